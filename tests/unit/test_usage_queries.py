"""annotate-usage's PromQL, evaluated by Prometheus's own engine on synthetic series.

``promtool test rules`` (shipped with Prometheus, Debian's ``prometheus`` package) evaluates an
expression against series given in a file, offline, in well under a second: the same engine as
the server, without a server. The series are shaped as node-exporter exposes them
(``node_cpu_seconds_total`` per ``cpu`` and ``mode``, ``node_memory_*_bytes``) with the target
labels of the local cluster's scrape configuration (``instance`` = InternalIP:9100, ``node``);
tests/e2e/test_local_prometheus.py runs the same queries against a real server scraping twice.

The case that matters: one node-exporter scraped by two jobs (a Helm chart's
``kubernetes-service-endpoints`` beside kube-prometheus's ``node-exporter``), whose series
differ only in ``job``. Adding the two counted each node twice (14.4 GiB used for 7.2).
"""

from __future__ import annotations

import shutil
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.nodes.annotate_usage.sources import queries

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)"
)

Gi = 2**30
# node-1: 2 CPUs each idle 1.5 s of every 15 s scrape interval (90 % busy: 1.8 cores), 16 GiB
# of which 8.75 GiB available (7.25 GiB in use). node-2: 1 CPU idle 3.75 s of 15 s (0.75
# cores), 4 GiB with 3 available.
NODE_1 = {"instance": "10.0.0.11:9100", "node": "node-1"}
NODE_2 = {"instance": "10.0.0.12:9100", "node": "node-2"}
EXPECTED = {
    "cpu": {"node-1": 1.8, "node-2": 0.75},
    "cpu_avg5m": {"node-1": 1.8, "node-2": 0.75},
    "cpu_max1h": {"node-1": 1.8, "node-2": 0.75},
    "memory": {"node-1": 7.25 * Gi, "node-2": 1.0 * Gi},
    "memory_avg5m": {"node-1": 7.25 * Gi, "node-2": 1.0 * Gi},
    "memory_max1h": {"node-1": 7.25 * Gi, "node-2": 1.0 * Gi},
}


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


def node_exporter(
    target: dict[str, str],
    job: str,
    cpus: int,
    idle_per_scrape: float,
    total: float,
    available: float,
) -> list[dict[str, str]]:
    """One scrape job's series of one node-exporter, two hours at a 15 s interval (the
    1-hour maximum needs a full hour before the evaluation)."""
    labels = {**target, "job": job}
    # node-exporter's modes: the busy time here is all user time.
    out = [
        _series(
            "node_cpu_seconds_total",
            {**labels, "cpu": str(cpu), "mode": mode},
            f"0+{per_scrape}x480",
        )
        for cpu in range(cpus)
        for mode, per_scrape in (("idle", idle_per_scrape), ("user", 15 - idle_per_scrape))
    ]
    out.append(_series("node_memory_MemTotal_bytes", labels, f"{total:.0f}x480"))
    out.append(_series("node_memory_MemAvailable_bytes", labels, f"{available:.0f}x480"))
    return out


def evaluate(
    expr: str, expected: dict[str, float], series: list[dict[str, str]], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    targets = {"node-1": NODE_1, "node-2": NODE_2}
    test: dict[str, Any] = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "15s",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "119m",
                        "exp_samples": [
                            {
                                "labels": "{"
                                + ",".join(f'{k}="{v}"' for k, v in sorted(targets[n].items()))
                                + "}",
                                "value": value,
                            }
                            for n, value in sorted(expected.items())
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "queries-test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def two_jobs_on_node_1() -> list[dict[str, str]]:
    return [
        *node_exporter(NODE_1, "kubernetes-service-endpoints", 2, 1.5, 16 * Gi, 8.75 * Gi),
        *node_exporter(NODE_1, "node-exporter", 2, 1.5, 16 * Gi, 8.75 * Gi),
        *node_exporter(NODE_2, "node-exporter", 1, 3.75, 4 * Gi, 3 * Gi),
    ]


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_a_node_exporter_scraped_by_two_jobs_is_counted_once(key: str, tmp_path: Path) -> None:
    expr = queries(timedelta(minutes=1))[key]
    done = evaluate(expr, EXPECTED[key], two_jobs_on_node_1(), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_node_exporter_pod_restarting_within_the_rate_window_is_counted_once(
    tmp_path: Path,
) -> None:
    """The same job and target, a new ``pod`` label (kube-prometheus keeps the pod as a target
    label): the old pod's last samples are still the latest within Prometheus's 5-minute
    lookback (no staleness marker when a target's labels change under a restart) while the new
    pod's arrive, so both series answer."""
    old = {**NODE_1, "pod": "node-exporter-7x2kq"}
    new = {**NODE_1, "pod": "node-exporter-q9d4m"}
    series = [
        # The old pod's last sample is at the evaluation time; the new one's start 30 s before.
        *[
            {**s, "values": s["values"].replace("x480", "x476")}
            for s in node_exporter(old, "node-exporter", 2, 1.5, 16 * Gi, 8.75 * Gi)
        ],
        *[
            {**s, "values": "_x473 " + s["values"].replace("x480", "x3")}
            for s in node_exporter(new, "node-exporter", 2, 1.5, 16 * Gi, 8.75 * Gi)
        ],
        *node_exporter(NODE_2, "node-exporter", 1, 3.75, 4 * Gi, 3 * Gi),
    ]
    expr = queries(timedelta(minutes=1))["memory"]
    done = evaluate(expr, EXPECTED["memory"], series, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("key", ["cpu", "cpu_avg5m"])
def test_a_node_just_added_reads_as_busy_as_it_is(key: str, tmp_path: Path) -> None:
    """Its series began three scrapes (45 s) before the evaluation, inside the 1- and 5-minute
    windows, its counters at what a machine up for a day has. Idle time over the window's
    length read node-1 (1.8 cores of 2 in use) as 1.96 in the 5-minute average."""
    young = [
        {**s, "values": "_x472 " + _young(s["values"])}
        for s in node_exporter(NODE_1, "node-exporter", 2, 1.5, 16 * Gi, 8.75 * Gi)
    ]
    series = [*young, *node_exporter(NODE_2, "node-exporter", 1, 3.75, 4 * Gi, 3 * Gi)]
    expr = queries(timedelta(minutes=1))[key]
    done = evaluate(expr, EXPECTED[key], series, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def _young(values: str) -> str:
    """A series of 480 samples as its last three: a counter (``0+Nx480``) a day old, a gauge
    (``Vx480``) as it is."""
    if "+" not in values:
        return values.replace("x480", "x3")
    step = float(values.split("+", 1)[1].split("x", 1)[0])
    return f"{step * 5760:g}+{step:g}x3"
