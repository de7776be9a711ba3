"""Real nodes: a real kubelet and a real containerd per node, beside the kwok ones.

kwok nodes and the fake kubelet write pod statuses shaped as a kubelet writes them, but their
dynamics are ours. A real node is the real thing: kubelet (built from the Kubernetes module
with the control plane) and Debian's containerd with runc and the CNI plugins, pulling real
images from a local registry, with the kubelet's real back-off, grace periods, evictions
and pod lifecycle.

Several nodes share one machine, so each has its own of everything a node owns: containerd
socket, root and state directories; cgroup root; CNI bridge, subnet and IPAM data; kubelet
ports, root and certificate directories; registry configuration (``certs.d``); and its own
network namespace with its own address, where its kubelet, containerd and kube-proxy run
(:mod:`localcluster.nodenet`: pods reach each other across nodes, Services have endpoints).

What a node changes on the machine is recorded first and undone at stop, or at the next start
after a crash (:mod:`localcluster.hostchanges`). The kubelet is kept from what it need not do:
no iptables chains of its own (``makeIPTablesUtilChains: false``; kube-proxy writes the
Services' chains, in the node's namespace), no masquerading in the bridge plugin, sandbox
network namespaces mounted under containerd's state directory rather than ``/var/run/netns``.

Node faults are real causes, set and cleared while the node runs (:data:`FAULTS`):

- ``mirror-refused``: the node's registry mirror is a closed port on the node's loopback
  (connection refused);
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

from dev.localcluster import hostchanges, networkpolicies, nodenet, pki
from dev.localcluster.nodeimages import (
    IMAGE_HOST,
    KNATIVE_RELEASES_HOST,
    PAUSE_IMAGE,
    UPSTREAM_HOST,
)
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
# The cluster DNS: the kube-dns Service's address (in the control plane's service range) and
# domain, as kubeadm sets them.
CLUSTER_DNS: Final = "10.96.0.10"
CLUSTER_DOMAIN: Final = "cluster.local"
# The functions' settings for a cluster of real nodes: the defaults, made for a real kubelet's
# back-off, where the kwok stack compresses them to follow its fake kubelet
# (kubelet.LOCAL_FUNCTION_SETTINGS).
REAL_KUBELET_FUNCTION_SETTINGS: Final = {
    "KN_RESCHEDULER_WAITING_FAILURE_AFTER": "30s",
    "KN_RESCHEDULER_CRASHLOOP_PACE": "10s",
}
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


def missing_tools() -> list[str]:
    """What the machine lacks for real nodes (Debian: containerd, runc,
    containernetworking-plugins, iproute2, iptables, util-linux's nsenter)."""
    absent = [t for t in (CONTAINERD, CTR, "ip", "nsenter") if shutil.which(t) is None]
    if shutil.which("iptables-restore") is None:
        absent.append("iptables")
    if not os.access(RUNC, os.X_OK):
        absent.append("runc")
    if not Path(CNI_BIN_DIR, "bridge").exists():
        absent.append("containernetworking-plugins")
    if os.geteuid() != 0:
        absent.append("root")
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


# In its own network namespace a node has every port: the kubelet's are the usual ones.
KUBELET_PORT: Final = 10250
KUBELET_HEALTHZ_PORT: Final = 10248


@dataclass(frozen=True)
class NodeLayout:
    """Where one real node keeps what it owns."""

    name: str
    directory: Path
    # The node's CNI bridge, in its namespace (named per cluster all the same: ``ip link`` on
    # the machine lists no other, but a reader of a node's log knows whose it is).
    bridge: str
    cgroup_root: str
    net: nodenet.NodeNet
    kubelet_port: int = KUBELET_PORT
    healthz_port: int = KUBELET_HEALTHZ_PORT

    @property
    def index(self) -> int:
        return self.net.index

    @property
    def subnet(self) -> str:
        return self.net.pod_subnet

    @property
    def address(self) -> str:
        return self.net.address

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
        return self.mirror_config(IMAGE_HOST)

    def mirror_config(self, host: str) -> Path:
        """containerd's configuration for pulls from ``host`` (``name`` or ``name:port``)."""
        return self.directory / "certs.d" / host / "hosts.toml"


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
        # The bridge's address is the pods' default route: the node routes them on to other
        # nodes' pods, to the machine, and to Services (kube-proxy's rules, in the node).
        "isGateway": True,
        "isDefaultGateway": True,
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
    node: NodeLayout, *, ca_file: Path, eviction_hard: dict[str, str] | None
) -> dict[str, Any]:
    d = node.directory / "kubelet"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.address,
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
        # Its KUBE-FIREWALL and KUBE-IPTABLES-HINT chains, as every kubelet makes them: in the
        # node's network namespace, which is the node's own.
        "makeIPTablesUtilChains": True,
        "protectKernelDefaults": False,
        "resolvConf": str(node.directory / "resolv.conf"),
        # The kube-dns Service (CoreDNS, localcluster.addons) for every ClusterFirst pod.
        "clusterDNS": [CLUSTER_DNS],
        "clusterDomain": CLUSTER_DOMAIN,
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
        # Containers' logs in the node's directory, not the machine's /var/log/pods.
        "podLogsDir": str(d / "pod-logs"),
        "staticPodPath": "",
        "logging": {"format": "text"},
    }


BRIDGE_NF_CALL_IPTABLES: Final = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


def bridged_traffic_filtered(sysctl: Path = BRIDGE_NF_CALL_IPTABLES) -> bool:
    """Whether the kernel passes bridged frames through iptables (br_netfilter loaded and on):
    then a reply between two pods of one bridge meets the conntrack entry that un-NATs it."""
    try:
        return sysctl.read_text().strip() == "1"
    except OSError:
        return False


def kube_proxy_config(
    node: NodeLayout, *, cluster_cidr: str, masquerade_all: bool = False
) -> dict[str, Any]:
    """kube-proxy in iptables mode, as a DaemonSet's would run, minus what reaches past its node:
    conntrack's table size and timeouts (``nf_conntrack_max`` is machine-wide; 0 leaves each
    as it is) and its own OOM score.

    A pod's connection to a Service keeps the pod's address, as in a cluster (kube-proxy
    masquerades only what comes from outside ``clusterCIDR``): NetworkPolicies select senders
    by their pod address, and would see every sender as its node otherwise. ``masquerade_all``
    is for a machine whose bridged traffic skips iptables (no br_netfilter): there a reply from
    a backend on the sender's own bridge would skip the un-NAT, so every Service connection
    leaves with the node's address instead, and NetworkPolicies cannot be enforced."""
    leave = "0s"
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(node.directory / "kube-proxy" / "kubeconfig")},
        "hostnameOverride": node.name,
        "bindAddress": "0.0.0.0",
        "healthzBindAddress": "0.0.0.0:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "mode": "iptables",
        "clusterCIDR": cluster_cidr,
        "iptables": {
            "masqueradeAll": masquerade_all,
            # route_localnet is not set, and NodePorts on 127.0.0.1 need it.
            "localhostNodePorts": False,
            "syncPeriod": "30s",
            "minSyncPeriod": "1s",
        },
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": leave,
            "tcpCloseWaitTimeout": leave,
            "udpTimeout": leave,
            "udpStreamTimeout": leave,
        },
        "oomScoreAdj": 0,
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

    def __init__(self, host: str) -> None:
        """``host``: an address of the machine the nodes reach (the cluster network's gateway)."""
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
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
    """The real nodes of one local cluster.

    Two steps, because the control plane sits between them: :meth:`prepare` claims the
    cluster's network (the API server listens on its gateway, where nodes and pods reach it);
    :meth:`start`, once the API server runs, configures and starts every node."""

    def __init__(
        self,
        log_dir: Path,
        names: list[str],
        *,
        kubelet_bin: Path,
        kube_proxy_bin: Path,
    ) -> None:
        self.log_dir = log_dir
        self.names = list(names)
        self.kubelet_bin = kubelet_bin
        self.kube_proxy_bin = kube_proxy_bin
        self.server = ""
        self.pki: pki.ClusterPKI | None = None
        self.registry = ""
        self.layouts: dict[str, NodeLayout] = {}
        self.containerd: dict[str, Proc] = {}
        self.kubelets: dict[str, Proc] = {}
        self.kube_proxies: dict[str, Proc] = {}
        # kube-router's firewall per node, once start_firewalls ran (networkpolicies.py).
        self.firewalls: dict[str, Proc] = {}
        self.faults: dict[str, set[str]] = {n: set() for n in names}
        self.record: hostchanges.HostRecord | None = None
        self.net: nodenet.ClusterNet | None = None
        self.network = ""
        self.base = NODE_ROOT
        self._refused_port = 0
        self._hanging: HangingMirror | None = None
        self._spec: dict[str, Any] | None = None

    @property
    def gateway(self) -> str:
        """The machine's address on the nodes' network (where the API server listens)."""
        if self.net is None:
            raise RealNodeError("the real nodes' network is not prepared")
        return self.net.gateway

    # -- start and stop -------------------------------------------------------------------------

    def prepare(self) -> nodenet.ClusterNet:
        """Cleans what crashed runs left, records what these nodes will change, makes their
        network (bridge, namespaces, routes), directories and cgroups."""
        absent = missing_tools()
        if absent:
            raise RealNodeError(
                f"real nodes need {', '.join(absent)} (bash hack/install-packages.sh installs "
                "the packages; run as root)"
            )
        hostchanges.clean_stale()
        live = hostchanges.records()
        taken = _used_second_octets() | {
            int(n.split("-")[0][len("knr") :]) for r in live for n in r.cni_networks
        }
        octet = pick_cluster_octet(taken)
        net = nodenet.plan(octet, self.names)
        self.net = net
        self.network = net.bridge
        cgroup_base = f"/{CGROUP_PREFIX}-{octet}"
        self.base = NODE_ROOT / self.network
        # A directory of a crashed run whose record is gone: nothing can use it.
        hostchanges.unmount_all(str(self.base))
        shutil.rmtree(self.base, ignore_errors=True)
        # A port nothing listens on in a node's namespace (the mirror-refused fault).
        self._refused_port = free_ports(1)[0]
        for node_net in net.nodes:
            name = node_net.name
            self.layouts[name] = NodeLayout(
                name=name,
                directory=self.base / f"n{node_net.index}",
                bridge=f"{self.network}n{node_net.index}",
                cgroup_root=f"{cgroup_base}/{name}",
                net=node_net,
            )
        self.record = hostchanges.HostRecord(
            owner_pid=os.getpid(),
            owner_start=hostchanges.start_time(os.getpid()),
            workdir=str(self.base),
            bridges=(net.bridge,),
            cgroup_roots=(cgroup_base,),
            cni_networks=(self.network,),
            runtime_sockets=tuple(str(n.socket) for n in self.layouts.values()),
            sysctls=hostchanges.read_sysctls(),
            created_dirs=tuple(d for d in CONTAINERD_RUN_DIRS if not Path(d).exists()),
            netns=tuple(n.netns for n in net.nodes),
        )
        self.base.mkdir(parents=True, exist_ok=True)
        self.record.write()
        try:
            nodenet.create(net)
        except nodenet.NodeNetError as e:
            raise RealNodeError(f"cannot make the real nodes' network: {e}") from e
        for node in self.layouts.values():
            try:
                hostchanges.make_cgroup(node.cgroup_root)
            except OSError as e:
                raise RealNodeError(f"cannot make the cgroup {node.cgroup_root}: {e}") from e
        return net

    def _write_files(self, node: NodeLayout) -> None:
        shutil.rmtree(node.directory, ignore_errors=True)
        for sub in (
            "containerd",
            "cni",
            "cni-ipam",
            "kubelet",
            "kube-proxy",
            "faults",
            "certs.d",
            "local",
        ):
            (node.directory / sub).mkdir(parents=True, exist_ok=True)
        (node.directory / "containerd" / "config.toml").write_text(containerd_config(node))
        (node.directory / "base-spec.json").write_text(
            json.dumps(base_runtime_spec(self._default_spec(), node), indent=2)
        )
        (node.directory / "local" / "app-ok").write_text("this node has what the app needs\n")
        node.cni_conf.write_text(cni_config(node, self.network))
        self._write_mirrors(node, self.registry)
        wrapper = node.directory / "runc"
        wrapper.write_text(runc_wrapper(node))
        wrapper.chmod(0o755)
        # The node's upstream resolver, which CoreDNS forwards to (dnsPolicy: Default): the
        # machine, where nothing answers DNS. Names outside the cluster fail at once, and
        # CoreDNS's loop plugin finds no loop (127.0.0.1 would be CoreDNS itself).
        (node.directory / "resolv.conf").write_text(f"nameserver {self.gateway}\n")
        cluster_pki = self._require_pki()
        ca = pki.KeyPair(cluster_pki.ca_crt.read_bytes(), cluster_pki.ca_key.read_bytes())
        client = pki.issue(
            ca, f"system:node:{node.name}", organizations=("system:nodes",), client=True
        )
        crt, key = client.write(node.directory / "kubelet", "client")
        serving = pki.issue(
            ca, node.name, dns_names=(node.name,), ip_addresses=(node.address,), server=True
        )
        serving.write(node.directory / "kubelet", "serving")
        (node.directory / "kubelet" / "kubeconfig").write_text(
            yaml.safe_dump(_kubeconfig(self.server, cluster_pki.ca_crt, crt, key, node.name))
        )
        self._write_kubelet_config(node)
        # kube-proxy's identity: the user the bootstrap policy binds to system:node-proxier.
        proxy = pki.issue(ca, "system:kube-proxy", client=True)
        crt, key = proxy.write(node.directory / "kube-proxy", "client")
        (node.directory / "kube-proxy" / "kubeconfig").write_text(
            yaml.safe_dump(
                _kubeconfig(self.server, cluster_pki.ca_crt, crt, key, "system:kube-proxy")
            )
        )
        (node.directory / "kube-proxy" / "config.yaml").write_text(
            yaml.safe_dump(
                kube_proxy_config(
                    node,
                    cluster_cidr=self._require_net().pod_cidr,
                    masquerade_all=not bridged_traffic_filtered(),
                ),
                sort_keys=False,
            )
        )

    def _write_mirrors(self, node: NodeLayout, upstream: str) -> None:
        """Every registry the node's pods name, served by ``upstream``: the local names
        (IMAGE_HOST), registry.k8s.io and gcr.io (add-ons and Knative's images keep their
        upstream names) and the local registry's own address (images pushed there by
        reference, plain HTTP)."""
        for host in (IMAGE_HOST, UPSTREAM_HOST, KNATIVE_RELEASES_HOST, self.registry):
            path = node.mirror_config(host)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(hosts_toml(upstream))

    def _require_pki(self) -> pki.ClusterPKI:
        if self.pki is None:
            raise RealNodeError("the real nodes are not started: no cluster PKI yet")
        return self.pki

    def _require_net(self) -> nodenet.ClusterNet:
        if self.net is None:
            raise RealNodeError("the real nodes' network is not prepared")
        return self.net

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
        config = kubelet_config(node, ca_file=self._require_pki().ca_crt, eviction_hard=eviction)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def start(
        self,
        deadline: float,
        *,
        server: str,
        cluster_pki: pki.ClusterPKI,
        registry: str,
        pause_archive: Path,
    ) -> None:
        """Every node's files, then containerd on every node (the pause image imported), then
        the kubelets and kube-proxies. ``registry``: ``host:port`` of the local registry, on
        an address the nodes reach."""
        self.server = server
        self.pki = cluster_pki
        self.registry = registry
        for node in self.layouts.values():
            self._write_files(node)
        for node in self.layouts.values():
            self._start_containerd(node, deadline)
            self._import(node, pause_archive, deadline)
        for node in self.layouts.values():
            self._start_kubelet(node)
            self._start_kube_proxy(node)

    def _spawn(self, node: NodeLayout, name: str, argv: list[str]) -> Proc:
        """``argv`` in ``node``'s network namespace."""
        return Proc(name, node.net.enter(argv), self.log_dir / f"{name}.log")

    def _start_containerd(self, node: NodeLayout, deadline: float) -> None:
        proc = self._spawn(
            node,
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
            node,
            f"kubelet-{node.name}",
            [
                str(self.kubelet_bin),
                f"--config={config}",
                f"--kubeconfig={d / 'kubeconfig'}",
                f"--root-dir={d / 'root'}",
                f"--cert-dir={d / 'pki'}",
                f"--hostname-override={node.name}",
                f"--node-ip={node.address}",
                "--node-labels=type=real,kn-rescheduler.local/real-node=true",
                "--v=1",
            ],
        )

    def _start_kube_proxy(self, node: NodeLayout) -> None:
        self.kube_proxies[node.name] = self._spawn(
            node,
            f"kube-proxy-{node.name}",
            [
                str(self.kube_proxy_bin),
                f"--config={node.directory / 'kube-proxy' / 'config.yaml'}",
                "--v=1",
            ],
        )

    def start_firewalls(self, binary: Path) -> None:
        """kube-router's NetworkPolicy firewall on every node, in its network namespace, as the
        user ``networkpolicies.USER`` (networkpolicies.py): from then on the nodes refuse what
        the cluster's NetworkPolicies do not admit."""
        cluster_pki = self._require_pki()
        ca = pki.KeyPair(cluster_pki.ca_crt.read_bytes(), cluster_pki.ca_key.read_bytes())
        identity = pki.issue(ca, networkpolicies.USER, client=True)
        for node in self.layouts.values():
            if node.name in self.firewalls:
                continue
            directory = node.directory / "kube-router"
            directory.mkdir(parents=True, exist_ok=True)
            crt, key = identity.write(directory, "client")
            kubeconfig = directory / "kubeconfig"
            kubeconfig.write_text(
                yaml.safe_dump(
                    _kubeconfig(self.server, cluster_pki.ca_crt, crt, key, networkpolicies.USER)
                )
            )
            self.firewalls[node.name] = self._spawn(
                node,
                f"kube-router-{node.name}",
                networkpolicies.argv(binary, kubeconfig, node.name),
            )

    def check_alive(self) -> None:
        procs = [
            *self.containerd.items(),
            *self.kubelets.items(),
            *self.kube_proxies.items(),
            *self.firewalls.items(),
        ]
        for name, proc in procs:
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
        """Kubelets, kube-proxies and firewalls, then every container, shim and containerd,
        then what they changed (the network included)."""
        for proc in [
            *self.kubelets.values(),
            *self.kube_proxies.values(),
            *self.firewalls.values(),
        ]:
            proc.stop(grace=10.0)
        self.kubelets.clear()
        self.kube_proxies.clear()
        self.firewalls.clear()
        # Before any shim dies: containerd deletes a dead shim's bundle, where its socket's
        # path is written, and the socket outlives a SIGKILLed shim.
        sockets = hostchanges.shim_sockets(str(self.base)) if self.record is not None else set()
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
            hostchanges.undo(self.record, known_sockets=sockets)
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
                self._hanging = HangingMirror(self.gateway)
            mirror = self._hanging.address
        if "mirror-refused" in after:
            mirror = f"127.0.0.1:{self._refused_port}"
        self._write_mirrors(node, mirror)
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
                "address": node.address,
                "netns": node.net.netns,
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
