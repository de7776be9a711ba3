"""Every function reads a request body with a bound (shared.platform.bodies): an oversized body
is answered 413 before it is read, through functions-framework (whose own after-request hook
would otherwise read every body in full), and a chunked one as soon as the limit is passed."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from shared.platform.bodies import EVENT_MAX_BODY, EXTENDER_MAX_BODY, MAX_BODY_ENV
from tests.handlers.conftest import ClientFactory, cloudevent, settings
from tests.handlers.test_mutate_admission_limits import Untouchable

# Every function and the path its callers POST to, with its default limit.
FUNCTIONS = {
    "detect-failures": ("/", EVENT_MAX_BODY),
    "update-annotations": ("/", EVENT_MAX_BODY),
    "assess-nodes": ("/", EVENT_MAX_BODY),
    "sweep-failures": ("/", EVENT_MAX_BODY),
    "label-nodes": ("/", EVENT_MAX_BODY),
    "annotate-usage": ("/", EVENT_MAX_BODY),
    "rebalance-nodes": ("/", EVENT_MAX_BODY),
    "mutate-admission": ("/", EVENT_MAX_BODY),
    "score-nodes": ("/filter", EXTENDER_MAX_BODY),
}


class Trickle(io.RawIOBase):
    """A chunked body (no declared length) of ``size`` bytes, counting what was read."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left, 4096)
        buffer[:n] = b"x" * n
        self.left -= n
        self.read_bytes += n
        return n


@pytest.mark.parametrize("name", FUNCTIONS)
def test_a_body_declared_over_the_limit_is_refused_with_413_without_reading_it(
    name: str, function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    path, limit = FUNCTIONS[name]
    client = function_client(name, **settings(name, unreachable_kubeconfig))
    body = Untouchable(limit + 1)
    response = client.post(path, input_stream=body, content_type="application/json")
    assert response.status_code == 413
    assert body.reads == 0
    error = response.get_json()["error"]
    assert f"{limit + 1} bytes" in error and f"{limit} bytes" in error


@pytest.mark.parametrize("name", FUNCTIONS)
def test_a_chunked_body_is_read_no_further_than_the_limit(
    name: str, function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    path, _ = FUNCTIONS[name]
    client = function_client(
        name, **settings(name, unreachable_kubeconfig, **{MAX_BODY_ENV: "8192"})
    )
    body = Trickle(10 * 1024 * 1024)
    # As a server hands over a chunked body: no length, the stream ends where the body does.
    response = client.post(
        path,
        content_type="application/json",
        environ_overrides={
            "wsgi.input": body,
            "wsgi.input_terminated": True,
            "CONTENT_LENGTH": "",
        },
    )
    assert response.status_code == 413
    assert body.read_bytes <= 8192 + 64 * 1024
    assert MAX_BODY_ENV in response.get_json()["error"]


def test_an_event_under_the_limit_is_handled_as_before(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client(
        "detect-failures", KUBECONFIG=str(unreachable_kubeconfig), **{MAX_BODY_ENV: "65536"}
    )
    headers, data = cloudevent("com.example.unrelated", {"hello": "world"})
    assert client.post("/", headers=headers, data=data).status_code == 202


@pytest.mark.parametrize("name", ["detect-failures", "score-nodes", "mutate-admission"])
def test_a_limit_that_is_not_a_positive_number_of_bytes_stops_the_function(
    name: str, function_client: ClientFactory
) -> None:
    with pytest.raises(Exception, match=MAX_BODY_ENV):
        function_client(name, **{MAX_BODY_ENV: "3MiB"})


@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_function_answers_its_probes_on_healthz(
    name: str, function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client(name, **settings(name, unreachable_kubeconfig))
    response = client.get("/healthz")
    assert response.status_code == 200 and response.data == b"ok"
