"""update-annotations through functions-framework: the answers Knative's redelivery relies on.

Success paths need a real API server and live in tests/e2e; here are the paths that decide
whether the Broker retries, dead-letters or forgets an event.
"""

from __future__ import annotations

from pathlib import Path

from shared.api.keys import EVENT_POD_FAILING
from shared.platform.config import Config
from shared.platform.events import Event
from shared.pods.detect_failures.decide import detect
from tests.handlers.conftest import ClientFactory, cloudevent
from tests.unit import pods


def failing_data() -> dict[str, object]:
    pod = pods.pod(containers=[pods.crash_looping(restarts=4)])
    reply = detect(
        Event("1", "s", "dev.knative.apiserver.resource.update", {"kind": "Pod"}, pod), Config()
    )
    assert reply is not None
    return dict(reply.data)


def test_a_malformed_failing_event_gets_400_and_is_not_retried(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("update-annotations", KUBECONFIG=str(unreachable_kubeconfig))
    headers, body = cloudevent(EVENT_POD_FAILING, {"name": "web"})
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 400
    assert "namespace" in response.get_json()["error"]


def test_an_unreachable_api_server_gets_503_so_knative_redelivers(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("update-annotations", KUBECONFIG=str(unreachable_kubeconfig))
    headers, body = cloudevent(EVENT_POD_FAILING, failing_data())
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 503
    assert "127.0.0.1" in response.get_json()["error"]
