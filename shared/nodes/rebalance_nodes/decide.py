"""Which pods rebalance-nodes evicts, and why: the pure decision, clock passed in.

From the Nodes (their usage records, labels, allocatable, taints, cordon), the bound pods, the
facts of the workloads that own the pods on the nodes to act on, and ``now``, ``assess`` says
which nodes are hot and for how long, and ``choose`` returns a frozen plan: the evictions, each
with its reason, the node usage that justified it and the cooler node the pod fits on, and the
reasons for what was not done.

Hot. A node is hot when its measured usage (the record's current value, percent of allocatable)
is over ``cpu_threshold`` / ``memory_threshold``, or above the mean of the nodes pods may land
on (fresh record; not in maintenance, opted out, cordoned or NotReady: the drained nodes of an
upgrade would otherwise lower the mean and make healthy nodes "hot" when capacity is short) by
more than ``rebalance_gap`` points: for each resource the bound is the lower of the two. It is
acted on only after ``rebalance_hot_samples`` hot samples in a row (Koordinator's LowNodeLoad
anomaly count: a spike of one sample moves nothing). A sample is a record with a new
``sampledAt``: a record stays fresh for ``usage_stale_after`` and every evaluation reads it, so
counting evaluations would turn one spike into a streak. The count lives on the Node
(``kn-rescheduler.io/hot-streak``) with the sample it last counted; a cool evaluation, or a
record that is missing, unreadable or stale, starts it again from zero, and so does acting on
the node, the sample acted on remembered: the usage record lags the evictions by a sample or
more, and acting on the same old numbers again would drain the node far below the bound (then
its pods would come back: ping-pong). A NotReady node is never acted on: its pods are the node
lifecycle controller's.

Maintenance. A node labelled ``kn-rescheduler.io/maintenance=true`` is drained gradually: every
eligible pod is a candidate, no streak and no usage record needed, within the same limits.

Victims. Only pods of workloads that opted in (``kn-rescheduler.io/rebalance: "true"`` on the
pod's controller, which for a Deployment is its ReplicaSet: the Deployment controller copies the
Deployment's annotations onto its ReplicaSets; or the label ``kn-rescheduler.io/rebalance=true``
on the namespace), running, not terminating; never DaemonSet or static (mirror) pods, pods in
excluded namespaces, pods with the opt-out label, bare pods (nothing would recreate them), nor a
Job's pod whose eviction the Job controller would count as a failure. A pod's requests stand
in for its usage (per-pod usage would need a metrics query per pod; the node's measured usage
is what decides that it is hot, the requests which pods relieve it most). On a hot node, the
pods are taken in the order that lowers the over-threshold resources most and only as many as
bring the node to its bound: when one pod suffices, the smallest that does; else the largest.
A pod whose requests do not touch the resource that is over does not help and stays.

Fit. A pod is evicted only when a cooler node would take it: no maintenance, not cordoned,
Ready (stricter than the scheduler: a node being drained or whose kubelet is away takes
nothing, whatever the pod tolerates), a fresh record,
its usage plus the estimate of just-bound pods plus the pod's requests within the hot bound,
the requests of its pods plus this one within allocatable, the pod's nodeSelector and required
node affinity (In, NotIn, Exists, DoesNotExist, Gt, Lt; matchFields on metadata.name), its
tolerations of the node's NoSchedule and NoExecute taints (the scheduler's own filters:
k8s.io/component-helpers nodeaffinity, v1helper.TolerationsTolerateTaint), and its volumes as
the VolumeBinding and VolumeZone filters judge bound claims: each bound PersistentVolume's
required node affinity against the node's labels, its zone and region labels against the
node's. A local PV names one node, so its pod never moves (evicted, it could only come back to
its disk and be evicted again); a pod with a hostPath volume, or a claim not read or not bound,
stays too. What is already planned for a target counts for the next pod. Inter-
pod affinity and topology spread are not checked: they can only make the scheduler keep the pod
Pending, never put it back on a node it does not fit on.

Limits. At most ``rebalance_max_per_run`` evictions per evaluation, ``rebalance_max_per_node``
per node, ``rebalance_max_per_namespace`` per namespace and ``rebalance_max_per_workload`` per
workload, and never when fewer than ``rebalance_min_available`` of the workload's desired
replicas (rounded up) would stay ready, each planned eviction counted as one ready replica
less. PodDisruptionBudgets are the Eviction API's to enforce.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, cast

from shared.api import quantity
from shared.api.keys import (
    LOAD_AWARE_SCHEDULER_NAME,
    LOAD_LABEL,
    MAINTENANCE_LABEL,
    MAINTENANCE_VALUE,
    opted_out,
)
from shared.api.kubetypes import Node, Pod
from shared.api.rebalance import Streak, read_streak
from shared.api.times import format_time
from shared.api.usage import UsageError, UsageRecord, read_usage
from shared.nodes.usage import Resources, allocatable, percent_of, pod_requests
from shared.platform.config import Config
from shared.workloads.classify import controller_of, skip_reason
from shared.workloads.jobs import JobFacts, Outcome, judge_removal

# The taint the node lifecycle controller puts on a cordoned node; a pod that tolerates it may
# be placed there (the NodeUnschedulable plugin).
UNSCHEDULABLE_TAINT: Final = "node.kubernetes.io/unschedulable"
# Kinds whose pods another object recreates, and that rebalancing may evict.
WORKLOAD_KINDS: Final = ("ReplicaSet", "StatefulSet", "Job")

# Why a pod was evicted, as the metric's reason label says it.
MAINTENANCE: Final = "maintenance"
CPU_OVER_THRESHOLD: Final = "cpu-over-threshold"
MEMORY_OVER_THRESHOLD: Final = "memory-over-threshold"
CPU_ABOVE_MEAN: Final = "cpu-above-mean"
MEMORY_ABOVE_MEAN: Final = "memory-above-mean"


# -- nodes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeState:
    """One node as this evaluation sees it."""

    name: str
    # The usage record, when fresh and the allocatable readable; None otherwise.
    usage: UsageRecord | None
    allocatable: Resources | None
    maintenance: bool
    opted_out: bool
    hot: bool
    # Why hot, or why not (no fresh usage, under the bounds).
    why: str
    # The streak after this evaluation (before acting on it) and what the Node carries now.
    streak: Streak
    previous: Streak | None
    # Evictions may be chosen on this node (maintenance, or hot long enough).
    acting: bool
    reason: str = ""
    # Cordoned (spec.unschedulable), and whether its Ready condition is True.
    cordoned: bool = False
    ready: bool = True

    @property
    def cpu(self) -> float:
        return self.usage.cpu.now if self.usage else 0.0

    @property
    def memory(self) -> float:
        return self.usage.memory.now if self.usage else 0.0


@dataclass(frozen=True)
class Bounds:
    """Per resource, the usage above which a node is hot (percent of allocatable)."""

    cpu: float
    memory: float
    mean_cpu: float | None
    mean_memory: float | None


def _labels(node: Node) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def _name(obj: Node | Pod) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _cordoned(node: Node) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def _ready(node: Node) -> bool:
    """Whether the node's Ready condition is True. The kubelet posts it; when the kubelet stops
    posting, the node lifecycle controller sets it to Unknown. A node without one (just
    registered) is not ready either."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _fresh_usage(node: Node, cfg: Config, now: datetime) -> tuple[UsageRecord | None, str]:
    try:
        record = read_usage(node)
    except UsageError as err:
        return None, f"usage record unreadable ({err})"
    if record is None:
        return None, "no usage record"
    if record.is_stale(now, cfg.usage_stale_after):
        return None, f"usage record sampled {format_time(record.sampled_at)} is stale"
    return record, ""


def bounds_for(usages: Iterable[UsageRecord], cfg: Config) -> Bounds:
    """The hot bounds: the thresholds, or the mean plus the gap when that is lower."""
    records = list(usages)
    if not records:
        return Bounds(cfg.cpu_threshold, cfg.memory_threshold, None, None)
    mean_cpu = sum(r.cpu.now for r in records) / len(records)
    mean_memory = sum(r.memory.now for r in records) / len(records)
    return Bounds(
        min(cfg.cpu_threshold, mean_cpu + cfg.rebalance_gap),
        min(cfg.memory_threshold, mean_memory + cfg.rebalance_gap),
        mean_cpu,
        mean_memory,
    )


def _why_hot(record: UsageRecord, bounds: Bounds, cfg: Config) -> tuple[str, str] | None:
    """(reason code, words) when the record is over a bound; the resource most over wins."""
    over = []
    for resource, value, bound, threshold, mean in (
        ("cpu", record.cpu.now, bounds.cpu, cfg.cpu_threshold, bounds.mean_cpu),
        ("memory", record.memory.now, bounds.memory, cfg.memory_threshold, bounds.mean_memory),
    ):
        if value <= bound:
            continue
        label = "CPU" if resource == "cpu" else "memory"
        if value > threshold:
            code = f"{resource}-over-threshold"
            words = f"{label} {value:.1f} % over the threshold of {threshold:g} %"
        else:
            code = f"{resource}-above-mean"
            words = (
                f"{label} {value:.1f} % more than {cfg.rebalance_gap:g} points above the "
                f"cluster mean of {mean or 0:.1f} %"
            )
        over.append((value - bound, code, words))
    if not over:
        return None
    over.sort(reverse=True)
    return over[0][1], "; ".join(words for _, _, words in over)


def assess(
    nodes: Sequence[Node], cfg: Config, now: datetime
) -> tuple[tuple[NodeState, ...], Bounds]:
    """Each node's hot state and streak after this evaluation, and the bounds used."""
    fresh: dict[str, UsageRecord] = {}
    why_not: dict[str, str] = {}
    capacity: dict[str, Resources | None] = {}
    for node in nodes:
        name = _name(node)
        record, why = _fresh_usage(node, cfg, now)
        capacity[name] = allocatable(node)
        if record is not None and capacity[name] is None:
            record, why = None, "no readable allocatable CPU and memory"
        if record is None:
            why_not[name] = why
        else:
            fresh[name] = record
    # The mean of the nodes pods may land on: a node in maintenance or opted out is no part of
    # the cluster rebalancing evens out, and a cordoned or NotReady node takes no pod. During
    # a node upgrade the drained nodes read near zero: counted, they would lower the mean and
    # make the healthy nodes "hot" exactly when capacity is short.
    members = [
        fresh[_name(n)]
        for n in nodes
        if _name(n) in fresh
        and _labels(n).get(MAINTENANCE_LABEL) != MAINTENANCE_VALUE
        and not opted_out(_labels(n))
        and not _cordoned(n)
        and _ready(n)
    ]
    bounds = bounds_for(members, cfg)
    states = []
    for node in nodes:
        name = _name(node)
        labels = _labels(node)
        maintenance = labels.get(MAINTENANCE_LABEL) == MAINTENANCE_VALUE
        node_opted_out = opted_out(labels)
        ready = _ready(node)
        previous = read_streak(node)
        record = fresh.get(name)
        hot_why = _why_hot(record, bounds, cfg) if record is not None else None
        if node_opted_out or not ready:
            hot_why = None
        if hot_why is None or record is None:
            streak = Streak()
            if node_opted_out:
                why = "opted out"
            elif not ready:
                # Its kubelet may not even see an eviction through; the node lifecycle
                # controller evicts by its NoExecute taints when the node stays away.
                why = "NotReady: its pods are the node lifecycle controller's"
            else:
                why = why_not.get(name) or "under the bounds"
        else:
            streak = (previous or Streak()).counted(record, now)
            why = f"{hot_why[1]}; hot for {streak.hot} sample(s)"
            if streak == previous:
                why += f" (sample of {format_time(record.sampled_at)} already counted)"
        acting = (
            not node_opted_out
            and ready
            and (maintenance or (hot_why is not None and streak.hot >= cfg.rebalance_hot_samples))
        )
        reason = MAINTENANCE if maintenance else hot_why[0] if hot_why else ""
        states.append(
            NodeState(
                name,
                record,
                capacity[name],
                maintenance,
                node_opted_out,
                hot_why is not None,
                why,
                streak,
                previous,
                acting,
                reason,
                cordoned=_cordoned(node),
                ready=ready,
            )
        )
    return tuple(states), bounds


# -- workloads and pods ----------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """What the handler read about a pod's controller."""

    kind: str
    namespace: str
    name: str
    uid: str
    opted_in: bool
    # Where the opt-in (or its absence) was read, in words.
    opt_in: str
    # Desired and ready replicas (a Job: parallelism and ready pods); None: unknown.
    desired: int | None
    ready: int
    job: JobFacts | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        return workload_key(self.kind, self.namespace, self.name)


@dataclass(frozen=True)
class Claim:
    """A PersistentVolumeClaim a pod mounts and the PersistentVolume bound to it, as the
    handler read them (None: not read, or no volume bound)."""

    namespace: str
    name: str
    pvc: Mapping[str, Any] | None = field(default=None, compare=False)
    pv: Mapping[str, Any] | None = field(default=None, compare=False)
    # Why the claim or its volume could not be read; "" when they were.
    unread: str = ""

    @property
    def key(self) -> str:
        return claim_key(self.namespace, self.name)


def claim_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def workload_key(kind: str, namespace: str, name: str) -> str:
    return f"{kind} {namespace}/{name}"


def workload_of(pod: Pod) -> tuple[str, str, str, str] | None:
    """(kind, namespace, name, uid) of the pod's controller; None for a bare pod."""
    owner = controller_of(pod)
    if owner is None:
        return None
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    return (
        str(owner.get("kind", "")),
        namespace,
        str(owner.get("name", "")),
        str(owner.get("uid", "")),
    )


def _is_pod_active(pod: Pod) -> bool:
    """Counts against its node's allocatable: not terminal (a terminating pod still does)."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


# -- fit ------------------------------------------------------------------------------------


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """v1helper.TolerationsTolerateTaint / Toleration.ToleratesTaint."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        if key and key != taint.get("key"):
            continue
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists":
            return True
        if operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _requirement_matches(requirement: Mapping[str, Any], value: str | None) -> bool:
    """One NodeSelectorRequirement against a label's value (None: no such label)."""
    operator = requirement.get("operator")
    values = [str(v) for v in requirement.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        # Exactly one integer value, and the label an integer too (nodeaffinity's parse).
        if value is None or len(values) != 1:
            return False
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _term_matches(term: Mapping[str, Any], node: Node) -> bool:
    """A NodeSelectorTerm: every expression and field requirement; an empty term matches no
    node (component-helpers nodeaffinity)."""
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    labels = _labels(node)
    for requirement in expressions:
        if not _requirement_matches(requirement, labels.get(str(requirement.get("key", "")))):
            return False
    for requirement in fields:
        # metadata.name is the only field a node selector can match on.
        if requirement.get("key") != "metadata.name":
            return False
        if requirement.get("operator") not in ("In", "NotIn"):
            return False
        if not _requirement_matches(requirement, _name(node)):
            return False
    return True


def placement_refusal(pod: Pod, node: Node) -> str | None:
    """Why the scheduler would not place ``pod`` on ``node`` by its selectors and taints (not
    resources), or None."""
    spec = cast(Mapping[str, Any], pod.get("spec") or {})
    tolerations = spec.get("tolerations") or []
    node_spec = cast(Mapping[str, Any], node.get("spec") or {})
    if node_spec.get("unschedulable") and not _tolerates(
        tolerations, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
    ):
        return "cordoned"
    for taint in node_spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(
            tolerations, taint
        ):
            return f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
    labels = _labels(node)
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value}"
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is not None:
        terms = required.get("nodeSelectorTerms") or []
        if not any(_term_matches(term, node) for term in terms):
            return "required node affinity"
    return None


# -- volumes ----------------------------------------------------------------------------------

# The labels the scheduler's VolumeZone filter compares between a PV and a node, and the GA
# label a beta one stands for on the node's side (pkg/scheduler/framework/plugins/volumezone).
_ZONE_LABELS: Final = (
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
)
_GA_LABEL: Final = {
    "failure-domain.beta.kubernetes.io/zone": "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region": "topology.kubernetes.io/region",
}
# The annotation the PV controller puts on a claim once its binding is complete; the
# scheduler's VolumeBinding plugin counts a claim as bound only with it.
_BIND_COMPLETED: Final = "pv.kubernetes.io/bind-completed"


def pinned_volumes(
    pod: Pod, claims: Mapping[str, Claim]
) -> tuple[tuple[Mapping[str, Any], ...], str]:
    """The PersistentVolumes bound to the pod's claims, or why the pod must stay where it is.

    A hostPath volume (inline, or a PV without node affinity) keeps its data on this node: the
    replacement would start elsewhere with none. A claim not read, or not bound, cannot be
    judged: the pod stays (when in doubt, do not act). Ephemeral volumes get a claim of their
    own for the replacement and tie nothing.
    """
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    volumes: list[Mapping[str, Any]] = []
    for volume in cast(Mapping[str, Any], pod.get("spec") or {}).get("volumes") or []:
        name = volume.get("name", "")
        if volume.get("hostPath") is not None:
            return (), f"its hostPath volume {name} keeps its data on this node"
        source = volume.get("persistentVolumeClaim")
        if source is None:
            continue
        claim_name = str(source.get("claimName", ""))
        claim = claims.get(claim_key(namespace, claim_name))
        if claim is None:
            return (), f"its claim {claim_name} was not read"
        if claim.unread:
            return (), f"its claim {claim_name} could not be read ({claim.unread})"
        pvc = claim.pvc or {}
        pvc_meta = pvc.get("metadata") or {}
        volume_name = (pvc.get("spec") or {}).get("volumeName")
        if (
            not volume_name
            or (pvc.get("status") or {}).get("phase") != "Bound"
            or _BIND_COMPLETED not in (pvc_meta.get("annotations") or {})
        ):
            return (), f"its claim {claim_name} is not bound"
        pv = claim.pv
        if pv is None or (pv.get("metadata") or {}).get("name") != volume_name:
            return (), f"the volume {volume_name} of its claim {claim_name} was not read"
        pv_spec = pv.get("spec") or {}
        if pv_spec.get("hostPath") is not None and not pv_spec.get("nodeAffinity"):
            return (), f"its volume {volume_name} is a hostPath volume: its data is on this node"
        volumes.append(pv)
    return tuple(volumes), ""


def volume_refusal(volumes: Iterable[Mapping[str, Any]], node: Node) -> str | None:
    """Why the scheduler would not place a pod with these bound volumes on ``node``, or None.

    VolumeBinding: a bound PV's required node affinity must match the node's labels (the
    scheduler matches it against the labels alone, so a matchFields term names no node).
    VolumeZone: each zone or region label on the PV must hold the node's value for it (a
    "__"-joined set for a regional disk), unless the node has no zone or region label at all.
    """
    labels = _labels(node)
    by_labels = cast(Node, {"metadata": {"labels": dict(labels)}})
    for pv in volumes:
        meta = pv.get("metadata") or {}
        name = meta.get("name", "")
        required = ((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required")
        if required is not None:
            terms = required.get("nodeSelectorTerms") or []
            if not any(_term_matches(term, by_labels) for term in terms):
                return f"volume {name}: node affinity"
        if not any(key in labels for key in _ZONE_LABELS):
            continue
        for key, value in (meta.get("labels") or {}).items():
            if key not in _ZONE_LABELS:
                continue
            have = labels.get(key)
            if have is None:
                have = labels.get(_GA_LABEL.get(key, key))
            zones = {zone.strip() for zone in str(value).split("__")}
            if have is None or have not in zones:
                return f"volume {name}: zone {value}"
    return None


# -- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Eviction:
    """One pod to evict, why, and where it fits."""

    namespace: str
    pod: str
    uid: str
    node: str
    target: str
    workload: str
    # The reason code (maintenance, cpu-over-threshold, memory-above-mean...).
    reason: str
    # The node's usage when decided (None for a node in maintenance without a fresh record).
    cpu: float | None
    memory: float | None
    why: str

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "pod": self.pod,
            "node": self.node,
            "fitsOn": self.target,
            "workload": self.workload,
            "reason": self.reason,
            "nodeUsage": {"cpu": self.cpu, "memory": self.memory},
            "why": self.why,
        }


@dataclass(frozen=True)
class Skipped:
    """Something not done: a pod left in place, or a node acted on without result."""

    subject: str
    why: str


@dataclass(frozen=True)
class Plan:
    at: datetime
    bounds: Bounds
    nodes: tuple[NodeState, ...]
    evictions: tuple[Eviction, ...]
    skipped: tuple[Skipped, ...]

    def streaks(self, acted: Iterable[str] | None = None) -> dict[str, Streak | None]:
        """The streak each node should carry after this evaluation (None: the annotation goes),
        for the nodes whose annotation changes. A node acted on (by default: any eviction was
        chosen there; the handler passes the nodes where one went through) starts afresh."""
        acted = {e.node for e in self.evictions} if acted is None else set(acted)
        out: dict[str, Streak | None] = {}
        for state in self.nodes:
            after: Streak | None = state.streak if state.hot else None
            if state.name in acted:
                after = state.streak.acted_on()
            if after is not None and after.hot == 0 and after.sample is None:
                after = None
            if after != state.previous:
                out[state.name] = after
        return out


@dataclass
class _Target:
    node: Node
    state: NodeState
    requested: Resources
    added_cpu: float = 0.0
    added_memory: float = 0.0


@dataclass(frozen=True)
class _Candidate:
    pod: Pod
    workload: Workload
    requests: Resources
    # Percent of the source node's allocatable (zero without one: maintenance, no record).
    cpu: float
    memory: float
    # The PersistentVolumes bound to its claims: a target must satisfy them.
    volumes: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)


def placed_by_load(pod: Pod) -> bool:
    """Whether the pod's replacement will be placed by load: it names the load-aware
    scheduler, or carries the webhook's preferred affinity on the load bucket label (label
    mode; the replacement gets it too)."""
    spec = pod.get("spec") or {}
    if spec.get("schedulerName") == LOAD_AWARE_SCHEDULER_NAME:
        return True
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    for term in node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        for expression in (term.get("preference") or {}).get("matchExpressions") or []:
            if expression.get("key") == LOAD_LABEL:
                return True
    return False


def _eligible(
    pod: Pod, workloads: Mapping[str, Workload], cfg: Config, *, cordoned: bool = False
) -> tuple[Workload | None, Resources | None, str]:
    """The pod's workload and requests when it may be evicted; else why not."""
    skip = skip_reason(pod, cfg)
    if skip:
        return None, None, skip
    if not (cfg.rebalance_any_placement or cordoned or placed_by_load(pod)):
        # Measured (dev/bench/RESULTS.md, section 9): the stock scheduler places replacements by
        # requests, back onto the nodes whose pods use more than they request; evicting then
        # moves pods in circles. A cordoned node cannot take the replacement back.
        return (
            None,
            None,
            "its replacement would be placed by requests alone (no load-aware scheduler or "
            "load affinity), likely back here; rebalance_any_placement allows it",
        )
    if (pod.get("status") or {}).get("phase") != "Running":
        return None, None, "not running"
    owner = workload_of(pod)
    if owner is None:
        return None, None, "a bare pod: nothing would recreate it"
    kind, namespace, name, uid = owner
    if kind not in WORKLOAD_KINDS:
        return None, None, f"its controller is a {kind}"
    workload = workloads.get(workload_key(kind, namespace, name))
    if workload is None or (uid and workload.uid and uid != workload.uid):
        return None, None, f"{workload_key(kind, namespace, name)} could not be read"
    if not workload.opted_in:
        return None, None, f"{workload.key} did not opt in ({workload.opt_in})"
    if workload.job is not None:
        judged = judge_removal(workload.job, pod, evicting=True)
        if judged.outcome is not Outcome.IGNORED:
            return None, None, f"the Job would count the eviction as a failure ({judged.why})"
    try:
        requests = pod_requests(pod)
    except quantity.QuantityError as err:
        return None, None, f"requests unreadable ({err})"
    return workload, requests, ""


def _fits(
    cand: _Candidate, target: _Target, bounds: Bounds
) -> tuple[tuple[float, float] | None, str]:
    """The target's estimated usage after taking the pod, or why it cannot take it."""
    state = target.state
    if state.usage is None or state.allocatable is None:
        return None, state.why
    # Stricter than the scheduler: even a pod that tolerates the cordon does not go to a node
    # being drained, nor to one whose kubelet is away.
    if state.cordoned:
        return None, "cordoned"
    if not state.ready:
        return None, "NotReady"
    refusal = placement_refusal(cand.pod, target.node) or volume_refusal(cand.volumes, target.node)
    if refusal:
        return None, refusal
    total = target.requested + cand.requests
    if (
        total.cpu_millis > state.allocatable.cpu_millis
        or total.memory_bytes > state.allocatable.memory_bytes
    ):
        return None, "requests over allocatable"
    cpu, memory = percent_of(cand.requests, state.allocatable)
    after_cpu = state.usage.estimated_cpu + target.added_cpu + cpu
    after_memory = state.usage.estimated_memory + target.added_memory + memory
    if after_cpu > bounds.cpu or after_memory > bounds.memory:
        return None, f"would be hot ({after_cpu:.1f} % CPU, {after_memory:.1f} % memory)"
    return (after_cpu, after_memory), ""


def _pick(
    candidates: list[_Candidate], need_cpu: float, need_memory: float, maintenance: bool
) -> list[_Candidate]:
    """The candidates in the order to try: on a hot node, the smallest that covers what is
    needed on its own first, then the others largest first; pods that relieve nothing over
    the bound are left out. In maintenance, largest first."""

    def relief(c: _Candidate) -> float:
        return (c.cpu if need_cpu > 0 else 0.0) + (c.memory if need_memory > 0 else 0.0)

    def name(c: _Candidate) -> str:
        return _name(c.pod)

    if maintenance:
        return sorted(candidates, key=lambda c: (-(c.cpu + c.memory), name(c)))
    helpful = [c for c in candidates if relief(c) > 0]
    covering = sorted(
        (
            c
            for c in helpful
            if (need_cpu <= 0 or c.cpu >= need_cpu)
            and (need_memory <= 0 or c.memory >= need_memory)
        ),
        key=lambda c: (relief(c), name(c)),
    )
    rest = sorted((c for c in helpful if c not in covering), key=lambda c: (-relief(c), name(c)))
    return covering + rest


def choose(
    nodes: Sequence[Node],
    states: Sequence[NodeState],
    bounds: Bounds,
    pods: Sequence[Pod],
    workloads: Mapping[str, Workload],
    cfg: Config,
    now: datetime,
    *,
    claims: Mapping[str, Claim] | None = None,
) -> Plan:
    """The evictions of this evaluation; see the module docstring. ``claims``: the claims
    (and their volumes) of the pods on the nodes to act on, by ``claim_key``."""
    by_name = {_name(n): n for n in nodes}
    pods_on: dict[str, list[Pod]] = {}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name:
            pods_on.setdefault(node_name, []).append(pod)
    targets: dict[str, _Target] = {}
    for state in states:
        if state.maintenance or state.opted_out or state.name not in by_name:
            continue
        requested = Resources()
        for pod in pods_on.get(state.name, []):
            if _is_pod_active(pod):
                try:
                    requested = requested + pod_requests(pod)
                except quantity.QuantityError:
                    continue
        targets[state.name] = _Target(by_name[state.name], state, requested)

    evictions: list[Eviction] = []
    skipped: list[Skipped] = []
    per_namespace: dict[str, int] = {}
    per_workload: dict[str, int] = {}

    def hotness(state: NodeState) -> tuple[int, float, str]:
        over = max(state.cpu - bounds.cpu, state.memory - bounds.memory)
        return (0 if state.maintenance else 1, -over, state.name)

    for state in sorted((s for s in states if s.acting), key=hotness):
        if len(evictions) >= cfg.rebalance_max_per_run:
            skipped.append(Skipped(state.name, "the limit per evaluation is reached"))
            continue
        need_cpu = max(0.0, state.cpu - bounds.cpu) if not state.maintenance else 0.0
        need_memory = max(0.0, state.memory - bounds.memory) if not state.maintenance else 0.0
        candidates = []
        for pod in sorted(pods_on.get(state.name, []), key=_name):
            workload, requests, why = _eligible(
                pod,
                workloads,
                cfg,
                cordoned=bool((by_name.get(state.name, {}).get("spec") or {}).get("unschedulable")),
            )
            subject = f"{(pod.get('metadata') or {}).get('namespace', '')}/{_name(pod)}"
            if workload is None or requests is None:
                skipped.append(Skipped(subject, why))
                continue
            volumes, why = pinned_volumes(pod, claims or {})
            if why:
                skipped.append(Skipped(subject, why))
                continue
            cpu, memory = (
                percent_of(requests, state.allocatable) if state.allocatable else (0.0, 0.0)
            )
            candidates.append(_Candidate(pod, workload, requests, cpu, memory, volumes))
        order = _pick(candidates, need_cpu, need_memory, state.maintenance)
        if not state.maintenance:
            for cand in candidates:
                if cand not in order:
                    skipped.append(
                        Skipped(
                            _subject(cand.pod),
                            "its requests would not lower what is over the bound",
                        )
                    )
        taken = 0
        remaining = list(order)
        while remaining:
            if not state.maintenance and need_cpu <= 0 and need_memory <= 0:
                break
            if taken >= cfg.rebalance_max_per_node:
                skipped.append(Skipped(state.name, "the limit per node is reached"))
                break
            if len(evictions) >= cfg.rebalance_max_per_run:
                skipped.append(Skipped(state.name, "the limit per evaluation is reached"))
                break
            # Again after each pod: what is still needed decides which pod covers it.
            ordered = _pick(remaining, need_cpu, need_memory, state.maintenance)
            if not ordered:
                break
            cand = ordered[0]
            remaining.remove(cand)
            limit = _limit(cand, per_namespace, per_workload, evictions, cfg)
            if limit:
                skipped.append(Skipped(_subject(cand.pod), limit))
                continue
            target, after, refusals = None, None, []
            for name in sorted(targets, key=lambda n: (_load(targets[n]), n)):
                if name == state.name:
                    continue
                after, refusal = _fits(cand, targets[name], bounds)
                if after is not None:
                    target = targets[name]
                    break
                refusals.append(f"{name}: {refusal}")
            if target is None or after is None:
                skipped.append(
                    Skipped(
                        _subject(cand.pod),
                        "no cooler node would take it ("
                        + ("; ".join(refusals) or "no other node")
                        + ")",
                    )
                )
                continue
            add_cpu, add_memory = percent_of(
                cand.requests, target.state.allocatable or Resources(1, 1)
            )
            target.added_cpu += add_cpu
            target.added_memory += add_memory
            target.requested = target.requested + cand.requests
            need_cpu -= cand.cpu
            need_memory -= cand.memory
            taken += 1
            meta = cand.pod.get("metadata") or {}
            namespace = str(meta.get("namespace", ""))
            per_namespace[namespace] = per_namespace.get(namespace, 0) + 1
            per_workload[cand.workload.key] = per_workload.get(cand.workload.key, 0) + 1
            evictions.append(
                Eviction(
                    namespace=namespace,
                    pod=_name(cand.pod),
                    uid=str(meta.get("uid", "")),
                    node=state.name,
                    target=target.state.name,
                    workload=cand.workload.key,
                    reason=state.reason,
                    cpu=state.usage.cpu.now if state.usage else None,
                    memory=state.usage.memory.now if state.usage else None,
                    why=_why(state, cand, target.state.name, after),
                )
            )
        if taken == 0 and not any(s.subject == state.name for s in skipped):
            skipped.append(Skipped(state.name, "no pod on it may be evicted and placed elsewhere"))
    return Plan(now, bounds, tuple(states), tuple(evictions), tuple(skipped))


def plan(
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    workloads: Mapping[str, Workload],
    cfg: Config,
    now: datetime,
    *,
    claims: Mapping[str, Claim] | None = None,
) -> Plan:
    """``assess`` then ``choose``, for callers that have every workload at hand."""
    states, bounds = assess(nodes, cfg, now)
    return choose(nodes, states, bounds, pods, workloads, cfg, now, claims=claims)


def _subject(pod: Pod) -> str:
    return f"{(pod.get('metadata') or {}).get('namespace', '')}/{_name(pod)}"


def _load(target: _Target) -> float:
    usage = target.state.usage
    if usage is None:
        return math.inf
    return max(usage.estimated_cpu + target.added_cpu, usage.estimated_memory + target.added_memory)


def _limit(
    cand: _Candidate,
    per_namespace: Mapping[str, int],
    per_workload: Mapping[str, int],
    evictions: Sequence[Eviction],
    cfg: Config,
) -> str:
    namespace = str((cand.pod.get("metadata") or {}).get("namespace", ""))
    if per_namespace.get(namespace, 0) >= cfg.rebalance_max_per_namespace:
        return f"the limit per namespace ({cfg.rebalance_max_per_namespace}) is reached"
    planned = per_workload.get(cand.workload.key, 0)
    if planned >= cfg.rebalance_max_per_workload:
        return f"the limit per workload ({cfg.rebalance_max_per_workload}) is reached"
    desired = cand.workload.desired
    if desired is None or desired <= 0:
        return f"{cand.workload.key} has no desired replica count"
    keep = math.ceil(cfg.rebalance_min_available * desired - 1e-9)
    if cand.workload.ready - planned - 1 < keep:
        return (
            f"{cand.workload.key} would keep {cand.workload.ready - planned - 1} of {desired} "
            f"replicas ready, fewer than {cfg.rebalance_min_available:g} of them ({keep})"
        )
    return ""


def _why(state: NodeState, cand: _Candidate, target: str, after: tuple[float, float]) -> str:
    requests = f"requests {cand.cpu:.1f} % CPU, {cand.memory:.1f} % memory of {state.name}"
    if state.maintenance:
        head = f"node {state.name} is in maintenance ({MAINTENANCE_LABEL}={MAINTENANCE_VALUE})"
        if state.usage is not None:
            head += f", CPU {state.cpu:.1f} %, memory {state.memory:.1f} %"
    else:
        head = f"node {state.name}: {state.why}"
    fits = f"fits on {target} ({after[0]:.1f} % CPU, {after[1]:.1f} % memory after)"
    return f"{head}; {requests}; {fits}"
