"""The real nodes' network: each node its own network namespace, as each node is its own machine.

A kubelet, its containerd and kube-proxy see the network of the machine they run on. Put
several of them in the machine's own namespace and they share one set of iptables chains:
two kube-proxies (two clusters side by side, or two nodes of one) would overwrite each other's
``KUBE-*`` chains, and every node would have the machine's address. So each real node gets a
network namespace of its own, with one interface (``eth0``) on a bridge of its cluster on the
machine, and the node processes are started in it (``nsenter --net``, which leaves their mount
namespace alone: the kubelet's volume mounts must be the ones containerd sees).

Addresses, for the cluster whose second octet is X (``10.X.0.0/16``, picked free at start):

- ``10.X.255.1`` is the machine on the cluster's bridge (``knrX``): the API server and the
  registry listen there, so nodes and pods reach them, and nothing of the cluster listens on
  the machine's own interfaces;
- ``10.X.255.<i+2>`` is node ``i`` (its InternalIP);
- ``10.X.<i>.0/24`` are node ``i``'s pods, on its CNI bridge, inside its namespace.

Routing is static, as kubenet or flannel's host-gw do it: every node has a route to every other
node's pods through that node's address, and the machine has one to each node's pods (the API
server calls webhooks and the metrics pipeline reads kubelets and pods directly). No NAT leaves
the cluster: pods reach each other, their nodes and the machine, not the internet.

Everything here is a plan (pure: names and addresses in, ``ip`` commands out) and the few calls
that carry it out; :mod:`localcluster.hostchanges` records the namespaces and the bridge before
they exist and deletes them at stop.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# Node i's address is .<i+2> on the cluster's /24: .1 is the machine, .255 the broadcast.
MAX_NODES: Final = 253
NODE_NETWORK_OCTET: Final = 255


class NodeNetError(RuntimeError):
    """The nodes' network could not be set up (the message names the command and its error)."""


@dataclass(frozen=True)
class NodeNet:
    """One real node's place in the cluster network."""

    name: str
    index: int
    netns: str
    # The machine-side end of the node's veth pair; the node-side end is eth0 in ``netns``.
    host_veth: str
    address: str
    pod_subnet: str

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"

    def enter(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in this node's network namespace (and nothing else of it changed)."""
        return ["nsenter", f"--net={self.netns_path}", "--", *argv]


@dataclass(frozen=True)
class ClusterNet:
    """The network of one cluster's real nodes."""

    octet: int
    bridge: str
    gateway: str
    prefix_len: int
    pod_cidr: str
    nodes: tuple[NodeNet, ...]

    def node(self, name: str) -> NodeNet:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


def plan(octet: int, names: Sequence[str]) -> ClusterNet:
    """Names and addresses for ``names`` (in order) in ``10.<octet>.0.0/16``."""
    if not 1 <= octet <= 254:
        raise ValueError(f"second octet {octet} is outside 1-254")
    if len(names) > MAX_NODES:
        raise ValueError(f"{len(names)} real nodes; one cluster network holds {MAX_NODES}")
    net = f"knr{octet}"
    nodes = tuple(
        NodeNet(
            name=name,
            index=i,
            netns=f"{net}n{i}",
            host_veth=f"{net}v{i}",
            address=f"10.{octet}.{NODE_NETWORK_OCTET}.{i + 2}",
            pod_subnet=f"10.{octet}.{i}.0/24",
        )
        for i, name in enumerate(names)
    )
    return ClusterNet(
        octet=octet,
        bridge=net,
        gateway=f"10.{octet}.{NODE_NETWORK_OCTET}.1",
        prefix_len=24,
        pod_cidr=f"10.{octet}.0.0/16",
        nodes=nodes,
    )


def setup_commands(net: ClusterNet) -> list[list[str]]:
    """The ``ip`` commands that make ``net``, in order; each node's last."""
    cmds = [
        ["ip", "link", "add", net.bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{net.gateway}/{net.prefix_len}", "dev", net.bridge],
        ["ip", "link", "set", net.bridge, "up"],
    ]
    for node in net.nodes:
        ns = ["ip", "-n", node.netns]
        cmds += [
            ["ip", "netns", "add", node.netns],
            # The node's end is created in its namespace directly, named as a machine's NIC.
            [
                *("ip", "link", "add", node.host_veth, "type", "veth"),
                *("peer", "name", "eth0", "netns", node.netns),
            ],
            ["ip", "link", "set", node.host_veth, "master", net.bridge, "up"],
            [*ns, "link", "set", "lo", "up"],
            [*ns, "addr", "add", f"{node.address}/{net.prefix_len}", "dev", "eth0"],
            [*ns, "link", "set", "eth0", "up"],
            [*ns, "route", "add", "default", "via", net.gateway],
            ["ip", "route", "add", node.pod_subnet, "via", node.address, "dev", net.bridge],
        ]
        for other in net.nodes:
            if other is not node:
                cmds.append([*ns, "route", "add", other.pod_subnet, "via", other.address])
    return cmds


def run(cmd: Sequence[str]) -> None:
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30.0, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NodeNetError(f"`{' '.join(cmd)}`: {e}") from e
    if done.returncode != 0:
        raise NodeNetError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()}")


def create(net: ClusterNet) -> None:
    """Makes ``net`` on the machine (record it first: a failure part-way leaves part of it)."""
    for cmd in setup_commands(net):
        run(cmd)


def netns_pids(netns: str) -> set[int]:
    """The processes in the named network namespace (``ip netns pids``)."""
    try:
        out = subprocess.run(
            ["ip", "netns", "pids", netns], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return set()
    return {int(p) for p in out.split() if p.isdigit()}


def run_quietly(cmd: Sequence[str]) -> None:
    """``cmd`` for its effect only: an undo that finds nothing to undo is not an error."""
    subprocess.run(
        list(cmd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


def delete_netns(netns: str) -> None:
    """Deletes the namespace; its eth0 goes with it, and so does the veth's other end."""
    run_quietly(["ip", "netns", "delete", netns])
