"""The chaos suite's faults over real TCP: a :class:`pipeline.netns.Forward` between an HTTP client
and a recording HTTP server (both on loopback, no network namespace), with a fault policy that
says exactly what to do. Each test fails if the fault did not happen where Knative meets it:
the server's record shows what reached the function, the client's what reached the sender.
"""

from __future__ import annotations

import http.client
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests

from dev.pipeline.faults import SOURCE, Faults, FaultSpec
from dev.pipeline.netns import PASS, Action, Decision, Forward, Message


@dataclass
class Recorder:
    """An HTTP/1.1 server (kept-alive connections, as gunicorn's) recording each request."""

    got: list[tuple[str, bytes]] = field(default_factory=list)
    server: http.server.ThreadingHTTPServer | None = None
    answer: bytes = b""
    status: int = 200

    def start(self) -> Recorder:
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                if "chunked" in (self.headers.get("Transfer-Encoding") or ""):
                    body = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        chunk = self.rfile.read(size + 2)
                        if size == 0:
                            break
                        body += chunk[:-2]
                else:
                    body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.got.append((self.headers.get("ce-id") or "", body))
                self.send_response(recorder.status)
                self.send_header("Content-Length", str(len(recorder.answer)))
                self.end_headers()
                self.wfile.write(recorder.answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.server_address[1])

    def ids(self) -> list[str]:
        return [ce for ce, _ in self.got]


class Scripted:
    """A fault policy that does what it is told, and remembers what it was asked."""

    def __init__(self, decision: Decision = PASS, again: float | None = None) -> None:
        self.decision = decision
        self.again = again
        self.asked: list[tuple[str, Message]] = []
        self.answers: list[int] = []

    def decide(self, forward: str, request: Message) -> Decision:
        self.asked.append((forward, request))
        return self.decision

    def answered(self, forward: str, request: Message, answer: Message) -> float | None:
        self.answers.append(answer.status)
        return self.again


@pytest.fixture
def server() -> Iterator[Recorder]:
    r = Recorder().start()
    yield r
    assert r.server is not None
    r.server.shutdown()
    r.server.server_close()


@pytest.fixture
def forward(server: Recorder) -> Iterator[Forward]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    f = Forward("out-test", listen_in=None, listen_port=port, connect_in=None, port=server.port)
    f.start()
    yield f
    f.stop()


def url(f: Forward) -> str:
    return f"http://127.0.0.1:{f.listen_port}/"


def post(f: Forward, ce_id: str, body: bytes = b"{}", timeout: float = 5.0) -> requests.Response:
    return requests.post(url(f), data=body, headers={"ce-id": ce_id}, timeout=timeout)


def eventually(check: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return bool(check())


def test_without_faults_a_request_and_its_answer_go_through_untouched(
    forward: Forward, server: Recorder
) -> None:
    server.answer = b'{"ok":true}'
    answer = post(forward, "e1", b"payload")
    assert (answer.status_code, answer.content) == (200, b'{"ok":true}')
    assert server.got == [("e1", b"payload")]


def test_an_ingress_drop_answers_202_and_nothing_reaches_the_server(
    forward: Forward, server: Recorder
) -> None:
    policy = Scripted(Decision(Action.ACCEPT_AND_DROP))
    forward.set_faults(policy)
    answer = post(forward, "lost")
    assert answer.status_code == 202
    time.sleep(0.2)
    assert server.got == []
    assert [m.headers["ce-id"] for _, m in policy.asked] == ["lost"]


def test_an_attempt_drop_resets_the_sender_before_the_server_sees_the_request(
    forward: Forward, server: Recorder
) -> None:
    forward.set_faults(Scripted(Decision(Action.RESET_BEFORE)))
    with pytest.raises(requests.ConnectionError):
        post(forward, "dropped")
    time.sleep(0.2)
    assert server.got == []


def test_an_answer_loss_lets_the_server_act_and_resets_the_sender(
    forward: Forward, server: Recorder
) -> None:
    server.answer = b'{"reply":"lost with the answer"}'
    forward.set_faults(Scripted(Decision(Action.RESET_AFTER)))
    with pytest.raises(requests.ConnectionError):
        post(forward, "acted")
    assert server.ids() == ["acted"]


def test_a_duplicate_sends_the_same_bytes_again_later_and_the_sender_sees_one_answer(
    forward: Forward, server: Recorder
) -> None:
    policy = Scripted(again=0.3)
    forward.set_faults(policy)
    answer = post(forward, "twice", b"same body")
    assert answer.status_code == 200
    assert server.got == [("twice", b"same body")]
    # The repeat is pending, so the forward is not idle (wait_idle waits for it).
    assert forward.busy() == 1
    assert eventually(lambda: len(server.got) == 2)
    assert server.got == [("twice", b"same body")] * 2
    assert eventually(lambda: forward.busy() == 0)
    assert policy.answers == [200]


def test_a_held_back_request_is_overtaken_by_a_later_one(
    forward: Forward, server: Recorder
) -> None:
    class HoldFirst(Scripted):
        def decide(self, forward: str, request: Message) -> Decision:
            super().decide(forward, request)
            return Decision(hold=0.6) if request.headers["ce-id"] == "early" else PASS

    forward.set_faults(HoldFirst())
    early = threading.Thread(target=post, args=(forward, "early"))
    early.start()
    assert eventually(lambda: forward.busy() == 1)
    post(forward, "late")
    early.join(5)
    assert server.ids() == ["late", "early"]


def test_a_chunked_request_is_framed_whole_and_repeated_whole(
    forward: Forward, server: Recorder
) -> None:
    forward.set_faults(Scripted(again=0.1))
    conn = http.client.HTTPConnection("127.0.0.1", forward.listen_port, timeout=5)
    conn.request(
        "POST",
        "/",
        body=iter([b"first ", b"second"]),
        headers={"ce-id": "chunks"},
        encode_chunked=True,
    )
    assert conn.getresponse().status == 200
    conn.close()
    assert eventually(lambda: len(server.got) == 2)
    assert server.got == [("chunks", b"first second")] * 2


def test_requests_on_one_kept_alive_connection_are_each_put_to_the_policy(
    forward: Forward, server: Recorder
) -> None:
    policy = Scripted()
    forward.set_faults(policy)
    with requests.Session() as session:
        for n in range(3):
            session.post(url(forward), data=b"{}", headers={"ce-id": f"k{n}"}, timeout=5)
    assert [m.headers["ce-id"] for _, m in policy.asked] == ["k0", "k1", "k2"]
    assert server.ids() == ["k0", "k1", "k2"]


def test_switching_faults_on_ends_kept_alive_raw_connections_so_the_next_request_is_faulted(
    forward: Forward, server: Recorder
) -> None:
    with requests.Session() as session:
        session.post(url(forward), data=b"{}", headers={"ce-id": "before"}, timeout=5)
        forward.set_faults(Scripted(Decision(Action.ACCEPT_AND_DROP)))
        time.sleep(1.0)  # the raw relay notices within its half-second poll
        answer = session.post(url(forward), data=b"{}", headers={"ce-id": "after"}, timeout=5)
    assert answer.status_code == 202
    assert server.ids() == ["before"]


def test_faults_off_again_lets_everything_through(forward: Forward, server: Recorder) -> None:
    forward.set_faults(Scripted(Decision(Action.RESET_BEFORE)))
    forward.set_faults(None)
    assert post(forward, "through").status_code == 200
    assert server.ids() == ["through"]


# -- the policy the chaos suite uses, on the same forward -------------------------------------


def test_the_chaos_policy_drops_at_most_its_budget_per_event_so_knatives_retry_gets_through(
    forward: Forward, server: Recorder
) -> None:
    faults = Faults(
        FaultSpec(
            seed=1,
            attempt_drop=1.0,
            answer_loss=0.0,
            duplicate=0.0,
            reorder=0.0,
            ingress_drop=0.0,
            max_failures=2,
        )
    )
    faults.watch(forward.name, "update-annotations")
    forward.set_faults(faults)
    outcomes = []
    for _ in range(3):  # the dispatcher's first attempt and two retries
        try:
            outcomes.append(post(forward, "budgeted").status_code)
        except requests.ConnectionError:
            outcomes.append(None)
    assert outcomes == [None, None, 200]
    assert server.ids() == ["budgeted"]
    assert faults.stats()["attempts_dropped"] == 2
    assert faults.stats()["retries"] == 2


def test_the_chaos_policy_drops_source_events_only_on_the_source_forward(
    forward: Forward, server: Recorder
) -> None:
    faults = Faults(
        FaultSpec(
            seed=1, ingress_drop=1.0, attempt_drop=0.0, answer_loss=0.0, duplicate=0.0, reorder=0.0
        )
    )
    faults.watch(forward.name, SOURCE)
    forward.set_faults(faults)
    assert post(forward, "from-the-adapter").status_code == 202
    time.sleep(0.2)
    assert server.got == []
    assert faults.stats()["ingress_dropped"] == 1


def test_an_answer_lost_leaves_nothing_outstanding(forward: Forward, server: Recorder) -> None:
    forward.set_faults(Scripted(Decision(Action.RESET_AFTER)))
    with pytest.raises(requests.ConnectionError):
        post(forward, "acted")
    assert eventually(lambda: forward.busy() == 0)


def test_an_answer_without_a_length_is_relayed_up_to_the_servers_close() -> None:
    """An HTTP/1.0-style answer (no Content-Length, not chunked) ends when the server closes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(4096)
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil ")
                time.sleep(0.2)
                conn.sendall(b"the close")

        threading.Thread(target=serve, daemon=True).start()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        f = Forward(
            "out-raw",
            listen_in=None,
            listen_port=port,
            connect_in=None,
            port=listener.getsockname()[1],
        ).start()
        try:
            f.set_faults(Scripted())
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/")
            assert conn.getresponse().read() == b"until the close"
            conn.close()
        finally:
            f.stop()
