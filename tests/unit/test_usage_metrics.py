"""annotate-usage's per-node gauges on /metrics follow the nodes that exist.

``node_cpu_usage_percent`` and ``node_memory_usage_percent`` carry a ``node`` label; a series
left behind by every node that ever existed makes /metrics grow with node churn (an autoscaled
cluster replaces nodes daily) and shows dashboards a node that is gone. The Annotator runs here
with stand-ins for the API server and the usage source (its Kubernetes and Prometheus paths are
tested in tests/e2e/test_annotate_usage.py); /metrics is read as the function serves it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from shared.api.keys import OPT_OUT_LABEL
from shared.nodes.annotate_usage.decide import Measured
from shared.nodes.annotate_usage.handler import Annotator
from shared.platform import metrics
from shared.platform.config import Config
from tests.unit.nodes import node

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)


class FakeKube:
    """The Nodes listed; pods none; patches recorded and applied to nothing."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = nodes

    def list_all(self, kind: str, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        yield from (self.nodes if kind == "Node" else [])

    def merge_patch(self, *args: Any) -> dict[str, Any]:
        return {}


class FakeSource:
    """Every node it is asked about at 2 cores and 4 GiB in use."""

    name = "prometheus"

    def sample(self, internal_ips: Mapping[str, Iterable[str]]) -> dict[str, Measured]:
        return {name: Measured(cpu_cores=2.0, memory_bytes=4.0 * 2**30) for name in internal_ips}


def gauged_nodes() -> dict[str, set[str]]:
    """Metric name -> the ``node`` label values /metrics shows for it."""
    text = metrics.response().get_data(as_text=True)
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        if family.name in ("node_cpu_usage_percent", "node_memory_usage_percent"):
            out[family.name] = {s.labels["node"] for s in family.samples}
    return out


def test_a_node_that_is_gone_or_opted_out_leaves_metrics_and_the_others_stay() -> None:
    # Names of their own: the gauges are process-wide, other tests' nodes may be there.
    a, b, c = (f"node-{uuid.uuid4().hex[:8]}" for _ in range(3))
    kube = FakeKube([node(a), node(b), node(c)])
    annotator = Annotator(kube, FakeSource(), Config(), clock=lambda: NOW)  # type: ignore[arg-type]

    annotator.evaluate()
    shown = gauged_nodes()
    assert {a, b, c} <= shown["node_cpu_usage_percent"]
    assert {a, b, c} <= shown["node_memory_usage_percent"]

    # b is deleted (the cluster autoscaler scaled it down), c opts out.
    kube.nodes = [node(a), node(c, labels={OPT_OUT_LABEL: ""})]
    annotator.evaluate()
    shown = gauged_nodes()
    for name in ("node_cpu_usage_percent", "node_memory_usage_percent"):
        assert a in shown[name]
        assert b not in shown[name] and c not in shown[name]


def test_a_node_the_source_misses_once_keeps_its_last_value() -> None:
    a = f"node-{uuid.uuid4().hex[:8]}"
    kube = FakeKube([node(a)])
    annotator = Annotator(kube, FakeSource(), Config(), clock=lambda: NOW)  # type: ignore[arg-type]
    annotator.evaluate()

    class Silent(FakeSource):
        def sample(self, internal_ips: Mapping[str, Iterable[str]]) -> dict[str, Measured]:
            return {}

    annotator.source = Silent()
    annotator.evaluate()
    assert a in gauged_nodes()["node_cpu_usage_percent"]
