"""detect-failures through functions-framework: which failures are worth a move (issue 11).

Each case is a pod shaped like a kubelet writes it, posted as ApiServerSource would; the
answer says whether a Broker would see a failing-pod event (200) or nothing to do (202).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.api.keys import APISERVER_UPDATE, EVENT_POD_FAILING
from tests.handlers.conftest import ClientFactory, cloudevent, reply_of
from tests.unit import pods

SOURCE_ATTRS = {"subject": "/apis/v1/namespaces/shop/pods/web-7d9c8b6f4-x2x9z", "kind": "Pod"}


def post(client: Any, data: Any) -> Any:
    headers, body = cloudevent(APISERVER_UPDATE, data, **SOURCE_ATTRS)
    return client.post("/", headers=headers, data=body)


def test_a_pod_that_turned_rescheduling_off_is_still_forwarded_when_our_exclusions_block_it(
    function_client: ClientFactory,
) -> None:
    response = post(
        function_client("detect-failures"), pods.unschedulable(excluded=["node-a"], stamp="0")
    )
    assert response.status_code == 200
    attrs, data = reply_of(response)
    assert attrs["type"] == EVENT_POD_FAILING
    assert data["kind"] == "exclusions-unschedulable"


def test_a_pod_that_turned_rescheduling_off_is_not_forwarded_for_a_node_failure(
    function_client: ClientFactory,
) -> None:
    pod = pods.pod(stamp="0", containers=[pods.crash_looping(restarts=9)])
    assert post(function_client("detect-failures"), pod).status_code == 202


def test_an_unschedulable_pod_that_never_opted_in_is_forwarded_if_it_carries_our_exclusions(
    function_client: ClientFactory,
) -> None:
    pod = pods.unschedulable(excluded=["node-a"], stamp=None)
    assert post(function_client("detect-failures"), pod).status_code == 200


LEFT_ALONE = {
    "a pod labelled kn-rescheduler.io/ignore after creation": pods.pod(
        labels={"app": "web", "kn-rescheduler.io/ignore": "true"},
        containers=[pods.crash_looping(restarts=9)],
    ),
    "a container OOM-killed at its own limit once": pods.pod(
        containers=[pods.crash_looping(restarts=1, last_reason="OOMKilled", exit_code=137)]
    ),
    "an image that does not exist": pods.pod(
        phase="Pending",
        containers=[pods.waiting("ErrImagePull", "registry.example.com/shop/web:9: not found")],
    ),
}


@pytest.mark.parametrize("pod", LEFT_ALONE.values(), ids=LEFT_ALONE.keys())
def test_failures_no_node_can_fix_get_202(function_client: ClientFactory, pod: Any) -> None:
    assert post(function_client("detect-failures"), pod).status_code == 202


def test_the_failing_event_says_how_long_the_container_ran_not_how_old_the_pod_is(
    function_client: ClientFactory,
) -> None:
    now = datetime.now(UTC)
    pod = pods.pod(started=now - timedelta(minutes=45), containers=[pods.crash_looping(restarts=5)])
    response = post(function_client("detect-failures"), pod)
    assert response.status_code == 200
    _, data = reply_of(response)
    assert data["ranForSeconds"] == 3


def _evicted_at_its_own_limit() -> Any:
    """The kubelet's eviction for a container's own ephemeral-storage limit: phase Failed,
    reason Evicted, containerEphemeralStorageMessageFmt (pkg/kubelet/eviction/helpers.go),
    no DisruptionTarget condition (eviction_manager.go passes none for limit evictions)."""
    return pods.pod(
        phase="Failed",
        reason="Evicted",
        message='Container app exceeded its local ephemeral storage limit "1Gi". ',
        containers=[pods.terminated("Error", 137)],
    )


def test_an_eviction_at_the_pods_own_limit_gets_202(function_client: ClientFactory) -> None:
    assert post(function_client("detect-failures"), _evicted_at_its_own_limit()).status_code == 202


def test_a_container_the_runtime_never_started_is_forwarded_with_no_time_run(
    function_client: ClientFactory,
) -> None:
    # containerd's failed start (internal/cri/server/container_start.go): StartError, 128, and
    # startedAt as the kubelet converts containerd's 0 ns (kuberuntime_container.go).
    now = datetime.now(UTC)
    status = pods.crash_looping(restarts=3)
    status["lastState"] = {
        "terminated": {
            **pods.last_terminated("StartError", 128, attempt=2, finished=now),
            "startedAt": "1970-01-01T00:00:00Z",
            "message": "failed to create containerd task: failed to create shim task: OCI "
            "runtime create failed: runc create failed: unable to start container process: "
            "error during container init: error setting cgroup config for procHooks "
            "process: unable to freeze: unknown",
        }
    }
    response = post(function_client("detect-failures"), pods.pod(started=now, containers=[status]))
    assert response.status_code == 200
    _, data = reply_of(response)
    assert data["reason"] == "CrashLoopBackOff"
    assert data["ranForSeconds"] == 0
