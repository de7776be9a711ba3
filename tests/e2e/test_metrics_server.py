"""The local cluster's Metrics API is served by a real metrics-server scraping kwok.

A function that reads node usage from ``metrics.k8s.io`` (``kubectl top``'s API) is tested
against this cluster, so these tests pin down what it relies on, independently of any reader:
the API lists every node, ``kubectl top nodes`` shows each node's simulated usage as a share
of its allocatable, and a usage set with ``Cluster.set_node_usage`` shows up within a scrape
or two, with no spike above the node's allocatable and no node dropping out of the list while
it changes (metrics-server computes CPU as the rate of a counter kwok integrates).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.localcluster import Cluster
from dev.localcluster import metricsserver as ms
from dev.localcluster.keys import (
    SIM_CPU_USAGE_ANNOTATION,
    SIM_MEMORY_USAGE_ANNOTATION,
)
from shared.api.keys import (
    LOAD_LABEL,
    PING_EVENT_TYPE,
    USAGE_ANNOTATION,
)
from shared.api.usage import UsageRecord
from tests.e2e.conftest import wait_for
from tests.handlers.conftest import ON_DEMAND_TICKS, cloudevent

pytestmark = pytest.mark.e2e

# A usage set on a Node counts from metrics-server's next scrape (every 10 s), and the API
# answers with the last window: two resolutions and some slack bound the wait.
FOLLOW_TIMEOUT = 2 * ms.RESOLUTION_SECONDS + 8


@pytest.fixture(scope="module")
def metrics_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two nodes, metrics-server, no Prometheus (not needed here)."""
    workdir = tmp_path_factory.mktemp("metrics-cluster")
    with Cluster(workdir, nodes=2, prometheus=False, metrics_server=True, quiet=True) as cluster:
        yield cluster


@pytest.fixture
def usage_reset(metrics_cluster: Cluster) -> Iterator[None]:
    """Takes every simulated usage off the nodes afterwards."""
    yield
    unset = {SIM_CPU_USAGE_ANNOTATION: None, SIM_MEMORY_USAGE_ANNOTATION: None}
    for node in metrics_cluster.nodes:
        metrics_cluster.rest.patch(f"/api/v1/nodes/{node}", {"metadata": {"annotations": unset}})


def node_metrics(cluster: Cluster) -> dict[str, dict[str, Any]]:
    items = cluster.rest.get(ms.NODES_PATH)["items"]
    return {i["metadata"]["name"]: i for i in items}


def expected(cluster: Cluster, node: str) -> ms.NodeUsage:
    return ms.expected_usage(cluster.rest.get(f"/api/v1/nodes/{node}"))


def kubectl(cluster: Cluster, *args: str) -> str:
    out = subprocess.run(
        [str(Path(cluster.bins_dir) / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout


def test_the_metrics_api_lists_every_node_with_its_usage_over_a_window(
    metrics_cluster: Cluster,
) -> None:
    cluster = metrics_cluster
    body = cluster.rest.get(ms.NODES_PATH)
    one = cluster.rest.get(f"{ms.NODES_PATH}/{cluster.nodes[0]}")
    apiservice = cluster.rest.get(
        f"/apis/apiregistration.k8s.io/v1/apiservices/{ms.API_SERVICE_NAME}"
    )

    assert body["kind"] == "NodeMetricsList"
    assert body["apiVersion"] == "metrics.k8s.io/v1beta1"
    assert sorted(i["metadata"]["name"] for i in body["items"]) == sorted(cluster.nodes)
    for item in body["items"]:
        assert set(item["usage"]) == {"cpu", "memory"}
        # metrics-server's window is the time between its last two scrapes of the node.
        window = float(item["window"].rstrip("s"))
        assert ms.RESOLUTION_SECONDS - 1 <= window <= 2 * ms.RESOLUTION_SECONDS + 1
    assert one["kind"] == "NodeMetrics"
    assert one["metadata"]["name"] == cluster.nodes[0]
    conditions = {c["type"]: c["status"] for c in apiservice["status"]["conditions"]}
    assert conditions["Available"] == "True"


def test_kubectl_top_nodes_shows_the_quiet_defaults_as_shares_of_allocatable(
    metrics_cluster: Cluster,
) -> None:
    # Nobody set a usage: 10 % CPU and 20 % memory, as the node-exporter endpoints say, of the
    # allocatable 7800m CPU. kubectl truncates the shares to whole percents, and a CPU rate
    # measured over a window can come out a hair under: one percent of slack.
    lines = kubectl(metrics_cluster, "top", "nodes", "--no-headers").splitlines()

    rows = {line.split()[0]: line.split()[1:] for line in lines}
    assert sorted(rows) == sorted(metrics_cluster.nodes)
    for node, (cores, cpu_share, _memory, memory_share) in rows.items():
        assert abs(int(cpu_share.rstrip("%")) - 10) <= 1, rows
        assert abs(int(memory_share.rstrip("%")) - 20) <= 1, rows
        assert abs(int(cores.rstrip("m")) - 780) <= 10, rows
        reported = ms.reported_usage(node_metrics(metrics_cluster)[node])
        assert ms.within(reported, expected(metrics_cluster, node)), (node, reported)


@pytest.mark.parametrize(("role", "allowed"), [("view", True), (None, False)])
def test_reading_node_metrics_needs_a_role_as_on_a_cluster_with_metrics_servers_manifests(
    metrics_cluster: Cluster, role: str | None, allowed: bool
) -> None:
    # metrics-server's manifests aggregate metrics.k8s.io reads into view/edit/admin; a user
    # with no role is refused, so a reader's missing RBAC shows up here as on a real cluster.
    cluster = metrics_cluster
    user = f"metrics-reader-{role or 'none'}"
    if role is not None:
        cluster.rest.post(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": user},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                ],
            },
        )

    def can_list() -> bool:
        review = cluster.rest.post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user,
                    "resourceAttributes": {
                        "group": "metrics.k8s.io",
                        "resource": "nodes",
                        "verb": "list",
                    },
                },
            },
        )
        return bool(review["status"].get("allowed"))

    # The controller manager aggregates the rule into `view` within moments of its creation.
    wait_for(f"list nodes.metrics.k8s.io to be {allowed}", lambda: can_list() == allowed, 10)


def test_a_nodes_usage_follows_set_node_usage_without_spikes_or_gaps(
    metrics_cluster: Cluster, usage_reset: None
) -> None:
    cluster = metrics_cluster
    busy, quiet = cluster.nodes
    allocatable = {n: ms.expected_usage(_fully_used(cluster, n)) for n in cluster.nodes}

    def follow(settings: dict[str, tuple[float, float]]) -> float:
        """Sets the usages; the seconds until the API shows them all. Every answer meanwhile
        lists both nodes, none above its allocatable."""
        for node, (cpu, memory) in settings.items():
            cluster.set_node_usage(node, cpu=cpu, memory=memory)
        want = {n: expected(cluster, n) for n in settings}
        t0 = time.monotonic()
        seen: dict[str, ms.NodeUsage] = {}

        def shown() -> bool:
            metrics = node_metrics(cluster)
            assert sorted(metrics) == sorted(cluster.nodes), "a node dropped out of the API"
            seen.update({n: ms.reported_usage(metrics[n]) for n in cluster.nodes})
            for n, usage in seen.items():
                assert usage.cpu_cores <= allocatable[n].cpu_cores * 1.02, (n, usage)
                assert usage.memory_bytes <= allocatable[n].memory_bytes * 1.02, (n, usage)
            return all(ms.within(seen[n], want[n]) for n in settings)

        wait_for(
            f"the API to show {want}", shown, FOLLOW_TIMEOUT, every=0.5, seen=lambda: dict(seen)
        )
        return time.monotonic() - t0

    # Up: 90 % on one node (7.02 cores of 7.8), 10 % on the other.
    follow({busy: (0.9, 0.9), quiet: (0.1, 0.1)})
    busy_now = ms.reported_usage(node_metrics(cluster)[busy])
    assert busy_now.cpu_cores == pytest.approx(0.9 * 7.8, rel=0.02)
    assert busy_now.memory_bytes == pytest.approx(0.9 * allocatable[busy].memory_bytes, rel=0.02)

    # And down again: the counter keeps rising (more slowly), so no node drops out.
    follow({busy: (0.2, 0.3)})


def _fully_used(cluster: Cluster, node: str) -> dict[str, Any]:
    """The Node as if both usages were 100 %: its allocatable in the Metrics API's units."""
    obj = cluster.rest.get(f"/api/v1/nodes/{node}")
    obj["metadata"].setdefault("annotations", {}).update(
        {SIM_CPU_USAGE_ANNOTATION: "1.0", SIM_MEMORY_USAGE_ANNOTATION: "1.0"}
    )
    return obj


def test_a_node_registered_later_is_listed_with_its_usage_and_dropped_once_deleted(
    metrics_cluster: Cluster,
) -> None:
    # The DaemonSet gives it a load pod and the node network learns its InternalIP: nothing
    # about metrics has to be added to the Node.
    cluster = metrics_cluster
    name = "node-late-metrics"
    template = cluster.rest.get(f"/api/v1/nodes/{cluster.nodes[0]}")
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {**template["metadata"]["labels"], "kubernetes.io/hostname": name},
            "annotations": {"kwok.x-k8s.io/node": "fake", SIM_CPU_USAGE_ANNOTATION: "0.5"},
        },
        # No other pod may land here (the fake kubelet does not run it); the load pod tolerates
        # the taint, as DaemonSet pods do.
        "spec": {
            "unschedulable": True,
            "taints": [{"key": "kn-rescheduler.io/test", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "3800m", "memory": "15Gi", "pods": "110"},
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.251"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": ms.KUBELET_PORT}},
            "nodeInfo": template["status"]["nodeInfo"],
        },
    }
    cluster.rest.post("/api/v1/nodes", node)
    try:
        listed = wait_for(
            f"metrics-server to list {name}",
            lambda: node_metrics(cluster).get(name),
            timeout=3 * ms.RESOLUTION_SECONDS + 10,
            every=0.5,
        )
        reported = ms.reported_usage(listed)
        # Half of 3800m; memory at the quiet default, 20 % of 15Gi.
        assert ms.within(reported, ms.NodeUsage(1.9, 0.2 * 15 * 1024**3)), reported
    finally:
        cluster.rest.delete(f"/api/v1/nodes/{name}")

    wait_for(
        f"metrics-server to drop {name}",
        lambda: sorted(node_metrics(cluster)) == sorted(cluster.nodes),
        timeout=15,
        every=0.5,
    )


# -- annotate-usage with the Metrics API as its source ----------------------------------------


def test_annotate_usage_reads_the_metrics_api_when_told_to(
    metrics_cluster: Cluster, usage_reset: None, function_client: Any
) -> None:
    """The same function as with Prometheus, KN_RESCHEDULER_USAGE_SOURCE=metrics-api: usage
    now only (the API keeps no history), as percent of allocatable, buckets as usual."""
    cluster = metrics_cluster
    busy, quiet = cluster.nodes[:2]
    cluster.set_node_usage(busy, cpu=0.9, memory=0.5)
    cluster.set_node_usage(quiet, cpu=0.05, memory=0.1)

    def follows() -> bool:
        items = node_metrics(cluster)
        return all(
            n in items
            and abs(ms.reported_usage(items[n]).cpu_cores - expected(cluster, n).cpu_cores) < 0.1
            for n in (busy, quiet)
        )

    wait_for("the Metrics API to follow the usage", follows, FOLLOW_TIMEOUT, every=0.5)

    client = function_client(
        "annotate-usage",
        KUBECONFIG=str(cluster.kubeconfig),
        **ON_DEMAND_TICKS,
        KN_RESCHEDULER_USAGE_SOURCE="metrics-api",
    )
    headers, body = cloudevent(PING_EVENT_TYPE, {"message": "measure"}, source="/pingsource")
    assert client.post("/", headers=headers, data=body).status_code == 202

    def carried(node: str) -> tuple[UsageRecord, str | None]:
        meta = cluster.rest.get(f"/api/v1/nodes/{node}")["metadata"]
        return (
            UsageRecord.from_json(meta["annotations"][USAGE_ANNOTATION]),
            (meta.get("labels") or {}).get(LOAD_LABEL),
        )

    record, bucket = carried(busy)
    assert record.source == "metrics-api"
    # The Metrics API reports shares of allocatable: 0.9 is 90 % (7.02 of 7.8 cores).
    assert record.cpu.now == pytest.approx(90, abs=2)
    assert record.memory.now == pytest.approx(50, abs=2)
    assert (record.cpu.avg5m, record.cpu.max1h, record.memory.avg5m) == (None, None, None)
    assert bucket == "overloaded"
    quiet_record, quiet_bucket = carried(quiet)
    assert quiet_record.cpu.now == pytest.approx(5, abs=2) and quiet_bucket == "low"
    status = client.get("/status").get_json()
    assert status["source"] == "metrics-api" and status["source_up"] is True
    for node in (busy, quiet):
        cluster.rest.patch(
            f"/api/v1/nodes/{node}",
            {"metadata": {"labels": {LOAD_LABEL: None}, "annotations": {USAGE_ANNOTATION: None}}},
        )
