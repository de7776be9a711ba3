"""rebalance-nodes' handler: one evaluation, evictions through the Eviction API.

An evaluation lists the Nodes, lets the pure decision (shared.nodes.rebalance_nodes.decide) say
which are hot and for how long, and only when a node is to be acted on (hot long enough, or in
maintenance) lists the bound pods and reads the controllers of the pods on those nodes: one GET
per distinct controller and one per namespace (its opt-in label), cached within the run, and,
for the pods of workloads that opted in, one per PersistentVolumeClaim they mount and one per
volume bound to it (a volume may tie a pod to its node: the fit check needs them). Then
it evicts what the plan chose, with a uid precondition (a namesake created since the listing is
not evicted), records a ``Rebalanced`` Event on the pod and on its workload with the node usage
that justified it, and writes the hot streaks that changed (a JSON merge patch of our one
annotation; no resourceVersion precondition, for annotate-usage's reason: we own the key and one
evaluation runs at a time).

Answers: a PodDisruptionBudget's 429 is "not now": logged, counted
(``rescheduler_pod_evictions_total{result="refused"}``), never a failure; the node keeps its
streak and the next evaluation tries again. A pod gone (404, or a uid precondition that no longer
holds) is fine. Listing failures the API server may recover from answer 503; RBAC refusals 500.

Dry run (``KN_RESCHEDULER_DRY_RUN``): every write is a server-side dry run, so the API server
checks each eviction against its PodDisruptionBudget and RBAC and deletes nothing. Streaks
written in a dry run are not kept by the API server either; this process keeps them itself, so
that a dry run reaches the evictions a real run would make (one replica: min/max-scale 1).

The reply. Each evaluation that evicted pods (or would have, in a dry run) answers one
``io.kn-rescheduler.pod.rebalanced`` CloudEvent summarising the run (the evictions, each with
its node, reason, node usage and the node it fits on). A PingSource does not route what its sink
answers, so the shipped manifest sends the Ping through the Broker, with a Trigger on its
source, and the reply lands on the Broker like assess-nodes' node.suspected: anything may
subscribe to it. One event per run rather than per pod: a run evicts a handful at most, and
subscribers want to know that a rebalancing happened and why.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final, cast

from prometheus_client import Counter, Gauge

from shared.api.keys import (
    EVENT_POD_REBALANCED,
    HOT_STREAK_ANNOTATION,
    REASON_REBALANCED,
    REBALANCE_KEY,
    REBALANCE_VALUE,
)
from shared.api.kubetypes import Node, Pod
from shared.api.rebalance import Streak
from shared.api.times import format_time
from shared.nodes.rebalance_nodes.decide import (
    Claim,
    Eviction,
    NodeState,
    Plan,
    Workload,
    assess,
    choose,
    claim_key,
    workload_key,
    workload_of,
)
from shared.platform import events
from shared.platform import kube as kubeapi
from shared.platform.config import Config
from shared.platform.kube import Kube
from shared.platform.recorder import Involved, Recorder
from shared.workloads.jobs import JobFacts

log = logging.getLogger(__name__)

# The seed's metric name. result: evicted, dry-run, refused (a PodDisruptionBudget said not
# now), gone (the pod went first), error (anything else the API server answered).
EVICTIONS: Final = Counter(
    "rescheduler_pod_evictions_total",
    "Pods rebalance-nodes evicted or tried to, by reason (maintenance, cpu-over-threshold, "
    "memory-over-threshold, cpu-above-mean, memory-above-mean) and result.",
    ["reason", "result"],
)
EVALUATIONS: Final = Counter(
    "knr_rebalance_evaluations_total",
    "rebalance-nodes evaluations, by outcome (ok, error).",
    ["outcome"],
)
HOT_NODES: Final = Gauge(
    "knr_rebalance_hot_nodes",
    "Nodes the last evaluation found hot (any streak), and those it acted on.",
    ["state"],
)
MEAN_USAGE: Final = Gauge(
    "knr_rebalance_cluster_mean_percent",
    "Mean usage of the schedulable, Ready nodes with fresh records (percent of allocatable), "
    "by resource.",
    ["resource"],
)
SKIPPED: Final = Counter(
    "knr_rebalance_skipped_total",
    "Pods or nodes on a node to act on that were left alone (limits, no fit, not opted in).",
)

EVICTED: Final = "evicted"
DRY_RUN: Final = "dry-run"
REFUSED: Final = "refused"
GONE: Final = "gone"
ERROR: Final = "error"


@dataclass(frozen=True)
class Outcome:
    eviction: Eviction
    result: str
    detail: str = ""


@dataclass(frozen=True)
class Evaluation:
    """One evaluation, for logs, /status and tests."""

    plan: Plan
    outcomes: tuple[Outcome, ...]
    dry_run: bool

    def reply(self) -> events.Reply | None:
        done = [o for o in self.outcomes if o.result in (EVICTED, DRY_RUN)]
        if not done:
            return None
        nodes = sorted({o.eviction.node for o in done})
        return events.Reply(
            type=EVENT_POD_REBALANCED,
            subject="nodes/" + ",".join(nodes),
            data={
                "at": format_time(self.plan.at),
                "dryRun": self.dry_run,
                "evictions": [{**o.eviction.to_json(), "result": o.result} for o in done],
                "refused": [
                    {"namespace": o.eviction.namespace, "pod": o.eviction.pod, "why": o.detail}
                    for o in self.outcomes
                    if o.result == REFUSED
                ],
            },
        )


@dataclass
class Status:
    """What ``GET /status`` shows: this process's last evaluations."""

    dry_run: bool
    last_evaluation: datetime | None = None
    last_success: datetime | None = None
    last_error: str = ""
    hot: dict[str, int] = field(default_factory=dict)
    acting: list[str] = field(default_factory=list)
    last_run: dict[str, int] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=dict)
    last_evictions: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "last_evaluation": _precise(self.last_evaluation),
            "last_success": _precise(self.last_success),
            "last_error": self.last_error,
            "hot_streaks": dict(sorted(self.hot.items())),
            "acting_on": self.acting,
            "last_run": dict(sorted(self.last_run.items())),
            "totals": dict(sorted(self.totals.items())),
            "last_evictions": self.last_evictions,
        }


class Rebalancer:
    def __init__(
        self,
        kube: Kube,
        config: Config,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.config = config
        self.clock = clock
        self.status = Status(dry_run=config.dry_run)
        self.recorder = Recorder(kube, clock)
        self._lock = threading.Lock()
        # Dry run only: the streaks the API server did not keep.
        self._dry_streaks: dict[str, Streak | None] = {}

    @property
    def dry_run(self) -> bool:
        return self.kube.dry_run

    def evaluate(self) -> Evaluation:
        with self._lock:
            try:
                evaluation = self._evaluate()
            except kubeapi.KubeError as err:
                self.status.last_evaluation = self.clock()
                self.status.last_error = str(err)
                EVALUATIONS.labels(outcome="error").inc()
                raise
            EVALUATIONS.labels(outcome="ok").inc()
            return evaluation

    def _evaluate(self) -> Evaluation:
        dry = self.dry_run
        nodes = [cast(Node, n) for n in self.kube.list_all("Node")]
        if dry:
            nodes = [self._with_remembered_streak(n) for n in nodes]
        now = self.clock()
        states, bounds = assess(nodes, self.config, now)
        acting = [s for s in states if s.acting]
        pods: list[Pod] = []
        workloads: dict[str, Workload] = {}
        claims: dict[str, Claim] = {}
        if acting:
            # Every bound pod: the targets' requested totals need them too.
            pods = [
                cast(Pod, p) for p in self.kube.list_all("Pod", field_selector="spec.nodeName!=")
            ]
            names = {s.name for s in acting}
            on_acting = [p for p in pods if (p.get("spec") or {}).get("nodeName") in names]
            workloads = self._workloads(on_acting)
            claims = self._claims(p for p in on_acting if _opted_in(p, workloads))
        plan = choose(nodes, states, bounds, pods, workloads, self.config, now, claims=claims)
        outcomes = tuple(self._evict(e, dry) for e in plan.evictions)
        acted = {o.eviction.node for o in outcomes if o.result in (EVICTED, DRY_RUN)}
        self._write_streaks(plan, acted, dry)
        for outcome in outcomes:
            if outcome.result in (EVICTED, DRY_RUN):
                self._record_events(outcome.eviction, workloads, dry)
        evaluation = Evaluation(plan, outcomes, dry)
        self._report(evaluation, states, acting)
        return evaluation

    # -- reading ----------------------------------------------------------------------------

    def _with_remembered_streak(self, node: Node) -> Node:
        name = (node.get("metadata") or {}).get("name", "")
        if name not in self._dry_streaks:
            return node
        streak = self._dry_streaks[name]
        meta: dict[str, Any] = dict(node.get("metadata") or {})
        annotations: dict[str, str] = dict(meta.get("annotations") or {})
        if streak is None:
            annotations.pop(HOT_STREAK_ANNOTATION, None)
        else:
            annotations[HOT_STREAK_ANNOTATION] = streak.to_json()
        meta["annotations"] = annotations
        return cast(Node, {**node, "metadata": meta})

    def _workloads(self, pods: Iterable[Pod]) -> dict[str, Workload]:
        """The controllers of ``pods`` (one GET each) and their namespaces' opt-in."""
        found: dict[str, Workload] = {}
        namespaces: dict[str, bool | None] = {}
        seen: set[str] = set()
        for pod in pods:
            owner = workload_of(pod)
            if owner is None:
                continue
            kind, namespace, name, _ = owner
            key = workload_key(kind, namespace, name)
            if key in seen or kind not in ("ReplicaSet", "StatefulSet", "Job"):
                continue
            if self.config.is_excluded_namespace(namespace):
                continue
            seen.add(key)
            try:
                obj = self.kube.get(kind, namespace, name)
            except kubeapi.NotFound:
                log.info("%s is gone; its pods are left alone", key)
                continue
            if namespace not in namespaces:
                namespaces[namespace] = self._namespace_opted_in(namespace)
            opted_in = namespaces[namespace]
            workload = _workload(kind, obj, bool(opted_in))
            if opted_in is None:
                # The API server refuses every create in a terminating namespace, evictions
                # included (403); its pods are going anyway.
                workload = replace(
                    workload, opted_in=False, opt_in=f"namespace {namespace} is being deleted"
                )
            found[key] = workload
        return found

    def _claims(self, pods: Iterable[Pod]) -> dict[str, Claim]:
        """The PersistentVolumeClaims ``pods`` mount and the volumes bound to them (one GET
        each), for the fit check. A claim or volume that cannot be read (gone, RBAC refusing
        it with an older manifest, an API error or a timeout) is recorded as such and its pod
        stays where it is, so that the other pods are still rebalanced."""
        found: dict[str, Claim] = {}
        for pod in pods:
            namespace = str((pod.get("metadata") or {}).get("namespace", ""))
            for volume in cast(Mapping[str, Any], pod.get("spec") or {}).get("volumes") or []:
                source = volume.get("persistentVolumeClaim")
                if source is None:
                    continue
                name = str(source.get("claimName", ""))
                key = claim_key(namespace, name)
                if key not in found:
                    found[key] = self._claim(namespace, name)
        return found

    def _claim(self, namespace: str, name: str) -> Claim:
        try:
            pvc = self.kube.get("PersistentVolumeClaim", namespace, name)
        except kubeapi.KubeError as err:
            log.warning("claim %s/%s not read: %s", namespace, name, err)
            return Claim(namespace, name, unread=str(err))
        volume = (pvc.get("spec") or {}).get("volumeName")
        if not volume:
            return Claim(namespace, name, pvc=pvc)
        try:
            pv = self.kube.get("PersistentVolume", None, volume)
        except kubeapi.KubeError as err:
            log.warning("volume %s of claim %s/%s not read: %s", volume, namespace, name, err)
            return Claim(namespace, name, pvc=pvc, unread=str(err))
        return Claim(namespace, name, pvc=pvc, pv=pv)

    def _namespace_opted_in(self, namespace: str) -> bool | None:
        """The namespace's opt-in label; None when it is being deleted (or gone)."""
        try:
            obj = self.kube.get("Namespace", None, namespace)
        except kubeapi.NotFound:
            return None
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp") or (obj.get("status") or {}).get("phase") == "Terminating":
            return None
        labels = meta.get("labels") or {}
        return bool(labels.get(REBALANCE_KEY) == REBALANCE_VALUE)

    # -- acting -----------------------------------------------------------------------------

    def _evict(self, eviction: Eviction, dry: bool) -> Outcome:
        who = f"{eviction.namespace}/{eviction.pod}"
        extra = {
            "pod": who,
            "node": eviction.node,
            "target": eviction.target,
            "reason": eviction.reason,
            "dry_run": dry,
        }
        try:
            self.kube.evict(eviction.namespace, eviction.pod, uid=eviction.uid or None)
        except kubeapi.DisruptionBudgetRefused as err:
            # Not now: the budget allows no disruption. The next evaluation tries again.
            log.info("eviction of %s refused for now: %s", who, err, extra=extra)
            return self._counted(Outcome(eviction, REFUSED, "; ".join(err.causes) or str(err)))
        except (kubeapi.NotFound, kubeapi.Conflict) as err:
            # Gone, or replaced by a namesake since the listing (the uid precondition).
            log.info("%s went before its eviction: %s", who, err, extra=extra)
            return self._counted(Outcome(eviction, GONE, str(err)))
        except kubeapi.Forbidden:
            raise
        except kubeapi.KubeError as err:
            log.warning("eviction of %s failed: %s", who, err, extra=extra)
            return self._counted(Outcome(eviction, ERROR, str(err)))
        result = DRY_RUN if dry else EVICTED
        log.info(
            "%s %s off %s: %s",
            "would evict" if dry else "evicted",
            who,
            eviction.node,
            eviction.why,
            extra=extra,
        )
        return self._counted(Outcome(eviction, result))

    def _counted(self, outcome: Outcome) -> Outcome:
        EVICTIONS.labels(reason=outcome.eviction.reason, result=outcome.result).inc()
        return outcome

    def _write_streaks(self, plan: Plan, acted: set[str], dry: bool) -> None:
        transient = []
        for node, streak in plan.streaks(acted).items():
            if dry:
                self._dry_streaks[node] = streak
            patch = {
                "metadata": {
                    "annotations": {
                        HOT_STREAK_ANNOTATION: None if streak is None else streak.to_json()
                    }
                }
            }
            try:
                self.kube.merge_patch("Node", None, node, patch)
            except kubeapi.NotFound:
                continue
            except kubeapi.Transient as err:
                # The evictions are done; a streak written one evaluation late costs little.
                transient.append(f"{node}: {err}")
        if transient:
            log.warning("hot streaks not written: %s", "; ".join(transient))

    def _record_events(
        self, eviction: Eviction, workloads: Mapping[str, Workload], dry: bool
    ) -> None:
        message = ("Would evict (dry run): " if dry else "Evicted: ") + eviction.why
        self.recorder.record(
            Involved("Pod", eviction.namespace, eviction.pod, eviction.uid),
            REASON_REBALANCED,
            message,
            repeat=False,
        )
        workload = workloads.get(eviction.workload)
        if workload is not None:
            self.recorder.record(
                Involved(workload.kind, workload.namespace, workload.name, workload.uid),
                REASON_REBALANCED,
                f"{eviction.pod}: {message}",
                key=f"{eviction.pod}/{eviction.uid}",
                repeat=False,
            )

    def _report(
        self, evaluation: Evaluation, states: Sequence[NodeState], acting: Sequence[NodeState]
    ) -> None:
        status = self.status
        plan = evaluation.plan
        status.last_evaluation = plan.at
        status.last_success = plan.at
        status.last_error = ""
        status.dry_run = evaluation.dry_run
        status.hot = {s.name: s.streak.hot for s in states if s.hot}
        status.acting = sorted(s.name for s in acting)
        run: dict[str, int] = {}
        for outcome in evaluation.outcomes:
            run[outcome.result] = run.get(outcome.result, 0) + 1
            status.totals[outcome.result] = status.totals.get(outcome.result, 0) + 1
        status.last_run = run
        status.last_evictions = [
            {**o.eviction.to_json(), "result": o.result, "detail": o.detail}
            for o in evaluation.outcomes
        ]
        HOT_NODES.labels(state="hot").set(sum(1 for s in states if s.hot))
        HOT_NODES.labels(state="acting").set(len(acting))
        if plan.bounds.mean_cpu is not None and plan.bounds.mean_memory is not None:
            MEAN_USAGE.labels(resource="cpu").set(plan.bounds.mean_cpu)
            MEAN_USAGE.labels(resource="memory").set(plan.bounds.mean_memory)
        if plan.skipped:
            SKIPPED.inc(len(plan.skipped))
        for skipped in plan.skipped:
            log.info("left alone: %s: %s", skipped.subject, skipped.why)
        log.info(
            "rebalance evaluation: %d hot, acting on %s, %s",
            len(status.hot),
            ", ".join(status.acting) or "none",
            ", ".join(f"{v} {k}" for k, v in sorted(run.items())) or "no eviction",
            extra={"hot": status.hot, "outcome": "ok", "dry_run": evaluation.dry_run},
        )


def _opted_in(pod: Pod, workloads: Mapping[str, Workload]) -> bool:
    """Whether the pod's workload was read and opted in: only then are its claims worth a GET."""
    owner = workload_of(pod)
    if owner is None:
        return False
    workload = workloads.get(workload_key(*owner[:3]))
    return workload is not None and workload.opted_in


def _workload(kind: str, obj: Mapping[str, Any], namespace_opted_in: bool) -> Workload:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = meta.get("annotations") or {}
    namespace = str(meta.get("namespace", ""))
    name = str(meta.get("name", ""))
    own = annotations.get(REBALANCE_KEY)
    if own is not None:
        # The workload's own word wins over its namespace's, either way.
        opted_in = own == REBALANCE_VALUE
        where = f"{REBALANCE_KEY}={own!r} on the {kind}"
    else:
        opted_in = namespace_opted_in
        where = (
            f"namespace {namespace} labelled {REBALANCE_KEY}={REBALANCE_VALUE}"
            if opted_in
            else f"no {REBALANCE_KEY} annotation on the {kind} nor label on its namespace"
        )
    if kind == "Job":
        parallelism = spec.get("parallelism", 1)
        desired = parallelism if type(parallelism) is int else None
        ready = status.get("ready", 0)
        job: JobFacts | None = JobFacts.from_job(obj)
    else:
        replicas = spec.get("replicas", 1)
        desired = replicas if type(replicas) is int else None
        ready = status.get("readyReplicas", 0)
        job = None
    return Workload(
        kind=kind,
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid", "")),
        opted_in=opted_in,
        opt_in=where,
        desired=desired,
        ready=ready if type(ready) is int else 0,
        job=job,
    )


def _precise(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
