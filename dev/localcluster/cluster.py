"""A real Kubernetes control plane on 127.0.0.1 with kwok nodes and a fake kubelet.

``Cluster`` runs etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok from the
binaries of ``hack/build-bins.sh``, registers N nodes that kwok keeps alive, and runs the fake
kubelet (:mod:`localcluster.kubelet`) that writes pod statuses, faulty ones on nodes labelled
``sim.kn-rescheduler.io/fault``. Unless ``prometheus=False``, a real Prometheus scrapes a
node-exporter endpoint per node whose usage the Node's ``sim.kn-rescheduler.io/*-usage``
annotations set (:mod:`localcluster.prometheus`, :mod:`localcluster.nodeexporter`). With
``metrics_server=True`` a real metrics-server serves the Metrics API (``kubectl top``) from
kwok's emulated kubelet metrics, which follow the same annotations
(:mod:`localcluster.metricsserver`). Every port
is a free one on 127.0.0.1; every file (PKI, kubeconfigs, etcd data, logs) lives in the work
directory.

    with Cluster(nodes=4) as c:
        core = kubernetes.client.CoreV1Api(c.api_client())
        c.set_fault("node-1", "crashloop")
        c.set_node_usage("node-2", cpu=0.9)  # Prometheus at c.prometheus_url sees it
"""

from __future__ import annotations

import atexit
import base64
import logging
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from kubernetes import client as k8s_client

from dev.localcluster import (
    addons,
    addresses,
    knative,
    kwok,
    metricsserver,
    networkpolicies,
    nodeimages,
    pki,
    realnode,
    registry,
)
from dev.localcluster.bins import ensure_bins
from dev.localcluster.keys import (
    SIM_CPU_USAGE_ANNOTATION,
    SIM_FAULT_HITS_RUNNING_LABEL,
    SIM_FAULT_LABEL,
    SIM_MEMORY_USAGE_ANNOTATION,
)
from dev.localcluster.kubelet import FakeKubelet, Timing
from dev.localcluster.nodeexporter import NodeExporter
from dev.localcluster.podstatus import FAULT_MODES, HEALTHY
from dev.localcluster.procs import Component, Proc, free_ports, stop_all
from dev.localcluster.prometheus import (
    SCRAPE_INTERVAL,
    LocalPrometheus,
    PrometheusError,
    find_binary,
)
from dev.localcluster.rest import ApiError, Rest

log = logging.getLogger("localcluster")

K8S_VERSION: Final = "v1.36.3"
SERVICE_CIDR: Final = "10.96.0.0/16"
SA_ISSUER: Final = "https://kubernetes.default.svc.cluster.local"
CLUSTER_NAME: Final = "kn-rescheduler-local"
PROCESS_NAMES: Final = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
)
# Everything a ready cluster must have, after which start() gives up.
START_TIMEOUT: Final = 90.0


class ClusterError(RuntimeError):
    """The control plane failed to start (the message carries the failing process's log)."""


@dataclass(frozen=True)
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


def _kubeconfig(server: str, ca: Path, crt: Path, key: Path, user: str) -> dict[str, Any]:
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority-data": b64(ca)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(crt), "client-key-data": b64(key)},
            }
        ],
        "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": CLUSTER_NAME,
    }


class Cluster:
    """One local control plane. Use as a context manager, or call start() and stop()."""

    def __init__(
        self,
        workdir: Path | str | None = None,
        *,
        nodes: int = 4,
        timing: Timing | None = None,
        bins_dir: Path | None = None,
        components: Sequence[Component] = (),
        keep_workdir: bool | None = None,
        quiet: bool = False,
        prometheus: bool = True,
        prometheus_scrape_interval: str = SCRAPE_INTERVAL,
        metrics_server: bool = False,
        scheduler_config: Mapping[str, Any] | None = None,
        real_nodes: int = 0,
        kwok_manages_all: bool = True,
        controller_manager_qps: tuple[int, int] | None = None,
    ) -> None:
        if nodes < 0 or real_nodes < 0 or nodes + real_nodes < 1:
            raise ValueError("a cluster needs at least one node")
        if nodes > addresses.MAX_NODES:
            raise ValueError(
                f"{nodes} kwok nodes: the local cluster has addresses for {addresses.MAX_NODES}"
            )
        self._own_workdir = workdir is None
        self.workdir = (
            Path(tempfile.mkdtemp(prefix="kn-rescheduler-cluster-"))
            if workdir is None
            else Path(workdir).resolve()
        )
        self.keep_workdir = (not self._own_workdir) if keep_workdir is None else keep_workdir
        self.log_dir = self.workdir / "logs"
        self.kubeconfig = self.workdir / "kubeconfig"
        # kwok nodes (the fake kubelet writes their pods' statuses), then real ones (a kubelet
        # and a containerd each: localcluster.realnode).
        self.kwok_nodes = [f"node-{i}" for i in range(nodes)]
        self.real_nodes = [f"real-{i}" for i in range(real_nodes)]
        self.nodes = [*self.kwok_nodes, *self.real_nodes]
        self.realnodes: realnode.RealNodes | None = None
        self.registry: registry.LocalRegistry | None = None
        # Knative's event-display as installed with Eventing (install_knative_eventing): its
        # release name at the digest the registry holds.
        self.event_display: str | None = None
        self._node_images = Path()
        self.timing = timing or Timing()
        self.components = list(components)
        self.quiet = quiet
        self._bins_dir = bins_dir
        self.procs: list[Proc] = []
        self.kubelet: FakeKubelet | None = None
        self.ports: Ports | None = None
        self.server = ""
        self.startup_seconds: float | None = None
        self._pki: pki.ClusterPKI | None = None
        self._rest: Rest | None = None
        self._stopped = threading.Event()
        self._atexit_registered = False
        # Prometheus and the node-exporter endpoints it scrapes (None with prometheus=False).
        self.with_prometheus = prometheus
        # Every second by default (the local clock is compressed); a large cluster's run uses
        # what installs use (15 s or more): each scrape is a request to the harness's exporter.
        self.prometheus_scrape_interval = prometheus_scrape_interval
        self.prometheus: LocalPrometheus | None = None
        self.node_exporter: NodeExporter | None = None
        # metrics-server and what surrounds it (None with metrics_server=False).
        self.with_metrics_server = metrics_server
        # False: kwok keeps only the nodes the cluster registered (annotated), and Node objects
        # a caller creates stay unmanaged: no heartbeats (the extender bench's 1,000 Nodes).
        self.kwok_manages_all = kwok_manages_all
        self.metrics_server: metricsserver.MetricsServerStack | None = None
        self._metrics_server_bin = ""
        # (QPS, burst) of each controller's API client; None: kube-controller-manager's defaults
        # (20, 30), under which a ReplicaSet recreates a burst of pods a few a second.
        self.controller_manager_qps = controller_manager_qps
        # A KubeSchedulerConfiguration for the cluster's kube-scheduler (see _scheduler_argv).
        self.scheduler_config = dict(scheduler_config) if scheduler_config is not None else None

    # -- public API ----------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def bins_dir(self) -> Path:
        if self._bins_dir is None:
            self._bins_dir = ensure_bins(real_nodes=bool(self.real_nodes))
        return self._bins_dir

    @property
    def rest(self) -> Rest:
        if self._rest is None:
            raise ClusterError("the cluster is not started")
        return self._rest

    @property
    def ca_file(self) -> Path:
        return self._require_pki().ca_crt

    def api_client(self) -> k8s_client.ApiClient:
        """A fresh official-client ApiClient with cluster-admin (system:masters) credentials."""
        p = self._require_pki()
        cfg = k8s_client.Configuration(
            host=self.server,
            ssl_ca_cert=str(p.ca_crt),
            cert_file=str(p.admin_crt),
            key_file=str(p.admin_key),
        )
        return k8s_client.ApiClient(cfg)

    def set_fault(self, node: str, mode: str | None, *, running: bool = False) -> None:
        """Breaks ``node``: a kwok node is labelled with a fault mode the fake kubelet applies to
        pods bound later (podstatus.FAULT_MODES); a real node gets a real cause added
        (realnode.FAULTS). None or "none" heals it.

        ``running`` (kwok nodes, the crashing modes): the fault also hits the containers
        running there now, as a runtime breaking under its pods would; they exit and
        crash-loop in place; healing the node leaves them crash-looping, as it leaves the pods
        bound while it was faulty (the fake kubelet decides a run's fate once)."""
        if node not in self.nodes:
            raise ValueError(f"unknown node {node!r}; nodes are {self.nodes}")
        if mode == HEALTHY:
            mode = None
        if running and (node in self.real_nodes or mode not in ("crashloop", "oom")):
            raise ValueError(f"only a kwok node's crashloop or oom fault hits running pods: {mode}")
        if node in self.real_nodes:
            if self.realnodes is None:
                raise ClusterError("the cluster is not started")
            try:
                self.realnodes.set_fault(node, mode)
            except realnode.RealNodeError as e:
                raise ClusterError(str(e)) from e
            return
        if mode is not None and mode not in FAULT_MODES:
            raise ValueError(f"unknown fault mode {mode!r}; modes are {FAULT_MODES}")
        labels = {SIM_FAULT_LABEL: mode, SIM_FAULT_HITS_RUNNING_LABEL: "true" if running else None}
        self.rest.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": labels}})

    # -- Prometheus ----------------------------------------------------------------------------

    @property
    def prometheus_url(self) -> str:
        """``http://127.0.0.1:PORT`` of the cluster's Prometheus (the same while it is stopped)."""
        if self.prometheus is None:
            raise ClusterError("this cluster runs no Prometheus (started with prometheus=False)")
        return self.prometheus.url

    def set_node_usage(
        self, node: str, cpu: float | None = None, memory: float | None = None
    ) -> None:
        """Sets the simulated CPU and/or memory usage (fractions 0..1) of ``node``, which its
        node-exporter endpoint serves from the next scrape on; None leaves a value alone."""
        annotations = {}
        for key, value in ((SIM_CPU_USAGE_ANNOTATION, cpu), (SIM_MEMORY_USAGE_ANNOTATION, memory)):
            if value is None:
                continue
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"usage is a fraction of 0..1, got {value!r}")
            annotations[key] = str(float(value))
        if annotations:
            self.rest.patch(f"/api/v1/nodes/{node}", {"metadata": {"annotations": annotations}})

    def stop_prometheus(self, *, kill: bool = False) -> None:
        """Stops Prometheus (SIGTERM, or SIGKILL), for outage tests; the endpoints stay."""
        if self.prometheus is None:
            raise ClusterError("this cluster runs no Prometheus (started with prometheus=False)")
        self.prometheus.stop(kill=kill)
        self._say("prometheus stopped")

    def start_prometheus(self, timeout: float = 60.0) -> None:
        """Starts Prometheus again on the same port with the same data; returns once it has
        scraped every node of the cluster. Call it from the thread that started the cluster
        (the process dies with the thread that starts it)."""
        if self.prometheus is None:
            raise ClusterError("this cluster runs no Prometheus (started with prometheus=False)")
        deadline = time.monotonic() + timeout
        try:
            self.prometheus.start(deadline)
            self.prometheus.wait_scraped(self.nodes, deadline)
        except PrometheusError as e:
            raise ClusterError(str(e)) from e
        self._say(f"prometheus serving at {self.prometheus.url}")

    def pids(self) -> dict[str, int]:
        return {p.name: p.pid for p in self.procs}

    def restart(self, name: str, *, kill: bool = False, timeout: float = 60.0) -> float:
        """Stops one process of the control plane and starts it again; the seconds until it
        serves again.

        ``kill`` sends SIGKILL, as a crash or an OOM kill would; otherwise SIGTERM, as a
        rolling restart does. The process comes back with the same command line: same ports,
        certificates and etcd data (etcd's data directory outlives it), so clients reconnect
        to the same address. "Serves again" is etcd's ``/health`` for etcd, then the API
        server's ``/readyz`` (which checks etcd); ``/readyz`` for the API server; running for
        the others. Other processes may exit meanwhile: the controller manager and the
        scheduler give up when they cannot renew their leader lease for 10 s (a kubelet
        restarts them, being static pods); ``revive`` does that here.

        Call it from the thread that started the cluster (see ``start``): the restarted
        process dies with the thread that started it.
        """
        index = next((i for i, p in enumerate(self.procs) if p.name == name), None)
        if index is None:
            raise ValueError(f"no process {name!r}; processes are {[p.name for p in self.procs]}")
        t0 = time.monotonic()
        old = self.procs[index]
        if kill:
            old.kill()
            old.wait(10.0)
        else:
            old.stop(grace=10.0)
        self._say(f"restarting {name} ({'SIGKILL' if kill else 'SIGTERM'})")
        self.procs[index] = old.respawn()
        self._wait_serving(name, time.monotonic() + timeout)
        return time.monotonic() - t0

    def revive(self, timeout: float = 60.0) -> list[str]:
        """Starts again every process of the control plane that exited (what a kubelet does
        for static pods); the names of those restarted, once they serve again."""
        revived = []
        for i, proc in enumerate(self.procs):
            if not proc.alive():
                self._say(f"{proc.name} exited with {proc.returncode}: starting it again")
                self.procs[i] = proc.respawn()
                revived.append(proc.name)
        deadline = time.monotonic() + timeout
        for name in revived:
            self._wait_serving(name, deadline)
        return revived

    def _wait_serving(self, name: str, deadline: float) -> None:
        """Wait until the process ``name`` serves (see ``restart``); only its own exit fails."""
        proc = next(p for p in self.procs if p.name == name)
        checks: list[tuple[str, Callable[[], bool]]] = []
        if name == "etcd":
            assert self.ports is not None
            pki_ = self._require_pki()
            etcd = Rest(
                f"http://127.0.0.1:{self.ports.etcd}",
                ca_file=pki_.ca_crt,
                cert_file=pki_.admin_crt,
                key_file=pki_.admin_key,
            )
            checks.append(("etcd", lambda: '"health":"true"' in etcd.text("/health", 1.0)[1]))
        if name in ("etcd", "kube-apiserver"):
            checks.append(
                ("kube-apiserver /readyz", lambda: self.rest.text("/readyz", 2.0) == (200, "ok"))
            )
        for what, check in checks:
            while True:
                if not proc.alive():
                    raise ClusterError(
                        f"{name} exited with code {proc.returncode} after a restart; last log "
                        f"lines ({proc.log_path}):\n{proc.log_tail()}"
                    )
                try:
                    if check():
                        break
                except ApiError:
                    pass
                if time.monotonic() > deadline:
                    raise ClusterError(f"timed out waiting for {what} after restarting {name}")
                time.sleep(0.1)

    def start(self) -> Cluster:
        """Starts everything and returns once the cluster is ready (see ``wait_ready``).

        Call it from a thread that lives as long as the cluster (normally the main thread):
        the kernel kills the children when the thread that started them ends.
        """
        bins = self.bins_dir  # may build; not part of the start-up time
        if self.real_nodes:
            absent = realnode.missing_tools()
            lacking = [b for b in ("kubelet", "kube-proxy") if not (bins / b).exists()]
            if absent or lacking:
                raise ClusterError(
                    f"real nodes need {', '.join(absent or lacking)}: run "
                    "`make cluster-bins` (as root) first"
                )
            try:
                self._node_images = nodeimages.ensure_node_images()  # may build
            except nodeimages.NodeImagesError as e:
                raise ClusterError(str(e)) from e
        try:
            prometheus_bin = find_binary() if self.with_prometheus else ""
        except PrometheusError as e:
            raise ClusterError(str(e)) from e
        if self.with_metrics_server and not self._metrics_server_bin:
            try:
                self._metrics_server_bin = metricsserver.ensure_binary()  # may build
            except metricsserver.MetricsServerError as e:
                raise ClusterError(str(e)) from e
        last: ClusterError | None = None
        for _ in range(2):
            t0 = time.monotonic()
            try:
                self._start_once(bins, prometheus_bin)
            except ClusterError as e:
                self.keep_workdir = True  # the logs say why
                self.stop(remove=False)
                # Another process may have grabbed one of our free ports in the meantime.
                if "address already in use" not in str(e):
                    raise
                last = e
                continue
            except BaseException:
                self.keep_workdir = True  # the logs say why
                self.stop(remove=False)
                raise
            self.startup_seconds = time.monotonic() - t0
            self._say(
                f"local cluster ready in {self.startup_seconds:.1f}s: {self.server}, "
                f"kubeconfig {self.kubeconfig}, logs {self.log_dir}"
            )
            return self
        assert last is not None
        raise last

    def stop(self, remove: bool | None = None) -> None:
        """Stops Prometheus and its endpoints, the components, the fake kubelet and the control
        plane (in that order)."""
        if self.prometheus is not None:
            self.prometheus.stop()
            self.prometheus.remove_data()  # bulk; its log, config and targets stay
            self.prometheus = None
        if self.node_exporter is not None:
            self.node_exporter.stop()
            self.node_exporter = None
        if self.metrics_server is not None:
            self.metrics_server.stop()  # the node network; the process stops below
            self.metrics_server = None
        if self.kubelet is not None:
            self.kubelet.stop()
            self.kubelet = None
        if self.realnodes is not None:
            self.realnodes.stop()  # kubelets, containers, containerd, what they changed
            self.realnodes = None
        if self.registry is not None:
            self.registry.stop()
            self.registry = None
        procs, self.procs = self.procs, []
        # Dependants first; etcd last so the API server can shut down cleanly.
        stop_all(list(reversed(procs)), grace=10.0)
        self._stopped.set()
        if remove if remove is not None else not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _at_exit(self) -> None:
        # An interpreter exiting without stop() (a crashed test session): stop what runs.
        if (
            self.procs
            or self.kubelet is not None
            or self.prometheus is not None
            or self.realnodes is not None
        ):
            self.stop()

    def check_alive(self) -> None:
        """Raises ClusterError naming the first process that exited."""
        for p in self.procs:
            if not p.alive():
                raise ClusterError(
                    f"{p.name} exited with code {p.returncode}; last log lines "
                    f"({p.log_path}):\n{p.log_tail()}"
                )
        if self.realnodes is not None:
            try:
                self.realnodes.check_alive()
            except realnode.RealNodeError as e:
                raise ClusterError(str(e)) from e
        prom = self.prometheus.proc if self.prometheus is not None else None
        if prom is not None and not prom.alive():
            raise ClusterError(
                f"prometheus exited with code {prom.returncode}; last log lines "
                f"({prom.log_path}):\n{prom.log_tail()}"
            )

    def state(self) -> dict[str, Any]:
        """What the supervisor records about this cluster (JSON-serialisable)."""
        return {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "workdir": str(self.workdir),
            "log_dir": str(self.log_dir),
            "nodes": self.nodes,
            "real_nodes": self.realnodes.state() if self.realnodes is not None else {},
            "registry": self.registry.host if self.registry is not None else None,
            "ports": self.ports.__dict__ if self.ports else {},
            "pids": self.pids(),
            "startup_seconds": self.startup_seconds,
            "bins_dir": str(self.bins_dir),
            "prometheus_url": self.prometheus.url if self.prometheus is not None else None,
            "prometheus_pid": (
                self.prometheus.proc.pid
                if self.prometheus is not None and self.prometheus.proc is not None
                else None
            ),
        }

    # -- start-up --------------------------------------------------------------------------------

    def _say(self, message: str) -> None:
        log.info(message)
        if not self.quiet:
            print(f"[localcluster] {message}", file=sys.stderr, flush=True)

    def _require_pki(self) -> pki.ClusterPKI:
        if self._pki is None:
            raise ClusterError("the cluster is not started")
        return self._pki

    def _prepare_workdir(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name in ("etcd", "pki", "kwok", "certs"):
            shutil.rmtree(self.workdir / name, ignore_errors=True)
        for name in ("kubeconfig", "controller-manager.kubeconfig", "scheduler.kubeconfig"):
            (self.workdir / name).unlink(missing_ok=True)
        # Only our own logs: a supervisor may already be writing its log in the same directory.
        self.log_dir.mkdir(parents=True, exist_ok=True)
        names = [*PROCESS_NAMES, "fake-kubelet", *(c.name for c in self.components)]
        for name in names:
            (self.log_dir / f"{name}.log").unlink(missing_ok=True)
        if not self._atexit_registered:
            atexit.register(self._at_exit)
            self._atexit_registered = True

    def _spawn(self, name: str, argv: list[str], **kw: Any) -> Proc:
        proc = Proc(name, argv, self.log_dir / f"{name}.log", **kw)
        self.procs.append(proc)
        return proc

    def _wait(self, what: str, check: Callable[[], bool], deadline: float) -> None:
        while True:
            self.check_alive()
            try:
                if check():
                    return
            except ApiError:
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for {what}")
            time.sleep(0.1)

    def _start_once(self, bins: Path, prometheus_bin: str) -> None:
        self._stopped.clear()
        self._prepare_workdir()
        # Real nodes add a registry push and a containerd per node before the kubelets start.
        deadline = time.monotonic() + START_TIMEOUT + 30.0 * len(self.real_nodes)
        *control_plane, prometheus_port = free_ports(7)
        ports = Ports(*control_plane)
        self.ports = ports
        # Real nodes reach the API server on their network's gateway, an address of the
        # machine's that only the nodes' bridge carries (nodenet.py); kwok-only clusters keep
        # it on loopback.
        host = self._prepare_real_nodes() if self.real_nodes else "127.0.0.1"
        self.server = f"https://{host}:{ports.apiserver}"
        p = pki.generate(self.workdir / "pki", apiserver_ips=(host,) if self.real_nodes else ())
        self._pki = p
        self.kubeconfig.write_text(
            yaml.safe_dump(
                _kubeconfig(self.server, p.ca_crt, p.admin_crt, p.admin_key, "kubernetes-admin")
            )
        )
        kcm_kubeconfig = self.workdir / "controller-manager.kubeconfig"
        kcm_kubeconfig.write_text(
            yaml.safe_dump(
                _kubeconfig(
                    self.server,
                    p.ca_crt,
                    p.controller_manager_crt,
                    p.controller_manager_key,
                    "system:kube-controller-manager",
                )
            )
        )
        sched_kubeconfig = self.workdir / "scheduler.kubeconfig"
        sched_kubeconfig.write_text(
            yaml.safe_dump(
                _kubeconfig(
                    self.server, p.ca_crt, p.scheduler_crt, p.scheduler_key, "system:kube-scheduler"
                )
            )
        )
        self._rest = Rest(
            self.server, ca_file=p.ca_crt, cert_file=p.admin_crt, key_file=p.admin_key
        )

        # etcd
        etcd_url = f"http://127.0.0.1:{ports.etcd}"
        peer_url = f"http://127.0.0.1:{ports.etcd_peer}"
        self._spawn(
            "etcd",
            [
                str(bins / "etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--initial-cluster-state=new",
                # A test cluster: durability across power loss buys nothing, fsync costs seconds.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        etcd = Rest(etcd_url, ca_file=p.ca_crt, cert_file=p.admin_crt, key_file=p.admin_key)
        self._wait("etcd", lambda: '"health":"true"' in etcd.text("/health", 1.0)[1], deadline)

        # kube-apiserver
        self._spawn(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--bind-address={host}",
                f"--advertise-address={host}",
                f"--secure-port={ports.apiserver}",
                f"--cert-dir={self.workdir / 'certs'}",
                f"--tls-cert-file={p.apiserver_crt}",
                f"--tls-private-key-file={p.apiserver_key}",
                f"--client-ca-file={p.ca_crt}",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={p.sa_pub}",
                f"--service-account-signing-key-file={p.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--requestheader-client-ca-file={p.front_proxy_ca_crt}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={p.front_proxy_client_crt}",
                f"--proxy-client-key-file={p.front_proxy_client_key}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction,MutatingAdmissionWebhook,"
                "ValidatingAdmissionWebhook",
                "--allow-privileged=true",
                *(
                    # Pods reach the API server through the `kubernetes` Service (kube-proxy
                    # on every real node), whose endpoint is the advertised address; the API
                    # server reaches webhooks and aggregated APIs at their pods' addresses,
                    # as no kube-proxy runs on the machine itself.
                    ["--enable-aggregator-routing=true"]
                    if self.real_nodes
                    # The default reconciler would publish 127.0.0.1 as the endpoint of the
                    # `kubernetes` Service, which Endpoints validation rejects (loopback).
                    else ["--endpoint-reconciler-type=none"]
                ),
                # Real nodes' Hostnames resolve nowhere. The admin identity reads logs and
                # execs.
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--kubelet-client-certificate={p.admin_crt}",
                f"--kubelet-client-key={p.admin_key}",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait(
            "kube-apiserver /readyz",
            lambda: self.rest.text("/readyz", 2.0) == (200, "ok"),
            deadline,
        )

        # Controllers, scheduler and kwok in parallel; nodes registered meanwhile.
        self._spawn(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={kcm_kubeconfig}",
                f"--authentication-kubeconfig={kcm_kubeconfig}",
                f"--authorization-kubeconfig={kcm_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports.controller_manager}",
                f"--cert-dir={self.workdir / 'certs'}",
                "--leader-elect=true",
                "--controllers=*",
                "--use-service-account-credentials=true",
                f"--root-ca-file={p.ca_crt}",
                f"--service-account-private-key-file={p.sa_key}",
                f"--cluster-signing-cert-file={p.ca_crt}",
                f"--cluster-signing-key-file={p.ca_key}",
                f"--cluster-name={CLUSTER_NAME}",
                "--allocate-node-cidrs=true",
                f"--cluster-cidr={addresses.CLUSTER_CIDR}",
                f"--node-cidr-mask-size={addresses.NODE_CIDR_MASK}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--profiling=false",
                *(
                    [
                        f"--kube-api-qps={self.controller_manager_qps[0]}",
                        f"--kube-api-burst={self.controller_manager_qps[1]}",
                    ]
                    if self.controller_manager_qps
                    else []
                ),
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            self._scheduler_argv(
                bins, "kube-scheduler", ports.scheduler, self.scheduler_config, "kube-scheduler"
            ),
        )
        kwok_dir = self.workdir / "kwok"
        kwok_dir.mkdir()
        kwok_config = kwok_dir / "stages.yaml"
        kwok_config.write_text(
            kwok.config_yaml()
            + (metricsserver.kwok_config_yaml() if self.with_metrics_server else "")
        )
        self._spawn(
            "kwok",
            [
                str(bins / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={kwok_config}",
                # Only the nodes it registered: real nodes have kubelets of their own.
                *(
                    ["--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake"]
                    if self.real_nodes or not self.kwok_manages_all
                    else ["--manage-all-nodes=true"]
                ),
                f"--server-address=127.0.0.1:{ports.kwok}",
                "--node-lease-duration-seconds=40",
            ],
            # kwok also reads ~/.kwok/kwok.yaml; keep whatever a user has there out of it.
            env={"KWOK_WORKDIR": str(kwok_dir)},
        )
        for i, name in enumerate(self.kwok_nodes):
            self._register_node(i, name)
        if self.real_nodes:
            self._start_real_nodes(deadline)
        if prometheus_bin:
            try:
                self._start_prometheus_stack(prometheus_bin, prometheus_port, deadline)
            except PrometheusError as e:
                raise ClusterError(str(e)) from e

        self.kubelet = FakeKubelet(
            Rest(
                self.server,
                ca_file=p.ca_crt,
                cert_file=p.admin_crt,
                key_file=p.admin_key,
                user_agent="kn-rescheduler-fake-kubelet",
            ),
            frozenset(self.kwok_nodes),
            self.timing,
            fallback_cidr=self._fallback_cidr,
            log=self._kubelet_logger(),
        )
        self.kubelet.start()
        self.wait_ready(deadline)
        if self.real_nodes:
            self._install_addons(max(deadline, time.monotonic() + 60.0))
        if self.prometheus is not None:
            try:
                self.prometheus.wait_scraped(self.nodes, deadline)
            except PrometheusError as e:
                raise ClusterError(str(e)) from e
        if self.with_metrics_server:
            self._start_metrics_server()
        for component in self.components:
            self.start_component(component, deadline=time.monotonic() + component.ready_timeout)

    def _prepare_real_nodes(self) -> str:
        """The real nodes' network, made before the API server that listens on it; returns
        its gateway (the machine's address there)."""
        nodes = realnode.RealNodes(
            self.log_dir,
            self.real_nodes,
            kubelet_bin=self.bins_dir / "kubelet",
            kube_proxy_bin=self.bins_dir / "kube-proxy",
        )
        self.realnodes = nodes
        try:
            return nodes.prepare().gateway
        except realnode.RealNodeError as e:
            raise ClusterError(str(e)) from e

    def _start_real_nodes(self, deadline: float) -> None:
        """The local registry with the node images, then containerd, a kubelet and kube-proxy
        per real node (see realnode.py); their Nodes register themselves."""
        images = self._node_images
        nodes = self.realnodes
        assert nodes is not None
        reg = registry.LocalRegistry(self.workdir / "registry", self.log_dir, host=nodes.gateway)
        self.registry = reg
        try:
            reg.start(deadline)
            nodeimages.push_node_images(reg, images)
            nodes.start(
                deadline,
                server=self.server,
                cluster_pki=self._require_pki(),
                registry=reg.host,
                pause_archive=images / nodeimages.PAUSE_ARCHIVE,
            )
        except (realnode.RealNodeError, registry.RegistryError, nodeimages.NodeImagesError) as e:
            raise ClusterError(str(e)) from e
        self._say(f"real nodes {', '.join(self.real_nodes)} started (registry {reg.host})")

    def _install_addons(self, deadline: float) -> None:
        """CoreDNS, from Kubernetes' own add-on manifest (addons.py), ready before start()
        returns: a pod's first lookup must not race the cluster DNS."""
        try:
            addons.install_coredns(
                self.bins_dir / "kubectl",
                self.kubeconfig,
                self._node_images,
                real_nodes_only=bool(self.kwok_nodes),
                available=self._coredns_available,
                deadline=deadline,
            )
        except addons.AddonError as e:
            raise ClusterError(str(e)) from e
        self._say("CoreDNS ready (kube-system/kube-dns)")

    def install_knative_eventing(self, timeout: float = 900.0) -> Path:
        """Knative Eventing from the manifests ko resolves from its module, as a user installs
        it (knative.py); returns the directory of those manifests. Real nodes only: Knative's
        controllers, webhook and data plane run as pods."""
        if self.realnodes is None or self.registry is None or self.kwok_nodes:
            raise ClusterError("Knative Eventing installs on a cluster of real nodes only")
        try:
            directory = knative.ensure_eventing()  # may build: several minutes the first time
            self.event_display = knative.install(
                self.registry,
                self.bins_dir / "kubectl",
                self.kubeconfig,
                directory,
                deployments=self._knative_deployments,
                deadline=time.monotonic() + timeout,
                say=self._say,
            )
        except knative.KnativeError as e:
            raise ClusterError(str(e)) from e
        return directory

    def install_network_policies(self, timeout: float = 120.0) -> None:
        """kube-router's firewall on every real node (networkpolicies.py): from then on the
        cluster's NetworkPolicies refuse what they do not admit, as a CNI that enforces them
        does. Real nodes only: a kwok node runs no pod and filters nothing."""
        nodes = self.realnodes
        if nodes is None or nodes.net is None:
            raise ClusterError("NetworkPolicies are enforced on a cluster of real nodes only")
        if not realnode.bridged_traffic_filtered():
            raise ClusterError(
                "NetworkPolicies cannot be enforced here: bridged traffic skips iptables "
                f"({realnode.BRIDGE_NF_CALL_IPTABLES} is not 1: load br_netfilter), so every "
                "Service connection leaves with its node's address and no policy can tell "
                "senders apart"
            )
        missing = networkpolicies.missing_tools()
        if missing:
            raise ClusterError(
                f"enforcing NetworkPolicies needs {', '.join(missing)} (Debian: "
                "hack/install-packages.sh installs them)"
            )
        try:
            directory = networkpolicies.ensure()
            manifest = (directory / networkpolicies.RBAC_MANIFEST).read_text()
            addons.apply(
                self.bins_dir / "kubectl",
                self.kubeconfig,
                networkpolicies.rbac_documents(manifest),
            )
        except addons.AddonError as e:
            raise ClusterError(str(e)) from e
        nodes.start_firewalls(directory / networkpolicies.BINARY)
        deadline = time.monotonic() + timeout
        waiting = [n.address for n in nodes.net.nodes]
        while waiting := [a for a in waiting if not networkpolicies.healthy(a)]:
            nodes.check_alive()  # a firewall that exited says why, with its log
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"kube-router's firewall is not healthy in time on {waiting}; see its logs "
                    f"(kube-router-<node>.log) in {self.log_dir}"
                )
            time.sleep(0.5)
        self._say("NetworkPolicies enforced (kube-router's firewall on every real node)")

    def _coredns_available(self) -> bool:
        try:
            deployment = self.rest.get("/apis/apps/v1/namespaces/kube-system/deployments/coredns")
        except ApiError:
            return False  # asked again until the deadline, which names what to look at
        return int(deployment.get("status", {}).get("readyReplicas") or 0) >= 1

    def _knative_deployments(self) -> list[dict[str, Any]]:
        try:
            listed = self.rest.get(f"/apis/apps/v1/namespaces/{knative.NAMESPACE}/deployments")
        except ApiError:
            return [{"metadata": {"name": "(the API server did not answer)"}}]
        items: list[dict[str, Any]] = listed.get("items", [])
        return items

    def _start_prometheus_stack(self, binary: str, port: int, deadline: float) -> None:
        """The node-exporter endpoints, then Prometheus scraping them (see prometheus.py)."""
        p = self._require_pki()
        exporter = NodeExporter(
            Rest(
                self.server,
                ca_file=p.ca_crt,
                cert_file=p.admin_crt,
                key_file=p.admin_key,
                user_agent="kn-rescheduler-node-exporter",
            )
        )
        prom = LocalPrometheus(
            self.workdir / "prometheus",
            self.log_dir,
            port,
            binary,
            exporter,
            scrape_interval=self.prometheus_scrape_interval,
        )
        exporter.on_nodes = prom.write_targets
        prom.prepare()
        self.node_exporter, self.prometheus = exporter, prom
        exporter.start()
        prom.start(deadline)

    def _start_metrics_server(self) -> None:
        """metrics-server, its objects and the nodes' load pods (see metricsserver.py); returns
        once the Metrics API lists every node."""
        assert self.ports is not None
        if self.real_nodes and self.kwok_nodes:
            raise ClusterError(
                "metrics-server scrapes either kwok's emulated kubelets or real ones, not both: "
                "use nodes=0 with real_nodes"
            )
        deadline = time.monotonic() + metricsserver.START_TIMEOUT
        stack = metricsserver.MetricsServerStack(
            self.workdir / "metrics-server",
            self.rest,
            self.server,
            self._require_pki(),
            kwok_port=self.ports.kwok,
            port=free_ports(1)[0],
            log=logging.getLogger("localcluster.metricsserver"),
            real_kubelets=bool(self.real_nodes),
            host=self.realnodes.gateway if self.realnodes is not None else "127.0.0.1",
        )
        self.metrics_server = stack
        stack.prepare()
        if not self.real_nodes:
            self._wait(
                "kwok's load pod on every node",
                lambda: stack.kwok_serves_load(self.nodes),
                deadline,
            )
        self._spawn(
            metricsserver.PROCESS_NAME,
            stack.argv(self._metrics_server_bin),
            env=stack.env(),
            cwd=stack.directory,
        )
        self._wait(
            "the Metrics API to list every node",
            lambda: stack.lists_every_node(self.nodes),
            deadline,
        )
        self._say(f"metrics-server serving {metricsserver.NODES_PATH}")

    def _fallback_cidr(self, node: str) -> str:
        index = self.nodes.index(node) if node in self.nodes else 0
        return addresses.node_pod_cidr(index)

    def _kubelet_logger(self) -> logging.Logger:
        """A logger of this cluster's own, writing ``logs/fake-kubelet.log``."""
        logger = logging.getLogger(f"localcluster.kubelet.{id(self):x}")
        for h in list(logger.handlers):
            logger.removeHandler(h)
            h.close()
        handler = logging.FileHandler(self.log_dir / "fake-kubelet.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        return logger

    def _register_node(self, index: int, name: str) -> None:
        """Registers a node the way a kubelet does (labels, capacity, addresses, nodeInfo)."""
        ip = addresses.node_ip(index)
        capacity = {
            "cpu": "8",
            "memory": "32873196Ki",
            "pods": "110",
            "ephemeral-storage": "102350Mi",
            "hugepages-1Gi": "0",
            "hugepages-2Mi": "0",
        }
        allocatable = {**capacity, "cpu": "7800m", "memory": "32158316Ki"}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "beta.kubernetes.io/os": "linux",
                    "beta.kubernetes.io/arch": "amd64",
                    "type": "kwok",
                },
                "annotations": {
                    "kwok.x-k8s.io/node": "fake",
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                },
            },
            "spec": {},
            "status": {
                "capacity": capacity,
                "allocatable": allocatable,
                "addresses": [
                    {"type": "InternalIP", "address": ip},
                    {"type": "Hostname", "address": name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {
                    "architecture": "amd64",
                    "bootID": f"00000000-0000-4000-8000-{index:012d}",
                    "containerRuntimeVersion": "containerd://2.1.4",
                    "kernelVersion": "6.8.0-60-generic",
                    "kubeProxyVersion": "",
                    "kubeletVersion": K8S_VERSION,
                    "machineID": f"{index:032x}",
                    "operatingSystem": "linux",
                    "osImage": "Ubuntu 24.04.2 LTS",
                    "systemUUID": f"00000000-0000-4000-9000-{index:012d}",
                },
            },
        }
        self.rest.post("/api/v1/nodes", node)

    def _nodes_ready(self) -> bool:
        items = self.rest.get("/api/v1/nodes").get("items", [])
        ready = set()
        for n in items:
            conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
            taints = {t["key"] for t in n.get("spec", {}).get("taints", []) or []}
            if conds.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints:
                ready.add(n["metadata"]["name"])
        return ready >= set(self.nodes)

    def _lease_held(self, name: str) -> bool:
        lease = self.rest.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{name}")
        return bool(lease.get("spec", {}).get("holderIdentity"))

    def _default_sa(self) -> bool:
        self.rest.get("/api/v1/namespaces/default/serviceaccounts/default")
        return True

    def wait_ready(self, deadline: float) -> None:
        """Nodes Ready and untainted, default ServiceAccount present, leaders elected."""
        assert self.ports is not None
        kwok_health = Rest(
            f"http://127.0.0.1:{self.ports.kwok}",
            ca_file=self.ca_file,
            cert_file=self._require_pki().admin_crt,
            key_file=self._require_pki().admin_key,
        )
        self._wait("kwok /healthz", lambda: kwok_health.text("/healthz", 1.0)[0] == 200, deadline)
        self._wait(
            "the scheduler's leader lease", lambda: self._lease_held("kube-scheduler"), deadline
        )
        self._wait(
            "the controller manager's leader lease",
            lambda: self._lease_held("kube-controller-manager"),
            deadline,
        )
        self._wait("nodes Ready", self._nodes_ready, deadline)
        self._wait("the default ServiceAccount", self._default_sa, deadline)
        kubelet = self.kubelet
        assert kubelet is not None
        self._wait("the fake kubelet's pod list", kubelet.synced.is_set, deadline)

    def _scheduler_argv(
        self,
        bins: Path,
        name: str,
        port: int,
        config: Mapping[str, Any] | None,
        lease: str,
    ) -> list[str]:
        """kube-scheduler's command line; with ``config``, a KubeSchedulerConfiguration file.

        With --config, kube-scheduler ignores its deprecated flags (--kubeconfig, --profiling,
        ...: Options.ApplyTo in cmd/kube-scheduler/app/options) and honours only the leader
        election flags besides the serving and delegated-auth ones, so the kubeconfig goes into
        clientConnection.kubeconfig and the lease name into leaderElection.resourceName.
        """
        kubeconfig = self.workdir / "scheduler.kubeconfig"
        argv = [
            str(bins / "kube-scheduler"),
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'certs'}",
            "--v=1",
        ]
        if config is None:
            return [*argv, f"--kubeconfig={kubeconfig}", "--leader-elect=true", "--profiling=false"]
        full: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "enableProfiling": False,
            **config,
        }
        full["clientConnection"] = {
            "kubeconfig": str(kubeconfig),
            **(config.get("clientConnection") or {}),
        }
        full["leaderElection"] = {
            "leaderElect": True,
            "resourceNamespace": "kube-system",
            "resourceName": lease,
            **(config.get("leaderElection") or {}),
        }
        path = self.workdir / f"{name}.config.yaml"
        path.write_text(yaml.safe_dump(full, sort_keys=False))
        return [*argv, f"--config={path}"]

    def start_scheduler(self, name: str, config: Mapping[str, Any], timeout: float = 60.0) -> Proc:
        """Starts a second kube-scheduler beside the cluster's, with its own
        KubeSchedulerConfiguration, port and leader lease (named ``name``, in kube-system);
        returns once it holds the lease. It stops with the cluster.

        A second scheduler, not a second profile of the first: the extenders of a
        KubeSchedulerConfiguration are shared by all its profiles (its ``extenders`` field,
        pkg/scheduler/apis/config), so a profile of its own that calls an extender needs a
        process of its own. It signs in as system:kube-scheduler, whose bootstrap ClusterRole
        may update only the lease named "kube-scheduler"; a Role in kube-system grants it
        this one too, as an install of a second scheduler must. So ``config`` leaves the lease
        alone (a ValueError otherwise): an install's own lease namespace and account are not
        the local cluster's.
        """
        election = config.get("leaderElection") or {}
        if any(
            key in election and election[key] != value
            for key, value in (
                ("leaderElect", True),
                ("resourceNamespace", "kube-system"),
                ("resourceName", name),
            )
        ):
            raise ValueError(
                f"{name}: the local cluster runs it on the lease kube-system/{name}; drop "
                f"leaderElection from its configuration (got {dict(election)})"
            )
        self._grant_lease(name)
        port = free_ports(1)[0]
        (self.log_dir / f"{name}.log").unlink(missing_ok=True)
        proc = self._spawn(name, self._scheduler_argv(self.bins_dir, name, port, config, name))
        self._wait(
            f"{name}'s leader lease",
            lambda: self._lease_held(name),
            time.monotonic() + timeout,
        )
        return proc

    def _grant_lease(self, lease: str) -> None:
        role = f"kn-rescheduler:scheduler-lease:{lease}"
        bodies = [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": role, "namespace": "kube-system"},
                "rules": [
                    {
                        "apiGroups": ["coordination.k8s.io"],
                        "resources": ["leases"],
                        "resourceNames": [lease],
                        "verbs": ["get", "update", "list", "watch"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": role, "namespace": "kube-system"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": role,
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "User",
                        "name": "system:kube-scheduler",
                    }
                ],
            },
        ]
        for body, kind in zip(bodies, ("roles", "rolebindings"), strict=True):
            try:
                self.rest.post(
                    f"/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/{kind}", body
                )
            except ApiError as e:
                if e.status != 409:
                    raise

    def start_component(self, component: Component, deadline: float | None = None) -> Proc:
        """Starts one more process beside the cluster (KUBECONFIG points at the cluster)."""
        env = {"KUBECONFIG": str(self.kubeconfig), **component.env}
        proc = self._spawn(component.name, list(component.argv), env=env, cwd=component.cwd)
        if component.ready is not None:
            ready = component.ready
            self._wait(
                f"component {component.name}",
                ready,
                deadline or time.monotonic() + component.ready_timeout,
            )
        return proc
