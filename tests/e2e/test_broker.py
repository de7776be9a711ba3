"""Knative's own Broker data plane, wired by dev/pipeline/broker.py, on the real local API server.

What these tests pin down is our wiring, not Knative's code: that the statuses we write in place
of Knative's controllers make its ingress, channel dispatcher and filter route every event to
exactly the Triggers of the project's manifests (and that replay, which routes in-process with
pipeline.filters, agrees with Knative's filter on every one of them), that replies re-enter the
Broker, that a subscriber that keeps failing is retried per the Trigger's delivery spec and then
dead-lettered with Knative's error extensions, that a malformed event is refused by Knative's
ingress, and that two stacks run side by side with nothing listening beyond loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from dev.pipeline.broker import DISPATCHER_PORT, KnativeBroker
from kubectl_kn_rescheduler.routing import triggers as trigger_manifests
from shared.api.keys import (
    APISERVER_ADD,
    APISERVER_DELETE,
    APISERVER_UPDATE,
    EVENT_NODE_SUSPECTED,
    EVENT_POD_EXHAUSTED,
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ("detect-failures", "update-annotations", "assess-nodes", "rebalance-nodes")
PING = "dev.knative.sources.ping"


class Subscriber:
    """A function stand-in: records each delivery, answers what ``answer`` says (202)."""

    def __init__(self, answer: Callable[[dict[str, str]], Response] | None = None) -> None:
        self.calls: list[dict[str, str]] = []
        self.answer = answer
        self._lock = threading.Lock()
        self._server = make_server("127.0.0.1", 0, self._app, threaded=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.port}/"

    @Request.application  # type: ignore[arg-type]
    def _app(self, request: Request) -> Response:
        headers = {k.lower(): v for k, v in request.headers}
        with self._lock:
            self.calls.append(headers)
        return self.answer(headers) if self.answer else Response("", status=202)

    def ids(self) -> list[str]:
        with self._lock:
            return [c["ce-id"] for c in self.calls]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def binary_headers(event_type: str, **extensions: str) -> dict[str, str]:
    return {
        "ce-specversion": "1.0",
        "ce-id": str(uuid.uuid4()),
        "ce-source": extensions.pop("source", "/tests/broker"),
        "ce-type": event_type,
        "content-type": "application/json",
        **{f"ce-{k}": v for k, v in extensions.items()},
    }


@pytest.fixture
def subscribers() -> Iterator[dict[str, Subscriber]]:
    subs = {name: Subscriber() for name in FUNCTIONS}
    yield subs
    for sub in subs.values():
        sub.close()


def start_broker(
    cluster: Any, tmp_path: Path, subs: dict[str, Subscriber], manifests: Path = ROOT / "knative"
) -> KnativeBroker:
    return KnativeBroker(
        cluster.kubeconfig,
        cluster.api_client(),
        manifests,
        {name: sub.url for name, sub in subs.items()},
        tmp_path,
        tmp_path / "logs",
    ).start()


def manifests_copy(tmp_path: Path, namespace: str, delivery: dict[str, Any] | None) -> Path:
    """The project's Broker and Triggers, in ``namespace``, each with ``delivery`` if given."""
    out = tmp_path / f"manifests-{namespace}"
    out.mkdir()
    for name in ("broker.yaml", "triggers.yaml", "rebalance-nodes.yaml"):
        docs = []
        for doc in yaml.safe_load_all((ROOT / "knative" / name).read_text()):
            if not doc or doc.get("kind") not in ("Broker", "Trigger"):
                continue
            doc["metadata"]["namespace"] = namespace
            if delivery is not None:
                doc["spec"]["delivery"] = delivery
            docs.append(doc)
        (out / name).write_text(yaml.safe_dump_all(docs))
    return out


# Events of every kind the project's Triggers tell apart, and some none of them wants.
EVENTS: list[tuple[str, dict[str, str]]] = [
    (APISERVER_ADD, {"kind": "Pod"}),
    (APISERVER_UPDATE, {"kind": "Pod"}),
    (APISERVER_DELETE, {"kind": "Pod"}),
    (APISERVER_UPDATE, {"kind": "Deployment"}),
    (APISERVER_ADD, {}),
    (EVENT_POD_FAILING, {}),
    (EVENT_POD_RESCHEDULED, {}),
    (EVENT_POD_EXHAUSTED, {}),
    (EVENT_NODE_SUSPECTED, {}),
    (PING, {"source": "/apis/v1/namespaces/kn-rescheduler/pingsources/rebalance-nodes"}),
    (PING, {"source": "/apis/v1/namespaces/kn-rescheduler/pingsources/sweep-failures"}),
    ("io.example.unrelated", {"kind": "Pod"}),
]


def test_knatives_filter_and_replays_in_process_filter_route_every_event_alike(
    cluster: Any, tmp_path: Path, subscribers: dict[str, Subscriber]
) -> None:
    broker = start_broker(cluster, tmp_path, subscribers)
    try:
        sent = []
        for event_type, extensions in EVENTS:
            headers = binary_headers(event_type, **extensions)
            assert broker.send(headers, b"{}") == 202
            sent.append(headers)
        assert broker.wait_idle(20)
    finally:
        broker.stop()

    triggers, _ = trigger_manifests.load(
        ROOT / "knative", namespace="kn-rescheduler", broker="default"
    )
    for headers in sent:
        attributes = {k[3:]: v for k, v in headers.items() if k.startswith("ce-")}
        expected = sorted(
            t.subscriber.service or t.name for t in triggers if t.filter(attributes).delivers
        )
        got = sorted(n for n, sub in subscribers.items() if headers["ce-id"] in sub.ids())
        assert got == expected, f"{attributes['type']} {attributes}"
        # And each subscriber got it once: a delivery that succeeds is not repeated.
        for name in got:
            assert subscribers[name].ids().count(headers["ce-id"]) == 1
    # The table covers every Trigger and an event no Trigger wants.
    assert all(sub.calls for sub in subscribers.values())
    archived = [json.loads(line) for line in (tmp_path / "archive.jsonl").read_text().splitlines()]
    assert sorted(e["id"] for e in archived) == sorted(h["ce-id"] for h in sent)


def test_a_reply_re_enters_the_broker_and_reaches_the_triggers_that_want_it(
    cluster: Any, tmp_path: Path, subscribers: dict[str, Subscriber]
) -> None:
    reply_id = str(uuid.uuid4())

    def reply(headers: dict[str, str]) -> Response:
        return Response(
            "{}",
            status=200,
            headers={
                "ce-specversion": "1.0",
                "ce-id": reply_id,
                "ce-source": "/kn-rescheduler/detect-failures",
                "ce-type": EVENT_POD_FAILING,
                "content-type": "application/json",
            },
        )

    subscribers["detect-failures"].answer = reply
    broker = start_broker(cluster, tmp_path, subscribers)
    try:
        assert broker.send(binary_headers(APISERVER_UPDATE, kind="Pod"), b"{}") == 202
        assert broker.wait_idle(20)
    finally:
        broker.stop()
    assert subscribers["update-annotations"].ids() == [reply_id]
    assert subscribers["assess-nodes"].ids() == [reply_id]
    # The reply went through the ingress like any event: the archive Trigger has it too.
    archived = [
        json.loads(line)["id"] for line in (tmp_path / "archive.jsonl").read_text().splitlines()
    ]
    assert reply_id in archived


def test_a_subscriber_that_keeps_failing_is_retried_then_dead_lettered(
    cluster: Any, tmp_path: Path, subscribers: dict[str, Subscriber]
) -> None:
    subscribers["update-annotations"].answer = lambda _: Response("state corrupt", status=500)
    delivery = {
        "retry": 2,
        "backoffPolicy": "linear",
        "backoffDelay": "PT0.1S",
        "deadLetterSink": {
            "ref": {
                "apiVersion": "serving.knative.dev/v1",
                "kind": "Service",
                "name": "dead-letters",
            }
        },
    }
    manifests = manifests_copy(tmp_path, "kn-rescheduler", delivery)
    broker = start_broker(cluster, tmp_path, subscribers, manifests)
    headers = binary_headers(EVENT_POD_FAILING)
    try:
        assert broker.send(headers, b'{"pod": "x"}') == 202
        assert broker.wait_idle(20)
    finally:
        broker.stop()
    # The first attempt and two retries, then the dead-letter sink; assess-nodes, on the same
    # event, is not affected.
    assert subscribers["update-annotations"].ids() == [headers["ce-id"]] * 3
    assert subscribers["assess-nodes"].ids() == [headers["ce-id"]]
    [record] = [
        json.loads(line) for line in (tmp_path / "dead-letters.jsonl").read_text().splitlines()
    ]
    assert record["trigger"] == "update-annotations"
    assert record["status"] == 500
    assert record["reason"] == "state corrupt"
    assert record["event"]["id"] == headers["ce-id"]
    assert record["event"]["data"] == {"pod": "x"}


def test_knatives_ingress_refuses_what_is_not_a_cloudevent(
    cluster: Any, tmp_path: Path, subscribers: dict[str, Subscriber]
) -> None:
    broker = start_broker(cluster, tmp_path, subscribers)
    try:
        response = requests.post(broker.url, data=b"{}", timeout=10)
        assert response.status_code == 400
        missing_type = binary_headers("x")
        del missing_type["ce-type"]
        assert broker.send(missing_type, b"{}") == 400
        assert broker.wait_idle(5)
    finally:
        broker.stop()
    assert not any(sub.calls for sub in subscribers.values())


def _netns_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def test_two_stacks_run_side_by_side_and_nothing_listens_beyond_loopback(
    cluster: Any, tmp_path: Path, subscribers: dict[str, Subscriber]
) -> None:
    others = {name: Subscriber() for name in FUNCTIONS}
    first = start_broker(cluster, tmp_path / "a", subscribers)
    second = None
    try:
        second = start_broker(
            cluster, tmp_path / "b", others, manifests_copy(tmp_path, "kn-rescheduler-b", None)
        )
        # Each has Knative's dispatcher on 8080 of its own namespace.
        for broker in (first, second):
            assert f"*:{DISPATCHER_PORT}" in broker.netns.sockets()
        one, two = binary_headers(EVENT_POD_FAILING), binary_headers(EVENT_POD_FAILING)
        assert first.send(one, b"{}") == 202
        assert second.send(two, b"{}") == 202
        assert first.wait_idle(20) and second.wait_idle(20)
        assert subscribers["update-annotations"].ids() == [one["ce-id"]]
        assert others["update-annotations"].ids() == [two["ce-id"]]

        # No Knative process shares this machine's network namespace, and on it the stacks
        # listen on loopback only.
        host = _netns_of(os.getpid())
        pids = [p.proc.pid for b in (first, second) for p in b.procs]
        assert pids and all(_netns_of(pid) != host for pid in pids)
        mine = {
            str(f.listen_port) for b in (first, second) for f in b.forwards if f.listen_in is None
        }
        listening = subprocess.run(
            ["ss", "-Hltn"], capture_output=True, text=True, check=True
        ).stdout.split("\n")
        ours = [
            line.split()[3]
            for line in listening
            if line.strip() and line.split()[3].rsplit(":", 1)[1] in mine
        ]
        assert ours and all(addr.startswith("127.0.0.1:") for addr in ours)
    finally:
        if second is not None:
            second.stop()
        first.stop()
        for sub in others.values():
            sub.close()
    assert not first.netns.path.exists() and second is not None and not second.netns.path.exists()
