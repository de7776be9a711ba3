"""score-nodes' node cache: what it keeps of a Node, how list and watch events change it, when
it can be trusted, and the list-watch loop's answers to an expired version and to failures.

The Nodes are the two the real kube-scheduler (v1.36.3) sent in tests/handlers/extender_args.json
(registered by kwok, with managedFields, conditions, addresses and nodeInfo as the API server
returns them). The loop runs against a scripted source with the two calls of
shared.platform.kube.Kube; the real API server's list and watch are tests/e2e/test_node_cache.py.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from shared.api.keys import MAINTENANCE_LABEL, USAGE_ANNOTATION
from shared.api.kubetypes import Node
from shared.api.usage import Reading, UsageRecord
from shared.nodes.score_nodes import decide as extender
from shared.platform import informer
from shared.platform.config import Config
from shared.platform.kube import JSON, Gone, Transient, WatchEvent, _watch_event

CAPTURED = json.loads(
    (Path(__file__).parents[1] / "handlers" / "extender_args.json").read_text(encoding="utf-8")
)
NOW = datetime(2026, 11, 27, 20, 0, tzinfo=UTC)


def kubelet_node(name: str = "node-0", **annotations: str) -> JSON:
    node: JSON = copy.deepcopy(CAPTURED["Nodes"]["items"][0])
    node["metadata"]["name"] = name
    node["metadata"].setdefault("annotations", {}).update(annotations)
    return node


def usage(cpu: float) -> str:
    return UsageRecord(
        sampled_at=NOW, source="prometheus", cpu=Reading(now=cpu), memory=Reading(now=20.0)
    ).to_json()


def event(kind: str, obj: JSON, version: str = "") -> WatchEvent:
    obj = copy.deepcopy(obj)
    if version:
        obj["metadata"]["resourceVersion"] = version
    return WatchEvent(kind, obj)


# -- what is kept -------------------------------------------------------------------------------


def test_the_cache_keeps_the_node_parsed_for_the_decisions() -> None:
    node = kubelet_node(**{USAGE_ANNOTATION: usage(50), "other.io/note": "x"})
    view = extender.view_of(cast(Node, node), Config())
    assert (view.name, view.maintenance, view.takes_pods) == ("node-0", False, True)
    assert view.usage == usage(50) and view.sampled_at == NOW
    assert isinstance(view.load, extender.Load) and view.load.cpu == 50.0
    # The answers that do not depend on the pod or the time, made once.
    assert (view.verdict.passed, view.verdict.reason) == (True, extender.FITS)
    assert view.score is not None and view.score.reason == extender.SCORED


@pytest.mark.parametrize("cpu", [10.0, 50.0, 79.0, 85.0])
@pytest.mark.parametrize("maintenance", [False, True])
def test_a_cached_view_gets_the_same_verdict_and_score_as_the_whole_node(
    cpu: float, maintenance: bool
) -> None:
    cfg = Config()
    whole = kubelet_node(**{USAGE_ANNOTATION: usage(cpu)})
    if maintenance:
        whole["metadata"]["labels"][MAINTENANCE_LABEL] = "true"
    view = extender.view_of(cast(Node, whole), cfg)
    pod = CAPTURED["Pod"]
    # The pod's requests push a node at 79 % over the predicted limit only with them counted.
    for now in (NOW, NOW + cfg.usage_stale_after * 2):
        assert extender.filter_views(pod, [view], cfg, now) == extender.filter_nodes(
            pod, [cast(Node, whole)], cfg, now
        )
        assert extender.prioritize_views(pod, [view], cfg, now) == extender.prioritize(
            pod, [cast(Node, whole)], cfg, now
        )


def test_a_view_goes_stale_when_its_record_does_and_is_judged_unknown_then() -> None:
    cfg = Config()
    view = extender.view_of(cast(Node, kubelet_node(**{USAGE_ANNOTATION: usage(95)})), cfg)
    fresh = extender.filter_views(CAPTURED["Pod"], [view], cfg, NOW).verdicts[0]
    later = NOW + cfg.usage_stale_after + timedelta(seconds=1)
    stale = extender.filter_views(CAPTURED["Pod"], [view], cfg, later).verdicts[0]
    # The only node, hot: the default scheduler's pod gets it anyway, ranked (EVERY_NODE_HOT).
    assert fresh.reason == extender.EVERY_NODE_HOT and "CPU usage over" in fresh.message
    assert (stale.passed, stale.reason) == (True, extender.STALE_USAGE)


def test_a_cordoned_node_stays_cordoned_in_the_cache() -> None:
    node = kubelet_node()
    node["spec"]["unschedulable"] = True
    assert not extender.view_of(cast(Node, node), Config()).takes_pods


def test_a_name_the_cache_does_not_hold_passes_as_an_unmeasured_node() -> None:
    cfg = Config()
    cached = {
        "node-0": extender.view_of(cast(Node, kubelet_node(**{USAGE_ANNOTATION: usage(95)})), cfg)
    }
    nodes, missing = extender.named(("node-0", "node-new"), cached.get)
    assert missing == 1
    result = extender.filter_views(CAPTURED["Pod"], nodes, cfg, NOW)
    assert [(v.node, v.passed, v.reason) for v in result.verdicts] == [
        ("node-0", False, extender.CPU_OVER),
        ("node-new", True, extender.NO_USAGE),
    ]


# -- list and watch events ----------------------------------------------------------------------


def cache(max_outage: float = 180.0) -> informer.Cache[extender.NodeView]:
    return informer.Cache(
        lambda obj: extender.view_of(cast(Node, obj), Config()), max_outage=max_outage
    )


def test_a_cache_is_not_ready_until_it_has_listed() -> None:
    nodes = cache()
    assert not nodes.ready(0.0)
    nodes.replace([kubelet_node("node-0"), kubelet_node("node-1")], "100")
    assert nodes.ready(0.0)
    assert nodes.status() == informer.Status(True, None, "100", 2)


def test_watch_events_add_change_and_remove_nodes_and_move_the_version_on() -> None:
    nodes = cache()
    nodes.replace([kubelet_node("node-0")], "100")
    nodes.apply(event("ADDED", kubelet_node("node-1"), "101"))
    nodes.apply(event("MODIFIED", kubelet_node("node-0", **{USAGE_ANNOTATION: usage(70)}), "102"))
    nodes.apply(event("DELETED", kubelet_node("node-1"), "103"))
    # A bookmark carries only a version.
    nodes.apply(WatchEvent("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "110"}}))
    assert set(nodes.snapshot()) == {"node-0"}
    got = nodes.get("node-0")
    assert got is not None and got.usage == usage(70)
    assert nodes.status().resource_version == "110"


def test_a_new_list_replaces_everything_a_missed_delete_included() -> None:
    nodes = cache()
    nodes.replace([kubelet_node("node-0"), kubelet_node("gone")], "100")
    nodes.replace([kubelet_node("node-0")], "500")
    assert set(nodes.snapshot()) == {"node-0"}


def test_a_cache_failing_longer_than_its_outage_is_not_trusted_until_it_works_again() -> None:
    nodes = cache(max_outage=180.0)
    nodes.replace([kubelet_node()], "100")
    nodes.failed(1000.0)
    nodes.failed(1100.0)  # the outage counts from its first failure
    assert nodes.ready(1180.0)
    assert not nodes.ready(1181.0)
    nodes.apply(event("MODIFIED", kubelet_node(), "101"))
    assert nodes.ready(1181.0)


# -- the loop -----------------------------------------------------------------------------------


class Scripted:
    """Answers list and watch from a script; each step is a list answer (items, version), a
    watch answer (events, or events then an exception), or an exception."""

    def __init__(self, steps: Iterable[Any], stop: threading.Event, cache: informer.Cache) -> None:
        self.steps = list(steps)
        self.stop = stop
        self.cache = cache
        self.calls: list[str] = []
        # The cache as each call found it.
        self.seen: list[informer.Status] = []

    def _next(self) -> Any:
        if not self.steps:
            self.stop.set()
            return []
        return self.steps.pop(0)

    def list_snapshot(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        limit: int = 500,
        keep: Callable[[JSON], Any] | None = None,
    ) -> tuple[list[Any], str]:
        self.calls.append("list")
        self.seen.append(self.cache.status())
        step = self._next()
        if isinstance(step, Exception):
            raise step
        if not step:
            raise Transient("the script ended")
        items, version = cast(tuple[list[JSON], str], step)
        return [keep(item) for item in items] if keep else items, version

    def watch(
        self,
        kind: str,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        namespace: str | None = None,
    ) -> Iterator[WatchEvent]:
        self.calls.append(f"watch@{resource_version}")
        self.seen.append(self.cache.status())
        step = self._next()
        if isinstance(step, Exception):
            raise step
        for item in step:
            if isinstance(item, Exception):
                raise item
            yield item


def run(
    steps: list[Any],
    nodes: informer.Cache[extender.NodeView],
    waits: list[int] | None = None,
) -> Scripted:
    """The loop over ``steps``; ``waits`` collects the failure count of each back-off (the
    back-off itself is not waited)."""
    stop = threading.Event()
    source = Scripted(steps, stop, nodes)
    with pytest.MonkeyPatch.context() as patch:
        if waits is not None:

            def count(failures: int) -> float:
                waits.append(failures)
                return 0.0

            patch.setattr(informer, "backoff", count)
        informer.run(lambda: source, "Node", nodes, stop, clock=lambda: 50.0)
    return source


def test_the_loop_resumes_each_watch_from_the_last_version_it_saw() -> None:
    nodes = cache()
    source = run(
        [
            ([kubelet_node("node-0")], "100"),
            [event("ADDED", kubelet_node("node-1"), "105")],
            [WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "120"}})],
        ],
        nodes,
    )
    assert source.calls[:3] == ["list", "watch@100", "watch@105"]
    assert source.calls[3] == "watch@120"
    assert set(nodes.snapshot()) == {"node-0", "node-1"}


def test_an_expired_version_after_a_working_watch_lists_again_at_once() -> None:
    nodes = cache()
    waits: list[int] = []
    source = run(
        [
            ([kubelet_node("node-0")], "100"),
            [
                event("MODIFIED", kubelet_node("node-0"), "150"),
                Gone("WATCH /api/v1/nodes: 410 Expired: too old resource version", 410, "Expired"),
            ],
            ([kubelet_node("node-1")], "900"),
        ],
        nodes,
        waits,
    )
    assert source.calls[:4] == ["list", "watch@100", "list", "watch@900"]
    assert set(nodes.snapshot()) == {"node-1"}
    assert nodes.status().failing_since is None
    assert waits == []


def test_a_watch_refused_right_after_each_list_backs_off_longer_each_time() -> None:
    """RBAC granting list but not watch, or a proxy cutting long requests: the lists work,
    every watch fails at once. The back-off must grow, not restart after each good list (a
    LIST of every Node twice a second, forever)."""
    refused = Transient("WATCH /api/v1/nodes: 403 Forbidden")
    waits: list[int] = []
    steps: list[Any] = []
    for version in ("1", "2", "3", "4"):
        steps += [([kubelet_node("node-0")], version), refused]
    run(steps, cache(), waits)
    assert waits[:4] == [1, 2, 3, 4]


def test_an_expired_version_straight_after_a_list_is_backed_off_like_a_failure() -> None:
    gone = Gone("WATCH /api/v1/nodes: 410 Expired", 410, "Expired")
    waits: list[int] = []
    run([([kubelet_node()], "1"), gone, ([kubelet_node()], "2"), gone], cache(), waits)
    assert waits[:2] == [1, 2]


def test_a_broken_watch_is_a_failure_the_cache_keeps_what_it_had_until_a_list_works() -> None:
    nodes = cache()
    source = run(
        [
            ([kubelet_node("node-0")], "100"),
            [Transient("WATCH /api/v1/nodes: connection reset")],
            Transient("GET /api/v1/nodes: connection refused"),
            ([kubelet_node("node-0"), kubelet_node("node-1")], "200"),
        ],
        nodes,
    )
    assert source.calls == ["list", "watch@100", "list", "list", "watch@200"]
    # After the broken watch and the refused list: the old picture, marked failing.
    assert source.seen[2] == informer.Status(True, 50.0, "100", 1)
    assert source.seen[3] == informer.Status(True, 50.0, "100", 1)
    # The next list replaces it and clears the failure.
    assert source.seen[4] == informer.Status(True, None, "200", 2)


def test_an_unreachable_api_at_start_leaves_the_cache_unlisted() -> None:
    nodes = cache()
    source = run([Transient("GET /api/v1/nodes: connection refused")], nodes)
    assert source.calls[0] == "list"
    assert not nodes.ready(50.0)


def test_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    for failures, full in ((1, 0.5), (2, 1.0), (4, 4.0), (20, 30.0)):
        waits = [informer.backoff(failures) for _ in range(50)]
        assert all(full / 2 <= wait <= full for wait in waits), (failures, waits)


def test_an_error_line_of_a_watch_ends_it_with_the_status_it_carries() -> None:
    # What the API server streams for a watch from a compacted version (metav1.Status).
    line = (
        b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},'
        b'"status":"Failure","message":"too old resource version: 1 (4242)",'
        b'"reason":"Expired","code":410}}'
    )
    with pytest.raises(Gone) as gone:
        _watch_event(line, "WATCH /api/v1/nodes")
    assert gone.value.status == 410 and "too old resource version" in str(gone.value)
    with pytest.raises(Transient):
        _watch_event(b"not json", "WATCH /api/v1/nodes")
    added = _watch_event(
        b'{"type":"ADDED","object":{"metadata":{"name":"n","resourceVersion":"7"}}}', "w"
    )
    assert (added.type, added.resource_version) == ("ADDED", "7")
