"""The local control plane behaves like a real cluster, and its nodes fail like real nodes.

These tests pin down what the rest of the e2e suite relies on: the real scheduler and
controllers run, the API server calls webhooks and enforces RBAC, kwok nodes stay Ready, and a
node labelled ``sim.kn-rescheduler.io/fault=<mode>`` makes its pods fail with exactly the
status a kubelet reports. Statuses are read as raw JSON, the shape the API serves.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from dev.localcluster import FAULT_ANNOTATION, Cluster
from dev.localcluster import pki as lpki
from dev.localcluster.keys import (
    SIM_FAULT_LABEL,
)
from dev.localcluster.procs import cmdline, names_path, pid_alive
from tests.e2e import conftest as e2e

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
IMAGE = "registry.example.com/shop/web:1.4.2"
KUBELET_CONDITION_ORDER = [
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
]
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
RFC3339_MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")

JSON = dict[str, Any]


# -- helpers ------------------------------------------------------------------------------------


# The harness answers within seconds: half the e2e suite's patience, polled a little faster.
wait_for = partial(e2e.wait_for, timeout=30.0, every=0.2)


def get_pod(cluster: Cluster, namespace: str, name: str) -> JSON:
    return cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def create_pod(cluster: Cluster, namespace: str, name: str, **spec: Any) -> JSON:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "app", "image": IMAGE}], **spec},
    }
    return cluster.rest.post(f"/api/v1/namespaces/{namespace}/pods", body)


def conditions(pod: JSON) -> dict[str, JSON]:
    return {c["type"]: c for c in pod.get("status", {}).get("conditions", [])}


def container(pod: JSON) -> JSON:
    statuses: list[JSON] = pod.get("status", {}).get("containerStatuses") or [{}]
    return statuses[0]


def is_ready(pod: JSON) -> bool:
    return conditions(pod).get("Ready", {}).get("status") == "True"


def waiting_reason(pod: JSON) -> str | None:
    reason: str | None = container(pod).get("state", {}).get("waiting", {}).get("reason")
    return reason


def node_of(cluster: Cluster, name: str) -> JSON:
    return cluster.rest.get(f"/api/v1/nodes/{name}")


@pytest.fixture
def fault(cluster: Cluster) -> Iterator[Callable[[str, str | None], None]]:
    """Sets node faults for one test and heals every touched node afterwards."""
    touched: set[str] = set()

    def set_fault(node: str, mode: str | None) -> None:
        cluster.set_fault(node, mode)
        touched.add(node)

    yield set_fault
    for node in touched:
        cluster.set_fault(node, None)


def assert_kubelet_conditions(pod: JSON, **expected: str) -> None:
    """The kubelet's five conditions, in its order, with the given statuses."""
    conds = pod["status"]["conditions"]
    assert [c["type"] for c in conds if c["type"] in KUBELET_CONDITION_ORDER] == (
        KUBELET_CONDITION_ORDER
    )
    by_type = conditions(pod)
    for ctype, status in expected.items():
        assert by_type[ctype]["status"] == status, (ctype, by_type[ctype])
    for c in conds:
        assert RFC3339.match(c["lastTransitionTime"]), c
        assert c.get("observedGeneration") == pod["metadata"]["generation"], c


def assert_placed_like_a_kubelet(cluster: Cluster, pod: JSON) -> None:
    """startTime, the node's InternalIP as hostIP, a pod IP from the node's podCIDR."""
    status = pod["status"]
    node = node_of(cluster, pod["spec"]["nodeName"])
    internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
    assert status["hostIP"] == internal[0]
    assert status["hostIPs"] == [{"ip": internal[0]}]
    prefix = node["spec"]["podCIDR"].rsplit(".", 1)[0] + "."
    assert status["podIP"].startswith(prefix), (status["podIP"], node["spec"]["podCIDR"])
    assert status["podIPs"] == [{"ip": status["podIP"]}]
    assert RFC3339.match(status["startTime"])


def assert_ran(cs: JSON) -> None:
    """A container the runtime created: normalised image, digest imageID, containerd ID."""
    assert cs["image"] == "registry.example.com/shop/web:1.4.2"
    assert re.match(r"^registry\.example\.com/shop/web@sha256:[0-9a-f]{64}$", cs["imageID"])
    assert re.match(r"^containerd://[0-9a-f]{64}$", cs["containerID"])


def assert_never_ran(cs: JSON) -> None:
    """A container the runtime never created: the spec's image, no IDs."""
    assert cs["image"] == IMAGE
    assert cs["imageID"] == ""
    assert "containerID" not in cs
    assert cs["restartCount"] == 0
    assert cs["ready"] is False
    assert cs["started"] is False


# -- the control plane --------------------------------------------------------------------------


def test_the_cluster_has_ready_kwok_nodes_and_elected_leaders(cluster: Cluster) -> None:
    nodes = cluster.rest.get("/api/v1/nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == sorted(cluster.nodes)
    for n in nodes:
        assert conditions(n)["Ready"]["status"] == "True"
        assert n["spec"]["podCIDR"].startswith("10.128.")
        lease = cluster.rest.get(
            f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{n['metadata']['name']}"
        )
        # kwok renews every node's Lease (under its own identity) like a kubelet would.
        assert lease["spec"]["holderIdentity"]
        assert RFC3339_MICRO.match(lease["spec"]["renewTime"])
    for leader in ("kube-scheduler", "kube-controller-manager"):
        lease = cluster.rest.get(
            f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{leader}"
        )
        assert lease["spec"]["holderIdentity"]
    assert cluster.startup_seconds is not None and cluster.startup_seconds < 30


def test_a_deployment_is_scheduled_onto_kwok_nodes_and_its_pods_become_ready(
    cluster: Cluster, kube: k8s.ApiClient, namespace: str
) -> None:
    apps = k8s.AppsV1Api(kube)
    core = k8s.CoreV1Api(kube)
    labels = {"app": "web"}
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "app", "image": IMAGE}]},
                },
            },
        },
    )

    def ready_pods() -> list[JSON]:
        pods = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return live if len(live) == 3 and all(is_ready(p) for p in live) else []

    pods = wait_for("3 ready pods", ready_pods)
    for pod in pods:
        # Placed by the real scheduler (not pinned), run by the fake kubelet.
        assert pod["spec"]["nodeName"] in cluster.nodes
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        assert pod["metadata"]["annotations"][FAULT_ANNOTATION] == "none"
        assert_kubelet_conditions(
            pod,
            PodReadyToStartContainers="True",
            Initialized="True",
            Ready="True",
            ContainersReady="True",
            PodScheduled="True",
        )
        assert pod["status"]["phase"] == "Running"
        cs = container(pod)
        assert_ran(cs)
        assert cs["ready"] is True and cs["started"] is True and cs["restartCount"] == 0
        assert RFC3339.match(cs["state"]["running"]["startedAt"])
        assert_placed_like_a_kubelet(cluster, pod)
    wait_for(
        "the Deployment to report 3 available replicas",
        lambda: apps.read_namespaced_deployment("web", namespace).status.available_replicas == 3,
    )

    # The ReplicaSet controller replaces a deleted pod; the fake kubelet stops and removes it.
    victim = pods[0]["metadata"]
    core.delete_namespaced_pod(victim["name"], namespace)

    def replaced() -> bool:
        current = ready_pods()
        uids = {p["metadata"]["uid"] for p in current}
        return bool(current) and victim["uid"] not in uids

    wait_for("a ready replacement pod", replaced)
    wait_for(
        "the deleted pod to be gone",
        lambda: (
            victim["name"]
            not in {
                p["metadata"]["name"]
                for p in cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
            }
        ),
    )


def test_a_jobs_pod_completes_on_a_healthy_node_and_the_job_succeeds(
    cluster: Cluster, kube: k8s.ApiClient, namespace: str
) -> None:
    batch = k8s.BatchV1Api(kube)
    batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "once"},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "initContainers": [{"name": "setup", "image": IMAGE}],
                        "containers": [{"name": "app", "image": IMAGE}],
                    }
                }
            },
        },
    )
    wait_for(
        "the Job to succeed",
        lambda: batch.read_namespaced_job("once", namespace).status.succeeded == 1,
    )
    (pod,) = cluster.rest.get(
        f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": "job-name=once"}
    )["items"]
    assert pod["status"]["phase"] == "Succeeded"
    assert container(pod)["state"]["terminated"]["reason"] == "Completed"
    assert container(pod)["state"]["terminated"]["exitCode"] == 0
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["reason"] == "Completed" and init["ready"] is True
    assert conditions(pod)["Ready"]["reason"] == "PodCompleted"


# -- node faults --------------------------------------------------------------------------------


def test_a_node_in_crashloop_makes_its_pods_crash_loop_with_rising_restarts(
    cluster: Cluster, namespace: str, fault: Callable[[str, str | None], None]
) -> None:
    fault("node-1", "crashloop")
    uid = create_pod(cluster, namespace, "crasher", nodeName="node-1")["metadata"]["uid"]

    pod = wait_for(
        "CrashLoopBackOff",
        lambda: (
            (p := get_pod(cluster, namespace, "crasher"))
            and waiting_reason(p) == "CrashLoopBackOff"
            and p
        ),
    )
    assert pod["metadata"]["annotations"][FAULT_ANNOTATION] == "crashloop"
    assert pod["status"]["phase"] == "Running"
    assert_kubelet_conditions(
        pod,
        PodReadyToStartContainers="True",
        Initialized="True",
        Ready="False",
        ContainersReady="False",
        PodScheduled="True",
    )
    for ctype in ("Ready", "ContainersReady"):
        assert conditions(pod)[ctype]["reason"] == "ContainersNotReady"
        assert conditions(pod)[ctype]["message"] == "containers with unready status: [app]"
    assert_placed_like_a_kubelet(cluster, pod)
    cs = container(pod)
    assert_ran(cs)
    assert cs["ready"] is False and cs["started"] is False
    assert re.match(
        rf"^back-off \d+(m\d+)?s restarting failed container=app pod=crasher_{namespace}\({uid}\)$",
        cs["state"]["waiting"]["message"],
    )
    last = cs["lastState"]["terminated"]
    assert last["exitCode"] == 1
    assert last["reason"] == "Error"
    assert RFC3339.match(last["startedAt"]) and RFC3339.match(last["finishedAt"])
    assert last["containerID"] == cs["containerID"]

    first = cs["restartCount"]
    assert first >= 1
    later = wait_for(
        "restartCount to rise",
        lambda: (
            (n := container(get_pod(cluster, namespace, "crasher"))["restartCount"]) > first and n
        ),
        timeout=cluster.timing.restart_interval * 3 + 5,
    )
    assert later > first
    # Each restart is a new container.
    assert container(get_pod(cluster, namespace, "crasher"))["containerID"] != cs["containerID"]


def test_a_node_in_oom_makes_its_pods_crash_loop_as_oomkilled(
    cluster: Cluster, namespace: str, fault: Callable[[str, str | None], None]
) -> None:
    fault("node-2", "oom")
    create_pod(
        cluster,
        namespace,
        "hungry",
        nodeSelector={"kubernetes.io/hostname": "node-2"},  # through the scheduler this time
    )
    pod = wait_for(
        "CrashLoopBackOff",
        lambda: (
            (p := get_pod(cluster, namespace, "hungry"))
            and waiting_reason(p) == "CrashLoopBackOff"
            and p
        ),
    )
    assert pod["spec"]["nodeName"] == "node-2"
    assert pod["metadata"]["annotations"][FAULT_ANNOTATION] == "oom"
    assert pod["status"]["phase"] == "Running"
    cs = container(pod)
    assert_ran(cs)
    assert cs["restartCount"] >= 1
    assert cs["lastState"]["terminated"]["reason"] == "OOMKilled"
    assert cs["lastState"]["terminated"]["exitCode"] == 137
    assert conditions(pod)["Ready"]["reason"] == "ContainersNotReady"


def test_a_job_pod_that_may_not_restart_fails_on_a_crashloop_node(
    cluster: Cluster, kube: k8s.ApiClient, namespace: str, fault: Callable[[str, str | None], None]
) -> None:
    fault("node-3", "crashloop")
    batch = k8s.BatchV1Api(kube)
    batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "doomed"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": {"kubernetes.io/hostname": "node-3"},
                        "containers": [{"name": "app", "image": IMAGE}],
                    }
                },
            },
        },
    )
    wait_for(
        "the Job to fail",
        lambda: any(
            c.type == "Failed" and c.status == "True"
            for c in batch.read_namespaced_job("doomed", namespace).status.conditions or []
        ),
    )
    (pod,) = cluster.rest.get(
        f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": "job-name=doomed"}
    )["items"]
    assert pod["status"]["phase"] == "Failed"
    cs = container(pod)
    assert cs["restartCount"] == 0
    assert cs["state"]["terminated"]["exitCode"] == 1
    assert cs["state"]["terminated"]["reason"] == "Error"
    assert conditions(pod)["Ready"]["reason"] == "PodFailed"


def test_a_node_in_imagepull_reports_errimagepull_then_imagepullbackoff(
    cluster: Cluster, namespace: str, fault: Callable[[str, str | None], None]
) -> None:
    fault("node-3", "imagepull")
    create_pod(cluster, namespace, "puller", nodeName="node-3")

    pod = wait_for(
        "ErrImagePull",
        lambda: (
            (p := get_pod(cluster, namespace, "puller"))
            and waiting_reason(p) == "ErrImagePull"
            and p
        ),
    )
    assert pod["status"]["phase"] == "Pending"
    cs = container(pod)
    assert_never_ran(cs)
    assert (
        'failed to pull and unpack image "registry.example.com/shop/web:1.4.2"'
        in (cs["state"]["waiting"]["message"])
    )

    pod = wait_for(
        "ImagePullBackOff",
        lambda: (
            (p := get_pod(cluster, namespace, "puller"))
            and waiting_reason(p) == "ImagePullBackOff"
            and p
        ),
    )
    assert pod["metadata"]["annotations"][FAULT_ANNOTATION] == "imagepull"
    assert pod["status"]["phase"] == "Pending"
    assert_kubelet_conditions(
        pod,
        PodReadyToStartContainers="True",
        Initialized="True",
        Ready="False",
        ContainersReady="False",
        PodScheduled="True",
    )
    assert_placed_like_a_kubelet(cluster, pod)
    cs = container(pod)
    assert_never_ran(cs)
    assert cs["state"]["waiting"]["message"].startswith(f'Back-off pulling image "{IMAGE}"')


def test_a_node_in_evict_evicts_its_pods_for_memory_pressure(
    cluster: Cluster, namespace: str, fault: Callable[[str, str | None], None]
) -> None:
    fault("node-1", "evict")
    create_pod(cluster, namespace, "evictee", nodeName="node-1")
    pod = wait_for(
        "the eviction",
        lambda: (
            (p := get_pod(cluster, namespace, "evictee"))
            and p["status"].get("phase") == "Failed"
            and p
        ),
    )
    assert pod["metadata"]["annotations"][FAULT_ANNOTATION] == "evict"
    assert pod["status"]["reason"] == "Evicted"
    assert pod["status"]["message"].startswith(
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 12Mi. "
    )
    assert_kubelet_conditions(
        pod,
        PodReadyToStartContainers="False",
        Initialized="True",
        Ready="False",
        ContainersReady="False",
        PodScheduled="True",
    )
    assert conditions(pod)["Ready"]["reason"] == "PodFailed"
    disruption = conditions(pod)["DisruptionTarget"]
    assert disruption["status"] == "True"
    assert disruption["reason"] == "TerminationByKubelet"
    assert disruption["message"] == pod["status"]["message"]
    cs = container(pod)
    assert_ran(cs)
    assert cs["state"]["terminated"]["exitCode"] == 137
    assert cs["state"]["terminated"]["reason"] == "Error"
    assert cs["ready"] is False and cs["started"] is False


def test_a_node_in_createcontainer_reports_createcontainererror(
    cluster: Cluster, namespace: str, fault: Callable[[str, str | None], None]
) -> None:
    fault("node-2", "createcontainer")
    uid = create_pod(cluster, namespace, "uncreatable", nodeName="node-2")["metadata"]["uid"]
    pod = wait_for(
        "CreateContainerError",
        lambda: (
            (p := get_pod(cluster, namespace, "uncreatable"))
            and waiting_reason(p) == "CreateContainerError"
            and p
        ),
    )
    assert pod["metadata"]["annotations"][FAULT_ANNOTATION] == "createcontainer"
    assert pod["status"]["phase"] == "Pending"
    assert_kubelet_conditions(pod, Ready="False", ContainersReady="False", PodScheduled="True")
    cs = container(pod)
    assert_never_ran(cs)
    assert f"app_uncreatable_{namespace}_{uid}_0" in cs["state"]["waiting"]["message"]


def test_a_pod_on_an_unlabelled_node_stays_healthy_next_to_a_faulty_one(
    cluster: Cluster, namespace: str, fault: Callable[[str, str | None], None]
) -> None:
    fault("node-1", "crashloop")
    create_pod(cluster, namespace, "sick", nodeName="node-1")
    create_pod(cluster, namespace, "fine", nodeName="node-0")
    wait_for("the healthy pod to be Ready", lambda: is_ready(get_pod(cluster, namespace, "fine")))
    wait_for(
        "the other pod to crash loop",
        lambda: waiting_reason(get_pod(cluster, namespace, "sick")) == "CrashLoopBackOff",
    )
    # Over a restart interval of the other: Ready all along, never restarted.
    e2e.holds(
        "the healthy pod Ready and never restarted",
        lambda: (
            is_ready(fine := get_pod(cluster, namespace, "fine"))
            and container(fine)["restartCount"] == 0
        ),
        cluster.timing.restart_interval,
    )
    fine = get_pod(cluster, namespace, "fine")
    assert fine["metadata"]["annotations"][FAULT_ANNOTATION] == "none"


def test_removing_the_label_heals_the_node_for_new_pods(
    cluster: Cluster, namespace: str, fault: Callable[[str, str | None], None]
) -> None:
    fault("node-3", "imagepull")
    create_pod(cluster, namespace, "before", nodeName="node-3")
    wait_for(
        "the first pod to fail",
        lambda: (
            waiting_reason(get_pod(cluster, namespace, "before")) == "ErrImagePull"
            or waiting_reason(get_pod(cluster, namespace, "before")) == "ImagePullBackOff"
        ),
    )
    fault("node-3", None)
    assert SIM_FAULT_LABEL not in node_of(cluster, "node-3")["metadata"]["labels"]
    create_pod(cluster, namespace, "after", nodeName="node-3")
    wait_for("the new pod to be Ready", lambda: is_ready(get_pod(cluster, namespace, "after")))
    # A fault sticks to the pods bound while it was on: no kubelet un-fails a pod.
    assert (
        get_pod(cluster, namespace, "before")["metadata"]["annotations"][FAULT_ANNOTATION]
        == "imagepull"
    )
    assert not is_ready(get_pod(cluster, namespace, "before"))


def test_a_pods_fate_is_its_nodes_label_at_the_moment_it_was_bound(
    cluster: Cluster, namespace: str, fault: Callable[[str, str | None], None]
) -> None:
    fault("node-2", "createcontainer")
    create_pod(cluster, namespace, "bound-while-sick", nodeName="node-2")
    fault("node-2", None)  # healed at once, likely before the fake kubelet saw the pod
    create_pod(cluster, namespace, "bound-after-healing", nodeName="node-2")
    wait_for(
        "the pod bound while the node was sick to fail",
        lambda: (
            waiting_reason(get_pod(cluster, namespace, "bound-while-sick"))
            == "CreateContainerError"
        ),
    )
    wait_for(
        "the pod bound after healing to be Ready",
        lambda: is_ready(get_pod(cluster, namespace, "bound-after-healing")),
    )


def test_set_fault_rejects_unknown_modes_and_nodes(cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="unknown fault mode"):
        cluster.set_fault("node-0", "flaky")
    with pytest.raises(ValueError, match="unknown node"):
        cluster.set_fault("node-99", "crashloop")


# -- admission and authorization ----------------------------------------------------------------


class _Mutator(BaseHTTPRequestHandler):
    seen: list[str] = []  # noqa: RUF012 (a test double's call log)

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        meta = request["object"]["metadata"]
        self.seen.append(request.get("name") or meta.get("name") or meta.get("generateName", ""))
        patch = [
            {
                "op": "add",
                "path": "/metadata/labels",
                "value": {
                    **(request["object"]["metadata"].get("labels") or {}),
                    "mutated-by": "test-webhook",
                },
            }
        ]
        body = json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": request["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_the_api_server_calls_a_mutating_webhook_over_tls(
    cluster: Cluster, kube: k8s.ApiClient, namespace: str, tmp_path: Path
) -> None:
    ca = lpki.make_ca("test-webhook-ca")
    serving = lpki.issue(ca, "127.0.0.1", ip_addresses=("127.0.0.1",), server=True)
    crt, key = serving.write(tmp_path, "webhook")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Mutator)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(crt, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    name = f"test-mutator-{namespace}"
    admission = k8s.AdmissionregistrationV1Api(kube)
    admission.create_mutating_webhook_configuration(
        {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "mutator.test.kn-rescheduler.io",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/mutate",
                        "caBundle": base64.b64encode(ca.cert_pem).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                        }
                    ],
                    # Only this test's namespace: the rest of the suite shares the cluster.
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                }
            ],
        }
    )
    try:
        # The API server picks new webhook configurations up from a watch: probe with dry runs.
        def mutated_dry_run() -> bool:
            pod = cluster.rest.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/pods",
                body={
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"generateName": "probe-"},
                    "spec": {"containers": [{"name": "app", "image": IMAGE}]},
                },
                params={"dryRun": "All"},
            )
            return pod["metadata"].get("labels", {}).get("mutated-by") == "test-webhook"

        wait_for("the webhook configuration to take effect", mutated_dry_run)
        _Mutator.seen.clear()
        pod = create_pod(cluster, namespace, "mutated")
        assert pod["metadata"]["labels"]["mutated-by"] == "test-webhook"
        assert _Mutator.seen == ["mutated"]
    finally:
        admission.delete_mutating_webhook_configuration(name)
        server.shutdown()
        server.server_close()


def test_rbac_denies_a_service_account_without_rights(
    cluster: Cluster, kube: k8s.ApiClient, namespace: str
) -> None:
    core = k8s.CoreV1Api(kube)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    token = core.create_namespaced_service_account_token(
        "nobody", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token
    cfg = k8s.Configuration(host=cluster.server, ssl_ca_cert=str(cluster.ca_file))
    cfg.api_key = {"BearerToken": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer"}
    with k8s.ApiClient(cfg) as as_nobody:
        # Authenticated as the ServiceAccount ...
        review = k8s.AuthenticationV1Api(as_nobody).create_self_subject_review({})
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:nobody"
        # ... and authorised for nothing.
        with pytest.raises(ApiException) as denied:
            k8s.CoreV1Api(as_nobody).list_namespaced_pod(namespace)
        assert denied.value.status == 403
        with pytest.raises(ApiException) as denied:
            k8s.CoreV1Api(as_nobody).create_namespaced_pod(
                namespace,
                {
                    "metadata": {"name": "x"},
                    "spec": {"containers": [{"name": "a", "image": IMAGE}]},
                },
            )
        assert denied.value.status == 403


# -- process hygiene ----------------------------------------------------------------------------


def _ours(directory: Path, bins_dir: str) -> list[int]:
    """Live processes started from the binaries directory whose command line names directory."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if exe.startswith(bins_dir) and names_path(cmdline(pid), str(directory)) and pid_alive(pid):
            found.append(pid)
    return found


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dev.localcluster", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_up_then_down_leaves_no_process_behind(cluster: Cluster) -> None:
    with tempfile.TemporaryDirectory(prefix="kn-rescheduler-up-") as tmp:
        directory = Path(tmp)
        pids: list[int] = []
        up = _cli("up", "--dir", tmp, "--nodes", "1")
        try:
            assert up.returncode == 0, up.stderr + up.stdout
            assert f"kubeconfig: {directory / 'kubeconfig'}" in up.stdout
            assert f"logs: {directory / 'logs'}" in up.stdout
            state = json.loads((directory / "state.json").read_text())
            pids += [state["supervisor_pid"], *state["pids"].values()]
            assert len(state["pids"]) == 5
            assert all(pid_alive(p) for p in pids)
            assert sorted(_ours(directory, state["bins_dir"])) == sorted(state["pids"].values())
            status = _cli("status", "--dir", tmp)
            assert status.returncode == 0, status.stdout + status.stderr
            assert "/readyz: 200 ok" in status.stdout
        finally:
            down = _cli("down", "--dir", tmp)
        assert down.returncode == 0, down.stderr + down.stdout
        assert "no process left" in down.stdout
        assert not [p for p in pids if pid_alive(p)]
        assert _ours(directory, state["bins_dir"]) == []
        assert _cli("status", "--dir", tmp).returncode == 3


_HARNESS = """
import sys, json, time
from dev.localcluster import Cluster
c = Cluster(sys.argv[1], nodes=1, quiet=True).start()
print(json.dumps(c.pids()), flush=True)
time.sleep(600)
"""


def test_the_control_plane_dies_with_a_sigkilled_harness(cluster: Cluster) -> None:
    with tempfile.TemporaryDirectory(prefix="kn-rescheduler-kill-") as tmp:
        harness = subprocess.Popen(
            [sys.executable, "-c", _HARNESS, tmp],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert harness.stdout is not None
            pids = list(json.loads(harness.stdout.readline()).values())
            assert len(pids) == 5 and all(pid_alive(p) for p in pids)
        finally:
            harness.send_signal(signal.SIGKILL)  # no finally, no atexit: only the kernel
            harness.wait()
        wait_for(
            "every child to die with the harness",
            lambda: not [p for p in pids if pid_alive(p)],
            timeout=10,
        )
        assert _ours(Path(tmp), str(cluster.bins_dir)) == []
