"""The usage sources' answers and failures, with stand-ins for Prometheus and the API server.

Stand-ins, because these are failures a real server does not give on demand: Prometheus
refusing one of our fixed expressions while answering the others, the aggregation layer
missing the Metrics API. The happy paths run against the real Prometheus in
tests/e2e/test_annotate_usage.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from shared.nodes.annotate_usage.sources import (
    MetricsApiSource,
    PrometheusSource,
    SourceDown,
    queries,
)
from shared.platform import kube as kubeapi
from shared.platform import prometheus as prom

NODES = {"node-1": ["10.0.0.11"], "node-2": ["10.0.0.12"]}
QUERIES = queries(timedelta(minutes=1))


class FakePrometheus:
    """Answers each of our queries from a table; a missing entry raises what it says."""

    url = "http://prometheus.test:9090"

    def __init__(self, answers: dict[str, list[prom.Sample] | Exception]) -> None:
        self.answers = answers

    def query(self, expr: str) -> list[prom.Sample]:
        key = next(k for k, v in QUERIES.items() if v == expr)
        answer = self.answers[key]
        if isinstance(answer, Exception):
            raise answer
        return answer


def per_node(**values: float) -> list[prom.Sample]:
    ips = {"node-1": "10.0.0.11", "node-2": "10.0.0.12"}
    return [prom.Sample({"instance": f"{ips[n]}:9100"}, v) for n, v in values.items()]


def source(answers: dict[str, Any]) -> PrometheusSource:
    return PrometheusSource(FakePrometheus(answers))  # type: ignore[arg-type]


def test_every_value_comes_from_its_query_matched_to_nodes_by_instance() -> None:
    got = source(
        {
            "cpu": per_node(**{"node-1": 2.0, "node-2": 0.5}),
            "cpu_avg5m": per_node(**{"node-1": 1.5}),
            "cpu_max1h": per_node(**{"node-1": 1.0}),
            "memory": per_node(**{"node-1": 4e9, "node-2": 1e9}),
            "memory_avg5m": per_node(**{"node-1": 3e9}),
            "memory_max1h": per_node(**{"node-1": 5e9}),
        }
    ).sample(NODES)
    assert got["node-1"].cpu_cores == 2.0 and got["node-1"].cpu_cores_avg5m == 1.5
    # The hour's maximum is never below the current value.
    assert got["node-1"].cpu_cores_max1h == 2.0
    assert got["node-1"].memory_bytes_max1h == 5e9
    assert got["node-2"].cpu_cores_avg5m is None and got["node-2"].memory_bytes == 1e9


def test_a_refused_history_query_leaves_history_out() -> None:
    answers: dict[str, Any] = {k: per_node(**{"node-1": 1.0}) for k in QUERIES}
    answers["cpu_max1h"] = prom.QueryFailed("bad_data: subqueries not allowed")
    got = source(answers).sample(NODES)
    assert got["node-1"].cpu_cores_max1h is None and got["node-1"].cpu_cores == 1.0


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        (prom.QueryFailed("execution: out of memory"), "refused the cpu query"),
        (prom.Unreachable("connection refused"), "Prometheus: connection refused"),
        (prom.BadAnswer("HTML page"), "Prometheus: HTML page"),
    ],
)
def test_without_the_current_usage_the_source_is_down(failure: Exception, message: str) -> None:
    answers: dict[str, Any] = {k: per_node(**{"node-1": 1.0}) for k in QUERIES}
    answers["cpu"] = failure
    with pytest.raises(SourceDown, match=message):
        source(answers).sample(NODES)


def test_a_node_without_both_current_values_is_not_measured() -> None:
    answers: dict[str, Any] = {k: per_node(**{"node-1": 1.0}) for k in QUERIES}
    answers["memory"] = per_node(**{"node-2": 1e9})
    assert source(answers).sample(NODES) == {}


class FakeKube:
    def __init__(self, items: list[dict[str, Any]] | Exception) -> None:
        self.items = items

    def list_all(self, kind: str, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        assert kind == "NodeMetrics"
        if isinstance(self.items, Exception):
            raise self.items
        yield from self.items


def node_metrics(name: str, cpu: str, memory: str) -> dict[str, Any]:
    # As metrics-server serves it (metrics.k8s.io/v1beta1 NodeMetrics).
    return {
        "metadata": {"name": name, "creationTimestamp": "2026-11-23T10:00:05Z"},
        "timestamp": "2026-11-23T10:00:00Z",
        "window": "20.05s",
        "usage": {"cpu": cpu, "memory": memory},
    }


def test_the_metrics_api_gives_current_usage_in_cores_and_bytes() -> None:
    kube = FakeKube(
        [
            node_metrics("node-1", "1250m", "2Gi"),
            node_metrics("node-2", "97914163n", "524288Ki"),
            node_metrics("gone", "1", "1Gi"),
            node_metrics("node-3", "lots", "1Gi"),
        ]
    )
    got = MetricsApiSource(kube).sample({**NODES, "node-3": []})  # type: ignore[arg-type]
    assert got["node-1"].cpu_cores == 1.25 and got["node-1"].memory_bytes == 2 * 2**30
    assert got["node-2"].cpu_cores == pytest.approx(0.0979, abs=1e-4)
    assert got["node-1"].cpu_cores_avg5m is None
    assert set(got) == {"node-1", "node-2"}


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        (kubeapi.NotFound("the server could not find the requested resource"), "not served"),
        (kubeapi.Forbidden("nodes.metrics.k8s.io is forbidden"), "not allowed"),
        (kubeapi.Transient("503 service unavailable"), "did not answer"),
    ],
)
def test_a_missing_or_silent_metrics_api_is_a_source_down(failure: Exception, message: str) -> None:
    with pytest.raises(SourceDown, match=message):
        MetricsApiSource(FakeKube(failure)).sample(NODES)  # type: ignore[arg-type]
