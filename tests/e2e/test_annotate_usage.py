"""annotate-usage on the real control plane, reading the real local Prometheus.

The function runs in-process exactly as functions-framework serves it, with a real API client
and the real Prometheus HTTP API; each evaluation is one PingSource event posted to it. Usage
is set on a Node's simulated node-exporter (localcluster.nodeexporter), scraped every second;
the current CPU usage is a rate over 10 s here (KN_RESCHEDULER_USAGE_RATE_WINDOW). The local
nodes have 8 CPUs and 7800m allocatable, so a CPU busy at 90 % is 92.3 % of allocatable.
"""

from __future__ import annotations

import flask.testing
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dev.localcluster import Cluster
from shared.api.keys import LOAD_LABEL, MAINTENANCE_LABEL, PING_EVENT_TYPE, USAGE_ANNOTATION
from shared.api.usage import UsageRecord
from shared.platform.kube import Kube
from tests.e2e.conftest import let_time_pass, wait_for
from tests.e2e.test_label_nodes import cpu_by_node, reads
from tests.handlers.conftest import ON_DEMAND_TICKS, ClientFactory, cloudevent

pytestmark = pytest.mark.e2e

STALE_AFTER = 6.0
# 8 CPUs of capacity, 7800m allocatable: usage of allocatable = usage of the machine * 8 / 7.8.
SCALE = 8 / 7.8


def ping(client: flask.testing.FlaskClient) -> None:
    headers, body = cloudevent(PING_EVENT_TYPE, {"message": "measure"}, source="/pingsource")
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 202, response.get_data(as_text=True)


def usage_of(cluster: Cluster, node: str) -> tuple[UsageRecord | None, str | None]:
    meta = cluster.rest.get(f"/api/v1/nodes/{node}")["metadata"]
    raw = (meta.get("annotations") or {}).get(USAGE_ANNOTATION)
    return (UsageRecord.from_json(raw) if raw else None), (meta.get("labels") or {}).get(LOAD_LABEL)


def node_writes(client: flask.testing.FlaskClient) -> float:
    text = client.get("/metrics").get_data(as_text=True)
    for family in text_string_to_metric_families(text):
        if family.name == "knr_usage_node_writes":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


def bind(api: Kube, namespace: str, name: str, node: str) -> None:
    """A pod requesting 1950m (25 % of a local node's allocatable) bound to ``node`` by a
    nodeSelector, past any extender; returns once the scheduler bound it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {"requests": {"cpu": "1950m", "memory": "1Gi"}},
                }
            ],
        },
    }
    api.create("Pod", namespace, pod)
    wait_for(
        f"the scheduler to bind {name}",
        lambda: api.get("Pod", namespace, name)["spec"].get("nodeName") == node,
    )


@pytest.fixture
def annotate_usage(cluster: Cluster, function_client: ClientFactory) -> flask.testing.FlaskClient:
    wait_for(
        "every node to read quiet",
        lambda: (
            (v := cpu_by_node(cluster.prometheus_url)).keys() >= set(cluster.nodes)
            and all(v[n] < 60 for n in cluster.nodes)
        ),
    )
    return function_client(
        "annotate-usage",
        KUBECONFIG=str(cluster.kubeconfig),
        **ON_DEMAND_TICKS,
        KN_RESCHEDULER_PROMETHEUS_URL=cluster.prometheus_url,
        KN_RESCHEDULER_USAGE_RATE_WINDOW="10s",
        KN_RESCHEDULER_USAGE_STALE_AFTER=f"{STALE_AFTER:g}s",
    )


def test_each_nodes_usage_is_written_onto_it_as_percent_of_allocatable(
    cluster: Cluster, annotate_usage: flask.testing.FlaskClient
) -> None:
    busy, idle, *_ = cluster.nodes
    cluster.set_node_usage(busy, cpu=0.9, memory=0.5)
    cluster.set_node_usage(idle, cpu=0.1, memory=0.1)
    wait_for("Prometheus to read the busy node", reads(cluster, busy, 88, 92))
    wait_for("Prometheus to read the idle node", reads(cluster, idle, 8, 12))

    ping(annotate_usage)

    record, bucket = usage_of(cluster, busy)
    assert record is not None
    assert record.source == "prometheus"
    assert record.cpu.now == pytest.approx(90 * SCALE, abs=2.5)
    # Memory: MemTotal - MemAvailable over allocatable (a little under capacity).
    assert record.memory.now == pytest.approx(50 * 32873196 / 32158316, abs=1)
    # History: the 5-minute average is a young Prometheus's (extrapolated over a few seconds
    # of data, so only its presence is asserted); the hour's maximum is at least the current.
    assert record.cpu.avg5m is not None and record.memory.avg5m is not None
    assert record.cpu.max1h is not None and record.cpu.max1h >= record.cpu.now - 1
    assert record.memory.max1h is not None and record.memory.max1h >= record.memory.now - 1
    assert bucket == "overloaded"
    idle_record, idle_bucket = usage_of(cluster, idle)
    assert idle_record is not None and idle_record.cpu.now == pytest.approx(10 * SCALE, abs=2.5)
    assert idle_bucket == "low"
    status = annotate_usage.get("/status").get_json()
    assert status["source_up"] is True and status["measured"] == len(cluster.nodes)

    # Nothing moved: the next evaluation writes no Node.
    before = node_writes(annotate_usage)
    ping(annotate_usage)
    assert node_writes(annotate_usage) == before


def test_a_tick_replayed_in_dry_run_decides_every_node_and_writes_none(
    cluster: Cluster, annotate_usage: flask.testing.FlaskClient
) -> None:
    # The writes go out from a pool of threads: the dry run asked for by the event must reach
    # each of them, or a replay would write for real.
    assert all(usage_of(cluster, n) == (None, None) for n in cluster.nodes)
    before = node_writes(annotate_usage)
    headers, body = cloudevent(
        PING_EVENT_TYPE, {"message": "measure"}, source="/pingsource", knrdryrun="true"
    )
    response = annotate_usage.post("/", headers=headers, data=body)
    assert response.status_code == 202, response.get_data(as_text=True)

    # Every node was decided and its write sent, as a dry run: the API server kept nothing.
    assert node_writes(annotate_usage) - before == len(cluster.nodes)
    assert all(usage_of(cluster, n) == (None, None) for n in cluster.nodes)
    ping(annotate_usage)
    assert all(usage_of(cluster, n)[0] is not None for n in cluster.nodes)


def test_a_node_falling_below_a_boundary_keeps_its_bucket_within_the_hysteresis(
    cluster: Cluster, annotate_usage: flask.testing.FlaskClient
) -> None:
    node = cluster.nodes[1]
    cluster.set_node_usage(node, cpu=0.62)
    wait_for("the node to read over 60 % of allocatable", reads(cluster, node, 59.5, 63))
    ping(annotate_usage)
    assert usage_of(cluster, node)[1] == "high"

    # 57 % of allocatable: under the 60 % boundary, within its 5 points of hysteresis.
    cluster.set_node_usage(node, cpu=0.555)
    wait_for("the node to read 57 %", reads(cluster, node, 54.5, 56.5))
    ping(annotate_usage)
    record, bucket = usage_of(cluster, node)
    assert record is not None and 55 < record.cpu.now < 60
    assert bucket == "high"

    cluster.set_node_usage(node, cpu=0.4)
    wait_for("the node to read 41 %", reads(cluster, node, 38, 42))
    ping(annotate_usage)
    assert usage_of(cluster, node)[1] == "medium"


def test_pods_bound_since_the_sample_count_as_estimated_usage(
    cluster: Cluster, annotate_usage: flask.testing.FlaskClient, api: Kube, namespace: str
) -> None:
    node = cluster.nodes[2]
    ping(annotate_usage)
    before, _ = usage_of(cluster, node)
    assert before is not None and before.estimate.pods == 0

    bind(api, namespace, "just-bound", node)
    ping(annotate_usage)

    after, _ = usage_of(cluster, node)
    assert after is not None
    assert after.estimate.pods == 1
    # 1950m of 7800m allocatable.
    assert after.estimate.cpu == pytest.approx(25.0, abs=0.1)
    assert after.estimated_cpu == pytest.approx(after.cpu.now + 25.0, abs=0.1)


def test_maintenance_makes_a_node_overloaded(
    cluster: Cluster, annotate_usage: flask.testing.FlaskClient
) -> None:
    node = cluster.nodes[3]
    cluster.rest.patch(
        f"/api/v1/nodes/{node}", {"metadata": {"labels": {MAINTENANCE_LABEL: "true"}}}
    )
    ping(annotate_usage)
    assert usage_of(cluster, node)[1] == "overloaded"


def test_with_prometheus_down_buckets_go_once_the_records_are_stale(
    cluster: Cluster, annotate_usage: flask.testing.FlaskClient
) -> None:
    ping(annotate_usage)
    labelled = {n for n in cluster.nodes if usage_of(cluster, n)[1]}
    assert labelled == set(cluster.nodes)
    stamps = {n: usage_of(cluster, n)[0] for n in cluster.nodes}

    cluster.stop_prometheus()
    try:
        ping(annotate_usage)
        status = annotate_usage.get("/status").get_json()
        assert status["source_up"] is False and "Prometheus" in status["last_error"]
        # Fresh records hold: nothing rewritten, buckets kept.
        assert {n: usage_of(cluster, n)[0] for n in cluster.nodes} == stamps
        assert all(usage_of(cluster, n)[1] for n in cluster.nodes)

        let_time_pass(STALE_AFTER + 0.5, "the records are older than usage-stale-after")
        ping(annotate_usage)
        assert [usage_of(cluster, n)[1] for n in cluster.nodes] == [None] * len(cluster.nodes)
        # The records stay, with their time, for people to read.
        assert {n: usage_of(cluster, n)[0] for n in cluster.nodes} == stamps
    finally:
        cluster.start_prometheus()


def over_limit_counted(client: flask.testing.FlaskClient) -> float:
    text = client.get("/metrics").get_data(as_text=True)
    for family in text_string_to_metric_families(text):
        if family.name == "knr_usage_bindings_over_limit":
            return sum(
                s.value
                for s in family.samples
                if s.name.endswith("_total") and s.labels.get("resource") == "cpu"
            )
    return 0.0


def test_a_pod_bound_to_a_node_it_pushes_over_the_predicted_limit_is_warned_once(
    cluster: Cluster, annotate_usage: flask.testing.FlaskClient, api: Kube, namespace: str
) -> None:
    hot, cool, *_ = cluster.nodes
    cluster.set_node_usage(hot, cpu=0.85, memory=0.3)
    cluster.set_node_usage(cool, cpu=0.1, memory=0.1)
    wait_for("Prometheus to read the hot node", reads(cluster, hot, 83, 87))
    wait_for("Prometheus to read the cool node", reads(cluster, cool, 8, 12))
    ping(annotate_usage)
    before = over_limit_counted(annotate_usage)

    # Bound by a nodeSelector, past any extender: 87 % measured plus 25 % requested.
    for name, node in (("onto-hot", hot), ("onto-cool", cool)):
        bind(api, namespace, name, node)
    ping(annotate_usage)
    ping(annotate_usage)

    def warnings() -> list[dict[str, object]]:
        return [
            e
            for e in api.list_all("Event", namespace)
            if e.get("reason") == "PredictedUsageOverLimit"
        ]

    (said,) = wait_for("the warning on the pod bound to the hot node", warnings)
    assert said["type"] == "Warning"
    assert said["involvedObject"]["name"] == "onto-hot"  # type: ignore[index]
    assert said.get("count") == 1, "said again at the second evaluation"
    message = str(said["message"])
    assert f"bound to node {hot}" in message and "over the limit of 95%" in message
    assert over_limit_counted(annotate_usage) == before + 1
