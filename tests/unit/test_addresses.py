"""The simulated nodes' addresses: every node of a cluster past Kubernetes' 5,000-node limit
gets its own InternalIP and pod range, clear of the Service range and the real-node networks."""

from __future__ import annotations

import ipaddress
import itertools

import pytest

from dev.localcluster import addresses
from dev.localcluster.cluster import SERVICE_CIDR

SIZE = 5_000  # Kubernetes' largest supported cluster


def test_there_is_room_for_the_largest_cluster_kubernetes_supports() -> None:
    assert addresses.MAX_NODES >= SIZE


def test_the_first_node_keeps_the_address_it_always_had() -> None:
    assert addresses.node_ip(0) == "10.0.0.10"
    assert addresses.node_ip(246) == "10.0.1.0"  # where the old scheme ran out


def test_every_node_has_its_own_address_and_pod_range() -> None:
    ips = {addresses.node_ip(i) for i in range(addresses.MAX_NODES)}
    cidrs = [ipaddress.ip_network(addresses.node_pod_cidr(i)) for i in range(addresses.MAX_NODES)]
    assert len(ips) == len({str(c) for c in cidrs}) == addresses.MAX_NODES
    cluster = ipaddress.ip_network(addresses.CLUSTER_CIDR)
    assert all(c.subnet_of(cluster) and c.prefixlen == addresses.NODE_CIDR_MASK for c in cidrs)
    # Adjacent ranges never overlap, so no two nodes' ranges do (they are sorted).
    assert all(a.broadcast_address < b.network_address for a, b in itertools.pairwise(cidrs))


def test_a_nodes_range_holds_the_pods_a_kubelet_runs_by_default() -> None:
    assert ipaddress.ip_network(addresses.node_pod_cidr(4_999)).num_addresses - 2 >= 110


def test_the_ranges_stay_clear_of_services_and_of_real_node_networks() -> None:
    nodes = addresses.NODE_NETWORK
    pods = ipaddress.ip_network(addresses.CLUSTER_CIDR)
    services = ipaddress.ip_network(SERVICE_CIDR)
    real = [ipaddress.ip_network(f"10.{octet}.0.0/16") for octet in range(200, 255)]
    for a, b in [(nodes, pods), (nodes, services), (pods, services)]:
        assert not a.overlaps(b), (a, b)
    assert not any(r.overlaps(nodes) or r.overlaps(pods) for r in real)
    last = ipaddress.ip_address(addresses.node_ip(addresses.MAX_NODES - 1))
    assert last in nodes


@pytest.mark.parametrize("index", [-1, addresses.MAX_NODES])
def test_a_node_past_the_scheme_is_a_clear_error(index: int) -> None:
    with pytest.raises(addresses.AddressError, match="room for 8192 nodes"):
        addresses.node_ip(index)
    with pytest.raises(addresses.AddressError):
        addresses.node_pod_cidr(index)
