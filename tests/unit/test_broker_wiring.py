"""What dev/pipeline/broker.py writes in place of Knative's controllers, and how it reads dead
letters.

The objects are shaped as the project's manifests and Knative's API server return them (a
Trigger with its uid and generation); the expected subscriber entries are what Knative's Trigger
reconciler puts on the Broker's channel with OIDC off (pkg/reconciler/broker/trigger/trigger.go:
the filter's /triggers/NS/NAME/UID, the Broker as reply, the Trigger's delivery else the
Broker's, as a whole, with the dead-letter sink resolved).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
import requests

from dev.pipeline import cloudevent
from dev.pipeline.broker import (
    PROBE_TYPE,
    Receiver,
    archive_line,
    channel_subscriber,
    dead_letter_line,
    resolve,
)

SERVICES = {
    "detect-failures": "http://127.0.0.1:8101/",
    "dead-letters": "http://127.0.0.1:8199/",
}
DLS_REF = {
    "ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "dead-letters"}
}
BROKER_DELIVERY = {
    "retry": 5,
    "backoffPolicy": "exponential",
    "backoffDelay": "PT0.5S",
    "deadLetterSink": DLS_REF,
}


def trigger(delivery: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "broker": "default",
        "subscriber": {
            "ref": {
                "apiVersion": "serving.knative.dev/v1",
                "kind": "Service",
                "name": "detect-failures",
            }
        },
    }
    if delivery is not None:
        spec["delivery"] = delivery
    return {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Trigger",
        "metadata": {
            "name": "detect-failures",
            "namespace": "kn-rescheduler",
            "uid": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
            "generation": 2,
        },
        "spec": spec,
    }


BROKER = {
    "metadata": {"name": "default", "namespace": "kn-rescheduler"},
    "spec": {"delivery": BROKER_DELIVERY},
}


@pytest.mark.parametrize(
    ("destination", "url"),
    [
        ({"ref": {"kind": "Service", "name": "detect-failures"}}, "http://127.0.0.1:8101/"),
        ({"uri": "http://sink.example/x"}, "http://sink.example/x"),
        (
            {"ref": {"kind": "Service", "name": "detect-failures"}, "uri": "/hook"},
            "http://127.0.0.1:8101/hook",
        ),
        ({"ref": {"kind": "Service", "name": "not-running-here"}}, None),
        (None, None),
        ({}, None),
    ],
    ids=[
        "a Service ref is its local URL",
        "a uri alone is itself",
        "a uri beside a ref is relative to it",
        "a Service that does not run resolves to nothing",
        "no destination",
        "an empty destination",
    ],
)
def test_a_destination_resolves_as_knatives_destination_rules_say(
    destination: dict[str, Any] | None, url: str | None
) -> None:
    assert resolve(destination, SERVICES) == url


def test_a_trigger_without_delivery_subscribes_with_the_brokers_delivery_and_its_sink() -> None:
    entry = channel_subscriber(
        trigger(None),
        BROKER,
        filter_url="http://broker-filter.knative-eventing.svc.cluster.local",
        broker_url="http://127.0.0.1:8380/kn-rescheduler/default",
        services=SERVICES,
    )
    assert entry == {
        "uid": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
        "generation": 2,
        "subscriberUri": "http://broker-filter.knative-eventing.svc.cluster.local/triggers/"
        "kn-rescheduler/detect-failures/7c9e6679-7425-40de-944b-e07fc1f90ae7",
        "replyUri": "http://127.0.0.1:8380/kn-rescheduler/default",
        "delivery": {
            "retry": 5,
            "backoffPolicy": "exponential",
            "backoffDelay": "PT0.5S",
            "deadLetterSink": {"uri": "http://127.0.0.1:8199/"},
        },
    }


def test_a_triggers_own_delivery_replaces_the_brokers_as_a_whole() -> None:
    entry = channel_subscriber(
        trigger({"retry": 0}),
        BROKER,
        filter_url="http://f",
        broker_url="http://b",
        services=SERVICES,
    )
    # No dead-letter sink and no backoff leak in from the Broker's spec.
    assert entry["delivery"] == {"retry": 0}


def test_a_dead_letter_sink_that_does_not_run_here_is_left_out_not_sent_nowhere() -> None:
    entry = channel_subscriber(
        trigger({"retry": 1, "deadLetterSink": {"ref": {"kind": "Service", "name": "gone"}}}),
        BROKER,
        filter_url="http://f",
        broker_url="http://b",
        services=SERVICES,
    )
    assert entry["delivery"] == {"retry": 1}


def dead_letter(code: str | None, body: bytes | None) -> cloudevent.Event:
    """An event as Knative's dispatcher sends it to a dead-letter sink (kncloudevents,
    dispatchExecutionInfoTransformers: the failed destination, status, base64 body)."""
    attrs = {
        "specversion": "1.0",
        "id": "e-1",
        "source": "/apis/v1/namespaces/x/pods/y",
        "type": "io.kn-rescheduler.pod.failing",
        "knativeerrordest": "http://127.0.0.1:8101/",
    }
    if code is not None:
        attrs["knativeerrorcode"] = code
    if body is not None:
        attrs["knativeerrordata"] = base64.b64encode(body).decode()
    return cloudevent.Event(attrs, b'{"pod":"y"}')


def test_a_dead_letter_names_the_trigger_the_status_and_the_answer_it_died_with() -> None:
    record = dead_letter_line(
        dead_letter("500", b"state corrupt"), {"http://127.0.0.1:8101/": "detect-failures"}
    )
    assert (record["trigger"], record["status"], record["reason"]) == (
        "detect-failures",
        500,
        "state corrupt",
    )
    assert record["subscriber"] == "http://127.0.0.1:8101/"
    assert record["event"]["id"] == "e-1" and record["event"]["data"] == {"pod": "y"}


def test_a_dead_letter_without_an_answer_has_no_status_and_no_reason() -> None:
    # Knative sets code -1 when the subscriber never answered (a refused connection).
    record = dead_letter_line(dead_letter("-1", None), {})
    assert (record["trigger"], record["status"], record["reason"]) == (None, None, None)


def test_a_receiver_records_events_skips_probes_and_refuses_what_is_not_an_event(
    tmp_path: Any,
) -> None:
    rx = Receiver(tmp_path / "archive.jsonl", archive_line).start()
    try:
        headers = {
            "ce-specversion": "1.0",
            "ce-id": "1",
            "ce-source": "s",
            "ce-type": "t",
            "content-type": "application/json",
        }
        assert requests.post(rx.url, data=b'{"a":1}', headers=headers, timeout=5).status_code == 202
        probe = {**headers, "ce-id": "2", "ce-type": PROBE_TYPE}
        assert requests.post(rx.url, data=b"{}", headers=probe, timeout=5).status_code == 202
        assert requests.post(rx.url, data=b"nope", timeout=5).status_code == 400
    finally:
        rx.stop()
    lines = (tmp_path / "archive.jsonl").read_text().splitlines()
    assert len(lines) == 1 and '"id":"1"' in lines[0] and '"data":{"a":1}' in lines[0]
    assert (rx.count, rx.probes) == (1, 1)
