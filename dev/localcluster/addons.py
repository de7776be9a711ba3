"""The cluster add-ons a real-node cluster runs as pods: CoreDNS, the cluster DNS.

Installed the way a cluster installer does it: Kubernetes' own add-on manifest
(cluster/addons/dns/coredns/coredns.yaml.base of the pinned module, copied beside the node
images by hack/build-node-images.sh) with its placeholders filled as kubeadm fills them, applied
with kubectl. The image it names (``registry.k8s.io/coredns/coredns``) is built here and pushed
to the local registry, which the nodes' containerd uses as registry.k8s.io's mirror: nothing
in the manifest is rewritten but its placeholders.

One exception: in a cluster that also has kwok nodes, the Deployment is kept on the real nodes
(a kwok node reports a pod Running and runs nothing, so DNS would answer nowhere).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import yaml

COREDNS_MANIFEST: Final = "coredns.yaml"
# kubeadm's values: the domain, the tenth address of the service range, the memory limit.
PLACEHOLDERS: Final = {
    "__DNS__DOMAIN__": "cluster.local",
    "__DNS__SERVER__": "10.96.0.10",
    "__DNS__MEMORY__LIMIT__": "170Mi",
    "__MACHINE_GENERATED_WARNING__": "Kubernetes' CoreDNS add-on, as the local cluster installs it",
}
REAL_NODE_SELECTOR: Final = {"kn-rescheduler.local/real-node": "true"}


class AddonError(RuntimeError):
    """An add-on could not be installed or did not become ready (the message says why)."""


def coredns_documents(template: str, *, real_nodes_only: bool) -> list[dict[str, Any]]:
    """The manifest's objects with the placeholders filled (pure)."""
    text = template
    for placeholder, value in PLACEHOLDERS.items():
        text = text.replace(placeholder, value)
    if "__DNS__" in text or "__MACHINE_GENERATED" in text:
        left = sorted({w for w in text.split() if w.startswith("__") and w.endswith("__")})
        raise AddonError(f"the CoreDNS manifest has placeholders this does not fill: {left}")
    docs = [d for d in yaml.safe_load_all(text) if d]
    if real_nodes_only:
        for doc in docs:
            if doc.get("kind") == "Deployment":
                spec = doc["spec"]["template"]["spec"]
                spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **REAL_NODE_SELECTOR}
    return docs


def apply(kubectl: Path, kubeconfig: Path, docs: list[dict[str, Any]]) -> None:
    """``kubectl apply -f -`` of ``docs``, server-side as an installer would."""
    try:
        done = subprocess.run(
            [
                str(kubectl),
                f"--kubeconfig={kubeconfig}",
                "apply",
                "--server-side",
                "--field-manager=kn-rescheduler-localcluster",
                "-f",
                "-",
            ],
            input=yaml.safe_dump_all(docs, sort_keys=False),
            capture_output=True,
            text=True,
            timeout=60.0,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AddonError(f"kubectl apply: {e}") from e
    if done.returncode != 0:
        raise AddonError(f"kubectl apply failed: {done.stderr.strip()}")


def install_coredns(
    kubectl: Path,
    kubeconfig: Path,
    images_dir: Path,
    *,
    real_nodes_only: bool,
    available: Callable[[], bool],
    deadline: float,
) -> None:
    """Applies CoreDNS and waits until ``available()`` (its Deployment has a ready replica)."""
    template = (images_dir / COREDNS_MANIFEST).read_text()
    apply(kubectl, kubeconfig, coredns_documents(template, real_nodes_only=real_nodes_only))
    while not available():
        if time.monotonic() > deadline:
            raise AddonError(
                "CoreDNS (kube-system/coredns) has no ready replica in time; see "
                "`kubectl -n kube-system describe pods -l k8s-app=kube-dns`"
            )
        time.sleep(0.5)
