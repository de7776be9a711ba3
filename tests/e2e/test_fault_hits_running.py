"""A node whose runtime breaks under its pods: the running containers exit and crash-loop there.

The scale benchmark turns 2 % of its nodes faulty at once. A real node's failure hits the
containers already running, so its pods fail where they are and the node keeps them until
they are moved: nothing empties it first. The fake kubelet does the same when a node's fault
is set with ``running=True``. On the real local control plane, every update of the pod watched.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from dev.localcluster import Cluster
from tests.e2e.test_kubelet_termination import (
    PodWatch,
    conditions,
    container,
    one_ready_pod,
    wait_for,
    watch,  # noqa: F401 (a fixture)
)

pytestmark = pytest.mark.e2e


def test_a_running_pod_crash_loops_in_place_when_its_nodes_runtime_breaks(
    cluster: Cluster,
    kube: k8s.ApiClient,
    namespace: str,
    watch: PodWatch,  # noqa: F811
) -> None:
    pod = one_ready_pod(cluster, kube, namespace)
    uid, node = pod["metadata"]["uid"], pod["spec"]["nodeName"]
    started = container(pod)["state"]["running"]["startedAt"]
    try:
        cluster.set_fault(node, "crashloop", running=True)
        crashed = wait_for(
            "its container to exit",
            lambda: watch.first(uid, lambda p: "terminated" in container(p).get("state", {})),
        )
        looping = wait_for(
            "its first restart, crashed again",
            lambda: watch.first(uid, lambda p: container(p).get("restartCount", 0) >= 1),
        )
    finally:
        cluster.set_fault(node, None)
    # The same pod on the same node: nothing deleted it or emptied the node.
    assert not watch.gone(uid)
    assert crashed.pod["spec"]["nodeName"] == node
    exited = container(crashed.pod)
    terminated = exited["state"]["terminated"]
    # The run that was going when the runtime broke ended in an error; the kubelet keeps
    # restartCount until it restarts the container.
    assert (terminated["reason"], terminated["exitCode"]) == ("Error", 1)
    assert terminated["startedAt"] == started
    assert exited["restartCount"] == 0 and exited["ready"] is False
    assert conditions(crashed.pod)["Ready"]["status"] == "False"
    assert container(looping.pod)["state"]["waiting"]["reason"] == "CrashLoopBackOff"


def test_a_fault_that_hits_running_pods_is_only_a_crashing_one(cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="hits running pods"):
        cluster.set_fault(cluster.nodes[0], "imagepull", running=True)
