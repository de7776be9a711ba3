"""A real NetworkPolicy implementation for the cluster of real nodes: kube-network-policies.

The local nodes' CNI is the plain bridge plugin, which enforces nothing: a NetworkPolicy applied
there is stored and ignored, so a test could not tell a policy that refuses a pod from one that
lets everything through. kubernetes-sigs/kube-network-policies is the implementation kind's
kindnet uses: a DaemonSet on every node that puts the first packet of each new connection to a
pod through an NFQUEUE and answers it from the NetworkPolicies, Pods and Namespaces it watches.

Installed as its project ships it: the module's own ``install.yaml`` (copied beside the image by
hack/build-network-policies.sh), applied with kubectl, with three changes made here and nowhere
else: the image is the one built from the pinned module (the manifest names an older tag); NRI is
off (the nodes' containerd does not run the NRI plugin, so the pods' addresses come from the
API, as before NRI); and the two hostPath volumes only NRI reads are dropped with it: its socket
(a hostPath the runtime would create on the machine, which is not the node's to make) and the
pods' network namespaces (mounted with HostToContainer propagation, which the runtime refuses
where the machine's root mount is private, as in a container).

Root's own traffic in a node (the kubelet's probes) is never queued (its nftables rules accept
``meta skuid 0``), as NetworkPolicy's "traffic from the node is allowed" asks.
"""

from __future__ import annotations

import gzip
import platform
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final

import yaml

from dev.localcluster.addons import REAL_NODE_SELECTOR, AddonError, apply
from dev.localcluster.bins import REPO_ROOT, BinsError, run_build_script
from dev.localcluster.registry import LocalRegistry, RegistryError

BUILD_SCRIPT: Final = REPO_ROOT / "hack" / "build-network-policies.sh"
GO_MOD: Final = REPO_ROOT / "hack" / "network-policies" / "go.mod"
MODULE: Final = "sigs.k8s.io/kube-network-policies"
ARCHIVE: Final = "kube-network-policies.oci.tar"
MANIFEST: Final = "kube-network-policies.yaml"
NAMESPACE: Final = "kube-system"
NAME: Final = "kube-network-policies"
NRI_VOLUMES: Final = frozenset({"nri-plugin", "netns"})


# Its rules send the first packet of a connection to userspace with nftables' `queue`
# statement, which the kernel implements in nft_queue (CONFIG_NFT_QUEUE). Without it, every
# rule sync fails with "netlink receive: no such file or directory" while the pods run Ready
# and enforce nothing.
KERNEL_OPTION: Final = "CONFIG_NFT_QUEUE"


def kernel_configs() -> list[Path]:
    """Where a kernel's build configuration is usually found."""
    return [Path("/proc/config.gz"), Path(f"/boot/config-{platform.release()}")]


def kernel_lacks_queue(configs: Iterable[Path]) -> str | None:
    """Why this kernel cannot run kube-network-policies, or None if it can or nobody can tell
    (no configuration found): then the install is tried."""
    for path in configs:
        try:
            raw = path.read_bytes()
        except OSError:
            continue
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode(errors="replace")
        for line in text.splitlines():
            if line.startswith(f"{KERNEL_OPTION}=") and line.split("=", 1)[1] in ("y", "m"):
                return None
        return (
            f"this kernel ({platform.release()}) is built without {KERNEL_OPTION} ({path}), "
            "the nftables queue kube-network-policies sends packets to userspace with"
        )
    return None


def version() -> str:
    """The kube-network-policies version hack/network-policies/go.mod pins."""
    for line in GO_MOD.read_text().splitlines():
        fields = line.split()
        if fields[:2] == ["require", MODULE]:
            return fields[2]
    raise AddonError(f"hack/network-policies/go.mod requires no {MODULE}")


def image_name() -> str:
    """Its name in the registry (under registry.k8s.io, which the nodes mirror)."""
    return f"networking/kube-network-policies:{version()}"


def documents(template: str, *, real_nodes_only: bool) -> list[dict[str, Any]]:
    """The manifest's objects with the three local changes the module docstring names (pure)."""
    docs = [d for d in yaml.safe_load_all(template) if d]
    daemonsets = [d for d in docs if d.get("kind") == "DaemonSet"]
    if len(daemonsets) != 1:
        raise AddonError(f"{MANIFEST} holds {len(daemonsets)} DaemonSets, expected one")
    spec = daemonsets[0]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    container["image"] = f"registry.k8s.io/{image_name()}"
    args = list(container.get("args") or [])
    if not args or not args[0].endswith("netpol"):
        raise AddonError(f"{MANIFEST}'s container no longer starts /bin/netpol: {args}")
    if "--disable-nri" not in args:
        args.append("--disable-nri")
    container["args"] = args
    container["volumeMounts"] = [
        m for m in container.get("volumeMounts") or [] if m["name"] not in NRI_VOLUMES
    ]
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v["name"] not in NRI_VOLUMES]
    if real_nodes_only:
        # A kwok node runs nothing: a DaemonSet pod there would be reported Running and enforce
        # nothing, and its readiness would say nothing of the real nodes.
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **REAL_NODE_SELECTOR}
    return docs


class KernelUnsupported(AddonError):
    """The machine's kernel lacks what the implementation needs (the message names it)."""


def ensure() -> Path:
    """The directory holding ARCHIVE and MANIFEST; builds them first when needed."""
    try:
        directory = Path(run_build_script(BUILD_SCRIPT))
    except BinsError as err:
        raise AddonError(str(err)) from err
    absent = [f for f in (ARCHIVE, MANIFEST) if not (directory / f).is_file()]
    if absent:
        raise AddonError(f"hack/{BUILD_SCRIPT.name} printed {directory}, which lacks {absent}")
    return directory


def install(
    registry: LocalRegistry,
    kubectl: Path,
    kubeconfig: Path,
    *,
    real_nodes_only: bool,
    ready: Callable[[], str | None],
    deadline: float,
) -> None:
    """Pushes the image, applies the manifest and waits until ``ready()`` returns None (it
    returns what is still missing otherwise, which the error then names)."""
    lacking = kernel_lacks_queue(kernel_configs())
    if lacking is not None:
        raise KernelUnsupported(f"NetworkPolicies cannot be enforced here: {lacking}")
    directory = ensure()
    try:
        registry.push(directory / ARCHIVE, image_name())
    except RegistryError as err:
        raise AddonError(f"pushing {ARCHIVE}: {err}") from err
    template = (directory / MANIFEST).read_text()
    apply(kubectl, kubeconfig, documents(template, real_nodes_only=real_nodes_only))
    while (waiting := ready()) is not None:
        if time.monotonic() > deadline:
            raise AddonError(
                f"{NAMESPACE}/{NAME} is not enforcing on every real node in time ({waiting}); "
                f"see `kubectl -n {NAMESPACE} describe pods -l app={NAME}`"
            )
        time.sleep(0.5)


def missing_on(daemonset: dict[str, Any] | None, nodes: int) -> str | None:
    """What keeps the DaemonSet from enforcing on ``nodes`` nodes, or None (pure)."""
    if daemonset is None:
        return "no DaemonSet yet"
    status = daemonset.get("status") or {}
    if status.get("observedGeneration") != daemonset["metadata"].get("generation"):
        return "its controller has not seen the latest spec"
    ready = int(status.get("numberReady") or 0)
    if ready < nodes:
        return f"{ready} of {nodes} nodes ready"
    return None
