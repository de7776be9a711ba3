"""Real nodes: a real kubelet and a real containerd per node, beside the kwok ones.

kwok nodes and the fake kubelet write pod statuses shaped as a kubelet writes them, but their
dynamics are ours. A real node is the real thing: kubelet (built from the Kubernetes module
with the control plane) and Debian's containerd with runc and the CNI plugins, pulling real
images from a registry on loopback, with the kubelet's real back-off, grace periods, evictions
and pod lifecycle.

Several nodes share one machine, so each has its own of everything a node owns: containerd
socket, root and state directories; cgroup root; CNI bridge, subnet and IPAM data; kubelet
ports, root and certificate directories; registry configuration (``certs.d``). All nodes use
the machine's own non-loopback address as their InternalIP (a kubelet refuses a loopback node
IP), told apart by their kubelet ports, which the API server reads from the Node's
``daemonEndpoints``.

What a node changes on the machine is recorded first and undone at stop, or at the next start
after a crash (:mod:`localcluster.hostchanges`). The kubelet is kept from what it need not do:
no iptables chains (``makeIPTablesUtilChains: false``), no masquerading in the bridge plugin,
network namespaces mounted under containerd's state directory rather than ``/var/run/netns``.

Node faults are real causes, set and cleared while the node runs (:data:`FAULTS`):

- ``mirror-refused``: the node's registry mirror is a closed local port (connection refused);
- ``mirror-hangs``: the mirror accepts and never answers (containerd 1.6 has no pull
  progress timeout, so the pull hangs);
- ``cni-broken``: the node's CNI configuration names a plugin that does not exist (every new
  sandbox fails: ``FailedCreatePodSandBox``);
- ``runtime-broken``: the node's runc refuses to create anything (a broken runtime binary);
- ``runtime-stopped``: containerd is stopped (the node turns NotReady; its pods stay
  Running in the API until the taint manager acts);
- ``app-crash``: a file the tests' node-dependent app needs is missing on the node, so that
  app exits 1 at start there and only there (a crash loop a move fixes). Every container on a
  real node sees the node's own directory at :data:`NODE_LOCAL_DIR` (a bind mount of
  containerd's base runtime spec), as an app sees a host file or device of its node;
  :data:`NODE_DEPENDENT_APP` is the command that needs ``NODE_LOCAL_DIR/app-ok``;
- ``disk-pressure`` and ``memory-pressure``: the kubelet is restarted with an eviction
  threshold the machine is already past, so it reports the condition, taints the node and
  evicts as it does on a full disk or under memory pressure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from dev.localcluster import hostchanges, pki
from dev.localcluster.nodeimages import IMAGE_HOST, PAUSE_IMAGE
from dev.localcluster.procs import Proc, free_ports

log = logging.getLogger(__name__)

CONTAINERD: Final = "containerd"
CTR: Final = "ctr"
RUNC: Final = "/usr/sbin/runc"
CNI_BIN_DIR: Final = "/usr/lib/cni"
# The cgroup roots of all real nodes sit under this one (named per cluster).
CGROUP_PREFIX: Final = "kn-rescheduler"
# Every container on a real node sees its node's own directory here (read-only).
NODE_LOCAL_DIR: Final = "/etc/kn-rescheduler-node"
# A server that needs a file of its node: exits 1 at start where the file is missing (the
# app-crash fault), otherwise stops on SIGTERM at once (a shell as PID 1 ignores SIGTERM unless
# it traps it).
NODE_DEPENDENT_APP: Final = (
    "sh",
    "-c",
    f"test -e {NODE_LOCAL_DIR}/app-ok || "
    f"{{ echo 'missing {NODE_LOCAL_DIR}/app-ok on this node' >&2; exit 1; }}; "
    "trap 'exit 0' TERM; sleep 3600 & wait",
)
FAULTS: Final = (
    "app-crash",
    "mirror-refused",
    "mirror-hangs",
    "cni-broken",
    "runtime-broken",
    "runtime-stopped",
    "disk-pressure",
    "memory-pressure",
)
START_TIMEOUT: Final = 90.0
# The functions' settings for a cluster of real nodes: the defaults, made for a real kubelet's
# back-off, where the kwok stack compresses them to follow its fake kubelet
# (kubelet.LOCAL_FUNCTION_SETTINGS).
REAL_KUBELET_FUNCTION_SETTINGS: Final = {"KN_RESCHEDULER_WAITING_FAILURE_AFTER": "30s"}
# Where the nodes keep their state: not the cluster's work directory, whose path may be long,
# because containerd and the kubelet make unix sockets in theirs (a socket's path has at most
# 107 bytes; both refuse a longer one). One directory per cluster, named by its network.
NODE_ROOT: Final = Path(
    os.environ.get("KN_RESCHEDULER_NODE_ROOT", "/var/lib/kn-rescheduler/real-nodes")
)
# What containerd makes machine-wide when missing (shim sockets, in /run/containerd/s).
CONTAINERD_RUN_DIRS: Final = ("/run/containerd/s", "/run/containerd")


class RealNodeError(RuntimeError):
    """A real node could not be set up, started or changed (the message says why)."""


def machine_address() -> str:
    """The machine's first global IPv4 address (what every real node gives as its IP)."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise RealNodeError(f"cannot list the machine's addresses: {e}") from e
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    raise RealNodeError(
        "real nodes need a non-loopback IPv4 address on the machine (a kubelet refuses a "
        "loopback node IP); `ip -4 addr` shows none"
    )


def missing_tools() -> list[str]:
    """What the machine lacks for real nodes (Debian: containerd, runc,
    containernetworking-plugins, iproute2)."""
    absent = [t for t in (CONTAINERD, CTR, "ip") if shutil.which(t) is None]
    if not os.access(RUNC, os.X_OK):
        absent.append("runc")
    if not Path(CNI_BIN_DIR, "bridge").exists():
        absent.append("containernetworking-plugins")
    if os.geteuid() != 0:
        absent.append("root")
    if "ip" not in absent:
        try:
            machine_address()
        except RealNodeError:
            absent.append("a non-loopback IPv4 address")
    return absent


def _used_second_octets() -> set[int]:
    """The 10.X.0.0/16 ranges the machine routes already (ours or anyone's)."""
    try:
        out = subprocess.run(
            ["ip", "-4", "route", "show"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return set()
    used = set()
    for line in out.split():
        if line.startswith("10."):
            with contextlib.suppress(ValueError, IndexError):
                used.add(int(line.split(".")[1]))
    return used


def pick_cluster_octet(taken: set[int]) -> int:
    """A second octet in 10.200-10.254 that no route and no live cluster uses."""
    for octet in range(200, 255):
        if octet not in taken:
            return octet
    raise RealNodeError("no free 10.X.0.0/16 range in 10.200-10.254 for real nodes' pods")


@dataclass(frozen=True)
class NodeLayout:
    """Where one real node keeps what it owns."""

    name: str
    index: int
    directory: Path
    bridge: str
    subnet: str
    cgroup_root: str
    kubelet_port: int
    healthz_port: int

    @property
    def socket(self) -> Path:
        return self.directory / "containerd.sock"

    @property
    def runtime_endpoint(self) -> str:
        return f"unix://{self.socket}"

    @property
    def fault_dir(self) -> Path:
        return self.directory / "faults"

    @property
    def cni_conf(self) -> Path:
        return self.directory / "cni" / "10-kn-rescheduler.conflist"

    @property
    def hosts_toml(self) -> Path:
        return self.directory / "certs.d" / IMAGE_HOST / "hosts.toml"


# -- configuration files (pure: a layout in, text out) -------------------------------------------


def containerd_config(node: NodeLayout) -> str:
    d = node.directory / "containerd"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
# Snapshotters that would look for devices or file systems this machine may not have.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{node.socket}"
[ttrpc]
  address = "{node.socket}.ttrpc"
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # Without CAP_SYS_RESOURCE containerd could not lower a container's oom_score_adj below
  # its own; harmless with it.
  restrict_oom_score_adj = true
  # Sandbox network namespaces under the state directory, not the machine's /var/run/netns.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      # containerd's default OCI spec with the node's own directory at NODE_LOCAL_DIR.
      base_runtime_spec = "{node.directory / "base-spec.json"}"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = "{node.directory / "runc"}"
        # runc's state, by default in the machine's /run/containerd/runc.
        Root = "{d / "state" / "runc"}"
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{node.cni_conf.parent}"
    max_conf_num = 1
  [{cri}.registry]
    config_path = "{node.directory / "certs.d"}"
"""


def base_runtime_spec(default: dict[str, Any], node: NodeLayout) -> dict[str, Any]:
    """containerd's default spec (``ctr oci spec``) plus the node's local directory, which the
    CRI plugin keeps in every container (it drops a base mount only where a pod mounts
    something at the same place)."""
    mount = {
        "destination": NODE_LOCAL_DIR,
        "type": "bind",
        "source": str(node.directory / "local"),
        "options": ["rbind", "ro"],
    }
    return {**default, "mounts": [*default.get("mounts", []), mount]}


def cni_config(node: NodeLayout, network: str, *, broken: bool = False) -> str:
    plugin: dict[str, Any] = {
        "type": "bridge",
        "bridge": node.bridge,
        # The machine reaches its pods (the kubelet's probes) through the bridge's address.
        "isGateway": True,
        # No NAT rules on the machine: pods talk to each other and to the machine only.
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": node.subnet}]],
            "dataDir": str(node.directory / "cni-ipam"),
        },
    }
    if broken:
        # What a half-installed or deleted CNI plugin looks like to containerd.
        plugin["type"] = "kn-rescheduler-missing-plugin"
    return json.dumps({"cniVersion": "0.4.0", "name": network, "plugins": [plugin]}, indent=2)


def hosts_toml(upstream: str) -> str:
    """The node's mirror for IMAGE_HOST, the registry the pods' images name: ``upstream`` is
    ``host:port`` (plain HTTP)."""
    return f"""server = "http://{upstream}"

[host."http://{upstream}"]
  capabilities = ["pull", "resolve"]
"""


def runc_wrapper(node: NodeLayout) -> str:
    broken = node.fault_dir / "runtime-broken"
    return f"""#!/bin/sh
# runc for {node.name}: refuses to create containers while {broken} exists.
if [ -e "{broken}" ]; then
  for arg in "$@"; do
    case "$arg" in
      create|run)
        echo "runc: {node.name}: exec format error (kn-rescheduler fault runtime-broken)" >&2
        exit 1 ;;
    esac
  done
fi
exec {RUNC} "$@"
"""


def kubelet_config(
    node: NodeLayout, *, address: str, ca_file: Path, eviction_hard: dict[str, str] | None
) -> dict[str, Any]:
    d = node.directory / "kubelet"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": node.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.healthz_port,
        "tlsCertFile": str(d / "serving.crt"),
        "tlsPrivateKeyFile": str(d / "serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": node.runtime_endpoint,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        # The machines these run on mount cgroup v1; kubelet 1.35+ refuses it by default.
        "failCgroupV1": False,
        "failSwapOn": False,
        # No KUBE-FIREWALL or KUBE-IPTABLES-HINT chains on the machine.
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False,
        "resolvConf": str(node.directory / "resolv.conf"),
        "clusterDNS": [],
        "serializeImagePulls": False,
        "registerNode": True,
        "nodeStatusUpdateFrequency": "10s",
        "nodeStatusReportFrequency": "1m",
        "evictionPressureTransitionPeriod": "10s",
        "evictionHard": eviction_hard or pressure_thresholds(""),
        "mergeDefaultEvictionSettings": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "maxPods": 110,
        "shutdownGracePeriod": "0s",
        "volumePluginDir": str(d / "volume-plugins"),
        "staticPodPath": "",
        "logging": {"format": "text"},
    }


def memory_total_ki() -> int:
    """The machine's memory as the kubelet sees it (cAdvisor reads MemTotal)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    raise RealNodeError("/proc/meminfo has no MemTotal")


def pressure_thresholds(fault: str) -> dict[str, str]:
    """Hard eviction thresholds the machine is already past, so the kubelet reports pressure
    at once. A memory threshold counts as a reservation in the node's allocatable, which the
    kubelet refuses above capacity ("invalid Node Allocatable configuration"): capacity less
    64 MiB is past on any machine that runs a cluster, and still valid."""
    quiet = {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"}
    if fault == "disk-pressure":
        return {**quiet, "nodefs.available": "99%", "imagefs.available": "99%"}
    if fault == "memory-pressure":
        return {**quiet, "memory.available": f"{memory_total_ki() - 64 * 1024}Ki"}
    return quiet


class HangingMirror:
    """A listener that accepts registry connections and never answers one."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self._held: list[socket.socket] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="hanging-mirror", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._sock.settimeout(0.5)
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)  # read nothing, answer nothing, close nothing

    def close(self) -> None:
        self._stopped.set()
        self._sock.close()
        for conn in self._held:
            with contextlib.suppress(OSError):
                conn.close()
        self._thread.join(2.0)


class RealNodes:
    """The real nodes of one local cluster."""

    def __init__(
        self,
        workdir: Path,
        log_dir: Path,
        names: list[str],
        *,
        kubelet_bin: Path,
        server: str,
        cluster_pki: pki.ClusterPKI,
        registry: str,
        pause_archive: Path,
    ) -> None:
        self.workdir = workdir
        self.log_dir = log_dir
        self.names = list(names)
        self.kubelet_bin = kubelet_bin
        self.server = server
        self.pki = cluster_pki
        self.registry = registry
        self.pause_archive = pause_archive
        self.address = ""
        self.layouts: dict[str, NodeLayout] = {}
        self.containerd: dict[str, Proc] = {}
        self.kubelets: dict[str, Proc] = {}
        self.faults: dict[str, set[str]] = {n: set() for n in names}
        self.record: hostchanges.HostRecord | None = None
        self.network = ""
        self.base = NODE_ROOT
        self._refused_port = 0
        self._hanging: HangingMirror | None = None
        self._spec: dict[str, Any] | None = None

    # -- start and stop -------------------------------------------------------------------------

    def prepare(self) -> None:
        """Cleans what crashed runs left, records what these nodes will change, lays out their
        directories and configuration."""
        absent = missing_tools()
        if absent:
            raise RealNodeError(
                f"real nodes need {', '.join(absent)} (bash hack/install-packages.sh installs "
                "the packages; run as root)"
            )
        hostchanges.clean_stale()
        self.address = machine_address()
        live = hostchanges.records()
        taken = _used_second_octets() | {
            int(n.split("-")[0][len("knr") :]) for r in live for n in r.cni_networks
        }
        octet = pick_cluster_octet(taken)
        self.network = f"knr{octet}"
        cgroup_base = f"/{CGROUP_PREFIX}-{octet}"
        self.base = NODE_ROOT / self.network
        # A directory of a crashed run whose record is gone: nothing can use it.
        hostchanges.unmount_all(str(self.base))
        shutil.rmtree(self.base, ignore_errors=True)
        ports = free_ports(2 * len(self.names) + 1)
        self._refused_port = ports.pop()
        for i, name in enumerate(self.names):
            self.layouts[name] = NodeLayout(
                name=name,
                index=i,
                directory=self.base / f"n{i}",
                bridge=f"{self.network}n{i}",
                subnet=f"10.{octet}.{i}.0/24",
                cgroup_root=f"{cgroup_base}/{name}",
                kubelet_port=ports[2 * i],
                healthz_port=ports[2 * i + 1],
            )
        self.record = hostchanges.HostRecord(
            owner_pid=os.getpid(),
            owner_start=hostchanges.start_time(os.getpid()),
            workdir=str(self.base),
            bridges=tuple(n.bridge for n in self.layouts.values()),
            cgroup_roots=(cgroup_base,),
            cni_networks=(self.network,),
            runtime_sockets=tuple(str(n.socket) for n in self.layouts.values()),
            sysctls=hostchanges.read_sysctls(),
            created_dirs=tuple(d for d in CONTAINERD_RUN_DIRS if not Path(d).exists()),
        )
        self.base.mkdir(parents=True, exist_ok=True)
        self.record.write()
        for node in self.layouts.values():
            self._write_files(node)
            try:
                hostchanges.make_cgroup(node.cgroup_root)
            except OSError as e:
                raise RealNodeError(f"cannot make the cgroup {node.cgroup_root}: {e}") from e

    def _write_files(self, node: NodeLayout) -> None:
        shutil.rmtree(node.directory, ignore_errors=True)
        for sub in ("containerd", "cni", "cni-ipam", "kubelet", "faults", "certs.d", "local"):
            (node.directory / sub).mkdir(parents=True, exist_ok=True)
        (node.directory / "containerd" / "config.toml").write_text(containerd_config(node))
        (node.directory / "base-spec.json").write_text(
            json.dumps(base_runtime_spec(self._default_spec(), node), indent=2)
        )
        (node.directory / "local" / "app-ok").write_text("this node has what the app needs\n")
        node.cni_conf.write_text(cni_config(node, self.network))
        node.hosts_toml.parent.mkdir(parents=True, exist_ok=True)
        node.hosts_toml.write_text(hosts_toml(self.registry))
        wrapper = node.directory / "runc"
        wrapper.write_text(runc_wrapper(node))
        wrapper.chmod(0o755)
        (node.directory / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        ca = pki.KeyPair(self.pki.ca_crt.read_bytes(), self.pki.ca_key.read_bytes())
        client = pki.issue(
            ca, f"system:node:{node.name}", organizations=("system:nodes",), client=True
        )
        crt, key = client.write(node.directory / "kubelet", "client")
        serving = pki.issue(
            ca, node.name, dns_names=(node.name,), ip_addresses=(self.address,), server=True
        )
        serving.write(node.directory / "kubelet", "serving")
        (node.directory / "kubelet" / "kubeconfig").write_text(
            yaml.safe_dump(_kubeconfig(self.server, self.pki.ca_crt, crt, key, node.name))
        )
        self._write_kubelet_config(node)

    def _default_spec(self) -> dict[str, Any]:
        if self._spec is None:
            done = subprocess.run([CTR, "oci", "spec"], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RealNodeError(f"`ctr oci spec` failed: {done.stderr.strip()}")
            self._spec = json.loads(done.stdout)
        return self._spec

    def _write_kubelet_config(self, node: NodeLayout) -> Path:
        eviction = None
        for fault in ("disk-pressure", "memory-pressure"):
            if fault in self.faults[node.name]:
                eviction = pressure_thresholds(fault)
        path = node.directory / "kubelet" / "config.yaml"
        config = kubelet_config(
            node, address=self.address, ca_file=self.pki.ca_crt, eviction_hard=eviction
        )
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def start(self, deadline: float) -> None:
        """containerd on every node (the pause image imported), then the kubelets."""
        for node in self.layouts.values():
            self._start_containerd(node, deadline)
            self._import(node, self.pause_archive, deadline)
        for node in self.layouts.values():
            self._start_kubelet(node)

    def _spawn(self, name: str, argv: list[str]) -> Proc:
        return Proc(name, argv, self.log_dir / f"{name}.log")

    def _start_containerd(self, node: NodeLayout, deadline: float) -> None:
        proc = self._spawn(
            f"containerd-{node.name}",
            [CONTAINERD, "--config", str(node.directory / "containerd" / "config.toml")],
        )
        self.containerd[node.name] = proc
        while not self._ctr_ok(node):
            if not proc.alive():
                raise RealNodeError(
                    f"containerd of {node.name} exited with {proc.returncode}:\n{proc.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise RealNodeError(f"containerd of {node.name} did not answer in time")
            time.sleep(0.1)

    def _ctr(
        self, node: NodeLayout, *args: str, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CTR, "--address", str(node.socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _ctr_ok(self, node: NodeLayout) -> bool:
        if not node.socket.exists():
            return False
        try:
            return self._ctr(node, "version", timeout=5.0).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _import(self, node: NodeLayout, archive: Path, deadline: float) -> None:
        timeout = max(deadline - time.monotonic(), 5.0)
        # The archive names the image (org.opencontainers.image.ref.name): PAUSE_IMAGE.
        done = self._ctr(node, "images", "import", str(archive), timeout=timeout)
        if done.returncode != 0:
            raise RealNodeError(f"importing {archive.name} into {node.name}: {done.stderr.strip()}")

    def _start_kubelet(self, node: NodeLayout) -> None:
        d = node.directory / "kubelet"
        config = self._write_kubelet_config(node)
        self.kubelets[node.name] = self._spawn(
            f"kubelet-{node.name}",
            [
                str(self.kubelet_bin),
                f"--config={config}",
                f"--kubeconfig={d / 'kubeconfig'}",
                f"--root-dir={d / 'root'}",
                f"--cert-dir={d / 'pki'}",
                f"--hostname-override={node.name}",
                f"--node-ip={self.address}",
                "--node-labels=type=real,kn-rescheduler.local/real-node=true",
                "--v=1",
            ],
        )

    def check_alive(self) -> None:
        for name, proc in [*self.containerd.items(), *self.kubelets.items()]:
            if "runtime-stopped" in self.faults.get(name, set()) and proc.name.startswith(
                "containerd"
            ):
                continue
            if not proc.alive():
                raise RealNodeError(
                    f"{proc.name} exited with {proc.returncode}; last log lines "
                    f"({proc.log_path}):\n{proc.log_tail()}"
                )

    def stop(self) -> None:
        """Kubelets, then every container, shim and containerd, then what they changed."""
        for proc in self.kubelets.values():
            proc.stop(grace=10.0)
        self.kubelets.clear()
        if self.record is not None:
            hostchanges.kill_all(
                hostchanges.pids_in_cgroups(self.record.cgroup_roots), "containers"
            )
            hostchanges.kill_all(
                hostchanges.shim_pids(self.record.runtime_sockets), "containerd shims"
            )
        for proc in self.containerd.values():
            proc.stop(grace=10.0)
        self.containerd.clear()
        if self._hanging is not None:
            self._hanging.close()
            self._hanging = None
        if self.record is not None:
            hostchanges.undo(self.record)
            self.record = None

    # -- faults ----------------------------------------------------------------------------------

    def set_fault(self, name: str, fault: str | None) -> None:
        """Breaks ``name`` in one more way (``fault``), or heals it of every fault (None)."""
        node = self.layouts.get(name)
        if node is None:
            raise ValueError(f"{name!r} is not a real node; real nodes are {self.names}")
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown real-node fault {fault!r}; faults are {FAULTS}")
        before = set(self.faults[name])
        after = set() if fault is None else before | {fault}
        self.faults[name] = after
        mirror = self.registry
        if "mirror-hangs" in after:
            if self._hanging is None:
                self._hanging = HangingMirror()
            mirror = self._hanging.address
        if "mirror-refused" in after:
            mirror = f"127.0.0.1:{self._refused_port}"
        node.hosts_toml.write_text(hosts_toml(mirror))
        node.cni_conf.write_text(cni_config(node, self.network, broken="cni-broken" in after))
        needed = node.directory / "local" / "app-ok"
        if "app-crash" in after:
            needed.unlink(missing_ok=True)
        else:
            needed.write_text("this node has what the app needs\n")
        flag = node.fault_dir / "runtime-broken"
        if "runtime-broken" in after:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)
        if "runtime-stopped" in after and "runtime-stopped" not in before:
            self.containerd[name].stop(grace=10.0)
        if "runtime-stopped" in before and "runtime-stopped" not in after:
            self._start_containerd(node, time.monotonic() + 30.0)
        pressure = {"disk-pressure", "memory-pressure"}
        if (before & pressure) != (after & pressure):
            self.kubelets[name].stop(grace=10.0)
            self._start_kubelet(node)

    def state(self) -> dict[str, Any]:
        return {
            name: {
                "kubelet_port": node.kubelet_port,
                "subnet": node.subnet,
                "bridge": node.bridge,
                "directory": str(node.directory),
                "socket": str(node.socket),
                "faults": sorted(self.faults[name]),
            }
            for name, node in self.layouts.items()
        }


def _kubeconfig(server: str, ca: Path, crt: Path, key: Path, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": node, "user": {"client-certificate": str(crt), "client-key": str(key)}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": node}}],
        "current-context": "local",
    }
