"""The scheduler extender's decisions: which nodes a pod may go to, and which it should prefer.

kube-scheduler runs its own filters and scores first, then POSTs the pod and the nodes that are
left to score-nodes (``filter``, then ``prioritize``). Both answers come from those Nodes alone,
sent whole or named and looked up in the function's node cache: their usage annotation
(written by annotate-usage), their allocatable, their maintenance label. Each Node is parsed
once into a ``NodeView`` holding what depends on neither the pod nor the time (the verdict
before the pod's requests, the score), so a call costs a lookup and a few comparisons per node.
No API call and no Prometheus on the request path: the same Nodes give the same answer in any
replica.

Filter. A node fails when its usage is over ``cpu_threshold`` / ``memory_threshold``, when it
is labelled for maintenance, or when its usage plus the pod's requests (percent of allocatable)
would go over ``predicted_usage_limit`` (the seed's Reserve at 95 %). The reason is short and
the same for every node that fails for the same cause, because the scheduler counts identical
reasons into the pod's FailedScheduling event ("0/4 nodes are available: 1 node in maintenance,
3 node CPU usage over 80 percent.", framework.FitError.Error). No "%" sign in a reason: the
scheduler uses that message as a format string.

Prioritize. ``(100 - cpu) * cpu_score_weight + (100 - mem) * memory_score_weight``, divided by
the weights' sum, plus ``load_balance_bonus`` when both are under ``low_load_threshold``, scaled
onto the extender's range 0..10 (extender/v1 MaxExtenderPriority; the scheduler multiplies it
by the extender's weight and by MaxNodeScore / MaxExtenderPriority).

Pods that must run whatever the load (``exemption``): a DaemonSet's pod or a static pod
(pinned to its node), a system-critical pod (priority class ``system-cluster-critical`` or
``system-node-critical``, or a priority of 2000000000 and more: what the kubelet calls critical,
pkg/kubelet/types IsCriticalPod), a pod in an excluded namespace (kube-system and the project's
own by default) and an opted-out pod pass every node, hot or in maintenance.

Every node hot. The scheduler calls the extender with the nodes its own filters left; when we
fail them all, the pod stays Pending: the answer is a valid 200 (``ignorable`` applies only to
errors), our failures are unresolvable (no preemption), and the Cluster Autoscaler simulates
scheduling without extenders (kubernetes/autoscaler#506, #5708), so it sees the pod fit and adds
no node. For a pod of the load-aware scheduler (``kn-rescheduler-load-aware``) that is the
point: it asked to wait for a node under the limits. For a pod of any other scheduler (the
default scheduler with the extender, where every pod of the cluster pays) it would be an
outage, so when no node passes and some failed on usage alone, those pass, ranked by the score
(the coolest first): the extender prefers, it does not block. Nodes in maintenance stay failed
(an operator's choice, like a cordon).

Usage we cannot trust (no record, a record older than ``usage_stale_after``, a record or an
allocatable we cannot read) neither fails a node nor pushes pods away from it: the scheduler's
own plugins decide there, as without the extender. Such a node scores the mean of the nodes
that were scored and can take pods (schedulable and Ready: a cordoned or NotReady node is
drained, its low usage says nothing about where pods go, and pods that tolerate it would lift
the mean with it): a low score would drain pods off every node whose annotator lags or that
just joined, a high one would herd them onto exactly the nodes nobody measured.

What the extender sees, and what it cannot (herding). Usage is measured: it lags the pods
placed on a node. The record therefore carries an estimate, the requests of pods bound to the
node within a window before the sample, and both the filter and the score use
``estimated_cpu`` / ``estimated_memory`` (measured plus that estimate). What the extender
cannot see are pods bound since the last sample: the annotator counts them at its next tick
(every 30 s by default). Within a tick, the scheduler's own NodeResourcesFit scoring counts the
requests of pods it has just assumed, which spreads a burst. Caveat, in the kube-scheduler
this project runs (1.36; kubernetes/kubernetes#141781, still open): with ``nodeCacheCapable:
false`` the scheduler wraps the nodes an extender's filter returns in new NodeInfos without
their pods (HTTPExtender.Filter), so that scoring sees every node empty whenever the filter
verb is configured; a burst within one tick then leans on the extender's score and on the
scheduler's random choice among equal scores. The pod's own requests always count: the
predicted-usage check adds them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final, cast

from shared.api import quantity
from shared.api.keys import (
    LOAD_AWARE_SCHEDULER_NAME,
    MAINTENANCE_LABEL,
    MAINTENANCE_VALUE,
    USAGE_ANNOTATION,
)
from shared.api.kubetypes import Node, Pod
from shared.api.usage import UsageError, UsageRecord
from shared.nodes.usage import (
    Resources,
    allocatable,
    exemption,
    percent_of,
    pod_requests,
)
from shared.platform.config import Config

# k8s.io/kube-scheduler/extender/v1: MinExtenderPriority, MaxExtenderPriority.
MIN_PRIORITY: Final = 0
MAX_PRIORITY: Final = 10

# Why a node passed or failed: metric labels and log fields (the text the scheduler shows is
# FilterVerdict.message).
FITS: Final = "fits"
NO_USAGE: Final = "no-usage"
STALE_USAGE: Final = "stale-usage"
UNREADABLE_USAGE: Final = "unreadable-usage"
UNREADABLE_ALLOCATABLE: Final = "unreadable-allocatable"
MAINTENANCE: Final = "maintenance"
CPU_OVER: Final = "cpu-over-threshold"
MEMORY_OVER: Final = "memory-over-threshold"
CPU_PREDICTED_OVER: Final = "cpu-predicted-over-limit"
MEMORY_PREDICTED_OVER: Final = "memory-predicted-over-limit"
SCORED: Final = "scored"
# Every node failed on usage for a pod of a scheduler whose pods all pay: passed, ranked by score.
EVERY_NODE_HOT: Final = "every-node-hot"
# Names only, and no cache to look them up in: the cache has not listed yet or lost the API
# server (cold), or it is turned off. Every node passes with the same score.
NODE_CACHE_COLD: Final = "node-cache-cold"
NODE_CACHE_OFF: Final = "node-cache-off"
# The failures that only say "hot": the ones that pass when every node fails.
USAGE_REASONS: Final = frozenset({CPU_OVER, MEMORY_OVER, CPU_PREDICTED_OVER, MEMORY_PREDICTED_OVER})
# A node whose usage cannot be trusted passes and scores neutral (the reasons above, for it).
UNKNOWN_REASONS: Final = frozenset(
    {NO_USAGE, STALE_USAGE, UNREADABLE_USAGE, UNREADABLE_ALLOCATABLE}
)


@dataclass(frozen=True)
class Load:
    """A node's usage as the extender counts it: measured plus estimate, percent of
    allocatable, with the allocatable it is a percentage of."""

    cpu: float
    memory: float
    allocatable: Resources


@dataclass(frozen=True)
class Unknown:
    """Why a node's usage cannot be used (one of UNKNOWN_REASONS) and the detail."""

    reason: str
    detail: str


COLD_CACHE: Final = Unknown(
    NODE_CACHE_COLD, "the node cache has not listed Nodes yet, or lost the API server"
)
CACHE_OFF: Final = Unknown(NODE_CACHE_OFF, "no Node object sent and the node cache is off")


def _metadata_map(node: Node, key: str) -> dict[str, Any]:
    """metadata.labels or metadata.annotations; empty when either level is not a map (only a
    hand-made object can be like that: the API server validates both)."""
    metadata = node.get("metadata")
    found = metadata.get(key) if isinstance(metadata, dict) else None
    return found if isinstance(found, dict) else {}


def node_name(node: Node) -> str:
    metadata = node.get("metadata")
    return str(metadata.get("name") or "") if isinstance(metadata, dict) else ""


def in_maintenance(node: Node) -> bool:
    return _metadata_map(node, "labels").get(MAINTENANCE_LABEL) == MAINTENANCE_VALUE


def takes_pods(node: Node) -> bool:
    """Schedulable (not cordoned) and Ready: a node that is not is being drained or is
    unreachable, and its usage says nothing about the nodes pods go to."""
    spec = node.get("spec")
    if isinstance(spec, dict) and spec.get("unschedulable") is True:
        return False
    status = node.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            # The kubelet posts True; the node lifecycle controller writes Unknown when the
            # kubelet stops posting, and the kubelet False when it is not ready.
            return condition.get("status") == "True"
    # No Ready condition yet: a node that just registered; the scheduler's own taint
    # (node.kubernetes.io/not-ready) keeps pods off it, and so out of this request.
    return False


# The scheduler sends every candidate Node twice per pod (filter, prioritize), and the same
# annotation text for every pod until annotate-usage's next write: parsing it once per text
# (and allocatable once per pair of quantities) saves most of a call's decision time with 240
# nodes. Both functions are pure, so a cache changes no answer; the bound keeps memory flat.
_CACHE_SIZE: Final = 4096


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _record(raw: str) -> UsageRecord | str:
    """The record in ``raw``, or why it cannot be read (exceptions are not cached)."""
    try:
        return UsageRecord.from_json(raw)
    except UsageError as err:
        return str(err)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _allocatable(cpu: object, memory: object) -> Resources | None:
    return allocatable(cast(Node, {"status": {"allocatable": {"cpu": cpu, "memory": memory}}}))


@dataclass(frozen=True, slots=True)
class NodeView:
    """A Node as the decisions read it, parsed once with one Config: its name, whether it is
    in maintenance and takes pods, its load (or why there is none), when its usage was
    sampled, and the answers that do not depend on the pod or the time: the filter's verdict
    before the pod's own requests are added, and the score. The node cache keeps these, so a
    call costs a lookup, a freshness check and, for a node that fits, the prediction with the
    pod's requests: no parse, no formula. Use the views only with the Config they were made
    with."""

    name: str
    maintenance: bool
    takes_pods: bool
    load: Load | Unknown
    sampled_at: datetime | None
    # The annotation as written (GET /debug/node-cache shows it).
    usage: str | None
    # The usage is used from fresh_from to fresh_until (usage_stale_after either side of
    # sampled_at: a record from the future by more than that is a skewed clock).
    fresh_from: datetime | None
    fresh_until: datetime | None
    verdict: FilterVerdict
    score: NodeScore | None


def view_of(node: Node, cfg: Config) -> NodeView:
    """``node`` parsed for the decisions under ``cfg`` (see NodeView)."""
    raw = _metadata_map(node, "annotations").get(USAGE_ANNOTATION)
    name, maintenance, takes = node_name(node), in_maintenance(node), takes_pods(node)
    usage = raw if isinstance(raw, str) else None

    def view(load: Load | Unknown, sampled_at: datetime | None = None) -> NodeView:
        fresh_from = sampled_at - cfg.usage_stale_after if sampled_at is not None else None
        fresh_until = sampled_at + cfg.usage_stale_after if sampled_at is not None else None
        if maintenance:
            verdict = FilterVerdict(name, False, MAINTENANCE, "node in maintenance")
        elif isinstance(load, Unknown):
            verdict = FilterVerdict(name, True, load.reason, load.detail)
        else:
            verdict = _usage_verdict(name, load, cfg)
        score = None
        if isinstance(load, Load):
            value = raw_score(load.cpu, load.memory, cfg)
            score = NodeScore(name, _scaled(value, cfg), SCORED, value)
        return NodeView(
            name,
            maintenance,
            takes,
            load,
            sampled_at,
            usage,
            fresh_from,
            fresh_until,
            verdict,
            score,
        )

    if raw is None:
        return view(Unknown(NO_USAGE, "no usage record"))
    # Only a hand-made object carries an annotation that is not a string.
    record = _record(raw) if isinstance(raw, str) else "not a string"
    if isinstance(record, str):
        return view(Unknown(UNREADABLE_USAGE, f"unreadable usage record: {record}"))
    status = node.get("status")
    values = status.get("allocatable") if isinstance(status, dict) else None
    cpu, memory = (
        (values.get("cpu"), values.get("memory")) if isinstance(values, dict) else (None, None)
    )
    whole = _allocatable(cpu, memory) if isinstance(cpu, str) and isinstance(memory, str) else None
    if whole is None:
        return view(
            Unknown(UNREADABLE_ALLOCATABLE, "no usable CPU and memory allocatable"),
            record.sampled_at,
        )
    return view(
        Load(cpu=record.estimated_cpu, memory=record.estimated_memory, allocatable=whole),
        record.sampled_at,
    )


def unlisted(name: str) -> NodeView:
    """A name the node cache does not hold (a node that registered a moment ago): it stands
    as an unmeasured node, passing with a neutral score."""
    load = Unknown(NO_USAGE, "not in the node cache yet")
    verdict = FilterVerdict(name, True, load.reason, load.detail)
    return NodeView(name, False, True, load, None, None, None, None, verdict, None)


def _stale(view: NodeView, now: datetime) -> Unknown | None:
    """Why the view's usage is not used at ``now`` (too old, or from the future), or None."""
    if view.fresh_from is None or view.fresh_until is None or view.sampled_at is None:
        return None
    if view.fresh_from <= now <= view.fresh_until:
        return None
    return Unknown(STALE_USAGE, f"usage sampled {now - view.sampled_at} ago")


def current_load(view: NodeView, now: datetime) -> Load | Unknown:
    """The view's load at ``now``: a record older than ``usage_stale_after`` (or from the
    future by more than it) is not used. Stale first, as for a record whose allocatable is
    unreadable too."""
    return _stale(view, now) or view.load


def load_of(node: Node, cfg: Config, now: datetime) -> Load | Unknown:
    """The node's load from its usage annotation, or why there is none we can use."""
    return current_load(view_of(node, cfg), now)


# -- filter ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterVerdict:
    """One node: passed or not, the reason (a label), and the text the scheduler shows."""

    node: str
    passed: bool
    reason: str
    message: str
    cpu: float | None = None
    memory: float | None = None


@dataclass(frozen=True)
class FilterResult:
    verdicts: tuple[FilterVerdict, ...]
    # The pod's requests as the scheduler counts them (for the log line).
    pod_requests: Resources

    @property
    def passed(self) -> tuple[str, ...]:
        return tuple(v.node for v in self.verdicts if v.passed)

    @property
    def failed(self) -> dict[str, str]:
        """Failed node -> the message the scheduler puts into FailedScheduling."""
        return {v.node: v.message for v in self.verdicts if not v.passed}


def _percent_text(value: float) -> str:
    # Not "80%": kube-scheduler passes the FailedScheduling message to Eventf as its format
    # string (handleSchedulingFailure, pkg/scheduler/schedule_one.go), so a "%" in a reason
    # reaches the Event as "80%! (MISSING)".
    return f"{value:g} percent"


def waits_for_a_cool_node(pod: Pod) -> bool:
    """Whether the pod asked for load-aware placement by naming the load-aware scheduler: it
    waits while every node is hot. Any other scheduler's pods pay for the extender without
    asking, and never wait for it."""
    spec = pod.get("spec")
    return isinstance(spec, dict) and spec.get("schedulerName") == LOAD_AWARE_SCHEDULER_NAME


def filter_nodes(pod: Pod, nodes: Sequence[Node], cfg: Config, now: datetime) -> FilterResult:
    """``filter_views`` of the Node objects (a request with whole Nodes)."""
    return filter_views(pod, [view_of(node, cfg) for node in nodes], cfg, now)


def filter_views(pod: Pod, nodes: Sequence[NodeView], cfg: Config, now: datetime) -> FilterResult:
    """Which of ``nodes`` the pod may go to, one verdict per node, in the given order.

    An exempt pod (``exemption``) passes everywhere. A DaemonSet's pod, for one: its
    controller pins it to one node (a required node affinity on that node's name), so failing
    that node would leave the node without its daemon (its network plugin, log shipper,
    node-exporter) for as long as it stays hot, which is when it is needed most. Maintenance
    does not keep exempt pods off either, as cordoning does not keep off daemons.

    When no node passes and some failed on usage alone, a pod that did not ask to wait
    (``waits_for_a_cool_node``) gets those nodes back, each with the reason EVERY_NODE_HOT:
    the score ranks them and the pod goes to the coolest (see the module docstring).
    """
    exempt = exemption(pod, cfg)
    if exempt is not None:
        return FilterResult(
            verdicts=tuple(
                FilterVerdict(n.name, True, exempt.reason, exempt.message) for n in nodes
            ),
            pod_requests=Resources(),
        )
    try:
        requests = pod_requests(pod)
    except (quantity.QuantityError, AttributeError, TypeError):
        # The API server validated the pod's quantities on create, so this is a hand-made
        # object; without its requests the prediction adds nothing rather than failing nodes.
        requests = Resources()
    verdicts = tuple(_filter_one(node, requests, cfg, now) for node in nodes)
    if not waits_for_a_cool_node(pod) and not any(v.passed for v in verdicts):
        verdicts = tuple(
            replace(v, passed=True, reason=EVERY_NODE_HOT, message=f"{v.message}, as every node is")
            if v.reason in USAGE_REASONS
            else v
            for v in verdicts
        )
    return FilterResult(verdicts=verdicts, pod_requests=requests)


def _usage_verdict(name: str, load: Load, cfg: Config) -> FilterVerdict:
    """The verdict on a node's measured load alone (before the pod's own requests)."""
    cpu, memory = load.cpu, load.memory
    if cpu > cfg.cpu_threshold:
        message = f"node CPU usage over {_percent_text(cfg.cpu_threshold)}"
        return FilterVerdict(name, False, CPU_OVER, message, cpu, memory)
    if memory > cfg.memory_threshold:
        message = f"node memory usage over {_percent_text(cfg.memory_threshold)}"
        return FilterVerdict(name, False, MEMORY_OVER, message, cpu, memory)
    return FilterVerdict(name, True, FITS, "fits", cpu, memory)


def _filter_one(node: NodeView, requests: Resources, cfg: Config, now: datetime) -> FilterVerdict:
    verdict = node.verdict
    if node.maintenance:
        return verdict
    stale = _stale(node, now)
    if stale is not None:
        return FilterVerdict(node.name, True, stale.reason, stale.detail)
    load = node.load
    if verdict.reason != FITS or not isinstance(load, Load):
        return verdict
    pod_cpu, pod_memory = percent_of(requests, load.allocatable)
    cpu, memory = load.cpu, load.memory
    if cpu + pod_cpu > cfg.predicted_usage_limit:
        limit = _percent_text(cfg.predicted_usage_limit)
        message = f"node CPU usage with the pod would exceed {limit}"
        return FilterVerdict(node.name, False, CPU_PREDICTED_OVER, message, cpu, memory)
    if memory + pod_memory > cfg.predicted_usage_limit:
        limit = _percent_text(cfg.predicted_usage_limit)
        message = f"node memory usage with the pod would exceed {limit}"
        return FilterVerdict(node.name, False, MEMORY_PREDICTED_OVER, message, cpu, memory)
    return verdict


# -- prioritize -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeScore:
    """One node's score on the extender's range, the reason, and the unscaled value."""

    node: str
    score: int
    reason: str
    raw: float | None = None


@dataclass(frozen=True)
class Priorities:
    scores: tuple[NodeScore, ...]


def raw_score(cpu: float, memory: float, cfg: Config) -> float:
    """Free capacity, weighted (0..100), plus the bonus for a node low on both."""
    cpu = min(max(cpu, 0.0), 100.0)
    memory = min(max(memory, 0.0), 100.0)
    weights = cfg.cpu_score_weight + cfg.memory_score_weight
    free = ((100.0 - cpu) * cfg.cpu_score_weight + (100.0 - memory) * cfg.memory_score_weight) / (
        weights
    )
    if cpu < cfg.low_load_threshold and memory < cfg.low_load_threshold:
        free += cfg.load_balance_bonus
    return free


def _scaled(raw: float, cfg: Config) -> int:
    top = 100.0 + max(cfg.load_balance_bonus, 0.0)
    value = math.floor(raw * MAX_PRIORITY / top + 0.5)
    return min(max(value, MIN_PRIORITY), MAX_PRIORITY)


def prioritize(pod: Pod, nodes: Sequence[Node], cfg: Config, now: datetime) -> Priorities:
    """``prioritize_views`` of the Node objects (a request with whole Nodes)."""
    return prioritize_views(pod, [view_of(node, cfg) for node in nodes], cfg, now)


def prioritize_views(pod: Pod, nodes: Sequence[NodeView], cfg: Config, now: datetime) -> Priorities:
    """A score 0..10 per node, in the given order; unknown usage scores the others' mean.

    ``pod`` is not used by the formula (it scores the node, not the placement); it is part of
    the signature because it is part of the request, and a later formula may weigh it.
    """
    del pod
    known: list[NodeScore] = []
    # The scores the neutral one is the mean of: nodes that take pods (``takes_pods``).
    counted: list[int] = []
    unknown: dict[str, str] = {}
    for node in nodes:
        stale = _stale(node, now)
        if stale is not None:
            unknown[node.name] = stale.reason
        elif node.score is None:
            unknown[node.name] = node.load.reason if isinstance(node.load, Unknown) else NO_USAGE
        else:
            known.append(node.score)
            if node.takes_pods:
                counted.append(node.score.score)
    if not unknown:
        return Priorities(scores=tuple(known))
    neutral = (
        math.floor(sum(counted) / len(counted) + 0.5)
        if counted
        else (MIN_PRIORITY + MAX_PRIORITY) // 2
    )
    by_name = {score.node: score for score in known}
    for name, reason in unknown.items():
        by_name[name] = NodeScore(name, neutral, reason)
    return Priorities(scores=tuple(by_name[node.name] for node in nodes))


def pass_unknown(names: Sequence[str], why: Unknown) -> FilterResult:
    """Nodes sent by name only with no cache to look them up in (NODE_CACHE_COLD or
    NODE_CACHE_OFF): nothing to read, so all pass."""
    return FilterResult(
        verdicts=tuple(FilterVerdict(name, True, why.reason, why.detail) for name in names),
        pod_requests=Resources(),
    )


def unknown_nodes(names: Sequence[str], why: Unknown) -> Priorities:
    """Scores for nodes sent by name only with no cache to look them up in: all equal."""
    neutral = (MIN_PRIORITY + MAX_PRIORITY) // 2
    return Priorities(scores=tuple(NodeScore(name, neutral, why.reason) for name in names))


# -- the node cache (nodeCacheCapable: true) -------------------------------------------------------


def named(
    names: Sequence[str], lookup: Callable[[str], NodeView | None]
) -> tuple[tuple[NodeView, ...], int]:
    """The cached view of each name, in order, and how many names the cache does not hold
    (each stands ``unlisted``)."""
    views: list[NodeView] = []
    missing = 0
    for name in names:
        view = lookup(name)
        if view is None:
            missing += 1
            view = unlisted(name)
        views.append(view)
    return tuple(views), missing


def describe(view: NodeView) -> dict[str, Any]:
    """A view as JSON, for GET /debug/node-cache."""
    load = view.load
    return {
        "maintenance": view.maintenance,
        "takesPods": view.takes_pods,
        "usage": view.usage,
        "sampledAt": view.sampled_at.isoformat() if view.sampled_at else None,
        "load": {"cpu": load.cpu, "memory": load.memory}
        if isinstance(load, Load)
        else {"unknown": load.reason, "detail": load.detail},
    }
