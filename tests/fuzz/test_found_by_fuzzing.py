"""What the fuzzers found, each as its minimal example, until the product is fixed.

Every test here is a strict xfail: it fails today for the reason given, and the day the fix
lands it passes, which a strict xfail reports as a failure. Then remove its marker and the
matching entry of tests/fuzz/known.py (the fuzzers stop tolerating the bug from then on).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shared import events
from shared.classify import classify, excluded_nodes_of
from shared.config import Config
from shared.constants import APISERVER_UPDATE, EVENT_POD_FAILING, EXCLUDED_NODES_ANNOTATION
from shared.detect import detect
from shared.policy import parse_kube_time, parse_retries
from shared.state import PodEntry, StateError, WorkloadState, dump_state, load_state
from tests.fuzz.strategies import nested
from tests.handlers.conftest import ClientFactory, cloudevent
from tests.unit import pods
from tests.unit.pods import NOW

SUBJECT = {"subject": "/apis/v1/namespaces/shop/pods/web-7d9c8b6f4-x2x9z", "kind": "Pod"}
BINARY = {
    "ce-specversion": "1.0",
    "ce-id": "0b4c3c5e-1f0e-4d8b-9a55-3f1f4b1f2a11",
    "ce-source": "https://10.96.0.1:443",
    "ce-type": APISERVER_UPDATE,
    "content-type": "application/json",
}

# -- F1: timestamps valid in RFC 3339 but out of Python's range once in UTC ------------------

# parse_kube_time converts with astimezone(UTC), which raises OverflowError for year 1 with a
# positive offset or year 9999 with a negative one. Fix: catch OverflowError there too and
# return None, like any unreadable timestamp.
F1 = pytest.mark.xfail(
    strict=True, raises=OverflowError, reason="F1: a timestamp out of range in UTC raises"
)
OUT_OF_RANGE = "0001-01-01T00:00:00+00:01"


@F1
def test_a_timestamp_out_of_range_in_utc_reads_as_unreadable() -> None:
    assert parse_kube_time(OUT_OF_RANGE) is None


@F1
def test_a_state_updated_at_out_of_range_is_a_state_error() -> None:
    with pytest.raises(StateError):
        load_state('{"version": 2, "updatedAt": "9999-12-31T23:59:59-01:00"}')


def crash_loop_started_at(started_at: str) -> dict[str, Any]:
    status = pods.crash_looping(restarts=4)
    pod = pods.pod(containers=[status])
    pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["startedAt"] = started_at
    return dict(pod)


@F1
def test_a_crash_loop_with_an_out_of_range_start_is_judged_like_an_unreadable_one() -> None:
    unreadable = classify(crash_loop_started_at("not a time"), Config(), NOW)  # type: ignore[arg-type]
    assert unreadable is not None
    assert classify(crash_loop_started_at(OUT_OF_RANGE), Config(), NOW) == unreadable  # type: ignore[arg-type]


@pytest.mark.xfail(strict=True, reason="F1 through detect-failures: a 500, retried for nothing")
def test_detect_failures_answers_a_pod_with_an_out_of_range_timestamp(
    function_client: ClientFactory,
) -> None:
    client = function_client("detect-failures")
    headers, body = cloudevent(APISERVER_UPDATE, crash_loop_started_at(OUT_OF_RANGE), **SUBJECT)
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 200
    assert response.headers["ce-type"] == EVENT_POD_FAILING


# -- F2: deeply nested JSON -------------------------------------------------------------------

# json.loads raises RecursionError (not ValueError) past about 1,000 levels, and logs.redact
# recurses twice per level (comprehensions are frames), so it fails past about 450 levels, on
# the path that logs a 4xx event in full. Fix: catch RecursionError wherever JSON from outside
# is parsed (events._parse_binary and _parse_with_sdk, the webhook's body, excluded_nodes_of,
# state._load) and make redact iterative, or stop at a depth and log a placeholder.
F2 = pytest.mark.xfail(strict=True, reason="F2: deeply nested JSON raises RecursionError")


@F2
def test_a_deeply_nested_excluded_nodes_stamp_reads_as_none() -> None:
    pod = pods.pod(annotations={EXCLUDED_NODES_ANNOTATION: nested(2_000)})
    assert excluded_nodes_of(pod) == ()


@F2
def test_a_deeply_nested_state_is_a_state_error() -> None:
    with pytest.raises(StateError):
        load_state(nested(2_000))


@F2
@pytest.mark.parametrize("depth", [600, 100_000], ids=["logged-too-deep", "parsed-too-deep"])
def test_detect_failures_answers_a_nested_binary_event_with_400(
    function_client: ClientFactory, depth: int
) -> None:
    client = function_client("detect-failures")
    assert client.post("/", headers=BINARY, data=nested(depth).encode()).status_code == 400


@F2
def test_detect_failures_answers_a_nested_structured_event_with_400(
    function_client: ClientFactory,
) -> None:
    client = function_client("detect-failures")
    headers = {"content-type": "application/cloudevents+json"}
    assert client.post("/", headers=headers, data=nested(2_000).encode()).status_code == 400


@F2
def test_update_annotations_answers_nested_failing_data_with_400(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("update-annotations", KUBECONFIG=str(unreachable_kubeconfig))
    headers = {**BINARY, "ce-type": EVENT_POD_FAILING}
    assert client.post("/", headers=headers, data=nested(600).encode()).status_code == 400


@F2
def test_the_webhook_answers_a_nested_body_with_400(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    response = client.post("/", data=nested(100_000).encode(), content_type="application/json")
    assert response.status_code == 400


# -- F3: fields of the wrong type -------------------------------------------------------------

# The classifier assumes every field has the type the API gives it; a pod with another (a
# forged or hand-made event: the API server never sends one) raises, and detect-failures
# answers 500, which the Broker retries and dead-letters. Fix: check once the shape of the
# fields the classifier reads (metadata, its annotations, labels and ownerReferences; spec;
# status, its conditions and container statuses and their states), answer 400 in
# detect-failures, skip the pod in the sweep, and return None from classify, stuck_pending and
# unschedulable_due_to_exclusions.
F3 = pytest.mark.xfail(
    strict=True,
    raises=(AttributeError, TypeError),
    reason="F3: a pod with a field of the wrong type crashes the classifier",
)


def with_field(path: tuple[str | int, ...], value: object) -> dict[str, Any]:
    pod: dict[str, Any] = copy.deepcopy(dict(pods.pod(containers=[pods.crash_looping()])))
    parent: Any = pod
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return pod


@F3
@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("metadata",), 2_147_483_648),
        (("metadata", "namespace"), {"a": 1}),
        (("status",), "Running"),
        (("status", "containerStatuses"), [None]),
        (("status", "containerStatuses", 0, "state"), "waiting"),
    ],
    ids=[
        "metadata-a-number",
        "namespace-an-object",
        "status-a-string",
        "container-status-null",
        "container-state-a-string",
    ],
)
def test_classify_leaves_a_pod_with_a_field_of_the_wrong_type_alone(
    path: tuple[str | int, ...], value: object
) -> None:
    assert classify(with_field(path, value), Config(), NOW) is None  # type: ignore[arg-type]


@pytest.mark.xfail(strict=True, reason="F3 through detect-failures: a 500, retried for nothing")
def test_detect_failures_answers_a_pod_with_a_field_of_the_wrong_type_without_a_5xx(
    function_client: ClientFactory,
) -> None:
    client = function_client("detect-failures")
    pod = with_field(("status", "containerStatuses"), [None])
    headers, body = cloudevent(APISERVER_UPDATE, pod, **SUBJECT)
    assert client.post("/", headers=headers, data=body).status_code in (202, 400)


# -- F4: a zero-padded policy -----------------------------------------------------------------


# parse_retries refuses more than six digits before reading the value (to keep int() away
# from absurd strings), so "0000003" is refused as "more than the maximum of 100", which it is
# not. Fix: bound the length after the leading zeros, len(value.lstrip("0")) > 6.
@pytest.mark.xfail(strict=True, reason="F4: a zero-padded policy is refused as too large")
def test_a_zero_padded_policy_within_the_maximum_is_read() -> None:
    assert parse_retries("0000003") == 3


# -- F5: years before 1000 --------------------------------------------------------------------

# format_kube_time uses strftime("%Y"), which writes the year 999 as "999", not "0999":
# load_state then refuses the state we wrote (a hand-edited entry read fine is written back
# unreadable), and update-annotations answers 500 for that workload until a person edits it.
# Fix: write four digits, value.astimezone(UTC).isoformat(timespec="seconds") with "Z".
F5 = pytest.mark.xfail(
    strict=True, raises=StateError, reason="F5: a year before 1000 is written unreadably"
)


@F5
def test_a_state_updated_in_an_early_year_reads_back() -> None:
    state = WorkloadState(moves=1, updated_at=datetime(999, 1, 1, tzinfo=UTC))
    assert load_state(dump_state(state)) == state


@F5
def test_a_hand_edited_pod_entry_with_an_early_year_survives_a_rewrite() -> None:
    text = json.dumps(
        {
            "version": 2,
            "moves": 1,
            "pods": {"db-0": {"moves": 1, "updatedAt": "0999-01-01T00:00:00Z"}},
        }
    )
    state = load_state(text)
    assert state.per_pod["db-0"] == PodEntry(moves=1, updated_at=datetime(999, 1, 1, tzinfo=UTC))
    assert load_state(dump_state(state)) == state


# -- F6: a review without a pod ---------------------------------------------------------------


# Admitter.decide reads a null object as {} and mutate() adds an empty metadata to it, so the
# answer carries `add /metadata {}`: a patch for a pod that was not sent. The API server
# always sends the pod; a forged review gets it. Fix: answer without a patch when
# request.object is not a JSON object (and let mutate() leave a missing metadata alone when it
# stamps nothing).
@pytest.mark.xfail(strict=True, reason="F6: a review without a pod is answered with a patch")
def test_the_webhook_answers_a_review_without_a_pod_without_a_patch(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "e3e70682-c209-4cac-629f-6fbed82c07cd",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "shop",
            "object": None,
        },
    }
    response = client.post("/", json=review)
    assert response.status_code == 200
    assert response.get_json()["response"] == {
        "uid": "e3e70682-c209-4cac-629f-6fbed82c07cd",
        "allowed": True,
    }


# -- F7: a pod without a uid ------------------------------------------------------------------


# detect-failures checks that a pod has a name and a namespace, not a uid; a failing pod
# without one is forwarded, and update-annotations refuses the event (400: it needs the uid for
# its delete precondition), so the event is dropped one hop later than it should be. Stored
# pods always have a uid, so only a forged event does this. Fix: check the uid in detect() with
# the name and namespace (BadEvent, 400).
@pytest.mark.xfail(strict=True, reason="F7: a pod without a uid is forwarded")
def test_detect_refuses_a_failing_pod_without_a_uid() -> None:
    pod = pods.pod(containers=[pods.crash_looping(restarts=4)])
    del pod["metadata"]["uid"]
    event = events.Event("1", "s", APISERVER_UPDATE, {"kind": "Pod"}, dict(pod))
    with pytest.raises(events.BadEvent):
        detect(event, Config(), NOW)
