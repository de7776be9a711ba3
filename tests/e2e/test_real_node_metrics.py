"""The Metrics API from real kubelets, and annotate-usage reading it.

A real metrics-server scrapes real kubelets as it does on any cluster: HTTPS to each Node's
InternalIP and kubelet port, the kubelet's serving certificate checked against the cluster CA,
its ServiceAccount token checked by the kubelet's authentication and authorization webhooks
(dev/localcluster/metricsserver.py). Nothing is simulated: the usage is cAdvisor's. Both real
nodes share this machine, and a kubelet reports its node from the root cgroup, so each
reports the machine's usage.

Needs root and Debian's containerd, runc and CNI plugins (hack/install-packages.sh).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.utils import parse_quantity

from dev.localcluster import Cluster
from dev.localcluster import metricsserver as ms
from shared.api.keys import LOAD_BUCKETS, LOAD_LABEL, PING_EVENT_TYPE, USAGE_ANNOTATION
from shared.api.usage import UsageRecord
from tests.e2e.conftest import needs_real_nodes
from tests.handlers.conftest import ON_DEMAND_TICKS, cloudevent

pytestmark = [pytest.mark.e2e, needs_real_nodes, pytest.mark.real_nodes]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("real-metrics")
    with Cluster(
        workdir, nodes=0, real_nodes=2, prometheus=False, metrics_server=True, quiet=True
    ) as c:
        yield c


def node_metrics(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {i["metadata"]["name"]: i for i in cluster.rest.get(ms.NODES_PATH)["items"]}


def allocatable(cluster: Cluster, node: str) -> dict[str, float]:
    alloc = cluster.rest.get(f"/api/v1/nodes/{node}")["status"]["allocatable"]
    return {k: float(parse_quantity(alloc[k])) for k in ("cpu", "memory")}


def test_the_metrics_api_lists_each_real_node_with_the_kubelets_own_usage(
    cluster: Cluster,
) -> None:
    items = node_metrics(cluster)
    assert sorted(items) == cluster.real_nodes
    for node, item in items.items():
        cpu = float(parse_quantity(item["usage"]["cpu"]))
        memory = float(parse_quantity(item["usage"]["memory"]))
        # The machine runs a control plane, two kubelets and containerds: never idle.
        assert 0 < cpu <= allocatable(cluster, node)["cpu"]
        assert 100 * 2**20 < memory <= allocatable(cluster, node)["memory"] * 1.1
    top = subprocess.run(
        [
            *(str(Path(cluster.bins_dir) / "kubectl"), f"--kubeconfig={cluster.kubeconfig}"),
            *("top", "nodes", "--no-headers"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert sorted(line.split()[0] for line in top.splitlines()) == cluster.real_nodes


def test_annotate_usage_reads_the_real_kubelets_through_the_metrics_api(
    cluster: Cluster, function_client: Any
) -> None:
    client = function_client(
        "annotate-usage",
        KUBECONFIG=str(cluster.kubeconfig),
        **ON_DEMAND_TICKS,
        KN_RESCHEDULER_USAGE_SOURCE="metrics-api",
    )
    headers, body = cloudevent(PING_EVENT_TYPE, {"message": "measure"}, source="/pingsource")
    before = node_metrics(cluster)
    assert client.post("/", headers=headers, data=body).status_code == 202
    after = node_metrics(cluster)
    try:
        for node in cluster.real_nodes:
            meta = cluster.rest.get(f"/api/v1/nodes/{node}")["metadata"]
            record = UsageRecord.from_json(meta["annotations"][USAGE_ANNOTATION])
            assert record.source == "metrics-api"
            alloc = allocatable(cluster, node)
            # What the Metrics API said just before and just after, as percent of allocatable:
            # the record is one of the windows in between (metrics-server scrapes every 10 s).
            shares = [
                100 * float(parse_quantity(m[node]["usage"]["memory"])) / alloc["memory"]
                for m in (before, after)
            ]
            assert record.memory.now is not None
            assert min(shares) - 2 <= record.memory.now <= max(shares) + 2
            assert record.cpu.now is not None and 0 < record.cpu.now <= 100
            assert (meta.get("labels") or {}).get(LOAD_LABEL) in LOAD_BUCKETS
    finally:
        for node in cluster.real_nodes:
            cluster.rest.patch(
                f"/api/v1/nodes/{node}",
                {
                    "metadata": {
                        "labels": {LOAD_LABEL: None},
                        "annotations": {USAGE_ANNOTATION: None},
                    }
                },
            )
