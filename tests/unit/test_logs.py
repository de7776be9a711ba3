"""What a log line may carry of an event: ``shared.platform.logs.redact``, and the setting that says
which events are logged in full."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from shared.api.keys import APISERVER_UPDATE, EVENT_POD_FAILING
from shared.platform import logs
from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.workloads.classify import classify
from tests.unit import pods
from tests.unit.secret_pods import SECRETS, with_secrets

POD = with_secrets(pods.pod(containers=[pods.crash_looping(restarts=4)]))
BARE = with_secrets(pods.pod(owner=None, containers=[pods.crash_looping(restarts=4)]))


def apiserver_event(pod: Any) -> dict[str, Any]:
    return {"id": "1", "source": "https://10.0.0.1", "type": APISERVER_UPDATE, "data": pod}


def failing_event(pod: Any) -> dict[str, Any]:
    failure = classify(pod, Config())
    assert failure is not None
    data = FailingPod.from_pod(pod, failure).to_data()
    source = "/kn-rescheduler/detect-failures"
    return {"id": "2", "source": source, "type": EVENT_POD_FAILING, "data": data}


def template_event(pod: Any) -> dict[str, Any]:
    # Not a pod event, but a workload carries the same containers in its template.
    template = {"metadata": {"labels": {"app": "web"}}, "spec": pod["spec"]}
    return {"id": "3", "source": "x", "type": "t", "data": {"spec": {"template": template}}}


@pytest.mark.parametrize(
    "event",
    [apiserver_event(POD), template_event(POD)],
    ids=["a pod event", "a workload's template"],
)
def test_no_literal_env_value_and_no_managed_fields_survive_redaction(event: Any) -> None:
    text = json.dumps(logs.redact(event))
    for secret in SECRETS:
        assert secret in json.dumps(event)
        assert secret not in text
    assert "managedFields" not in text


def test_a_bare_pods_failing_event_carries_no_literal_env_value_in_the_first_place() -> None:
    # The Broker and the dead-letter sink keep whole events; the snapshot is for people only.
    text = json.dumps(failing_event(BARE))
    for secret in SECRETS:
        assert secret not in text
    assert "managedFields" not in text


def test_redaction_keeps_what_a_person_debugging_needs() -> None:
    redacted = logs.redact(apiserver_event(POD))["data"]
    app = redacted["spec"]["containers"][0]
    # Names stay, and references to Secrets and fields stay: they are not the secret.
    assert app["env"] == [
        {"name": "DB_HOST"},
        {"name": "DB_PASSWORD"},
        {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "shop-api", "key": "token"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    assert redacted["spec"]["initContainers"][0]["env"] == [{"name": "GITHUB_TOKEN"}]
    assert redacted["spec"]["ephemeralContainers"][0]["env"] == [{"name": "SESSION"}]
    # Other "value" fields are not env values.
    assert redacted["spec"]["tolerations"][-1]["value"] == "shop"
    # Everything a decision reads is untouched.
    assert redacted["status"] == POD["status"]
    assert redacted["metadata"] == {
        k: v for k, v in POD["metadata"].items() if k != "managedFields"
    }


def test_redaction_copies_and_never_changes_the_event_being_handled() -> None:
    event = apiserver_event(POD)
    before = json.dumps(event, sort_keys=True)
    logs.redact(event)
    assert json.dumps(event, sort_keys=True) == before


@pytest.mark.parametrize(
    ("value", "every"),
    [(None, False), ("", False), ("actions", False), ("ALL", True), (" all ", True)],
)
def test_only_an_explicit_setting_logs_every_event_in_full(value: str | None, every: bool) -> None:
    environ = {} if value is None else {logs.LOG_EVENTS_ENV: value}
    assert logs.log_every_event(environ) is every


def test_an_unknown_log_events_setting_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ValueError, match=r"KN_RESCHEDULER_LOG_EVENTS.*actions, all"):
        logs.log_every_event({logs.LOG_EVENTS_ENV: "everything"})


def formatted(formatter: logs.JsonFormatter) -> dict[str, Any]:
    record = logging.makeLogRecord({"msg": "event handled", "levelno": 20, "levelname": "INFO"})
    line: dict[str, Any] = json.loads(formatter.format(record))
    return line


def test_every_line_names_the_build_that_wrote_it_when_the_image_says() -> None:
    assert formatted(logs.JsonFormatter("detect-failures", "v1.2.0"))["version"] == "v1.2.0"


def test_a_process_not_started_from_an_image_logs_no_version() -> None:
    assert "version" not in formatted(logs.JsonFormatter("detect-failures"))
