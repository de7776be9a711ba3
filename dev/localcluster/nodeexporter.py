"""A node-exporter endpoint per kwok node, so a real Prometheus has real-looking nodes to scrape.

kwok nodes have no machine behind them, so nothing measures their CPU or memory. This module
serves, for each Node of the local cluster, what the real node-exporter serves for a machine,
under the same metric names and labels (checked against node-exporter's own output), so PromQL
written here works unchanged on a real cluster:

- ``node_cpu_seconds_total{cpu, mode}``: counters per CPU and mode that grow as a real node's
  do. Each second, every CPU spends ``1 - usage`` seconds idle and ``usage`` seconds busy
  (80 % user, 20 % system); the other modes (iowait, irq, nice, softirq, steal) stay at 0. So
  ``1 - avg by (node) (rate(node_cpu_seconds_total{mode="idle"}[1m]))`` is the usage.
- ``node_memory_MemTotal_bytes`` (the Node's memory capacity), ``node_memory_MemAvailable_bytes``
  (``MemTotal * (1 - usage)``) and the fields older expressions use (MemFree, Buffers, Cached,
  Active_file, Inactive_file), split so that ``MemFree + Buffers + Cached == MemAvailable``.
- ``node_load1``/``node_load5``/``node_load15``: CPUs times CPU usage, with no damping (a real
  load average trails the load by about a minute; a test would only wait longer).
- ``node_uname_info``: the Node's kernel version and architecture, as labels.

The values come from the Node object itself: the number of CPUs and the memory from
``status.capacity``, the usage from the annotations ``sim.kn-rescheduler.io/cpu-usage`` and
``sim.kn-rescheduler.io/memory-usage`` (fractions 0..1; absent means a quiet node, 10 % CPU and
20 % memory). A watch keeps them current, so a scrape never calls the API server and a usage set
on the Node shows up at the next scrape.

One HTTP server on a free 127.0.0.1 port serves every node, ``/metrics/<node>`` each; the
Prometheus scrape configuration (:mod:`localcluster.prometheus`) gives each target the labels a
real cluster's would.

The pure part (reading a Node, advancing the CPU counters, writing the exposition text) is
separate from the threads that serve and watch, and is what the unit tests check.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

from kubernetes.utils import parse_quantity

from dev.localcluster.keys import (
    SIM_CPU_USAGE_ANNOTATION,
    SIM_MEMORY_USAGE_ANNOTATION,
)
from dev.localcluster.rest import ApiError, Rest

JSON = dict[str, Any]

# A node nobody set a usage on: busy enough to look alive, far from any pressure threshold.
DEFAULT_CPU_USAGE: Final = 0.1
DEFAULT_MEMORY_USAGE: Final = 0.2
# How busy CPU time splits between the user and system modes.
USER_SHARE: Final = 0.8
# node-exporter's CPU modes on Linux (/proc/stat), in the order it writes them.
CPU_MODES: Final = ("idle", "iowait", "irq", "nice", "softirq", "steal", "system", "user")
# How the available memory splits into the fields older expressions add up.
CACHED_SHARE: Final = 0.4
BUFFERS_SHARE: Final = 0.05
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
PATH_PREFIX: Final = "/metrics/"
WATCH_SECONDS: Final = 10


def usage_fraction(raw: object, default: float) -> tuple[float, str | None]:
    """The usage an annotation value means (clamped to 0..1), and a problem if it was not a
    number (then the default applies)."""
    if raw is None:
        return default, None
    try:
        value = float(str(raw).strip())
    except ValueError:
        return default, f"not a number: {raw!r}"
    if math.isnan(value):
        return default, f"not a number: {raw!r}"
    return min(max(value, 0.0), 1.0), None


@dataclass(frozen=True)
class SimNode:
    """What the endpoint of one Node serves, read from the Node object."""

    name: str
    # The Node's InternalIP ("" if it has none): the address of a real node-exporter.
    internal_ip: str
    cpus: int
    memory_bytes: int
    cpu_usage: float
    memory_usage: float
    kernel_version: str = ""
    architecture: str = ""
    # Why a usage annotation was ignored (it was not a number).
    problems: tuple[str, ...] = ()


def sim_node(node: JSON) -> SimNode:
    """Reads a Node as the kubelet registered it (capacity, addresses, nodeInfo) plus the
    simulated usage annotations."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    capacity = status.get("capacity") or {}
    annotations = meta.get("annotations") or {}
    info = status.get("nodeInfo") or {}
    problems = []
    cpu, problem = usage_fraction(annotations.get(SIM_CPU_USAGE_ANNOTATION), DEFAULT_CPU_USAGE)
    if problem:
        problems.append(f"{SIM_CPU_USAGE_ANNOTATION}: {problem}")
    memory, problem = usage_fraction(
        annotations.get(SIM_MEMORY_USAGE_ANNOTATION), DEFAULT_MEMORY_USAGE
    )
    if problem:
        problems.append(f"{SIM_MEMORY_USAGE_ANNOTATION}: {problem}")
    ip = next(
        (
            str(a.get("address", ""))
            for a in status.get("addresses") or []
            if a.get("type") == "InternalIP"
        ),
        "",
    )
    return SimNode(
        name=str(meta.get("name", "")),
        internal_ip=ip,
        cpus=_quantity(capacity.get("cpu"), 1, whole=True),
        memory_bytes=_quantity(capacity.get("memory"), 0, whole=False),
        cpu_usage=cpu,
        memory_usage=memory,
        kernel_version=str(info.get("kernelVersion", "")),
        architecture=str(info.get("architecture", "")),
        problems=tuple(problems),
    )


def _quantity(raw: object, default: int, *, whole: bool) -> int:
    """A capacity quantity as an integer; a CPU count rounds up (a node with 1500m has two
    CPUs a node-exporter would list), never below 1."""
    if raw is None:
        return default
    try:
        value = parse_quantity(str(raw))
    except ValueError:
        return default
    return max(math.ceil(value), 1) if whole else int(value)


@dataclass(frozen=True)
class CpuTimes:
    """Seconds one CPU has spent in each mode that moves (the others stay 0)."""

    idle: float = 0.0
    user: float = 0.0
    system: float = 0.0


def advance(times: CpuTimes, usage: float, seconds: float) -> CpuTimes:
    """The counters ``seconds`` later, with the CPU ``usage`` busy all along."""
    if seconds <= 0:
        return times
    busy = usage * seconds
    return CpuTimes(
        idle=times.idle + seconds - busy,
        user=times.user + busy * USER_SHARE,
        system=times.system + busy * (1 - USER_SHARE),
    )


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value))


def exposition(node: SimNode, cpu: CpuTimes) -> str:
    """The node's metrics in Prometheus' text exposition format, as node-exporter writes them
    (every CPU has the same counters: only their average is simulated)."""
    lines = [
        "# HELP node_cpu_seconds_total Seconds the CPUs spent in each mode.",
        "# TYPE node_cpu_seconds_total counter",
    ]
    per_mode = {"idle": cpu.idle, "user": cpu.user, "system": cpu.system}
    for index in range(node.cpus):
        for mode in CPU_MODES:
            value = per_mode.get(mode, 0.0)
            lines.append(f'node_cpu_seconds_total{{cpu="{index}",mode="{mode}"}} {_number(value)}')
    load = node.cpus * node.cpu_usage
    for name, minutes in (("node_load1", "1m"), ("node_load15", "15m"), ("node_load5", "5m")):
        lines += [
            f"# HELP {name} {minutes} load average.",
            f"# TYPE {name} gauge",
            f"{name} {_number(load)}",
        ]
    total = float(node.memory_bytes)
    available = total * (1 - node.memory_usage)
    cached = available * CACHED_SHARE
    buffers = available * BUFFERS_SHARE
    memory = {
        "Active_file": cached / 2,
        "Buffers": buffers,
        "Cached": cached,
        "Inactive_file": cached / 2,
        "MemAvailable": available,
        "MemFree": available - cached - buffers,
        "MemTotal": total,
    }
    for field_name, value in memory.items():
        name = f"node_memory_{field_name}_bytes"
        lines += [
            f"# HELP {name} Memory information field {field_name}_bytes.",
            f"# TYPE {name} gauge",
            f"{name} {_number(value)}",
        ]
    uname = {
        "domainname": "(none)",
        "machine": {"amd64": "x86_64", "arm64": "aarch64"}.get(
            node.architecture, node.architecture
        ),
        "nodename": node.name,
        "release": node.kernel_version,
        "sysname": "Linux",
        "version": "",
    }
    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in uname.items())
    lines += [
        "# HELP node_uname_info Labeled system information as provided by the uname system call.",
        "# TYPE node_uname_info gauge",
        f"node_uname_info{{{labels}}} 1",
    ]
    return "\n".join(lines) + "\n"


# -- serving ------------------------------------------------------------------------------------


@dataclass
class _Tracked:
    node: SimNode
    cpu: CpuTimes
    at: float


@dataclass
class NodeExporter:
    """Serves ``/metrics/<node>`` for every Node of the cluster. ``start()``, then ``stop()``.

    ``on_nodes`` is called (from the watch thread, and once from ``start``) with every node
    whenever a node appears, goes or changes its InternalIP: what a scrape configuration
    needs to follow.
    """

    rest: Rest
    on_nodes: Callable[[Sequence[SimNode]], None] = lambda nodes: None
    clock: Callable[[], float] = time.monotonic
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("localcluster.nodes"))

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, _Tracked] = {}
        self._stopped = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._rv = ""

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT`` of the HTTP server."""
        if self._server is None:
            raise RuntimeError("the node exporter is not started")
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    @staticmethod
    def path(node: str) -> str:
        return PATH_PREFIX + node

    def nodes(self) -> list[SimNode]:
        with self._lock:
            return [t.node for _, t in sorted(self._nodes.items())]

    def scrape(self, name: str) -> str | None:
        """The exposition text of node ``name`` now (None for a node it does not know)."""
        now = self.clock()
        with self._lock:
            tracked = self._nodes.get(name)
            if tracked is None:
                return None
            tracked.cpu = advance(tracked.cpu, tracked.node.cpu_usage, now - tracked.at)
            tracked.at = now
            node, cpu = tracked.node, tracked.cpu
        return exposition(node, cpu)

    def start(self) -> None:
        """Listens, lists the nodes (so the first ``on_nodes`` has them all and the address),
        then serves and watches."""
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            # Keep-alive: Prometheus reuses one connection per target instead of one a scrape.
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                body: str | None = None
                if path.startswith(PATH_PREFIX):
                    body = exporter.scrape(path[len(PATH_PREFIX) :])
                elif path == "/":
                    body = "".join(f"{exporter.path(n.name)}\n" for n in exporter.nodes())
                data = (body if body is not None else f"no node at {path}\n").encode()
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per scrape, every second, per node: nobody reads that

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self._rv = self._list()
        self._threads = [
            threading.Thread(target=server.serve_forever, name="node-exporter-http", daemon=True),
            threading.Thread(target=self._watch_loop, name="node-exporter-watch", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for t in self._threads:
            t.join(timeout=1)

    # -- the Node watch ---------------------------------------------------------------------------

    def apply(self, node: JSON) -> bool:
        """Takes a Node's new state; True if the set of nodes or an address changed."""
        new = sim_node(node)
        if not new.name:
            return False
        now = self.clock()
        with self._lock:
            tracked = self._nodes.get(new.name)
            previous = tracked.node if tracked is not None else None
            if tracked is None:
                self._nodes[new.name] = _Tracked(new, CpuTimes(), now)
            else:
                # The old usage held until now; the new one holds from now on.
                tracked.cpu = advance(tracked.cpu, tracked.node.cpu_usage, now - tracked.at)
                tracked.at = now
                tracked.node = new
        if new.problems and (previous is None or previous.problems != new.problems):
            self.log.warning("node %s: %s (the default applies)", new.name, "; ".join(new.problems))
        return previous is None or previous.internal_ip != new.internal_ip

    def forget(self, name: str) -> bool:
        with self._lock:
            return self._nodes.pop(name, None) is not None

    def _list(self) -> str:
        """Lists every Node, drops the vanished ones, tells ``on_nodes``; returns the RV."""
        body = self.rest.get("/api/v1/nodes")
        names = set()
        for node in body.get("items", []):
            self.apply(node)
            names.add(node.get("metadata", {}).get("name"))
        for gone in {n.name for n in self.nodes()} - names:
            self.forget(gone)
        self.on_nodes(self.nodes())
        return str(body.get("metadata", {}).get("resourceVersion", ""))

    def _watch_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                if not self._rv:
                    self._rv = self._list()
                params = {"resourceVersion": self._rv}
                for event in self.rest.watch("/api/v1/nodes", params, WATCH_SECONDS):
                    if self._stopped.is_set():
                        return
                    etype, obj = event.get("type"), event.get("object") or {}
                    if etype == "ERROR":
                        if obj.get("code") == 410:
                            self._rv = ""  # too old: list again
                        break
                    self._rv = str(obj.get("metadata", {}).get("resourceVersion", self._rv))
                    changed = False
                    if etype in ("ADDED", "MODIFIED"):
                        changed = self.apply(obj)
                    elif etype == "DELETED":
                        changed = self.forget(str(obj.get("metadata", {}).get("name", "")))
                    if changed:
                        self.on_nodes(self.nodes())
            except ApiError as e:
                if self._stopped.is_set():
                    return
                if e.status == 410:
                    self._rv = ""
                self.log.debug("node watch: %s", e)
                time.sleep(0.5)
            except Exception:
                if self._stopped.is_set():
                    return
                self.log.exception("node watch failed")
                time.sleep(0.5)
