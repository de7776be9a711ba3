"""A local Broker: Knative's ingress, trigger filters and delivery rules, on one loopback port.

Knative's data plane does not run here, so this stands in for the ``default`` Broker of the
project's namespace. It reads the Trigger (and Broker) manifests from ``knative/``, the very
files that get deployed, and behaves like Knative's MT channel-based broker as far as a
subscriber can tell (knative.dev/eventing v0.50, ``pkg/broker/ingress``, ``pkg/broker/filter``,
``pkg/kncloudevents``):

Ingress (POST ``/NAMESPACE/BROKER``, or ``/``)
    Binary or structured CloudEvents; batches and invalid events are answered 400. Accepted
    events get the ``knativearrivaltime`` extension and the hop counter ``knativebrokerttl``
    (255 when absent, else decremented; an event reaching 0 is refused with 400, which stops
    reply loops), are appended to the archive (one structured-mode JSON line each) and are
    answered 202.

Matching
    Every Trigger of this broker sees every accepted event; :mod:`pipeline.filters` decides.

Delivery
    POST in binary mode (structured with ``delivery.format: json``) to the subscriber, without
    ``knativebrokerttl``, with ``Prefer: reply`` and ``Kn-Namespace``. Connection errors,
    timeouts, 404, 408, 409, 429 and 5xx are retried per the delivery spec; other 4xx and 3xx
    are final. A 2xx answer carrying a CloudEvent is a reply: it re-enters the ingress with the
    original event's TTL (archived, matched against all Triggers). A 2xx with an empty body is
    plain success. A non-empty body that is not a valid CloudEvent is what Knative's broker
    filter turns into a 502 for the dispatcher, so it is retried and finally dead-lettered.
    Deliveries run on a thread pool; waits between retries sit in a timer queue, not in a
    worker, so one event's backoff never delays another event.

Dead letters
    What still fails is appended to the dead-letter file: the trigger, the subscriber, the last
    status (None for no answer), the attempts made, the dead-letter sink the manifest names
    (None when it names none: Knative would then drop the event) and the event with the
    ``knativeerrordest``, ``knativeerrorcode`` and ``knativeerrordata`` extensions Knative adds.

Chaos (off unless switched on: ``Router(..., chaos=Chaos(seed=...))``, ``set_chaos`` at run
time, or ``--chaos-seed`` for the process)
    Seeded faults for the chaos suite (``bench/chaos``), each where Knative really has it and
    with the consequence Knative gives it:

    - *ingress drop* (``ingress_drop``): an event of the ApiServerSource (types
      ``dev.knative.apiserver.resource.*``, arriving at the ingress from outside) is answered
      202 and then lost: neither archived nor delivered. This is the one loss nothing retries:
      the adapter gives up a send after its own retries and only logs it, and an in-memory
      channel loses what it held when it restarts. Only the periodic sweep finds the pod again.
      Replies are never dropped at the ingress (the dispatcher treats a refused reply as a
      failed delivery, see above), nor are the sweep's events.
    - *attempt drop* (``attempt_drop``): a Trigger delivery attempt fails before it reaches the
      subscriber, as a refused connection or a timeout does (status None). It is a failed
      attempt like any other: retried with the Trigger's backoff.
    - *answer loss* (``answer_loss``): the subscriber got the event and acted on it, but its
      answer never reaches the dispatcher (a reset connection, the attempt's timeout). Also a
      failed attempt, retried: the subscriber sees the same event again, having already acted.
      A reply in the lost answer is lost with it, as in Knative.
    - *duplicate* (``duplicate``): an event delivered successfully is delivered once more to
      the same subscriber, up to ``max_delay`` seconds later, with the same id (at-least-once
      delivery: a dispatcher that redelivers after losing its acknowledgement).
    - *reorder* (``reorder``): a delivery's first attempt is held back between half of and all
      of ``max_delay`` seconds, so events accepted later overtake it (Knative delivers in no
      particular order).

    Attempt drops and answer losses never hit the last attempt the delivery spec allows: what is
    dead-lettered is always the subscriber's own last answer, which is what the chaos suite's
    dead-letter invariant judges. The dice are one seeded ``random.Random``: the same seed
    rolls the same sequence, though which delivery gets which roll depends on thread timing.
    ``chaos_stats()`` counts what was injected.

Run as a library (``Router(...).start()``) or a process (``python -m pipeline.router``).
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import dataclasses
import email.utils
import functools
import heapq
import http.client
import http.server
import itertools
import json
import logging
import random
import signal
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline import cloudevent, filters, triggers
from pipeline.cloudevent import Event
from shared.constants import DEFAULT_NAMESPACE
from shared.platform import logs

log = logging.getLogger("pipeline.router")

TTL_ATTRIBUTE = "knativebrokerttl"
ARRIVAL_ATTRIBUTE = "knativearrivaltime"
DEFAULT_TTL = 255
ERROR_DATA_MAX = 1024
RETRIABLE = frozenset({404, 408, 409, 429})
# Event types the ApiServerSource sends: the only ones an ingress drop (chaos) may lose.
SOURCE_TYPE_PREFIX = "dev.knative.apiserver.resource."
CHAOS_COUNTERS = ("ingress_dropped", "attempts_dropped", "answers_lost", "duplicated", "reordered")


def _now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def retriable(status: int | None) -> bool:
    """Knative's SelectiveRetry: no answer, 404, 408, 409, 429 and every 5xx."""
    return status is None or status >= 500 or status in RETRIABLE


def _retry_after(headers: Mapping[str, str]) -> float:
    value = headers.get("retry-after", "").strip()
    if not value:
        return 0.0
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True)
class Chaos:
    """Seeded faults in the data plane (see the module docstring); probabilities per event
    (ingress drop) or per delivery attempt (the rest). The defaults are a moderate storm."""

    seed: int
    ingress_drop: float = 0.05
    attempt_drop: float = 0.1
    answer_loss: float = 0.05
    duplicate: float = 0.1
    reorder: float = 0.1
    max_delay: float = 2.0

    def __post_init__(self) -> None:
        for name in ("ingress_drop", "attempt_drop", "answer_loss", "duplicate", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"chaos {name} must be a probability, got {value!r}")
        if self.max_delay < 0:
            raise ValueError(f"chaos max_delay must be >= 0, got {self.max_delay!r}")


class _Dice:
    """One seeded random sequence shared by every thread of the router."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def roll(self, probability: float) -> bool:
        if probability <= 0.0:
            return False
        with self._lock:
            return self._random.random() < probability

    def uniform(self, low: float, high: float) -> float:
        with self._lock:
            return self._random.uniform(low, high)


@dataclass
class _Outcome:
    status: int | None
    reason: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    reply: Event | None = None
    ok: bool = False


@dataclass
class _Delivery:
    trigger: triggers.Trigger
    url: str
    event: Event
    ttl: int
    spec: triggers.Delivery
    attempts: int = 0
    started: float = field(default_factory=time.monotonic)
    # A copy made by the chaos duplicate fault (never duplicated again).
    duplicate: bool = False


class Router:
    """The local Broker ingress and dispatcher.

    ``subscribers`` maps a Knative Service name (what a Trigger's ``subscriber.ref`` names) to
    the local URL serving it. Triggers whose Service is not in the map are reported at start
    and skipped, as Knative skips a Trigger whose subscriber does not resolve.
    """

    def __init__(
        self,
        triggers_dir: str | Path,
        subscribers: Mapping[str, str],
        archive_path: str | Path,
        dead_letter_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        namespace: str = DEFAULT_NAMESPACE,
        broker: str = "default",
        workers: int = 16,
        chaos: Chaos | None = None,
    ) -> None:
        self.namespace = namespace
        self.broker_name = broker
        loaded, broker_obj = triggers.load(Path(triggers_dir), namespace=namespace, broker=broker)
        self.triggers: list[triggers.Trigger] = loaded
        self.broker: triggers.Broker | None = broker_obj
        self._subscribers = dict(subscribers)
        self.archive_path = Path(archive_path)
        self.dead_letter_path = Path(dead_letter_path)
        self._host = host
        self._port = port
        self._workers = workers
        self._server: http.server.ThreadingHTTPServer | None = None
        self._server_thread: threading.Thread | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._timer_thread: threading.Thread | None = None
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = itertools.count()
        self._timer_cv = threading.Condition()
        self._idle_cv = threading.Condition()
        self._pending = 0
        self._stopping = False
        self._file_lock = threading.Lock()
        self._connections: set[http.client.HTTPConnection] = set()
        self._conn_lock = threading.Lock()
        self._stats: dict[str, int] = dict.fromkeys(
            (
                "accepted",
                "rejected",
                "matched",
                "attempts",
                "retries",
                "delivered",
                "replies",
                "dead_lettered",
                "unresolved",
            ),
            0,
        )
        self._chaos: Chaos | None = None
        self._dice: _Dice | None = None
        self._chaos_stats: dict[str, int] = dict.fromkeys(CHAOS_COUNTERS, 0)
        if chaos is not None:
            self.set_chaos(chaos)
        self.url = ""

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> str:
        """Bind, serve, and answer the Broker's URL (``http://HOST:PORT/NAMESPACE/BROKER``)."""
        if self._server is not None:
            return self.url
        for t in self.triggers:
            if t.subscriber.resolve(self._subscribers) is None:
                log.warning(
                    "trigger %s: subscriber Service %s has no local URL; its events are skipped",
                    t.name,
                    t.subscriber.service,
                )
        self.archive_path.parent.mkdir(parents=True, exist_ok=True)
        self.dead_letter_path.parent.mkdir(parents=True, exist_ok=True)
        self._stopping = False
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self._workers, thread_name_prefix="router-delivery"
        )
        self._timer_thread = threading.Thread(
            target=self._timer_loop, name="router-timers", daemon=True
        )
        self._timer_thread.start()
        server = http.server.ThreadingHTTPServer((self._host, self._port), _handler_for(self))
        server.daemon_threads = False
        self._server = server
        self._server_thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="router-http"
        )
        self._server_thread.start()
        host, port = str(server.server_address[0]), int(server.server_address[1])
        self.url = f"http://{host}:{port}/{self.namespace}/{self.broker_name}"
        log.info(
            "broker ingress listening",
            extra={"url": self.url, "triggers": [t.name for t in self.triggers]},
        )
        return self.url

    def stop(self) -> None:
        """Stop serving and delivering; waits for the threads, abandons scheduled retries."""
        if self._server is None:
            return
        self._stopping = True
        self._server.shutdown()
        self._server.server_close()
        if self._server_thread is not None:
            self._server_thread.join()
        with self._timer_cv:
            abandoned = len(self._timers)
            self._timers.clear()
            self._timer_cv.notify_all()
        if abandoned:
            log.warning("stopping with %d scheduled retries abandoned", abandoned)
        if self._timer_thread is not None:
            self._timer_thread.join()
        with self._conn_lock:
            for conn in list(self._connections):
                if conn.sock is not None:
                    with contextlib.suppress(OSError):
                        conn.sock.shutdown(socket.SHUT_RDWR)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        with self._idle_cv:
            self._pending = 0
            self._idle_cv.notify_all()
        self._server = None
        self._pool = None
        log.info("broker stopped", extra={"stats": self.stats()})

    def __enter__(self) -> Router:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- public helpers ----------------------------------------------------------------------

    def set_subscriber(self, service: str, url: str) -> None:
        """Point a Knative Service name at a (new) local URL."""
        self._subscribers[service] = url

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no delivery is running or scheduled; False if ``timeout`` ran out."""
        deadline = time.monotonic() + timeout
        with self._idle_cv:
            while self._pending > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle_cv.wait(left)
        return True

    def stats(self) -> dict[str, int]:
        with self._idle_cv:
            return dict(self._stats, pending=self._pending)

    def publish(self, event: Event) -> tuple[int, str]:
        """Hand an event to the ingress in-process, as if POSTed; answers (status, reason)."""
        return self._ingest(event.copy(), origin="in-process", from_outside=True)

    def set_chaos(self, chaos: Chaos | None) -> None:
        """Switch the chaos faults on (with a fresh sequence from ``chaos.seed``) or off."""
        was = self._chaos
        self._dice = _Dice(chaos.seed) if chaos is not None else None
        self._chaos = chaos
        if chaos is not None:
            log.warning(
                "chaos on: deliveries may be dropped, duplicated and reordered",
                extra={"chaos": dataclasses.asdict(chaos)},
            )
        elif was is not None:
            log.info("chaos off", extra={"chaos_stats": self.chaos_stats()})

    @property
    def chaos(self) -> Chaos | None:
        return self._chaos

    def chaos_stats(self) -> dict[str, int]:
        """How many faults of each kind chaos injected so far (all zero when it never ran)."""
        with self._idle_cv:
            return dict(self._chaos_stats)

    def _chaos_roll(self, what: str) -> bool:
        """Roll for one chaos fault (``what`` names the Chaos field); count it when it hits."""
        chaos, dice = self._chaos, self._dice
        if chaos is None or dice is None or not dice.roll(getattr(chaos, what)):
            return False
        counter = {
            "ingress_drop": "ingress_dropped",
            "attempt_drop": "attempts_dropped",
            "answer_loss": "answers_lost",
            "duplicate": "duplicated",
            "reorder": "reordered",
        }[what]
        with self._idle_cv:
            self._chaos_stats[counter] += 1
        return True

    def _chaos_delay(self, low_share: float = 0.0) -> float:
        """Seconds between ``low_share`` of ``max_delay`` and all of it."""
        chaos, dice = self._chaos, self._dice
        if chaos is None or dice is None:
            return 0.0
        return dice.uniform(chaos.max_delay * low_share, chaos.max_delay)

    # -- ingress -----------------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> None:
        with self._idle_cv:
            self._stats[key] += n

    def _ingest(
        self, event: Event, *, origin: str, ttl: int | None = None, from_outside: bool = False
    ) -> tuple[int, str]:
        try:
            cloudevent.validate(event)
        except cloudevent.InvalidEvent as exc:
            self._count("rejected")
            return 400, str(exc)
        if (
            from_outside
            and event.type.startswith(SOURCE_TYPE_PREFIX)
            and self._chaos_roll("ingress_drop")
        ):
            # Accepted and lost: what the source's sender sees when the broker loses an event.
            log.warning(
                "chaos: event lost at the ingress",
                extra={"ce_id": event.id, "ce_type": event.type, "origin": origin},
            )
            return 202, "accepted"
        attrs = event.attributes
        if ttl is not None:
            attrs[TTL_ATTRIBUTE] = str(ttl)
        attrs[ARRIVAL_ATTRIBUTE] = _now_text()
        # The ingress defaulter: a missing or unreadable TTL becomes 255, else it loses one.
        raw = attrs.get(TTL_ATTRIBUTE)
        try:
            hops = DEFAULT_TTL if raw is None else max(int(raw) - 1, 0)
        except ValueError:
            hops = DEFAULT_TTL
        attrs[TTL_ATTRIBUTE] = str(hops)
        if hops <= 0:
            self._count("rejected")
            log.warning(
                "dropping event: TTL exhausted (reply loop?)",
                extra={"ce_id": event.id, "ce_type": event.type, "origin": origin},
            )
            return 400, "knativebrokerttl exhausted"
        self._append(self.archive_path, cloudevent.to_structured_dict(event))
        self._count("accepted")
        log.info(
            "event accepted",
            extra={"ce_id": event.id, "ce_type": event.type, "origin": origin},
        )
        outgoing = event.copy()
        outgoing.attributes.pop(TTL_ATTRIBUTE, None)
        for trigger in self.triggers:
            if not trigger.filter(outgoing.attributes).delivers:
                continue
            url = trigger.subscriber.resolve(self._subscribers)
            if url is None:
                self._count("unresolved")
                log.warning(
                    "trigger %s matched but its subscriber has no local URL",
                    trigger.name,
                    extra={"ce_id": event.id, "ce_type": event.type},
                )
                continue
            spec = trigger.delivery or (self.broker.delivery if self.broker else None)
            delivery = _Delivery(
                trigger=trigger,
                url=url,
                event=outgoing,
                ttl=hops,
                spec=spec or triggers.Delivery(),
            )
            with self._idle_cv:
                self._pending += 1
                self._stats["matched"] += 1
            self._first_attempt(delivery)
        return 202, "accepted"

    def _first_attempt(self, d: _Delivery) -> None:
        if self._chaos_roll("reorder"):
            wait = self._chaos_delay(0.5)
            log.info(
                "chaos: delivery held back",
                extra={"trigger": d.trigger.name, "ce_id": d.event.id, "hold_s": round(wait, 3)},
            )
            self._later(wait, functools.partial(self._attempt, d))
            return
        self._submit(functools.partial(self._attempt, d))

    def _append(self, path: Path, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n"
        with self._file_lock, path.open("a", encoding="utf-8") as f:
            f.write(line)

    # -- delivery ----------------------------------------------------------------------------

    def _submit(self, task: Callable[[], None]) -> None:
        pool = self._pool
        if pool is None or self._stopping:
            self._done()
            return
        try:
            pool.submit(self._guard, task)
        except RuntimeError:  # the pool is shutting down
            self._done()

    def _guard(self, task: Callable[[], None]) -> None:
        if self._stopping:
            self._done()
            return
        try:
            task()
        except Exception:
            log.exception("delivery task failed")
            self._done()

    def _done(self) -> None:
        with self._idle_cv:
            self._pending = max(self._pending - 1, 0)
            if self._pending == 0:
                self._idle_cv.notify_all()

    def _later(self, delay: float, task: Callable[[], None]) -> None:
        with self._timer_cv:
            if self._stopping:
                self._done()
                return
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), task))
            self._timer_cv.notify()

    def _timer_loop(self) -> None:
        while True:
            with self._timer_cv:
                while not self._stopping and (
                    not self._timers or self._timers[0][0] > time.monotonic()
                ):
                    wait = self._timers[0][0] - time.monotonic() if self._timers else None
                    self._timer_cv.wait(wait)
                if self._stopping:
                    return
                _, _, task = heapq.heappop(self._timers)
            self._submit(task)

    def _attempt(self, d: _Delivery) -> None:
        d.attempts += 1
        self._count("attempts")
        # Chaos never fails the last attempt the delivery spec allows (module docstring).
        retries_left = d.attempts <= d.spec.retry
        if retries_left and self._chaos_roll("attempt_drop"):
            outcome = _Outcome(None, "chaos: attempt dropped before reaching the subscriber")
        else:
            outcome = self._post(d)
            if outcome.ok and retries_left and self._chaos_roll("answer_loss"):
                outcome = _Outcome(None, "chaos: the subscriber's answer was lost")
        if self._stopping:
            log.info("delivery abandoned: router stopping", extra={"trigger": d.trigger.name})
            self._done()
            return
        fields = {
            "trigger": d.trigger.name,
            "ce_id": d.event.id,
            "ce_type": d.event.type,
            "attempt": d.attempts,
            "status": outcome.status,
        }
        if outcome.ok:
            if outcome.reply is not None:
                status, reason = self._ingest(
                    outcome.reply, origin=f"reply via trigger {d.trigger.name}", ttl=d.ttl
                )
                if status >= 300:
                    # The dispatcher could not hand the reply to the broker: dead-letter the
                    # original event, naming the broker as the failing destination.
                    self._dead_letter(d, _Outcome(status, f"reply refused: {reason}"), self.url)
                    self._done()
                    return
                self._count("replies")
            self._count("delivered")
            log.info("delivered", extra=fields)
            if not d.duplicate and self._chaos_roll("duplicate"):
                self._duplicate(d)
            self._done()
            return
        retries_done = d.attempts - 1
        if retriable(outcome.status) and retries_done < d.spec.retry and not self._stopping:
            wait = d.spec.backoff(retries_done)
            if d.spec.retry_after_max is not None and outcome.status in (429, 503):
                wait = max(wait, min(_retry_after(outcome.headers), d.spec.retry_after_max))
            self._count("retries")
            log.info(
                "delivery failed, retrying",
                extra={**fields, "reason": outcome.reason, "retry_in_s": round(wait, 3)},
            )
            self._later(wait, functools.partial(self._attempt, d))
            return
        log.warning("delivery failed for good", extra={**fields, "reason": outcome.reason})
        self._dead_letter(d, outcome, d.url)
        self._done()

    def _duplicate(self, d: _Delivery) -> None:
        copy = _Delivery(
            trigger=d.trigger, url=d.url, event=d.event, ttl=d.ttl, spec=d.spec, duplicate=True
        )
        wait = self._chaos_delay()
        log.info(
            "chaos: delivering the event once more",
            extra={"trigger": d.trigger.name, "ce_id": d.event.id, "in_s": round(wait, 3)},
        )
        with self._idle_cv:
            self._pending += 1
        self._later(wait, functools.partial(self._attempt, copy))

    def _post(self, d: _Delivery) -> _Outcome:
        if d.spec.format == "json":
            headers, body = cloudevent.to_structured(d.event)
        else:
            headers, body = cloudevent.to_binary(d.event)
        headers = {
            **headers,
            "Prefer": "reply",
            "Kn-Namespace": d.trigger.namespace,
            "Content-Length": str(len(body)),
        }
        parts = urllib.parse.urlsplit(d.url)
        conn_cls = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        if parts.hostname is None:
            return _Outcome(None, f"bad subscriber URL {d.url!r}")
        conn = conn_cls(parts.hostname, parts.port, timeout=d.spec.timeout)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        with self._conn_lock:
            self._connections.add(conn)
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            answer = response.read()
            status = response.status
            answer_headers = {k.lower(): v for k, v in response.getheaders()}
        except (OSError, http.client.HTTPException) as exc:
            return _Outcome(None, f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()
            with self._conn_lock:
                self._connections.discard(conn)
        if not 200 <= status < 300:
            return _Outcome(status, f"HTTP {status}", answer, answer_headers)
        if cloudevent.encoding(answer_headers) is None:
            if answer:
                return _Outcome(
                    502,
                    f"HTTP {status} with a non-empty body that is not a CloudEvent",
                    answer,
                    answer_headers,
                )
            return _Outcome(status, f"HTTP {status}", answer, answer_headers, ok=True)
        try:
            reply = cloudevent.from_http(answer_headers, answer)
        except (cloudevent.InvalidEvent, cloudevent.NotAnEvent) as exc:
            return _Outcome(502, f"HTTP {status} with a malformed reply: {exc}", answer)
        return _Outcome(status, f"HTTP {status} with a reply", answer, answer_headers, reply, True)

    def _dead_letter(self, d: _Delivery, outcome: _Outcome, failed_url: str) -> None:
        event = d.event.copy()
        data = base64.b64encode(outcome.body).decode()[:ERROR_DATA_MAX]
        event.attributes["knativeerrordest"] = failed_url
        event.attributes["knativeerrorcode"] = str(
            outcome.status if outcome.status is not None else -1
        )
        event.attributes["knativeerrordata"] = data
        self._append(
            self.dead_letter_path,
            {
                "time": _now_text(),
                "trigger": d.trigger.name,
                "subscriber": d.url,
                "status": outcome.status,
                "reason": outcome.reason,
                "attempts": d.attempts,
                "deadLetterSink": d.spec.dead_letter_sink,
                "event": cloudevent.to_structured_dict(event),
            },
        )
        self._count("dead_lettered")


def _handler_for(router: Router) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "kn-rescheduler-router"
        timeout = 30

        def _answer(
            self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None
        ) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if body:
                self.wfile.write(body)
            self.close_connection = True

        def _ours(self) -> bool:
            path = urllib.parse.urlsplit(self.path).path.rstrip("/")
            return path in ("", f"/{router.namespace}/{router.broker_name}")

        def do_OPTIONS(self) -> None:
            self._answer(
                200,
                headers={
                    "Allow": "POST, OPTIONS",
                    "WebHook-Allowed-Origin": "*",
                    "WebHook-Allowed-Rate": "*",
                },
            )

        def do_GET(self) -> None:
            if self.path.rstrip("/") in ("/healthz", "/readyz"):
                self._answer(200, b"ok")
            else:
                self._answer(405, headers={"Allow": "POST, OPTIONS"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if not self._ours():
                self._answer(404)
                return
            headers = {k: v for k, v in self.headers.items()}
            try:
                event = cloudevent.from_http(headers, body)
            except (cloudevent.InvalidEvent, cloudevent.NotAnEvent) as exc:
                router._count("rejected")
                log.warning("refusing request: %s", exc)
                self._answer(400, json.dumps({"error": str(exc)}).encode())
                return
            status, reason = router._ingest(event, origin=self.client_address[0], from_outside=True)
            if status >= 300:
                self._answer(status, json.dumps({"error": reason}).encode())
            else:
                self._answer(status)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler


def _parse_subscriber(value: str) -> tuple[str, str]:
    name, sep, url = value.partition("=")
    if not sep or not name or not url:
        raise argparse.ArgumentTypeError(f"expected NAME=URL, got {value!r}")
    return name, url


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.router",
        description="Local Knative Broker: ingress, Trigger filters, retries, dead letters.",
    )
    parser.add_argument("--triggers", required=True, help="directory of Trigger/Broker YAML")
    parser.add_argument(
        "--subscriber",
        action="append",
        default=[],
        type=_parse_subscriber,
        metavar="SERVICE=URL",
        help="local URL of a Knative Service a Trigger refers to (repeatable)",
    )
    parser.add_argument("--archive", required=True, help="JSONL file of every accepted event")
    parser.add_argument("--dead-letter", required=True, help="JSONL file of failed deliveries")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    parser.add_argument("--broker", default="default")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument(
        "--chaos-seed",
        type=int,
        help="switch chaos on (drops, duplicates, reorders; see the module docstring)",
    )
    args = parser.parse_args(argv)
    logs.configure("router")
    try:
        router = Router(
            args.triggers,
            dict(args.subscriber),
            args.archive,
            args.dead_letter,
            host=args.host,
            port=args.port,
            namespace=args.namespace,
            broker=args.broker,
            workers=args.workers,
            chaos=Chaos(seed=args.chaos_seed) if args.chaos_seed is not None else None,
        )
    except (triggers.InvalidManifest, filters.InvalidFilter, OSError) as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    url = router.start()
    # The one line on stdout that is not JSON-logged: callers read the URL from it.
    print(f"READY {url}", flush=True)
    try:
        stop.wait()
    finally:
        router.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
