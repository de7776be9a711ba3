"""The real-node cluster's network: pods across nodes, Services, cluster DNS, two clusters.

Each real node has its own network namespace and address, routes to the others' pods, and runs
kube-proxy (iptables mode); CoreDNS runs as pods from Kubernetes' own add-on manifest
(dev/localcluster/nodenet.py, addons.py). These tests use them as a workload does: by Service
name, across nodes, and through the ``kubernetes`` Service to the API server.

Needs root and Debian's containerd, runc, CNI plugins and iptables (hack/install-packages.sh).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.localcluster.cluster import Cluster
from dev.localcluster.nodeimages import BUSYBOX_IMAGE
from tests.e2e.conftest import kubectl, needs_real_nodes, real_cluster
from tests.e2e.test_real_nodes import eventually, iptables, pod

pytestmark = [pytest.mark.e2e, needs_real_nodes, pytest.mark.real_nodes]

CLIENT_NODE, SERVER_NODE = "real-0", "real-1"


@pytest.fixture(scope="module")
def rules_before() -> list[str]:
    return iptables()


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory, rules_before: list[str]) -> Iterator[Cluster]:
    with real_cluster(tmp_path_factory.mktemp("net") / "cluster") as c:
        yield c


def in_pod(c: Cluster, name: str, *command: str) -> str:
    return kubectl(c, "exec", name, "--", *command)


def start_pod(
    c: Cluster,
    name: str,
    node: str,
    script: str,
    labels: dict[str, str],
    namespace: str = "default",
) -> None:
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "main", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", script]}
            ],
        },
    }
    c.rest.post(f"/api/v1/namespaces/{namespace}/pods", manifest)


def ready(c: Cluster, name: str) -> bool:
    conditions = pod(c, name).get("status", {}).get("conditions", [])
    return any(x["type"] == "Ready" and x["status"] == "True" for x in conditions)


@pytest.fixture(scope="module")
def web(net: Cluster) -> str:
    """An HTTP server on SERVER_NODE behind the Service ``web``, made after the cluster started
    (so CoreDNS learns of it through its watch on the API server); a client on CLIENT_NODE."""
    start_pod(
        net,
        "web",
        SERVER_NODE,
        f"mkdir -p /www && echo served-by-{SERVER_NODE} > /www/index.html && "
        "exec httpd -f -p 8080 -h /www",
        {"app": "web"},
    )
    start_pod(net, "client", CLIENT_NODE, "trap 'exit 0' TERM; sleep 3600 & wait", {})
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    net.rest.post("/api/v1/namespaces/default/services", service)
    eventually(lambda: ready(net, "web") and ready(net, "client"), "web and client to be ready")
    return str(net.rest.get("/api/v1/namespaces/default/services/web")["spec"]["clusterIP"])


def node_address(c: Cluster, name: str) -> str:
    node = c.rest.get(f"/api/v1/nodes/{name}")
    return next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")


def test_each_node_has_an_address_of_its_own(net: Cluster) -> None:
    assert net.realnodes is not None and net.realnodes.net is not None
    addresses = {name: node_address(net, name) for name in net.real_nodes}
    assert addresses == {n.name: n.address for n in net.realnodes.net.nodes}
    assert len(set(addresses.values())) == len(addresses)


def test_the_kubernetes_service_leads_to_the_api_server_where_nodes_reach_it(
    net: Cluster,
) -> None:
    assert net.realnodes is not None
    slices = net.rest.get(
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
        "?labelSelector=kubernetes.io/service-name=kubernetes"
    )["items"]
    addresses = {a for s in slices for e in s["endpoints"] for a in e["addresses"]}
    assert addresses == {net.realnodes.gateway}
    assert net.server.startswith(f"https://{net.realnodes.gateway}:")


def test_coredns_runs_from_the_upstream_manifest_and_is_ready(net: Cluster) -> None:
    deployment = net.rest.get("/apis/apps/v1/namespaces/kube-system/deployments/coredns")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("registry.k8s.io/coredns/coredns:")
    assert deployment["status"].get("readyReplicas") == 1
    service = net.rest.get("/api/v1/namespaces/kube-system/services/kube-dns")
    assert service["spec"]["clusterIP"] == "10.96.0.10"


def test_a_pod_finds_a_service_on_another_node_by_its_name(net: Cluster, web: str) -> None:
    # CoreDNS answers for a Service made after it started: it watches the API server through
    # the `kubernetes` Service, i.e. through kube-proxy's rules in its node.
    answer = in_pod(net, "client", "nslookup", "web.default.svc.cluster.local")
    assert f"Address: {web}" in answer
    # busybox's static wget resolves no names itself (no NSS in the image): the address
    # CoreDNS gave, which kube-proxy sends to the pod on the other node.
    body = in_pod(net, "client", "timeout", "10", "wget", "-qO-", f"http://{web}/")
    assert body.strip() == f"served-by-{SERVER_NODE}"


def test_pods_reach_each_other_across_nodes_and_the_machine_reaches_them(
    net: Cluster, web: str
) -> None:
    web_ip = pod(net, "web")["status"]["podIP"]
    assert pod(net, "web")["spec"]["nodeName"] != pod(net, "client")["spec"]["nodeName"]
    body = in_pod(net, "client", "timeout", "10", "wget", "-qO-", f"http://{web_ip}:8080/")
    assert body.strip() == f"served-by-{SERVER_NODE}"
    # The API server calls webhooks at their pods' addresses: the machine routes to every node.
    done = subprocess.run(
        ["curl", "-sS", "-m", "10", f"http://{web_ip}:8080/"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout.strip() == f"served-by-{SERVER_NODE}", done.stderr


def node_rules(c: Cluster, node: str) -> str:
    assert c.realnodes is not None
    layout = c.realnodes.layouts[node]
    return subprocess.run(
        layout.net.enter(["iptables-save", "-t", "nat"]),
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_kube_proxy_writes_its_rules_in_its_node_and_none_on_the_machine(
    net: Cluster, web: str, rules_before: list[str]
) -> None:
    for node in net.real_nodes:
        eventually(
            lambda n=node: f"-d {web}/32" in node_rules(net, n),  # type: ignore[misc]
            f"kube-proxy on {node} to write the rules of {web}",
        )
        assert "-A KUBE-SERVICES" in node_rules(net, node)
    assert iptables() == rules_before


def test_a_second_cluster_runs_beside_the_first_with_a_network_of_its_own(
    net: Cluster, web: str, tmp_path: Path
) -> None:
    assert net.realnodes is not None
    other = Cluster(tmp_path / "other", nodes=0, real_nodes=1, prometheus=False, quiet=True)
    other.start()  # returns once its own CoreDNS is ready
    try:
        assert other.realnodes is not None
        assert other.realnodes.network != net.realnodes.network
        assert other.realnodes.gateway != net.realnodes.gateway
        # Same Service range, separate kube-proxies: each cluster's 10.96.0.10 is its own.
        start_pod(other, "client", "real-0", "trap 'exit 0' TERM; sleep 3600 & wait", {})
        eventually(lambda: ready(other, "client"), "the second cluster's client to be ready")
        answer = in_pod(other, "client", "nslookup", "kubernetes.default.svc.cluster.local")
        assert "Address: 10.96.0.1" in answer
        missing = subprocess.run(
            [
                *(str(other.bins_dir / "kubectl"), f"--kubeconfig={other.kubeconfig}", "exec"),
                *("client", "--", "nslookup", "web.default.svc.cluster.local"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert web not in missing.stdout  # the first cluster's Service is not the second's
    finally:
        other.stop()
    # The first cluster's network is untouched by the second's start and stop.
    body = in_pod(net, "client", "timeout", "10", "wget", "-qO-", f"http://{web}/")
    assert body.strip() == f"served-by-{SERVER_NODE}"


STRANGERS = "strangers"
SLEEPER = "trap 'exit 0' TERM; sleep 3600 & wait"


def reaches(c: Cluster, namespace: str, name: str, url: str) -> bool:
    """Whether pod ``name`` gets an answer from ``url`` within 5 s (busybox's own `wget -T`
    crashes; `timeout` ends a try whose packets are dropped)."""
    done = subprocess.run(
        [
            *(str(c.bins_dir / "kubectl"), f"--kubeconfig={c.kubeconfig}"),
            *("exec", "-n", namespace, name, "--", "timeout", "5", "wget", "-qO-", url),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


@pytest.fixture(scope="module")
def enforced(net: Cluster, web: str) -> Cluster:
    """NetworkPolicies enforced on every node, and two pods of another namespace: one on the
    web server's node (bridged to it), one on the other node (routed)."""
    net.install_network_policies()
    kubectl(net, "create", "namespace", STRANGERS)
    for name, node in (("near", SERVER_NODE), ("far", CLIENT_NODE)):
        start_pod(net, name, node, SLEEPER, {}, namespace=STRANGERS)
    eventually(
        lambda: all(
            any(
                x["type"] == "Ready" and x["status"] == "True"
                for x in net.rest.get(f"/api/v1/namespaces/{STRANGERS}/pods/{n}")
                .get("status", {})
                .get("conditions", [])
            )
            for n in ("near", "far")
        ),
        "the strangers' pods to be ready",
    )
    return net


def test_the_nodes_enforce_a_network_policy_on_pods_of_another_namespace(
    enforced: Cluster,
) -> None:
    c = enforced
    url = f"http://{pod(c, 'web')['status']['podIP']}:8080/"
    strangers = [(STRANGERS, "near"), (STRANGERS, "far")]
    # Without a policy, everything reaches everything.
    assert all(reaches(c, ns, name, url) for ns, name in strangers)
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "web-from-its-namespace", "namespace": "default"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "web"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {}}]}],
        },
    }
    policies = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies"
    c.rest.post(policies, policy)
    try:
        for ns, name in strangers:
            eventually(
                lambda ns=ns, name=name: not reaches(c, ns, name, url),  # type: ignore[misc]
                f"{ns}/{name} to be refused by the policy",
            )
        # Its own namespace still gets through, across nodes.
        assert reaches(c, "default", "client", url)
    finally:
        c.rest.delete(f"{policies}/web-from-its-namespace")
    for ns, name in strangers:
        eventually(
            lambda ns=ns, name=name: reaches(c, ns, name, url),  # type: ignore[misc]
            f"{ns}/{name} to get through once the policy is gone",
        )
