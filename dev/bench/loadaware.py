"""Load-aware placement and rebalancing (``--only load``): a burst of pods whose actual usage is
not what they request, on nodes that are not equally busy, placed and then rebalanced by each
system in turn on the same cluster.

The usage model. kwok nodes run nothing, so usage is simulated, and the placement must change
it, or no system could be judged by where it puts pods:

- each pod carries what it actually uses as annotations (``sim.kn-rescheduler.io/cpu``, cores,
  and ``sim.kn-rescheduler.io/memory``, bytes; ``POD_CPU_ANNOTATION``), set in its Deployment's
  template. The workloads (``Shape``) are heterogeneous on purpose: batch pods use seven times
  what they request, caches a fifth of it, idle sidecar-like pods nearly nothing. Requests are
  what the default scheduler sees; usage is what a node-exporter measures;
- each node has a background usage (``background``: the kubelet, system daemons, what runs
  outside the cluster's view), the same pattern every run: some nodes at 55 %, some at 35 %,
  most at 10 %;
- a loop in the harness (``UsageLoop``), every second, lists the bench's pods and sets each
  node's simulated usage (the Node annotations ``sim.kn-rescheduler.io/cpu-usage`` and
  ``memory-usage`` that the local node-exporter serves, ``Cluster.set_node_usage``) to its
  background plus the sum over the pods Running on it (bound, phase Running, not terminating),
  as a fraction of the machine (8 CPUs), capped at 1: a saturated node measures 100 %, the
  rest is throttling (the demand is recorded too). So Prometheus, and everything that reads it
  (annotate-usage, hence score-nodes, the load labels and rebalance-nodes; the descheduler's
  query), sees the consequences of the placement one scrape and one rate window later, as on a
  real cluster.

The figures are the model's own values (what the node-exporter serves), in percent of the
machine's CPUs: max node CPU usage, the standard deviation over the nodes, the nodes over 80 %.

The scenario, per placement: one namespace per Deployment (teams; rebalance-nodes' per-namespace
limit is per team, as in a real cluster), every Deployment created at once; "placed" when every
pod is bound and Running (or the placement bound passes: a pod no node takes stays Pending and is
counted). The figures then are the placement's. Then the rebalancer (if any) starts, and the
harness samples every second until every node has stayed under 80 % for ``hold`` seconds or
``rebalance_bound`` passes: the evictions (pods of the burst that disappeared: nothing else
deletes them), the time from the start of rebalancing until every node was under 80 % (None:
never within the bound) and whether that still held at the end, and the figures at the end.

The systems, on the run's shared cluster, one after the other, namespaces deleted and node
state reset between them:

- ``stock``: the cluster's kube-scheduler as configured by default, nothing else;
- ``descheduler``: the same placement, then the descheduler (``bench.descheduler``'s build,
  v0.36) with ``LowNodeUtilization`` on actual utilisation from Prometheus, the one source its
  ``metricsUtilization`` takes besides metrics-server. Its Prometheus client (v0.36,
  pkg/descheduler/client CreatePrometheusClient, prom_client_controller) only exists inside a
  pod: it reads the service account token and the CA from
  ``/var/run/secrets/kubernetes.io/serviceaccount`` (or a Secret's token, still with that CA
  file). The harness gives it that directory in a mount namespace of its own (``unshare``: a
  tmpfs on /run, never the host's), with the cluster's CA and a token our Prometheus ignores.
  Its query must return one sample per node, in 0..1, labelled ``instance`` with the Node's
  name (usageclients.go NodeUsageFromPrometheusMetrics; a missing node fails the whole cycle,
  a value outside 0..1 too): ``descheduler_query``. Thresholds (``MetricResource``, the only
  resource a Prometheus query may name): under 40 % is underutilised, over 80 % overutilised;
  it evicts at most one pod per overutilised node per cycle (its README);
- ``stock+rebalance`` (full runs only): the stock placement again, then rebalance-nodes, the
  descheduler's peer on the same footing;
- ``extender``: pods with ``schedulerName: kn-rescheduler-load-aware``, a second kube-scheduler
  with the shipped configuration (``stack.up.load_aware_scheduler_config``) calling score-nodes,
  node usage from annotate-usage; ``extender+rebalance``: the same placement, then
  rebalance-nodes;
- ``label``: the stock scheduler, mutate-admission registered, the Deployments opted in
  (``kn-rescheduler.io/load-aware: "true"``): preferred affinities away from nodes whose load
  label (annotate-usage's) is medium or more, twice as strong against high and overloaded;
  ``label+rebalance``: then rebalance-nodes.

Every Deployment is opted in to rebalancing (``kn-rescheduler.io/rebalance: "true"``) and to
load-aware admission; only the systems that run those functions act on it. The functions run as
they ship (gunicorn), pinged by the harness as their PingSources would, on a compressed clock
(``LoadScales``): a rate window of 10 s (5 s with ``--quick``) for annotate-usage and the
descheduler's query alike, rebalance-nodes and the descheduler every ``every`` seconds; every
other setting at its default.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import statistics
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import requests
import yaml

from dev.bench import descheduler
from dev.bench.common import (
    DESCHEDULER_USER,
    JSON,
    ca_path,
    create_namespace,
    identity_kubeconfig,
    list_all,
    wait_until,
)
from dev.localcluster.cluster import Cluster
from dev.localcluster.keys import (
    SIM_CPU_USAGE_ANNOTATION,
    SIM_MEMORY_USAGE_ANNOTATION,
    SIM_POD_CPU_ANNOTATION,
    SIM_POD_MEMORY_ANNOTATION,
)
from dev.localcluster.procs import Proc
from dev.localcluster.rest import ApiError
from dev.stack import webhook as webhook_setup
from dev.stack.functions import FunctionServer, environment, free_port
from dev.stack.up import load_aware_scheduler_config
from shared.api import quantity
from shared.api.keys import (
    HOT_STREAK_ANNOTATION,
    LOAD_AWARE_KEY,
    LOAD_AWARE_SCHEDULER_NAME,
    LOAD_LABEL,
    PING_EVENT_TYPE,
    REBALANCE_KEY,
    REBALANCE_VALUE,
    USAGE_ANNOTATION,
)

# What a pod actually uses (the simulation's input, never read by a system under test).
POD_CPU_ANNOTATION: Final = SIM_POD_CPU_ANNOTATION
POD_MEMORY_ANNOTATION: Final = SIM_POD_MEMORY_ANNOTATION
# Marks the burst's pods, so the usage loop lists only them.
BENCH_LABEL: Final = "bench.kn-rescheduler.io/load"
IMAGE: Final = "registry.example.com/shop/app:2.3.1"
THRESHOLD: Final = 80.0
# The descheduler's LowNodeUtilization thresholds (percent of the query's value).
DESCHEDULER_UNDER: Final = 40
DESCHEDULER_OVER: Final = 80
# A real node-exporter's machine: what the usage fractions are of (the local nodes' capacity).
DEFAULT_CPUS: Final = 8.0
# The simulated usage is rewritten only when it moved by more than this (fraction).
WRITE_TOLERANCE: Final = 0.002
# The background usage pattern, cycled over the nodes: (cpu, memory) fractions of the machine.
BACKGROUND_PATTERN: Final = ((0.55, 0.40), (0.10, 0.20), (0.35, 0.30), (0.10, 0.20), (0.10, 0.25))
SA_DIR: Final = "/run/secrets/kubernetes.io/serviceaccount"

SYSTEMS: Final = (
    "stock",
    "descheduler",
    "stock+rebalance",
    "extender",
    "extender+rebalance",
    "label",
    "label+rebalance",
)


@dataclass(frozen=True)
class Shape:
    """One Deployment of the burst: its replicas, what each pod requests and what it uses."""

    name: str
    replicas: int
    cpu_request: str
    memory_request: str
    cpu_usage: float  # cores
    memory_usage: int  # bytes


MI: Final = 1024 * 1024
FULL_SHAPES: Final = (
    Shape("api", 12, "500m", "512Mi", 1.2, 600 * MI),
    Shape("batch", 10, "250m", "256Mi", 1.8, 1024 * MI),
    Shape("cache", 10, "1", "2Gi", 0.2, 1536 * MI),
    Shape("web", 16, "200m", "128Mi", 0.3, 200 * MI),
    Shape("worker", 12, "500m", "512Mi", 0.9, 400 * MI),
    Shape("sidecar", 20, "100m", "64Mi", 0.02, 40 * MI),
)
QUICK_SHAPES: Final = (
    Shape("api", 4, "500m", "512Mi", 1.2, 600 * MI),
    Shape("batch", 3, "250m", "256Mi", 1.8, 1024 * MI),
    Shape("cache", 2, "1", "2Gi", 0.2, 1536 * MI),
    Shape("web", 4, "200m", "128Mi", 0.3, 200 * MI),
    Shape("sidecar", 3, "100m", "64Mi", 0.02, 40 * MI),
)


@dataclass(frozen=True)
class LoadScales:
    """The sizes and clocks of one run; ``FULL_LOAD`` is ``make bench``, ``QUICK_LOAD`` CI's."""

    shapes: tuple[Shape, ...]
    # How long the burst may take to be bound and Running.
    placement_bound: float
    # How long a rebalancer gets, and how long every node must stay under 80 % to end sooner.
    rebalance_bound: float
    hold: float
    # The PingSources' and the descheduler's period (seconds).
    every: int
    # annotate-usage's period (seconds).
    usage_every: float
    # Whether the stock placement is also rebalanced by rebalance-nodes (a fourth phase).
    stock_rebalance: bool
    # The rate window of every Prometheus reader here, annotate-usage and the descheduler's
    # query alike (Prometheus scrapes the local nodes every second; a real cluster's 1-5 min
    # would only make every system slower alike).
    rate_window: str


FULL_LOAD: Final = LoadScales(
    FULL_SHAPES,
    placement_bound=120.0,
    rebalance_bound=240.0,
    hold=60.0,
    every=10,
    usage_every=5,
    stock_rebalance=True,
    rate_window="10s",
)
QUICK_LOAD: Final = LoadScales(
    QUICK_SHAPES,
    placement_bound=60.0,
    rebalance_bound=30.0,
    hold=6.0,
    every=3,
    usage_every=2,
    stock_rebalance=False,
    rate_window="5s",
)


# -- the usage model (pure) ---------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """A node's simulated usage, fractions of the machine: measured (capped at 1) and demand."""

    cpu: float
    memory: float
    cpu_demand: float


def background(nodes: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Each node's background (cpu, memory) fractions: ``BACKGROUND_PATTERN`` cycled."""
    return {n: BACKGROUND_PATTERN[i % len(BACKGROUND_PATTERN)] for i, n in enumerate(nodes)}


def pod_usage(pod: JSON) -> tuple[float, float]:
    """(cores, bytes) a pod uses, from its annotations; a missing or unreadable one is 0."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    out = []
    for key in (POD_CPU_ANNOTATION, POD_MEMORY_ANNOTATION):
        try:
            value = float(annotations.get(key, 0) or 0)
        except (TypeError, ValueError):
            value = 0.0
        out.append(value if math.isfinite(value) and value > 0 else 0.0)
    return out[0], out[1]


def running_on(pod: JSON) -> str | None:
    """The node a pod uses resources on: bound, Running, not terminating; else None."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if (pod.get("status") or {}).get("phase") != "Running":
        return None
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def steered_by_load(pod: JSON) -> bool:
    """Whether the pod carries a preferred node affinity on the load label (what
    mutate-admission injects into an opted-in pod in the label mode)."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    for term in affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
        for expr in (term.get("preference") or {}).get("matchExpressions") or []:
            if expr.get("key") == LOAD_LABEL:
                return True
    return False


def node_usage(
    base: Mapping[str, tuple[float, float]],
    pods: Iterable[JSON],
    cpus: Mapping[str, float],
    memory_bytes: Mapping[str, float],
) -> dict[str, Usage]:
    """Every node of ``base``: its background plus the usage of the pods running on it, as
    fractions of its machine (``cpus`` cores, ``memory_bytes``), the measured values capped
    at 1."""
    cores = {n: b[0] * cpus[n] for n, b in base.items()}
    mem = {n: b[1] * memory_bytes[n] for n, b in base.items()}
    for pod in pods:
        node = running_on(pod)
        if node not in cores:
            continue
        c, m = pod_usage(pod)
        cores[node] += c
        mem[node] += m
    out = {}
    for n in base:
        demand = cores[n] / cpus[n]
        out[n] = Usage(min(demand, 1.0), min(mem[n] / memory_bytes[n], 1.0), demand)
    return out


def to_write(
    usage: Mapping[str, Usage], written: Mapping[str, tuple[float, float]]
) -> dict[str, tuple[float, float]]:
    """The nodes whose simulated (cpu, memory) moved by more than ``WRITE_TOLERANCE`` since last
    written (or were never written), with the values to write, rounded to 4 places."""
    out = {}
    for node, u in usage.items():
        new = (round(u.cpu, 4), round(u.memory, 4))
        old = written.get(node)
        if old is None or max(abs(new[0] - old[0]), abs(new[1] - old[1])) > WRITE_TOLERANCE:
            out[node] = new
    return out


@dataclass(frozen=True)
class Spread:
    """How a placement loaded the nodes: CPU percent of the machine."""

    max_cpu: float
    stdev_cpu: float
    mean_cpu: float
    over: tuple[str, ...]
    max_demand: float

    def to_json(self) -> JSON:
        return {
            "max_cpu_percent": round(self.max_cpu, 1),
            "stdev_cpu_percent": round(self.stdev_cpu, 1),
            "mean_cpu_percent": round(self.mean_cpu, 1),
            "nodes_over_threshold": len(self.over),
            "over": list(self.over),
            "max_cpu_demand_percent": round(self.max_demand, 1),
        }


def spread(usage: Mapping[str, Usage], threshold: float = THRESHOLD) -> Spread:
    """The figures of one moment: max, population standard deviation and mean of the nodes' CPU
    usage, the nodes over ``threshold`` (percent), the highest demand."""
    cpu = {n: u.cpu * 100 for n, u in usage.items()}
    values = list(cpu.values())
    return Spread(
        max_cpu=max(values),
        stdev_cpu=statistics.pstdev(values),
        mean_cpu=statistics.fmean(values),
        over=tuple(sorted(n for n, v in cpu.items() if v > threshold)),
        max_demand=max(u.cpu_demand * 100 for u in usage.values()),
    )


@dataclass(frozen=True)
class Convergence:
    """When every node was first under the threshold (seconds from the start; None: never),
    and whether every node still was at the last sample."""

    first_all_under_s: float | None
    held_to_end: bool


def convergence(samples: Sequence[tuple[float, Spread]]) -> Convergence:
    """From (seconds since the rebalancer started, figures) samples in time order."""
    first = next((t for t, s in samples if not s.over), None)
    held = bool(samples) and not samples[-1][1].over
    return Convergence(None if first is None else round(first, 1), held)


def under_for(samples: Sequence[tuple[float, Spread]]) -> float:
    """How long, up to the last sample, every node has been under the threshold (0: not now)."""
    if not samples or samples[-1][1].over:
        return 0.0
    start = samples[-1][0]
    for t, s in reversed(samples):
        if s.over:
            break
        start = t
    return samples[-1][0] - start


def evicted(seen: Iterable[str], present: Iterable[str]) -> int:
    """How many of the burst's pods seen during rebalancing (uids; replacements included, so a
    pod moved twice counts twice) are gone at its end: nothing but the rebalancer deletes them
    (the Deployments keep their replicas)."""
    return len(set(seen) - set(present))


# -- the Kubernetes objects (pure) ----------------------------------------------------------------


def deployment(shape: Shape, scheduler: str | None) -> JSON:
    """The Deployment of ``shape``: opted in to load-aware admission and to rebalancing; its
    pods carry their usage; ``scheduler`` names the scheduler (None: the default one)."""
    labels = {"app": shape.name}
    spec: JSON = {
        "containers": [
            {
                "name": "app",
                "image": IMAGE,
                "resources": {
                    "requests": {"cpu": shape.cpu_request, "memory": shape.memory_request}
                },
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": shape.name,
            "annotations": {LOAD_AWARE_KEY: "true", REBALANCE_KEY: REBALANCE_VALUE},
        },
        "spec": {
            "replicas": shape.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": {**labels, BENCH_LABEL: "true"},
                    "annotations": {
                        POD_CPU_ANNOTATION: f"{shape.cpu_usage:g}",
                        POD_MEMORY_ANNOTATION: str(shape.memory_usage),
                    },
                },
                "spec": spec,
            },
        },
    }


def descheduler_query(window: str) -> str:
    """Each node's CPU usage, 0..1, labelled ``instance`` with the Node's name.

    The local scrape labels a node-exporter series with ``node`` (the Node's name) and
    ``instance`` (its address, ``<InternalIP>:9100``), as the community chart does; the
    descheduler maps a sample to a Node by ``instance`` alone, so ``label_replace`` copies the
    name there. ``clamp`` keeps a rate's extrapolation from taking a sample out of 0..1: the
    descheduler drops the whole cycle for one such value."""
    busy = f'1 - avg by (node) (rate(node_cpu_seconds_total{{mode="idle"}}[{window}]))'
    return f'clamp(label_replace({busy}, "instance", "$1", "node", "(.+)"), 0, 1)'


def descheduler_policy(prometheus_url: str, query: str) -> JSON:
    """LowNodeUtilization on a Prometheus query (descheduler/v1alpha2), DefaultEvictor at its
    defaults (as the recovery peer's)."""
    return {
        "apiVersion": "descheduler/v1alpha2",
        "kind": "DeschedulerPolicy",
        "metricsProviders": [{"source": "Prometheus", "prometheus": {"url": prometheus_url}}],
        "profiles": [
            {
                "name": "kn-rescheduler-bench-load",
                "pluginConfig": [
                    {"name": "DefaultEvictor", "args": {}},
                    {
                        "name": "LowNodeUtilization",
                        "args": {
                            "thresholds": {"MetricResource": DESCHEDULER_UNDER},
                            "targetThresholds": {"MetricResource": DESCHEDULER_OVER},
                            "metricsUtilization": {
                                "source": "Prometheus",
                                "prometheus": {"query": query},
                            },
                        },
                    },
                ],
                "plugins": {
                    "filter": {"enabled": ["DefaultEvictor"]},
                    "preEvictionFilter": {"enabled": ["DefaultEvictor"]},
                    "balance": {"enabled": ["LowNodeUtilization"]},
                },
            }
        ],
    }


def descheduler_cycles(log: str) -> JSON:
    """How many descheduling cycles its log shows, and how many of them LowNodeUtilization
    failed (no usage from Prometheus: it then evicts nothing that cycle). A cycle cut short
    by the harness stopping it (its query ends with "terminated signal received") is not a
    failure."""
    failed = [
        line
        for line in log.splitlines()
        if "running balance extension point failed" in line
        and "terminated signal received" not in line
    ]
    return {"run": log.count('"Number of evictions/requests"'), "failed": len(failed)}


def in_pod_argv(script_dir: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` in a mount namespace of its own where ``SA_DIR`` holds ``script_dir``'s token
    and ca.crt, as in a pod (see the module docstring). Without root, a user namespace maps the
    caller to root inside it, which may mount."""
    script = (
        "set -e; mount -t tmpfs -o size=1m tmpfs /run; "
        f"mkdir -p {SA_DIR}; cp {script_dir}/token {script_dir}/ca.crt {SA_DIR}/; "
        'exec "$@"'
    )
    rootless = [] if os.geteuid() == 0 else ["--map-root-user"]
    return ["unshare", "--mount", *rootless, "sh", "-c", script, "in-pod", *argv]


# -- the harness ---------------------------------------------------------------------------------


class UsageLoop:
    """Every second: the burst's pods -> each node's simulated usage (see the module docstring);
    the latest figures for the measurement, and every pod uid seen since ``mark``."""

    def __init__(self, cluster: Cluster, every: float = 1.0) -> None:
        self.cluster = cluster
        self.every = every
        nodes = [n for n in cluster.rest.get("/api/v1/nodes")["items"]]
        self.cpus = {
            n["metadata"]["name"]: float(quantity.parse(n["status"]["capacity"]["cpu"]))
            for n in nodes
        }
        self.memory = {
            n["metadata"]["name"]: float(quantity.bytes_of(n["status"]["capacity"]["memory"]))
            for n in nodes
        }
        self.base = background(sorted(self.cpus, key=_node_order))
        self.written: dict[str, tuple[float, float]] = {}
        self.latest: dict[str, Usage] = {}
        self.pods: list[JSON] = []
        self.seen: set[str] = set()
        self.errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> UsageLoop:
        self.step()
        self._thread = threading.Thread(target=self._loop, name="usage-loop", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def step(self) -> None:
        pods = list_all(self.cluster.rest, "/api/v1/pods", {"labelSelector": f"{BENCH_LABEL}"})
        usage = node_usage(self.base, pods, self.cpus, self.memory)
        for node, (cpu, memory) in to_write(usage, self.written).items():
            self.cluster.set_node_usage(node, cpu=cpu, memory=memory)
            self.written[node] = (cpu, memory)
        with self._lock:
            self.latest = usage
            self.pods = pods
            self.seen.update(_live(pods))

    def snapshot(self) -> tuple[dict[str, Usage], list[JSON]]:
        with self._lock:
            return dict(self.latest), list(self.pods)

    def mark(self) -> None:
        """From now on ``seen`` holds only the pods there now and those seen later."""
        with self._lock:
            self.seen = set(_live(self.pods))

    def seen_since_mark(self) -> set[str]:
        with self._lock:
            return set(self.seen)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.step()
            except (ApiError, requests.RequestException, OSError):
                self.errors += 1


def _live(pods: Iterable[JSON]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def _node_order(name: str) -> tuple[int, str]:
    tail = name.rsplit("-", 1)[-1]
    return (int(tail), name) if tail.isdigit() else (10**9, name)


class Pinger:
    """POSTs a PingSource event to a function every ``every`` seconds, as its PingSource would."""

    def __init__(self, server: FunctionServer, every: float) -> None:
        self.server = server
        self.every = every
        self.failures = 0
        self.pings = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> Pinger:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=70)

    def ping(self) -> int:
        headers = {
            "ce-specversion": "1.0",
            "ce-id": str(uuid.uuid4()),
            "ce-source": f"/apis/v1/namespaces/kn-rescheduler/pingsources/{self.server.function}",
            "ce-type": PING_EVENT_TYPE,
            "content-type": "application/json",
        }
        response = requests.post(
            self.server.url, json={"message": "tick"}, headers=headers, timeout=60
        )
        self.pings += 1
        return response.status_code

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                if self.ping() >= 300:
                    self.failures += 1
            except requests.RequestException:
                self.failures += 1


@dataclass(frozen=True)
class Phase:
    """One placement, measured, then rebalanced: ``names`` are the system without rebalancing
    (None: the same placement is already measured by another phase) and the one with it."""

    placement: str  # stock, extender, label
    rebalancer: str  # descheduler, rebalance-nodes
    names: tuple[str | None, str]


PHASES: Final = (
    Phase("stock", "descheduler", ("stock", "descheduler")),
    # The stock placement again, rebalanced by rebalance-nodes: the descheduler's peer on the
    # same footing (full runs only: the quick run's two minutes hold three phases).
    Phase("stock", "rebalance-nodes", (None, "stock+rebalance")),
    Phase("extender", "rebalance-nodes", ("extender", "extender+rebalance")),
    Phase("label", "rebalance-nodes", ("label", "label+rebalance")),
)


def phases(scales: LoadScales) -> tuple[Phase, ...]:
    return tuple(p for p in PHASES if scales.stock_rebalance or p.names[1] != "stock+rebalance")


def system_names(scales: LoadScales) -> list[str]:
    """The systems a run of ``scales`` measures, in ``SYSTEMS``' order."""
    measured = {n for p in phases(scales) for n in p.names if n}
    return [n for n in SYSTEMS if n in measured]


class LoadBench:
    """The functions, the usage loop, and each phase in turn on ``cluster``."""

    def __init__(
        self,
        cluster: Cluster,
        scales: LoadScales,
        workdir: Path,
        log: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.scales = scales
        self.workdir = workdir
        self.log = log
        self.servers: dict[str, FunctionServer] = {}
        self.pingers: list[Pinger] = []
        self.loop: UsageLoop | None = None
        self.scheduler: Proc | None = None
        self.webhook_ca = Path()
        self.descheduler_bin = Path()

    # -- set-up and tear-down -------------------------------------------------------------------

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Built (or found cached) before anything is timed: a first build takes minutes.
        self.descheduler_bin = descheduler.binary()
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        env = environment(
            self.cluster.kubeconfig,
            KN_RESCHEDULER_PROMETHEUS_URL=self.cluster.prometheus_url,
            KN_RESCHEDULER_USAGE_RATE_WINDOW=self.scales.rate_window,
            KN_RESCHEDULER_LOG_LEVEL="WARNING",
        )
        score_port = free_port()
        self.servers["annotate-usage"] = FunctionServer("annotate-usage", logs, env=env).start()
        self.servers["score-nodes"] = FunctionServer(
            "score-nodes", logs, env=env, port=score_port
        ).start()
        self.servers["rebalance-nodes"] = FunctionServer("rebalance-nodes", logs, env=env).start()
        ca, crt, key = webhook_setup.make_tls(self.workdir / "tls")
        self.servers["mutate-admission"] = FunctionServer(
            "mutate-admission", logs, env=env, tls=(crt, key), ca_file=ca
        ).start()
        self.webhook_ca = ca
        self.scheduler = self.cluster.start_scheduler(
            LOAD_AWARE_SCHEDULER_NAME,
            load_aware_scheduler_config(f"http://127.0.0.1:{score_port}"),
        )
        self.loop = UsageLoop(self.cluster).start()
        self.pingers.append(Pinger(self.servers["annotate-usage"], self.scales.usage_every).start())

    def stop(self) -> None:
        for pinger in self.pingers:
            pinger.stop()
        self.pingers.clear()
        if self.loop is not None:
            self.loop.stop()
            self.loop = None
        with contextlib.suppress(Exception):
            webhook_setup.unregister(self.cluster.api_client())
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
        if self.scheduler is not None:
            self.scheduler.stop(grace=5.0)
            # The cluster would otherwise revive it, or report it as a process that died.
            with contextlib.suppress(ValueError):
                self.cluster.procs.remove(self.scheduler)
            self.scheduler = None
        self._reset_nodes(usage=True)

    def _reset_nodes(self, *, usage: bool) -> None:
        """Every node as the cluster started it (usage=True) or without our functions' state:
        the usage record and load label annotate-usage wrote, rebalance-nodes' hot streak."""
        for node in self.cluster.nodes:
            annotations: dict[str, Any] = {HOT_STREAK_ANNOTATION: None}
            labels: dict[str, Any] = {}
            if usage:
                annotations.update(
                    {
                        USAGE_ANNOTATION: None,
                        SIM_CPU_USAGE_ANNOTATION: None,
                        SIM_MEMORY_USAGE_ANNOTATION: None,
                    }
                )
                labels[LOAD_LABEL] = None
            self.cluster.rest.patch(
                f"/api/v1/nodes/{node}",
                {"metadata": {"annotations": annotations, "labels": labels}},
            )

    # -- one phase ------------------------------------------------------------------------------

    def run(self, phase: Phase, index: int) -> dict[str, JSON]:
        assert self.loop is not None
        rest = self.cluster.rest
        namespaces = [f"bench-load-{index}-{s.name}" for s in self.scales.shapes]
        # A clean start: the previous phase's pods gone, Prometheus and annotate-usage past
        # their rate window, no hot streak left over.
        self._reset_nodes(usage=False)
        self._quiet()
        probe = f"bench-load-{index}-probe"
        scheduler = LOAD_AWARE_SCHEDULER_NAME if phase.placement == "extender" else None
        expected = sum(s.replicas for s in self.scales.shapes)
        try:
            for ns in namespaces:
                create_namespace(rest, ns)
            if phase.placement == "label":
                webhook_setup.register(
                    self.cluster.api_client(),
                    webhook_setup.configuration(
                        self.servers["mutate-admission"].url, self.webhook_ca
                    ),
                )
                self._wait_webhook(probe)
            t0 = time.monotonic()
            for ns, shape in zip(namespaces, self.scales.shapes, strict=True):
                rest.post(
                    f"/apis/apps/v1/namespaces/{ns}/deployments", deployment(shape, scheduler)
                )
            placed = self._wait_placed(expected, t0 + self.scales.placement_bound)
            placement_s = time.monotonic() - t0
            # The usage of what was placed (the loop's next sample, after the last pod ran).
            self.loop.step()
            usage, pods = self.loop.snapshot()
            at_placement = spread(usage)
            pending = expected - placed
            out: dict[str, JSON] = {}
            if phase.names[0] is not None:
                out[phase.names[0]] = self._result(
                    phase.names[0], at_placement, placement_s, pending, pods, expected
                )
            out[phase.names[1]] = self._rebalance(
                phase, at_placement, placement_s, pending, expected
            )
        finally:
            if phase.placement == "label":
                webhook_setup.unregister(self.cluster.api_client())
            self._delete([*namespaces, probe])
        return out

    def _result(
        self,
        name: str,
        at_placement: Spread,
        placement_s: float,
        pending: int,
        pods: list[JSON],
        expected: int,
    ) -> JSON:
        """A system without rebalancing: its figures stay the placement's."""
        return {
            "system": name,
            "pods": expected,
            "placement_s": round(placement_s, 1),
            "pending_after_placement": pending,
            "after_placement": at_placement.to_json(),
            "pods_per_node": _per_node(pods),
            "steered_by_load_label": sum(1 for p in pods if steered_by_load(p)),
            "rebalancer": None,
            "evictions": 0,
            "all_under_threshold_s": 0.0 if not at_placement.over else None,
            "held_to_end": not at_placement.over,
            "end": at_placement.to_json(),
        }

    def _rebalance(
        self, phase: Phase, at_placement: Spread, placement_s: float, pending: int, expected: int
    ) -> JSON:
        assert self.loop is not None
        self.loop.mark()
        proc: Proc | None = None
        pinger: Pinger | None = None
        if phase.rebalancer == "descheduler":
            proc = self._start_descheduler()
        else:
            pinger = Pinger(self.servers["rebalance-nodes"], self.scales.every).start()
        t0 = time.monotonic()
        samples: list[tuple[float, Spread]] = [(0.0, at_placement)]
        timeline: list[list[float]] = []
        try:
            while time.monotonic() - t0 < self.scales.rebalance_bound:
                time.sleep(1.0)
                if proc is not None and not proc.alive():
                    raise RuntimeError(f"the descheduler exited:\n{proc.log_tail()}")
                usage, _ = self.loop.snapshot()
                s = spread(usage)
                t = time.monotonic() - t0
                samples.append((t, s))
                timeline.append([round(t, 1), round(s.max_cpu, 1), len(s.over)])
                if under_for(samples) >= self.scales.hold:
                    break
        finally:
            if proc is not None:
                proc.stop(grace=5.0)
            if pinger is not None:
                pinger.stop()
        cycles = descheduler_cycles(proc.log_path.read_text()) if proc is not None else None
        elapsed = time.monotonic() - t0
        self.loop.step()
        usage, pods = self.loop.snapshot()
        end = spread(usage)
        conv = convergence([*samples, (elapsed, end)])
        out: JSON = {
            "system": phase.names[1],
            "pods": expected,
            "placement_s": round(placement_s, 1),
            "pending_after_placement": pending,
            "after_placement": at_placement.to_json(),
            "rebalancer": phase.rebalancer,
            "rebalance_window_s": round(elapsed, 1),
            "evictions": evicted(self.loop.seen_since_mark(), _live(pods)),
            "all_under_threshold_s": conv.first_all_under_s,
            "held_to_end": conv.held_to_end,
            "end": end.to_json(),
            "pods_per_node": _per_node(pods),
            "pending_at_end": sum(1 for p in pods if not (p.get("spec") or {}).get("nodeName")),
            "timeline": timeline,
        }
        if pinger is not None:
            out["pings"] = {"sent": pinger.pings, "failed": pinger.failures}
        if cycles is not None:
            out["descheduler_cycles"] = cycles
        return out

    def _start_descheduler(self) -> Proc:
        directory = self.workdir / "descheduler"
        directory.mkdir(parents=True, exist_ok=True)
        kubeconfig = identity_kubeconfig(self.cluster, DESCHEDULER_USER, directory)
        policy_file = directory / "policy.yaml"
        policy_file.write_text(
            yaml.safe_dump(
                descheduler_policy(
                    self.cluster.prometheus_url, descheduler_query(self.scales.rate_window)
                )
            )
        )
        secrets = directory / "serviceaccount"
        secrets.mkdir(exist_ok=True)
        shutil.copy(ca_path(self.cluster), secrets / "ca.crt")
        # Our Prometheus asks for no credentials; the client sends this as its bearer token,
        # read as is: a newline at the end would make the Authorization header invalid.
        (secrets / "token").write_text("bench-prometheus-needs-no-token")
        port = self.cluster.server.rsplit(":", 1)[1]
        argv = in_pod_argv(
            secrets,
            [
                str(self.descheduler_bin),
                f"--kubeconfig={kubeconfig}",
                f"--policy-config-file={policy_file}",
                f"--descheduling-interval={self.scales.every}s",
                "--secure-port=0",
                "--v=2",
            ],
        )
        return Proc(
            "descheduler-load",
            argv,
            directory / "descheduler.log",
            # What rest.InClusterConfig needs to see a pod (the token is all it reads here).
            env={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port},
            cwd=directory,
        )

    def _wait_webhook(self, namespace: str) -> None:
        """Waits until the API server calls the webhook just registered (it picks a new
        registration up from its own watch, a moment later): a pod in a namespace opted in to
        load-aware placement, created as a server-side dry run, comes back with the affinity."""
        rest = self.cluster.rest
        rest.post(
            "/api/v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace, "labels": {LOAD_AWARE_KEY: "true"}},
            },
        )
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe"},
            "spec": {"containers": [{"name": "app", "image": IMAGE}]},
        }

        def mutated() -> bool:
            try:
                created = rest.request(
                    "POST",
                    f"/api/v1/namespaces/{namespace}/pods",
                    body=probe,
                    params={"dryRun": "All"},
                )
            except ApiError:
                return False  # the namespace's default ServiceAccount may not exist yet
            return steered_by_load(created)

        wait_until(mutated, 60, 0.2, "mutate-admission called by the API server")

    def _wait_placed(self, expected: int, deadline: float) -> int:
        """Waits until ``expected`` pods of the burst run (or ``deadline``); how many do."""
        assert self.loop is not None
        running = 0
        while time.monotonic() < deadline:
            _, pods = self.loop.snapshot()
            running = sum(1 for p in pods if running_on(p))
            if running >= expected:
                return running
            time.sleep(0.5)
        return running

    def _quiet(self) -> None:
        """Waits until no pod of the burst is left and the usage every reader sees is the
        background again (a rate window and an annotate-usage period)."""
        assert self.loop is not None
        wait_until(
            lambda: not self.loop.snapshot()[1] if self.loop else True, 180, 1.0, "no bench pods"
        )
        time.sleep(_seconds(self.scales.rate_window) + 2 * self.scales.usage_every)

    def _delete(self, namespaces: Sequence[str]) -> None:
        for ns in namespaces:
            with contextlib.suppress(ApiError):
                self.cluster.rest.delete(f"/api/v1/namespaces/{ns}")

        def gone() -> bool:
            left = 0
            for ns in namespaces:
                try:
                    self.cluster.rest.get(f"/api/v1/namespaces/{ns}")
                    left += 1
                except ApiError as e:
                    if e.status != 404:
                        raise
            return left == 0

        wait_until(gone, 180, 0.5, "the load namespaces deleted")


def _seconds(window: str) -> float:
    return float(window.removesuffix("s"))


def _per_node(pods: Sequence[JSON]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pod in pods:
        node = running_on(pod)
        if node:
            out[node] = out.get(node, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: _node_order(kv[0])))


def measure(cluster: Cluster, workdir: Path, *, quick: bool, log: Callable[[str], None]) -> JSON:
    """Every system of ``system_names`` on ``cluster`` (the run's shared one)."""
    scales = QUICK_LOAD if quick else FULL_LOAD
    bench = LoadBench(cluster, scales, workdir, log)
    systems: dict[str, JSON] = {}
    failures: dict[str, str] = {}
    try:
        bench.start()
        assert bench.loop is not None
        for index, phase in enumerate(phases(scales)):
            log(f"load: {phase.placement} placement, then {phase.rebalancer}")
            try:
                systems.update(bench.run(phase, index))
            except Exception as exc:  # one system's failure leaves the others' figures
                traceback.print_exc()
                failures[phase.names[1]] = f"{type(exc).__name__}: {exc}"
                continue
            for name in phase.names:
                if name is None:
                    continue
                r = systems[name]
                log(
                    f"  {name}: max {r['end']['max_cpu_percent']} %, over 80 %: "
                    f"{r['end']['nodes_over_threshold']}, evictions {r['evictions']}, "
                    f"all under after {r['all_under_threshold_s']} s"
                )
        usage_loop_errors = bench.loop.errors
    finally:
        bench.stop()
    return {
        "nodes": len(cluster.nodes),
        "pods": sum(s.replicas for s in scales.shapes),
        "threshold_percent": THRESHOLD,
        "shapes": [s.__dict__ for s in scales.shapes],
        "background": {n: list(b) for n, b in background(cluster.nodes).items()},
        "scales": {
            "placement_bound_s": scales.placement_bound,
            "rebalance_bound_s": scales.rebalance_bound,
            "hold_s": scales.hold,
            "rebalance_every_s": scales.every,
            "usage_every_s": scales.usage_every,
            "rate_window": scales.rate_window,
        },
        "descheduler_version": descheduler.version(),
        "descheduler_policy": descheduler_policy(
            "<the cluster's Prometheus>", descheduler_query(scales.rate_window)
        ),
        "usage_loop_errors": usage_loop_errors,
        "systems": systems,
        "failures": failures,
    }
