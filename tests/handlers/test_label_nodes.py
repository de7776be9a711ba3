"""label-nodes through functions-framework: start-up checks, /status, /nodes, /metrics and how
a ping is answered when something it needs is down.

No cluster here: the API server is a loopback port nobody listens on (a real refused
connection), and so is Prometheus. Evaluations against a real API server and a real Prometheus
are in tests/e2e/test_label_nodes.py.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from shared.nodes.label_nodes.rules import RulesError
from shared.platform.config import ConfigError
from tests.handlers.conftest import ClientFactory, cloudevent

PING = "dev.knative.sources.ping"


def nobody_listens() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_without_a_prometheus_address_the_function_does_not_start(
    function_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KN_RESCHEDULER_PROMETHEUS_URL", raising=False)
    with pytest.raises(ConfigError, match="KN_RESCHEDULER_PROMETHEUS_URL: label-nodes needs"):
        function_client("label-nodes")


def test_malformed_rules_stop_the_function_naming_the_rule_and_field(
    function_client: ClientFactory, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: cpu\n    expr: up\n    threshold: 80\n    clear: 90\n")
    with pytest.raises(RulesError, match="rule 'cpu', field clear: a rule that fires above"):
        function_client(
            "label-nodes",
            KN_RESCHEDULER_PROMETHEUS_URL=nobody_listens(),
            KN_RESCHEDULER_PRESSURE_RULES_FILE=str(rules),
        )


def test_status_before_any_evaluation_names_prometheus_and_the_rules(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    url = nobody_listens()
    client = function_client(
        "label-nodes", KUBECONFIG=str(unreachable_kubeconfig), KN_RESCHEDULER_PROMETHEUS_URL=url
    )
    response = client.get("/status")
    assert response.status_code == 200
    assert response.get_json() == {
        "prometheus_url": url,
        "prometheus_reachable": None,
        "last_evaluation": None,
        "last_success": None,
        "last_error": "",
        "labelled": 0,
        "cap": 0,
        "rules": [
            "cpu-usage: > 70 (clears at 60)",
            "memory-usage: > 70 (clears at 65)",
            "memory-available: < 5.36871e+08 (clears at 8.05306e+08)",
        ],
    }


def test_a_ping_the_api_server_cannot_answer_gets_503_so_the_source_retries(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client(
        "label-nodes",
        KUBECONFIG=str(unreachable_kubeconfig),
        KN_RESCHEDULER_PROMETHEUS_URL=nobody_listens(),
    )
    headers, body = cloudevent(PING, {"message": "evaluate"})
    assert client.post("/", headers=headers, data=body).status_code == 503
    # No evaluation happened: /status says so rather than claiming an outage of Prometheus.
    assert client.get("/status").get_json()["last_evaluation"] is None


def test_nodes_answers_503_with_the_reason_when_the_api_server_is_unreachable(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client(
        "label-nodes",
        KUBECONFIG=str(unreachable_kubeconfig),
        KN_RESCHEDULER_PROMETHEUS_URL=nobody_listens(),
    )
    response = client.get("/nodes")
    assert response.status_code == 503
    # The API path only in the log: anyone who reaches the Service reads the answer.
    assert "/api/v1/nodes" not in response.get_json()["error"]
    assert "see the function's log" in response.get_json()["error"]


def test_an_event_that_is_not_a_ping_is_accepted_without_an_evaluation(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client(
        "label-nodes",
        KUBECONFIG=str(unreachable_kubeconfig),
        KN_RESCHEDULER_PROMETHEUS_URL=nobody_listens(),
    )
    headers, body = cloudevent("io.kn-rescheduler.pod.failing", {"pod": "x"})
    # Had it evaluated, the unreachable API server would have made it 503.
    assert client.post("/", headers=headers, data=body).status_code == 202


def test_a_malformed_request_gets_400_and_metrics_show_the_pressure_families(
    function_client: ClientFactory,
) -> None:
    client = function_client("label-nodes", KN_RESCHEDULER_PROMETHEUS_URL=nobody_listens())
    assert client.post("/", data=b"nope", headers={"content-type": "text/plain"}).status_code == 400
    text = client.get("/metrics").get_data(as_text=True)
    for family in (
        "knr_pressure_evaluations_total",
        "knr_pressure_node_writes_total",
        "knr_pressure_labelled_nodes",
        "knr_pressure_prometheus_up",
    ):
        assert f"# TYPE {family.removesuffix('_total')}" in text
