"""The success paths of the functions that need the API server, still through
functions-framework's test client, against the real local control plane."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shared.api.keys import EVENT_POD_FAILING, EVENT_POD_RESCHEDULED, STATE_ANNOTATION
from shared.platform.kube import Kube
from tests.e2e.conftest import Loop, pod_template, wait_for
from tests.e2e.knative_manifests import kubeconfig_for, service_account_token
from tests.e2e.test_rescheduling import failing_pod, only
from tests.handlers.conftest import ClientFactory, cloudevent, reply_of

pytestmark = pytest.mark.e2e


def replicaset_preferring(api: Kube, namespace: str, bad: str, annotations: dict[str, str]) -> None:
    api.create(
        "ReplicaSet",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "web", "annotations": annotations},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": pod_template({"app": "web"}, bad),
            },
        },
    )


def test_update_annotations_answers_200_with_the_rescheduled_event(
    cluster: Any,
    namespace: str,
    api: Kube,
    loop: Loop,
    faults: Callable[..., None],
    function_client: ClientFactory,
) -> None:
    bad = cluster.nodes[0]
    faults("crashloop", bad)
    replicaset_preferring(api, namespace, bad, {"scheduling-retries": "2"})
    pod = wait_for("a failing pod", lambda: failing_pod(api, loop, namespace))
    event = loop.failing_event(pod)
    assert event is not None
    client = function_client("update-annotations", KUBECONFIG=str(cluster.kubeconfig))
    headers, body = cloudevent(EVENT_POD_FAILING, event.data, subject=event.subject)

    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 200
    attrs, data = reply_of(response)
    assert attrs["type"] == EVENT_POD_RESCHEDULED
    assert attrs["source"] == "/kn-rescheduler/update-annotations"
    assert (data["moves"], data["budget"], data["excludedNodes"]) == (1, 2, [bad])
    assert data["workload"] == {"kind": "ReplicaSet", "name": "web"}

    # The same event again: already handled, nothing to emit.
    assert client.post("/", headers=headers, data=body).status_code == 202


def test_mutate_admission_patches_a_pod_of_a_workload_with_exclusions(
    cluster: Any, namespace: str, api: Kube, function_client: ClientFactory
) -> None:
    state = '{"excludedNodes":["node-3"],"handled":[],"moves":1,"version":1}'
    rs = api.create(
        "ReplicaSet",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": "web",
                "annotations": {"scheduling-retries": "3", STATE_ANNOTATION: state},
            },
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "web"}},
                "template": pod_template({"app": "web"}, "node-0"),
            },
        },
    )
    pod = {
        "metadata": {
            "generateName": "web-",
            "labels": {"app": "web"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web",
                    "uid": rs["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": pod_template({"app": "web"}, "node-0")["spec"],
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "e911857d-c318-11e8-bbad-025000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": namespace,
            "object": pod,
        },
    }
    client = function_client("mutate-admission", KUBECONFIG=str(cluster.kubeconfig))
    answer = client.post("/", json=review).get_json()["response"]
    assert answer["allowed"] is True
    assert answer["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(answer["patch"]))
    paths = {op["path"] for op in ops}
    assert "/metadata/annotations" in paths  # the pod had no annotations map at all
    assert any(p.startswith("/spec/affinity/nodeAffinity/required") for p in paths)
    assert only(api, "ReplicaSet", namespace)["metadata"]["name"] == "web"


def test_rbac_refusal_is_answered_500_so_the_event_is_dead_lettered_not_lost(
    cluster: Any,
    namespace: str,
    api: Kube,
    loop: Loop,
    faults: Callable[..., None],
    function_client: ClientFactory,
    tmp_path: Path,
) -> None:
    bad = cluster.nodes[1]
    faults("imagepull", bad)
    replicaset_preferring(api, namespace, bad, {"scheduling-retries": "2"})
    pod = wait_for("a failing pod", lambda: failing_pod(api, loop, namespace))
    event = loop.failing_event(pod)
    assert event is not None
    # A ServiceAccount with no rights at all: the API server answers 403 for real.
    api.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        body={"metadata": {"name": "powerless"}},
        write=True,
    )
    token = service_account_token(cluster.api_client(), "powerless", namespace)
    kubeconfig = kubeconfig_for(cluster.server, cluster.ca_file, token, tmp_path / "kc")
    client = function_client("update-annotations", KUBECONFIG=str(kubeconfig))
    headers, body = cloudevent(EVENT_POD_FAILING, event.data, subject=event.subject)

    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 500
    # The RBAC message stays in the log; the answer says a person is needed and where to look.
    assert "cannot act, needs a person" in response.get_json()["error"]
    assert (
        api.get("Pod", namespace, pod["metadata"]["name"])["metadata"]["uid"]
        == pod["metadata"]["uid"]
    )


def test_a_corrupt_state_annotation_is_never_overwritten(
    cluster: Any,
    namespace: str,
    api: Kube,
    loop: Loop,
    faults: Callable[..., None],
    function_client: ClientFactory,
) -> None:
    bad = cluster.nodes[2]
    faults("imagepull", bad)
    corrupt = '{"version": 1, "moves": "many"'
    replicaset_preferring(
        api, namespace, bad, {"scheduling-retries": "2", STATE_ANNOTATION: corrupt}
    )
    pod = wait_for("a failing pod", lambda: failing_pod(api, loop, namespace))
    event = loop.failing_event(pod)
    assert event is not None
    client = function_client("update-annotations", KUBECONFIG=str(cluster.kubeconfig))
    headers, body = cloudevent(EVENT_POD_FAILING, event.data, subject=event.subject)

    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 500
    assert "cannot act, needs a person" in response.get_json()["error"]
    rs = api.get("ReplicaSet", namespace, "web")
    assert rs["metadata"]["annotations"][STATE_ANNOTATION] == corrupt
    assert (
        api.get("Pod", namespace, pod["metadata"]["name"])["metadata"]["uid"]
        == pod["metadata"]["uid"]
    )
