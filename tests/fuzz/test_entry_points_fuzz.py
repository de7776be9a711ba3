"""Every HTTP entry point, fuzzed through functions-framework's test client: CloudEvents in
binary and structured mode with any headers, content types and data, AdmissionReviews of any
shape, malformed and oversized bodies.

What Knative and the API server need from the answers:
- an event function answers 2xx, 400 (malformed, not retried), 413 (a body over its size
  limit, shared.platform.bodies; not retried either) or 503 (transient, retried); never another
  5xx, which a Broker retries and then dead-letters for a body that will never
  parse. A pod with a field of the wrong type is malformed too (detect-failures answers 400);
  a pod of the API server's types never is;
- the webhook answers 200 with ``allowed: true`` for every review with a request uid, 400 for
  a body it cannot answer, 413 for one over its size limit, and never fails: a patch that
  comes back must apply to the pod.

No Kubernetes API is reachable here: update-annotations and the webhook use a kubeconfig whose
server refuses every connection (a real transient failure), so no fuzzed event can move a
pod. Unhandled exceptions propagate into the test (``PROPAGATE_EXCEPTIONS``) instead of
becoming a generic 500, so a failure names its exception.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flask.testing
import jsonpatch
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shared.api.keys import (
    EVENT_POD_FAILING,
    PING_EVENT_TYPE,
    POLICY_ANNOTATION,
    STATE_ANNOTATION,
)
from shared.platform.bodies import EVENT_MAX_BODY
from tests.fuzz import strategies as s
from tests.handlers.conftest import ClientFactory
from tests.unit import pods
from tests.unit.apivalidation import api_server_errors

# The client is made once per test and reused by every example (the `clients` fixture).
HTTP = settings(
    deadline=None,
    suppress_health_check=[
        *settings().suppress_health_check,
        HealthCheck.function_scoped_fixture,
    ],
)
pytestmark = pytest.mark.usefixtures("quiet_logs")

EVENT_ANSWERS = {200, 202, 400}


def answers_for(request: tuple[dict[str, str], bytes]) -> set[int]:
    """What an event function may answer ``request``: 413 too when its body is over the limit."""
    return EVENT_ANSWERS | ({413} if len(request[1]) > EVENT_MAX_BODY else set())


def event_type(request: tuple[dict[str, str], bytes]) -> str | None:
    """The CloudEvent type ``request`` carries: its ce-type header (binary mode), else the
    type in its JSON body (structured mode); None when neither says."""
    headers, body = request
    lowered = {k.lower(): v for k, v in headers.items()}
    if "ce-type" in lowered:
        return lowered["ce-type"]
    try:
        found = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    kind = found.get("type") if isinstance(found, dict) else None
    return kind if isinstance(kind, str) else None


# How detect-failures words a 400 for a pod with a field of the wrong type
# (shared.pods.detect_failures.decide).
MALFORMED = "not a pod the API server sends"


Clients = Callable[..., flask.testing.FlaskClient]


@pytest.fixture
def clients(function_client: ClientFactory) -> Clients:
    """The test client of a function with the given environment, made once per test and
    reused by every example (importing a function costs more than most requests, and keeps
    nothing between requests that matters here)."""
    made: dict[tuple[str, tuple[tuple[str, str], ...]], flask.testing.FlaskClient] = {}

    def get(name: str, **env: str) -> flask.testing.FlaskClient:
        key = (name, tuple(sorted(env.items())))
        if key not in made:
            client = function_client(name, **env)
            client.application.config["PROPAGATE_EXCEPTIONS"] = True
            made[key] = client
        return made[key]

    return get


def answer(client: flask.testing.FlaskClient, request: tuple[dict[str, str], bytes]) -> Any:
    """The function's answer to a POST, counted by status (hypothesis' statistics)."""
    headers, body = request
    response = client.post("/", headers=headers, data=body)
    event(f"answered {response.status_code}")
    return response


def error_of(response: Any) -> str:
    try:
        return str(json.loads(response.data).get("error", ""))
    except (ValueError, AttributeError):
        return str(response.data[:200].decode("utf-8", "replace"))


# -- detect-failures ------------------------------------------------------------------------


@HTTP
@given(request=s.cloudevents(s.mutated_pods | s.well_typed_pods))
def test_detect_failures_answers_any_event_with_200_202_or_400(
    clients: Clients, request: tuple[dict[str, str], bytes]
) -> None:
    client = clients("detect-failures")
    response = answer(client, request)
    assert response.status_code in answers_for(request), error_of(response)
    if response.status_code == 200:
        assert response.headers["ce-type"] == EVENT_POD_FAILING
        json.loads(response.data)


@HTTP
@given(request=s.wellformed_events(s.KNOWN_POD_TYPES, s.well_typed_pods))
def test_detect_failures_answers_any_pod_a_broker_delivers_with_200_202_or_400(
    clients: Clients, request: tuple[dict[str, str], bytes]
) -> None:
    client = clients("detect-failures")
    response = answer(client, request)
    assert response.status_code in answers_for(request), error_of(response)
    # Every field of the type the API server gives it: never refused for its shape.
    assert not error_of(response).startswith(MALFORMED), error_of(response)


# -- update-annotations and sweep-failures --------------------------------------------------


@settings(HTTP, max_examples=s.examples(0.4))
@given(
    request=s.cloudevents(s.failing_data)
    | s.wellformed_events(st.just(EVENT_POD_FAILING), s.failing_data)
)
def test_update_annotations_answers_any_event_with_202_400_or_503(
    clients: Clients,
    unreachable_kubeconfig: Path,
    request: tuple[dict[str, str], bytes],
) -> None:
    client = clients("update-annotations", KUBECONFIG=str(unreachable_kubeconfig))
    response = answer(client, request)
    assert response.status_code in answers_for(request) - {200} | {503}, error_of(response)


@settings(HTTP, max_examples=s.examples(0.25))
@given(request=s.cloudevents(s.json_values))
def test_sweep_failures_answers_any_tick_with_400_or_503(
    clients: Clients,
    unreachable_kubeconfig: Path,
    request: tuple[dict[str, str], bytes],
) -> None:
    client = clients(
        "sweep-failures",
        KUBECONFIG=str(unreachable_kubeconfig),
        K_SINK="http://127.0.0.1:9/",
    )
    response = answer(client, request)
    # Only the PingSource's tick starts a sweep, whose list then fails: transient. Any other
    # event that parses is not a tick: nothing to do.
    allowed = {400, 503} if event_type(request) == PING_EVENT_TYPE else {202, 400}
    allowed |= answers_for(request) - EVENT_ANSWERS
    assert response.status_code in allowed, error_of(response)


@settings(HTTP, max_examples=s.examples(0.25))
@given(
    name=st.sampled_from(["detect-failures", "update-annotations", "sweep-failures"]),
    method=st.sampled_from(["GET", "PUT", "PATCH", "DELETE", "OPTIONS"]),
    path=st.sampled_from(["/", "/metrics", "/x"]),
)
def test_event_functions_refuse_other_methods_without_failing(
    clients: Clients, unreachable_kubeconfig: Path, name: str, method: str, path: str
) -> None:
    client = clients(name, KUBECONFIG=str(unreachable_kubeconfig))
    response = client.open(path, method=method)
    assert response.status_code < 500, error_of(response)


# -- mutate-admission -----------------------------------------------------------------------

POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
# Bare pods carry their own policy and state, so the webhook patches them without any lookup:
# the answers with a patch to check.
BARE_STATE = '{"version":2,"moves":1,"excludedNodes":["node-a","Bad_Name!","node-b"]}'
bare_pods = st.builds(
    lambda policy, state, affinity: pods.new_pod(
        owner=None,
        annotations={POLICY_ANNOTATION: policy, STATE_ANNOTATION: state},
        affinity=affinity,
    ),
    st.sampled_from(["0", "2", "100", "x"]),
    st.sampled_from([BARE_STATE, "", "{"]) | st.text(max_size=5),
    st.none() | st.just({"nodeAffinity": {}}),
)
admitted_objects = st.one_of(
    s.mutated(bare_pods, well_typed=True),
    s.mutated(s.realistic_pods),
    s.well_typed_pods,
    s.json_values,
)


@st.composite
def admission_requests(draw: st.DrawFn) -> dict[str, Any]:
    """An AdmissionReview's request, usually what the API server sends, one or two fields
    missing or of another shape now and then."""
    request: dict[str, Any] = {
        "uid": draw(st.uuids().map(str) | st.uuids().map(str) | s.json_values),
        "kind": draw(st.sampled_from([POD_KIND, POD_KIND, {"kind": "Node"}]) | s.json_values),
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": draw(
            st.sampled_from(["CREATE", "CREATE", "CREATE", "UPDATE"]) | s.json_values
        ),
        "namespace": draw(st.sampled_from(["shop", "shop", "kube-system", ""]) | s.json_values),
        "object": draw(admitted_objects),
        "dryRun": draw(st.booleans()),
    }
    for key in draw(st.lists(st.sampled_from(sorted(request)), max_size=2)):
        request.pop(key, None)
    return request


reviews = st.one_of(
    st.builds(
        lambda request: {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request,
        },
        admission_requests(),
    ),
    st.fixed_dictionaries({"request": admission_requests() | s.json_values}),
    s.json_values,
)
review_bodies = st.one_of(
    reviews.map(lambda review: json.dumps(review).encode()),
    st.binary(max_size=100),
    s.depths.map(lambda depth: s.nested(depth).encode()),
    s.depths.map(
        lambda depth: (
            '{"request": {"uid": "u", "operation": "CREATE", "kind": {"kind": "Pod"}, '
            '"namespace": "shop", "object": {"metadata": {"labels": ' + s.nested(depth) + "}}}}"
        ).encode()
    ),
)


def expected_uid(body: bytes) -> str | None:
    """The request uid the webhook must answer for, or None when there is nothing to answer."""
    try:
        review = json.loads(body or b"null")
    except (ValueError, RecursionError):
        return None
    request = review.get("request") if isinstance(review, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) and uid else None


@HTTP
@given(body=review_bodies)
def test_the_webhook_allows_every_review_with_a_uid_and_refuses_the_rest_with_400(
    clients: Clients, unreachable_kubeconfig: Path, body: bytes
) -> None:
    client = clients("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    response = answer(client, ({"content-type": "application/json"}, body))
    uid = expected_uid(body)
    if uid is None:
        assert response.status_code == 400, error_of(response)
        return
    assert response.status_code == 200, error_of(response)
    verdict = response.get_json()["response"]
    assert verdict["uid"] == uid
    assert verdict["allowed"] is True
    if "patch" in verdict:
        event("patched")
        pod = json.loads(body)["request"].get("object")
        # Only for a pod that was sent: a patch made for anything else cannot apply to it.
        assert isinstance(pod, dict) and isinstance(pod.get("metadata"), dict), pod
        patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(verdict["patch"])))
        if not api_server_errors(pod):
            assert api_server_errors(patched) == []


LIMIT = 4096


@settings(HTTP, max_examples=s.examples(0.5))
@given(size=st.sampled_from([LIMIT - 1, LIMIT, LIMIT + 1]) | st.integers(2, 3 * LIMIT))
def test_the_webhook_answers_413_exactly_past_its_size_limit(
    clients: Clients, unreachable_kubeconfig: Path, size: int
) -> None:
    client = clients(
        "mutate-admission",
        KUBECONFIG=str(unreachable_kubeconfig),
        KN_RESCHEDULER_WEBHOOK_MAX_BODY_BYTES=str(LIMIT),
    )
    review = json.dumps({"request": {"uid": "u"}})
    # Whitespace is valid JSON between tokens: the same review, any size from its own up.
    body = (review[:-1] + " " * max(size - len(review), 0) + "}").encode()
    response = client.post("/", data=body, content_type="application/json")
    if len(body) > LIMIT:
        assert response.status_code == 413
    else:
        assert response.status_code in (200, 400), error_of(response)
