"""The real nodes' configuration files, as values: what each promises the machine.

The e2e tests (tests/e2e/test_real_nodes.py, test_cluster_network.py) run them; these say,
without root or a cluster, that a node keeps to its own directory and network namespace,
masquerades nothing out of the cluster, reaches past its node in nothing machine-wide, and that
a fault is a change of one file.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from dev.localcluster import hostchanges, nodenet, realnode
from dev.localcluster.nodeimages import PAUSE_IMAGE


def layout(base: Path = realnode.NODE_ROOT / "knr200", index: int = 0) -> realnode.NodeLayout:
    net = nodenet.plan(200, [f"real-{i}" for i in range(index + 1)])
    return realnode.NodeLayout(
        name=f"real-{index}",
        directory=base / f"n{index}",
        bridge=f"knr200n{index}",
        cgroup_root=f"/kn-rescheduler-200/real-{index}",
        net=net.nodes[index],
    )


def test_containerd_keeps_everything_in_the_nodes_directory() -> None:
    node = layout()
    config = tomllib.loads(realnode.containerd_config(node))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    paths = [
        config["root"],
        config["state"],
        config["grpc"]["address"],
        config["ttrpc"]["address"],
        config["plugins"]["io.containerd.internal.v1.opt"]["path"],
        runc["BinaryName"],
        runc["Root"],
        cri["cni"]["conf_dir"],
        cri["registry"]["config_path"],
    ]
    assert all(p.startswith(f"{node.directory}/") for p in paths), paths
    assert cri["sandbox_image"] == PAUSE_IMAGE
    assert cri["netns_mounts_under_state_dir"] is True
    assert runc["SystemdCgroup"] is False


def test_the_sockets_fit_a_unix_socket_path() -> None:
    # sun_path holds 108 bytes with its NUL; the kubelet's pod-resources socket is the longest.
    longest = layout().directory / "kubelet" / "root" / "pod-resources" / ("9" * 10)
    assert len(str(longest)) < 108
    assert len(f"{layout().socket}.ttrpc") < 108


def test_the_bridge_masquerades_nothing_and_keeps_its_ipam_in_the_node() -> None:
    node = layout()
    plugin = json.loads(realnode.cni_config(node, "knr200"))["plugins"][0]
    assert plugin["type"] == "bridge"
    assert plugin["bridge"] == "knr200n0"
    assert plugin["ipMasq"] is False
    # Pods route through their node: to other nodes' pods, the machine and Services.
    assert plugin["isDefaultGateway"] is True
    assert plugin["ipam"]["dataDir"].startswith(str(node.directory))
    assert plugin["ipam"]["ranges"] == [[{"subnet": "10.200.0.0/24"}]]
    assert len(node.bridge) <= 15  # IFNAMSIZ


def test_a_broken_cni_names_a_plugin_that_does_not_exist() -> None:
    plugin = json.loads(realnode.cni_config(layout(), "knr200", broken=True))["plugins"][0]
    assert not (Path(realnode.CNI_BIN_DIR) / plugin["type"]).exists()


def test_the_mirror_is_plain_http_to_the_given_address() -> None:
    hosts = tomllib.loads(realnode.hosts_toml("127.0.0.1:5000"))
    assert hosts["server"] == "http://127.0.0.1:5000"
    assert hosts["host"]["http://127.0.0.1:5000"]["capabilities"] == ["pull", "resolve"]


def test_the_kubelet_serves_on_its_node_address_with_authentication() -> None:
    config = realnode.kubelet_config(layout(index=1), ca_file=Path("/ca.crt"), eviction_hard=None)
    assert config["address"] == "10.200.255.3"
    assert config["port"] == 10250
    assert config["failCgroupV1"] is False
    assert config["readOnlyPort"] == 0
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert config["containerRuntimeEndpoint"] == f"unix://{layout(index=1).socket}"
    assert config["cgroupRoot"] == "/kn-rescheduler-200/real-1"


def test_the_kubelet_points_pods_at_the_cluster_dns_and_keeps_their_logs_in_the_node() -> None:
    config = realnode.kubelet_config(layout(), ca_file=Path("/ca.crt"), eviction_hard=None)
    assert config["clusterDNS"] == ["10.96.0.10"]
    assert config["clusterDomain"] == "cluster.local"
    assert config["podLogsDir"].startswith(f"{layout().directory}/")


def test_kube_proxy_writes_iptables_and_leaves_machine_wide_conntrack_alone() -> None:
    config = realnode.kube_proxy_config(layout(index=1), cluster_cidr="10.200.0.0/16")
    assert config["mode"] == "iptables"
    assert config["hostnameOverride"] == "real-1"
    assert config["clusterCIDR"] == "10.200.0.0/16"
    # nf_conntrack_max is one for the whole machine: 0 leaves it (and each timeout) alone.
    conntrack = config["conntrack"]
    assert conntrack["maxPerCore"] == 0
    assert conntrack["min"] == 0
    assert {conntrack[k] for k in conntrack if k.endswith("Timeout")} == {"0s"}
    assert config["oomScoreAdj"] == 0
    assert config["clientConnection"]["kubeconfig"].startswith(f"{layout(index=1).directory}/")


def test_a_pods_service_connection_keeps_its_address_where_bridged_traffic_is_filtered(
    tmp_path: Path,
) -> None:
    # NetworkPolicies select senders by pod address: masquerading every Service connection
    # would make each sender its node. Only a machine without br_netfilter needs it.
    config = realnode.kube_proxy_config(layout(index=1), cluster_cidr="10.200.0.0/16")
    assert config["iptables"]["masqueradeAll"] is False
    forced = realnode.kube_proxy_config(
        layout(index=1), cluster_cidr="10.200.0.0/16", masquerade_all=True
    )
    assert forced["iptables"]["masqueradeAll"] is True
    on, off = tmp_path / "on", tmp_path / "off"
    on.write_text("1\n")
    off.write_text("0\n")
    assert realnode.bridged_traffic_filtered(on) is True
    assert realnode.bridged_traffic_filtered(off) is False
    assert realnode.bridged_traffic_filtered(tmp_path / "absent") is False


def test_memory_pressure_stays_below_capacity_so_the_kubelet_accepts_it() -> None:
    threshold = realnode.pressure_thresholds("memory-pressure")["memory.available"]
    assert threshold.endswith("Ki")
    assert 0 < int(threshold[:-2]) < realnode.memory_total_ki()


def test_disk_pressure_asks_for_more_free_disk_than_any_machine_has() -> None:
    thresholds = realnode.pressure_thresholds("disk-pressure")
    assert thresholds["nodefs.available"] == "99%"
    assert realnode.pressure_thresholds("")["nodefs.available"] == "1%"


@pytest.mark.parametrize(
    ("taken", "expected"), [(set(), 200), ({200, 201}, 202), (set(range(200, 254)), 254)]
)
def test_each_cluster_gets_a_range_nobody_routes(taken: set[int], expected: int) -> None:
    assert realnode.pick_cluster_octet(taken) == expected


def test_no_range_left_is_a_clear_error() -> None:
    with pytest.raises(realnode.RealNodeError, match="no free"):
        realnode.pick_cluster_octet(set(range(200, 255)))


def test_a_record_survives_a_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostchanges, "RECORD_DIR", tmp_path)
    record = hostchanges.HostRecord(
        owner_pid=1,
        owner_start=2,
        workdir="/var/lib/kn-rescheduler/real-nodes/knr200",
        bridges=("knr200n0",),
        cgroup_roots=("/kn-rescheduler-200",),
        cni_networks=("knr200",),
        runtime_sockets=("/x.sock",),
        sysctls={"vm/overcommit_memory": "0"},
        created_dirs=("/run/containerd/s",),
        netns=("knr200n0", "knr200n1"),
    )
    record.write()
    assert hostchanges.records() == [record]


def test_a_record_of_a_live_process_started_later_is_not_its_owner() -> None:
    # A reused pid: alive, but not the process that wrote the record.
    me = os.getpid()
    record = hostchanges.HostRecord(me, hostchanges.start_time(me) + 1, "/x", (), (), (), ())
    assert not hostchanges.owner_alive(record)
    assert hostchanges.owner_alive(
        hostchanges.HostRecord(me, hostchanges.start_time(me), "/x", (), (), (), ())
    )
