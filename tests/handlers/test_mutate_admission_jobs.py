"""mutate-admission on Job CREATE: the ignore-disruptions rule, through functions-framework."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any, cast

import jsonpatch

from shared.api.keys import IGNORE_DISRUPTIONS_ANNOTATION
from tests.handlers.conftest import ClientFactory
from tests.unit.test_jobs import IGNORE_DISRUPTIONS, job


def job_review(obj: object) -> dict[str, object]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "9c0b7f3e-1d2a-4c55-8e61-0f7a9b3c2d10",
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
            "resource": {"group": "batch", "version": "v1", "resource": "jobs"},
            "operation": "CREATE",
            "namespace": "shop",
            "object": obj,
        },
    }


def test_a_job_that_asks_for_free_moves_gets_the_rule_without_any_lookup(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    submitted = job(annotations={IGNORE_DISRUPTIONS_ANNOTATION: "true"})
    answer = client.post("/", json=job_review(submitted)).get_json()["response"]
    assert answer["allowed"] is True
    assert answer["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(answer["patch"]))
    created = cast(dict[str, Any], jsonpatch.apply_patch(copy.deepcopy(submitted), patch))
    assert created["spec"]["podFailurePolicy"] == {"rules": [IGNORE_DISRUPTIONS]}
    assert created["spec"]["podReplacementPolicy"] == "Failed"


def test_a_job_that_did_not_ask_is_allowed_unchanged(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    answer = client.post("/", json=job_review(job())).get_json()["response"]
    assert answer == {"uid": "9c0b7f3e-1d2a-4c55-8e61-0f7a9b3c2d10", "allowed": True}


def test_a_cronjobs_job_is_allowed_unchanged_when_its_cronjob_cannot_be_read(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    made = job()
    made["metadata"]["annotations"] = {}
    made["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "name": "nightly",
            "uid": "0d6c1b2a-8f3e-4b7d-9a51-6e2f4c8b1a37",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    response = client.post("/", json=job_review(made))
    assert response.status_code == 200
    assert response.get_json()["response"] == {
        "uid": "9c0b7f3e-1d2a-4c55-8e61-0f7a9b3c2d10",
        "allowed": True,
    }
