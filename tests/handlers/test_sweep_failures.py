"""sweep-failures through functions-framework: a PingSource tick in, a summary in the logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.handlers.conftest import ClientFactory, cloudevent

PING = "dev.knative.sources.ping"


def test_an_unreachable_api_server_gets_503_so_the_tick_is_retried(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client(
        "sweep-failures", KUBECONFIG=str(unreachable_kubeconfig), K_SINK="http://127.0.0.1:9/"
    )
    headers, body = cloudevent(PING, {"message": "sweep"})
    assert client.post("/", headers=headers, data=body).status_code == 503


def test_a_missing_sink_is_a_deployment_error_not_a_crash(
    function_client: ClientFactory, unreachable_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("K_SINK", raising=False)
    client = function_client("sweep-failures", KUBECONFIG=str(unreachable_kubeconfig))
    headers, body = cloudevent(PING, {"message": "sweep"})
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 500
    # The reason (K_SINK is not set) is in the log line of this event; the answer points there.
    assert "see the function's log for event" in response.get_json()["error"]


def test_a_malformed_tick_gets_400(function_client: ClientFactory) -> None:
    client = function_client("sweep-failures", K_SINK="http://127.0.0.1:9/")
    assert client.post("/", data=b"nope", headers={"content-type": "text/plain"}).status_code == 400


def test_an_event_that_is_not_the_tick_starts_no_sweep(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    # Any pod can post to the Service: a sweep lists every pod of the cluster, so only the
    # PingSource's type starts one. The API server is unreachable here, so a sweep would 503.
    client = function_client(
        "sweep-failures", KUBECONFIG=str(unreachable_kubeconfig), K_SINK="http://127.0.0.1:9/"
    )
    headers, body = cloudevent("com.example.anything", {"message": "sweep"})
    assert client.post("/", headers=headers, data=body).status_code == 202
