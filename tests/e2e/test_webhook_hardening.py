"""mutate-admission as its image serves it (gunicorn, TLS), facing callers that are not the API
server: client-certificate authentication and the request size limit, over real sockets.

With TLS_CLIENT_CA_FILE the TLS handshake itself requires a client certificate from that CA,
so a caller without one never gets to send an AdmissionReview. The API server presents one
when its AdmissionConfiguration gives it a kubeconfig for the webhook
(docs/install-hardening.md): the last test starts a second kube-apiserver of the local control
plane with exactly that configuration, and shows that it reaches the webhook where the first
one (without it) cannot.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from dev.localcluster.procs import Proc
from dev.stack import webhook as webhook_setup
from dev.stack.functions import FunctionServer, free_port
from tests import builders
from tests.e2e.conftest import mutate_admission_over_tls, register_for_one_namespace, wait_for
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


# -- a real API server presents the client certificate ------------------------------------------


def admission_configuration(directory: Path, webhook_host_port: str, client: Any) -> Path:
    """The API server side of docs/install-hardening.md: an AdmissionConfiguration whose kubeconfig
    gives the webhook's address a client certificate. For a webhook registered by URL the user
    entry is named host:port; for one registered by Service it is NAME.NAMESPACE.svc (the API
    server looks for NAME.NAMESPACE.svc:PORT, then without :443)."""
    kubeconfig = directory / "webhook-kubeconfig.yaml"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "users": [
                    {
                        "name": webhook_host_port,
                        "user": {
                            "client-certificate": str(client.crt),
                            "client-key": str(client.key),
                        },
                    }
                ],
            }
        )
    )
    config = directory / "admission-configuration.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "AdmissionConfiguration",
                "plugins": [
                    {
                        "name": "MutatingAdmissionWebhook",
                        "configuration": {
                            "apiVersion": "apiserver.config.k8s.io/v1",
                            "kind": "WebhookAdmissionConfiguration",
                            "kubeConfigFile": str(kubeconfig),
                        },
                    }
                ],
            }
        )
    )
    return config


@pytest.fixture
def second_api_server(cluster: Any, tmp_path: Path) -> Iterator[Any]:
    """A factory: another kube-apiserver of the same control plane (same etcd, same flags)
    on its own port, with the extra flags given; an ApiClient for it. Two API servers on one
    etcd is what an HA control plane runs (here they share a host name, so they argue over
    one identity lease while both run: harmless, and over when the test ends)."""
    started: list[Proc] = []

    def start(*extra: str) -> k8s.ApiClient:
        pid = cluster.pids()["kube-apiserver"]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        port = free_port()
        argv = [a for a in argv if not a.startswith("--secure-port=")]
        argv += [f"--secure-port={port}", *extra]
        proc = Proc("kube-apiserver-2", argv, tmp_path / "kube-apiserver-2.log")
        started.append(proc)
        api = cluster.api_client()
        api.configuration.host = f"https://127.0.0.1:{port}"

        config = api.configuration
        context = ssl.create_default_context(cafile=config.ssl_ca_cert)
        context.load_cert_chain(config.cert_file, config.key_file)

        def ready() -> bool:
            assert proc.alive(), proc.log_tail()
            try:
                with urllib.request.urlopen(
                    f"{config.host}/readyz", context=context, timeout=2
                ) as answer:
                    return bool(answer.status == 200)
            except OSError:
                return False

        wait_for("the second kube-apiserver to be ready", ready, timeout=60, every=0.5)
        return api

    yield start
    for proc in started:
        proc.stop(grace=10)


def admissions(server: FunctionServer) -> float:
    """How many AdmissionReviews the webhook has answered (its own metrics)."""
    context = server.ssl_context()
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    pattern = r'^knr_webhook_admissions_total\{result="(?:patched|unchanged)"\} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))


def failed_calls(log: Path, url: str) -> list[str]:
    """The API server's log lines about a failed call to the webhook at `url`."""
    return [
        line
        for line in log.read_text().splitlines()
        if "failed calling webhook" in line and url in line
    ]


def test_only_an_api_server_configured_with_the_client_certificate_reaches_the_webhook(
    cluster: Any,
    namespace: str,
    tmp_path: Path,
    client_tls: webhook_setup.ClientTLS,
    second_api_server: Any,
) -> None:
    server, ca = mutate_admission_over_tls(
        cluster, tmp_path, tmp_path / "serving", client_tls=client_tls
    )
    with server:
        name = webhook_setup.NAME + "-client-auth"
        register_for_one_namespace(cluster.api_client(), server.url, ca, name, namespace)
        try:
            # The session's API server has no AdmissionConfiguration: the handshake fails,
            # failurePolicy Ignore admits the pod, and the webhook answered nothing. Its
            # admission plugin follows registrations with a lag, so a pod is created until its
            # call shows in the log.
            plain = k8s.CoreV1Api(cluster.api_client())
            url = f"127.0.0.1:{server.port}"
            tried = 0

            def failed_call() -> list[str]:
                nonlocal tried
                tried += 1
                plain.create_namespaced_pod(
                    namespace, builders.bare_pod(f"without-certificate-{tried}", retries="2")
                )
                return failed_calls(cluster.log_dir / "kube-apiserver.log", url)

            # Which error Go's client reports depends on when the server's refusal reaches it:
            # with TLS 1.3 the client's side of the handshake completes before the server checks
            # the certificate, so the alert ("certificate required", "bad certificate") or only
            # the closed connection may be what it reads. The refusal itself is proved by
            # test_without_a_client_certificate_the_tls_handshake_is_refused; here, that this
            # API server called the webhook and failed, on this webhook's own address.
            wait_for(
                f"the API server to log its failed call to {url}",
                failed_call,
                timeout=15,
                every=0.5,
            )
            assert admissions(server) == 0

            # An API server of the same control plane started with the AdmissionConfiguration
            # of docs/install-hardening.md presents the client certificate and gets its answer.
            config = admission_configuration(tmp_path, f"127.0.0.1:{server.port}", client_tls)
            second = second_api_server(f"--admission-control-config-file={config}")
            # Its webhook informer may need a moment to see the registration.
            created = 0

            def answered() -> bool:
                nonlocal created
                created += 1
                k8s.CoreV1Api(second).create_namespaced_pod(
                    namespace, builders.bare_pod(f"with-{created}", retries="2")
                )
                return admissions(server) >= 1

            wait_for("the webhook to answer the second API server", answered, timeout=30)
        finally:
            webhook_setup.unregister(cluster.api_client(), name)
