"""Where node usage comes from: Prometheus (node-exporter's metrics) or the Metrics API.

Both answer the same question, cores and bytes in use per Node (`decide.Measured`); the
annotator turns them into percent of the node's allocatable. They differ in what they know:

- Prometheus keeps history, so it gives the current usage (a rate over 1 minute), the 5-minute
  average and the 1-hour maximum. CPU in use is the node's CPUs times the share of their time
  not idle (idle time over all CPU time, ``node_cpu_seconds_total``): iowait and steal count as
  in use, as the CPU is not available to pods then either. Not idle time over the window's
  length: rate() divides what it extrapolates by the whole window, so a series younger than the
  window (a node just added, a Prometheus that lost its data) would read busier than it is; the
  two sides of the ratio are short by the same factor. Memory in use is MemTotal minus
  MemAvailable (what the kernel could give without swapping; the working set the kubelet
  evicts on is close to it). Series are matched to Nodes as label-nodes matches them
  (shared.platform.prometheus.node_values). A node-exporter scraped by two jobs is one
  machine: its copies are never added (``_per_node``).
- The Metrics API (metrics-server, what ``kubectl top nodes`` reads) keeps no history: the
  current usage only (metrics-server's window, 10-30 s), the average and maximum stay unknown.
  Its memory is the node's working set.

A source that cannot answer raises `SourceDown` with what a person needs to fix it; one answer
that lacks a node leaves that node without a measurement (its record ages, then its bucket
goes).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Final, Protocol

from shared.api import quantity
from shared.nodes.annotate_usage.decide import Measured
from shared.platform import kube as kubeapi
from shared.platform import prometheus as prom
from shared.platform.config import USAGE_SOURCE_METRICS_API, USAGE_SOURCE_PROMETHEUS

log = logging.getLogger(__name__)

_CPUS: Final = 'count without (cpu, mode) (node_cpu_seconds_total{mode="idle"})'
_MEMORY_IN_USE: Final = "node_memory_MemTotal_bytes - node_memory_MemAvailable_bytes"


def _per_node(expr: str) -> str:
    """``expr``, whose series keep every label of their target, as one value per node.

    A target's series keep apart one node-exporter scraped twice: by two jobs (a Helm chart's
    ``kubernetes-service-endpoints`` and kube-prometheus's ``node-exporter``, each with the
    same ``instance`` and ``node``), or by one job across a node-exporter pod's restart (a new
    ``pod`` label while the old series is still inside the rate window). Then the largest of
    those per ``instance`` and ``node``: they measure the same machine, so adding them (a plain
    ``sum by (instance, node)``) would count it twice. Copies with a different ``instance`` are
    matched to the same Node afterwards, and their largest taken too
    (``PrometheusSource.sample``).
    """
    return f"max by (instance, node) ({expr})"


def _cpu_in_use(window: str) -> str:
    """Cores in use per node over ``window``: a target's CPUs times the share of their time not
    idle, each part summed over the CPUs and modes only (``without (cpu, mode)``), so that the
    parts match one to one and a target's copies stay apart (`_per_node`)."""
    idle = f'sum without (cpu, mode) (rate(node_cpu_seconds_total{{mode="idle"}}[{window}]))'
    every = f"sum without (cpu, mode) (rate(node_cpu_seconds_total[{window}]))"
    return _per_node(f"{_CPUS} * (1 - {idle} / {every})")


def queries(rate_window: timedelta) -> dict[str, str]:
    """The PromQL per measured value; the current CPU usage is a rate over ``rate_window``.

    Only the CPU maximum needs a subquery (a maximum of rates); its step is a quarter of the
    rate window, so that a young Prometheus (a minute of data) already answers it. Memory's
    average and maximum come from the raw series (MemTotal does not change while a node runs).
    """
    seconds = max(1, int(rate_window.total_seconds()))
    now = f"{seconds}s"
    step = f"{max(1, seconds // 4)}s"
    return {
        "cpu": _cpu_in_use(now),
        "cpu_avg5m": _cpu_in_use("5m"),
        "cpu_max1h": f"max_over_time(({_cpu_in_use(now)})[1h:{step}])",
        "memory": _per_node(_MEMORY_IN_USE),
        "memory_avg5m": _per_node(
            "avg_over_time(node_memory_MemTotal_bytes[5m]) - "
            "avg_over_time(node_memory_MemAvailable_bytes[5m])"
        ),
        "memory_max1h": _per_node(
            "max_over_time(node_memory_MemTotal_bytes[1h]) - "
            "min_over_time(node_memory_MemAvailable_bytes[1h])"
        ),
    }


# Without these two there is no measurement; the others only add history.
_REQUIRED: Final = ("cpu", "memory")


class SourceDown(Exception):
    """The source gave no usable answer; the message says why."""


class Source(Protocol):
    name: str

    def sample(self, internal_ips: Mapping[str, Iterable[str]]) -> dict[str, Measured]:
        """Usage per Node name. ``internal_ips`` maps every Node to its InternalIP addresses."""
        ...


@dataclass
class PrometheusSource:
    prometheus: prom.Prometheus
    rate_window: timedelta = timedelta(minutes=1)
    name: str = USAGE_SOURCE_PROMETHEUS

    def sample(self, internal_ips: Mapping[str, Iterable[str]]) -> dict[str, Measured]:
        ips = {node: list(addresses) for node, addresses in internal_ips.items()}
        values: dict[str, dict[str, float]] = {}
        for key, expr in queries(self.rate_window).items():
            try:
                samples = self.prometheus.query(expr)
            except prom.QueryFailed as err:
                if key in _REQUIRED:
                    raise SourceDown(f"Prometheus refused the {key} query: {err}") from err
                log.warning("usage history unavailable (%s): %s", key, err)
                continue
            except prom.PrometheusError as err:
                raise SourceDown(f"Prometheus: {err}") from err
            for node, found in prom.node_values(samples, ips).items():
                # Several series for one node (scraped by two jobs) are the same machine.
                values.setdefault(node, {})[key] = max(found)
        measured: dict[str, Measured] = {}
        for node, got in values.items():
            if not all(key in got for key in _REQUIRED):
                continue
            measured[node] = Measured(
                cpu_cores=got["cpu"],
                memory_bytes=got["memory"],
                cpu_cores_avg5m=got.get("cpu_avg5m"),
                memory_bytes_avg5m=got.get("memory_avg5m"),
                # The hour includes now; the subquery's last step may be a few seconds old.
                cpu_cores_max1h=_at_least(got.get("cpu_max1h"), got["cpu"]),
                memory_bytes_max1h=_at_least(got.get("memory_max1h"), got["memory"]),
            )
        return measured


@dataclass
class MetricsApiSource:
    kube: kubeapi.Kube
    name: str = USAGE_SOURCE_METRICS_API

    def sample(self, internal_ips: Mapping[str, Iterable[str]]) -> dict[str, Measured]:
        try:
            items = list(self.kube.list_all("NodeMetrics"))
        except kubeapi.NotFound as err:
            raise SourceDown(
                "the Metrics API (metrics.k8s.io/v1beta1) is not served: is metrics-server "
                f"installed and its APIService Available? ({err})"
            ) from err
        except kubeapi.Forbidden as err:
            raise SourceDown(f"not allowed to list nodes.metrics.k8s.io: {err}") from err
        except kubeapi.KubeError as err:
            # 503 from the aggregation layer when metrics-server is down, or a timeout.
            raise SourceDown(f"the Metrics API did not answer: {err}") from err
        measured: dict[str, Measured] = {}
        for item in items:
            name = (item.get("metadata") or {}).get("name")
            usage = item.get("usage") or {}
            if name not in internal_ips:
                continue
            try:
                cpu = quantity.parse(usage.get("cpu"))
                memory = quantity.parse(usage.get("memory"))
            except quantity.QuantityError as err:
                log.warning("NodeMetrics %s: unreadable usage %r: %s", name, usage, err)
                continue
            measured[str(name)] = Measured(cpu_cores=float(cpu), memory_bytes=float(memory))
        return measured


def _at_least(value: float | None, floor: float) -> float | None:
    return None if value is None else max(value, floor)
