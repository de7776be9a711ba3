"""detect-failures through functions-framework: what a Broker sees for each kind of event."""

from __future__ import annotations

from typing import Any

from shared.api.keys import APISERVER_ADD, APISERVER_DELETE, APISERVER_UPDATE, EVENT_POD_FAILING
from tests.handlers.conftest import ClientFactory, cloudevent, reply_of
from tests.unit import pods

SOURCE_ATTRS = {"subject": "/apis/v1/namespaces/shop/pods/web-7d9c8b6f4-x2x9z", "kind": "Pod"}


def post(client: Any, event_type: str, data: Any, **kw: Any) -> Any:
    headers, body = cloudevent(event_type, data, **{**SOURCE_ATTRS, **kw})
    return client.post("/", headers=headers, data=body)


def test_a_crash_looping_opted_in_pod_is_answered_with_a_failing_event(
    function_client: ClientFactory,
) -> None:
    client = function_client("detect-failures")
    pod = pods.pod(containers=[pods.crash_looping(restarts=4)], excluded=["node-a"])
    response = post(client, APISERVER_UPDATE, pod)
    assert response.status_code == 200
    attrs, data = reply_of(response)
    assert attrs["type"] == EVENT_POD_FAILING
    assert attrs["subject"] == "namespaces/shop/pods/web-7d9c8b6f4-x2x9z"
    assert response.headers["content-type"] == "application/json"
    assert attrs["id"] and attrs["source"] == "/kn-rescheduler/detect-failures"
    assert data["reason"] == "CrashLoopBackOff"
    assert data["node"] == "node-b"
    assert data["restartCount"] == 4
    assert data["excludedNodes"] == ["node-a"]
    assert data["uid"] == pod["metadata"]["uid"]
    assert data["ownerReferences"][0]["kind"] == "ReplicaSet"
    assert data["startTime"] == pod["status"]["startTime"]
    assert "pod" not in data  # only bare pods carry their spec


def test_a_failing_bare_pod_carries_its_spec_for_recreation(function_client: ClientFactory) -> None:
    client = function_client("detect-failures")
    response = post(client, APISERVER_UPDATE, pods.evicted(owner=None))
    assert response.status_code == 200
    _, data = reply_of(response)
    assert data["reason"] == "Evicted"
    assert data["pod"]["spec"]["containers"]


def test_a_healthy_pod_gets_202_and_an_empty_body(function_client: ClientFactory) -> None:
    response = post(function_client("detect-failures"), APISERVER_ADD, pods.pod())
    assert response.status_code == 202
    assert response.data == b""


def test_structured_mode_events_are_understood(function_client: ClientFactory) -> None:
    headers, body = cloudevent(
        APISERVER_UPDATE,
        pods.pod(containers=[pods.crash_looping(restarts=5)]),
        structured=True,
        **SOURCE_ATTRS,
    )
    response = function_client("detect-failures").post("/", headers=headers, data=body)
    assert response.status_code == 200


def test_a_pod_without_the_policy_stamp_is_ignored_unless_configured(
    function_client: ClientFactory,
) -> None:
    unstamped = pods.pod(containers=[pods.crash_looping(restarts=5)], stamp=None)
    assert post(function_client("detect-failures"), APISERVER_UPDATE, unstamped).status_code == 202
    forwarding = function_client("detect-failures", KN_RESCHEDULER_FORWARD_UNSTAMPED="true")
    assert post(forwarding, APISERVER_UPDATE, unstamped).status_code == 200


def test_delete_events_and_other_kinds_are_nothing_to_do(function_client: ClientFactory) -> None:
    client = function_client("detect-failures")
    failing = pods.pod(containers=[pods.crash_looping(restarts=5)])
    assert post(client, APISERVER_DELETE, failing).status_code == 202
    assert post(client, APISERVER_UPDATE, failing, kind="Deployment").status_code == 202


def test_malformed_events_get_400_with_a_reason(function_client: ClientFactory) -> None:
    client = function_client("detect-failures")
    not_a_cloudevent = client.post("/", data=b"{}", headers={"content-type": "application/json"})
    assert not_a_cloudevent.status_code == 400
    assert "CloudEvent" in not_a_cloudevent.get_json()["error"]
    headers, _ = cloudevent(APISERVER_UPDATE, {}, **SOURCE_ATTRS)
    bad_json = client.post("/", headers=headers, data=b"{not json")
    assert bad_json.status_code == 400
    assert post(client, APISERVER_UPDATE, ["a", "list"]).status_code == 400
    assert post(client, APISERVER_UPDATE, {"metadata": {"name": "x"}}).status_code == 400


def test_metrics_count_the_events_by_answer(function_client: ClientFactory) -> None:
    client = function_client("detect-failures")
    post(client, APISERVER_ADD, pods.pod())
    text = client.get("/metrics").data.decode()
    assert 'knr_events_received_total{function="detect-failures",outcome="202",type=' in text
