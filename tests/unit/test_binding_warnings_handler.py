"""annotate-usage's binding warnings inside an evaluation: bounded in time, judged again when an
evaluation could not judge, and never in the way of the usage writes.

The Annotator runs with stand-ins for the API server (the Nodes, the bound pods, Event creates
that may be slow) and the usage source; the real API server path is
tests/e2e/test_annotate_usage.py's.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.nodes.annotate_usage.decide import Measured
from shared.nodes.annotate_usage.handler import Annotator
from shared.nodes.annotate_usage.sources import SourceDown
from shared.platform import kube
from shared.platform.config import Config
from tests.unit.nodes import node
from tests.unit.pods import pod, ts

NOW = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)


def bound(name: str, at: datetime) -> Any:
    return pod(
        name,
        node="node-1",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": ts(at),
            }
        ],
    )


class Api:
    """The Nodes and pods listed; Event creates take ``delay`` seconds each and are kept."""

    def __init__(self, pods: list[Any], delay: float = 0.0) -> None:
        self.pods = pods
        self.delay = delay
        self.events: list[str] = []
        self.names: set[str] = set()
        self.patched: list[str] = []

    def list_all(self, kind: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        yield from ([node("node-1")] if kind == "Node" else self.pods)

    def merge_patch(self, kind: str, namespace: None, name: str, body: Any) -> Any:
        self.patched.append(name)
        return {}

    def create(self, kind: str, namespace: str, body: Any) -> Any:
        time.sleep(self.delay)
        # As the API server answers a second create of the same name.
        if body["metadata"]["name"] in self.names:
            raise kube.AlreadyExists("409: already exists", 409)
        self.names.add(body["metadata"]["name"])
        self.events.append(body["involvedObject"]["name"])
        return body


class Hot:
    """node-1 at 7.8 of its 7.8 allocatable cores: 100 % CPU."""

    name = "prometheus"

    def __init__(self) -> None:
        self.down = False

    def sample(self, internal_ips: Mapping[str, Iterable[str]]) -> dict[str, Measured]:
        if self.down:
            raise SourceDown("prometheus: connection refused")
        return {n: Measured(cpu_cores=7.8, memory_bytes=1.0 * 2**30) for n in internal_ips}


def annotator(api: Api, source: Hot, clock: list[datetime]) -> Annotator:
    return Annotator(api, source, Config(), clock=lambda: clock[0])  # type: ignore[arg-type]


def test_slow_event_creates_stop_at_the_budget_and_the_rest_are_said_next_time() -> None:
    pods = [bound(f"web-{i}", NOW - timedelta(seconds=5)) for i in range(10)]
    api, clock = Api(pods, delay=0.05), [NOW]
    usage = annotator(api, Hot(), clock)
    usage.warning_budget = 0.12

    usage.evaluate()
    first = len(api.events)
    assert api.patched == ["node-1"], "the usage was written first, whatever the warnings"
    assert 0 < first < 10

    # The next evaluation judges the same bindings again and says the rest, each once.
    api.delay, usage.warning_budget, clock[0] = 0.0, 5.0, NOW + timedelta(seconds=30)
    usage.evaluate()
    assert sorted(api.events) == sorted(f"web-{i}" for i in range(10))


def test_an_evaluation_without_a_measurement_leaves_the_bindings_for_the_next() -> None:
    api, source, clock = Api([bound("web-0", NOW - timedelta(seconds=2))]), Hot(), [NOW]
    usage = annotator(api, source, clock)
    source.down = True
    usage.evaluate()
    assert api.events == []

    source.down, clock[0] = False, NOW + timedelta(seconds=30)
    usage.evaluate()
    assert api.events == ["web-0"]


def test_a_binding_a_skewed_clock_puts_before_the_last_evaluation_is_still_judged() -> None:
    # Ours runs 3 s ahead of the API server's: the pod bound right after the first evaluation
    # carries a time 2 s before it.
    api, clock = Api([]), [NOW]
    usage = annotator(api, Hot(), clock)
    usage.evaluate()
    api.pods = [bound("web-0", NOW - timedelta(seconds=2))]
    clock[0] = NOW + timedelta(seconds=30)
    usage.evaluate()
    assert api.events == ["web-0"]


class Warming(Hot):
    """node-1 at 2 of its 7.8 cores (26 %), then at 100 % once ``hot`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hot = False

    def sample(self, internal_ips: Mapping[str, Iterable[str]]) -> dict[str, Measured]:
        cores = 7.8 if self.hot else 2.0
        return {n: Measured(cpu_cores=cores, memory_bytes=1.0 * 2**30) for n in internal_ips}


def test_a_binding_judged_under_the_limit_is_not_warned_when_the_node_heats_up_later() -> None:
    api, source, clock = Api([bound("web-0", NOW - timedelta(seconds=5))]), Warming(), [NOW]
    usage = annotator(api, source, clock)
    usage.evaluate()
    assert api.events == []
    # Other load comes 3 s later: the binding, still within the skew margin of the last
    # evaluation, was judged fine then and is not blamed for what came after it.
    source.hot, clock[0] = True, NOW + timedelta(seconds=3)
    usage.evaluate()
    assert api.events == []
    # A binding after that evaluation is judged against the hot node.
    api.pods.append(bound("web-1", NOW + timedelta(seconds=2)))
    clock[0] = NOW + timedelta(seconds=30)
    usage.evaluate()
    assert api.events == ["web-1"]


def test_a_new_process_leaves_the_bindings_a_previous_one_judged() -> None:
    # web-0 was bound 50 s ago, within the estimate window, before this process began.
    api, clock = Api([bound("web-0", NOW - timedelta(seconds=50))]), [NOW]
    usage = annotator(api, Hot(), clock)
    usage.evaluate()
    assert api.events == []
    # One bound since it began (a skewed clock's few seconds before) is its to judge.
    api.pods.append(bound("web-1", NOW - timedelta(seconds=4)))
    clock[0] = NOW + timedelta(seconds=30)
    usage.evaluate()
    assert api.events == ["web-1"]
