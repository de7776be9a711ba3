"""What must hold after a soak on a production-like cluster: do no harm.

Pure functions of a :class:`Record`, the facts the soak's own watches gathered (every pod and
Node as seen, with the harness's clock; the Jobs and ReplicaSets that owned pods; the Events;
what the harness itself, standing in for the cluster's operator, wrote onto Nodes), each
returning :class:`Violation` s with the evidence a person needs. Nothing here calls the
product's decision code: which pod is failing, which workload a pod belongs to and when a node
turned suspect are read from the API objects with readers of their own, so that a bug in the
product cannot hide itself. Only the Event naming rule is the product's
(``shared.pods.update_annotations.bodies.event_name``): it is the contract by which a move's Event
is found.

The invariants:

``healthy-pods-untouched``
    A pod we removed (an Event of ours keyed by its uid: ``Rescheduled``, ``ExclusionsCleared``
    or ``Rebalanced``) was not healthy before its deletion, unless it is a ``Rebalanced`` pod of
    a workload (or namespace) that opted in to rebalancing. Healthy: Ready, and admitted by the
    local kubelet on a node without a fault (the kubelet stamps the fault it gave the pod on it,
    ``sim.kn-rescheduler.io/fault``). Read from the last status seen *before* the
    deletionTimestamp: a kubelet writes every pod it stops for a deletion Failed first.
``foreign-labels-untouched``
    Every label, taint and cordon the operator (the harness) wrote on a Node reads the same in
    every later version of that Node (by resourceVersion: etcd revisions, ordered on one
    cluster), until the operator writes it again; and our field manager (``kn-rescheduler``, in
    ``managedFields``) owns no label outside our prefix, except ``status`` on a node where the
    operator never set one (label-nodes' pressure label).
``system-critical-scheduled``
    No pod of a system-critical priority class stays unscheduled longer than ``pending_grace``.
    The fixture keeps room for every add-on, so a long Pending is ours (the extender, a label or
    a taint of ours) or a fixture bug; the scheduler's message is the evidence either way.
``evicted-once-per-reason``
    No pod of a stable identity (a StatefulSet's ordinal, a bare pod's lineage) is removed by
    us twice for the same reason within ``evict_window``: the same pod coming back to the same
    place (a local volume pins it) and being moved again is a loop, not a remedy.
``suspect-needs-two-workloads``
    When a Node turns suspect, pods of at least two distinct workloads were seen failing on it
    within ``suspect_window`` before. A workload is the top of a pod's owner chain: a
    Deployment (through its ReplicaSets), a CronJob (through its Jobs: every run is a new Job
    of the same workload), a StatefulSet, a Job, or a bare pod's lineage.
``budget-kept-when-broken-everywhere``
    A workload whose application is broken on every node (the local kubelet fails its pods
    wherever they run: the fault label on the pod itself) cannot be helped by a move: it never
    spends its whole budget (no ``RetriesExhausted`` about it, fewer moves than the budget
    allows), and the ``MovesStopped`` Warning that says so is recorded at most once per holder.
``node-fixable-recovered``
    Every workload of the recovery namespaces (opted in, failing only because of a faulty node)
    ends with every replica Ready on a node without a fault: the chaos suite's
    ``replicas-healthy`` (dev/bench/chaos/invariants.py), judged on the same objects.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from dev.bench.chaos import invariants as chaos
from dev.bench.chaos.invariants import Verdict, Violation
from dev.localcluster.keys import (
    SIM_FAULT_LABEL,
)
from shared.api.keys import (
    COMPONENT,
    NODE_HEALTH_ANNOTATION,
    PREFIX,
    PRESSURE_LABEL_KEY,
    REASON_EXCLUSIONS_CLEARED,
    REASON_MOVES_STOPPED,
    REASON_REBALANCED,
    REASON_RESCHEDULED,
    REASON_RETRIES_EXHAUSTED,
    REBALANCE_KEY,
    REBALANCE_VALUE,
    SUSPECT_LABEL,
)
from shared.pods.update_annotations.bodies import ORIGIN_ANNOTATION, event_name
from shared.workloads.owners import Ref

JSON = dict[str, Any]

INVARIANTS: Final = (
    "healthy-pods-untouched",
    "foreign-labels-untouched",
    "system-critical-scheduled",
    "evicted-once-per-reason",
    "suspect-needs-two-workloads",
    "budget-kept-when-broken-everywhere",
    "node-fixable-recovered",
)
# The reasons of our Events that say we removed a pod.
REMOVAL_REASONS: Final = (REASON_RESCHEDULED, REASON_EXCLUSIONS_CLEARED, REASON_REBALANCED)
# The priority classes every API server creates (pkg/apis/scheduling: SystemClusterCritical,
# SystemNodeCritical), and the priority from which a pod is system-critical
# (scheduling.SystemCriticalPriority, 2 * 10^9).
SYSTEM_CLASSES: Final = frozenset({"system-cluster-critical", "system-node-critical"})
SYSTEM_CRITICAL_PRIORITY: Final = 2_000_000_000
# What the local kubelet stamps on a pod it admitted on a healthy node
# (localcluster.podstatus.HEALTHY).
HEALTHY_FAULT: Final = "none"
# A container waiting for one of these reasons is failing (the kubelet's own reasons:
# kuberuntime's CrashLoopBackOff, the image manager's ErrImagePull / ImagePullBackOff, the
# runtime's CreateContainerError).
FAILING_WAITING: Final = frozenset(
    {
        "CrashLoopBackOff",
        "ErrImagePull",
        "ImagePullBackOff",
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
    }
)


@dataclass(frozen=True)
class PodFacts:
    """One pod as the soak saw it (times from the harness's clock, seconds)."""

    # As last seen without a deletionTimestamp (None: first seen being deleted).
    before_deletion: JSON | None
    last: JSON
    first_seen: float
    # When it was first seen bound to a node; first seen failing (see :func:`is_failing`);
    # first seen with a deletionTimestamp; seen going away.
    bound_at: float | None = None
    failing_at: float | None = None
    deleting_at: float | None = None
    gone: bool = False


@dataclass(frozen=True)
class NodeSeen:
    """One version of a Node, as a watch delivered it."""

    at: float
    node: JSON


@dataclass(frozen=True)
class OperatorWrite:
    """What the harness, as the cluster's operator, set on a Node, and the resourceVersion its
    write answered with. ``labels`` maps a key to its value (None: removed); ``taints`` are the
    operator's taints on the node from then on (None: not touched); ``unschedulable`` likewise."""

    node: str
    rv: int
    labels: Mapping[str, str | None] = field(default_factory=dict)
    taints: tuple[JSON, ...] | None = None
    unschedulable: bool | None = None


@dataclass(frozen=True)
class Record:
    pods: Mapping[str, PodFacts]
    nodes: Sequence[NodeSeen]
    operator: Sequence[OperatorWrite]
    # Every ReplicaSet and Job seen during the run, by uid (a CronJob's old Jobs are deleted by
    # its history limits; their pods' workload is still the CronJob).
    owners: Mapping[str, JSON]
    # Everything read at the end: workloads, live pods, Namespaces, Events (each with its kind).
    objects: Sequence[JSON]
    faulty_nodes: frozenset[str]
    # The namespaces whose workloads must recover (node-fixable failures only).
    recovery_namespaces: frozenset[str]
    ended_at: float
    pending_grace: float = 60.0
    evict_window: float = 600.0
    suspect_window: float = 600.0
    # Workloads broken on every node ("Deployment ns/name"), each with the moves its budget
    # allows (scheduling-retries x replicas).
    broken: Mapping[str, int] = field(default_factory=dict)


# -- readers ------------------------------------------------------------------------------------


def _meta(obj: Mapping[str, Any]) -> JSON:
    meta: JSON = obj.get("metadata") or {}
    return meta


def _describe(pod: Mapping[str, Any]) -> str:
    return f"{_meta(pod).get('namespace')}/{_meta(pod).get('name')}"


def is_failing(pod: Mapping[str, Any]) -> bool:
    """The kubelet says so: a container waiting for a failure reason, one that last ended
    OOMKilled or with a non-zero code and restarts, or the pod Failed before anyone deleted it."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed" and not _meta(pod).get("deletionTimestamp"):
        return True
    for c in status.get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FAILING_WAITING:
            return True
        last = (c.get("lastState") or {}).get("terminated") or {}
        if last and (last.get("reason") == "OOMKilled" or last.get("exitCode", 0) != 0):
            return True
    return False


def is_healthy(pod: Mapping[str, Any]) -> bool:
    """Ready, and admitted on a node without a fault."""
    fault = (_meta(pod).get("annotations") or {}).get(SIM_FAULT_LABEL)
    return chaos.is_ready(pod) and fault == HEALTHY_FAULT


def is_system_critical(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    return (
        spec.get("priorityClassName") in SYSTEM_CLASSES
        or int(spec.get("priority") or 0) >= SYSTEM_CRITICAL_PRIORITY
    )


def _controller(obj: Mapping[str, Any]) -> JSON | None:
    for owner in _meta(obj).get("ownerReferences") or []:
        if owner.get("controller"):
            found: JSON = owner
            return found
    return None


def workload_of(pod: Mapping[str, Any], owners: Mapping[str, JSON]) -> str:
    """The top of the pod's owner chain: ReplicaSet -> Deployment, Job -> CronJob."""
    ns = _meta(pod).get("namespace", "")
    owner = _controller(pod)
    if owner is None:
        return f"Pod {ns}/{chaos.chain(pod)}"
    above = owners.get(owner.get("uid", ""))
    top = _controller(above) if above is not None else None
    if top is not None and top.get("kind") in ("Deployment", "CronJob"):
        return f"{top.get('kind')} {ns}/{top.get('name')}"
    return f"{owner.get('kind')} {ns}/{owner.get('name')}"


def _rv(obj: Mapping[str, Any]) -> int:
    try:
        return int(_meta(obj).get("resourceVersion") or 0)
    except ValueError:
        return 0


class _Index:
    def __init__(self, record: Record) -> None:
        self.r = record
        self.by_kind: dict[str, list[JSON]] = {}
        for obj in record.objects:
            self.by_kind.setdefault(obj.get("kind", ""), []).append(obj)
        self.events = self.by_kind.get("Event", [])
        self.event_names = {
            f"{_meta(e).get('namespace')}/{_meta(e).get('name')}" for e in self.events
        }
        self.about: dict[str, list[JSON]] = {}
        for e in self.events:
            uid = (e.get("involvedObject") or {}).get("uid")
            if uid:
                self.about.setdefault(uid, []).append(e)
        self.namespaces = {_meta(n).get("name"): n for n in self.by_kind.get("Namespace", [])}
        self.by_uid = {_meta(o).get("uid"): o for o in [*record.objects, *record.owners.values()]}

    def removal_reason(self, uid: str, pod: JSON) -> str | None:
        """The reason of our Event that says we removed this pod, if any."""
        for e in self.about.get(uid, []):
            if e.get("reason") in REMOVAL_REASONS:
                return str(e["reason"])
        owner = _controller(pod)
        if owner is None:
            return None
        ref = Ref(owner.get("kind", ""), _meta(pod).get("namespace", ""), owner.get("name", ""))
        ref = Ref(ref.kind, ref.namespace, ref.name, owner.get("uid", ""))
        for reason in (REASON_RESCHEDULED, REASON_EXCLUSIONS_CLEARED):
            if f"{ref.namespace}/{event_name(ref, reason, uid)}" in self.event_names:
                return reason
        return None

    def opted_in_to_rebalance(self, pod: JSON) -> bool:
        owner = _controller(pod)
        holder = self.by_uid.get(owner.get("uid")) if owner else None
        if holder is not None:
            said = (_meta(holder).get("annotations") or {}).get(REBALANCE_KEY)
            if said is not None:
                return bool(said == REBALANCE_VALUE)
        ns = self.namespaces.get(_meta(pod).get("namespace")) or {}
        return bool((_meta(ns).get("labels") or {}).get(REBALANCE_KEY) == REBALANCE_VALUE)


# -- the invariants -----------------------------------------------------------------------------


def healthy_pods_untouched(record: Record) -> tuple[list[Violation], int]:
    idx = _Index(record)
    violations: list[Violation] = []
    checked = 0
    for uid, facts in sorted(record.pods.items()):
        reason = idx.removal_reason(uid, facts.last)
        if reason is None:
            continue
        checked += 1
        before = facts.before_deletion
        if before is None or not is_healthy(before):
            continue
        if reason == REASON_REBALANCED and idx.opted_in_to_rebalance(before):
            continue
        violations.append(
            Violation(
                "healthy-pods-untouched",
                _describe(before),
                f"a healthy pod was removed ({reason})",
                {
                    "uid": uid,
                    "node": (before.get("spec") or {}).get("nodeName"),
                    "reason": reason,
                    "fault": (_meta(before).get("annotations") or {}).get(SIM_FAULT_LABEL),
                    "ready": chaos.is_ready(before),
                },
            )
        )
    return violations, checked


def _ours(key: str) -> bool:
    return key.startswith(PREFIX)


def _taint_key(t: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))


def _owned_labels(node: Mapping[str, Any], manager: str) -> set[str]:
    """Label keys ``manager`` owns according to the Node's managedFields."""
    keys: set[str] = set()
    for entry in _meta(node).get("managedFields") or []:
        if entry.get("manager") != manager:
            continue
        labels = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {}
        keys.update(k[2:] for k in labels if k.startswith("f:"))
    return keys


def foreign_labels_untouched(record: Record) -> tuple[list[Violation], int]:
    violations: list[Violation] = []
    checked = 0
    writes: dict[str, list[OperatorWrite]] = {}
    for w in sorted(record.operator, key=lambda w: w.rv):
        writes.setdefault(w.node, []).append(w)
    status_set = {w.node for w in record.operator if PRESSURE_LABEL_KEY in w.labels}
    said: set[tuple[str, str]] = set()

    def violate(subject: str, key: str, message: str, evidence: JSON) -> None:
        # One violation per node and key: every later version repeats the first.
        if (subject, key) not in said:
            said.add((subject, key))
            violations.append(Violation("foreign-labels-untouched", subject, message, evidence))

    for seen in record.nodes:
        node = seen.node
        name = str(_meta(node).get("name"))
        rv = _rv(node)
        labels = _meta(node).get("labels") or {}
        taints = {_taint_key(t) for t in (node.get("spec") or {}).get("taints") or []}
        # What the operator's writes up to this version say.
        want_labels: dict[str, str | None] = {}
        want_taints: tuple[JSON, ...] | None = None
        want_cordon: bool | None = None
        for w in writes.get(name, []):
            if w.rv > rv:
                break
            want_labels.update(w.labels)
            if w.taints is not None:
                want_taints = w.taints
            if w.unschedulable is not None:
                want_cordon = w.unschedulable
        if want_labels or want_taints is not None or want_cordon is not None:
            checked += 1
        evidence = {"node": name, "resourceVersion": rv}
        for key, value in sorted(want_labels.items()):
            if _ours(key) or labels.get(key) == value:
                continue
            violate(
                f"Node {name}",
                key,
                f"the operator's label {key}={value} reads {labels.get(key)!r}",
                {**evidence, "label": key, "operator": value, "found": labels.get(key)},
            )
        for t in want_taints or ():
            if not _ours(str(t.get("key", ""))) and _taint_key(t) not in taints:
                violate(
                    f"Node {name}",
                    f"taint {t.get('key')}",
                    f"the operator's taint {t.get('key')}:{t.get('effect')} is gone",
                    {**evidence, "taint": dict(t), "taints": sorted(taints)},
                )
        cordoned = bool((node.get("spec") or {}).get("unschedulable"))
        if want_cordon is not None and cordoned != want_cordon:
            violate(
                f"Node {name}",
                "spec.unschedulable",
                f"the operator {'cordoned' if want_cordon else 'uncordoned'} the node; "
                f"it reads unschedulable={cordoned}",
                evidence,
            )
        for key in sorted(_owned_labels(node, COMPONENT)):
            if _ours(key) or (key == PRESSURE_LABEL_KEY and name not in status_set):
                continue
            violate(
                f"Node {name}",
                f"manager {key}",
                f"our field manager ({COMPONENT}) owns the foreign label {key}",
                {**evidence, "label": key, "value": labels.get(key)},
            )
    return violations, checked


def _scheduled_message(pod: Mapping[str, Any]) -> str:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message", ""))
    return ""


def system_critical_scheduled(record: Record) -> tuple[list[Violation], int]:
    violations: list[Violation] = []
    checked = 0
    for uid, facts in sorted(record.pods.items()):
        pod = facts.before_deletion or facts.last
        if not is_system_critical(pod):
            continue
        checked += 1
        until = facts.bound_at
        if until is None:
            ends = [t for t in (facts.deleting_at, record.ended_at) if t is not None]
            until = min(ends)
        waited = until - facts.first_seen
        if waited <= record.pending_grace:
            continue
        violations.append(
            Violation(
                "system-critical-scheduled",
                _describe(pod),
                f"a {(pod.get('spec') or {}).get('priorityClassName') or 'system-critical'} pod "
                f"waited {waited:.0f} s to be scheduled (grace {record.pending_grace:.0f} s)",
                {
                    "uid": uid,
                    "schedulerName": (pod.get("spec") or {}).get("schedulerName"),
                    "message": _scheduled_message(pod),
                    "bound": facts.bound_at is not None,
                },
            )
        )
    return violations, checked


def _identity(pod: Mapping[str, Any]) -> str | None:
    """A pod's identity across its replacements, where it has one."""
    ns = _meta(pod).get("namespace")
    owner = _controller(pod)
    if owner is None:
        origin = (_meta(pod).get("annotations") or {}).get(ORIGIN_ANNOTATION)
        return f"pod {ns}/{origin or _meta(pod).get('name')}"
    if owner.get("kind") == "StatefulSet":
        return f"StatefulSet {ns}/{owner.get('name')} pod {_meta(pod).get('name')}"
    return None


def evicted_once_per_reason(record: Record) -> tuple[list[Violation], int]:
    idx = _Index(record)
    removals: dict[tuple[str, str], list[tuple[float, str, str]]] = {}
    for uid, facts in record.pods.items():
        reason = idx.removal_reason(uid, facts.last)
        identity = _identity(facts.last)
        if reason is None or identity is None:
            continue
        at = facts.deleting_at if facts.deleting_at is not None else record.ended_at
        node = str((facts.last.get("spec") or {}).get("nodeName"))
        removals.setdefault((identity, reason), []).append((at, uid, node))
    violations: list[Violation] = []
    for (identity, reason), times in sorted(removals.items()):
        times.sort()
        for (t1, u1, n1), (t2, u2, n2) in itertools.pairwise(times):
            if t2 - t1 < record.evict_window:
                violations.append(
                    Violation(
                        "evicted-once-per-reason",
                        identity,
                        f"removed twice for {reason} within {t2 - t1:.0f} s "
                        f"(window {record.evict_window:.0f} s)",
                        {"first": {"uid": u1, "node": n1}, "second": {"uid": u2, "node": n2}},
                    )
                )
                break
    return violations, sum(len(v) for v in removals.values())


def suspect_needs_two_workloads(record: Record) -> tuple[list[Violation], int]:
    violations: list[Violation] = []
    checked = 0
    suspect: dict[str, bool] = {}
    for seen in record.nodes:
        name = str(_meta(seen.node).get("name"))
        now = SUSPECT_LABEL in (_meta(seen.node).get("labels") or {})
        was, suspect[name] = suspect.get(name, False), now
        if not now or was:
            continue
        checked += 1
        failing = sorted(
            {
                workload_of(f.last, record.owners)
                for f in record.pods.values()
                if f.failing_at is not None
                and seen.at - record.suspect_window <= f.failing_at <= seen.at
                and (f.last.get("spec") or {}).get("nodeName") == name
            }
        )
        if len(failing) < 2:
            health = (_meta(seen.node).get("annotations") or {}).get(NODE_HEALTH_ANNOTATION)
            violations.append(
                Violation(
                    "suspect-needs-two-workloads",
                    f"Node {name}",
                    f"turned suspect with {len(failing)} workload(s) failing on it: "
                    f"{', '.join(failing) or 'none'}",
                    {
                        "workloads": failing,
                        "node_health": health,
                        "resourceVersion": _rv(seen.node),
                    },
                )
            )
    return violations, checked


def budget_kept_when_broken_everywhere(record: Record) -> tuple[list[Violation], int]:
    idx = _Index(record)
    violations: list[Violation] = []
    for workload, budget in sorted(record.broken.items()):
        pods = {
            uid: f.last
            for uid, f in record.pods.items()
            if workload_of(f.last, record.owners) == workload
        }
        moved = sorted(
            _describe(pod)
            for uid, pod in pods.items()
            if idx.removal_reason(uid, pod) == REASON_RESCHEDULED
        )
        holders = {str(o.get("uid")) for o in map(_controller, pods.values()) if o is not None}
        said = Counter(
            str(e.get("reason"))
            for uid in holders
            for e in idx.about.get(uid, [])
            if e.get("reason") in (REASON_RETRIES_EXHAUSTED, REASON_MOVES_STOPPED)
        )
        counts = {
            str((e.get("involvedObject") or {}).get("uid")): int(e.get("count") or 1)
            for e in idx.events
            if e.get("reason") == REASON_MOVES_STOPPED
            and (e.get("involvedObject") or {}).get("uid") in holders
        }
        evidence = {"moves": moved, "budget": budget, "events": dict(said), "stopped": counts}
        if said[REASON_RETRIES_EXHAUSTED] or len(moved) >= budget:
            violations.append(
                Violation(
                    "budget-kept-when-broken-everywhere",
                    workload,
                    f"broken on every node, yet moved {len(moved)} time(s) of {budget}"
                    + (" until RetriesExhausted" if said[REASON_RETRIES_EXHAUSTED] else ""),
                    evidence,
                )
            )
        elif any(n > 1 for n in counts.values()):
            violations.append(
                Violation(
                    "budget-kept-when-broken-everywhere",
                    workload,
                    f"{REASON_MOVES_STOPPED} said more than once: {counts}",
                    evidence,
                )
            )
    return violations, len(record.broken)


def node_fixable_recovered(record: Record) -> tuple[list[Violation], int]:
    objects = [
        o
        for o in record.objects
        if o.get("kind") in ("Deployment", "ReplicaSet", "StatefulSet", "Job", "Pod")
        and _meta(o).get("namespace") in record.recovery_namespaces
    ]
    seen = {
        uid: f.last
        for uid, f in record.pods.items()
        if _meta(f.last).get("namespace") in record.recovery_namespaces
    }
    gone = frozenset(uid for uid in seen if record.pods[uid].gone)
    found, checked = chaos.replicas_healthy(
        chaos.Snapshot(record.faulty_nodes, objects, seen, gone)
    )
    return [
        Violation("node-fixable-recovered", v.subject, v.message, v.evidence) for v in found
    ], checked


def check(record: Record) -> Verdict:
    """Every invariant, in the order of the module docstring."""
    results = [
        healthy_pods_untouched(record),
        foreign_labels_untouched(record),
        system_critical_scheduled(record),
        evicted_once_per_reason(record),
        suspect_needs_two_workloads(record),
        budget_kept_when_broken_everywhere(record),
        node_fixable_recovered(record),
    ]
    return Verdict(
        violations=tuple(v for found, _ in results for v in found),
        checked={name: n for name, (_, n) in zip(INVARIANTS, results, strict=True)},
    )


def moves(record: Record) -> dict[str, int]:
    """Pods we removed, by the reason of our Event."""
    idx = _Index(record)
    out: dict[str, int] = {}
    for uid, facts in record.pods.items():
        reason = idx.removal_reason(uid, facts.last)
        if reason is not None:
            out[reason] = out.get(reason, 0) + 1
    return out
