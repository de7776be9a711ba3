"""The local cluster's Prometheus is a real one, scraping a node-exporter endpoint per node.

label-nodes and its tests query this server over the Prometheus HTTP API exactly as they would
query a production one, so these tests pin down what they rely on: every node is a target with
the labels a real cluster's scrape configuration gives (``node``, ``instance`` = InternalIP:9100),
a usage set on a Node shows up in the usual PromQL within a few scrapes while the other nodes
stay quiet, nodes that come and go are followed, an outage ends on the same URL, and no
Prometheus process outlives its cluster.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests

from dev.localcluster import Cluster
from dev.localcluster.__main__ import cluster_processes
from dev.localcluster.keys import (
    SIM_CPU_USAGE_ANNOTATION,
    SIM_MEMORY_USAGE_ANNOTATION,
)
from dev.localcluster.procs import cmdline, pid_alive
from dev.localcluster.prometheus import LocalPrometheus, find_binary
from dev.stack.functions import free_port
from shared.nodes.annotate_usage.decide import Measured
from shared.nodes.annotate_usage.sources import PrometheusSource
from shared.platform.prometheus import Prometheus
from tests.e2e import conftest as e2e

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# The CPU usage as most node dashboards and alert rules compute it, over a short window (the
# local scrape interval is 1 s).
CPU_USAGE = '1 - avg by (node) (rate(node_cpu_seconds_total{mode="idle"}[10s]))'
MEMORY_USAGE = "1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes"
# A node nobody set a usage on (localcluster.nodeexporter's defaults).
QUIET_CPU = 0.1
QUIET_MEMORY = 0.2


# Prometheus scrapes within seconds: half the e2e suite's patience is plenty.
wait_for = partial(e2e.wait_for, timeout=30.0)


def _http() -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    return s


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """The instant vector ``promql`` evaluates to now, through the HTTP API."""
    resp = _http().get(f"{url}/api/v1/query", params={"query": promql}, timeout=5)
    resp.raise_for_status()
    body = resp.json()
    assert body["status"] == "success", body
    assert body["data"]["resultType"] == "vector", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def per_node(url: str, promql: str) -> dict[str, float]:
    return {r["metric"]["node"]: float(r["value"][1]) for r in query(url, promql)}


def near(values: dict[str, float], nodes: list[str], expected: dict[str, float]) -> bool:
    """Every node has a value, each within 0.03 of what it should be."""
    return set(values) >= set(nodes) and all(
        abs(values[n] - expected.get(n, values[n])) < 0.03 for n in nodes
    )


@pytest.fixture
def usage_reset(cluster: Cluster) -> Iterator[None]:
    """Takes every simulated usage off the session's nodes afterwards (other tests share them)."""
    yield
    unset = {SIM_CPU_USAGE_ANNOTATION: None, SIM_MEMORY_USAGE_ANNOTATION: None}
    for node in cluster.nodes:
        cluster.rest.patch(f"/api/v1/nodes/{node}", {"metadata": {"annotations": unset}})


def test_prometheus_scrapes_every_node_labelled_with_its_node_name_and_internal_ip(
    cluster: Cluster,
) -> None:
    ips = {}
    for node in cluster.nodes:
        addresses = cluster.rest.get(f"/api/v1/nodes/{node}")["status"]["addresses"]
        ips[node] = next(a["address"] for a in addresses if a["type"] == "InternalIP")

    up = query(cluster.prometheus_url, "up")

    assert {r["metric"]["node"]: r["value"][1] for r in up} == {n: "1" for n in cluster.nodes}
    for r in up:
        node = r["metric"]["node"]
        assert r["metric"] == {
            "__name__": "up",
            "job": "node-exporter",
            "node": node,
            "instance": f"{ips[node]}:9100",
        }


def test_the_node_exporter_metrics_carry_the_nodes_capacity(cluster: Cluster) -> None:
    node = cluster.nodes[0]
    capacity = cluster.rest.get(f"/api/v1/nodes/{node}")["status"]["capacity"]
    assert capacity["memory"].endswith("Ki")
    memory_bytes = int(capacity["memory"][:-2]) * 1024

    total = per_node(cluster.prometheus_url, "node_memory_MemTotal_bytes")
    cpus = per_node(cluster.prometheus_url, 'count by (node) (node_cpu_seconds_total{mode="idle"})')
    kernel = query(cluster.prometheus_url, f'node_uname_info{{node="{node}"}}')

    assert total[node] == memory_bytes
    assert cpus[node] == int(capacity["cpu"])
    assert (
        kernel[0]["metric"]["release"]
        == cluster.rest.get(f"/api/v1/nodes/{node}")["status"]["nodeInfo"]["kernelVersion"]
    )


def test_a_nodes_cpu_usage_shows_in_promql_within_a_few_scrapes_and_the_others_stay_quiet(
    cluster: Cluster, usage_reset: None
) -> None:
    url, nodes = cluster.prometheus_url, cluster.nodes
    busy = nodes[1]
    # A series younger than the query's window reads too busy (rate() divides by the whole
    # window): wait until every node reads quiet, as a long-running cluster does.
    quiet = {n: QUIET_CPU for n in nodes}
    wait_for("every node to read quiet", lambda: near(per_node(url, CPU_USAGE), nodes, quiet))

    cluster.set_node_usage(busy, cpu=0.9)

    t0 = time.monotonic()
    values = wait_for(
        f"{busy}'s CPU usage over 0.85",
        lambda: (v := per_node(url, CPU_USAGE)).get(busy, 0) > 0.85 and v,
        timeout=20,
    )
    # Half the window at most: rate() shows the new slope well before the window is full.
    assert time.monotonic() - t0 < 10
    assert all(abs(values[n] - QUIET_CPU) < 0.03 for n in nodes if n != busy), values
    wait_for(
        f"{busy}'s CPU usage to settle at 0.9",
        lambda: near(per_node(url, CPU_USAGE), nodes, quiet | {busy: 0.9}),
        timeout=20,
    )
    # The load follows: a busy node's run queue is its CPUs times the usage.
    load = per_node(url, "node_load1")
    cpus = per_node(url, 'count by (node) (node_cpu_seconds_total{mode="idle"})')
    assert load[busy] == pytest.approx(cpus[busy] * 0.9)

    cluster.set_node_usage(busy, cpu=0.2)

    wait_for(
        f"{busy}'s CPU usage to fall to 0.2",
        lambda: near(per_node(url, CPU_USAGE), [busy], {busy: 0.2}),
        timeout=20,
    )


def test_a_nodes_memory_usage_shows_at_the_next_scrape_and_the_others_stay_quiet(
    cluster: Cluster, usage_reset: None
) -> None:
    url, nodes = cluster.prometheus_url, cluster.nodes
    full = nodes[2]
    cluster.set_node_usage(full, cpu=0.3)

    cluster.set_node_usage(full, memory=0.75)

    wait_for(
        f"{full}'s memory usage at 0.75",
        lambda: near(
            per_node(url, MEMORY_USAGE), nodes, {n: QUIET_MEMORY for n in nodes} | {full: 0.75}
        ),
        timeout=5,
    )
    # Older expressions add up the free, buffer and page-cache memory instead: same answer.
    classic = per_node(
        url,
        "1 - (node_memory_MemFree_bytes + node_memory_Buffers_bytes + node_memory_Cached_bytes)"
        " / node_memory_MemTotal_bytes",
    )
    assert classic[full] == pytest.approx(0.75)
    # cpu=None left the CPU usage alone.
    annotations = cluster.rest.get(f"/api/v1/nodes/{full}")["metadata"]["annotations"]
    assert annotations[SIM_MEMORY_USAGE_ANNOTATION] == "0.75"
    assert annotations[SIM_CPU_USAGE_ANNOTATION] == "0.3"


def test_set_node_usage_refuses_a_usage_outside_zero_to_one(cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="fraction"):
        cluster.set_node_usage(cluster.nodes[0], cpu=1.5)
    with pytest.raises(ValueError, match="fraction"):
        cluster.set_node_usage(cluster.nodes[0], memory=-0.1)


def test_a_node_registered_later_is_scraped_and_a_deleted_one_is_dropped(
    cluster: Cluster,
) -> None:
    url = cluster.prometheus_url
    name = "node-late-prometheus"
    template = cluster.rest.get(f"/api/v1/nodes/{cluster.nodes[0]}")
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {**template["metadata"]["labels"], "kubernetes.io/hostname": name},
            "annotations": {"kwok.x-k8s.io/node": "fake", SIM_CPU_USAGE_ANNOTATION: "0.5"},
        },
        # The session's other tests must not get pods here (the fake kubelet does not run it).
        "spec": {
            "unschedulable": True,
            "taints": [{"key": "kn-rescheduler.io/test", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "3800m", "memory": "15Gi", "pods": "110"},
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.250"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": template["status"]["nodeInfo"],
        },
    }
    cluster.rest.post("/api/v1/nodes", node)
    try:
        up = wait_for(
            f"{name} to be scraped",
            lambda: query(url, f'up{{node="{name}"}} == 1'),
            timeout=15,
        )
        assert up[0]["metric"]["instance"] == "10.0.0.250:9100"
        cpus = per_node(url, f'count by (node) (node_cpu_seconds_total{{node="{name}"}})')
        assert cpus == {name: 4 * 8}  # four CPUs, eight modes each
    finally:
        cluster.rest.delete(f"/api/v1/nodes/{name}")

    active = wait_for(
        f"{name} to leave the targets",
        lambda: (
            (t := cluster.prometheus.targets_up() if cluster.prometheus else {})
            and name not in t
            and t
        ),
        timeout=15,
    )
    assert set(active) == set(cluster.nodes)


def test_prometheus_stopped_then_started_again_serves_on_the_same_url_with_its_data(
    cluster: Cluster,
) -> None:
    url = cluster.prometheus_url
    samples = f'count_over_time(up{{node="{cluster.nodes[0]}"}}[1h])'
    before = float(query(url, samples)[0]["value"][1])

    cluster.stop_prometheus()

    assert cluster.prometheus_url == url
    with pytest.raises(requests.ConnectionError):
        _http().get(f"{url}/-/ready", timeout=2)

    cluster.start_prometheus()

    assert cluster.prometheus_url == url
    # A target's health turns "up" when it is scraped, a moment before the sample is
    # committed to the TSDB: wait for the query to see it.
    wait_for(
        "every node up in PromQL",
        lambda: {r["metric"]["node"] for r in query(url, "up == 1")} == set(cluster.nodes),
        timeout=15,
    )
    # The same TSDB: what was scraped before the outage is still there.
    assert float(query(url, samples)[0]["value"][1]) >= before


def _prometheus_pid(c: Cluster) -> int:
    pid = c.state()["prometheus_pid"]
    assert isinstance(pid, int)
    return pid


def test_stopping_the_cluster_leaves_no_prometheus_process(tmp_path: Path) -> None:
    workdir = tmp_path / "cluster"
    c = Cluster(workdir, nodes=1, quiet=True)
    c.start()
    try:
        pid = _prometheus_pid(c)
        url = c.prometheus_url
        assert pid_alive(pid)
        assert any(str(workdir) in a for a in cmdline(pid))
        # `make down` would find it by its command line, should the supervisor be gone.
        assert pid in cluster_processes(workdir, str(c.bins_dir))
    finally:
        c.stop()

    assert not pid_alive(pid)
    assert cluster_processes(workdir, str(c.bins_dir)) == []
    with pytest.raises(requests.ConnectionError):
        _http().get(f"{url}/-/ready", timeout=2)


_HARNESS = """
import sys, json, time
from dev.localcluster import Cluster
c = Cluster(sys.argv[1], nodes=1, quiet=True).start()
print(json.dumps(c.state()["prometheus_pid"]), flush=True)
time.sleep(600)
"""


def test_prometheus_dies_with_a_sigkilled_harness(tmp_path: Path) -> None:
    harness = subprocess.Popen(
        [sys.executable, "-c", _HARNESS, str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert harness.stdout is not None
        pid = json.loads(harness.stdout.readline())
        assert pid_alive(pid)
    finally:
        harness.send_signal(signal.SIGKILL)  # no finally, no atexit: only the kernel
        harness.wait()

    wait_for("prometheus to die with the harness", lambda: not pid_alive(pid), timeout=10)


def test_a_second_scrape_job_of_the_same_node_exporter_doubles_nothing_annotate_usage_reads(
    cluster: Cluster, usage_reset: None, tmp_path: Path
) -> None:
    """A production-like Prometheus (``second_job=True``): every node-exporter scraped by two
    jobs with the same ``instance`` and ``node``. annotate-usage's queries measure each node
    once; a ``sum by (instance, node)`` (what they were) measures it twice."""
    exporter = cluster.node_exporter
    assert exporter is not None
    (tmp_path / "logs").mkdir()
    twice = LocalPrometheus(
        tmp_path / "prometheus",
        tmp_path / "logs",
        free_port(),
        find_binary(),
        exporter,
        second_job=True,
    )
    twice.prepare()
    twice.write_targets(exporter.nodes())
    deadline = time.monotonic() + 60
    twice.start(deadline)
    try:
        twice.wait_scraped(cluster.nodes, deadline)
        # Both jobs' samples, committed (the targets' health turns "up" a moment before).
        wait_for(
            "two jobs' scrapes of every node in PromQL",
            lambda: (
                per_node(twice.url, "count by (node) (up == 1)") == {n: 2 for n in cluster.nodes}
            ),
            timeout=15,
        )

        busy = cluster.nodes[0]
        cluster.set_node_usage(busy, cpu=0.6, memory=0.45)
        node = cluster.rest.get(f"/api/v1/nodes/{busy}")
        cpus = int(node["status"]["capacity"]["cpu"])
        memory = int(node["status"]["capacity"]["memory"].removesuffix("Ki")) * 1024
        ips = {
            n["metadata"]["name"]: [
                a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP"
            ]
            for n in cluster.rest.get("/api/v1/nodes")["items"]
        }
        source = PrometheusSource(Prometheus(twice.url), timedelta(seconds=10))

        quiet = cluster.nodes[1]

        def settled() -> dict[str, Measured] | None:
            # A series younger than the rate window reads too busy (rate() divides by the
            # whole window): this Prometheus is seconds old, so wait for both to settle.
            got = source.sample(ips)
            cores = {n: got[n].cpu_cores / cpus for n in (busy, quiet) if n in got}
            fine = len(cores) == 2 and abs(cores[busy] - 0.6) < 0.03
            return got if fine and abs(cores[quiet] - QUIET_CPU) < 0.03 else None

        measured = wait_for(f"{busy} to read 60 % CPU through both jobs", settled, timeout=40)
        assert measured[busy].memory_bytes == pytest.approx(0.45 * memory, rel=0.01)
        assert measured[quiet].memory_bytes == pytest.approx(QUIET_MEMORY * memory, rel=0.01)
        # The expression annotate-usage used before: every node twice (the 14.4 GiB
        # for 7.2).
        added = per_node(
            twice.url,
            "sum by (instance, node) (node_memory_MemTotal_bytes - node_memory_MemAvailable_bytes)",
        )
        assert added[busy] == pytest.approx(2 * measured[busy].memory_bytes, rel=0.01)
    finally:
        twice.stop()
        twice.remove_data()
