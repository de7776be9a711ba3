"""The local stack's load-aware half, as ``make up`` starts it, end to end.

stack.up starts a second real kube-scheduler with the shipped configuration
(knative/components/load-aware-scheduler), its extender pointed at the stack's score-nodes;
the stack's annotate-usage reads the cluster's real Prometheus on a timer and writes usage onto
the Nodes. Nothing here writes a usage annotation by hand: a node's simulated usage goes
node-exporter -> Prometheus -> annotate-usage -> Node -> kube-scheduler -> score-nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from dev.stack.functions import free_port
from dev.stack.stack import Stack
from dev.stack.up import load_aware_scheduler_config
from shared.api.keys import LOAD_AWARE_SCHEDULER_NAME, LOAD_LABEL
from shared.platform.kube import Kube
from tests.e2e.conftest import wait_for
from tests.e2e.test_label_nodes import reads

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def load_aware_scheduler(cluster: Any) -> int:
    """The second scheduler, started once for the module (it stops with the cluster); the port
    score-nodes must listen on."""
    port = free_port()
    cluster.start_scheduler(
        LOAD_AWARE_SCHEDULER_NAME, load_aware_scheduler_config(f"http://127.0.0.1:{port}")
    )
    return port


@pytest.fixture
def stack(cluster: Any, tmp_path: Any, load_aware_scheduler: int) -> Iterator[Stack]:
    with Stack(
        cluster.kubeconfig,
        cluster.api_client(),
        tmp_path / "stack",
        cluster.log_dir,
        prometheus_url=cluster.prometheus_url,
        usage_every=1.0,
        label_every=None,
        assess_every=None,
        sweep_every=None,
        score_nodes_port=load_aware_scheduler,
    ) as running:
        yield running


def refused(stack: Stack, *names: str) -> dict[str, str]:
    """The nodes score-nodes' filter fails for a pod of the load-aware scheduler, with why."""
    pod = {
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {
            "schedulerName": LOAD_AWARE_SCHEDULER_NAME,
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "100m"}}}],
        },
    }
    answer = requests.post(
        stack.servers["score-nodes"].url + "/filter",
        json={"Pod": pod, "NodeNames": list(names)},
        timeout=5,
    ).json()
    return dict(answer.get("FailedAndUnresolvableNodes") or {})


def extender_calls(stack: Stack) -> float:
    text = requests.get(stack.servers["score-nodes"].url + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("knr_extender_requests_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_pods_for_the_load_aware_scheduler_stay_off_a_node_prometheus_reads_overloaded(
    cluster: Any, api: Kube, namespace: str, stack: Stack
) -> None:
    hot, *cool = cluster.nodes
    cluster.set_node_usage(hot, cpu=0.95)
    wait_for("Prometheus to read the node busy", reads(cluster, hot, 90, 101))
    wait_for(
        "annotate-usage to label the node overloaded",
        lambda: (
            (api.get("Node", None, hot)["metadata"].get("labels") or {}).get(LOAD_LABEL)
            == "overloaded"
        ),
        timeout=30,
    )
    # score-nodes decides from its own watch of the Nodes, which follows the API a moment
    # later: ask it, as the scheduler will, until it fails the hot node.
    wait_for("score-nodes to fail the hot node", lambda: hot in refused(stack, hot), timeout=30)
    before = extender_calls(stack)

    names = [f"web-{i}" for i in range(6)]
    for name in names:
        api.create(
            "Pod",
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "schedulerName": LOAD_AWARE_SCHEDULER_NAME,
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.example/app:1",
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                        }
                    ],
                },
            },
        )
    placed = wait_for(
        "the load-aware scheduler to bind every pod",
        lambda: (
            nodes
            if all(nodes := [api.get("Pod", namespace, n)["spec"].get("nodeName") for n in names])
            else None
        ),
        timeout=60,
    )
    assert hot not in placed
    assert set(placed) <= set(cool)
    # The scheduler asked the function (filter and prioritize) for these pods.
    assert extender_calls(stack) >= before + len(names)
