"""CoreDNS as Kubernetes ships it: the add-on manifest with only its placeholders filled.

The manifest is the one hack/build-node-images.sh copies from the pinned Kubernetes module
(cluster/addons/dns/coredns/coredns.yaml.base); these tests fill a copy of its lines that carry
a placeholder or the image, and tests/e2e/test_cluster_network.py installs the whole of it.
"""

from __future__ import annotations

from typing import Any

import pytest

from dev.localcluster import addons, realnode
from dev.localcluster.nodeimages import COREDNS_NAME, UPSTREAM_HOST

# The lines of coredns.yaml.base (Kubernetes v1.36.3) that carry a placeholder or an image.
TEMPLATE = f"""# __MACHINE_GENERATED_WARNING__
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |
    .:53 {{
        kubernetes __DNS__DOMAIN__ in-addr.arpa ip6.arpa {{
            pods insecure
        }}
    }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
spec:
  selector:
    matchLabels:
      k8s-app: kube-dns
  template:
    metadata:
      labels:
        k8s-app: kube-dns
    spec:
      nodeSelector:
        kubernetes.io/os: linux
      containers:
      - name: coredns
        image: {UPSTREAM_HOST}/{COREDNS_NAME}
        resources:
          limits:
            memory: __DNS__MEMORY__LIMIT__
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
spec:
  clusterIP: __DNS__SERVER__
"""


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


def test_the_placeholders_are_filled_as_kubeadm_fills_them() -> None:
    docs = by_kind(addons.coredns_documents(TEMPLATE, real_nodes_only=False))
    assert "kubernetes cluster.local in-addr.arpa" in docs["ConfigMap"]["data"]["Corefile"]
    assert docs["Service"]["spec"]["clusterIP"] == "10.96.0.10"
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["memory"] == "170Mi"


def test_the_dns_service_is_where_every_kubelet_points_pods() -> None:
    docs = by_kind(addons.coredns_documents(TEMPLATE, real_nodes_only=False))
    assert [docs["Service"]["spec"]["clusterIP"]] == [realnode.CLUSTER_DNS]
    assert "kubernetes " + realnode.CLUSTER_DOMAIN in docs["ConfigMap"]["data"]["Corefile"]


def test_the_image_is_the_one_the_manifest_names() -> None:
    docs = by_kind(addons.coredns_documents(TEMPLATE, real_nodes_only=False))
    image = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"registry.k8s.io/{COREDNS_NAME}"


def test_beside_kwok_nodes_coredns_stays_on_the_real_ones() -> None:
    alone = by_kind(addons.coredns_documents(TEMPLATE, real_nodes_only=False))
    mixed = by_kind(addons.coredns_documents(TEMPLATE, real_nodes_only=True))
    assert alone["Deployment"]["spec"]["template"]["spec"]["nodeSelector"] == {
        "kubernetes.io/os": "linux"
    }
    assert mixed["Deployment"]["spec"]["template"]["spec"]["nodeSelector"] == {
        "kubernetes.io/os": "linux",
        "kn-rescheduler.local/real-node": "true",
    }


def test_a_placeholder_this_does_not_know_is_an_error() -> None:
    with pytest.raises(addons.AddonError, match="__DNS__UPSTREAM__"):
        addons.coredns_documents(TEMPLATE + "# __DNS__UPSTREAM__\n", real_nodes_only=False)
