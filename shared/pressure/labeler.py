"""label-nodes' handler: one evaluation of the pressure rules, and what it tells people.

An evaluation lists the Nodes, asks Prometheus each rule's expression, lets the pure decision
(shared.pressure.decide) say which nodes carry the label afterwards, and writes only the Nodes
whose label or record changes, with a JSON merge patch of the label and the annotation alone.
No resourceVersion precondition: the patch touches only keys this function owns, one
evaluation runs at a time (the Service allows one request in one pod), and what it writes
depends only on those keys and on Prometheus, so a concurrent writer of other keys (assess-nodes'
health record, the node controller's labels) never conflicts with it.

Prometheus down or answering errors is not a failed evaluation: the decision keeps labels until
they are stale and labels nothing new, the outage is logged, counted and shown on ``/status``,
and the ping is answered 202. A 5xx would gain nothing: the PingSource adapter retries a 5xx
five times within about 1.5 s (50 ms doubling; knative.dev/eventing pkg/adapter/mtping) and
then drops the tick, and an outage does not end in 1.5 s; the next tick comes anyway. What a
retry can fix (the API server throttling or briefly unreachable) is answered 503.

``/status`` is this process's view (last evaluation, last success, whether Prometheus answered,
last error); ``/nodes`` reads the labelled Nodes from the API server, so it is true whichever
instance answers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypedDict, cast

from prometheus_client import Counter, Gauge

from shared.constants import PRESSURE_ANNOTATION, opted_out
from shared.platform import kube as kubeapi
from shared.platform import prometheus as prom
from shared.platform.config import Config
from shared.platform.kube import Kube
from shared.platform.recorder import format_time
from shared.pressure.decide import (
    Decision,
    NodeView,
    Observations,
    Record,
    RecordError,
    decide,
    stale_limit,
)
from shared.pressure.rules import Rule

log = logging.getLogger(__name__)

EVALUATIONS: Final = Counter(
    "knr_pressure_evaluations_total",
    "label-nodes evaluations, by outcome (ok; partial: some rules failed; outage: Prometheus "
    "unreachable or not answering as its API).",
    ["outcome"],
)
RULE_FAILURES: Final = Counter(
    "knr_pressure_rule_failures_total",
    "Pressure rules whose query failed, by rule and kind (unreachable, bad_answer, query).",
    ["rule", "kind"],
)
NODE_WRITES: Final = Counter(
    "knr_pressure_node_writes_total",
    "Nodes written by label-nodes, by action (label, unlabel, keep: a record renewed, none: a "
    "pending record changed).",
    ["action"],
)
LABELLED: Final = Gauge(
    "knr_pressure_labelled_nodes", "Nodes carrying the pressure label after the last evaluation."
)
PROMETHEUS_UP: Final = Gauge(
    "knr_pressure_prometheus_up",
    "1 when the last evaluation reached Prometheus and it answered as its API, else 0.",
)


# The parts of a Node this function reads (the API's JSON).
class _NodeAddress(TypedDict, total=False):
    type: str
    address: str


class _NodeStatus(TypedDict, total=False):
    addresses: list[_NodeAddress]


class _NodeSpec(TypedDict, total=False):
    unschedulable: bool


class _NodeMeta(TypedDict, total=False):
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]


class _Node(TypedDict, total=False):
    metadata: _NodeMeta
    spec: _NodeSpec
    status: _NodeStatus


@dataclass
class Status:
    """What ``/status`` shows: this process's last evaluations."""

    prometheus_url: str
    last_evaluation: datetime | None = None
    # The last evaluation in which every rule answered.
    last_success: datetime | None = None
    prometheus_reachable: bool | None = None
    last_error: str = ""
    labelled: int = 0
    cap: int = 0
    rules: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "prometheus_url": self.prometheus_url,
            "prometheus_reachable": self.prometheus_reachable,
            "last_evaluation": _precise(self.last_evaluation),
            "last_success": _precise(self.last_success),
            "last_error": self.last_error,
            "labelled": self.labelled,
            "cap": self.cap,
            "rules": self.rules,
        }


@dataclass(frozen=True)
class Evaluation:
    """One evaluation's outcome, for logs and tests."""

    at: datetime
    decision: Decision
    observations: Observations
    outage: str
    written: tuple[str, ...]


class Labeler:
    def __init__(
        self,
        kube: Kube,
        prometheus: prom.Prometheus,
        rules: Sequence[Rule],
        config: Config,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.prometheus = prometheus
        self.rules = tuple(rules)
        self.config = config
        self.clock = clock
        key, _, value = config.pressure_label.partition("=")
        self.label_key, self.label_value = key, value
        self.status = Status(prometheus.url, rules=[rule.describe() for rule in self.rules])
        self._lock = threading.Lock()

    # -- one evaluation -----------------------------------------------------------------------

    def evaluate(self) -> Evaluation:
        with self._lock:
            return self._evaluate()

    def _evaluate(self) -> Evaluation:
        nodes = [cast(_Node, node) for node in self.kube.list_all("Node")]
        observations, outage = self._observe(nodes)
        now = self.clock()
        decision = decide(
            [self._view(n) for n in nodes], self.rules, observations, now, self.config
        )
        written = self._write(decision)
        self._record(now, decision, observations, outage)
        return Evaluation(now, decision, observations, outage, written)

    def _observe(self, nodes: Iterable[_Node]) -> tuple[Observations, str]:
        """Each rule's value per node; the failed rules; the outage, if Prometheus is down."""
        ips = {
            (n.get("metadata") or {}).get("name", ""): [
                a.get("address", "")
                for a in (n.get("status") or {}).get("addresses") or ()
                if a.get("type") == "InternalIP"
            ]
            for n in nodes
        }
        ips.pop("", None)
        values: dict[str, dict[str, float]] = {}
        failed: dict[str, str] = {}
        outage = ""
        for rule in self.rules:
            if outage:
                failed[rule.name] = outage
                continue
            try:
                samples = self.prometheus.query(rule.expr)
            except (prom.Unreachable, prom.BadAnswer) as err:
                kind = "unreachable" if isinstance(err, prom.Unreachable) else "bad_answer"
                outage = f"Prometheus {kind.replace('_', ' ')}: {err}"
                failed[rule.name] = outage
                RULE_FAILURES.labels(rule=rule.name, kind=kind).inc()
                continue
            except prom.QueryFailed as err:
                failed[rule.name] = f"query failed: {err}"
                RULE_FAILURES.labels(rule=rule.name, kind="query").inc()
                log.error("pressure rule %s: Prometheus refused its expression: %s", rule.name, err)
                continue
            per_node = prom.node_values(samples, ips)
            values[rule.name] = {node: rule.worst(vals) for node, vals in per_node.items()}
            if samples and not per_node:
                log.warning(
                    "pressure rule %s: none of its %d series names a node (by a `node` label, "
                    "or an `instance` that is a node's name or InternalIP)",
                    rule.name,
                    len(samples),
                )
        return Observations(values, failed), outage

    def _view(self, node: _Node) -> NodeView:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        raw = (meta.get("annotations") or {}).get(PRESSURE_ANNOTATION)
        record: Record | None = None
        if raw is not None:
            try:
                record = Record.from_json(raw)
            except RecordError as err:
                log.warning(
                    "node %s: %s: %s (replaced)", meta.get("name"), PRESSURE_ANNOTATION, err
                )
        return NodeView(
            name=meta.get("name", ""),
            labelled=labels.get(self.label_key) == self.label_value,
            record=record,
            annotated=raw is not None,
            opted_out=opted_out(labels),
            schedulable=not (node.get("spec") or {}).get("unschedulable", False),
        )

    def _write(self, decision: Decision) -> tuple[str, ...]:
        written = []
        transient: list[str] = []
        for change in decision.changes:
            body = {
                "metadata": {
                    "labels": {self.label_key: self.label_value if change.labelled else None},
                    "annotations": {
                        PRESSURE_ANNOTATION: change.record.to_json() if change.record else None
                    },
                }
            }
            try:
                self.kube.merge_patch("Node", None, change.node, body)
            except kubeapi.NotFound:
                log.info("node %s is gone; nothing to write", change.node)
                continue
            except kubeapi.Transient as err:
                # The other nodes still get their writes; the tick is retried for this one.
                transient.append(f"{change.node}: {err}")
                continue
            written.append(change.node)
            NODE_WRITES.labels(action=change.action.value).inc()
            log.info(
                "node %s: %s (%s)",
                change.node,
                change.action.value,
                change.reason,
                extra={"node": change.node, "action": change.action.value},
            )
        if transient:
            raise kubeapi.Transient("; ".join(transient))
        return tuple(written)

    def _record(
        self, now: datetime, decision: Decision, observations: Observations, outage: str
    ) -> None:
        status = self.status
        status.last_evaluation = now
        status.prometheus_reachable = not outage
        status.labelled = len(decision.labelled)
        status.cap = decision.cap
        PROMETHEUS_UP.set(0 if outage else 1)
        LABELLED.set(len(decision.labelled))
        if outage:
            outcome = "outage"
            status.last_error = outage
            log.error(
                "pressure evaluation without data: %s; labels are kept until stale (%s after "
                "they were last confirmed), none is added",
                outage,
                self.config.pressure_stale_after,
            )
        elif observations.failed:
            outcome = "partial"
            status.last_error = "; ".join(
                f"{rule}: {error}" for rule, error in sorted(observations.failed.items())
            )
        else:
            outcome = "ok"
            status.last_success = now
            status.last_error = ""
        EVALUATIONS.labels(outcome=outcome).inc()
        log.info(
            "pressure evaluation: %s, %d labelled (at most %d), %d written",
            outcome,
            len(decision.labelled),
            decision.cap,
            len(decision.changes),
            extra={
                "labelled": sorted(d.node for d in decision.labelled),
                # Qualify for the label, held back because worse nodes hold all it allows.
                "capped": sorted(d.node for d in decision.capped),
                "outcome": outcome,
            },
        )

    # -- what /nodes shows ----------------------------------------------------------------------

    def labelled_nodes(self) -> dict[str, Any]:
        """The Nodes carrying the label now, with their records, read from the API server."""
        selector = f"{self.label_key}={self.label_value}"
        nodes = []
        for raw in self.kube.list_all("Node", label_selector=selector):
            view = self._view(cast(_Node, raw))
            record = view.record
            nodes.append(
                {
                    "name": view.name,
                    "rule": record.rule if record else None,
                    "value": record.value if record else None,
                    "since": _stamp(record.since if record else None),
                    "seen": _stamp(record.seen if record else None),
                    "stale_at": _stamp(stale_limit(record, self.config)),
                }
            )
        return {"label": selector, "count": len(nodes), "nodes": nodes}


def _stamp(moment: datetime | None) -> str | None:
    return format_time(moment) if moment is not None else None


def _precise(moment: datetime | None) -> str | None:
    """Evaluations may be less than a second apart: /status tells them apart."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
