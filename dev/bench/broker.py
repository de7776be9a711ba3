"""``--only broker``: event latency through Knative's own Broker data plane, and what
``messaging.knative.dev/async-handler`` changes.

Events reach the functions through Knative's MTChannelBasedBroker (ingress, in-memory channel
dispatcher, filter: :class:`pipeline.broker.KnativeBroker`) on the local control plane, with the
project's Broker and Triggers as shipped (``knative/``, moved to a namespace of the bench's).
detect-failures' Trigger delivers to a *recording subscriber* of the bench instead of the
function (the data plane's latency, not the function's), and one more Trigger with the same
filter and the same delivery spec (5 retries, exponential from 0.5 s: about 15.5 s, then the
dead-letter sink) delivers to a *failing subscriber*, which answers 500 to the events it is
told to fail and 202 to every other. Both note the monotonic time each event arrives.

Per ``async_handler`` value (false, Knative's default: the dispatcher answers the ingress, and
so the sender, once every subscription's delivery and retries are done; true: at once, and
delivers in the background), one Broker is started and measures, in this order:

- ``hop``: ``hop_events`` pod-shaped CloudEvents POSTed one at a time to the Broker's ingress,
  each only after the previous one arrived: ingress -> recording subscriber p50/p99
  (``latency_ms``), and how long the sender waited for the ingress's answer (``answer_ms``);
- ``source``: ``source_events`` annotation patches of opted-in pods, one at a time, watched by
  Knative's ApiServerSource adapter configured from ``knative/sources.yaml`` (label selector
  included) and sent to the Broker: from just before the PATCH to the recording subscriber
  (``latency_ms``; the API server's write and watch are part of it, ``patch_ms`` is the PATCH
  alone);
- ``failing``, ``trials`` times each: one event the failing subscriber fails, then right after
  it, from the same sender, one it accepts. ``direct``: one thread POSTs both to the ingress,
  the second when the first POST returned (as any sender that sends one event at a time).
  ``source``: two pod patches, the first event failed; the adapter sends both (it sends from
  its watch handler, one event at a time: see below). Figures: how long the first POST was
  answered after (``first_answer_ms``, direct only), when the second event reached the
  recording subscriber counted from the first event's send (``next_delivered_ms``), and when
  the first event reached the dead-letter sink (``dead_letter_ms``).

Why the adapter stalls behind a slow delivery, in knative.dev/eventing v0.50.0: client-go's
reflector hands each watch event to the adapter's store (``pkg/adapter/apiserver``,
``resourceDelegate.Add``/``Update``/``Delete``) one after the other, and those call
``sendCloudEvent``, which returns only when ``ce.Send`` has the sink's answer; no
``K_SINK_TIMEOUT`` is set by the controller (no timeout). With a synchronous dispatcher the
ingress answers only when every Trigger's delivery ended, retries included.

The local data plane runs in a network namespace reached through the bench process's own TCP
forwards (:mod:`pipeline.netns`): the ingress hop crosses two forwards, each delivery one more.
A cluster has kube-proxy and pod networking there instead; the figures include the forwards.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import requests
import yaml

from dev.bench.common import (
    JSON,
    ROOT,
    broker_manifests,
    create_namespace,
    is_ready,
    list_all,
    summary,
)
from dev.localcluster.cluster import Cluster
from dev.localcluster.rest import Rest
from dev.pipeline import cloudevent
from dev.pipeline.broker import KnativeBroker
from dev.pipeline.source import ApiServerSource
from shared.api.keys import OPTED_IN_LABEL, OPTED_IN_VALUE

NAMESPACE: Final = "bench-broker"
PODS_NAMESPACE: Final = "bench-broker-pods"
SEQ_ANNOTATION: Final = "bench.kn-rescheduler.io/seq"
IMAGE: Final = "registry.example.com/shop/web:1.4.2"
UPDATE_TYPE: Final = "dev.knative.apiserver.resource.update"
# The Service names the two subscribers stand in for (detect-failures' Trigger is the shipped
# one; "failing" is the bench's copy of it).
RECORDER: Final = "detect-failures"
FAILING: Final = "failing"


@dataclass(frozen=True)
class Sizes:
    nodes: int = 4
    pods: int = 4
    hop_events: int = 300
    source_events: int = 200
    trials: int = 3


FULL_SIZES: Final = Sizes()
QUICK_SIZES: Final = Sizes(nodes=2, pods=2, hop_events=30, source_events=20, trials=1)


# -- the subscribers --------------------------------------------------------------------------


@dataclass
class Subscriber:
    """An HTTP sink that notes when each event (by its ``seq`` annotation) first arrives and
    how often; it answers 500 to the events whose seq is in ``fail``, 202 to the rest."""

    name: str
    fail: set[str] = field(default_factory=set)
    arrived: dict[str, float] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    port: int = 0
    _server: http.server.ThreadingHTTPServer | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _arrival: threading.Condition = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._arrival = threading.Condition(self._lock)

    def start(self) -> Subscriber:
        sub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                now = time.monotonic()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seq = _seq(dict(self.headers.items()), body)
                failed = sub.take(seq, now)
                self.send_response(500 if failed else 202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def take(self, seq: str | None, now: float) -> bool:
        """Note an arrival; True when the event is to be failed."""
        with self._arrival:
            if seq is None:
                return False
            self.arrived.setdefault(seq, now)
            self.attempts[seq] = self.attempts.get(seq, 0) + 1
            self._arrival.notify_all()
            return seq in self.fail

    def wait(self, seq: str, timeout: float) -> float | None:
        """When ``seq`` first arrived (monotonic), or None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._arrival:
            while seq not in self.arrived:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._arrival.wait(left)
            return self.arrived[seq]

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _seq(headers: Mapping[str, str], body: bytes) -> str | None:
    """The bench's sequence annotation of the pod an event carries."""
    try:
        event = cloudevent.from_http(headers, body)
        pod = json.loads(event.data or b"{}")
    except ValueError:
        return None
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(SEQ_ANNOTATION)
    return str(value) if value is not None else None


# -- the manifests ----------------------------------------------------------------------------


def manifests(directory: Path) -> Path:
    """The shipped Broker and Triggers in the bench's namespace, plus the failing subscriber's
    Trigger: detect-failures' filter and delivery spec, another subscriber."""
    broker_manifests(NAMESPACE, directory)
    docs = list(yaml.safe_load_all((directory / "broker.yaml").read_text()))
    shipped = next(d for d in docs if d["kind"] == "Trigger" and d["metadata"]["name"] == RECORDER)
    failing = json.loads(json.dumps(shipped))
    failing["metadata"]["name"] = FAILING
    failing["spec"]["subscriber"]["ref"]["name"] = FAILING
    docs.append(failing)
    (directory / "broker.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return directory


# -- the senders ------------------------------------------------------------------------------


def pod_event(seq: str) -> tuple[dict[str, str], bytes]:
    """A pod update as the ApiServerSource sends it (binary mode), carrying ``seq``."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"hop-{seq}",
            "namespace": PODS_NAMESPACE,
            "annotations": {SEQ_ANNOTATION: seq},
            "labels": {OPTED_IN_LABEL: OPTED_IN_VALUE},
        },
        "status": {"phase": "Running"},
    }
    headers = {
        "ce-specversion": "1.0",
        "ce-id": str(uuid.uuid4()),
        "ce-source": "https://127.0.0.1:6443",
        "ce-type": UPDATE_TYPE,
        "ce-subject": f"/apis/v1/namespaces/{PODS_NAMESPACE}/pods/hop-{seq}",
        "ce-kind": "Pod",
        "ce-apiversion": "v1",
        "ce-name": f"hop-{seq}",
        "ce-namespace": PODS_NAMESPACE,
        "content-type": "application/json",
    }
    return headers, json.dumps(pod).encode()


@dataclass
class Bed:
    """One Broker with its subscribers and adapter, on one control plane."""

    rest: Rest
    broker: KnativeBroker
    recorder: Subscriber
    failing: Subscriber
    pods: list[str]
    session: requests.Session = field(default_factory=requests.Session)
    _n: int = 0

    def seq(self) -> str:
        self._n += 1
        return f"{self.broker.async_handler}-{self._n}"

    def post(self, seq: str) -> tuple[float, float, int]:
        """POST one event to the ingress: (sent, answered) monotonic times and the status."""
        headers, body = pod_event(seq)
        t0 = time.monotonic()
        status = self.session.post(self.broker.url, data=body, headers=headers, timeout=120)
        return t0, time.monotonic(), status.status_code

    def patch(self, pod: str, seq: str) -> tuple[float, float]:
        t0 = time.monotonic()
        self.rest.patch(
            f"/api/v1/namespaces/{PODS_NAMESPACE}/pods/{pod}",
            {"metadata": {"annotations": {SEQ_ANNOTATION: seq}}},
        )
        return t0, time.monotonic()

    def dead_letters(self) -> int:
        return self.broker.stats()["dead_lettered"]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def hop(bed: Bed, n: int) -> JSON:
    latency: list[float] = []
    answer: list[float] = []
    statuses: dict[str, int] = {}
    lost = 0
    for _ in range(n):
        seq = bed.seq()
        t0, t1, status = bed.post(seq)
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        got = bed.recorder.wait(seq, 30)
        if got is None:
            lost += 1
            continue
        latency.append(got - t0)
        answer.append(t1 - t0)
    return {
        "events": n,
        "lost": lost,
        "statuses": statuses,
        "latency_ms": summary(latency, 1000),
        "answer_ms": summary(answer, 1000),
    }


def source(bed: Bed, n: int) -> JSON:
    latency, patch = [], []
    lost = 0
    for i in range(n):
        seq = bed.seq()
        t0, t1 = bed.patch(bed.pods[i % len(bed.pods)], seq)
        got = bed.recorder.wait(seq, 30)
        if got is None:
            lost += 1
            continue
        latency.append(got - t0)
        patch.append(t1 - t0)
    return {
        "events": n,
        "lost": lost,
        "latency_ms": summary(latency, 1000),
        "patch_ms": summary(patch, 1000),
    }


def failing(bed: Bed, trials: int, via: str) -> JSON:
    """One failed event, then right after it from the same sender one that is not."""
    runs: list[JSON] = []
    for _ in range(trials):
        bed.broker.wait_idle(60)
        dead0 = bed.dead_letters()
        first, second = bed.seq(), bed.seq()
        bed.failing.fail.add(first)
        run: JSON = {}
        if via == "direct":
            t0, t1, status = bed.post(first)
            run["first_answer_ms"] = ms(t1 - t0)
            run["first_status"] = status
            bed.post(second)
        else:
            t0, _ = bed.patch(bed.pods[0], first)
            bed.patch(bed.pods[1 % len(bed.pods)], second)
        got = bed.recorder.wait(second, 90)
        run["next_delivered_ms"] = None if got is None else ms(got - t0)
        first_got = bed.recorder.wait(first, 5)
        run["first_delivered_elsewhere_ms"] = None if first_got is None else ms(first_got - t0)
        deadline = time.monotonic() + 90
        while bed.dead_letters() == dead0 and time.monotonic() < deadline:
            time.sleep(0.02)
        run["dead_letter_ms"] = ms(time.monotonic() - t0) if bed.dead_letters() > dead0 else None
        run["failing_attempts"] = bed.failing.attempts.get(first, 0)
        runs.append(run)
    out: JSON = {"trials": runs}
    for key in ("next_delivered_ms", "first_answer_ms", "dead_letter_ms"):
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = summary(values)
    return out


# -- the run ----------------------------------------------------------------------------------


def _pod(name: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {OPTED_IN_LABEL: OPTED_IN_VALUE, "app": "bench"}},
        "spec": {
            "containers": [{"name": "app", "image": IMAGE}],
            "terminationGracePeriodSeconds": 0,
        },
    }


@contextlib.contextmanager
def bed(cluster: Cluster, workdir: Path, async_handler: bool, pods: list[str]) -> Iterator[Bed]:
    recorder = Subscriber(RECORDER).start()
    fails = Subscriber(FAILING).start()
    mode = "async" if async_handler else "sync"
    broker = KnativeBroker(
        cluster.kubeconfig,
        cluster.api_client(),
        manifests(workdir / "knative"),
        {RECORDER: recorder.url, FAILING: fails.url},
        workdir / mode,
        workdir / mode / "logs",
        async_handler=async_handler,
    )
    adapter: ApiServerSource | None = None
    try:
        broker.start()
        adapter = ApiServerSource.from_manifest(
            cluster.kubeconfig,
            broker.source_url,
            log_path=workdir / mode / "logs" / "adapter.log",
            wrap=broker.wrap,
        )
        adapter.start()
        yield Bed(cluster.rest, broker, recorder, fails, pods)
    finally:
        if adapter is not None:
            adapter.stop()
        broker.stop()
        recorder.stop()
        fails.stop()


def measure_mode(
    cluster: Cluster,
    workdir: Path,
    sizes: Sizes,
    async_handler: bool,
    pods: list[str],
    log: Callable[[str], None],
) -> JSON:
    with bed(cluster, workdir, async_handler, pods) as b:
        log(f"  async_handler={str(async_handler).lower()}: ingress hop")
        out: JSON = {"hop": hop(b, sizes.hop_events)}
        log(f"  async_handler={str(async_handler).lower()}: adapter -> subscriber")
        out["source"] = source(b, sizes.source_events)
        log(f"  async_handler={str(async_handler).lower()}: one failing subscriber")
        out["failing"] = {
            "direct": failing(b, sizes.trials, "direct"),
            "source": failing(b, sizes.trials, "source"),
        }
        out["broker_stats"] = b.broker.stats()
    return out


def measure(workdir: Path, *, quick: bool, log: Callable[[str], None]) -> JSON:
    sizes = QUICK_SIZES if quick else FULL_SIZES
    log(f"broker: starting a {sizes.nodes}-node cluster")
    with Cluster(
        workdir / "cluster", nodes=sizes.nodes, quiet=True, keep_workdir=True, prometheus=False
    ) as cluster:
        rest = cluster.rest
        create_namespace(rest, PODS_NAMESPACE)
        pods = [f"p{i}" for i in range(sizes.pods)]
        for name in pods:
            rest.post(f"/api/v1/namespaces/{PODS_NAMESPACE}/pods", _pod(name))
        path = f"/api/v1/namespaces/{PODS_NAMESPACE}/pods"
        deadline = time.monotonic() + 120
        while sum(is_ready(p) for p in list_all(rest, path)) < len(pods):
            if time.monotonic() > deadline:
                raise TimeoutError("the bench's pods did not become Ready")
            time.sleep(0.5)
        modes: JSON = {}
        for async_handler in (False, True):
            key = "async_handler_" + str(async_handler).lower()
            modes[key] = measure_mode(cluster, workdir, sizes, async_handler, pods, log)
    return {
        "sizes": sizes.__dict__,
        "delivery": _delivery(),
        "modes": modes,
    }


def _delivery() -> JSON:
    """The shipped detect-failures Trigger's delivery spec (what the failing one has too)."""
    for doc in yaml.safe_load_all((ROOT / "knative" / "triggers.yaml").read_text()):
        if doc and doc["metadata"]["name"] == RECORDER:
            delivery: JSON = doc["spec"]["delivery"]
            return {k: v for k, v in delivery.items() if k != "deadLetterSink"}
    return {}
