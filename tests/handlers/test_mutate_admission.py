"""mutate-admission through functions-framework: it answers allowed, whatever happens."""

from __future__ import annotations

import json
from pathlib import Path

from tests.handlers.conftest import ClientFactory
from tests.unit import pods


def review(operation: str = "CREATE", kind: str = "Pod", obj: object = None) -> dict[str, object]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": operation,
            "namespace": "shop",
            "object": obj if obj is not None else pods.pod(node=None, stamp=None),
        },
    }


def test_the_pod_is_allowed_unpatched_when_the_api_server_cannot_be_reached(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    response = client.post("/", json=review())
    assert response.status_code == 200
    answer = response.get_json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_a_bare_pod_with_a_policy_is_stamped_without_any_lookup(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    bare = pods.pod(owner=None, node=None, stamp=None, annotations={"scheduling-retries": "2"})
    answer = client.post("/", json=review(obj=bare)).get_json()["response"]
    assert answer["allowed"] is True
    # The user's own annotation is the policy: nothing to add, no exclusions yet.
    assert "patch" not in answer


def test_other_operations_and_kinds_are_allowed_untouched(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    for body in (review(operation="UPDATE"), review(kind="Service", obj={"metadata": {}})):
        answer = client.post("/", json=body).get_json()["response"]
        assert answer == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_a_body_without_a_request_uid_gets_400(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    assert client.post("/", data=b"not json").status_code == 400
    assert client.post("/", data=json.dumps({"request": {}})).status_code == 400
