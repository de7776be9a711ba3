"""The real nodes' network plan: names and addresses in, ``ip`` commands out.

tests/e2e/test_cluster_network.py runs the plan on the machine; these say, without root, that
nodes and clusters never share a name or an address, and that every node reaches every other
node's pods, and the machine every node's pods.
"""

from __future__ import annotations

import ipaddress

import pytest

from dev.localcluster import nodenet


def test_each_node_has_its_own_namespace_address_and_pod_range() -> None:
    net = nodenet.plan(201, ["real-0", "real-1", "real-2"])
    assert [n.netns for n in net.nodes] == ["knr201n0", "knr201n1", "knr201n2"]
    assert [n.address for n in net.nodes] == ["10.201.255.2", "10.201.255.3", "10.201.255.4"]
    assert [n.pod_subnet for n in net.nodes] == ["10.201.0.0/24", "10.201.1.0/24", "10.201.2.0/24"]
    assert net.gateway == "10.201.255.1"
    assert net.node("real-2").index == 2


def test_every_address_is_inside_the_clusters_range_and_none_overlaps() -> None:
    net = nodenet.plan(202, [f"real-{i}" for i in range(nodenet.MAX_NODES)])
    cluster = ipaddress.ip_network(net.pod_cidr)
    node_net = ipaddress.ip_network(f"{net.gateway}/{net.prefix_len}", strict=False)
    subnets = [ipaddress.ip_network(n.pod_subnet) for n in net.nodes]
    assert all(s.subnet_of(cluster) for s in subnets)  # type: ignore[arg-type]
    assert not any(s.overlaps(node_net) for s in subnets)
    assert len({n.address for n in net.nodes}) == nodenet.MAX_NODES
    assert all(ipaddress.ip_address(n.address) in node_net for n in net.nodes)
    # Interface names fit IFNAMSIZ (15 characters) at the largest octet and node index.
    assert max(len(n.host_veth) for n in nodenet.plan(254, ["x"] * 253).nodes) <= 15


def test_two_clusters_share_no_name_and_no_address() -> None:
    a, b = nodenet.plan(200, ["real-0", "real-1"]), nodenet.plan(201, ["real-0", "real-1"])
    names = lambda n: {n.bridge, *(x.netns for x in n.nodes), *(x.host_veth for x in n.nodes)}  # noqa: E731
    assert not names(a) & names(b)
    assert not ipaddress.ip_network(a.pod_cidr).overlaps(ipaddress.ip_network(b.pod_cidr))


def test_every_node_routes_to_every_other_nodes_pods_and_the_machine_to_all() -> None:
    net = nodenet.plan(200, ["real-0", "real-1", "real-2"])
    cmds = nodenet.setup_commands(net)
    for node in net.nodes:
        for other in net.nodes:
            route = ["ip", "-n", node.netns, "route", "add", other.pod_subnet, "via", other.address]
            assert (route in cmds) == (other is not node)
        host = ["ip", "route", "add", node.pod_subnet, "via", node.address, "dev", net.bridge]
        assert host in cmds
        assert ["ip", "-n", node.netns, "route", "add", "default", "via", net.gateway] in cmds


def test_the_bridge_exists_before_anything_is_attached_to_it() -> None:
    cmds = nodenet.setup_commands(nodenet.plan(200, ["real-0"]))
    made = cmds.index(["ip", "link", "add", "knr200", "type", "bridge"])
    attached = cmds.index(["ip", "link", "set", "knr200v0", "master", "knr200", "up"])
    assert made < attached


def test_a_node_process_changes_only_its_network_namespace() -> None:
    node = nodenet.plan(200, ["real-0"]).nodes[0]
    # nsenter --net: not `ip netns exec`, which also unshares the mount namespace (the
    # kubelet's volume mounts would then be invisible to containerd).
    assert node.enter(["kubelet", "--v=1"]) == [
        "nsenter",
        "--net=/run/netns/knr200n0",
        "--",
        "kubelet",
        "--v=1",
    ]


@pytest.mark.parametrize("octet", [0, 255])
def test_an_octet_outside_the_range_is_refused(octet: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        nodenet.plan(octet, ["real-0"])


def test_more_nodes_than_the_network_holds_is_refused() -> None:
    with pytest.raises(ValueError, match="holds 253"):
        nodenet.plan(200, ["x"] * 254)
