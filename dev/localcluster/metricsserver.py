"""The Metrics API (``metrics.k8s.io/v1beta1``, what ``kubectl top`` reads) on the local cluster,
served by a real metrics-server scraping kwok's emulated kubelet resource metrics.

A function that reads node usage from the Metrics API should be tested against the real thing:
the real metrics-server (built by ``hack/build-metrics-server.sh``), registered with the real
aggregation layer of the API server, computing CPU rates from cumulative counters the way it
does on a real cluster. Only the kubelets are simulated, by kwok, and their usage follows the
same Node annotations as the node-exporter endpoints Prometheus scrapes
(``sim.kn-rescheduler.io/cpu-usage`` / ``memory-usage``, fractions 0..1, set with
``Cluster.set_node_usage``). The pieces, each forced by how the real components work:

- **kwok serves ``/metrics/resource``.** kwok v0.8.0 plays a kubelet's resource metrics from a
  ``Metric`` in its configuration, at ``/metrics/nodes/<node>/metrics/resource`` on its server
  (``--server-address``), one server for all nodes.
- **Node usage is carried by one pod per node.** kwok computes a node's usage only as the sum
  of its pods' usage (``node.Usage`` / ``node.CumulativeUsage``, pkg/kwok/server/
  metrics_resource_usage.go), and only for nodes that have pods. The CPU figure metrics-server
  wants is a cumulative counter (core-seconds); kwok integrates it over time itself, but only
  through those pod sums. A stateless expression of the annotation (fraction x cores x time)
  would jump whenever the annotation changes (by the change times the node's age), and
  metrics-server would report a spike far above the node's CPUs, or drop the node, for a
  window. So a DaemonSet, ``kn-rescheduler-sim-node-load``
  in ``kube-system`` (a pause container, like a node's own system daemons), gives every node
  a pod whose usage is the node's simulated usage: fraction x the Node's **allocatable** CPU
  and memory (what ``kubectl top nodes`` divides by), read from the Node's annotations by a
  ``ClusterResourceUsage`` CEL expression. Every other pod uses nothing, so the node's usage is
  exactly what its annotations say. kwok evaluates the expression at each scrape and credits
  the whole interval since the previous scrape with it, so a new usage shows in the Metrics
  API from the first scrape after it is set (metrics-server scrapes every 10 s, its minimum).
- **The nodes' network.** Nodes have InternalIPs (10.0.0.x) that no machine answers, and
  metrics-server asks ``http://<InternalIP>:<kubelet port>/metrics/resource``, as on a real
  cluster. :class:`NodeNetwork` is an HTTP proxy on 127.0.0.1, named to metrics-server by
  ``HTTP_PROXY``, that delivers such a request to kwok's path for the Node with that
  InternalIP (any node, also one registered later; nothing is added to the Node objects).
  kwok's server speaks plain HTTP (the cluster's health check reads it so), hence
  ``--deprecated-kubelet-completely-insecure``. Go never proxies requests to loopback
  addresses, so metrics-server reaches the API server directly. (metrics-server >= 0.7 would
  also follow a Node annotation ``metrics.k8s.io/resource-metrics-path`` to kwok's path, as
  kwok's docs suggest; the proxy needs none.)
- **The aggregation layer.** The API server already runs with the front-proxy
  (request-header) CA and client certificate (:mod:`localcluster.pki`). The APIService
  ``v1beta1.metrics.k8s.io`` names the Service ``kube-system/metrics-server``, an
  ``ExternalName`` Service for ``127.0.0.1``: the aggregator resolves an ExternalName Service
  to that name and the APIService's port (k8s.io/apiserver pkg/util/proxy ``ResolveCluster``);
  routing through Endpoints (``--enable-aggregator-routing``) cannot work here, because
  Endpoints and EndpointSlices refuse loopback addresses (``ValidateEndpointIP``). A
  real-node cluster is the other way round: its API server routes through endpoints (it has
  no kube-proxy of its own to reach a ClusterIP), which refuses ExternalName Services, so
  metrics-server listens on the nodes' gateway and a selector-less Service with an
  EndpointSlice of that address stands for it. The
  aggregator checks the serving certificate against the APIService's ``caBundle`` for the name
  ``metrics-server.kube-system.svc``, which the certificate made here carries.
- **Real kubelets** (``Cluster(real_nodes=N, nodes=0, metrics_server=True)``): metrics-server
  scrapes them as on any cluster, over HTTPS at the Node's InternalIP and kubelet port, the
  kubelet's serving certificate checked against the cluster CA (which signed it for the
  node's own address, :mod:`localcluster.realnode`), its ServiceAccount token authenticated and
  authorized by the kubelet's webhooks (``nodes/metrics``). No proxy, no load DaemonSet: the
  usage is the kubelet's own, from cAdvisor. All real nodes share the machine, and a kubelet
  reports its node's usage from the root cgroup, so each reports the whole machine's.
- **Its identity.** metrics-server runs as the ServiceAccount ``kube-system/metrics-server``
  (a token from the TokenRequest API) with the RBAC of metrics-server's own manifests, so a
  missing permission shows up here as on a real cluster.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import requests
import yaml
from kubernetes.utils import parse_quantity

from dev.localcluster import pki
from dev.localcluster.bins import BinsError, run_build_script
from dev.localcluster.keys import (
    SIM_CPU_USAGE_ANNOTATION,
    SIM_MEMORY_USAGE_ANNOTATION,
)
from dev.localcluster.nodeexporter import DEFAULT_CPU_USAGE, DEFAULT_MEMORY_USAGE
from dev.localcluster.rest import ApiError, Rest

JSON = dict[str, Any]

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
BUILD_SCRIPT: Final = REPO_ROOT / "hack" / "build-metrics-server.sh"
# Names a metrics-server binary to run instead of building one.
ENV_METRICS_SERVER: Final = "KN_RESCHEDULER_METRICS_SERVER"
PROCESS_NAME: Final = "metrics-server"

NAMESPACE: Final = "kube-system"
SERVICE_NAME: Final = "metrics-server"
API_SERVICE_NAME: Final = "v1beta1.metrics.k8s.io"
NODES_PATH: Final = "/apis/metrics.k8s.io/v1beta1/nodes"
# metrics-server's minimum --metric-resolution (cmd/metrics-server/app/options/options.go).
RESOLUTION_SECONDS: Final = 10
# Must stay under 90 % of the resolution (same file).
KUBELET_TIMEOUT_SECONDS: Final = 5
# From creating the objects to the Metrics API listing every node (two scrapes, 10 s apart).
START_TIMEOUT: Final = 60.0
# The port nodes advertise for their kubelet (status.daemonEndpoints), as on a real node.
KUBELET_PORT: Final = 10250

# The path a kubelet serves its resource metrics at, which metrics-server scrapes.
KUBELET_RESOURCE_PATH: Final = "/metrics/resource"
# A third-party key the harness alone uses (the project's own keys are in shared.api.keys):
# the recommended name label, on the load DaemonSet.
NAME_LABEL: Final = "app.kubernetes.io/name"
LOAD_DAEMONSET: Final = "kn-rescheduler-sim-node-load"
PAUSE_IMAGE: Final = "registry.k8s.io/pause:3.10"

# A usage annotation kwok's CEL expression accepts as a number: what Go's ParseFloat reads,
# without surrounding spaces, NaN or infinities (anything else means the default, as for the
# node-exporter endpoints). The same pattern is used in Python by expected_usage().
FRACTION_PATTERN: Final = r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]{1,2})?$"


class MetricsServerError(RuntimeError):
    """metrics-server could not be built, or did not start (the message says why)."""


def resource_metrics_path(node: str) -> str:
    """Where kwok serves ``node``'s kubelet resource metrics."""
    return f"/metrics/nodes/{node}/metrics/resource"


# -- kwok's configuration ---------------------------------------------------------------------


def _cel_fraction(annotation: str, default: float) -> str:
    """A CEL expression: the Node's ``annotation`` as a fraction clamped to 0..1, or
    ``default`` when it is absent or not a number."""
    annotations = "node.metadata.annotations"
    key = json.dumps(annotation)
    value = f"double({annotations}[{key}])"
    return (
        f'({key} in {annotations} && {annotations}[{key}].matches(r"{FRACTION_PATTERN}")'
        f" ? ({value} < 0.0 ? 0.0 : ({value} > 1.0 ? 1.0 : {value}))"
        f" : {float(default)!r})"
    )


def _cel_load_pod() -> str:
    """A CEL condition: the pod is the node's load pod (of the DaemonSet)."""
    labels = "pod.metadata.labels"
    return (
        f"pod.metadata.namespace == {json.dumps(NAMESPACE)}"
        f" && {json.dumps(NAME_LABEL)} in {labels}"
        f" && {labels}[{json.dumps(NAME_LABEL)}] == {json.dumps(LOAD_DAEMONSET)}"
    )


def usage_expression(resource: str) -> str:
    """The CEL expression of a container's ``resource`` ("cpu" or "memory") usage: the node's
    simulated usage for its load pod, nothing for every other pod."""
    annotation, default = {
        "cpu": (SIM_CPU_USAGE_ANNOTATION, DEFAULT_CPU_USAGE),
        "memory": (SIM_MEMORY_USAGE_ANNOTATION, DEFAULT_MEMORY_USAGE),
    }[resource]
    return (
        f"{_cel_load_pod()}"
        f' ? node.status.allocatable["{resource}"] * {_cel_fraction(annotation, default)}'
        f' : Quantity("0")'
    )


def kwok_documents() -> list[JSON]:
    """kwok's ``Metric`` (a kubelet's ``/metrics/resource``, node series only: metrics-server
    reads these three for a node) and the ``ClusterResourceUsage`` behind the node series."""
    metric = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Metric",
        "metadata": {"name": "kn-rescheduler-metrics-resource"},
        "spec": {
            "path": resource_metrics_path("{nodeName}"),
            "metrics": [
                {
                    "name": "scrape_error",
                    "dimension": "node",
                    "kind": "gauge",
                    "help": "[ALPHA] 1 if there was an error while getting container metrics, "
                    "0 otherwise",
                    "value": "0",
                },
                {
                    "name": "node_cpu_usage_seconds_total",
                    "dimension": "node",
                    "kind": "counter",
                    "help": "[ALPHA] Cumulative cpu time consumed by the node in core-seconds",
                    "value": 'node.CumulativeUsage("cpu")',
                },
                {
                    "name": "node_memory_working_set_bytes",
                    "dimension": "node",
                    "kind": "gauge",
                    "help": "[ALPHA] Current working set of the node in bytes",
                    "value": 'node.Usage("memory")',
                },
            ],
        },
    }
    usage = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "ClusterResourceUsage",
        "metadata": {"name": "kn-rescheduler-node-load"},
        # No selector: every pod gets a usage (nothing, unless it is a load pod); a pod without
        # one would make kwok log an error at every scrape.
        "spec": {
            "usages": [
                {
                    "usage": {
                        "cpu": {"expression": usage_expression("cpu")},
                        "memory": {"expression": usage_expression("memory")},
                    }
                }
            ]
        },
    }
    return [metric, usage]


def kwok_config_yaml() -> str:
    """The documents to append to kwok's ``--config`` stream (starts with a separator)."""
    return "".join("---\n" + yaml.safe_dump(d, sort_keys=False) for d in kwok_documents())


# -- what the Metrics API should show -----------------------------------------------------------


@dataclass(frozen=True)
class NodeUsage:
    """A node's usage as the Metrics API reports it: CPU in cores, memory in bytes."""

    cpu_cores: float
    memory_bytes: float


def usage_fraction(raw: object, default: float) -> float:
    """What kwok's expression makes of an annotation value (see ``_cel_fraction``)."""
    if not isinstance(raw, str) or re.fullmatch(FRACTION_PATTERN, raw) is None:
        return default
    return min(max(float(raw), 0.0), 1.0)


def expected_usage(node: JSON) -> NodeUsage:
    """The usage the Metrics API should report for ``node`` (a Node as the API serves it):
    each fraction of its allocatable CPU and memory."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    cpu = usage_fraction(annotations.get(SIM_CPU_USAGE_ANNOTATION), DEFAULT_CPU_USAGE)
    memory = usage_fraction(annotations.get(SIM_MEMORY_USAGE_ANNOTATION), DEFAULT_MEMORY_USAGE)
    return NodeUsage(
        cpu_cores=float(parse_quantity(str(allocatable.get("cpu", "0")))) * cpu,
        memory_bytes=float(parse_quantity(str(allocatable.get("memory", "0")))) * memory,
    )


def reported_usage(node_metrics: JSON) -> NodeUsage:
    """The usage in one item of ``GET /apis/metrics.k8s.io/v1beta1/nodes`` (a NodeMetrics)."""
    usage = node_metrics.get("usage") or {}
    return NodeUsage(
        cpu_cores=float(parse_quantity(str(usage.get("cpu", "0")))),
        memory_bytes=float(parse_quantity(str(usage.get("memory", "0")))),
    )


def sample(exposition: str, name: str) -> float | None:
    """The value of the unlabelled series ``name`` in Prometheus' text format, if present."""
    for line in exposition.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == name:
            try:
                return float(parts[1])
            except ValueError:
                return None
    return None


# -- the nodes' network ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Forward:
    """Where the node network sends one proxied request: kwok's ``path``, or nowhere
    (``path`` None) with the HTTP ``status`` and ``reason`` to answer instead."""

    path: str | None
    status: int = 200
    reason: str = ""


def forward(request_target: str, node_for_ip: Callable[[str], str | None]) -> Forward:
    """Where a request for a kubelet goes, from its absolute-form target
    (``http://10.0.0.10:10250/metrics/resource``): a kubelet's resource metrics path becomes
    kwok's path of the node with that InternalIP; any other path is kwok's own."""
    parts = urlsplit(request_target)
    if parts.scheme != "http" or not parts.hostname or not parts.path.startswith("/"):
        return Forward(None, 400, "a proxy request needs an absolute http:// URL")
    path = parts.path
    if path == KUBELET_RESOURCE_PATH:
        node = node_for_ip(parts.hostname)
        if node is None:
            # No machine answers there: the closest a proxy can say.
            return Forward(None, 502, f"no Node has the InternalIP {parts.hostname}")
        path = resource_metrics_path(node)
    return Forward(path + (f"?{parts.query}" if parts.query else ""))


def nodes_by_internal_ip(nodes: list[JSON]) -> dict[str, str]:
    """InternalIP -> Node name, for a list of Nodes as the API serves them."""
    found = {}
    for node in nodes:
        for address in (node.get("status") or {}).get("addresses") or []:
            if address.get("type") == "InternalIP" and address.get("address"):
                found[str(address["address"])] = str((node.get("metadata") or {}).get("name"))
    return found


class NodeNetwork:
    """An HTTP proxy standing for the network between metrics-server and the kubelets: a
    request for a node's kubelet reaches kwok's server, which serves all the nodes.

    It learns the nodes' InternalIPs from the API server, again whenever it meets an address
    it does not know (at most once a second), so nodes registered later are reachable too."""

    def __init__(self, kwok_port: int, rest: Rest, log: logging.Logger) -> None:
        self.kwok_port = kwok_port
        self.rest = rest
        self.log = log
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._addresses: dict[str, str] = {}
        self._listed_at = -math.inf

    def node_for_ip(self, ip: str) -> str | None:
        with self._lock:
            if ip not in self._addresses and time.monotonic() - self._listed_at >= 1.0:
                self._listed_at = time.monotonic()
                try:
                    items = self.rest.get("/api/v1/nodes").get("items", [])
                except ApiError as e:
                    self.log.warning("listing the nodes' addresses: %s", e)
                else:
                    self._addresses = nodes_by_internal_ip(items)
            return self._addresses.get(ip)

    @property
    def url(self) -> str:
        if self._server is None:
            raise MetricsServerError("the node network is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        network = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                target = forward(self.path, network.node_for_ip)
                path = target.path
                if path is None:
                    self._answer(target.status, f"{target.reason}\n".encode())
                    return
                conn = http.client.HTTPConnection("127.0.0.1", network.kwok_port, timeout=10)
                try:
                    conn.request("GET", path, headers={"Accept": self.headers.get("Accept", "*/*")})
                    resp = conn.getresponse()
                    body = resp.read()
                except OSError as e:
                    network.log.warning("GET %s: kwok did not answer: %s", self.path, e)
                    self._answer(502, f"kwok did not answer: {e}\n".encode())
                    return
                finally:
                    conn.close()
                self._answer(resp.status, body, resp.getheader("Content-Type", "text/plain"))

            def do_CONNECT(self) -> None:
                self._answer(405, b"kwok's kubelet server speaks plain HTTP\n")

            def _answer(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                network.log.debug("%s %s", self.address_string(), format % args)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="node-network", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


# -- the objects metrics-server needs -------------------------------------------------------------


def manifests(
    port: int, ca_bundle: bytes, *, load: bool = True, host: str = "127.0.0.1"
) -> list[tuple[str, JSON]]:
    """(collection path, object) of everything to create: metrics-server's ServiceAccount and
    RBAC (as in its manifests/base/rbac.yaml), its Service and APIService, the load DaemonSet.
    ``host``: where metrics-server listens; not loopback, the Service is one without a selector
    and an EndpointSlice names that address (a real-node cluster's gateway)."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    sa_subject = [{"kind": "ServiceAccount", "name": SERVICE_NAME, "namespace": NAMESPACE}]
    labels = {"k8s-app": SERVICE_NAME}
    load_labels = {NAME_LABEL: LOAD_DAEMONSET}
    made: list[tuple[str, JSON]] = [
        (
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": SERVICE_NAME, "namespace": NAMESPACE, "labels": labels},
            },
        ),
        (
            f"{rbac}/clusterroles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {
                    "name": "system:aggregated-metrics-reader",
                    "labels": {
                        **labels,
                        "rbac.authorization.k8s.io/aggregate-to-view": "true",
                        "rbac.authorization.k8s.io/aggregate-to-edit": "true",
                        "rbac.authorization.k8s.io/aggregate-to-admin": "true",
                    },
                },
                "rules": [
                    {
                        "apiGroups": ["metrics.k8s.io"],
                        "resources": ["pods", "nodes"],
                        "verbs": ["get", "list", "watch"],
                    }
                ],
            },
        ),
        (
            f"{rbac}/namespaces/{NAMESPACE}/rolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {
                    "name": "metrics-server-auth-reader",
                    "namespace": NAMESPACE,
                    "labels": labels,
                },
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "extension-apiserver-authentication-reader",
                },
                "subjects": sa_subject,
            },
        ),
        (
            f"{rbac}/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "metrics-server:system:auth-delegator", "labels": labels},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:auth-delegator",
                },
                "subjects": sa_subject,
            },
        ),
        (
            f"{rbac}/clusterroles",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "system:metrics-server", "labels": labels},
                "rules": [
                    {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
                    {
                        "apiGroups": [""],
                        "resources": ["pods", "nodes"],
                        "verbs": ["get", "list", "watch"],
                    },
                ],
            },
        ),
        (
            f"{rbac}/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "system:metrics-server", "labels": labels},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:metrics-server",
                },
                "subjects": sa_subject,
            },
        ),
        (
            f"/api/v1/namespaces/{NAMESPACE}/services",
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": SERVICE_NAME, "namespace": NAMESPACE, "labels": labels},
                "spec": (
                    # Not a ClusterIP Service: nothing here routes ClusterIPs (no kube-proxy).
                    {
                        "type": "ExternalName",
                        "externalName": host,
                        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
                    }
                    if host == "127.0.0.1"
                    # The API server routes to endpoints there (--enable-aggregator-routing),
                    # which refuses ExternalName Services: the address is the endpoint.
                    else {"ports": [{"name": "https", "port": port, "protocol": "TCP"}]}
                ),
            },
        ),
        *(
            []
            if host == "127.0.0.1"
            else [
                (
                    f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices",
                    {
                        "apiVersion": "discovery.k8s.io/v1",
                        "kind": "EndpointSlice",
                        "metadata": {
                            "name": SERVICE_NAME,
                            "namespace": NAMESPACE,
                            "labels": {
                                **labels,
                                "kubernetes.io/service-name": SERVICE_NAME,
                                # Ours, not the EndpointSlice controller's, which leaves it be.
                                "endpointslice.kubernetes.io/managed-by": "kn-rescheduler-local",
                            },
                        },
                        "addressType": "IPv4",
                        "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
                        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
                    },
                )
            ]
        ),
        (
            "/apis/apiregistration.k8s.io/v1/apiservices",
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": API_SERVICE_NAME, "labels": labels},
                "spec": {
                    "service": {"name": SERVICE_NAME, "namespace": NAMESPACE, "port": port},
                    "group": "metrics.k8s.io",
                    "version": "v1beta1",
                    "caBundle": base64.b64encode(ca_bundle).decode(),
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                },
            },
        ),
        (
            f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets",
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": LOAD_DAEMONSET, "namespace": NAMESPACE, "labels": load_labels},
                "spec": {
                    "selector": {"matchLabels": load_labels},
                    "template": {
                        "metadata": {"labels": load_labels},
                        "spec": {
                            "containers": [{"name": "load", "image": PAUSE_IMAGE}],
                            # On every node, tainted or not, like a node's own daemons.
                            "tolerations": [{"operator": "Exists"}],
                            "priorityClassName": "system-node-critical",
                            "automountServiceAccountToken": False,
                            "terminationGracePeriodSeconds": 0,
                        },
                    },
                },
            },
        ),
    ]
    # The load DaemonSet is kwok's alone: a real kubelet reports its own usage.
    return [(path, obj) for path, obj in made if load or obj["kind"] != "DaemonSet"]


def ensure_binary() -> str:
    """The metrics-server binary: ``$KN_RESCHEDULER_METRICS_SERVER``, else the one
    ``hack/build-metrics-server.sh`` builds (once; cached by version)."""
    override = os.environ.get(ENV_METRICS_SERVER)
    if override:
        if not os.access(override, os.X_OK):
            raise MetricsServerError(f"{ENV_METRICS_SERVER}={override} is not an executable")
        return override
    try:
        built = run_build_script(BUILD_SCRIPT)
    except BinsError as err:
        raise MetricsServerError(str(err)) from err
    if not os.access(built, os.X_OK):
        raise MetricsServerError(f"hack/build-metrics-server.sh printed {built}, not an executable")
    return built


class MetricsServerStack:
    """Everything around the metrics-server process, which the Cluster runs like its own."""

    def __init__(
        self,
        directory: Path,
        rest: Rest,
        server: str,
        cluster_pki: pki.ClusterPKI,
        *,
        kwok_port: int,
        port: int,
        log: logging.Logger,
        real_kubelets: bool = False,
        host: str = "127.0.0.1",
    ) -> None:
        self.directory = directory
        # Where it listens: loopback, or a real-node cluster's gateway (see manifests()).
        self.host = host
        self.rest = rest
        self.server = server
        self.pki = cluster_pki
        self.kwok_port = kwok_port
        self.port = port
        self.log = log
        self.network = NodeNetwork(kwok_port, rest, log)
        # Real kubelets: scraped over HTTPS, no node network, no load DaemonSet.
        self.real_kubelets = real_kubelets
        self.kubeconfig = directory / "kubeconfig"
        self.cert = directory / "serving.crt"
        self.key = directory / "serving.key"

    def prepare(self) -> None:
        """Creates the objects, writes the serving certificate and kubeconfig, and starts the
        node network."""
        self.directory.mkdir(parents=True, exist_ok=True)
        ca = pki.KeyPair(self.pki.ca_crt.read_bytes(), self.pki.ca_key.read_bytes())
        serving = pki.issue(
            ca,
            "metrics-server",
            dns_names=(f"{SERVICE_NAME}.{NAMESPACE}.svc", "localhost"),
            ip_addresses=tuple(dict.fromkeys(("127.0.0.1", self.host))),
            server=True,
        )
        self.cert, self.key = serving.write(self.directory, "serving")
        made = manifests(self.port, ca.cert_pem, load=not self.real_kubelets, host=self.host)
        for path, obj in made:
            try:
                self.rest.post(path, obj)
            except ApiError as e:
                if e.status != 409:  # already there: a restarted start-up
                    raise
        token = self.rest.post(
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{SERVICE_NAME}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                # A year: the harness does not rotate it as a kubelet would.
                "spec": {"expirationSeconds": 365 * 24 * 3600},
            },
        )["status"]["token"]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": base64.b64encode(ca.cert_pem).decode(),
                    },
                }
            ],
            "users": [{"name": SERVICE_NAME, "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": SERVICE_NAME}}],
            "current-context": "local",
        }
        self.kubeconfig.touch(mode=0o600)
        self.kubeconfig.write_text(yaml.safe_dump(config))
        if not self.real_kubelets:
            self.network.start()

    def kwok_serves_load(self, nodes: list[str]) -> bool:
        """True once kwok reports a working set for every node (it has seen each load pod).
        Also starts kwok's CPU counters, so metrics-server's first scrape already counts."""
        session = requests.Session()
        session.trust_env = False
        with session:
            for node in nodes:
                url = f"http://127.0.0.1:{self.kwok_port}{resource_metrics_path(node)}"
                try:
                    resp = session.get(url, timeout=2)
                except requests.RequestException:
                    return False
                if not (sample(resp.text, "node_memory_working_set_bytes") or 0.0) > 0.0:
                    return False
        return True

    def argv(self, binary: str) -> list[str]:
        return [
            binary,
            f"--bind-address={self.host}",
            f"--secure-port={self.port}",
            f"--tls-cert-file={self.cert}",
            f"--tls-private-key-file={self.key}",
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--kubelet-preferred-address-types=InternalIP",
            "--kubelet-use-node-status-port",
            *(
                [f"--kubelet-certificate-authority={self.pki.ca_crt}"]
                if self.real_kubelets
                else ["--deprecated-kubelet-completely-insecure"]
            ),
            f"--kubelet-request-timeout={KUBELET_TIMEOUT_SECONDS}s",
            f"--metric-resolution={RESOLUTION_SECONDS}s",
            "--v=2",
        ]

    def env(self) -> dict[str, str]:
        # Go's http.ProxyFromEnvironment: used for the http:// kubelet URLs, never for the API
        # server on 127.0.0.1 (loopback is never proxied).
        if self.real_kubelets:
            return {}
        return {"HTTP_PROXY": self.network.url, "http_proxy": self.network.url}

    def lists_every_node(self, nodes: list[str]) -> bool:
        items = self.rest.get(NODES_PATH).get("items", [])
        return {i["metadata"]["name"] for i in items} >= set(nodes)

    def stop(self) -> None:
        if not self.real_kubelets:
            self.network.stop()


def within(reported: NodeUsage, expected: NodeUsage, tolerance: float = 0.02) -> bool:
    """Whether a reported usage matches the expected one (relative, plus a little slack for a
    quiet node's small figures)."""
    return math.isclose(
        reported.cpu_cores, expected.cpu_cores, rel_tol=tolerance, abs_tol=0.01
    ) and math.isclose(
        reported.memory_bytes, expected.memory_bytes, rel_tol=tolerance, abs_tol=1024 * 1024
    )
