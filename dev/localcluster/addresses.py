"""The simulated nodes' addresses: room for 8,192 nodes, past Kubernetes' 5,000.

A kwok node gets what a kubelet on a real cluster would report and what the controller
manager's node IPAM would give it: an InternalIP, and a ``/24`` of the cluster's pod range (a
node runs at most 110 pods by default, so a ``/24`` holds them, as kubeadm's default
``--node-cidr-mask-size`` does). Nothing answers at these addresses; metrics-server and
Prometheus find a node by its InternalIP (metricsserver.py, nodeexporter.py).

The ranges stay clear of the Service range (``10.96.0.0/16``) and of the real-node clusters'
networks (``10.200.0.0/16`` to ``10.254.0.0/16``, nodenet.py):

- InternalIPs from ``10.0.0.10`` up, in ``10.0.0.0/16``;
- pod CIDRs, one ``/24`` each, from ``10.128.0.0/11`` (``--cluster-cidr``), 8,192 of them.
"""

from __future__ import annotations

import ipaddress
from typing import Final

NODE_NETWORK: Final = ipaddress.IPv4Network("10.0.0.0/16")
FIRST_NODE_ADDRESS: Final = ipaddress.IPv4Address("10.0.0.10")
CLUSTER_CIDR: Final = "10.128.0.0/11"
NODE_CIDR_MASK: Final = 24
MAX_NODES: Final = 2 ** (NODE_CIDR_MASK - ipaddress.IPv4Network(CLUSTER_CIDR).prefixlen)


class AddressError(ValueError):
    """A node index the scheme has no address for."""


def _check(index: int) -> None:
    if not 0 <= index < MAX_NODES:
        raise AddressError(f"node index {index}: the local cluster has room for {MAX_NODES} nodes")


def node_ip(index: int) -> str:
    """The InternalIP of node ``index`` (0-based)."""
    _check(index)
    return str(FIRST_NODE_ADDRESS + index)


def node_pod_cidr(index: int) -> str:
    """The pod CIDR the controller manager's range allocator gives the ``index``-th node to
    register (used when a node has none yet)."""
    _check(index)
    base = ipaddress.IPv4Network(CLUSTER_CIDR).network_address
    return f"{base + index * 2 ** (32 - NODE_CIDR_MASK)}/{NODE_CIDR_MASK}"
