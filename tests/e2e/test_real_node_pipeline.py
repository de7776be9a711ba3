"""The whole pipeline against real kubelets: a workload failing on a broken real node moves.

The same loop as tests/e2e/test_pipeline.py (Knative's ApiServerSource adapter and Broker,
every function as its own process, the webhook called by the API server), on a cluster whose
nodes are real: a kubelet and a containerd each (dev/localcluster/realnode.py). The failures
are real ones (a registry mirror refusing connections on one node), written by a real kubelet
with its real back-off, and the pods end with a real grace period. Each test measures the time
from the workload's creation to all its pods Ready on the healthy node.

Needs root and Debian's containerd, runc and CNI plugins (hack/install-packages.sh).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from dev.localcluster import realnode
from dev.localcluster.cluster import Cluster
from dev.localcluster.nodeimages import BUSYBOX_IMAGE
from dev.stack.stack import Stack
from shared.api.keys import (
    EVENT_NODE_SUSPECTED,
    EVENT_POD_RESCHEDULED,
    POLICY_ANNOTATION,
    SUSPECT_LABEL,
)
from shared.platform.kube import Kube
from tests import builders
from tests.e2e.conftest import (
    holds,
    let_time_pass,
    needs_real_nodes,
    preferring,
    state_of,
    wait_for,
)
from tests.e2e.test_rescheduling import only, pods, ready

pytestmark = [pytest.mark.e2e, needs_real_nodes, pytest.mark.real_nodes]

BROKEN, HEALTHY = "real-0", "real-1"
# The real back-off: pulls retried after 10 s, 20 s, 40 s ...; a move, a real grace period.
SETTLE = 180.0
# A server that stops on SIGTERM at once and needs a file of its node (the app-crash fault).
SERVER = list(realnode.NODE_DEPENDENT_APP)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """This module's own cluster: two real nodes and no kwok one."""
    c = Cluster(
        tmp_path_factory.mktemp("real-pipeline"),
        nodes=0,
        real_nodes=2,
        prometheus=False,
        keep_workdir=True,
        quiet=True,
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Kube:
    return Kube(cluster.api_client())


# The functions' defaults, made for a real kubelet's clock (the kwok stack compresses
# waiting_failure_after to follow its fake kubelet), except two: pending_stuck_after is 45 s
# instead of 10 minutes, so that a pod stuck for another reason than its node would be moved
# within a test's time, and a test that it is not means something; suspect_max_share is 0.5
# instead of 0.3, which on two nodes lets none be suspect.
REAL_SETTINGS = {
    **realnode.REAL_KUBELET_FUNCTION_SETTINGS,
    "KN_RESCHEDULER_PENDING_STUCK_AFTER": "45s",
    "KN_RESCHEDULER_SUSPECT_MAX_SHARE": "0.5",
}


@pytest.fixture(scope="module")
def stack(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        cluster.kubeconfig,
        cluster.api_client(),
        tmp_path_factory.mktemp("real-stack"),
        cluster.log_dir,
        settings=REAL_SETTINGS,
        sweep_every=None,
    ) as running:
        yield running


@pytest.fixture
def mirror_refused_on_broken(cluster: Cluster) -> Iterator[None]:
    cluster.set_fault(BROKEN, "mirror-refused")
    yield
    cluster.set_fault(BROKEN, None)


@pytest.fixture
def app_crashes_on_broken(cluster: Cluster) -> Iterator[None]:
    cluster.set_fault(BROKEN, "app-crash")
    yield
    cluster.set_fault(BROKEN, None)


def real_template(labels: dict[str, str]) -> dict[str, Any]:
    """Pods that prefer the broken node, pull their image each time, and end in a real grace
    period."""
    container = {
        "name": "app",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Always",
        "command": SERVER,
    }
    return builders.template(
        labels, affinity=preferring(BROKEN), containers=[container], grace_period=5
    )


def workload(kind: str, name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    template = real_template(labels)
    body: dict[str, Any] = {
        "apiVersion": "batch/v1" if kind == "Job" else "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "annotations": {POLICY_ANNOTATION: "3"}},
        "spec": {"template": template, **spec},
    }
    if kind != "Job":
        body["spec"]["selector"] = {"matchLabels": labels}
    return body


def settled_on_healthy(api: Kube, namespace: str, expected: int) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        live = [p for p in pods(api, namespace) if not p["metadata"].get("deletionTimestamp")]
        if len(live) == expected and all(
            ready(p) and p["spec"].get("nodeName") == HEALTHY for p in live
        ):
            return live
        return None

    result: list[dict[str, Any]] = wait_for(
        f"{expected} pod(s) Ready on {HEALTHY}", check, timeout=SETTLE, every=0.5
    )
    return result


def moves_of(stack: Stack, namespace: str) -> list[dict[str, Any]]:
    return [
        e
        for e in stack.archived()
        if e["type"] == EVENT_POD_RESCHEDULED
        and (e.get("data") or {}).get("namespace") == namespace
    ]


def real_container(pod: dict[str, Any]) -> bool:
    statuses = pod["status"].get("containerStatuses") or []
    return bool(statuses) and statuses[0].get("containerID", "").startswith("containerd://")


@pytest.mark.usefixtures("mirror_refused_on_broken")
def test_a_deployment_whose_image_cannot_be_pulled_on_its_node_moves_to_a_real_healthy_one(
    cluster: Cluster, namespace: str, api: Kube, stack: Stack
) -> None:
    t0 = time.monotonic()
    api.create("Deployment", namespace, workload("Deployment", "web", {"app": "web"}, replicas=1))
    (settled,) = settled_on_healthy(api, namespace, 1)
    took = time.monotonic() - t0
    assert real_container(settled)
    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]
    state = state_of(api, "ReplicaSet", namespace, rs)
    assert state.excluded_nodes == (BROKEN,)
    moves = moves_of(stack, namespace)
    assert state.moves == len(moves) == 1
    assert moves[0]["data"]["node"] == BROKEN
    print(f"deployment: Ready on {HEALTHY} {took:.1f}s after creation")


@pytest.mark.real_nodes_full
@pytest.mark.usefixtures("mirror_refused_on_broken")
def test_a_statefulset_pod_moves_and_keeps_its_name(
    cluster: Cluster, namespace: str, api: Kube, stack: Stack
) -> None:
    t0 = time.monotonic()
    api.create(
        "StatefulSet",
        namespace,
        workload("StatefulSet", "db", {"app": "db"}, replicas=1, serviceName="db"),
    )
    (settled,) = settled_on_healthy(api, namespace, 1)
    took = time.monotonic() - t0
    assert settled["metadata"]["name"] == "db-0"
    assert real_container(settled)
    state = state_of(api, "StatefulSet", namespace, "db")
    assert state.entry("db-0").excluded_nodes == (BROKEN,)
    assert state.entry("db-0").moves == len(moves_of(stack, namespace)) == 1
    print(f"statefulset: Ready on {HEALTHY} {took:.1f}s after creation")


@pytest.mark.real_nodes_full
@pytest.mark.usefixtures("mirror_refused_on_broken")
def test_a_job_pod_moves_and_the_job_completes(
    cluster: Cluster, namespace: str, api: Kube, stack: Stack
) -> None:
    body = workload("Job", "report", {"app": "report"}, backoffLimit=6)
    body["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    body["spec"]["template"]["spec"]["containers"][0]["command"] = ["sh", "-c", "sleep 2"]
    t0 = time.monotonic()
    api.create("Job", namespace, body)

    def complete() -> dict[str, Any] | None:
        job = api.get("Job", namespace, "report")
        return job if (job.get("status") or {}).get("succeeded") == 1 else None

    wait_for("the Job to complete", complete, timeout=SETTLE, every=0.5)
    took = time.monotonic() - t0
    done = [p for p in pods(api, namespace) if p["status"].get("phase") == "Succeeded"]
    assert [p["spec"]["nodeName"] for p in done] == [HEALTHY]
    assert moves_of(stack, namespace) and all(
        m["data"]["node"] == BROKEN for m in moves_of(stack, namespace)
    )
    print(f"job: complete on {HEALTHY} {took:.1f}s after creation")


# Full suite only: test_knative_installed.py moves the same crash loop in the short one, by
# the installed system.
@pytest.mark.real_nodes_full
@pytest.mark.usefixtures("app_crashes_on_broken")
def test_a_crash_loop_on_one_node_moves_after_the_kubelets_real_back_off(
    cluster: Cluster, namespace: str, api: Kube, stack: Stack
) -> None:
    t0 = time.monotonic()
    api.create(
        "Deployment", namespace, workload("Deployment", "needy", {"app": "needy"}, replicas=1)
    )
    (settled,) = settled_on_healthy(api, namespace, 1)
    took = time.monotonic() - t0
    assert real_container(settled)
    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]
    state = state_of(api, "ReplicaSet", namespace, rs)
    assert state.excluded_nodes == (BROKEN,)
    (move,) = moves_of(stack, namespace)
    assert move["data"]["node"] == BROKEN
    assert move["data"]["reason"] == "CrashLoopBackOff"
    assert move["data"]["kind"] == "node-fixable"
    # Not before three failures in a row, at the pace of the kubelet's back-off (10 s, 20 s,
    # ...): the moved pod's Events (which outlive it) count its container's starts.
    starts = sum(
        e.get("count", 1)
        for e in cluster.rest.get(
            f"/api/v1/namespaces/{namespace}/events",
            params={"fieldSelector": f"involvedObject.name={move['data']['name']}"},
        )["items"]
        if e["reason"] == "Started"
    )
    assert starts >= 3
    print(f"crash loop: Ready on {HEALTHY} {took:.1f}s after creation")


@pytest.fixture
def cni_broken_on_broken(cluster: Cluster) -> Iterator[None]:
    cluster.set_fault(BROKEN, "cni-broken")
    yield
    cluster.set_fault(BROKEN, None)


def sweeping_until(stack: Stack, what: str, check: Any, timeout: float = SETTLE) -> Any:
    """Runs the sweep (as its PingSource would, but every 3 s) until ``check`` answers."""

    def swept() -> Any:
        assert stack.sweep_now() in (200, 202)
        return check()

    return wait_for(what, swept, timeout=timeout, every=3.0)


@pytest.mark.usefixtures("cni_broken_on_broken")
def test_a_node_that_cannot_create_sandboxes_is_left_after_the_sweep_reads_its_events(
    cluster: Cluster, namespace: str, api: Kube, stack: Stack
) -> None:
    t0 = time.monotonic()
    api.create(
        "Deployment", namespace, workload("Deployment", "netless", {"app": "netless"}, replicas=1)
    )

    def settled() -> list[dict[str, Any]] | None:
        live = [p for p in pods(api, namespace) if not p["metadata"].get("deletionTimestamp")]
        good = len(live) == 1 and ready(live[0]) and live[0]["spec"]["nodeName"] == HEALTHY
        return live if good else None

    (pod,) = sweeping_until(stack, f"the pod Ready on {HEALTHY}", settled)
    took = time.monotonic() - t0
    assert real_container(pod)
    (move,) = moves_of(stack, namespace)
    assert (move["data"]["node"], move["data"]["reason"]) == (BROKEN, "FailedCreatePodSandBox")
    print(f"sandbox failure: Ready on {HEALTHY} {took:.1f}s after creation")


def test_a_pod_whose_configmap_does_not_exist_is_never_moved_by_the_sweep(
    cluster: Cluster, namespace: str, api: Kube, stack: Stack
) -> None:
    body = workload("Deployment", "unconfigured", {"app": "unconfigured"}, replicas=1)
    spec = body["spec"]["template"]["spec"]
    spec["volumes"] = [{"name": "config", "configMap": {"name": "not-created"}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "config", "mountPath": "/config"}]
    api.create("Deployment", namespace, body)

    def mount_failed() -> bool:
        found = pods(api, namespace)
        if not found:
            return False
        pod = found[0]
        items = cluster.rest.get(
            f"/api/v1/namespaces/{namespace}/events",
            params={"fieldSelector": f"involvedObject.uid={pod['metadata']['uid']}"},
        )["items"]
        started = pod["status"].get("startTime")
        return any(e["reason"] == "FailedMount" for e in items) and bool(started)

    wait_for("a FailedMount Event", mount_failed, timeout=60, every=1.0)
    # Past pending_stuck_after (45 s here): the status alone would have been moved.
    let_time_pass(50, "past pending-stuck-after (45 s here)")
    assert stack.sweep_now() in (200, 202)
    # Every event the sweep sent has been through the pipeline: nothing moved.
    assert stack.wait_idle(30)
    assert moves_of(stack, namespace) == []
    (pod,) = pods(api, namespace)
    assert (
        pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
    )


@pytest.mark.real_nodes_full
@pytest.mark.usefixtures("app_crashes_on_broken")
def test_two_workloads_crashing_on_a_real_node_make_it_suspect(
    cluster: Cluster, namespace: str, api: Kube, stack: Stack
) -> None:
    for name in ("web", "api"):
        api.create("Deployment", namespace, workload("Deployment", name, {"app": name}, replicas=1))

    def suspect() -> dict[str, Any] | None:
        node = api.get("Node", None, BROKEN)
        return node if (node["metadata"].get("labels") or {}).get(SUSPECT_LABEL) == "true" else None

    node = wait_for(f"{BROKEN} suspect", suspect, timeout=SETTLE, every=1.0)
    assert {"key": SUSPECT_LABEL, "value": "true", "effect": "PreferNoSchedule"} in [
        {k: t.get(k) for k in ("key", "value", "effect")} for t in node["spec"].get("taints") or []
    ]
    # assess-nodes labels the node before its reply leaves for the Broker: wait for the reply.
    suspected = wait_for(
        "the reply io.kn-rescheduler.node.suspected",
        lambda: [e["data"]["node"] for e in stack.archived() if e["type"] == EVENT_NODE_SUSPECTED],
        timeout=10,
    )
    assert suspected == [BROKEN]
    assert HEALTHY not in suspected
    settled_on_healthy(api, namespace, 2)


@pytest.mark.real_nodes_full
@pytest.mark.usefixtures("app_crashes_on_broken")
def test_a_moved_pod_held_by_a_finalizer_is_replaced_at_once_and_moved_once(
    cluster: Cluster, namespace: str, api: Kube, stack: Stack
) -> None:
    body = workload("Deployment", "held", {"app": "held"}, replicas=1)
    body["spec"]["template"]["metadata"]["finalizers"] = ["example.com/hold"]
    api.create("Deployment", namespace, body)

    def replaced() -> tuple[dict[str, Any], dict[str, Any]] | None:
        found = pods(api, namespace)
        old = [p for p in found if p["metadata"].get("deletionTimestamp")]
        new = [p for p in found if not p["metadata"].get("deletionTimestamp")]
        if len(old) == 1 and len(new) == 1 and ready(new[0]):
            return old[0], new[0]
        return None

    old, new = wait_for("a Ready replacement beside the held pod", replaced, SETTLE, every=0.5)
    assert (old["spec"]["nodeName"], new["spec"]["nodeName"]) == (BROKEN, HEALTHY)
    # The kubelet stops the held pod's containers within its grace period and keeps writing
    # its status while the finalizer holds the object: it is not moved again.
    holds("one move, no more", lambda: len(moves_of(stack, namespace)) == 1, 15, every=1.0)
    (move,) = moves_of(stack, namespace)
    assert move["data"]["name"] == old["metadata"]["name"]
    still = api.get("Pod", namespace, old["metadata"]["name"])
    assert still["metadata"]["deletionTimestamp"]
    statuses = still["status"].get("containerStatuses") or [{}]
    assert "running" not in statuses[0].get("state", {})
    api.merge_patch("Pod", namespace, old["metadata"]["name"], {"metadata": {"finalizers": None}})
    wait_for(
        "the held pod gone once released",
        lambda: len(pods(api, namespace)) == 1,
        timeout=30,
        every=0.5,
    )


@pytest.fixture
def mirror_hangs_on_broken(cluster: Cluster) -> Iterator[None]:
    cluster.set_fault(BROKEN, "mirror-hangs")
    yield
    # Healing closes the mirror's connections: the hung pull fails and the kubelet can end
    # the pod it held.
    cluster.set_fault(BROKEN, None)


@pytest.mark.usefixtures("mirror_hangs_on_broken")
def test_a_pull_that_never_ends_is_moved_once_a_sibling_pulled_the_image_elsewhere(
    cluster: Cluster, namespace: str, api: Kube, stack: Stack
) -> None:
    # Two replicas, spread one per node: one pulls from the hanging mirror forever, the other
    # pulls the same image on the healthy node in milliseconds. The evidence is the healthy
    # kubelet's Pulled Event for a pull asked for after the hung pod's sandbox came up; the
    # healthy node has the image from earlier tests, so the pods pull it whatever is cached
    # (imagePullPolicy Always, as for a moving tag), and the healthy replica is replaced once
    # the hung one waits, for its pull to come after.
    body = workload("Deployment", "hung", {"app": "hung"}, replicas=2)
    spec = body["spec"]["template"]["spec"]
    spec.pop("affinity", None)
    for container in spec["containers"]:
        container["imagePullPolicy"] = "Always"
    spec["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "hung"}},
        }
    ]
    t0 = time.monotonic()
    api.create("Deployment", namespace, body)

    def waiting_and_running() -> tuple[dict[str, Any], dict[str, Any]] | None:
        live = {p["spec"].get("nodeName"): p for p in pods(api, namespace)}
        hung, healthy = live.get(BROKEN), live.get(HEALTHY)
        if hung is None or healthy is None or not ready(healthy):
            return None
        up = [
            c
            for c in hung["status"].get("conditions") or []
            if c["type"] == "PodReadyToStartContainers" and c["status"] == "True"
        ]
        return (hung, healthy) if up else None

    _, first = wait_for(
        f"a replica pulling on {BROKEN} and one Ready on {HEALTHY}",
        waiting_and_running,
        timeout=SETTLE,
        every=0.5,
    )
    # Kubernetes writes times to the second: the replacement's pull starts a second later.
    let_time_pass(1.1, "timestamps have whole seconds")
    api.delete("Pod", namespace, first["metadata"]["name"], uid=first["metadata"]["uid"])

    def both_on_healthy() -> list[dict[str, Any]] | None:
        live = [p for p in pods(api, namespace) if not p["metadata"].get("deletionTimestamp")]
        good = len(live) == 2 and all(ready(p) and p["spec"]["nodeName"] == HEALTHY for p in live)
        return live if good else None

    # The spread keeps the replacement off the healthy node until the hung pod is gone from
    # the count: a pod being deleted no longer counts (the scheduler skips it).
    sweeping_until(stack, f"both replicas Ready on {HEALTHY}", both_on_healthy)
    took = time.monotonic() - t0
    (move,) = moves_of(stack, namespace)
    assert (move["data"]["node"], move["data"]["reason"]) == (BROKEN, "StuckPending")
    print(f"hung pull: both Ready on {HEALTHY} {took:.1f}s after creation")
