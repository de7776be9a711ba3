"""What must hold after a soak on a production-like cluster: do no harm.

Pure functions of a :class:`Record`, the facts the soak's own watches gathered (every pod and
Node as seen, with the harness's clock; the Jobs and ReplicaSets that owned pods; the Events;
what the harness itself, standing in for the cluster's operator, wrote onto Nodes), each
returning :class:`Violation` s with the evidence a person needs. Which pod is failing, which
workload a pod belongs to and when a node turned suspect are read from the API objects with
readers of their own, so that a bug in the product cannot hide itself. What is the product's:
the Event naming rule (``shared.pods.update_annotations.bodies.event_name``: the contract by
which a move's Event is found), the workload family of a name (``shared.api.workloadid.family``:
how the health record names workloads), and, for ``moved-on-evidence`` only, the full rules
themselves (``shared.workloads.evidence.failing_now``: ``classify`` and ``stuck_pending``), which
is what a move before them is told apart from.

A *lookalike* (``Record.lookalikes``) is a workload that fails, or looks stuck, for no node's
fault: pods left terminal long ago, an application broken on every node, a big image pulling
slowly beside siblings that had it, a sandbox its own network attachment keeps from being
created, a container its own restart rules restart in place. It is no witness against a node
without a fault.

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
    within ``suspect_window`` before, lookalikes not counted on a node without a fault. A
    workload is the top of a pod's owner chain: a Deployment (through its ReplicaSets), a
    CronJob (through its Jobs: every run is a new Job of the same workload), a StatefulSet, a
    Job, or a bare pod's lineage.
``budget-kept-when-broken-everywhere``
    A workload whose application is broken on every node (the local kubelet fails its pods
    wherever they run: the fault label on the pod itself) cannot be helped by a move: it never
    spends its whole budget (no ``RetriesExhausted`` about it, fewer moves than the budget
    allows), and the ``MovesStopped`` Warning that says so is recorded at most once per holder.
``node-fixable-recovered``
    Every workload of the recovery namespaces (opted in, failing only because of a faulty node)
    ends with every replica Ready on a node without a fault: the chaos suite's
    ``replicas-healthy`` (dev/bench/chaos/invariants.py), judged on the same objects.
``bad-nodes-at-once-recovered``
    The same for the Deployments that prefer several bad nodes at once (``must_recover``): a
    stop rule that took their failures for an application broken everywhere stranded them.
``lookalikes-left-alone``
    No pod of a lookalike no move helps (``NEVER_MOVED_KINDS``) is removed by us, and none of
    their holders is charged a move (our state annotation on it).
``no-mark-from-a-lookalike``
    Every moved-off mark on a Node was written by a move of ours off it, and on a node without a
    fault by a move of a workload that is no lookalike.
``moved-on-evidence``
    Every pod we moved for a failure failed the full rules then, or was moved early on evidence
    that held then (its node suspect; another workload, no lookalike on a node without a fault,
    failing there; a pod of its ReplicaSet Ready elsewhere, never for a workload broken
    everywhere), by the rule its reply names.
``forged-claims-change-nothing``
    What the forger claimed (``Forged``) changed nothing: no pod it named removed, no holder of
    theirs charged, no Event of ours about them, no health record counting them or a workload
    it made up.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from dev.bench.chaos import invariants as chaos
from dev.bench.chaos.invariants import Verdict, Violation
from dev.localcluster.keys import (
    SIM_FAULT_LABEL,
)
from shared.api.keys import (
    COMPONENT,
    EVENT_POD_RESCHEDULED,
    MOVED_OFF_LABEL,
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
from shared.api.workloadid import family
from shared.platform.config import Config
from shared.pods.update_annotations.bodies import ORIGIN_ANNOTATION, event_name
from shared.workloads.classify import Failure, Started, started_containers
from shared.workloads.evidence import PodEvidence, failing_now
from shared.workloads.owners import Ref
from shared.workloads.podevents import image_pulls, warning_events

JSON = dict[str, Any]

INVARIANTS: Final = (
    "healthy-pods-untouched",
    "foreign-labels-untouched",
    "system-critical-scheduled",
    "evicted-once-per-reason",
    "suspect-needs-two-workloads",
    "budget-kept-when-broken-everywhere",
    "node-fixable-recovered",
    "bad-nodes-at-once-recovered",
    "lookalikes-left-alone",
    "no-mark-from-a-lookalike",
    "moved-on-evidence",
    "forged-claims-change-nothing",
)
# What a lookalike workload looks like (Record.lookalikes): a pod left terminal long ago, an
# application that fails on every node, a big image pulling slowly beside siblings that had it,
# a sandbox its own network attachment keeps from being created, a container restarted in place
# by its own restart rules.
LOOKALIKE_KINDS: Final = ("terminal", "everywhere", "slow-pull", "multus", "restart-rules")
# The lookalikes no move of ours may touch at all (a workload broken everywhere may be moved
# until the stop: budget-kept-when-broken-everywhere judges it).
NEVER_MOVED_KINDS: Final = frozenset({"terminal", "slow-pull", "multus", "restart-rules"})
# How long after a moved-off mark's time the move that wrote it removes its pod: the mark is
# written first, then the state, then the removal (seconds, on the harness's clock).
MARK_TO_REMOVAL: Final = (-2.0, 30.0)
# How far back before a move the pod's versions are read: what the move may have read.
MOVE_READ_WINDOW: Final = 10.0
# The rules a move's reply names besides the thresholds (the reply's evidence.rule, or its
# message): the early ones, and the kubelet's Event about a pod its controller removed first.
EARLY_RULES: Final = ("suspect-node", "other-workloads", "ready-elsewhere", "kubelet-event")
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
    # The last few versions seen before its deletion, with when each was seen (oldest first):
    # what a move may have read a moment before the pod's last status.
    recent: tuple[tuple[float, JSON], ...] = ()
    # When it turned Ready or not Ready, as seen (oldest first; the first entry is how it was
    # first seen).
    ready_changes: tuple[tuple[float, bool], ...] = ()
    # The resourceVersion of its deletion (its first version with a deletionTimestamp, or the
    # object of its DELETED event): an etcd revision, ordered with every Node version's.
    deleting_rv: int | None = None
    # When it was first seen bound with a phase past Pending (its containers started, or it
    # ended).
    started_at: float | None = None


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
class Forged:
    """What the forger posted, straight to every function and to the Broker: reports and
    replies about real healthy pods (``pods``: uid -> "ns/name"), naming healthy ``nodes``, and
    about pods and workloads nobody made (``made_up_uids``; ``made_up_workloads`` as
    "ns/name" of each made-up ReplicaSet and Deployment); ``ids`` are its CloudEvents' ids."""

    pods: Mapping[str, str] = field(default_factory=dict)
    nodes: frozenset[str] = frozenset()
    made_up_uids: frozenset[str] = frozenset()
    made_up_workloads: frozenset[str] = frozenset()
    ids: frozenset[str] = frozenset()


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
    # The lookalikes of a node's failure: workloads ("Kind ns/name", the top of the owner chain)
    # that fail, or look stuck, for reasons no node causes, each with what it looks like (one of
    # LOOKALIKE_KINDS). They never count towards a node's suspicion or mark.
    lookalikes: Mapping[str, str] = field(default_factory=dict)
    # Deployments that prefer several bad nodes at once and must end with every replica Ready
    # on a healthy node ("Deployment ns/name").
    must_recover: frozenset[str] = frozenset()
    # What the forger claimed (None: no forger ran).
    forged: Forged | None = None
    # The functions' settings (KN_RESCHEDULER_* variables): the rules the moves are judged by.
    settings: Mapping[str, str] = field(default_factory=dict)
    # The io.kn-rescheduler.pod.rescheduled replies our functions sent (the Broker's archive,
    # the forger's own posts taken out), as structured CloudEvents.
    replies: Sequence[JSON] = ()
    # The holders (ReplicaSets, Jobs) seen carrying our state annotation, by uid, with when first.
    state_written: Mapping[str, float] = field(default_factory=dict)


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
        seen_failing = {
            workload_of(f.last, record.owners)
            for f in record.pods.values()
            if f.failing_at is not None
            and seen.at - record.suspect_window <= f.failing_at <= seen.at
            and (f.last.get("spec") or {}).get("nodeName") == name
        }
        # A lookalike fails for no node's fault (left terminal long ago, broken everywhere,
        # its own configuration): it is no witness against a node that has nothing wrong. (A
        # node with a fault fails every pod bound there: whatever else is wrong with a pod, the
        # node fails it too.)
        lookalike = (
            []
            if name in record.faulty_nodes
            else sorted(w for w in seen_failing if w in record.lookalikes)
        )
        failing = sorted(seen_failing - set(lookalike))
        if len(failing) < 2:
            health = (_meta(seen.node).get("annotations") or {}).get(NODE_HEALTH_ANNOTATION)
            violations.append(
                Violation(
                    "suspect-needs-two-workloads",
                    f"Node {name}",
                    f"turned suspect with {len(failing)} workload(s) failing on it for a reason "
                    f"a node may cause: {', '.join(failing) or 'none'}"
                    + (f" (and the lookalike(s) {', '.join(lookalike)})" if lookalike else ""),
                    {
                        "workloads": failing,
                        "lookalikes": {w: record.lookalikes[w] for w in lookalike},
                        "node_health": health,
                        "resourceVersion": _rv(seen.node),
                        "at": seen.at,
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


def bad_nodes_at_once_recovered(record: Record) -> tuple[list[Violation], int]:
    """Every replica of the Deployments that prefer several bad nodes at once ends Ready on a
    node without a fault: failing where other workloads fail too is evidence against the nodes,
    never a reason to stop moving (``MovesStopped`` about them is given as evidence)."""
    idx = _Index(record)
    wanted = set(record.must_recover)
    deployments = [
        d
        for d in idx.by_kind.get("Deployment", [])
        if f"Deployment {_meta(d).get('namespace')}/{_meta(d).get('name')}" in wanted
    ]
    found_names = {
        f"Deployment {_meta(d).get('namespace')}/{_meta(d).get('name')}" for d in deployments
    }
    violations = [
        Violation("bad-nodes-at-once-recovered", name, "the Deployment is gone", {})
        for name in sorted(wanted - found_names)
    ]
    uids = {_meta(d).get("uid") for d in deployments}
    sets = [
        rs
        for rs in [*idx.by_kind.get("ReplicaSet", []), *record.owners.values()]
        if rs.get("kind") == "ReplicaSet" and (_controller(rs) or {}).get("uid") in uids
    ]
    set_uids = {_meta(rs).get("uid") for rs in sets}
    pods = [p for p in idx.by_kind.get("Pod", []) if (_controller(p) or {}).get("uid") in set_uids]
    seen = {
        uid: f.last
        for uid, f in record.pods.items()
        if (_controller(f.last) or {}).get("uid") in set_uids
    }
    gone = frozenset(uid for uid in seen if record.pods[uid].gone)
    unique_sets = list({_meta(rs).get("uid"): rs for rs in sets}.values())
    found, checked = chaos.replicas_healthy(
        chaos.Snapshot(record.faulty_nodes, [*deployments, *unique_sets, *pods], seen, gone)
    )
    stopped = {
        str((e.get("involvedObject") or {}).get("name")): int(e.get("count") or 1)
        for e in idx.events
        if e.get("reason") == REASON_MOVES_STOPPED
        and (e.get("involvedObject") or {}).get("uid") in set_uids
    }
    for v in found:
        violations.append(
            Violation(
                "bad-nodes-at-once-recovered",
                v.subject,
                v.message,
                {**v.evidence, "moves_stopped": stopped},
            )
        )
    return violations, checked


def _lookalike_of(record: Record, pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(workload, what it looks like) when ``pod`` belongs to a lookalike workload."""
    workload = workload_of(pod, record.owners)
    kind = record.lookalikes.get(workload)
    return (workload, kind) if kind is not None else None


def lookalikes_left_alone(record: Record) -> tuple[list[Violation], int]:
    """No pod of a lookalike that no move can help (left terminal, a slow pull, a missing
    network attachment, restarts its own rules ask for) is removed by us, and none of their
    holders is charged a move (our state annotation written on it)."""
    idx = _Index(record)
    violations: list[Violation] = []
    checked = 0
    holders: dict[str, tuple[str, str]] = {}
    for uid, facts in sorted(record.pods.items()):
        found = _lookalike_of(record, facts.last)
        if found is None or found[1] not in NEVER_MOVED_KINDS:
            continue
        checked += 1
        owner = _controller(facts.last)
        if owner is not None and owner.get("uid"):
            holders[str(owner["uid"])] = found
        reason = idx.removal_reason(uid, facts.last)
        if reason is None:
            continue
        before = facts.before_deletion or facts.last
        violations.append(
            Violation(
                "lookalikes-left-alone",
                _describe(before),
                f"a pod of {found[0]} ({found[1]}: no move helps it) was removed ({reason})",
                {
                    "uid": uid,
                    "node": (before.get("spec") or {}).get("nodeName"),
                    "reason": reason,
                    "at": facts.deleting_at,
                    "status": _status_summary(before),
                },
            )
        )
    for holder, (workload, kind) in sorted(holders.items()):
        at = record.state_written.get(holder)
        if at is not None:
            violations.append(
                Violation(
                    "lookalikes-left-alone",
                    workload,
                    f"a move was charged to {workload} ({kind}: no move helps it): its holder "
                    "carries our state annotation",
                    {"holder": holder, "first_seen_at": at},
                )
            )
    return violations, checked


def _status_summary(pod: Mapping[str, Any]) -> JSON:
    """What a person needs of a pod's status: phase, reason, each container's state."""
    status = pod.get("status") or {}
    containers = {}
    for c in status.get("containerStatuses") or []:
        state = c.get("state") or {}
        which = next(iter(state), "")
        block = state.get(which) or {}
        containers[str(c.get("name"))] = {
            "state": which,
            "reason": block.get("reason"),
            "exitCode": block.get("exitCode"),
            "restartCount": c.get("restartCount"),
            "ready": c.get("ready"),
        }
    conditions = {str(c.get("type")): c.get("status") for c in status.get("conditions") or [] if c}
    return {
        "phase": status.get("phase"),
        "reason": status.get("reason"),
        "conditions": conditions,
        "containers": containers,
    }


def _removals_off(record: Record, idx: _Index) -> dict[str, list[tuple[float, str, str]]]:
    """Our removals of failing pods (Rescheduled, ExclusionsCleared), by the node they were
    on: (when, pod uid, workload)."""
    out: dict[str, list[tuple[float, str, str]]] = {}
    for uid, facts in record.pods.items():
        reason = idx.removal_reason(uid, facts.last)
        if reason not in (REASON_RESCHEDULED, REASON_EXCLUSIONS_CLEARED):
            continue
        node = str((facts.last.get("spec") or {}).get("nodeName") or "")
        at = facts.deleting_at if facts.deleting_at is not None else record.ended_at
        out.setdefault(node, []).append((at, uid, workload_of(facts.last, record.owners)))
    return out


def no_mark_from_a_lookalike(record: Record) -> tuple[list[Violation], int]:
    """Every moved-off mark (``MOVED_OFF_LABEL``, its value the move's time in Unix seconds)
    is written by a move of ours off that node, within ``MARK_TO_REMOVAL`` of the mark's time,
    and on a node without a fault by a move of a workload a node may fail, not of a
    lookalike: a lookalike's failure says nothing against a node that has nothing wrong."""
    idx = _Index(record)
    removals = _removals_off(record, idx)
    violations: list[Violation] = []
    checked = 0
    last: dict[str, str | None] = {}
    for seen in record.nodes:
        name = str(_meta(seen.node).get("name"))
        value = (_meta(seen.node).get("labels") or {}).get(MOVED_OFF_LABEL)
        was, last[name] = last.get(name), value
        if value is None or value == was:
            continue
        checked += 1
        try:
            at = float(value)
        except ValueError:
            at = seen.at
        near = [
            (t, uid, w)
            for t, uid, w in removals.get(name, [])
            if at + MARK_TO_REMOVAL[0] <= t <= at + MARK_TO_REMOVAL[1]
        ]
        # On a node with a fault any move off it is the node's doing; on one without, only a
        # workload a node may fail explains a mark.
        real = [w for _, _, w in near if w not in record.lookalikes or name in record.faulty_nodes]
        if real:
            continue
        lookalike = sorted({w for _, _, w in near})
        violations.append(
            Violation(
                "no-mark-from-a-lookalike",
                f"Node {name}",
                f"marked moved-off ({MOVED_OFF_LABEL}={value})"
                + (
                    f" by a move of the lookalike(s) {', '.join(lookalike)}"
                    if lookalike
                    else " with no move of ours off it then"
                ),
                {
                    "value": value,
                    "resourceVersion": _rv(seen.node),
                    "seen_at": seen.at,
                    "moves_near": [
                        {"at": t, "uid": u, "workload": w, "looks_like": record.lookalikes.get(w)}
                        for t, u, w in near
                    ],
                },
            )
        )
    return violations, checked


def _node_versions(record: Record) -> dict[str, list[NodeSeen]]:
    out: dict[str, list[NodeSeen]] = {}
    for seen in record.nodes:
        out.setdefault(str(_meta(seen.node).get("name")), []).append(seen)
    return out


def _node_at(versions: Sequence[NodeSeen], at: float, rv: int | None = None) -> JSON | None:
    """The Node as it was when a pod was deleted: its newest version before the deletion's
    resourceVersion ``rv`` (etcd revisions order a Node's versions and a pod's deletion
    exactly, whatever the watches' delays), else the newest one seen by ``at``."""
    found: JSON | None = None
    for seen in versions:
        if (_rv(seen.node) > rv) if rv is not None else (seen.at > at):
            break
        found = seen.node
    return found


def health_entries(node: Mapping[str, Any] | None) -> list[JSON]:
    """The failures in a Node's health record (``NODE_HEALTH_ANNOTATION``: a JSON object with a
    list ``failures`` of {at, workload, pod, reason}); none when it is absent or unreadable."""
    raw = (_meta(node or {}).get("annotations") or {}).get(NODE_HEALTH_ANNOTATION)
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except ValueError:
        return []
    entries = data.get("failures") if isinstance(data, dict) else None
    return [e for e in entries or [] if isinstance(e, dict)]


def _ready_at(facts: PodFacts, at: float) -> bool:
    ready = False
    for t, value in facts.ready_changes:
        if t > at:
            break
        ready = value
    return ready and (facts.deleting_at is None or facts.deleting_at > at)


def said_rule(reply: Mapping[str, Any] | None) -> str | None:
    """The rule a move's reply says it was made by: its ``evidence.rule`` when it has one, else
    read from its message ("; before the thresholds: <why>" for an early move); None without a
    reply."""
    if reply is None:
        return None
    data = reply.get("data") or {}
    evidence = data.get("evidence")
    if isinstance(evidence, dict) and isinstance(evidence.get("rule"), str):
        return str(evidence["rule"])
    message = str(data.get("message") or "")
    marker = "; before the thresholds: "
    if marker not in message:
        return "thresholds"
    why = message.split(marker, 1)[1]
    if " is suspect" in why:
        return "suspect-node"
    if "pod(s) of its ReplicaSet are Ready elsewhere" in why:
        return "ready-elsewhere"
    if "other workload(s)" in why:
        return "other-workloads"
    return "other"


def _full_rules(
    record: Record, cfg: Config, facts: PodFacts, at: float, evidence: PodEvidence
) -> tuple[Failure | None, JSON]:
    """The pod's failure by the full rules on any version seen in the moments before its move
    (judged at the move's time); the version judged."""
    versions = [pod for t, pod in facts.recent if t >= at - MOVE_READ_WINDOW]
    if facts.before_deletion is not None and all(v is not facts.before_deletion for v in versions):
        versions.append(facts.before_deletion)
    now = datetime.fromtimestamp(at, UTC)
    for pod in reversed(versions):
        found = failing_now(pod, cfg, now, evidence)  # type: ignore[arg-type]
        if found is not None:
            return found, pod
    return None, versions[-1] if versions else (facts.before_deletion or facts.last)


def _evidence_for(
    record: Record, uid: str, facts: PodFacts, at: float, warnings: Mapping[str, Any], pulls: Any
) -> PodEvidence:
    """What the sweep and update-annotations read beside the pod, from the record: its Warning
    Events, its siblings' started containers as last seen before the move, the kubelets'
    downloads."""
    owner = (_controller(facts.last) or {}).get("uid")
    started: list[Started] = []
    if owner:
        for other_uid, other in record.pods.items():
            if other_uid == uid or (_controller(other.last) or {}).get("uid") != owner:
                continue
            seen = [pod for t, pod in other.recent if t <= at] or [other.before_deletion or {}]
            started.extend(started_containers(seen[-1]))  # type: ignore[arg-type]
    return PodEvidence(tuple(warnings.get(uid, ())), tuple(started), pulls)


def moved_on_evidence(record: Record) -> tuple[list[Violation], int]:
    """Every pod our functions removed for a failure failed the full rules then
    (``classify`` / ``stuck_pending`` with the functions' settings, on what the move may have
    read, its Events and siblings beside it), or was moved early on evidence that held then:
    its node suspect (``suspect-node``), another workload failing there or in its health
    record (``other-workloads``; on a node without a fault, not a lookalike: it fails for no
    node's fault), a pod of its ReplicaSet Ready on another node (``ready-elsewhere``; never
    for a workload that fails on every node). The rule is the move's reply's
    (``evidence.rule``, else its message)."""
    idx = _Index(record)
    cfg = Config.from_env(dict(record.settings))
    events = idx.events
    warnings = warning_events(events)
    pulls = image_pulls(events)
    replies = {
        str((r.get("data") or {}).get("uid")): r
        for r in record.replies
        if r.get("type") == EVENT_POD_RESCHEDULED
    }
    versions = _node_versions(record)
    violations: list[Violation] = []
    checked = 0
    for uid, facts in sorted(record.pods.items()):
        reason = idx.removal_reason(uid, facts.last)
        reply = replies.get(uid)
        if reason not in (REASON_RESCHEDULED, REASON_EXCLUSIONS_CLEARED) and reply is None:
            continue
        if reason == REASON_REBALANCED:
            continue
        checked += 1
        at = facts.deleting_at if facts.deleting_at is not None else record.ended_at
        evidence = _evidence_for(record, uid, facts, at, warnings, pulls)
        full, judged = _full_rules(record, cfg, facts, at, evidence)
        if full is not None:
            continue
        rule = said_rule(reply)
        node = str((judged.get("spec") or {}).get("nodeName") or "")
        workload = workload_of(judged, record.owners)
        held, why = _early_evidence(record, versions, rule, uid, facts, judged, node, at)
        # (A pod moved on the kubelet's Event was gone already: its last status may say little.)
        if held and (is_failing(judged) or rule == "kubelet-event"):
            continue
        violations.append(
            Violation(
                "moved-on-evidence",
                _describe(judged),
                f"moved off {node} before its thresholds, "
                + (f"by the rule {rule}: {why}" if rule else "and no reply says on what evidence")
                + ("" if is_failing(judged) else "; it was not even failing"),
                {
                    "uid": uid,
                    "workload": workload,
                    "node": node,
                    "removed_at": at,
                    "reason": reason,
                    "rule": rule,
                    "reply_message": ((reply or {}).get("data") or {}).get("message"),
                    "status": _status_summary(judged),
                },
            )
        )
    return violations, checked


def _early_evidence(
    record: Record,
    versions: Mapping[str, Sequence[NodeSeen]],
    rule: str | None,
    uid: str,
    facts: PodFacts,
    pod: JSON,
    node: str,
    at: float,
) -> tuple[bool, str]:
    """Whether the evidence ``rule`` names held at ``at``, and what was found."""
    if rule == "suspect-node":
        seen = _node_at(versions.get(node, ()), at + 1.0, facts.deleting_rv)
        if seen is not None and SUSPECT_LABEL in (_meta(seen).get("labels") or {}):
            return True, "the node was suspect"
        return False, f"node {node} was not suspect then"
    if rule == "other-workloads":
        mine = family(workload_of(pod, record.owners))
        others = {
            workload_of(f.last, record.owners)
            for other_uid, f in record.pods.items()
            if other_uid != uid
            and (f.last.get("spec") or {}).get("nodeName") == node
            and f.failing_at is not None
            and f.failing_at <= at
            and (f.deleting_at is None or f.deleting_at >= at - 2.0)
            and ((f.before_deletion or f.last).get("status") or {}).get("phase")
            not in ("Failed", "Succeeded")
            and family(workload_of(f.last, record.owners)) != mine
        }
        seen = _node_at(versions.get(node, ()), at + 1.0, facts.deleting_rv)
        window = record.suspect_window
        recorded = {
            str(e.get("workload"))
            for e in health_entries(seen)
            if family(str(e.get("workload"))) != mine
            and _entry_time(e) is not None
            and at - window <= float(_entry_time(e) or 0) <= at + 1.0
        }
        # A lookalike is no witness against a node that has nothing wrong.
        lookalikes = {family(w) for w in record.lookalikes}
        faulty = node in record.faulty_nodes
        witnesses = sorted(w for w in others | recorded if faulty or family(w) not in lookalikes)
        if witnesses:
            return True, f"{', '.join(witnesses)} failed there (now, or in its health record)"
        if others or recorded:
            return False, (
                f"only lookalike(s) failed on {node}, a node without a fault: "
                f"{', '.join(sorted(others | recorded))}"
            )
        return False, f"no other workload failed on {node} then, none in its health record"
    if rule == "ready-elsewhere":
        kind = record.lookalikes.get(workload_of(pod, record.owners))
        if kind == "everywhere":
            return False, (
                "its workload fails on every node: a twin Ready between two crashes proves no "
                "node better"
            )
        owner = (_controller(pod) or {}).get("uid")
        ready = sorted(
            _describe(f.last)
            for other_uid, f in record.pods.items()
            if other_uid != uid
            and owner
            and (_controller(f.last) or {}).get("uid") == owner
            and (f.last.get("spec") or {}).get("nodeName") not in (node, None)
            and _ready_at(f, at)
        )
        if ready:
            return True, f"{', '.join(ready)} Ready elsewhere"
        return False, "no pod of its ReplicaSet was Ready on another node then"
    if rule == "kubelet-event":
        # A pod its controller removed first (a StatefulSet's): moved on the kubelet's own
        # Warning Event about it, from its node.
        said = [
            e
            for e in record.objects
            if e.get("kind") == "Event"
            and (e.get("involvedObject") or {}).get("uid") == uid
            and e.get("type") == "Warning"
            and "kubelet" in ((e.get("source") or {}).get("component"), e.get("reportingComponent"))
        ]
        if said:
            return True, f"the kubelet said {said[0].get('reason')} about it"
        return False, "no Warning Event of the kubelet about it"
    if rule == "thresholds":
        return False, "its reply says the thresholds, which its last statuses do not meet"
    return False, f"the rule {rule!r} is not one of {', '.join(EARLY_RULES)}"


def _entry_time(entry: Mapping[str, Any]) -> float | None:
    try:
        return datetime.fromisoformat(str(entry.get("at")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def forged_claims_change_nothing(record: Record) -> tuple[list[Violation], int]:
    """What the forger claimed changed nothing: no pod it named was removed by us (nor deleted
    by anyone, on a node the operator did not drain), no holder of theirs carries our state, no
    Event of ours is about them or names a made-up pod, and no Node's health record ever named
    a pod it named or a workload it made up."""
    forged = record.forged
    if forged is None:
        return [], 0
    idx = _Index(record)
    drained = {w.node for w in record.operator if w.unschedulable}
    violations: list[Violation] = []
    checked = 0
    named = {**forged.pods}
    holders: dict[str, str] = {}
    for uid, where in sorted(named.items()):
        checked += 1
        facts = record.pods.get(uid)
        if facts is None:
            continue
        owner = _controller(facts.last)
        if owner is not None and owner.get("uid"):
            holders[str(owner["uid"])] = where
        reason = idx.removal_reason(uid, facts.last)
        node = (facts.last.get("spec") or {}).get("nodeName")
        if reason is None and (facts.deleting_at is None or node in drained):
            continue
        violations.append(
            Violation(
                "forged-claims-change-nothing",
                where,
                "a healthy pod the forger named was "
                + (f"removed ({reason})" if reason else "deleted"),
                {"uid": uid, "node": node, "at": facts.deleting_at},
            )
        )
    for holder, where in sorted(holders.items()):
        if holder in record.state_written:
            violations.append(
                Violation(
                    "forged-claims-change-nothing",
                    where,
                    "the holder of a healthy pod the forger named carries our state annotation",
                    {"holder": holder, "first_seen_at": record.state_written[holder]},
                )
            )
    uids = set(named) | set(forged.made_up_uids)
    subjects = set(holders) | set(named)
    for e in idx.events:
        if not _ours_event(e):
            continue
        involved = e.get("involvedObject") or {}
        message = str(e.get("message") or "")
        made_up = sorted(w for w in forged.made_up_workloads if w.split("/", 1)[-1] in message)
        if involved.get("uid") in subjects or made_up:
            violations.append(
                Violation(
                    "forged-claims-change-nothing",
                    f"{involved.get('kind')} {involved.get('namespace')}/{involved.get('name')}",
                    f"our {e.get('reason')} Event about what the forger claimed",
                    {"message": message, "made_up": made_up},
                )
            )
    said: set[tuple[str, str]] = set()
    for seen in record.nodes:
        name = str(_meta(seen.node).get("name"))
        for entry in health_entries(seen.node):
            checked += 1
            workload = str(entry.get("workload"))
            claimed = entry.get("pod") in uids or family(workload) in forged.made_up_workloads
            key = (name, str(entry.get("pod")))
            if not claimed or key in said:
                continue
            said.add(key)
            violations.append(
                Violation(
                    "forged-claims-change-nothing",
                    f"Node {name}",
                    f"its health record counts {workload} (pod {entry.get('pod')}) from a forged "
                    "claim",
                    {"entry": dict(entry), "resourceVersion": _rv(seen.node), "seen_at": seen.at},
                )
            )
    return violations, checked


def _ours_event(e: Mapping[str, Any]) -> bool:
    return (e.get("source") or {}).get("component") == COMPONENT or e.get(
        "reportingComponent"
    ) == COMPONENT


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
        bad_nodes_at_once_recovered(record),
        lookalikes_left_alone(record),
        no_mark_from_a_lookalike(record),
        moved_on_evidence(record),
        forged_claims_change_nothing(record),
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
