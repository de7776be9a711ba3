"""The local broker over real HTTP: retries, backoff, dead letters, replies, archive.

Subscribers are small werkzeug servers on 127.0.0.1 (random ports) scripted per test. Timing
assertions are loose (the machine may be busy) but tell the policies apart: exponential
backoff from 0.1 s waits 0.1 then 0.2 s; linear from 0.2 s retries at once, then after 0.2 s.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from pipeline.router import Router

ROOT = Path(__file__).resolve().parents[2]
FAST = {"retry": 2, "backoffPolicy": "exponential", "backoffDelay": "PT0.1S"}


@dataclass
class Call:
    at: float
    headers: dict[str, str]
    body: bytes


@dataclass
class Subscriber:
    """A loopback HTTP server answering with ``respond(request, call_number)``."""

    respond: Callable[[Request, int], Response]
    calls: list[Call] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = 0
        self._server = make_server("127.0.0.1", 0, self._app, threaded=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.port}/"

    @Request.application  # type: ignore[arg-type]
    def _app(self, request: Request) -> Response:
        with self._lock:
            self._busy += 1
            self.calls.append(
                Call(time.monotonic(), {k.lower(): v for k, v in request.headers}, request.data)
            )
            n = len(self.calls)
        try:
            return self.respond(request, n)
        finally:
            with self._lock:
                self._busy -= 1

    def close(self) -> None:
        self.release.set()  # let slow handlers finish
        deadline = time.monotonic() + 5
        while self._busy and time.monotonic() < deadline:
            time.sleep(0.01)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def gaps(self) -> list[float]:
        return [b.at - a.at for a, b in zip(self.calls, self.calls[1:], strict=False)]


def reply(event_type: str, data: Any, status: int = 200, **extra: str) -> Response:
    headers = {
        "ce-specversion": "1.0",
        "ce-id": f"reply-{time.monotonic_ns()}",
        "ce-source": "/kn-rescheduler/test",
        "ce-type": event_type,
        **{f"ce-{k}": v for k, v in extra.items()},
    }
    return Response(json.dumps(data), status=status, headers=headers, mimetype="application/json")


def always(status: int, body: str = "") -> Callable[[Request, int], Response]:
    return lambda _req, _n: Response(body, status=status)


def trigger(
    name: str, event_type: str, service: str, delivery: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Trigger",
        "metadata": {"name": name, "namespace": "kn-rescheduler"},
        "spec": {
            "broker": "default",
            "filter": {"attributes": {"type": event_type}},
            "subscriber": {
                "ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": service}
            },
            **spec,
        },
    }
    if delivery is not None:
        doc["spec"]["delivery"] = delivery
    return doc


def broker(delivery: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Broker",
        "metadata": {"name": "default", "namespace": "kn-rescheduler"},
        "spec": {"delivery": delivery},
    }


def event_headers(event_type: str, **extra: str) -> dict[str, str]:
    return {
        "ce-specversion": "1.0",
        "ce-id": f"e-{time.monotonic_ns()}",
        "ce-source": "https://127.0.0.1:6443",
        "ce-type": event_type,
        "content-type": "application/json",
        **{f"ce-{k}": v for k, v in extra.items()},
    }


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(autouse=True)
def no_threads_left() -> Iterator[None]:
    before = {t.ident for t in threading.enumerate()}
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        extra = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
        if not extra:
            return
        time.sleep(0.05)
    pytest.fail(f"threads left behind: {[t.name for t in extra]}")


@dataclass
class Harness:
    tmp: Path
    subscribers: list[Subscriber] = field(default_factory=list)
    routers: list[Router] = field(default_factory=list)

    def subscriber(self, respond: Callable[[Request, int], Response]) -> Subscriber:
        s = Subscriber(respond)
        self.subscribers.append(s)
        return s

    def router(self, docs: list[dict[str, Any]], subs: dict[str, Subscriber], **kw: Any) -> Router:
        tdir = self.tmp / f"knative-{len(self.routers)}"
        tdir.mkdir()
        (tdir / "triggers.yaml").write_text(yaml.safe_dump_all(docs))
        r = Router(
            tdir,
            {name: s.url for name, s in subs.items()},
            self.tmp / "archive.jsonl",
            self.tmp / "dead-letters.jsonl",
            **kw,
        )
        r.start()
        self.routers.append(r)
        return r

    @property
    def archive(self) -> list[dict[str, Any]]:
        return lines(self.tmp / "archive.jsonl")

    @property
    def dead(self) -> list[dict[str, Any]]:
        return lines(self.tmp / "dead-letters.jsonl")


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    for r in harness.routers:
        r.stop()
    for s in harness.subscribers:
        s.close()


def send(router: Router, headers: dict[str, str], body: bytes = b'{"x":1}') -> requests.Response:
    return requests.post(router.url, headers=headers, data=body, timeout=5)


# --- retries, backoff, replies ------------------------------------------------------------------


def test_retries_then_reply_goes_back_through_the_broker(h: Harness) -> None:
    def flaky(_req: Request, n: int) -> Response:
        if n <= 2:
            return Response("busy", status=503)
        return reply("test.reply", {"answer": 42})

    first = h.subscriber(flaky)
    sink = h.subscriber(always(202))
    r = h.router(
        [trigger("first", "test.start", "first", FAST), trigger("sink", "test.reply", "sink")],
        {"first": first, "sink": sink},
    )
    answer = send(r, event_headers("test.start", kind="Pod"), b'{"pod": "web-0"}')
    assert answer.status_code == 202
    assert r.wait_idle(10)

    assert len(first.calls) == 3
    g = first.gaps()
    assert 0.08 <= g[0] < 0.6 and 0.18 <= g[1] < 0.8, g  # 0.1 s, then 0.2 s
    # What the subscriber sees: binary mode, the body untouched, no TTL, arrival time added.
    seen = first.calls[0]
    assert seen.body == b'{"pod": "web-0"}'
    assert seen.headers["ce-type"] == "test.start" and seen.headers["ce-kind"] == "Pod"
    assert seen.headers["content-type"] == "application/json"
    assert "ce-knativebrokerttl" not in seen.headers
    assert "ce-knativearrivaltime" in seen.headers
    assert seen.headers["prefer"] == "reply" and seen.headers["kn-namespace"] == "kn-rescheduler"

    assert len(sink.calls) == 1 and json.loads(sink.calls[0].body) == {"answer": 42}
    archived = h.archive
    assert [e["type"] for e in archived] == ["test.start", "test.reply"]
    assert archived[0]["data"] == {"pod": "web-0"} and archived[0]["knativebrokerttl"] == "255"
    assert archived[1]["knativebrokerttl"] == "254"
    assert "knativearrivaltime" in archived[1]
    assert h.dead == []
    stats = r.stats()
    assert (stats["retries"], stats["replies"], stats["delivered"]) == (2, 1, 2)


def test_exhausted_retries_are_dead_lettered_with_knative_error_extensions(h: Harness) -> None:
    broken = h.subscriber(always(500, "boom"))
    delivery = {**FAST, "deadLetterSink": {"uri": "http://dead-letters.example/"}}
    r = h.router([trigger("t", "test.start", "svc", delivery)], {"svc": broken})
    headers = event_headers("test.start")
    send(r, headers)
    assert r.wait_idle(10)
    assert len(broken.calls) == 3  # first attempt + retry: 2
    [dead] = h.dead
    assert dead["trigger"] == "t" and dead["status"] == 500 and dead["attempts"] == 3
    assert dead["subscriber"] == broken.url
    assert dead["deadLetterSink"] == "http://dead-letters.example/"
    assert dead["event"]["id"] == headers["ce-id"] and dead["event"]["data"] == {"x": 1}
    assert dead["event"]["knativeerrorcode"] == "500"
    assert dead["event"]["knativeerrordest"] == broken.url
    assert base64.b64decode(dead["event"]["knativeerrordata"]) == b"boom"


def test_linear_backoff_retries_at_once_then_after_one_delay(h: Harness) -> None:
    broken = h.subscriber(always(503))
    delivery = {"retry": 2, "backoffPolicy": "linear", "backoffDelay": "PT0.5S"}
    r = h.router([trigger("t", "test.start", "svc", delivery)], {"svc": broken})
    send(r, event_headers("test.start"))
    assert r.wait_idle(10)
    g = broken.gaps()
    assert len(g) == 2 and g[0] < 0.35 and 0.48 <= g[1] < 1.5, g
    assert h.dead[0]["deadLetterSink"] is None  # no sink named: Knative would drop it


@pytest.mark.parametrize("status", [404, 408, 409, 429, 500, 502, 503, 504])
def test_retriable_statuses(h: Harness, status: int) -> None:
    sub = h.subscriber(always(status))
    delivery = {"retry": 1, "backoffPolicy": "linear", "backoffDelay": "PT0S"}
    r = h.router([trigger("t", "test.start", "svc", delivery)], {"svc": sub})
    send(r, event_headers("test.start"))
    assert r.wait_idle(10)
    assert len(sub.calls) == 2
    assert h.dead[0]["status"] == status


@pytest.mark.parametrize("status", [400, 401, 403, 410, 413, 422, 301])
def test_final_statuses_are_not_retried(h: Harness, status: int) -> None:
    sub = h.subscriber(always(status))
    r = h.router([trigger("t", "test.start", "svc", FAST)], {"svc": sub})
    send(r, event_headers("test.start"))
    assert r.wait_idle(10)
    assert len(sub.calls) == 1
    [dead] = h.dead
    assert dead["status"] == status and dead["attempts"] == 1


def test_a_body_that_is_not_a_cloudevent_is_a_failed_delivery(h: Harness) -> None:
    chatty = h.subscriber(always(200, "OK"))
    r = h.router([trigger("t", "test.start", "svc", FAST)], {"svc": chatty})
    send(r, event_headers("test.start"))
    assert r.wait_idle(10)
    assert len(chatty.calls) == 3  # Knative's filter answers 502 for it, which is retried
    [dead] = h.dead
    assert dead["status"] == 502 and "not a CloudEvent" in dead["reason"]
    assert len(h.archive) == 1


@pytest.mark.parametrize("status", [200, 202, 204])
def test_empty_2xx_is_success(h: Harness, status: int) -> None:
    ok = h.subscriber(always(status))
    r = h.router([trigger("t", "test.start", "svc", FAST)], {"svc": ok})
    send(r, event_headers("test.start"))
    assert r.wait_idle(10)
    assert len(ok.calls) == 1 and h.dead == [] and len(h.archive) == 1


def test_timeout_bounds_each_attempt(h: Harness) -> None:
    def slow(req: Request, n: int) -> Response:
        sub.release.wait(2.0)
        return Response("", status=202)

    sub = h.subscriber(slow)
    delivery = {"retry": 1, "backoffPolicy": "linear", "backoffDelay": "PT0S", "timeout": "PT0.3S"}
    r = h.router([trigger("t", "test.start", "svc", delivery)], {"svc": sub})
    started = time.monotonic()
    send(r, event_headers("test.start"))
    assert r.wait_idle(10)
    assert time.monotonic() - started < 3.0  # two 0.3 s timeouts, not two 2 s answers
    assert len(sub.calls) == 2
    [dead] = h.dead
    assert dead["status"] is None and dead["event"]["knativeerrorcode"] == "-1"
    assert "timed out" in dead["reason"]


def test_connection_refused_is_retried(h: Harness) -> None:
    gone = h.subscriber(always(202))
    gone.close()  # nothing listens on that port any more
    r = h.router([trigger("t", "test.start", "svc", FAST)], {"svc": gone})
    send(r, event_headers("test.start"))
    assert r.wait_idle(10)
    [dead] = h.dead
    assert dead["status"] is None and dead["attempts"] == 3


# --- concurrency ---------------------------------------------------------------------------------


def test_a_slow_subscriber_does_not_hold_up_another_trigger(h: Harness) -> None:
    def slow(_req: Request, _n: int) -> Response:
        slow_sub.release.wait(2.0)
        return Response("", status=202)

    slow_sub = h.subscriber(slow)
    fast_sub = h.subscriber(always(202))
    r = h.router(
        [trigger("slow", "test.start", "slow"), trigger("fast", "test.start", "fast")],
        {"slow": slow_sub, "fast": fast_sub},
    )
    sent = time.monotonic()
    send(r, event_headers("test.start"))
    deadline = sent + 1.5
    while not fast_sub.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fast_sub.calls and fast_sub.calls[0].at - sent < 1.5
    assert not r.wait_idle(0.05)  # the slow one is still running
    assert r.wait_idle(5)


def test_backoff_of_one_event_does_not_delay_another(h: Harness) -> None:
    failing = h.subscriber(always(503))
    ok = h.subscriber(always(202))
    r = h.router(
        [
            trigger(
                "a",
                "test.a",
                "failing",
                {"retry": 1, "backoffPolicy": "exponential", "backoffDelay": "PT2S"},
            ),
            trigger("b", "test.b", "ok"),
        ],
        {"failing": failing, "ok": ok},
        workers=1,  # one delivery thread: the 2 s wait must not occupy it
    )
    send(r, event_headers("test.a"))
    deadline = time.monotonic() + 2
    while not failing.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    sent = time.monotonic()
    send(r, event_headers("test.b"))
    deadline = sent + 1.5
    while not ok.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ok.calls, "event b waited behind event a's backoff"
    assert len(failing.calls) == 1  # a's retry is still waiting
    assert r.wait_idle(6)
    assert len(failing.calls) == 2


def test_stop_abandons_scheduled_retries(h: Harness) -> None:
    failing = h.subscriber(always(503))
    delivery = {"retry": 3, "backoffPolicy": "exponential", "backoffDelay": "PT30S"}
    r = h.router([trigger("t", "test.start", "svc", delivery)], {"svc": failing})
    send(r, event_headers("test.start"))
    deadline = time.monotonic() + 2
    while not failing.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    started = time.monotonic()
    r.stop()
    assert time.monotonic() - started < 2
    assert len(failing.calls) == 1 and h.dead == []


# --- ingress ---------------------------------------------------------------------------------


def test_structured_events_are_accepted_and_delivered_in_binary_mode(h: Harness) -> None:
    sub = h.subscriber(always(202))
    r = h.router([trigger("t", "test.start", "svc")], {"svc": sub})
    doc = {
        "specversion": "1.0",
        "id": "s-1",
        "source": "/x",
        "type": "test.start",
        "subject": "thing",
        "datacontenttype": "application/json",
        "data": {"a": [1, 2]},
    }
    answer = requests.post(
        r.url,
        data=json.dumps(doc),
        headers={"content-type": "application/cloudevents+json; charset=utf-8"},
        timeout=5,
    )
    assert answer.status_code == 202
    assert r.wait_idle(5)
    call = sub.calls[0]
    assert call.headers["ce-id"] == "s-1" and call.headers["ce-subject"] == "thing"
    assert json.loads(call.body) == {"a": [1, 2]}
    assert h.archive[0]["data"] == {"a": [1, 2]}


def test_json_delivery_format_sends_structured_mode(h: Harness) -> None:
    sub = h.subscriber(always(202))
    r = h.router([trigger("t", "test.start", "svc", {"format": "json"})], {"svc": sub})
    send(r, event_headers("test.start"))
    assert r.wait_idle(5)
    call = sub.calls[0]
    assert call.headers["content-type"].startswith("application/cloudevents+json")
    assert json.loads(call.body)["data"] == {"x": 1}


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("POST", "", {"content-type": "application/json"}, 400),  # no CloudEvent at all
        ("POST", "", {k: v for k, v in event_headers("t").items() if k != "ce-id"}, 400),
        ("POST", "", {**event_headers("t"), "ce-specversion": "2.0"}, 400),
        ("POST", "", {**event_headers("t"), "ce-time": "yesterday"}, 400),
        ("POST", "", {"content-type": "application/cloudevents-batch+json"}, 400),
        ("POST", "", {**event_headers("t"), "ce-knativebrokerttl": "1"}, 400),  # TTL used up
        ("POST", "/", event_headers("t"), 202),
        ("POST", "/other-ns/default", event_headers("t"), 404),
        ("GET", "", {}, 405),
        ("GET", "/healthz", {}, 200),
    ],
    ids=[
        "not-ce",
        "no-id",
        "specversion",
        "bad-time",
        "batch",
        "ttl",
        "root",
        "other",
        "get",
        "health",
    ],
)
def test_ingress_answers(
    h: Harness, method: str, path: str, headers: dict[str, str], status: int
) -> None:
    r = h.router([], {})
    base = r.url.rsplit("/", 2)[0] if path else r.url
    answer = requests.request(method, base + path, headers=headers, data=b"[]", timeout=5)
    assert answer.status_code == status
    assert len(h.archive) == (1 if status == 202 else 0)


def test_reply_loops_end_when_the_ttl_runs_out(h: Harness) -> None:
    echo = h.subscriber(lambda _req, _n: reply("test.loop", {"again": True}))
    r = h.router([trigger("loop", "test.loop", "echo")], {"echo": echo})
    send(r, event_headers("test.loop", knativebrokerttl="3"))
    assert r.wait_idle(5)
    assert [e["knativebrokerttl"] for e in h.archive] == ["2", "1"]
    assert len(echo.calls) == 2
    [dead] = h.dead
    assert dead["status"] == 400 and "reply refused" in dead["reason"]
    assert dead["event"]["knativeerrordest"] == r.url


def test_broker_delivery_applies_to_triggers_without_their_own(h: Harness) -> None:
    sub = h.subscriber(always(503))
    r = h.router(
        [
            broker({"retry": 1, "backoffPolicy": "linear", "backoffDelay": "PT0S"}),
            trigger("t", "test.start", "svc"),
        ],
        {"svc": sub},
    )
    send(r, event_headers("test.start"))
    assert r.wait_idle(5)
    assert len(sub.calls) == 2


def test_unresolved_subscribers_are_skipped_and_counted(h: Harness) -> None:
    r = h.router([trigger("t", "test.start", "missing")], {})
    send(r, event_headers("test.start"))
    assert r.wait_idle(5)
    assert r.stats()["unresolved"] == 1 and len(h.archive) == 1 and h.dead == []


# --- the project's own manifests --------------------------------------------------------------


def test_project_triggers_chain_detect_then_update(tmp_path: Path) -> None:
    def detect(req: Request, _n: int) -> Response:
        pod = json.loads(req.data)
        return reply(
            "io.kn-rescheduler.pod.failing",
            {"pod": pod["metadata"]["name"]},
            subject=req.headers["ce-subject"],
        )

    detect_sub = Subscriber(detect)
    update_sub = Subscriber(always(202))
    try:
        with Router(
            ROOT / "knative",
            {"detect-failures": detect_sub.url, "update-annotations": update_sub.url},
            tmp_path / "archive.jsonl",
            tmp_path / "dead.jsonl",
        ) as r:
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0"}}
            for event_type in ("add", "update", "delete"):
                headers = event_headers(
                    f"dev.knative.apiserver.resource.{event_type}",
                    kind="Pod",
                    subject="/apis/v1/namespaces/demo/pods/web-0",
                )
                assert send(r, headers, json.dumps(pod).encode()).status_code == 202
            assert r.wait_idle(10)
    finally:
        detect_sub.close()
        update_sub.close()
    assert len(detect_sub.calls) == 2  # add and update, not delete
    assert len(update_sub.calls) == 2
    assert {c.headers["ce-type"] for c in update_sub.calls} == {"io.kn-rescheduler.pod.failing"}
    archived = lines(tmp_path / "archive.jsonl")
    assert len(archived) == 5 and lines(tmp_path / "dead.jsonl") == []


# --- as a process ----------------------------------------------------------------------------


def test_router_runs_as_a_process(tmp_path: Path) -> None:
    sub = Subscriber(always(202))
    tdir = tmp_path / "knative"
    tdir.mkdir()
    (tdir / "t.yaml").write_text(yaml.safe_dump(trigger("t", "test.start", "svc")))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.router",
            "--triggers",
            str(tdir),
            "--subscriber",
            f"svc={sub.url}",
            "--archive",
            str(tmp_path / "a.jsonl"),
            "--dead-letter",
            str(tmp_path / "d.jsonl"),
            "--port",
            "0",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        url = ""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not url:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("READY "):
                url = line.split()[1]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/kn-rescheduler/default")
        answer = requests.post(url, headers=event_headers("test.start"), data=b"{}", timeout=5)
        assert answer.status_code == 202
        deadline = time.monotonic() + 5
        while not sub.calls and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(sub.calls) == 1
    finally:
        proc.terminate()
        try:
            assert proc.wait(10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            sub.close()
    assert len(lines(tmp_path / "a.jsonl")) == 1
