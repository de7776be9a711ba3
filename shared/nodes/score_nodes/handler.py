"""The scheduler extender's wire format (k8s.io/kube-scheduler/extender/v1) and its metrics.

kube-scheduler marshals ``ExtenderArgs`` with Go's encoding/json, and those structs have no
JSON tags: the keys are the Go field names, ``{"Pod": {...}, "Nodes": {"metadata": {},
"items": [...]}, "NodeNames": null}``. It decodes our answer the same way, where a key matches
its field exactly or case-insensitively (encoding/json), so older extenders' lowercase
``nodenames`` also work; we write the Go names and read either.

- ``nodeCacheCapable: true`` (what we ship): only ``NodeNames`` are sent, and the scheduler
  keeps its own NodeInfos for the names we return (pkg/scheduler/extender.go,
  HTTPExtender.Filter); a name that was not sent is an error there, so we return a subset of
  the names, in their order. score-nodes looks them up in its node cache (functions/score-nodes).
- ``nodeCacheCapable: false``: the scheduler sends whole Node objects in ``Nodes`` and builds
  the filtered list from the ``Nodes`` we return, ignoring ``NodeNames``; returning only names
  would fail every node. Still answered, for configurations written before the cache.

Any status but 200 is an error to the scheduler ("failed filter with extender at URL ...,
code 400"), skipped when the extender is ``ignorable``, as is a non-empty ``Error``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypedDict, cast

import orjson
from prometheus_client import Counter, Gauge, Histogram

from shared.api.kubetypes import Node, Pod
from shared.nodes.score_nodes.decide import FilterResult, Priorities

REQUESTS: Final = Counter(
    "knr_extender_requests_total",
    "Calls from kube-scheduler to score-nodes, by verb (filter, prioritize) and HTTP status.",
    ["verb", "code"],
)
NODE_DECISIONS: Final = Counter(
    "knr_extender_node_decisions_total",
    "Nodes judged by score-nodes, by verb and reason (fits, cpu-over-threshold, maintenance, "
    "stale-usage, scored...).",
    ["verb", "reason"],
)
LATENCY: Final = Histogram(
    "knr_extender_seconds",
    "Time score-nodes takes to answer one scheduler call, parsing and encoding included.",
    ["verb"],
    # Fine below 25 ms, where a call should be (the target is 10 ms at p99).
    buckets=(
        0.0005,
        0.001,
        0.002,
        0.003,
        0.005,
        0.0075,
        0.01,
        0.015,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2.5,
        5,
    ),
)


CACHE_READY: Final = Gauge(
    "knr_extender_node_cache_ready",
    "1 while score-nodes' node cache is listed and following the API server; 0 while it is not "
    "(names-only calls then pass every node with a neutral score); 0 with the cache off.",
)
CACHE_NODES: Final = Gauge("knr_extender_node_cache_nodes", "Nodes in score-nodes' node cache.")
CACHE_MISSES: Final = Counter(
    "knr_extender_node_cache_misses_total",
    "Node names the scheduler sent that score-nodes' node cache did not hold (passed, scored "
    "neutral): nodes that registered a moment ago, or a cache that fell behind.",
)


class NodeList(TypedDict, total=False):
    metadata: dict[str, Any]
    items: list[Node] | None


class ExtenderArgs(TypedDict, total=False):
    Pod: Pod
    Nodes: NodeList | None
    NodeNames: list[str] | None


class ExtenderFilterResult(TypedDict, total=False):
    Nodes: NodeList | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    # Nodes preemption cannot help (they take precedence over FailedNodes).
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class HostPriority(TypedDict):
    Host: str
    Score: int


class WireError(ValueError):
    """The request is not ExtenderArgs we can read; answered with 400."""


@dataclass(frozen=True)
class Args:
    """ExtenderArgs, checked: the pod, the Node objects (None when only names were sent), and
    the node names in the order the scheduler sent them."""

    pod: Pod
    nodes: tuple[Node, ...] | None
    names: tuple[str, ...]


def _field(obj: Mapping[str, Any], name: str) -> Any:
    """``obj[name]`` as encoding/json matches it: exactly, else case-insensitively."""
    if name in obj:
        return obj[name]
    folded = name.lower()
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == folded:
            return value
    return None


def parse_args(body: bytes) -> Args:
    try:
        raw = orjson.loads(body)
    except ValueError as err:
        raise WireError(f"the body is not JSON: {err}") from err
    if not isinstance(raw, dict):
        raise WireError("expected ExtenderArgs, a JSON object with Pod and Nodes or NodeNames")
    pod = _field(raw, "Pod")
    if not isinstance(pod, dict):
        raise WireError("ExtenderArgs.Pod must be a Pod object")
    node_list = _field(raw, "Nodes")
    node_names = _field(raw, "NodeNames")
    if node_list is not None:
        if not isinstance(node_list, dict):
            raise WireError("ExtenderArgs.Nodes must be a NodeList object")
        items = _field(node_list, "items") or []
        if not isinstance(items, list):
            raise WireError("ExtenderArgs.Nodes.items must be a list of Nodes")
        names = []
        for index, item in enumerate(items):
            metadata = item.get("metadata") if isinstance(item, dict) else None
            name = metadata.get("name") if isinstance(metadata, dict) else None
            if not isinstance(name, str) or not name:
                raise WireError(f"ExtenderArgs.Nodes.items[{index}] is not a Node with a name")
            names.append(name)
        return Args(cast(Pod, pod), tuple(cast(list[Node], items)), tuple(names))
    if node_names is not None:
        if not isinstance(node_names, list) or not all(
            isinstance(name, str) and name for name in node_names
        ):
            raise WireError("ExtenderArgs.NodeNames must be a list of node names")
        return Args(cast(Pod, pod), None, tuple(node_names))
    raise WireError("ExtenderArgs has neither Nodes nor NodeNames")


def filter_response(args: Args, result: FilterResult) -> ExtenderFilterResult:
    """The filtered nodes as the scheduler reads them back, the failed ones with a reason.

    Failed nodes go to FailedAndUnresolvableNodes, not FailedNodes: the scheduler's preemption
    considers only nodes whose status is Unschedulable (preemption.Evaluator.findCandidates),
    then dry-runs its own filter plugins without the pods it would evict; extenders without a
    preempt verb are not asked. For a node failed on usage or maintenance, evicting
    lower-priority pods there would pass that dry run while our filter, asked again next
    cycle, fails the node again (measured usage falls only at the next sample, and maintenance
    not at all): victims evicted for nothing. Unresolvable keeps preemption off these nodes.
    """
    passed = set(result.passed)
    names = [name for name in args.names if name in passed]
    out: ExtenderFilterResult = {
        "NodeNames": names,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": result.failed,
    }
    if args.nodes is not None:
        kept = [node for node, name in zip(args.nodes, args.names, strict=True) if name in passed]
        out["Nodes"] = {"metadata": {}, "items": kept}
    return out


def priority_response(priorities: Priorities) -> list[HostPriority]:
    return [{"Host": score.node, "Score": score.score} for score in priorities.scores]
