"""A real Prometheus server for the local cluster, scraping one node-exporter endpoint per node.

``label-nodes`` evaluates PromQL rules against a Prometheus over its HTTP API. Locally that is
the real server (Debian's ``prometheus`` package, or any binary named by
``KN_RESCHEDULER_PROMETHEUS``), not a fake answering canned JSON: range functions (``rate``),
staleness, scrape failures and an outage behave as they do in production.

It scrapes the endpoints of :mod:`localcluster.nodeexporter` with a generated configuration:

- one job, ``node-exporter``, every second (a real cluster scrapes every 15-60 s; locally a
  test should not wait for that), targets from a ``file_sd`` file rewritten whenever a node
  appears, goes or changes its address (Prometheus watches the file);
- each target carries the labels a real cluster's node-exporter scrape configuration usually
  gives: ``node="<Node name>"`` (the Prometheus community Helm chart's
  ``kubernetes-service-endpoints`` job copies it from the pod's node name) and
  ``instance="<InternalIP>:9100"`` (that job's default: the address of a node-exporter pod on
  the host network). ``label-nodes`` matches a value to its Node by ``node``, and falls back to
  ``instance`` -> the Node's InternalIP. A target label ``instance`` is kept as is: Prometheus
  defaults it to the scraped address only when it is unset (scrape/target.go);
- a TSDB under the cluster's work directory (``prometheus/data``), kept an hour;
- with ``second_job=True`` (default off), a second job, ``kube-prometheus-node-exporter``,
  scraping the same endpoints with the same target labels, as a production cluster that runs
  both a Helm chart's scrape configuration and kube-prometheus does: every node-exporter series
  then exists twice, differing only in ``job``. Queries that add series per ``instance`` and
  ``node`` count each node twice there; annotate-usage's must not.

The process runs like the control plane's (:mod:`localcluster.procs`): its own process group,
killed by the kernel if the harness dies, logged to ``logs/prometheus.log``, on a free
127.0.0.1 port that stays the same across ``stop``/``start`` (an outage test sees the same URL
come back).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import requests
import yaml

from dev.localcluster.nodeexporter import NodeExporter, SimNode
from dev.localcluster.procs import Proc

# Names the prometheus binary to run instead of the one on PATH.
ENV_PROMETHEUS: Final = "KN_RESCHEDULER_PROMETHEUS"
JOB: Final = "node-exporter"
# The second job of a production-like configuration (``second_job=True``).
SECOND_JOB: Final = "kube-prometheus-node-exporter"
SCRAPE_INTERVAL: Final = "1s"
RETENTION: Final = "1h"
# The port of a real node-exporter, for the ``instance`` label.
NODE_EXPORTER_PORT: Final = 9100
PROCESS_NAME: Final = "prometheus"
INSTALL_HINT: Final = (
    "the local cluster runs a real Prometheus: install Debian's package "
    "(apt-get install --no-install-recommends prometheus), or set "
    f"{ENV_PROMETHEUS} to a prometheus binary, or start the Cluster with prometheus=False"
)


class PrometheusError(RuntimeError):
    """Prometheus is missing or did not start (the message says why)."""


def find_binary() -> str:
    """The prometheus binary: ``$KN_RESCHEDULER_PROMETHEUS``, else ``prometheus`` on PATH."""
    override = os.environ.get(ENV_PROMETHEUS)
    found = override if override else shutil.which("prometheus")
    if not found or not os.access(found, os.X_OK):
        raise PrometheusError(f"no prometheus binary found; {INSTALL_HINT}")
    return found


def target_groups(nodes: Sequence[SimNode], exporter_address: str) -> list[dict[str, Any]]:
    """The ``file_sd`` content: one target group per node, all at the exporter's address, each
    with its own path and the labels a real cluster's scrape configuration gives."""
    groups = []
    for node in sorted(nodes, key=lambda n: n.name):
        labels = {
            "__metrics_path__": NodeExporter.path(node.name),
            "node": node.name,
        }
        if node.internal_ip:
            labels["instance"] = f"{node.internal_ip}:{NODE_EXPORTER_PORT}"
        groups.append({"targets": [exporter_address], "labels": labels})
    return groups


def config(
    targets_file: Path, *, second_job: bool = False, scrape_interval: str = SCRAPE_INTERVAL
) -> dict[str, Any]:
    """The Prometheus configuration: the node-exporter job fed by ``targets_file`` and, with
    ``second_job``, a second job scraping the same targets with the same labels."""
    jobs = [JOB, SECOND_JOB] if second_job else [JOB]
    return {
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval},
        "scrape_configs": [
            {
                "job_name": job,
                # The file is watched; the refresh is the fallback if a change notice is lost.
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "5s"}],
            }
            for job in jobs
        ],
    }


def argv(binary: str, config_file: Path, data_dir: Path, port: int) -> list[str]:
    return [
        binary,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={data_dir}",
        f"--storage.tsdb.retention.time={RETENTION}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]


class LocalPrometheus:
    """Prometheus for one cluster: files under ``directory``, log in ``log_dir``."""

    def __init__(
        self,
        directory: Path,
        log_dir: Path,
        port: int,
        binary: str,
        exporter: NodeExporter,
        *,
        second_job: bool = False,
        scrape_interval: str = SCRAPE_INTERVAL,
    ) -> None:
        """``second_job``: also scrape every endpoint as SECOND_JOB (see the module docstring);
        ``targets_up`` and ``wait_scraped`` then need both jobs up. ``scrape_interval``: a
        Prometheus duration, every job's."""
        self.directory = directory
        self.second_job = second_job
        self.scrape_interval = scrape_interval
        self.exporter = exporter
        self.log_path = log_dir / f"{PROCESS_NAME}.log"
        self.port = port
        self.binary = binary
        self.url = f"http://127.0.0.1:{port}"
        self.config_file = directory / "prometheus.yml"
        self.targets_file = directory / "targets.json"
        self.data_dir = directory / "data"
        self.proc: Proc | None = None
        self._http = requests.Session()
        self._http.trust_env = False  # loopback: no proxy

    def prepare(self) -> None:
        """Writes a fresh configuration and an empty target list (a new TSDB too)."""
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True)
        self.write_targets([])
        self.config_file.write_text(
            yaml.safe_dump(
                config(
                    self.targets_file,
                    second_job=self.second_job,
                    scrape_interval=self.scrape_interval,
                ),
                sort_keys=False,
            )
        )
        self.log_path.unlink(missing_ok=True)

    def write_targets(self, nodes: Sequence[SimNode]) -> None:
        """Rewrites the target file atomically (Prometheus may read it at any moment): the
        exporter calls this whenever its nodes change."""
        groups = target_groups(nodes, self.exporter.address) if nodes else []
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=1))
        tmp.replace(self.targets_file)

    def start(self, deadline: float) -> Proc:
        """Starts the process and returns once it answers ``/-/ready``. Like every Proc, it
        dies with the thread that calls this."""
        if self.proc is not None and self.proc.alive():
            return self.proc
        self.proc = Proc(
            PROCESS_NAME,
            argv(self.binary, self.config_file, self.data_dir, self.port),
            self.log_path,
        )
        while True:
            if not self.proc.alive():
                raise PrometheusError(
                    f"prometheus exited with code {self.proc.returncode}; last log lines "
                    f"({self.log_path}):\n{self.proc.log_tail()}"
                )
            if self._get("/-/ready") is not None:
                return self.proc
            if time.monotonic() > deadline:
                raise PrometheusError(f"timed out waiting for prometheus at {self.url}/-/ready")
            time.sleep(0.05)

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL), and waits until the process is gone."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if kill:
            proc.kill()
            proc.wait(10.0)
        else:
            proc.stop(grace=10.0)

    def remove_data(self) -> None:
        """Drops the TSDB (bulk nobody reads after the run); the config and targets stay."""
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def targets_up(self) -> dict[str, str]:
        """``node`` label -> health ("up", "down", "unknown") of every active target; with two
        jobs, "up" only when both scrapes of the node are."""
        body = self._get("/api/v1/targets?state=active")
        if body is None:
            return {}
        targets = body.json().get("data", {}).get("activeTargets", [])
        health: dict[str, str] = {}
        for t in targets:
            node, state = str(t["labels"].get("node", "")), str(t.get("health", ""))
            health[node] = state if health.get(node, "up") == "up" else health[node]
        return health

    def wait_scraped(self, nodes: Sequence[str], deadline: float) -> None:
        """Waits until every one of ``nodes`` has been scraped successfully once."""
        while True:
            health = self.targets_up()
            if all(health.get(n) == "up" for n in nodes):
                return
            if self.proc is not None and not self.proc.alive():
                raise PrometheusError(f"prometheus exited with code {self.proc.returncode}")
            if time.monotonic() > deadline:
                waiting = sorted(n for n in nodes if health.get(n) != "up")
                raise PrometheusError(
                    f"timed out waiting for prometheus to scrape {', '.join(waiting)} "
                    f"(targets: {health})"
                )
            time.sleep(0.1)

    def _get(self, path: str) -> requests.Response | None:
        try:
            resp = self._http.get(self.url + path, timeout=2.0)
        except requests.RequestException:
            return None
        return resp if resp.status_code == 200 else None
