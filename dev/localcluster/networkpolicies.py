"""A real NetworkPolicy implementation for the cluster of real nodes: kube-router's firewall.

The local nodes' CNI is the plain bridge plugin, which enforces nothing: a NetworkPolicy applied
there is stored and ignored, so a test could not tell a policy that refuses a pod from one that
lets everything through. kube-router's network policy controller is one that clusters run
beside another CNI (`--run-router=false --run-service-proxy=false`, its
kube-router-firewall-daemonset.yaml): it watches Pods, Namespaces and NetworkPolicies and
writes, in its node, an iptables chain per pod and an ipset per selector, rejecting what no
policy admits.

It runs as each node's kube-proxy runs here: a process in the node's network namespace with a
client certificate of its own (``system:kube-router``), granted the ClusterRole of the module's
own generic-kuberouter.yaml. Stopping the node removes its namespace, and its rules and sets
with it. Traffic from the node itself (the kubelet's probes) is accepted before any policy
(its "source is the pod's local node" rule), as NetworkPolicy asks.

kube-network-policies, the implementation kind's kindnet uses, was the first choice; it needs
nftables' `queue` statement (CONFIG_NFT_QUEUE), which some kernels are built without. kube-router
needs iptables and ipset only.
"""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Final

import yaml

from dev.localcluster.addons import AddonError
from dev.localcluster.bins import REPO_ROOT, BinsError, run_build_script

BUILD_SCRIPT: Final = REPO_ROOT / "hack" / "build-network-policies.sh"
GO_MOD: Final = REPO_ROOT / "hack" / "network-policies" / "go.mod"
MODULE: Final = "github.com/cloudnativelabs/kube-router/v2"
BINARY: Final = "kube-router"
RBAC_MANIFEST: Final = "generic-kuberouter.yaml"
# The identity every node's firewall uses, and the ClusterRole the module's manifest names.
USER: Final = "system:kube-router"
ROLE: Final = "kube-router"
HEALTH_PORT: Final = 20244
# What kube-router runs (go-iptables and its ipset handler call the commands).
TOOLS: Final = ("iptables", "iptables-save", "iptables-restore", "ipset")


def version() -> str:
    """The kube-router version hack/network-policies/go.mod pins."""
    for line in GO_MOD.read_text().splitlines():
        fields = line.split()
        if fields[:2] == ["require", MODULE]:
            return fields[2]
    raise AddonError(f"hack/network-policies/go.mod requires no {MODULE}")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def rbac_documents(manifest: str) -> list[dict[str, Any]]:
    """The module's ClusterRole, bound to USER instead of its ServiceAccount (pure)."""
    roles = [
        d
        for d in yaml.safe_load_all(manifest)
        if d and d.get("kind") == "ClusterRole" and d["metadata"]["name"] == ROLE
    ]
    if len(roles) != 1:
        raise AddonError(f"{RBAC_MANIFEST} holds {len(roles)} ClusterRoles named {ROLE}")
    role = roles[0]
    role["metadata"].pop("namespace", None)  # a ClusterRole has none; the manifest sets one
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }
    return [role, binding]


def argv(binary: Path, kubeconfig: Path, node: str) -> list[str]:
    """The firewall alone, for ``node`` (pure)."""
    return [
        str(binary),
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        # The nodes' bridge plugin stays their CNI.
        "--enable-cni=false",
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node}",
        f"--health-port={HEALTH_PORT}",
        "--v=1",
    ]


def ensure() -> Path:
    """The directory holding BINARY and RBAC_MANIFEST; builds them first when needed."""
    try:
        directory = Path(run_build_script(BUILD_SCRIPT))
    except BinsError as err:
        raise AddonError(str(err)) from err
    absent = [f for f in (BINARY, RBAC_MANIFEST) if not (directory / f).is_file()]
    if absent:
        raise AddonError(f"hack/{BUILD_SCRIPT.name} printed {directory}, which lacks {absent}")
    return directory


def healthy(address: str) -> bool:
    """Whether the firewall of the node at ``address`` says its controller runs (its health
    check answers once the controller has synced and keeps answering while it heartbeats)."""
    try:
        with urllib.request.urlopen(f"http://{address}:{HEALTH_PORT}/healthz", timeout=2) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False
