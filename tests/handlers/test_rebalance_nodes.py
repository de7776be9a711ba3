"""rebalance-nodes through functions-framework: start-up checks, /status, and how a ping is
answered when the API server is down.

No cluster here: the API server is a loopback port nobody listens on (a real refused
connection). Evaluations against a real API server are in tests/e2e/test_rebalance_nodes.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.platform.config import ConfigError
from tests.handlers.conftest import ClientFactory, cloudevent

PING = "dev.knative.sources.ping"


def test_an_invalid_setting_stops_the_function_naming_it(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    with pytest.raises(ConfigError, match="KN_RESCHEDULER_REBALANCE_MIN_AVAILABLE"):
        function_client(
            "rebalance-nodes",
            KUBECONFIG=str(unreachable_kubeconfig),
            KN_RESCHEDULER_REBALANCE_MIN_AVAILABLE="150%",
        )


def test_status_before_any_evaluation(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client(
        "rebalance-nodes", KUBECONFIG=str(unreachable_kubeconfig), KN_RESCHEDULER_DRY_RUN="true"
    )
    response = client.get("/status")
    assert response.status_code == 200
    assert response.get_json() == {
        "dry_run": True,
        "last_evaluation": None,
        "last_success": None,
        "last_error": "",
        "hot_streaks": {},
        "acting_on": [],
        "last_run": {},
        "totals": {},
        "last_evictions": [],
    }


def test_a_ping_the_api_server_cannot_answer_gets_503_so_it_is_retried(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("rebalance-nodes", KUBECONFIG=str(unreachable_kubeconfig))
    headers, body = cloudevent(PING, {"reason": "rebalance"}, source="/pingsource")
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 503
    status = client.get("/status").get_json()
    assert "Connection refused" in status["last_error"] or "refused" in status["last_error"]
    assert status["last_success"] is None


def test_an_event_that_is_not_a_ping_is_accepted_without_a_call(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    # The API server is unreachable: any call would have made this a 503.
    client = function_client("rebalance-nodes", KUBECONFIG=str(unreachable_kubeconfig))
    headers, body = cloudevent("io.kn-rescheduler.pod.failing", {"pod": "x"})
    assert client.post("/", headers=headers, data=body).status_code == 202


def test_a_malformed_event_is_refused_with_400(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("rebalance-nodes", KUBECONFIG=str(unreachable_kubeconfig))
    response = client.post("/", data=b"not an event", headers={"Content-Type": "text/plain"})
    assert response.status_code == 400
