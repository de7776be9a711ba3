"""annotate-usage at a thousand nodes: its writes go out several at a time, and a tick that comes
while an evaluation runs is answered at once instead of queueing behind it.

The Annotator runs with stand-ins for the API server and the usage source (its Kubernetes and
Prometheus paths, a dry run included, are tested in tests/e2e/test_annotate_usage.py).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from shared.nodes.annotate_usage.decide import Measured
from shared.nodes.annotate_usage.handler import WRITERS, Annotator
from shared.platform import kube as kubeapi
from shared.platform.config import Config
from tests.unit.nodes import node

NOW = datetime(2026, 11, 28, 10, 0, 0, tzinfo=UTC)


class SlowKube:
    """The Nodes listed; each patch takes ``delay`` seconds; how many ran at once is kept.
    Patches of the nodes in ``failing`` raise what the API server throttling would."""

    def __init__(self, nodes: list[dict[str, Any]], delay: float = 0.02) -> None:
        self.nodes = nodes
        self.delay = delay
        self.failing: set[str] = set()
        self.patched: list[str] = []
        self.in_flight = 0
        self.most = 0
        self._lock = threading.Lock()

    def list_all(self, kind: str, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        yield from (self.nodes if kind == "Node" else [])

    def merge_patch(self, kind: str, namespace: None, name: str, body: Any) -> dict[str, Any]:
        with self._lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        try:
            time.sleep(self.delay)
            if name in self.failing:
                raise kubeapi.Transient(f"429 for {name}")
            with self._lock:
                self.patched.append(name)
            return {}
        finally:
            with self._lock:
                self.in_flight -= 1


class Source:
    """Every node at 2 cores and 4 GiB; ``gate``, when set, holds each sample until it opens."""

    name = "prometheus"

    def __init__(self) -> None:
        self.gate: threading.Event | None = None
        self.asked = threading.Event()

    def sample(self, internal_ips: Mapping[str, Iterable[str]]) -> dict[str, Measured]:
        self.asked.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        return {name: Measured(cpu_cores=2.0, memory_bytes=4.0 * 2**30) for name in internal_ips}


def names(count: int) -> list[str]:
    prefix = uuid.uuid4().hex[:6]
    return [f"node-{prefix}-{i}" for i in range(count)]


def skipped() -> float:
    value = REGISTRY.get_sample_value("knr_usage_evaluations_total", {"outcome": "skipped"})
    return value or 0.0


def test_every_node_is_written_several_at_a_time_and_no_more_than_writers() -> None:
    nodes = names(40)
    kube = SlowKube([node(n) for n in nodes])
    annotator = Annotator(kube, Source(), Config(), clock=lambda: NOW)  # type: ignore[arg-type]

    evaluation = annotator.evaluate()

    assert evaluation is not None
    assert sorted(kube.patched) == sorted(nodes)
    assert sorted(evaluation.written) == sorted(nodes)
    assert 1 < kube.most <= WRITERS


def test_a_throttled_node_is_left_for_the_next_tick_and_the_others_are_written() -> None:
    nodes = names(12)
    kube = SlowKube([node(n) for n in nodes], delay=0.0)
    kube.failing = {nodes[3], nodes[7]}
    annotator = Annotator(kube, Source(), Config(), clock=lambda: NOW)  # type: ignore[arg-type]

    # The tick is answered with what a retry fixes, naming the nodes left.
    with pytest.raises(kubeapi.Transient) as raised:
        annotator.evaluate()
    assert nodes[3] in str(raised.value) and nodes[7] in str(raised.value)
    assert sorted(kube.patched) == sorted(set(nodes) - kube.failing)


def test_a_tick_during_an_evaluation_is_answered_at_once_and_measures_nothing() -> None:
    nodes = names(3)
    kube = SlowKube([node(n) for n in nodes], delay=0.0)
    source = Source()
    source.gate = threading.Event()
    annotator = Annotator(kube, source, Config(), clock=lambda: NOW)  # type: ignore[arg-type]
    first = threading.Thread(target=annotator.evaluate)
    first.start()
    try:
        assert source.asked.wait(5)
        source.asked.clear()
        before = skipped()

        assert annotator.evaluate() is None

        assert skipped() == before + 1
        assert not source.asked.is_set()
    finally:
        source.gate.set()
        first.join(10)
    # The running evaluation wrote every node once; the next tick evaluates again.
    assert sorted(kube.patched) == sorted(nodes)
    source.gate = None
    assert annotator.evaluate() is not None
