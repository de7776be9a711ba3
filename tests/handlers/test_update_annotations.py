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
    # What failed and where to read more; the API's address and paths only in the log.
    error = response.get_json()["error"]
    assert "transient" in error and "see the function's log for event" in error
    assert "127.0.0.1" not in error and "/api/" not in error


def test_a_bare_pods_snapshot_not_shaped_as_a_pod_gets_400_before_anything_is_read(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    # Any pod can post one; a snapshot whose metadata is not an object (or whose labels are not
    # strings) used to end in a 500 and the dead-letter sink once the named pod was gone.
    client = function_client("update-annotations", KUBECONFIG=str(unreachable_kubeconfig))
    for pod in (
        {"metadata": "ab"},
        {"metadata": [1, 2]},
        {"metadata": {"annotations": "x"}},
        {"metadata": {"labels": ["a"]}},
        {"metadata": {}, "spec": "x"},
    ):
        headers, body = cloudevent(EVENT_POD_FAILING, {**failing_data(), "pod": pod})
        response = client.post("/", headers=headers, data=body)
        assert response.status_code == 400, pod
        assert "pod." in response.get_json()["error"]
