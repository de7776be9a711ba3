"""What detect-failures logs for each event it receives, through functions-framework.

detect-failures sees every pod change in the cluster. By default each event gets one compact
line; only events that led to something are logged in full (redacted), and those lines are
enough for the replay tool to reach the same decision again.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubectl_kn_rescheduler import replay
from shared.api.keys import APISERVER_UPDATE, EVENT_POD_FAILING
from shared.platform import logs
from tests import logcapture
from tests.handlers.conftest import ClientFactory, cloudevent, reply_of
from tests.unit import pods
from tests.unit.secret_pods import PASSWORD, SECRETS, with_secrets

NAME = "web-7d9c8b6f4-x2x9z"
SOURCE_ATTRS = {
    "subject": f"/apis/v1/namespaces/shop/pods/{NAME}",
    "kind": "Pod",
    "apiversion": "v1",
    "name": NAME,
    "namespace": "shop",
}
HEALTHY = with_secrets(pods.pod())
FAILING = with_secrets(pods.pod(containers=[pods.crash_looping(restarts=4)]))

Lines = Callable[[], list[dict[str, Any]]]


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> Iterator[Lines]:
    """The JSON lines the functions log from here on, at the deployed level INFO."""
    monkeypatch.delenv(logs.LOG_EVENTS_ENV, raising=False)
    with logcapture.log_lines("detect-failures") as lines:
        yield lambda: [json.loads(line) for line in lines()]


def post(client: Any, data: Any, **kw: Any) -> Any:
    headers, body = cloudevent(APISERVER_UPDATE, data, **{**SOURCE_ATTRS, **kw})
    return client.post("/", headers=headers, data=body)


def of_event(lines: list[dict[str, Any]], event_id: str) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("ce_id") == event_id]


def test_a_pod_that_needs_nothing_gets_one_compact_line_without_its_content(
    function_client: ClientFactory, logged: Lines
) -> None:
    response = post(function_client("detect-failures"), HEALTHY, id="ev-healthy")
    assert response.status_code == 202

    (line,) = of_event(logged(), "ev-healthy")
    assert line["msg"] == "event handled"
    assert line["level"] == "info"
    assert line["ce_type"] == APISERVER_UPDATE
    assert line["ce_subject"] == SOURCE_ATTRS["subject"]
    assert line["object"] == f"shop/{NAME}"
    assert line["resourceVersion"] == HEALTHY["metadata"]["resourceVersion"]
    assert (line["outcome"], line["status"], line["writes"]) == ("accepted", 202, 0)
    assert line["duration_ms"] >= 0
    assert "cloudevent" not in line
    text = json.dumps(logged())
    assert not any(secret in text for secret in SECRETS)
    assert "managedFields" not in text and "containers" not in text


def test_a_failing_pod_is_logged_in_full_without_env_values_or_managed_fields(
    function_client: ClientFactory, logged: Lines
) -> None:
    response = post(function_client("detect-failures"), FAILING, id="ev-failing")
    assert response.status_code == 200

    (line,) = of_event(logged(), "ev-failing")
    assert (line["outcome"], line["status"]) == ("replied", 200)
    assert line["reply_type"] == EVENT_POD_FAILING
    assert line["reply_id"] == reply_of(response)[0]["id"]
    event = line["cloudevent"]
    assert (event["id"], event["type"], event["subject"]) == (
        "ev-failing",
        APISERVER_UPDATE,
        SOURCE_ATTRS["subject"],
    )
    spec = event["data"]["spec"]
    assert spec["containers"][0]["env"][1] == {"name": "DB_PASSWORD"}
    assert spec["containers"][0]["env"][2]["valueFrom"]["secretKeyRef"]["name"] == "shop-api"
    assert event["data"]["status"] == FAILING["status"]
    text = json.dumps(logged())
    assert not any(secret in text for secret in SECRETS)
    assert "managedFields" not in text


def test_an_event_the_function_rejects_is_logged_in_full_and_a_malformed_body_is_not(
    function_client: ClientFactory, logged: Lines
) -> None:
    client = function_client("detect-failures")
    assert post(client, ["not", "a", "pod"], id="ev-list").status_code == 400
    rejected, line = of_event(logged(), "ev-list")
    assert rejected["msg"].startswith("event rejected")
    assert (line["outcome"], line["status"]) == ("rejected", 400)
    assert line["cloudevent"]["data"] == ["not", "a", "pod"]

    headers, _ = cloudevent(APISERVER_UPDATE, {}, **SOURCE_ATTRS)
    body = ('{"password": "' + PASSWORD + '", ').encode()
    assert client.post("/", headers=headers, data=body).status_code == 400
    (malformed,) = [line for line in logged() if line["msg"].startswith("malformed event")]
    assert (malformed["status"], malformed["bytes"]) == (400, len(body))
    assert PASSWORD not in json.dumps(logged())


def test_replay_from_the_default_log_reaches_the_same_decision(
    function_client: ClientFactory, logged: Lines, tmp_path: Path
) -> None:
    client = function_client("detect-failures")
    original = post(client, FAILING, id="ev-replayed")
    post(client, HEALTHY, id="ev-quiet")
    log_file = tmp_path / "detect-failures.log"
    log_file.write_text("".join(json.dumps(line) + "\n" for line in logged()))

    out = io.StringIO()
    assert replay.main([str(log_file), "--json"], out=out) == 0
    (outcome,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert (outcome["id"], outcome["function"], outcome["status"]) == (
        "ev-replayed",
        "detect-failures",
        200,
    )
    attrs, data = reply_of(original)
    assert outcome["reply"]["type"] == attrs["type"]
    assert outcome["reply"]["data"] == data


def test_log_events_all_logs_every_event_in_full_once_before_handling_it(
    function_client: ClientFactory, logged: Lines, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(logs.LOG_EVENTS_ENV, "all")
    client = function_client("detect-failures")
    assert post(client, HEALTHY, id="ev-all-healthy").status_code == 202
    assert post(client, FAILING, id="ev-all-failing").status_code == 200

    lines = logged()
    for event_id in ("ev-all-healthy", "ev-all-failing"):
        received, handled = of_event(lines, event_id)
        assert (received["msg"], received["level"]) == ("event received", "info")
        assert received["cloudevent"]["data"]["metadata"]["name"] == NAME
        assert handled["msg"] == "event handled"
        assert "cloudevent" not in handled
    # Each event once: a replay of this log replays each event once.
    items, _ = replay.read(json.dumps(line) for line in lines)
    assert [i.event.id for i in items] == ["ev-all-healthy", "ev-all-failing"]
    assert not any(secret in json.dumps(lines) for secret in SECRETS)


def test_at_debug_level_every_event_is_logged_in_full_at_debug(
    function_client: ClientFactory, logged: Lines
) -> None:
    logging.getLogger().setLevel(logging.DEBUG)
    assert post(function_client("detect-failures"), HEALTHY, id="ev-debug").status_code == 202
    received, handled = of_event(logged(), "ev-debug")
    assert (received["msg"], received["level"]) == ("event received", "debug")
    assert "managedFields" not in json.dumps(received)
    assert "cloudevent" not in handled


def test_an_unknown_log_events_setting_stops_the_function_at_start(
    function_client: ClientFactory,
) -> None:
    with pytest.raises(Exception, match=logs.LOG_EVENTS_ENV):
        function_client("detect-failures", KN_RESCHEDULER_LOG_EVENTS="everything")
