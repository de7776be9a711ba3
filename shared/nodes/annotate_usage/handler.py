"""annotate-usage's handler: one evaluation of node usage, written onto the Nodes that changed.

An evaluation lists the Nodes, asks the source (Prometheus or the Metrics API) for each node's
usage, lists the bound pods once (for the estimate of just-bound pods), lets the pure decision
(shared.nodes.annotate_usage.decide) say what each node carries afterwards, and writes only the
Nodes whose record or bucket changes, with a JSON merge patch of the usage annotation and the load
label alone. No resourceVersion precondition, for the reason label-nodes gives: the patch
touches only keys this function owns, one evaluation runs at a time (one pod, one request), and
what it writes depends only on those keys and on the measurement.

At a thousand nodes an evaluation writes hundreds of Nodes (a record moves with every pod bound
there, through the estimate), and one at a time, against a busy API server, that took 26 to 53 s
(the scale measurement, dev/bench/RESULTS.md), longer than the PingSource's 30 s. So the writes
go out WRITERS at a time, and a tick that arrives while an evaluation runs is answered at once:
that evaluation measures what the tick would have (they used to queue behind it, each holding a
thread and one more evaluation of the same nodes to come).

The source down is not a failed evaluation: nothing new is written, records age, buckets of
nodes whose records went stale are removed, the outage is logged, counted and shown on
``/status``, and the Ping is answered 202 (its adapter's retries last 1.5 s; an outage does
not). What a retry can fix (the API server throttling or briefly unreachable) is answered 503.

After the writes, a pod bound within ``usage_estimate_window`` (and since this process's last
evaluation) to a node whose new record's predicted usage is over ``predicted_usage_limit`` gets
one Warning Event, ``PredictedUsageOverLimit`` (``decide.bindings_over_limit``), counted in
``knr_usage_bindings_over_limit_total``: once per pod and node (a deterministic Event name,
never counted again), best effort, never blocking or moving anything.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, cast

from prometheus_client import Counter, Gauge

from shared.api.keys import REASON_PREDICTED_OVER_LIMIT, opted_out
from shared.api.kubetypes import Node, Pod
from shared.api.usage import Estimate
from shared.nodes.annotate_usage.decide import (
    Measured,
    NodeDecision,
    bindings_over_limit,
    decide_node,
)
from shared.nodes.annotate_usage.sources import Source, SourceDown
from shared.nodes.usage import allocatable, estimate, scheduled_at
from shared.platform import kube as kubeapi
from shared.platform.config import Config
from shared.platform.kube import Kube
from shared.platform.recorder import Involved, Recorder

log = logging.getLogger(__name__)

EVALUATIONS: Final = Counter(
    "knr_usage_evaluations_total",
    "annotate-usage evaluations, by outcome (ok; outage: the usage source did not answer; "
    "skipped: the tick came while another evaluation ran).",
    ["outcome"],
)
# Node writes in flight at once in one evaluation: the API server's priority and fairness
# queues them fairly with everyone else's, and a Kube client's connection pool holds this many.
WRITERS: Final = 8
NODE_WRITES: Final = Counter(
    "knr_usage_node_writes_total", "Nodes whose usage annotation or load label was written."
)
SOURCE_UP: Final = Gauge(
    "knr_usage_source_up", "1 when the last evaluation got usage from its source, else 0."
)
# The seed's metric names: each node's usage as the last evaluation measured it (percent of
# allocatable), so dashboards built for it keep working. A node's series is removed when the
# node is gone or opted out: otherwise /metrics grows with every node a cluster ever had (an
# autoscaled cluster replaces its nodes daily), and a dashboard shows the last value of a node
# that no longer exists.
CPU_PERCENT: Final = Gauge(
    "node_cpu_usage_percent", "Node CPU usage, percent of allocatable.", ["node"]
)
MEMORY_PERCENT: Final = Gauge(
    "node_memory_usage_percent", "Node memory usage, percent of allocatable.", ["node"]
)
# Seconds an evaluation may spend saying binding warnings, under its lock.
WARNING_BUDGET: Final = 5.0
# How far before the last evaluation bindings are judged again: the clocks of this process and
# of the API server (which times a binding) may differ by that much.
SKEW_MARGIN: Final = timedelta(seconds=10)
OVER_LIMIT: Final = Counter(
    "knr_usage_bindings_over_limit_total",
    "Pods bound to a node whose predicted usage with them was over predicted_usage_limit, by "
    "resource over it (each pod once per node and resource; a Warning Event "
    "PredictedUsageOverLimit on the pod).",
    ["resource"],
)


@dataclass
class Status:
    """What ``/status`` shows: this process's last evaluations."""

    source: str
    last_evaluation: datetime | None = None
    last_success: datetime | None = None
    source_up: bool | None = None
    last_error: str = ""
    measured: int = 0
    buckets: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "source_up": self.source_up,
            "last_evaluation": _precise(self.last_evaluation),
            "last_success": _precise(self.last_success),
            "last_error": self.last_error,
            "measured": self.measured,
            "buckets": dict(sorted(self.buckets.items())),
        }


@dataclass(frozen=True)
class Evaluation:
    """One evaluation's outcome, for logs and tests."""

    at: datetime
    decisions: tuple[NodeDecision, ...]
    outage: str
    written: tuple[str, ...]


def _name(obj: Node | Pod) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _internal_ips(nodes: Iterable[Node]) -> dict[str, list[str]]:
    return {
        _name(n): [
            a.get("address", "")
            for a in (n.get("status") or {}).get("addresses") or ()
            if a.get("type") == "InternalIP"
        ]
        for n in nodes
        if _name(n)
    }


class Annotator:
    def __init__(
        self,
        kube: Kube,
        source: Source,
        config: Config,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.source = source
        self.config = config
        self.clock = clock
        self.status = Status(source.name)
        self._lock = threading.Lock()
        # The nodes this process exports a usage gauge for.
        self._gauged: set[str] = set()
        self.recorder = Recorder(kube, clock)
        # When this process last judged every binding: those before it were judged then.
        self._evaluated_at: datetime | None = None
        # When this process began: bindings before it (less SKEW_MARGIN) were a previous
        # process's to judge, against the usage it saw.
        self._started = clock()
        # The bindings (pod uid, node) judged lately, whatever the verdict: judged once.
        self._judged: dict[tuple[str, str], datetime] = {}
        self.warning_budget = WARNING_BUDGET

    def evaluate(self) -> Evaluation | None:
        """One evaluation; None when another is running (it measures what this tick would)."""
        if not self._lock.acquire(blocking=False):
            EVALUATIONS.labels(outcome="skipped").inc()
            log.info("an evaluation is already running; this tick is covered by it")
            return None
        try:
            return self._evaluate()
        finally:
            self._lock.release()

    def _evaluate(self) -> Evaluation:
        nodes = [cast(Node, node) for node in self.kube.list_all("Node")]
        outage = ""
        measured: dict[str, Measured] = {}
        try:
            measured = self.source.sample(_internal_ips(nodes))
        except SourceDown as err:
            outage = str(err)
        now = self.clock()
        pods_by_node = self._recent_pods(now) if measured else {}
        decisions = []
        for node in nodes:
            name = _name(node)
            capacity = allocatable(node)
            guess = Estimate()
            if capacity is not None and name in pods_by_node:
                guess = estimate(
                    pods_by_node[name],
                    capacity,
                    now,
                    self.config.usage_estimate_window,
                    self.config.usage_estimate_factor,
                )
            decisions.append(
                decide_node(
                    node,
                    measured.get(name),
                    capacity,
                    guess,
                    self.source.name,
                    self.config,
                    now,
                )
            )
        try:
            written = self._write(decisions)
        finally:
            self._warn_bindings(decisions, pods_by_node, now)
        listed = {_name(n) for n in nodes if not opted_out((n.get("metadata") or {}).get("labels"))}
        self._record(now, decisions, measured, outage, listed)
        return Evaluation(now, tuple(decisions), outage, written)

    def _warn_bindings(
        self, decisions: Iterable[NodeDecision], pods_by_node: dict[str, list[Pod]], now: datetime
    ) -> None:
        """The PredictedUsageOverLimit Warning on each pod bound lately to a node over the
        limit (module docstring); each pod once per node, whatever the ticks and replicas.

        Bounded: it runs under the evaluation's lock, so Event creates the API server answers
        slowly (a policy engine down) must not hold back the next ticks' usage writes; after
        WARNING_BUDGET the rest waits for the next evaluation. Judged from the last evaluation
        that judged anything, less SKEW_MARGIN (binding times are the API server's clock, this
        ``now`` ours): a pod judged twice is said once, its Event's name being the same, and a
        pod judged under the limit is not judged again in that margin (the node may be hotter
        by then, from load that came after it). A process judges no binding from before it
        began, less the margin: a previous process judged those against what it measured, and
        a restart would otherwise warn about every pod of the last window again.
        """
        if not pods_by_node:
            # No pod list (the source down, the list refused): nothing judged, the cursor stays.
            return
        since = max(now - self.config.usage_estimate_window, self._started - SKEW_MARGIN)
        if self._evaluated_at is not None:
            since = max(since, self._evaluated_at - SKEW_MARGIN)
        deadline = time.monotonic() + self.warning_budget
        finished = True
        judged: dict[tuple[str, str], datetime] = {}
        for decision in decisions:
            if decision.record is None or decision.node not in pods_by_node:
                continue
            pods = pods_by_node[decision.node]
            # A binding judged under the limit by the last evaluation is not judged again
            # within SKEW_MARGIN: the node may be hotter now, from load that came after it.
            found = [
                over
                for over in bindings_over_limit(
                    decision.node, decision.record, pods, since, self.config
                )
                if (over.uid, over.node) not in self._judged
            ]
            judged.update(_judged_bindings(decision.node, pods, since))
            for over in found:
                if time.monotonic() > deadline:
                    finished = False
                    break
                said = self.recorder.record(
                    Involved("Pod", over.namespace, over.name, over.uid),
                    REASON_PREDICTED_OVER_LIMIT,
                    over.message,
                    warning=True,
                    key=over.node,
                    repeat=False,
                )
                if not said:
                    # Not said (the create failed, or an Event is there already): judged again
                    # next time, when the Event's name says it once.
                    judged.pop((over.uid, over.node), None)
                if said:
                    for resource, _ in over.over:
                        OVER_LIMIT.labels(resource=resource.lower()).inc()
                    log.warning(
                        "pod %s/%s: %s",
                        over.namespace,
                        over.name,
                        over.message,
                        extra={"node": over.node, "reason": REASON_PREDICTED_OVER_LIMIT},
                    )
            if not finished:
                log.warning(
                    "binding warnings took longer than %ss; the rest wait for the next evaluation",
                    self.warning_budget,
                )
                return
        self._evaluated_at = now
        floor = now - self.config.usage_estimate_window - SKEW_MARGIN
        self._judged = {k: at for k, at in {**self._judged, **judged}.items() if at >= floor}

    def _recent_pods(self, now: datetime) -> dict[str, list[Pod]]:
        """Bound pods by node. One LIST of every bound pod (paged); a failure leaves the
        estimate out of this evaluation rather than the measurement."""
        if self.config.usage_estimate_window.total_seconds() <= 0:
            return {}
        by_node: dict[str, list[Pod]] = {}
        try:
            for raw in self.kube.list_all("Pod", field_selector="spec.nodeName!="):
                pod = cast(Pod, raw)
                node = (pod.get("spec") or {}).get("nodeName")
                if node:
                    by_node.setdefault(node, []).append(pod)
        except kubeapi.KubeError as err:
            log.warning("listing pods for the estimate failed (%s); measured usage only", err)
            return {}
        return by_node

    def _write(self, decisions: Iterable[NodeDecision]) -> tuple[str, ...]:
        due = [d for d in decisions if d.write]
        with ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="usage-write") as pool:
            # Each write runs in a copy of this request's context, taken here: a forced dry run
            # (a replay's), the event's log fields and the recording of its API calls are
            # context variables, which a pool's threads do not inherit.
            contexts = [contextvars.copy_context() for _ in due]
            outcomes = list(pool.map(lambda c, d: c.run(self._write_one, d), contexts, due))
        written = [d.node for d, outcome in zip(due, outcomes, strict=True) if outcome is None]
        transient = [o for o in outcomes if o]
        if transient:
            # The other nodes got their writes; the next tick retries these.
            raise kubeapi.Transient("; ".join(transient))
        return tuple(written)

    def _write_one(self, decision: NodeDecision) -> str | None:
        """Writes one node's decision; None when written (or the node is gone), else what a
        retry could fix."""
        try:
            self.kube.merge_patch("Node", None, decision.node, decision.patch())
        except kubeapi.NotFound:
            log.info("node %s is gone; nothing to write", decision.node)
            return ""
        except kubeapi.Transient as err:
            return f"{decision.node}: {err}"
        NODE_WRITES.inc()
        log.info(
            "node %s: usage written, load %s (%s)",
            decision.node,
            decision.bucket or "unlabelled",
            decision.reason,
            extra={"node": decision.node, "bucket": decision.bucket},
        )
        return None

    def _record(
        self,
        now: datetime,
        decisions: Iterable[NodeDecision],
        measured: dict[str, Measured],
        outage: str,
        listed: set[str],
    ) -> None:
        """``listed``: the Nodes of this evaluation that are not opted out; gauges of any other
        node go."""
        status = self.status
        status.last_evaluation = now
        status.source_up = not outage
        status.measured = len(measured)
        buckets: dict[str, int] = {}
        gauged: set[str] = set()
        for decision in decisions:
            if decision.bucket:
                buckets[decision.bucket] = buckets.get(decision.bucket, 0) + 1
            record = decision.record
            if record is not None:
                CPU_PERCENT.labels(node=decision.node).set(record.cpu.now)
                MEMORY_PERCENT.labels(node=decision.node).set(record.memory.now)
                gauged.add(decision.node)
            elif decision.node in self._gauged and decision.node in listed:
                # Listed but not measured this time (the source is down or lags): the last
                # value stays, as the record on the Node does.
                gauged.add(decision.node)
        for gone in self._gauged - gauged:
            CPU_PERCENT.remove(gone)
            MEMORY_PERCENT.remove(gone)
        self._gauged = gauged
        status.buckets = buckets
        SOURCE_UP.set(0 if outage else 1)
        if outage:
            status.last_error = outage
            EVALUATIONS.labels(outcome="outage").inc()
            log.error(
                "usage evaluation without data: %s; records age, load labels go once they are "
                "older than %s",
                outage,
                self.config.usage_stale_after,
            )
            return
        status.last_success = now
        status.last_error = ""
        EVALUATIONS.labels(outcome="ok").inc()
        log.info(
            "usage evaluation: %d nodes measured",
            len(measured),
            extra={"buckets": buckets, "outcome": "ok"},
        )


def _precise(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _judged_bindings(
    node: str, pods: Iterable[Pod], since: datetime
) -> dict[tuple[str, str], datetime]:
    """The bindings to ``node`` an evaluation from ``since`` judges, by (pod uid, node)."""
    judged = {}
    for pod in pods:
        bound = scheduled_at(pod)
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        if uid and bound is not None and bound >= since.replace(microsecond=0):
            judged[(uid, node)] = bound
    return judged
