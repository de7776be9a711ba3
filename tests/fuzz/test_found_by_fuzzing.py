"""What the fuzzers found, each as its minimal example, and the fix it pins.

All in input no API server sends but a forged, corrupted or hand-made event, review or
annotation can carry. Each was a 500 (which Knative retries, then dead-letters, for a body that
will never change), a state we could not read back, or an answer the caller could not use.
These tests keep the shrunk example of each, so a regression shows up here by name, not only
as a random draw of `make fuzz`; the fuzzers hold the product to the same contracts on any
input.

All nine are fixed; a new finding is pinned here as a strict xfail until its fix lands.
"""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shared.api.keys import APISERVER_UPDATE, EVENT_POD_FAILING, EXCLUDED_NODES_ANNOTATION
from shared.api.state import PodEntry, StateError, WorkloadState, dump_state, load_state
from shared.api.times import parse_kube_time
from shared.platform import events, logs
from shared.platform.config import Config
from shared.pods.detect_failures.decide import detect
from shared.pods.sweep_failures.handler import find_failures
from shared.workloads.classify import classify, excluded_nodes_of
from shared.workloads.podshape import MalformedPod, judged, malformed
from shared.workloads.policy import (
    parse_retries,
)
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

# parse_kube_time converted with astimezone(UTC), which raises OverflowError for year 1 with a
# positive offset or year 9999 with a negative one: a 500 from every function that read such a
# timestamp. Fixed: OverflowError reads as an unreadable timestamp (None), like any other.
OUT_OF_RANGE = "0001-01-01T00:00:00+00:01"


def test_a_timestamp_out_of_range_in_utc_reads_as_unreadable() -> None:
    assert parse_kube_time(OUT_OF_RANGE) is None


def test_a_state_updated_at_out_of_range_is_a_state_error() -> None:
    with pytest.raises(StateError):
        load_state('{"version": 2, "updatedAt": "9999-12-31T23:59:59-01:00"}')


def crash_loop_started_at(started_at: str) -> dict[str, Any]:
    status = pods.crash_looping(restarts=4)
    pod = pods.pod(containers=[status])
    pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["startedAt"] = started_at
    return dict(pod)


def test_a_crash_loop_with_an_out_of_range_start_is_judged_like_an_unreadable_one() -> None:
    unreadable = classify(crash_loop_started_at("not a time"), Config(), NOW)  # type: ignore[arg-type]
    assert unreadable is not None
    assert classify(crash_loop_started_at(OUT_OF_RANGE), Config(), NOW) == unreadable  # type: ignore[arg-type]


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
# recursed twice per level, so it failed past about 450 levels on the path that logs a 4xx
# event in full. Fixed: wherever JSON from outside is parsed (a binary or structured event,
# the webhook's body, the excluded-nodes stamp, the state), RecursionError is malformed input
# like any other; redact stops at REDACT_MAX_DEPTH levels and logs a placeholder below.


def test_a_deeply_nested_excluded_nodes_stamp_reads_as_none() -> None:
    pod = pods.pod(annotations={EXCLUDED_NODES_ANNOTATION: nested(2_000)})
    assert excluded_nodes_of(pod) == ()


def test_a_deeply_nested_state_is_a_state_error() -> None:
    with pytest.raises(StateError):
        load_state(nested(2_000))


def test_redacting_json_nested_just_under_what_json_loads_follows_logs_a_placeholder() -> None:
    redacted = logs.redact(json.loads(nested(900)))
    for _ in range(logs.REDACT_MAX_DEPTH):
        redacted = redacted[0]
    assert isinstance(redacted, str) and "not logged" in redacted


@pytest.mark.parametrize("depth", [600, 100_000], ids=["logged-too-deep", "parsed-too-deep"])
def test_detect_failures_answers_a_nested_binary_event_with_400(
    function_client: ClientFactory, depth: int
) -> None:
    client = function_client("detect-failures")
    assert client.post("/", headers=BINARY, data=nested(depth).encode()).status_code == 400


def test_detect_failures_answers_a_nested_structured_event_with_400(
    function_client: ClientFactory,
) -> None:
    client = function_client("detect-failures")
    headers = {"content-type": "application/cloudevents+json"}
    assert client.post("/", headers=headers, data=nested(2_000).encode()).status_code == 400


def test_update_annotations_answers_nested_failing_data_with_400(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("update-annotations", KUBECONFIG=str(unreachable_kubeconfig))
    headers = {**BINARY, "ce-type": EVENT_POD_FAILING}
    assert client.post("/", headers=headers, data=nested(600).encode()).status_code == 400


def test_the_webhook_answers_a_nested_body_with_400(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    response = client.post("/", data=nested(100_000).encode(), content_type="application/json")
    assert response.status_code == 400


# -- F3: fields of the wrong type -------------------------------------------------------------

# The classifier assumes every field has the type the API server gives it; a pod with another
# (a forged or hand-made event) raised AttributeError or TypeError, and detect-failures
# answered 500, which the Broker retries and dead-letters. Fixed: when the decision code trips
# over a field, shared.workloads.podshape checks the pod against what the API server writes and
# raises MalformedPod naming the field; detect-failures answers 400, the sweep skips the pod. A
# crash on a pod of the right shape is still a crash: that is a bug of ours, not malformed input.
ILL_TYPED = pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        (("metadata",), 2_147_483_648, "pod.metadata must be an object"),
        (("metadata", "namespace"), {"a": 1}, "pod.metadata.namespace must be str"),
        (("status",), "Running", "pod.status must be an object"),
        (
            ("status", "containerStatuses"),
            [None],
            "pod.status.containerStatuses[0] must be an object, not null",
        ),
        (
            ("status", "containerStatuses", 0, "state"),
            "waiting",
            "pod.status.containerStatuses[0].state must be an object",
        ),
    ],
    ids=[
        "metadata-a-number",
        "namespace-an-object",
        "status-a-string",
        "container-status-null",
        "container-state-a-string",
    ],
)


def with_field(path: tuple[str | int, ...], value: object) -> dict[str, Any]:
    """The crash-looping pod of a ReplicaSet with one field replaced."""
    pod: dict[str, Any] = copy.deepcopy(dict(pods.pod(containers=[pods.crash_looping()])))
    parent: Any = pod
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return pod


@ILL_TYPED
def test_classify_refuses_a_pod_with_a_field_of_the_wrong_type_as_malformed(
    path: tuple[str | int, ...], value: object, says: str
) -> None:
    pod = with_field(path, value)
    with pytest.raises(MalformedPod, match=f"^{re.escape(says)}"):
        classify(pod, Config(), NOW)  # type: ignore[arg-type]
    assert malformed(pod) is not None


@ILL_TYPED
def test_the_sweep_skips_a_pod_with_a_field_of_the_wrong_type_and_finds_the_others(
    path: tuple[str | int, ...], value: object, says: str
) -> None:
    failing = pods.pod("db-0", owner=("StatefulSet", "db"), containers=[pods.crash_looping()])
    found = find_failures([with_field(path, value), failing], Config(), NOW)
    assert [(f.namespace, f.name) for f in found] == [("shop", "db-0")]


def test_detect_failures_answers_a_pod_with_a_field_of_the_wrong_type_with_400(
    function_client: ClientFactory,
) -> None:
    client = function_client("detect-failures")
    pod = with_field(("status", "containerStatuses"), [None])
    headers, body = cloudevent(APISERVER_UPDATE, pod, **SUBJECT)
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 400
    assert "containerStatuses[0] must be an object" in response.get_json()["error"]


def test_a_crash_on_a_pod_of_the_right_shape_is_still_a_crash() -> None:
    # What keeps the fuzzers able to find the next bug: only a pod the API server could not
    # have sent turns a crash into MalformedPod.
    pod = pods.pod(containers=[pods.crash_looping()])
    assert malformed(pod) is None
    with pytest.raises(TypeError), judged(pod):
        raise TypeError("a bug of ours")


# -- F4: a zero-padded policy -----------------------------------------------------------------


# parse_retries refused more than six digits before reading the value (to keep int() away
# from absurd strings), so "0000003" was refused as "more than the maximum of 100", which it
# is not. Fixed: the length is bounded after the leading zeros.
@pytest.mark.parametrize("value", ["0000003", "0000000000100"])
def test_a_zero_padded_policy_within_the_maximum_is_read(value: str) -> None:
    assert parse_retries(value) == int(value)


# -- F5: years before 1000 --------------------------------------------------------------------

# format_time used strftime("%Y"), which writes the year 999 as "999", not "0999":
# load_state then refused the state we wrote (a hand-edited entry read fine was written back
# unreadable), and update-annotations answered 500 for that workload until a person edited
# it. Fixed: years are written with four digits.


def test_a_state_updated_in_an_early_year_reads_back() -> None:
    state = WorkloadState(moves=1, updated_at=datetime(999, 1, 1, tzinfo=UTC))
    assert load_state(dump_state(state)) == state


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


# Admitter.decide read a null object as {} and mutate() added an empty metadata to it, so the
# answer carried `add /metadata {}`: a patch for a pod that was not sent. The API server
# always sends the pod; a forged review got it. Fixed: a review whose object is not a JSON
# object with metadata is allowed without a patch.
@pytest.mark.parametrize(
    "obj",
    [None, [], {"spec": {"containers": [{"name": "app", "image": "nginx"}]}}],
    ids=["null", "a-list", "no-metadata"],
)
def test_the_webhook_answers_a_review_without_a_pod_without_a_patch(
    function_client: ClientFactory, unreachable_kubeconfig: Path, obj: object
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
            "object": obj,
        },
    }
    response = client.post("/", json=review)
    assert response.status_code == 200
    assert response.get_json()["response"] == {
        "uid": "e3e70682-c209-4cac-629f-6fbed82c07cd",
        "allowed": True,
    }


# -- F7: a pod without a uid ------------------------------------------------------------------


# detect-failures checked that a pod had a name and a namespace, not a uid; a failing pod
# without one was forwarded, and update-annotations refused the event (400: it needs the uid
# for its delete precondition), so the event was dropped one hop later than it should be.
# Stored pods always have a uid, so only a forged event did this. Fixed: detect() refuses a
# pod without a non-empty string uid (BadEvent, 400), as it does one without a name.
@pytest.mark.parametrize("uid", [None, "", 42], ids=["missing", "empty", "a-number"])
def test_detect_refuses_a_failing_pod_without_a_uid(uid: object) -> None:
    pod = pods.pod(containers=[pods.crash_looping(restarts=4)])
    if uid is None:
        del pod["metadata"]["uid"]
    else:
        pod["metadata"]["uid"] = uid
    event = events.Event("1", "s", APISERVER_UPDATE, {"kind": "Pod"}, dict(pod))
    with pytest.raises(events.BadEvent, match=r"metadata\.uid"):
        detect(event, Config(), NOW)


def test_detect_failures_answers_a_failing_pod_without_a_uid_with_400(
    function_client: ClientFactory,
) -> None:
    client = function_client("detect-failures")
    pod = pods.pod(containers=[pods.crash_looping(restarts=4)])
    del pod["metadata"]["uid"]
    headers, body = cloudevent(APISERVER_UPDATE, dict(pod), **SUBJECT)
    assert client.post("/", headers=headers, data=body).status_code == 400


# -- F8: a null restart count -----------------------------------------------------------------

# The shape check let any leaf be null, but only a timestamp can be:
# metav1.Time marshals its zero value as null, while restartCount is a plain int32 the API
# server always writes. So a pod with `"restartCount": null` counts as well shaped, the
# crash-loop rule's `in_a_row < restarts` raises TypeError, and it is re-raised as a bug of
# ours: detect-failures answered 500. Found by test_one_field_fuzz.py. Fixed in
# shared/workloads/podshape.py: null passes only for timestamp fields (the TIME leaf shape); the
# pod is then malformed: MalformedPod, 400, skipped by the sweep, like F3.
NULL_RESTART_COUNT = ("status", "containerStatuses", 0, "restartCount")


def test_classify_refuses_a_pod_whose_restart_count_is_null_as_malformed() -> None:
    pod = with_field(NULL_RESTART_COUNT, None)
    with pytest.raises(MalformedPod, match=r"restartCount must be int, not null"):
        classify(pod, Config(), NOW)  # type: ignore[arg-type]


def test_detect_failures_answers_a_pod_whose_restart_count_is_null_with_400(
    function_client: ClientFactory,
) -> None:
    client = function_client("detect-failures")
    headers, body = cloudevent(APISERVER_UPDATE, with_field(NULL_RESTART_COUNT, None), **SUBJECT)
    assert client.post("/", headers=headers, data=body).status_code == 400


# -- F9: the sweep and a malformed stamp on a failing pod -----------------------------------


# find_failures caught MalformedPod around the decisions, but built the failing-pod event
# (FailingPod.from_pod, which reads the excluded-nodes stamp) outside that try: a failing pod
# whose stamp is not a string raises MalformedPod out of the sweep, which then judges none of
# the other pods of its page. detect-failures builds it inside and answers 400. The sweep
# lists pods from the API server, whose annotations are always strings, so only a caller of
# find_failures with other data meets it. Found by test_one_field_fuzz.py. Fixed: the sweep
# builds FailingPod.from_pod inside the try, as detect does.
def test_the_sweep_skips_a_failing_pod_whose_excluded_nodes_stamp_is_not_a_string() -> None:
    stamped = with_field(("metadata", "annotations", EXCLUDED_NODES_ANNOTATION), 7)
    failing = pods.pod("db-0", owner=("StatefulSet", "db"), containers=[pods.crash_looping()])
    found = find_failures([stamped, failing], Config(), NOW)
    assert [(f.namespace, f.name) for f in found] == [("shop", "db-0")]
