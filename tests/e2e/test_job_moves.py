"""What a move costs a Job, on the real control plane, through the whole pipeline.

The real Job controller counts removed pods against backoffLimit (pkg/controller/job); these
tests hold kn-rescheduler to never failing a Job by moving its pod, and to making the move
free when the Job ignores disruptions (the webhook adds that rule on request). The fake
kubelet terminates an evicted pod like a real one (phase Failed, then gone once the Job
controller released its finalizer), so the Job controller sees what it would see on a node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from dev.stack.stack import Stack
from shared.api.keys import (
    IGNORE_DISRUPTIONS_ANNOTATION,
    POLICY_ANNOTATION,
    REASON_JOB_RETRIES_SPENT,
    REASON_MOVE_WOULD_FAIL_JOB,
    REASON_RESCHEDULED,
)
from shared.platform.kube import Kube
from tests.e2e.conftest import pod_template, state_of, wait_for
from tests.e2e.test_rescheduling import events_for, pods

pytestmark = pytest.mark.e2e

SETTLE = 90.0
# pkg/controller/job: DefaultJobPodFailureBackOff.
JOB_POD_FAILURE_BACKOFF = 10.0
IGNORE_DISRUPTIONS = {
    "action": "Ignore",
    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
}


@pytest.fixture(scope="module")
def stack(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The pipeline for this module only: it acts on every namespace."""
    workdir = tmp_path_factory.mktemp("stack")
    with Stack(
        cluster.kubeconfig, cluster.api_client(), workdir, cluster.log_dir, sweep_every=None
    ) as running:
        yield running


def a_job(
    name: str,
    bad: str,
    *,
    restart: str = "Never",
    backoff_limit: int = 0,
    free_moves: bool = False,
    retries: str = "3",
) -> dict[str, Any]:
    annotations = {POLICY_ANNOTATION: retries}
    if free_moves:
        annotations[IGNORE_DISRUPTIONS_ANNOTATION] = "true"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": pod_template({"app": name}, bad, restartPolicy=restart),
        },
    }


def job_status(api: Kube, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = api.get("Job", namespace, name).get("status") or {}
    return status


def conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status.get("conditions") or []}


def ready_false_since(pod: dict[str, Any]) -> float:
    """When the pod became not Ready (epoch seconds): the Job controller's finish time for a
    pod whose containers never ran, from which its pod-failure back-off runs."""
    for c in pod.get("status", {}).get("conditions") or []:
        if c["type"] == "Ready" and c["status"] == "False":
            return datetime.strptime(c["lastTransitionTime"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    raise AssertionError(f"no Ready=False condition: {pod.get('status')}")


@dataclass(frozen=True)
class Replaced:
    # Seconds from the moment the pod was being removed to the moment a replacement existed.
    seconds: float
    node: str
    # What was left of the Job controller's 10 s pod-failure back-off at the removal.
    backoff_left: float


def watch_replacement(api: Kube, namespace: str, bad: str) -> Replaced:
    """Watch (polling every 0.1 s) the Job's pod on ``bad`` being removed and replaced."""
    first: dict[str, Any] = wait_for(
        "the Job's pod to land on the faulty node",
        lambda: next((p for p in pods(api, namespace) if p["spec"].get("nodeName") == bad), None),
        timeout=SETTLE,
    )
    uid = first["metadata"]["uid"]
    removed_at: float | None = None
    backoff_left = 0.0
    last = first

    def replaced() -> Replaced | None:
        nonlocal removed_at, backoff_left, last
        live = pods(api, namespace)
        mine = [p for p in live if p["metadata"]["uid"] == uid]
        if mine:
            last = mine[0]
        if removed_at is None and (not mine or mine[0]["metadata"].get("deletionTimestamp")):
            removed_at = time.monotonic()
            left = ready_false_since(last) + JOB_POD_FAILURE_BACKOFF - time.time()
            backoff_left = max(0.0, left)
        others = [p for p in live if p["metadata"]["uid"] != uid]
        if removed_at is None or not others:
            return None
        node = str(others[0]["spec"].get("nodeName") or "")
        return Replaced(time.monotonic() - removed_at, node, backoff_left)

    found: Replaced = wait_for(
        "a replacement after the move", replaced, SETTLE, every=0.1, seen=lambda: last
    )
    return found


def test_a_job_with_backoff_limit_0_that_ignores_disruptions_completes_after_a_free_move(
    cluster: Any, namespace: str, api: Kube, stack: Stack, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[2]
    faults("imagepull", bad)
    created = api.create("Job", namespace, a_job("report", bad, free_moves=True))
    # The webhook gave the Job the rule at creation (the only moment it can be set).
    assert created["spec"]["podFailurePolicy"] == {"rules": [IGNORE_DISRUPTIONS]}
    assert created["spec"]["podReplacementPolicy"] == "Failed"

    replaced = watch_replacement(api, namespace, bad)
    wait_for(
        "the Job to complete",
        lambda: conditions(job_status(api, namespace, "report")).get("Complete") == "True",
        timeout=SETTLE,
    )
    status = job_status(api, namespace, "report")
    assert status.get("failed", 0) == 0, status
    assert replaced.node in ("", *set(cluster.nodes) - {bad})
    state = state_of(api, "Job", namespace, "report")
    assert state.moves == 1 and state.excluded_nodes == (bad,)
    (said,) = events_for(api, namespace, "report", REASON_RESCHEDULED)
    assert "does not count the move" in said["message"]
    print(
        f"\nreplacement {replaced.seconds:.2f} s after the eviction "
        f"({replaced.backoff_left:.1f} s of the Job's back-off were left)"
    )
    # The pod never started, so the Job controller's back-off (10 s, ignored failures too)
    # runs from its Ready=False transition. On a real cluster a pull counts as failing after
    # 30 s, so none of it is left; on the local clock (1 s) most of it may be. Past it, only
    # the kubelet's stop and the Job controller's batching (about a second).
    assert replaced.seconds < replaced.backoff_left + 3.0, replaced


def test_a_move_that_would_fail_the_job_is_not_made_and_a_warning_says_why(
    cluster: Any, namespace: str, api: Kube, stack: Stack, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[2]
    faults("imagepull", bad)
    created = api.create("Job", namespace, a_job("batch", bad))
    assert "podFailurePolicy" not in created["spec"]

    warned = wait_for(
        "a MoveWouldFailJob Warning on the Job",
        lambda: events_for(api, namespace, "batch", REASON_MOVE_WOULD_FAIL_JOB),
        timeout=SETTLE,
    )
    assert warned[0]["type"] == "Warning"
    assert "backoffLimit 0" in warned[0]["message"]
    assert "ignore-disruptions" in warned[0]["message"]
    # The pod is still where it failed, and the Job is neither failed nor charged.
    (left,) = pods(api, namespace)
    assert left["spec"]["nodeName"] == bad and not left["metadata"].get("deletionTimestamp")
    status = job_status(api, namespace, "batch")
    assert status.get("failed", 0) == 0 and "Failed" not in conditions(status)
    assert state_of(api, "Job", namespace, "batch").moves == 0


def test_an_on_failure_job_pays_one_retry_per_move_and_is_warned_of_its_last(
    cluster: Any, namespace: str, api: Kube, stack: Stack, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[2]
    faults("imagepull", bad)
    # OnFailure cannot have a pod failure policy: asking changes nothing, said in the log.
    created = api.create(
        "Job",
        namespace,
        a_job("nightly", bad, restart="OnFailure", backoff_limit=1, free_moves=True),
    )
    assert "podFailurePolicy" not in created["spec"]
    wait_for(
        "the Job to complete",
        lambda: conditions(job_status(api, namespace, "nightly")).get("Complete") == "True",
        timeout=SETTLE,
    )
    # The move was one failed pod for the Job controller, its last retry, and said so.
    assert job_status(api, namespace, "nightly").get("failed") == 1
    assert state_of(api, "Job", namespace, "nightly").moves == 1
    (warning,) = events_for(api, namespace, "nightly", REASON_JOB_RETRIES_SPENT)
    assert warning["type"] == "Warning"
    assert "1 failure(s) against backoffLimit 1" in warning["message"]


def test_a_job_made_from_a_cronjob_that_asks_gets_free_moves_too(
    cluster: Any, namespace: str, api: Kube, stack: Stack, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[2]
    faults("imagepull", bad)
    # The policy and the request on the CronJob itself, whose annotations the CronJob
    # controller does not copy onto its Jobs: the webhook reads them.
    template = a_job("nightly", bad)
    cron = api.create(
        "CronJob",
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {
                "name": "nightly",
                "annotations": {POLICY_ANNOTATION: "3", IGNORE_DISRUPTIONS_ANNOTATION: "true"},
            },
            "spec": {
                "schedule": "0 3 * * *",
                "suspend": True,
                "jobTemplate": {"spec": template["spec"]},
            },
        },
    )
    # What `kubectl create job nightly-manual --from=cronjob/nightly` sends.
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "nightly-manual",
            "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "CronJob",
                    "name": "nightly",
                    "uid": cron["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": template["spec"],
    }
    created = api.create("Job", namespace, job)
    assert created["spec"]["podFailurePolicy"] == {"rules": [IGNORE_DISRUPTIONS]}
    wait_for(
        "the Job to complete",
        lambda: conditions(job_status(api, namespace, "nightly-manual")).get("Complete") == "True",
        timeout=SETTLE,
    )
    assert job_status(api, namespace, "nightly-manual").get("failed", 0) == 0
    assert state_of(api, "Job", namespace, "nightly-manual").moves == 1
