"""Knative's own Broker on the local control plane: its ingress, filter and channel dispatcher.

The events of the local stack travel exactly as in a cluster with Knative Eventing's
multi-tenant channel-based Broker (``MTChannelBasedBroker`` over an ``InMemoryChannel``)::

    ApiServerSource adapter --> broker ingress --> in-memory channel dispatcher
        --(one subscription per Trigger)--> broker filter --(Trigger filter)--> function
        function's reply --(the subscription's reply URI: the Broker)--> broker ingress ...
        failed after the Trigger's retries --(dead-letter sink)--> dead-letter receiver

The three data plane binaries are Knative's (built from the same module as the adapter by
``hack/build-adapter.sh``), and so are the CRDs and ConfigMaps installed for them. What is not
run is Knative's *control* plane: its controllers would need cluster DNS and Services with
endpoints for every address they resolve. So this module does, once, what they would do, and
writes it where the data plane reads it:

- the Broker's ``status.address`` (the ingress) and its ``knative.dev/channelAddress`` status
  annotation (the channel), which the ingress routes by;
- the Broker's ``InMemoryChannel`` (``<broker>-kne-trigger``, owned by the Broker), whose
  ``spec.subscribers`` hold, per Trigger, what the Trigger's Subscription would: the filter's
  ``/triggers/NS/NAME/UID`` URL, the Broker as reply URI and the Trigger's delivery spec with
  its dead-letter sink resolved; the dispatcher routes by the path ``/NS/NAME``;
- each Trigger's ``status.subscriberUri`` and ``deadLetterSinkUri``, which the filter reads
  (it finds the Trigger by UID);
- Ready conditions with ``observedGeneration``, as the controllers would report them.

Service references resolve to the local functions' URLs (``subscribers``), the dead-letter
sink to a local receiver writing ``dead-letters.jsonl``. What the project's former home-made
router gave is kept with Knative's means: a catch-all ``archive`` Trigger (local only)
delivers every event to a receiver that appends it to ``archive.jsonl`` for ``make replay``.

Knative's binaries bind fixed ports on every interface, so they run in a network namespace of
the stack's own (:mod:`pipeline.netns`) and reach the API server and the functions through
loopback forwards that keep port numbers. The Broker's address is a forward inside that
namespace to the ingress (as a Service address is, to its pod): it lets :meth:`wait_idle` see a
request still being fanned out. :attr:`url` is the Broker as seen from this machine.

The channel carries the Broker's ``messaging.knative.dev/*`` annotations, as Knative's Broker
reconciler copies them (``pkg/reconciler/broker/broker.go``), so ``knative/broker.yaml``
decides locally what it decides in a cluster, ``messaging.knative.dev/async-handler`` above all:
``"true"`` makes the dispatcher answer the ingress (and so the sender) at once and deliver in
the background; without it the sender waits until every Trigger's delivery and retries are
done (docs/pipeline.md compares the two). ``async_handler`` overrides it for a bench.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import logging
import os
import socket
import subprocess
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import requests
import yaml
from kubernetes import client as k8s

from dev.pipeline import cloudevent
from dev.pipeline.netns import Forward, NetNamespace
from dev.pipeline.source import _die_with_parent, _terminate, knative_dir
from kubectl_kn_rescheduler.routing import filters, triggers

log = logging.getLogger(__name__)

SYSTEM_NAMESPACE: Final = "knative-eventing"
EVENTING: Final = ("eventing.knative.dev", "v1")
MESSAGING: Final = ("messaging.knative.dev", "v1")
ASYNC_HANDLER: Final = "messaging.knative.dev/async-handler"
SCOPE: Final = "eventing.knative.dev/scope"
CHANNEL_ADDRESS: Final = "knative.dev/channelAddress"
ARCHIVE_TRIGGER: Final = "archive"
PROBE_TYPE: Final = "io.kn-rescheduler.local.probe"
# Inside the namespace. The dispatcher's 8080/8443 are Go constants; the others are set by env.
DISPATCHER_PORT: Final = 8080
INGRESS_PORT: Final = 8180
# The filter answers as Knative's broker-filter Service does, by that name on port 80 (the
# namespace's hosts file): the dispatcher unwraps the filter's error details into the
# dead-letter extensions only for a destination of exactly that host (kncloudevents,
# dispatchExecutionInfoTransformers), so dead letters look here as in a cluster.
FILTER_HOST: Final = f"broker-filter.{SYSTEM_NAMESPACE}.svc.cluster.local"
FILTER_PORT: Final = 80
BROKER_PORT: Final = 8380
INGRESS_HTTPS_PORT: Final = 8543
FILTER_HTTPS_PORT: Final = 8643
DISPATCHER_HTTPS_PORT: Final = 8443
# The ApiServerSource's own way to the ingress: a forward of its own, so the chaos suite can
# lose source events (and only those) where Knative loses them.
SOURCE_PORT: Final = 8381
# Taken inside the namespace: nothing outside may be forwarded in on these.
RESERVED_PORTS: Final = frozenset(
    {
        DISPATCHER_PORT,
        DISPATCHER_HTTPS_PORT,
        INGRESS_PORT,
        INGRESS_HTTPS_PORT,
        FILTER_PORT,
        FILTER_HTTPS_PORT,
        BROKER_PORT,
        SOURCE_PORT,
    }
)


class BrokerError(RuntimeError):
    pass


# -- what Knative's controllers would write --------------------------------------------------


def _ready(generation: int) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "observedGeneration": generation,
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
    }


def _ref_name(destination: Mapping[str, Any] | None) -> str | None:
    if not destination:
        return None
    ref = destination.get("ref") or {}
    return str(ref["name"]) if ref.get("name") else None


def resolve(destination: Mapping[str, Any] | None, services: Mapping[str, str]) -> str | None:
    """A Destination as the URL it stands for here: a ``ref`` to a Service is that Service's
    local URL, a ``uri`` alone is itself, both are the uri relative to the ref (Knative's
    Destination rules); None when the Service does not run here."""
    if not destination:
        return None
    uri = str(destination.get("uri") or "")
    name = _ref_name(destination)
    if name is None:
        return uri or None
    base = services.get(name)
    if base is None:
        return None
    return base.rstrip("/") + "/" + uri.lstrip("/") if uri else base


def channel_subscriber(
    trigger: Mapping[str, Any],
    broker: Mapping[str, Any],
    *,
    filter_url: str,
    broker_url: str,
    services: Mapping[str, str],
) -> dict[str, Any]:
    """The ``spec.subscribers`` entry the Trigger's Subscription puts on the Broker's channel
    (OIDC off: the reply goes to the Broker, the dead-letter sink straight to its address)."""
    meta = trigger["metadata"]
    delivery = dict(trigger["spec"].get("delivery") or broker["spec"].get("delivery") or {})
    dls = resolve(delivery.get("deadLetterSink"), services)
    if dls:
        delivery["deadLetterSink"] = {"uri": dls}
    else:
        delivery.pop("deadLetterSink", None)
    entry: dict[str, Any] = {
        "uid": meta["uid"],
        "generation": meta.get("generation", 1),
        "subscriberUri": f"{filter_url}/triggers/{meta['namespace']}/{meta['name']}/{meta['uid']}",
        "replyUri": broker_url,
    }
    if delivery:
        entry["delivery"] = delivery
    return entry


# -- the receivers ----------------------------------------------------------------------------


@dataclass
class Receiver:
    """A local HTTP sink that appends every CloudEvent it gets to a JSON-lines file."""

    path: Path
    record: Callable[[cloudevent.Event], dict[str, Any] | None]
    port: int = 0
    count: int = 0
    probes: int = 0
    _server: http.server.ThreadingHTTPServer | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self) -> Receiver:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = self.rfile.read(length)
                    event = cloudevent.from_http(dict(self.headers.items()), body)
                except ValueError as exc:
                    self._answer(400, str(exc).encode())
                    return
                receiver.take(event)
                self._answer(202, b"")

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def take(self, event: cloudevent.Event) -> None:
        with self._lock:
            if event.type == PROBE_TYPE:
                self.probes += 1
                return
            line = self.record(event)
            if line is None:
                return
            with self.path.open("a") as f:
                f.write(json.dumps(line, separators=(",", ":")) + "\n")
            self.count += 1

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def archive_line(event: cloudevent.Event) -> dict[str, Any]:
    return cloudevent.to_structured_dict(event)


def dead_letter_line(
    event: cloudevent.Event, subscribers: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Knative's dead-letter extensions, read: the subscriber that failed
    (``knativeerrordest``), its last status (``knativeerrorcode``) and answer body
    (``knativeerrordata``, base64); ``trigger`` is the Trigger whose subscriber that is, when
    ``subscribers`` (subscriber URL -> Trigger name) knows it."""
    attrs = event.attributes
    dest = attrs.get("knativeerrordest", "")
    code = attrs.get("knativeerrorcode", "")
    reason = attrs.get("knativeerrordata")
    if reason:
        with contextlib.suppress(ValueError):
            reason = base64.b64decode(reason, validate=True).decode(errors="replace")
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "trigger": (subscribers or {}).get(dest),
        "subscriber": dest,
        "status": int(code) if code.isdigit() else None,
        "reason": reason,
        "event": cloudevent.to_structured_dict(event),
    }


# -- the processes ----------------------------------------------------------------------------


@dataclass
class _Process:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path


class KnativeBroker:
    """The project's Broker and Triggers on Knative's data plane, in a namespace of its own."""

    def __init__(
        self,
        kubeconfig: Path,
        api_client: k8s.ApiClient,
        triggers_dir: Path,
        services: Mapping[str, str],
        workdir: Path,
        log_dir: Path,
        *,
        async_handler: bool | None = None,
        archive: Path | None = None,
        dead_letters: Path | None = None,
        port: int | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.api = k8s.CustomObjectsApi(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.ext = k8s.ApiextensionsV1Api(api_client)
        self.triggers_dir = triggers_dir
        self.services = dict(services)
        self.workdir = workdir
        self.log_dir = log_dir
        self.async_handler = async_handler
        self.archive = archive or workdir / "archive.jsonl"
        self.dead_letters = dead_letters or workdir / "dead-letters.jsonl"
        self.netns = NetNamespace()
        self.forwards: list[Forward] = []
        self.procs: list[_Process] = []
        self.url = ""
        self.namespace = ""
        self.name = ""
        self._archive_rx = Receiver(self.archive, archive_line)
        # Subscriber URL -> Trigger name, filled in when the Triggers are applied.
        self._trigger_of: dict[str, str] = {}
        self._dead_rx = Receiver(self.dead_letters, lambda e: dead_letter_line(e, self._trigger_of))
        self._bins = knative_dir()
        # The Broker's port on this machine, chosen up front so a function's K_SINK can name it,
        # and held bound until its forward listens on it: a port only looked up as free could be
        # taken meanwhile (an outgoing connection's ephemeral port), and the start would fail.
        self._reserved: socket.socket | None = None
        if port:
            self.port = port
        else:
            self._reserved = _reserve_port()
            self.port = int(self._reserved.getsockname()[1])
        self.broker_url_in_namespace = ""
        self._api_forward = ""
        # What the processes in the namespace use (_write_namespace_kubeconfig).
        self.namespace_kubeconfig = workdir / "kubeconfig-in-namespace"
        # Whether the channel answers before delivering (its async-handler annotation), and
        # the longest a retry of any Trigger can wait after a failed attempt.
        self.is_async = False
        self._retry_window = 0.0

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> KnativeBroker:
        try:
            self._start(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, deadline: float) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.netns.create(hosts=[FILTER_HOST])
        self._archive_rx.start()
        self._dead_rx.start()
        services = {
            **self.services,
            ARCHIVE_TRIGGER: self._archive_rx.url,
            "dead-letters": self._dead_rx.url,
        }
        # Out of the namespace, same port: the API server and every URL a Trigger resolves to.
        # The API server's is not an event path (and client-go speaks HTTP/2 on it, where
        # "the client spoke last" does not mean a request is waiting): wait_idle ignores it.
        api_host, api_port = self._api_endpoint()
        self._write_namespace_kubeconfig(api_port)
        self._api_forward = f"out-{api_port}"
        ports = {api_port} | {urllib.parse.urlsplit(u).port or 80 for u in services.values()}
        clash = sorted(ports & RESERVED_PORTS)
        if clash:
            raise BrokerError(
                f"port {clash[0]} is used by Knative's data plane inside the namespace; "
                "run the function or API server on another port"
            )
        for port in sorted(ports):
            host = api_host if port == api_port else "127.0.0.1"
            self._forward(f"out-{port}", self.netns.path, port, None, port, host=host)
        # The Broker's address: a forward to the ingress, as a Service is to its pod.
        self._forward("broker", self.netns.path, BROKER_PORT, self.netns.path, INGRESS_PORT)
        self._forward("source", self.netns.path, SOURCE_PORT, self.netns.path, INGRESS_PORT)
        self._forward(
            "broker-in", None, self.port, self.netns.path, BROKER_PORT, listener=self._reserved
        )
        self._reserved = None  # the forward owns it now

        self._install()
        broker_in_ns = self._apply(services)
        self.url = f"http://127.0.0.1:{self.port}{urllib.parse.urlsplit(broker_in_ns).path}"
        self.broker_url_in_namespace = broker_in_ns

        # The dispatcher first: it must own the namespace's 8080 before anything else binds it
        # (the adapter's health probe tries the same port and gives up quietly).
        self._run(
            "channel_dispatcher",
            ["--disable-ha"],
            {
                "MAX_IDLE_CONNS": "1000",
                "MAX_IDLE_CONNS_PER_HOST": "1000",
            },
        )
        self._wait_port("channel_dispatcher", DISPATCHER_PORT, deadline)
        self._run(
            "ingress",
            [],
            {"INGRESS_PORT": str(INGRESS_PORT), "INGRESS_PORT_HTTPS": str(INGRESS_HTTPS_PORT)},
        )
        self._run(
            "filter",
            [],
            {
                "FILTER_PORT": str(FILTER_PORT),
                "FILTER_PORT_HTTPS": str(FILTER_HTTPS_PORT),
                "NAMESPACE": SYSTEM_NAMESPACE,
            },
        )
        self._wait_port("ingress", INGRESS_PORT, deadline)
        self._wait_port("filter", FILTER_PORT, deadline)
        self._wait_delivering(deadline)

    def stop(self) -> None:
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None
        for p in reversed(self.procs):
            _terminate(p.proc, 5.0)
        self.procs.clear()
        for f in self.forwards:
            f.stop()
        self.forwards.clear()
        self._archive_rx.stop()
        self._dead_rx.stop()
        self.netns.delete()

    def __enter__(self) -> KnativeBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- for the stack --------------------------------------------------------------------------

    def wrap(self, argv: list[str]) -> list[str]:
        """Run ``argv`` in the broker's namespace (the ApiServerSource adapter goes there)."""
        return self.netns.argv(argv)

    @property
    def source_url(self) -> str:
        """Where the ApiServerSource adapter (in the namespace) sends: the Broker's path via the
        ``source`` forward."""
        path = urllib.parse.urlsplit(self.broker_url_in_namespace).path
        return f"http://127.0.0.1:{SOURCE_PORT}{path}"

    def forward(self, name: str) -> Forward:
        """One of the data plane's forwards: ``broker``, ``source``, ``broker-in`` or
        ``out-PORT`` (to the API server, a function or a receiver on PORT)."""
        return next(f for f in self.forwards if f.name == name)

    def busy(self) -> int:
        """Requests on their way through the data plane (the API server's forward aside)."""
        return sum(f.busy() for f in self.forwards if f.name != self._api_forward)

    def wait_idle(self, timeout: float = 30.0, quiet: float = 0.3) -> bool:
        """True once no request is outstanding anywhere in the data plane for ``quiet`` s.

        With the synchronous fan-out the sender's request to the ingress stays open through
        every delivery and retry, so that is exact. With ``async-handler`` a delivery waiting
        out a retry backoff holds no request open: then, after a failed answer, idle also
        means that the longest backoff of any Trigger has passed without a retry."""
        deadline = time.monotonic() + timeout
        calm_since: float | None = None
        while time.monotonic() < deadline:
            now = time.monotonic()
            if self.busy() == 0:
                calm_since = calm_since or now
                failed = self._last_failure()
                retry_due = (
                    self.is_async and failed is not None and now - failed < self._retry_window
                )
                if now - calm_since >= quiet and not retry_due:
                    return True
            else:
                calm_since = None
            time.sleep(0.05)
        return False

    def _last_failure(self) -> float | None:
        # Only deliveries (to a function or receiver) are retried by the dispatcher; a sender's
        # refused event at the ingress is not.
        times = [
            t
            for f in self.forwards
            if f.name.startswith("out-") and f.name != self._api_forward
            if (t := f.last_failure()) is not None
        ]
        return max(times, default=None)

    def stats(self) -> dict[str, int]:
        return {
            "accepted": self._archive_rx.count,
            "dead_lettered": self._dead_rx.count,
        }

    def send(self, headers: Mapping[str, str], body: bytes, timeout: float = 60.0) -> int:
        return requests.post(
            self.url, data=body, headers=dict(headers), timeout=timeout
        ).status_code

    # -- the control plane's part --------------------------------------------------------------

    def _install(self) -> None:
        """Knative's CRDs and ConfigMaps, from the module the binaries were built from."""
        for path in sorted((self._bins / "config" / "crds").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                # Conversion webhooks are Knative's webhook's job; with one served version
                # there is nothing to convert.
                doc["spec"].pop("conversion", None)
                with contextlib.suppress(k8s.ApiException):
                    self.ext.create_custom_resource_definition(doc)
        with contextlib.suppress(k8s.ApiException):
            self.core.create_namespace(_namespace(SYSTEM_NAMESPACE))
        for path in sorted((self._bins / "config" / "configmaps").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc.get("kind") == "ConfigMap":
                    with contextlib.suppress(k8s.ApiException):
                        self.core.create_namespaced_config_map(SYSTEM_NAMESPACE, doc)
        for name in (
            "brokers.eventing.knative.dev",
            "triggers.eventing.knative.dev",
            "inmemorychannels.messaging.knative.dev",
        ):
            _wait(functools.partial(_crd_established, self.ext, name), f"CRD {name}", 30)

    def _apply(self, services: Mapping[str, str]) -> str:
        docs = _load(self.triggers_dir)
        # No Knative webhook runs here: refuse what it would refuse (pipeline.triggers makes
        # its checks) before anything reaches the API server.
        for d in docs:
            if d.get("kind") == "Broker":
                meta = d["metadata"]
                try:
                    triggers.load(
                        self.triggers_dir, namespace=meta["namespace"], broker=meta["name"]
                    )
                except filters.UnsupportedFilter as exc:
                    # Knative's filter evaluates CESQL; only replay cannot.
                    log.warning("%s", exc)
        brokers = [d for d in docs if d.get("kind") == "Broker"]
        if len(brokers) != 1:
            raise BrokerError(f"expected one Broker in {self.triggers_dir}, found {len(brokers)}")
        broker_doc = brokers[0]
        self.namespace = broker_doc["metadata"]["namespace"]
        self.name = broker_doc["metadata"]["name"]
        ns, name = self.namespace, self.name
        with contextlib.suppress(k8s.ApiException):
            self.core.create_namespace(_namespace(ns))
        broker = self._upsert(EVENTING, "brokers", broker_doc)
        applied = [
            self._upsert(EVENTING, "triggers", d)
            for d in docs
            if d.get("kind") == "Trigger"
            and d["spec"].get("broker") == name
            and d["metadata"].get("namespace", ns) == ns
        ]
        archive = self._upsert(
            EVENTING,
            "triggers",
            {
                "apiVersion": "eventing.knative.dev/v1",
                "kind": "Trigger",
                "metadata": {
                    "name": ARCHIVE_TRIGGER,
                    "namespace": ns,
                    "labels": {"app.kubernetes.io/part-of": "kn-rescheduler-local"},
                },
                "spec": {
                    "broker": name,
                    "subscriber": {"uri": services[ARCHIVE_TRIGGER]},
                    "delivery": {"retry": 3, "backoffPolicy": "linear", "backoffDelay": "PT0.1S"},
                },
            },
        )
        applied.append(archive)

        broker_url = f"http://127.0.0.1:{BROKER_PORT}/{ns}/{name}"
        filter_url = f"http://{FILTER_HOST}"
        channel_name = f"{name}-kne-trigger"
        channel_url = f"http://127.0.0.1:{DISPATCHER_PORT}/{ns}/{channel_name}"

        subscribers = []
        for t in applied:
            uri = resolve(t["spec"].get("subscriber"), services)
            if uri is None:
                log.info(
                    "Trigger %s: subscriber %s is not running locally; not subscribed",
                    t["metadata"]["name"],
                    t["spec"].get("subscriber"),
                )
                # What Knative's Trigger controller reports for a subscriber it cannot resolve.
                status = _ready(t["metadata"]["generation"])
                status["conditions"][0].update(
                    status="False",
                    reason="SubscriberResolveFailed",
                    message="the subscriber does not run in the local stack",
                )
                self._status(EVENTING, "triggers", t, status)
                continue
            subscribers.append(
                channel_subscriber(
                    t, broker, filter_url=filter_url, broker_url=broker_url, services=services
                )
            )
            self._trigger_of[uri] = t["metadata"]["name"]
            status = _ready(t["metadata"]["generation"])
            status["subscriberUri"] = uri
            delivery = t["spec"].get("delivery") or broker["spec"].get("delivery") or {}
            dls = resolve(delivery.get("deadLetterSink"), services)
            if dls:
                status["deadLetterSinkUri"] = dls
            self._status(EVENTING, "triggers", t, status)

        channel_doc: dict[str, Any] = {
            "apiVersion": "messaging.knative.dev/v1",
            "kind": "InMemoryChannel",
            "metadata": {
                "name": channel_name,
                "namespace": ns,
                "labels": {
                    "eventing.knative.dev/broker": name,
                    "eventing.knative.dev/brokerEverything": "true",
                },
                "annotations": self._channel_annotations(broker),
                "ownerReferences": [
                    {
                        "apiVersion": "eventing.knative.dev/v1",
                        "kind": "Broker",
                        "name": name,
                        "uid": broker["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"subscribers": subscribers},
        }
        if broker["spec"].get("delivery"):
            channel_doc["spec"]["delivery"] = _resolved_delivery(
                broker["spec"]["delivery"], services
            )
        channel = self._upsert(MESSAGING, "inmemorychannels", channel_doc)
        self.is_async = channel["metadata"]["annotations"].get(ASYNC_HANDLER) == "true"
        self._retry_window = (
            max((_longest_wait(e.get("delivery")) for e in subscribers), default=0.0) + 0.5
        )
        status = _ready(channel["metadata"]["generation"])
        status["address"] = {"name": "http", "url": channel_url}
        status["addresses"] = [{"name": "http", "url": channel_url}]
        self._status(MESSAGING, "inmemorychannels", channel, status)

        status = _ready(broker["metadata"]["generation"])
        status["address"] = {"name": "http", "url": broker_url}
        status["addresses"] = [{"name": "http", "url": broker_url}]
        status["annotations"] = {CHANNEL_ADDRESS: channel_url}
        dls = resolve((broker["spec"].get("delivery") or {}).get("deadLetterSink"), services)
        if dls:
            status["deadLetterSinkUri"] = dls
        self._status(EVENTING, "brokers", broker, status)
        return broker_url

    def _channel_annotations(self, broker: Mapping[str, Any]) -> dict[str, str]:
        """What Knative's Broker reconciler puts on the Broker's channel."""
        out = {SCOPE: "cluster"}
        for key, value in (broker["metadata"].get("annotations") or {}).items():
            if key.startswith("messaging.knative.dev/"):
                out[key] = value
        if self.async_handler is not None:
            out[ASYNC_HANDLER] = str(self.async_handler).lower()
        return out

    def _upsert(self, gv: tuple[str, str], plural: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        group, version = gv
        ns = doc["metadata"]["namespace"]
        name = doc["metadata"]["name"]
        try:
            got: dict[str, Any] = self.api.create_namespaced_custom_object(  # type: ignore[assignment]
                group, version, ns, plural, dict(doc)
            )
            return got
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise BrokerError(f"create {plural} {ns}/{name}: {exc.status} {exc.body}") from exc
        current: dict[str, Any] = self.api.get_namespaced_custom_object(  # type: ignore[assignment]
            group, version, ns, plural, name
        )
        body = dict(doc)
        body["metadata"] = {
            **doc["metadata"],
            "resourceVersion": current["metadata"]["resourceVersion"],
        }
        replaced: dict[str, Any] = self.api.replace_namespaced_custom_object(  # type: ignore[assignment]
            group, version, ns, plural, name, body
        )
        return replaced

    def _status(
        self, gv: tuple[str, str], plural: str, obj: Mapping[str, Any], status: Mapping[str, Any]
    ) -> None:
        group, version = gv
        meta = obj["metadata"]
        self.api.patch_namespaced_custom_object_status(
            group, version, meta["namespace"], plural, meta["name"], {"status": dict(status)}
        )

    # -- helpers --------------------------------------------------------------------------------

    def _api_endpoint(self) -> tuple[str, int]:
        config = yaml.safe_load(self.kubeconfig.read_text())
        server = urllib.parse.urlsplit(config["clusters"][0]["cluster"]["server"])
        return server.hostname or "127.0.0.1", server.port or 443

    def _write_namespace_kubeconfig(self, api_port: int) -> None:
        """The kubeconfig of the processes in the namespace: the API server at the forward's
        end there, 127.0.0.1 (which its certificate names), wherever it listens outside."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{api_port}"
        self.namespace_kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))

    def _forward(
        self,
        name: str,
        listen_in: Path | None,
        listen_port: int,
        connect_in: Path | None,
        port: int,
        listener: socket.socket | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        f = Forward(
            name,
            listen_in=listen_in,
            listen_port=listen_port,
            connect_in=connect_in,
            port=port,
            listener=listener,
            host=host,
        ).start()
        self.forwards.append(f)

    def _run(self, name: str, args: list[str], env: Mapping[str, str]) -> None:
        log_path = self.log_dir / f"knative-{name.replace('_', '-')}.log"
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/"),
            "SYSTEM_NAMESPACE": SYSTEM_NAMESPACE,
            "POD_NAME": f"{name.replace('_', '-')}-{uuid.uuid4().hex[:5]}",
            "CONTAINER_NAME": name.replace("_", "-"),
            "CONFIG_LOGGING_NAME": "config-logging",
            "CONFIG_OBSERVABILITY_NAME": "config-observability",
            "PROFILING_PORT": "0",
            **env,
        }
        argv = self.netns.argv(
            [str(self._bins / name), "--kubeconfig", str(self.namespace_kubeconfig), *args]
        )
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),  # noqa: PLW1509
            )
        self.procs.append(_Process(name, proc, log_path))

    def _wait_port(self, name: str, port: int, deadline: float) -> None:
        proc = next(p for p in self.procs if p.name == name)
        while not self.netns.listening(port):
            if proc.proc.poll() is not None:
                raise BrokerError(
                    f"{name} exited with {proc.proc.returncode}:\n"
                    f"{proc.log_path.read_text(errors='replace')[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"{name} does not listen on {port}:\n"
                    f"{proc.log_path.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.1)

    def _wait_delivering(self, deadline: float) -> None:
        """Probe events through ingress, channel and filter until the archive Trigger gets one:
        every informer has synced and the dispatcher has the channel."""
        last = ""
        while self._archive_rx.probes == 0:
            headers = {
                "ce-specversion": "1.0",
                "ce-id": str(uuid.uuid4()),
                "ce-source": "kn-rescheduler/local",
                "ce-type": PROBE_TYPE,
                "content-type": "application/json",
            }
            try:
                status = self.send(headers, b"{}", timeout=5)
                last = f"ingress answered {status}"
            except requests.RequestException as exc:
                last = str(exc)
            if self._archive_rx.probes:
                break
            if time.monotonic() > deadline:
                tails = "\n".join(
                    f"--- {p.name}\n{p.log_path.read_text(errors='replace')[-1500:]}"
                    for p in self.procs
                )
                raise BrokerError(f"the Broker delivers nothing ({last}):\n{tails}")
            time.sleep(0.2)


def _longest_wait(delivery: Mapping[str, Any] | None) -> float:
    """The longest a dispatcher waits between two attempts under ``delivery``, plus one
    attempt's timeout (Knative's retry rules, as pipeline.triggers.Delivery encodes them)."""
    spec = triggers.Delivery.from_spec(delivery, "delivery")
    if spec is None or spec.retry == 0:
        return 0.0
    return spec.backoff(spec.retry - 1) + (spec.timeout or 0.0)


def _resolved_delivery(delivery: Mapping[str, Any], services: Mapping[str, str]) -> dict[str, Any]:
    out = dict(delivery)
    dls = resolve(out.get("deadLetterSink"), services)
    if dls:
        out["deadLetterSink"] = {"uri": dls}
    else:
        out.pop("deadLetterSink", None)
    return out


def _namespace(name: str) -> k8s.V1Namespace:
    return k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name))


def _load(directory: Path) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict))
    return docs


def _crd_established(ext: k8s.ApiextensionsV1Api, name: str) -> bool:
    try:
        crd = ext.read_custom_resource_definition(name)
    except k8s.ApiException:
        return False
    conditions = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def _wait(check: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise BrokerError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _reserve_port() -> socket.socket:
    """A socket bound to a free loopback port, held so that nothing else takes the port."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s
