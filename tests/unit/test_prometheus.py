"""Prometheus's HTTP API as label-nodes reads it: series matched to Nodes, and every failure
mapped to unreachable, bad answer or a refused query.

The answers of a real Prometheus (success, a malformed expression) are tested against the real
server in tests/e2e/test_label_nodes.py. Here a tiny local HTTP server replays canned answers,
only for what a real Prometheus cannot be made to say on demand (a query timing out, a proxy's
HTML page, a 502); a refused connection is real (a loopback port nobody listens on).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import parse_qs

import pytest

from shared.platform.prometheus import (
    BadAnswer,
    Prometheus,
    QueryFailed,
    Sample,
    Unreachable,
    instance_host,
    node_values,
)


@pytest.mark.parametrize(
    ("instance", "host"),
    [
        ("10.0.0.7:9100", "10.0.0.7"),
        ("node-a", "node-a"),
        ("node-a:9100", "node-a"),
        ("[fd00::7]:9100", "fd00::7"),
        ("fd00::7", "fd00::7"),
        ("", ""),
    ],
)
def test_the_host_of_an_instance_label(instance: str, host: str) -> None:
    assert instance_host(instance) == host


NODES = {"node-a": ["10.0.0.1"], "node-b": ["10.0.0.2"], "node-c": []}


@pytest.mark.parametrize(
    ("labels", "node"),
    [
        # kube-prometheus and many scrape configs: a `node` label
        ({"node": "node-b", "instance": "10.0.0.1:9100"}, "node-b"),
        # kubernetes_sd role node: instance is the Node's name
        ({"instance": "node-c", "job": "kubernetes-nodes"}, "node-c"),
        # node-exporter scraped on the InternalIP
        ({"instance": "10.0.0.2:9100", "job": "node-exporter"}, "node-b"),
        # a `node` label naming no Node: the instance decides
        ({"node": "gone", "instance": "10.0.0.1:9100"}, "node-a"),
        # nothing to go by
        ({"instance": "10.9.9.9:9100"}, None),
        ({"job": "x"}, None),
    ],
)
def test_a_series_is_matched_to_a_node_by_node_label_then_instance_name_then_internal_ip(
    labels: dict[str, str], node: str | None
) -> None:
    values = node_values([Sample(labels, 42.0)], NODES)
    assert values == ({node: [42.0]} if node else {})


def test_several_series_of_one_node_are_all_kept_and_nan_is_no_value() -> None:
    samples = [
        Sample({"instance": "10.0.0.1:9100", "job": "a"}, 80.0),
        Sample({"instance": "node-a", "job": "b"}, 90.0),
        Sample({"instance": "node-b"}, float("nan")),
    ]
    assert node_values(samples, NODES) == {"node-a": [80.0, 90.0]}


class Canned(BaseHTTPRequestHandler):
    """Answers every POST with the (status, content type, body) the test set."""

    answer: ClassVar[tuple[int, str, bytes]] = (200, "application/json", b"{}")
    queries: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        form = parse_qs(self.rfile.read(length).decode())
        type(self).queries.append(form["query"][0])
        status, content_type, body = type(self).answer
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def canned() -> Iterator[tuple[str, type[Canned]]]:
    handler = type("Answers", (Canned,), {"queries": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", handler
    finally:
        server.shutdown()
        server.server_close()


def api(status: str, **fields: object) -> bytes:
    return json.dumps({"status": status, **fields}).encode()


def test_a_vector_answer_gives_its_samples(canned: tuple[str, type[Canned]]) -> None:
    url, handler = canned
    handler.answer = (
        200,
        "application/json",
        api(
            "success",
            data={
                "resultType": "vector",
                "result": [
                    {"metric": {"instance": "node-a"}, "value": [1700000000.1, "93.5"]},
                    {"metric": {"instance": "node-b"}, "value": [1700000000.1, "+Inf"]},
                ],
            },
        ),
    )
    samples = Prometheus(url).query("up")
    assert samples == [
        Sample({"instance": "node-a"}, 93.5),
        Sample({"instance": "node-b"}, float("inf")),
    ]
    # The trailing slash of the configured URL does not double up.
    assert handler.queries == ["up"]


@pytest.mark.parametrize(
    ("status", "content_type", "body", "error", "says"),
    [
        # The query timed out inside Prometheus: an outage, not the rule's fault.
        (
            503,
            "application/json",
            api("error", errorType="timeout", error="query timed out"),
            Unreachable,
            "timeout",
        ),
        # A proxy in front of Prometheus has no backend.
        (502, "text/html", b"<html>Bad Gateway</html>", Unreachable, "HTTP 502"),
        # A wrong URL: some web server that is not Prometheus.
        (404, "text/html", b"<html>Not Found</html>", BadAnswer, "is this the Prometheus"),
        (200, "application/json", b'{"hello": "world"}', BadAnswer, "no Prometheus API"),
        # The expression is malformed or cannot be executed: the rule is wrong.
        (
            400,
            "application/json",
            api("error", errorType="bad_data", error="parse error"),
            QueryFailed,
            "bad_data: parse error",
        ),
        (
            422,
            "application/json",
            api("error", errorType="execution", error="many-to-many"),
            QueryFailed,
            "execution: many-to-many",
        ),
        # A scalar is not one value per node.
        (
            200,
            "application/json",
            api("success", data={"resultType": "scalar", "result": [1, "1"]}),
            QueryFailed,
            "yields a scalar",
        ),
        (
            200,
            "application/json",
            api("success", data={"resultType": "vector", "result": [{}]}),
            BadAnswer,
            "cannot read",
        ),
    ],
)
def test_every_failure_maps_to_unreachable_bad_answer_or_a_refused_query(
    canned: tuple[str, type[Canned]],
    status: int,
    content_type: str,
    body: bytes,
    error: type[Exception],
    says: str,
) -> None:
    url, handler = canned
    handler.answer = (status, content_type, body)
    with pytest.raises(error, match=says):
        Prometheus(url).query("up")


def test_a_refused_connection_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(Unreachable, match="ConnectionError"):
        Prometheus(f"http://127.0.0.1:{port}", timeout=2).query("up")
