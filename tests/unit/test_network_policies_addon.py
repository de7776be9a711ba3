"""The local cluster's NetworkPolicy implementation (dev/localcluster/networkpolicies.py).

The manifest here is the shape kube-network-policies v0.8.0 ships as install.yaml (its
DaemonSet, reduced to the fields the changes touch); the kernel configurations are lines as
a kernel's build writes them to /proc/config.gz or /boot/config-<release>.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import yaml

from dev.localcluster import networkpolicies
from dev.localcluster.addons import AddonError

INSTALL = """
kind: ServiceAccount
apiVersion: v1
metadata: {name: kube-network-policies, namespace: kube-system}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-network-policies, namespace: kube-system}
spec:
  template:
    spec:
      hostNetwork: true
      nodeSelector: {kubernetes.io/os: linux}
      containers:
      - name: kube-network-policies
        image: registry.k8s.io/networking/kube-network-policies:v0.7.0
        args: [/bin/netpol, --hostname-override=$(MY_NODE_NAME), --v=2, --nfqueue-id=98]
        volumeMounts:
        - {name: nri-plugin, mountPath: /var/run/nri}
        - {name: netns, mountPath: /var/run/netns, mountPropagation: HostToContainer}
        - {name: other, mountPath: /other}
      volumes:
      - {name: nri-plugin, hostPath: {path: /var/run/nri}}
      - {name: netns, hostPath: {path: /var/run/netns}}
      - {name: other, emptyDir: {}}
"""


def daemonset_spec(docs: list[dict]) -> dict:  # type: ignore[type-arg]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    spec: dict = ds["spec"]["template"]["spec"]  # type: ignore[type-arg]
    return spec


def test_the_manifest_runs_the_pinned_build_without_nri_and_keeps_everything_else() -> None:
    docs = networkpolicies.documents(INSTALL, real_nodes_only=False)
    spec = daemonset_spec(docs)
    (container,) = spec["containers"]
    assert container["image"] == (
        f"registry.k8s.io/networking/kube-network-policies:{networkpolicies.version()}"
    )
    assert (
        container["args"][:4]
        == yaml.safe_load(INSTALL.split("---")[1])["spec"]["template"]["spec"]["containers"][0][
            "args"
        ]
    )
    assert container["args"][-1] == "--disable-nri"
    assert [m["name"] for m in container["volumeMounts"]] == ["other"]
    assert [v["name"] for v in spec["volumes"]] == ["other"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert [d["kind"] for d in docs] == ["ServiceAccount", "DaemonSet"]


def test_beside_kwok_nodes_it_runs_on_the_real_nodes_only() -> None:
    spec = daemonset_spec(networkpolicies.documents(INSTALL, real_nodes_only=True))
    assert spec["nodeSelector"] == {
        "kubernetes.io/os": "linux",
        "kn-rescheduler.local/real-node": "true",
    }


def test_a_manifest_that_no_longer_starts_netpol_is_refused_not_patched() -> None:
    changed = INSTALL.replace("[/bin/netpol,", "[/bin/other,")
    with pytest.raises(AddonError, match="no longer starts"):
        networkpolicies.documents(changed, real_nodes_only=False)


@pytest.mark.parametrize(
    ("config", "gzipped", "lacking"),
    [
        ("CONFIG_NF_TABLES=y\n# CONFIG_NFT_QUEUE is not set\n", True, True),
        ("CONFIG_NF_TABLES=y\nCONFIG_NFT_QUEUE=m\n", False, False),
        ("CONFIG_NF_TABLES=y\nCONFIG_NFT_QUEUE=y\n", True, False),
        # CONFIG_NFT_QUEUE_X is another option, not this one.
        ("CONFIG_NFT_QUEUE_X=y\n", False, True),
    ],
)
def test_the_kernel_is_asked_for_the_nftables_queue(
    tmp_path: Path, config: str, gzipped: bool, lacking: bool
) -> None:
    path = tmp_path / ("config.gz" if gzipped else "config-6.1.0")
    path.write_bytes(gzip.compress(config.encode()) if gzipped else config.encode())
    why = networkpolicies.kernel_lacks_queue([tmp_path / "absent", path])
    assert (why is not None) == lacking
    if why is not None:
        assert "CONFIG_NFT_QUEUE" in why and str(path) in why


def test_without_a_kernel_configuration_the_install_is_tried(tmp_path: Path) -> None:
    assert networkpolicies.kernel_lacks_queue([tmp_path / "absent"]) is None


@pytest.mark.parametrize(
    ("status", "generation", "missing"),
    [
        ({"observedGeneration": 1, "numberReady": 2}, 1, None),
        ({"observedGeneration": 1, "numberReady": 1}, 1, "1 of 2 nodes ready"),
        ({"observedGeneration": 1, "numberReady": 2}, 2, "its controller has not seen"),
        ({}, 1, "its controller has not seen"),
    ],
)
def test_it_is_ready_once_its_controller_saw_the_spec_and_every_node_runs_it(
    status: dict,
    generation: int,
    missing: str | None,  # type: ignore[type-arg]
) -> None:
    ds = {"metadata": {"generation": generation}, "status": status}
    answer = networkpolicies.missing_on(ds, 2)
    assert answer == missing if missing is None else answer is not None and missing in answer
    assert networkpolicies.missing_on(None, 2) == "no DaemonSet yet"
