"""What the local node-exporter endpoints serve for a Node, and the scrape configuration that
labels them, checked by parsing the text back as Prometheus' client library does."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dev.localcluster.keys import (
    SIM_CPU_USAGE_ANNOTATION,
    SIM_MEMORY_USAGE_ANNOTATION,
)
from dev.localcluster.nodeexporter import (
    CPU_MODES,
    DEFAULT_CPU_USAGE,
    DEFAULT_MEMORY_USAGE,
    CpuTimes,
    NodeExporter,
    SimNode,
    advance,
    exposition,
    sim_node,
    usage_fraction,
)
from dev.localcluster.prometheus import SECOND_JOB, argv, config, target_groups
from dev.localcluster.rest import Rest

JSON = dict[str, Any]

# A kwok node as a kubelet registers it and kwok keeps it (status trimmed to what matters here
# plus the fields around it, so a reader that looked in the wrong place would fail).
NODE: JSON = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "node-2",
        "resourceVersion": "4711",
        "labels": {"kubernetes.io/hostname": "node-2", "kubernetes.io/os": "linux"},
        "annotations": {
            "kwok.x-k8s.io/node": "fake",
            "node.alpha.kubernetes.io/ttl": "0",
        },
    },
    "spec": {"podCIDR": "10.244.2.0/24", "podCIDRs": ["10.244.2.0/24"]},
    "status": {
        "capacity": {"cpu": "8", "memory": "32873196Ki", "pods": "110"},
        "allocatable": {"cpu": "7800m", "memory": "32158316Ki", "pods": "110"},
        "addresses": [
            {"type": "Hostname", "address": "node-2"},
            {"type": "InternalIP", "address": "10.0.0.12"},
        ],
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
        ],
        "nodeInfo": {
            "architecture": "amd64",
            "kernelVersion": "6.8.0-60-generic",
            "kubeletVersion": "v1.36.3",
            "operatingSystem": "linux",
            "osImage": "Ubuntu 24.04.2 LTS",
        },
    },
}
MEMORY_BYTES = 32873196 * 1024


def node_with(annotations: dict[str, str] | None = None, **capacity: str) -> JSON:
    node = copy.deepcopy(NODE)
    node["metadata"]["annotations"].update(annotations or {})
    node["status"]["capacity"].update(capacity)
    return node


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


# -- reading the Node ---------------------------------------------------------------------------


def test_a_node_without_usage_annotations_is_quiet_with_its_capacity_and_address() -> None:
    assert sim_node(NODE) == SimNode(
        name="node-2",
        internal_ip="10.0.0.12",
        cpus=8,
        memory_bytes=MEMORY_BYTES,
        cpu_usage=DEFAULT_CPU_USAGE,
        memory_usage=DEFAULT_MEMORY_USAGE,
        kernel_version="6.8.0-60-generic",
        architecture="amd64",
    )


@pytest.mark.parametrize(
    ("raw", "usage", "problem"),
    [
        (None, 0.42, None),
        ("0.9", 0.9, None),
        (" 0.25 ", 0.25, None),
        ("1", 1.0, None),
        ("0", 0.0, None),
        ("1.5", 1.0, None),  # clamped: a node is at most fully busy
        ("-0.2", 0.0, None),
        ("90%", 0.42, "not a number: '90%'"),
        ("nan", 0.42, "not a number: 'nan'"),
        ("", 0.42, "not a number: ''"),
    ],
)
def test_a_usage_annotation_reads_as_a_fraction_of_zero_to_one(
    raw: str | None, usage: float, problem: str | None
) -> None:
    assert usage_fraction(raw, 0.42) == (usage, problem)


def test_the_usage_annotations_set_the_nodes_cpu_and_memory_usage() -> None:
    node = sim_node(
        node_with({SIM_CPU_USAGE_ANNOTATION: "0.9", SIM_MEMORY_USAGE_ANNOTATION: "0.75"})
    )

    assert (node.cpu_usage, node.memory_usage, node.problems) == (0.9, 0.75, ())


def test_a_usage_annotation_that_is_not_a_number_leaves_the_default_and_says_why() -> None:
    node = sim_node(node_with({SIM_CPU_USAGE_ANNOTATION: "high"}))

    assert node.cpu_usage == DEFAULT_CPU_USAGE
    assert node.problems == (f"{SIM_CPU_USAGE_ANNOTATION}: not a number: 'high'",)


@pytest.mark.parametrize(
    ("cpu", "cpus"),
    [("8", 8), ("96", 96), ("7800m", 8), ("1500m", 2), ("500m", 1), ("0", 1)],
)
def test_the_cpu_capacity_gives_the_number_of_cpus_node_exporter_lists(cpu: str, cpus: int) -> None:
    assert sim_node(node_with(cpu=cpu)).cpus == cpus


@pytest.mark.parametrize(
    ("memory", "bytes_"),
    [("32873196Ki", MEMORY_BYTES), ("16Gi", 16 * 2**30), ("8G", 8 * 10**9), ("1048576", 2**20)],
)
def test_the_memory_capacity_is_memtotal_in_bytes(memory: str, bytes_: int) -> None:
    assert sim_node(node_with(memory=memory)).memory_bytes == bytes_


def test_a_node_without_an_internal_ip_has_no_address() -> None:
    node = copy.deepcopy(NODE)
    node["status"]["addresses"] = [{"type": "Hostname", "address": "node-2"}]

    assert sim_node(node).internal_ip == ""


# -- the CPU counters ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("usage", "seconds", "expected"),
    [
        (0.1, 10.0, CpuTimes(idle=9.0, user=0.8, system=0.2)),
        (0.9, 10.0, CpuTimes(idle=1.0, user=7.2, system=1.8)),
        (0.0, 5.0, CpuTimes(idle=5.0)),
        (1.0, 5.0, CpuTimes(user=4.0, system=1.0)),
        (0.5, 0.0, CpuTimes()),
        (0.5, -3.0, CpuTimes()),  # a clock read out of order never runs a counter back
    ],
)
def test_each_second_a_cpu_spends_usage_busy_and_the_rest_idle(
    usage: float, seconds: float, expected: CpuTimes
) -> None:
    got = advance(CpuTimes(), usage, seconds)

    assert got.idle == pytest.approx(expected.idle)
    assert got.user == pytest.approx(expected.user)
    assert got.system == pytest.approx(expected.system)


def test_counters_keep_growing_from_where_they_were() -> None:
    start = CpuTimes(idle=1000.0, user=50.0, system=10.0)

    got = advance(start, 0.5, 2.0)

    assert (got.idle, got.user, got.system) == pytest.approx((1001.0, 50.8, 10.2))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def exporter(clock: Clock) -> NodeExporter:
    # Never started: no call reaches this address; apply() takes the Nodes a watch would bring.
    rest = Rest("https://127.0.0.1:1", ca_file=Path("ca"), cert_file=Path("c"), key_file=Path("k"))
    return NodeExporter(rest, clock=clock)


def idle_seconds(text: str, cpu: str = "0") -> float:
    samples = families(text)["node_cpu_seconds"].samples
    return next(s.value for s in samples if s.labels == {"cpu": cpu, "mode": "idle"})


def test_a_new_usage_counts_from_the_moment_the_node_changed_not_from_the_last_scrape() -> None:
    clock = Clock()
    ex = exporter(clock)
    ex.apply(NODE)  # quiet: 10 % busy
    clock.now += 10
    assert ex.apply(node_with({SIM_CPU_USAGE_ANNOTATION: "0.9"})) is False  # same node, same IP
    clock.now += 10

    text = ex.scrape("node-2")

    assert text is not None
    assert idle_seconds(text) == pytest.approx(10 * 0.9 + 10 * 0.1)


def test_the_exporter_follows_nodes_that_come_go_and_change_address() -> None:
    clock = Clock()
    ex = exporter(clock)
    other = copy.deepcopy(NODE)
    other["metadata"]["name"] = "node-3"

    assert ex.apply(NODE) is True
    assert ex.apply(other) is True
    moved = node_with()
    moved["status"]["addresses"][1]["address"] = "10.0.0.99"
    assert ex.apply(moved) is True
    assert [(n.name, n.internal_ip) for n in ex.nodes()] == [
        ("node-2", "10.0.0.99"),
        ("node-3", "10.0.0.12"),
    ]
    assert ex.forget("node-3") is True
    assert ex.forget("node-3") is False
    assert ex.scrape("node-3") is None
    assert [n.name for n in ex.nodes()] == ["node-2"]


# -- the exposition text ------------------------------------------------------------------------


def busy_node(**overrides: Any) -> SimNode:
    base: dict[str, Any] = {
        "name": "node-2",
        "internal_ip": "10.0.0.12",
        "cpus": 2,
        "memory_bytes": 16 * 2**30,
        "cpu_usage": 0.75,
        "memory_usage": 0.6,
        "kernel_version": "6.8.0-60-generic",
        "architecture": "amd64",
    }
    return SimNode(**(base | overrides))


def test_the_text_has_node_exporters_metric_names_types_and_labels() -> None:
    text = exposition(busy_node(), CpuTimes(idle=90.0, user=8.0, system=2.0))

    got = families(text)

    assert {name: f.type for name, f in got.items()} == {
        "node_cpu_seconds": "counter",
        "node_load1": "gauge",
        "node_load5": "gauge",
        "node_load15": "gauge",
        "node_memory_Active_file_bytes": "gauge",
        "node_memory_Buffers_bytes": "gauge",
        "node_memory_Cached_bytes": "gauge",
        "node_memory_Inactive_file_bytes": "gauge",
        "node_memory_MemAvailable_bytes": "gauge",
        "node_memory_MemFree_bytes": "gauge",
        "node_memory_MemTotal_bytes": "gauge",
        "node_uname_info": "gauge",
    }
    cpu = got["node_cpu_seconds"].samples
    assert {s.name for s in cpu} == {"node_cpu_seconds_total"}
    assert [(s.labels["cpu"], s.labels["mode"]) for s in cpu] == [
        (c, m) for c in ("0", "1") for m in CPU_MODES
    ]
    by_mode = {s.labels["mode"]: s.value for s in cpu if s.labels["cpu"] == "1"}
    assert by_mode == {
        "idle": 90.0,
        "iowait": 0.0,
        "irq": 0.0,
        "nice": 0.0,
        "softirq": 0.0,
        "steal": 0.0,
        "system": 2.0,
        "user": 8.0,
    }
    (uname,) = got["node_uname_info"].samples
    assert uname.value == 1
    assert uname.labels == {
        "domainname": "(none)",
        "machine": "x86_64",
        "nodename": "node-2",
        "release": "6.8.0-60-generic",
        "sysname": "Linux",
        "version": "",
    }


def test_memory_available_is_the_unused_share_and_the_classic_fields_add_up_to_it() -> None:
    got = families(exposition(busy_node(memory_usage=0.6), CpuTimes()))

    def value(name: str) -> float:
        (sample,) = got[f"node_memory_{name}_bytes"].samples
        return float(sample.value)

    total = 16 * 2**30
    assert value("MemTotal") == total
    assert value("MemAvailable") == pytest.approx(total * 0.4)
    assert value("MemFree") + value("Buffers") + value("Cached") == pytest.approx(total * 0.4)
    assert value("Active_file") + value("Inactive_file") == pytest.approx(value("Cached"))
    assert 0 < value("MemFree") < value("MemAvailable")


@pytest.mark.parametrize(("cpus", "usage", "load"), [(2, 0.75, 1.5), (8, 0.1, 0.8), (4, 0, 0)])
def test_the_load_average_is_the_cpus_times_the_usage(cpus: int, usage: float, load: float) -> None:
    got = families(exposition(busy_node(cpus=cpus, cpu_usage=usage), CpuTimes()))

    for name in ("node_load1", "node_load5", "node_load15"):
        assert got[name].samples[0].value == pytest.approx(load)


def test_a_label_value_with_quotes_and_backslashes_is_escaped() -> None:
    text = exposition(busy_node(kernel_version='6.8 "custom" \\ build'), CpuTimes())

    (uname,) = families(text)["node_uname_info"].samples

    assert uname.labels["release"] == '6.8 "custom" \\ build'


# -- the scrape configuration -------------------------------------------------------------------


def test_each_node_is_a_target_with_its_path_node_name_and_internal_ip_instance() -> None:
    nodes = [busy_node(name="node-1", internal_ip="10.0.0.11"), busy_node(name="node-0")]

    groups = target_groups(nodes, "127.0.0.1:40123")

    assert groups == [
        {
            "targets": ["127.0.0.1:40123"],
            "labels": {
                "__metrics_path__": "/metrics/node-0",
                "node": "node-0",
                "instance": "10.0.0.12:9100",
            },
        },
        {
            "targets": ["127.0.0.1:40123"],
            "labels": {
                "__metrics_path__": "/metrics/node-1",
                "node": "node-1",
                "instance": "10.0.0.11:9100",
            },
        },
    ]
    json.dumps(groups)  # what file_sd reads


def test_a_node_without_an_address_keeps_prometheus_default_instance() -> None:
    (group,) = target_groups([busy_node(internal_ip="")], "127.0.0.1:40123")

    assert "instance" not in group["labels"]


def test_prometheus_scrapes_one_job_every_second_from_the_targets_file() -> None:
    cfg = config(Path("/w/prometheus/targets.json"))

    assert cfg["global"] == {"scrape_interval": "1s", "scrape_timeout": "1s"}
    (job,) = cfg["scrape_configs"]
    assert job["job_name"] == "node-exporter"
    assert job["file_sd_configs"][0]["files"] == ["/w/prometheus/targets.json"]


def test_a_large_cluster_is_scraped_at_the_interval_it_asks_for_every_job() -> None:
    cfg = config(Path("/w/prometheus/targets.json"), second_job=True, scrape_interval="15s")

    # A scrape that runs past the interval is cut there, as Prometheus requires.
    assert cfg["global"] == {"scrape_interval": "15s", "scrape_timeout": "15s"}
    assert len(cfg["scrape_configs"]) == 2
    assert all("scrape_interval" not in job for job in cfg["scrape_configs"])


def test_a_second_job_scrapes_the_same_targets_file_under_another_job_name() -> None:
    cfg = config(Path("/w/prometheus/targets.json"), second_job=True)

    first, second = cfg["scrape_configs"]
    assert (first["job_name"], second["job_name"]) == ("node-exporter", SECOND_JOB)
    # The same targets with the same labels: each series twice, differing only in `job`.
    assert first["file_sd_configs"] == second["file_sd_configs"]


def test_prometheus_listens_on_loopback_only_with_its_data_in_the_work_directory() -> None:
    args = argv("/usr/bin/prometheus", Path("/w/p.yml"), Path("/w/data"), 40999)

    assert args[0] == "/usr/bin/prometheus"
    assert "--web.listen-address=127.0.0.1:40999" in args
    assert "--storage.tsdb.path=/w/data" in args
    assert "--config.file=/w/p.yml" in args
