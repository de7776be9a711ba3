"""mutate-admission as its image serves it (gunicorn, TLS), facing callers that are not the API
server: client-certificate authentication and the request size limit, over real sockets.

With TLS_CLIENT_CA_FILE the TLS handshake itself requires a client certificate from that CA,
so a caller without one never gets to send an AdmissionReview. The API server presents one
when its AdmissionConfiguration gives it a kubeconfig for the webhook (docs/install.md).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stack import webhook as webhook_setup
from stack.functions import FunctionServer
from tests.unit import pods

pytestmark = pytest.mark.e2e

UID = "e911857d-c318-11e8-bbad-025000000001"


def review(obj: Any) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": UID,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": "shop",
                # A bare pod with no policy: answered without any API lookup.
                "object": obj,
            },
        }
    ).encode()


BARE_POD = pods.pod(owner=None, node=None, stamp=None)


def webhook_server(tmp: Path, **kw: Any) -> FunctionServer:
    ca, crt, key = webhook_setup.make_tls(tmp / "serving")
    # No API credentials at all: nothing asked here needs a lookup.
    return FunctionServer(
        "mutate-admission",
        tmp,
        env={"KN_RESCHEDULER_LOG_LEVEL": "INFO", **kw.pop("env", {})},
        tls=(crt, key),
        ca_file=ca,
        **kw,
    )


@pytest.fixture(scope="module")
def client_tls(tmp_path_factory: pytest.TempPathFactory) -> webhook_setup.ClientTLS:
    return webhook_setup.make_client_tls(tmp_path_factory.mktemp("client-tls"))


@pytest.fixture(scope="module")
def authenticating(
    tmp_path_factory: pytest.TempPathFactory, client_tls: webhook_setup.ClientTLS
) -> Iterator[FunctionServer]:
    """The webhook requiring client certificates signed by the client CA."""
    with webhook_server(tmp_path_factory.mktemp("authenticating"), client_tls=client_tls) as s:
        yield s


def post(server: FunctionServer, context: ssl.SSLContext | None, body: bytes) -> Any:
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        connection.request("POST", "/", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_without_a_client_certificate_the_tls_handshake_is_refused(
    authenticating: FunctionServer,
) -> None:
    anonymous = authenticating.ssl_context(with_client_cert=False)
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)) as refused:
        post(authenticating, anonymous, review(BARE_POD))
    # TLS 1.3: the server's alert arrives on the client's first read.
    assert "CERTIFICATE_REQUIRED" in str(refused.value) or isinstance(
        refused.value, (ConnectionResetError, BrokenPipeError)
    )


def test_a_certificate_from_another_ca_is_refused_too(
    authenticating: FunctionServer, tmp_path: Path
) -> None:
    # A perfectly valid client certificate, from a CA the webhook does not trust (say, the
    # cluster's own CA that signs every kubelet's and user's certificate).
    stranger = webhook_setup.make_client_tls(tmp_path, common_name="system:admin")
    context = authenticating.ssl_context(with_client_cert=False)
    assert context is not None
    context.load_cert_chain(str(stranger.crt), str(stranger.key))
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)) as refused:
        post(authenticating, context, review(BARE_POD))
    assert "UNKNOWN_CA" in str(refused.value) or isinstance(
        refused.value, (ConnectionResetError, BrokenPipeError)
    )


def test_a_caller_with_a_certificate_from_the_client_ca_is_answered(
    authenticating: FunctionServer,
) -> None:
    status, body = post(authenticating, authenticating.ssl_context(), review(BARE_POD))
    assert status == 200
    assert json.loads(body)["response"] == {"uid": UID, "allowed": True}


def test_without_the_setting_any_tls_client_is_answered(tmp_path: Path) -> None:
    # What the default install does: the CA-less check the setting adds is the difference.
    with webhook_server(tmp_path) as open_server:
        status, _ = post(open_server, open_server.ssl_context(), review(BARE_POD))
    assert status == 200


def test_a_client_ca_without_tls_stops_the_server(tmp_path: Path) -> None:
    ca = webhook_setup.make_client_tls(tmp_path).ca
    server = FunctionServer(
        "mutate-admission", tmp_path, env={"TLS_CLIENT_CA_FILE": str(ca)}, port=None
    )
    with pytest.raises(RuntimeError, match="TLS_CLIENT_CA_FILE needs TLS"):
        server.start(timeout=20)
    server.stop()


# -- the size limit, on the wire ----------------------------------------------------------------


@pytest.fixture(scope="module")
def small_limit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FunctionServer]:
    """The webhook with a 64 KiB limit, so that going over it takes little traffic."""
    env = {"env": {"KN_RESCHEDULER_WEBHOOK_MAX_BODY_BYTES": str(64 * 1024)}}
    with webhook_server(tmp_path_factory.mktemp("small-limit"), **env) as s:
        yield s


def raw_request(server: FunctionServer, head: bytes, body: bytes) -> bytes:
    """Send ``head`` and ``body`` as they are and read what comes back (up to 64 KiB)."""
    context = server.ssl_context()
    assert context is not None
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as plain,
        context.wrap_socket(plain, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(head + body)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = tls.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def test_a_declared_length_over_the_limit_is_answered_413_without_waiting_for_the_body(
    small_limit: FunctionServer,
) -> None:
    # 100 MiB announced, 10 bytes sent: a server that reads before it checks would wait.
    head = (
        b"POST / HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        b"Content-Length: 104857600\r\n\r\n"
    )
    started = time.monotonic()
    answer = raw_request(small_limit, head, b'{"apiVersi')
    assert time.monotonic() - started < 5
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"104857600 bytes" in answer and b"65536 bytes" in answer


def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(small_limit: FunctionServer) -> None:
    head = (
        b"POST / HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"x" * 16384
    body = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(8)) + b"0\r\n\r\n"
    answer = raw_request(small_limit, head, body)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"a chunked body" in answer


def test_a_real_review_under_the_limit_is_answered(small_limit: FunctionServer) -> None:
    status, body = post(small_limit, small_limit.ssl_context(), review(BARE_POD))
    assert status == 200
    assert json.loads(body)["response"]["allowed"] is True
