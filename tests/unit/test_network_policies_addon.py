"""The local cluster's NetworkPolicy implementation (dev/localcluster/networkpolicies.py).

The RBAC manifest is shaped as kube-router v2.1.0's daemonset/generic-kuberouter.yaml ships it
(a ClusterRole with a namespace set, bound to a ServiceAccount), reduced to two rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.localcluster import networkpolicies
from dev.localcluster.addons import AddonError

GENERIC = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-router, namespace: kube-system}
---
kind: ClusterRole
apiVersion: rbac.authorization.k8s.io/v1
metadata:
  name: kube-router
  namespace: kube-system
rules:
  - apiGroups: [""]
    resources: [namespaces, pods, services, nodes, endpoints]
    verbs: [list, get, watch]
  - apiGroups: ["networking.k8s.io"]
    resources: [networkpolicies]
    verbs: [list, get, watch]
---
kind: ClusterRoleBinding
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: kube-router}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kube-router}
subjects: [{kind: ServiceAccount, name: kube-router, namespace: kube-system}]
"""


def test_the_modules_cluster_role_is_granted_to_the_firewalls_own_user_only() -> None:
    role, binding = networkpolicies.rbac_documents(GENERIC)
    assert role["kind"] == "ClusterRole" and "namespace" not in role["metadata"]
    assert role["rules"][1]["resources"] == ["networkpolicies"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == "kube-router"
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-router"}
    ]


def test_a_manifest_without_its_cluster_role_is_refused() -> None:
    with pytest.raises(AddonError, match="0 ClusterRoles"):
        networkpolicies.rbac_documents(GENERIC.replace("kind: ClusterRole\n", "kind: Role\n"))


def test_only_the_firewall_runs_beside_the_nodes_own_cni_and_proxy() -> None:
    argv = networkpolicies.argv(Path("/bin/kube-router"), Path("/n/kubeconfig"), "real-1")
    assert argv[0] == "/bin/kube-router"
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv[1:])
    assert flags["run-firewall"] == "true"
    assert flags["run-router"] == flags["run-service-proxy"] == flags["enable-cni"] == "false"
    assert flags["hostname-override"] == "real-1"
    assert flags["kubeconfig"] == "/n/kubeconfig"
    assert flags["health-port"] == str(networkpolicies.HEALTH_PORT)


def test_the_pinned_version_is_read_from_the_go_module() -> None:
    assert networkpolicies.version().startswith("v2.")


def test_nothing_listening_is_not_healthy() -> None:
    assert networkpolicies.healthy("127.0.0.1") is False  # nothing on the health port here
