"""What the fake kubelet writes on a deleted pod before it removes it (kubelet v1.36's
SyncTerminatingPod + TerminatePod), checked on realistic kubelet-written pods."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import pytest

from dev.localcluster.podstatus import (
    KUBELET_CONDITIONS,
    STATUS_UNKNOWN,
    STATUS_UNKNOWN_MESSAGE,
    has_pod_initialized,
    terminated_status,
)
from shared.api.kubetypes import ContainerStatus, Pod

from . import pods
from .pods import NOW, crash_looping, last_terminated, running, terminated, ts, waiting

JSON = dict[str, Any]
NOW_S = NOW.timestamp()
# pods.pod's kubelet conditions all moved at creation + 3 s.
EARLIER = ts(NOW - timedelta(minutes=5) - timedelta(seconds=2) + timedelta(seconds=3))
PULL_ERROR = (
    'Back-off pulling image "registry.example.com/shop/web:1.4.2": ErrImagePull: rpc error: '
    'code = Unknown desc = failed to pull and unpack image "registry.example.com/shop/web:1.4.2"'
)


def deleted(p: Pod) -> JSON:
    """The pod as the kubelet sees it after a graceful DELETE (deletionTimestamp, grace 30)."""
    out = cast(JSON, copy.deepcopy(p))
    out["metadata"]["deletionTimestamp"] = ts(NOW)
    out["metadata"]["deletionGracePeriodSeconds"] = 30
    out["metadata"]["generation"] = 1
    return out


def with_init(p: Pod, *, sidecar: bool = False) -> Pod:
    """The pod with its init container spec'd as a sidecar (restartPolicy Always) or not."""
    out = cast(JSON, copy.deepcopy(p))
    if sidecar:
        for c in out["spec"]["initContainers"]:
            c["restartPolicy"] = "Always"
    return cast(Pod, out)


def init_done(name: str = "migrate") -> ContainerStatus:
    """A regular init container that ran to completion (Ready, as the prober marks it)."""
    status = cast(JSON, terminated("Completed", 0, name=name, finished=NOW - timedelta(minutes=4)))
    status["ready"] = True
    return cast(ContainerStatus, status)


def sidecar_running(name: str = "proxy") -> ContainerStatus:
    return running(name)


def still_initializing() -> Pod:
    """Bound, sandbox up, its init container not started yet: nothing regular ever ran."""
    return pods.pod(
        phase="Pending",
        containers=[waiting("PodInitializing")],
        init_containers=[waiting("PodInitializing", name="migrate")],
    )


def evicted_by_the_eviction_api(p: Pod) -> JSON:
    """What POST pods/<name>/eviction leaves on the pod before its DELETE."""
    out = deleted(p)
    out["status"]["conditions"].insert(
        0,
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
            "lastProbeTime": None,
            "lastTransitionTime": ts(NOW - timedelta(seconds=1)),
        },
    )
    return out


@dataclass(frozen=True)
class Stopped:
    pod: Pod | JSON
    phase: str
    # Per container name: its final state (the whole block under ``state``).
    states: dict[str, JSON]
    ready_reason: str
    # Whether Ready/ContainersReady keep their earlier lastTransitionTime (False already).
    ready_kept: bool
    init_states: dict[str, JSON] | None = None
    initialized: tuple[str, str] = ("True", "")


CRASH = last_terminated("Error", 1, attempt=2)
ZERO = last_terminated("Completed", 0, attempt=2)
UNKNOWN = {
    "terminated": {"exitCode": 137, "reason": STATUS_UNKNOWN, "message": STATUS_UNKNOWN_MESSAGE}
}


def killed(name: str = "app", attempt: int = 0) -> JSON:
    """Exit 143 (SIGTERM), started when it started, finished now, same containerID."""
    c = cast(JSON, running(name, restarts=attempt))
    return {
        "terminated": {
            "exitCode": 143,
            "reason": "Error",
            "startedAt": c["state"]["running"]["startedAt"],
            "finishedAt": ts(NOW),
            "containerID": c["containerID"],
        }
    }


CASES = {
    "a running pod's container dies of SIGTERM and the pod fails": Stopped(
        deleted(pods.pod()),
        "Failed",
        {"app": killed()},
        "PodFailed",
        ready_kept=False,
    ),
    "a crash-looping pod is not restarted: its last crash is its final state": Stopped(
        deleted(pods.pod(containers=[crash_looping(restarts=3)])),
        "Failed",
        {"app": {"terminated": CRASH}},
        "PodFailed",
        ready_kept=True,
    ),
    "a pod whose process keeps exiting 0 in back-off ends Succeeded": Stopped(
        deleted(
            pods.pod(containers=[crash_looping(restarts=3, last_reason="Completed", exit_code=0)])
        ),
        "Succeeded",
        {"app": {"terminated": ZERO}},
        "PodCompleted",
        ready_kept=True,
        initialized=("True", "PodCompleted"),
    ),
    "a pod that cannot pull its image: unknown, exit 137, no times, still not ready": Stopped(
        deleted(pods.pod(phase="Pending", containers=[waiting("ImagePullBackOff", PULL_ERROR)])),
        "Failed",
        {"app": UNKNOWN},
        "ContainersNotReady",
        ready_kept=True,
    ),
    "a pod whose container cannot be created fails the same way": Stopped(
        deleted(
            pods.pod(
                phase="Pending",
                containers=[
                    waiting("CreateContainerError", 'failed to reserve container name "app_x"')
                ],
            )
        ),
        "Failed",
        {"app": UNKNOWN},
        "ContainersNotReady",
        ready_kept=True,
    ),
    "a pod past its init container that cannot pull has initialized: unknown too": Stopped(
        deleted(
            pods.pod(
                phase="Pending",
                containers=[waiting("ErrImagePull", PULL_ERROR)],
                init_containers=[init_done()],
            )
        ),
        "Failed",
        {"app": UNKNOWN},
        "ContainersNotReady",
        ready_kept=True,
        init_states={"migrate": cast(JSON, init_done())["state"]},
    ),
    "a pod still initializing keeps its containers waiting; its init container is unknown": Stopped(
        deleted(still_initializing()),
        "Failed",
        {"app": {"waiting": {"reason": "PodInitializing"}}},
        "ContainersNotReady",
        ready_kept=True,
        init_states={"migrate": UNKNOWN},
        initialized=("False", "ContainersNotInitialized"),
    ),
    "a running pod's sidecar dies of SIGTERM with it": Stopped(
        deleted(with_init(pods.pod(init_containers=[sidecar_running()]), sidecar=True)),
        "Failed",
        {"app": killed()},
        "PodFailed",
        ready_kept=False,
        init_states={"proxy": killed("proxy")},
    ),
    "a running pod evicted through the Eviction API fails like any deleted pod": Stopped(
        evicted_by_the_eviction_api(pods.pod()),
        "Failed",
        {"app": killed()},
        "PodFailed",
        ready_kept=False,
    ),
}


def conditions_of(status: JSON) -> dict[str, JSON]:
    return {c["type"]: c for c in status["conditions"]}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_deleted_pod_is_written_terminal_with_stopped_containers(case: Stopped) -> None:
    before = copy.deepcopy(case.pod)
    status = terminated_status(cast(JSON, case.pod), NOW_S)
    assert case.pod == before, "the pod must not be changed in place"
    assert status is not None
    assert status["phase"] == case.phase
    states = {s["name"]: s["state"] for s in status["containerStatuses"]}
    assert states == case.states
    for s in status["containerStatuses"]:
        assert s["ready"] is False and s["started"] is False
    if case.init_states is not None:
        assert {s["name"]: s["state"] for s in status["initContainerStatuses"]} == case.init_states
    else:
        assert "initContainerStatuses" not in status

    conds = conditions_of(status)
    assert [c["type"] for c in status["conditions"]] == list(KUBELET_CONDITIONS)
    for ctype in ("Ready", "ContainersReady"):
        assert conds[ctype]["status"] == "False"
        assert conds[ctype]["reason"] == case.ready_reason
        assert conds[ctype]["lastTransitionTime"] == (EARLIER if case.ready_kept else ts(NOW))
    # The sandbox is gone with the containers.
    assert conds["PodReadyToStartContainers"]["status"] == "False"
    assert conds["PodReadyToStartContainers"]["lastTransitionTime"] == ts(NOW)
    assert (
        conds["Initialized"]["status"],
        conds["Initialized"]["reason"] or "",
    ) == case.initialized
    assert conds["PodScheduled"]["status"] == "True"
    assert conds["PodScheduled"]["lastTransitionTime"] == EARLIER
    for c in status["conditions"]:
        assert c["observedGeneration"] == 1


def test_ready_says_which_containers_are_unready_while_they_never_ran() -> None:
    pod = deleted(pods.pod(phase="Pending", containers=[waiting("ImagePullBackOff", PULL_ERROR)]))
    status = terminated_status(pod, NOW_S)
    assert status is not None
    ready = conditions_of(status)["Ready"]
    assert ready["message"] == "containers with unready status: [app]"


def test_a_failed_pods_reason_and_message_of_an_earlier_state_are_cleared() -> None:
    # A strategic merge patch keeps what it does not mention: null deletes.
    status = terminated_status(deleted(pods.pod()), NOW_S)
    assert status is not None
    ready = conditions_of(status)["Ready"]
    assert ready["message"] is None


def test_conditions_the_kubelet_does_not_own_are_kept_and_come_first() -> None:
    pod = evicted_by_the_eviction_api(pods.pod(containers=[crash_looping(restarts=3)]))
    status = terminated_status(pod, NOW_S)
    assert status is not None
    # Not sent (the merge keeps DisruptionTarget as the Eviction API wrote it) ...
    assert "DisruptionTarget" not in conditions_of(status)
    # ... and ordered first, as generateAPIPodStatus lists them.
    assert status["$setElementOrder/conditions"] == [
        {"type": "DisruptionTarget"},
        *({"type": t} for t in KUBELET_CONDITIONS),
    ]


TERMINAL = {
    "an evicted pod": pods.evicted(),
    "a completed Job pod": pods.pod(
        owner=("Job", "report"),
        phase="Succeeded",
        containers=[terminated("Completed", 0)],
    ),
    "a Job pod that failed": pods.pod(
        owner=("Job", "report"), phase="Failed", containers=[terminated("Error", 1)]
    ),
}


@pytest.mark.parametrize("pod", TERMINAL.values(), ids=TERMINAL.keys())
def test_a_pod_terminal_already_gets_no_more_status(pod: Pod) -> None:
    assert terminated_status(deleted(pod), NOW_S) is None


INITIALIZED = {
    "a pod without init containers": (
        pods.pod(phase="Pending", containers=[waiting("ErrImagePull")]),
        True,
    ),
    "a pod whose init container completed": (
        pods.pod(
            phase="Pending", containers=[waiting("ErrImagePull")], init_containers=[init_done()]
        ),
        True,
    ),
    "a pod whose regular container ran once": (
        pods.pod(
            containers=[crash_looping()],
            init_containers=[waiting("PodInitializing", name="migrate")],
        ),
        True,
    ),
    "a pod whose sidecar has started": (
        with_init(
            pods.pod(
                phase="Pending",
                containers=[waiting("PodInitializing")],
                init_containers=[sidecar_running()],
            ),
            sidecar=True,
        ),
        True,
    ),
    "a pod still in its init container": (still_initializing(), False),
    "a pod whose init container failed": (
        pods.pod(
            phase="Pending",
            containers=[waiting("PodInitializing")],
            init_containers=[crash_looping("migrate")],
        ),
        False,
    ),
}


@pytest.mark.parametrize(("pod", "expected"), INITIALIZED.values(), ids=INITIALIZED.keys())
def test_a_pod_has_initialized_once_a_regular_container_could_have_started(
    pod: Pod, expected: bool
) -> None:
    assert has_pod_initialized(cast(JSON, pod)) is expected


def test_a_pod_deleted_before_any_status_gets_every_container_unknown() -> None:
    pod = deleted(pods.pod(phase="Pending", started=None))
    pod["status"] = {"phase": "Pending"}
    status = terminated_status(pod, NOW_S)
    assert status is not None
    assert status["phase"] == "Failed"
    (app,) = status["containerStatuses"]
    assert app["name"] == "app" and app["state"] == UNKNOWN
    assert app["image"] == pods.IMAGE and app["imageID"] == ""
