"""Which pods are failing in a way another node could fix, and which are left alone."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import NamedTuple

import pytest

from shared.classify import (
    Failure,
    FailureKind,
    classify,
    excluded_nodes_of,
    policy_of,
    skip_reason,
    stuck_pending,
    unschedulable_due_to_exclusions,
)
from shared.config import Config
from shared.kubetypes import Pod
from shared.policy import InvalidPolicy

from . import pods
from .pods import NOW, crash_looping, last_terminated, running, terminated, waiting

CFG = Config()


class Moved(NamedTuple):
    pod: Pod
    reason: str
    container: str | None
    init_container: bool = False


MOVED = {
    "a crash-looping container at the restart threshold is moved": Moved(
        pods.pod(containers=[crash_looping(restarts=3)]), "CrashLoopBackOff", "app"
    ),
    "a healthy sidecar does not hide a crash-looping main container": Moved(
        pods.pod(containers=[running("istio-proxy"), crash_looping("app", restarts=5)]),
        "CrashLoopBackOff",
        "app",
    ),
    "a crash-looping main container is found even when it is listed first": Moved(
        pods.pod(containers=[crash_looping("app", restarts=4), running("log-shipper")]),
        "CrashLoopBackOff",
        "app",
    ),
    "a crash-looping init container is moved": Moved(
        pods.pod(
            phase="Pending",
            init_containers=[crash_looping("migrate-db", restarts=3)],
            containers=[waiting("PodInitializing")],
        ),
        "CrashLoopBackOff",
        "migrate-db",
        True,
    ),
    "an OOM kill in lastState of a container waiting to restart is moved": Moved(
        pods.pod(containers=[crash_looping(restarts=1, last_reason="OOMKilled", exit_code=137)]),
        "OOMKilled",
        "app",
    ),
    "an OOM kill in the current state is moved": Moved(
        pods.pod(containers=[terminated("OOMKilled", 137, restarts=2)]), "OOMKilled", "app"
    ),
    "a Job pod that failed because its container was OOM killed is moved": Moved(
        pods.pod(
            "nightly-report-28512345-7xk2q",
            owner=("Job", "nightly-report-28512345"),
            phase="Failed",
            containers=[terminated("OOMKilled", 137)],
        ),
        "OOMKilled",
        "app",
    ),
    "an evicted pod is moved": Moved(pods.evicted(), "Evicted", None),
    "a pod the kubelet rejected for lack of cpu is moved": Moved(
        pods.pod(
            phase="Failed",
            reason="OutOfcpu",
            message="Pod was rejected: Node didn't have enough resource: cpu, requested: 500",
            containers=[waiting("ContainerCreating")],
        ),
        "OutOfcpu",
        None,
    ),
    "a pod failed by a graceful node shutdown is moved": Moved(
        pods.pod(
            phase="Failed",
            reason="Terminated",
            message="Pod was terminated in response to imminent node shutdown.",
            containers=[terminated("Error", 143)],
        ),
        "Terminated",
        None,
    ),
    "a container the runtime cannot run is moved": Moved(
        pods.pod(
            containers=[
                waiting(
                    "RunContainerError",
                    "failed to create containerd task: failed to create shim task: OCI runtime "
                    "create failed: runc create failed: unable to start container process: "
                    'error during container init: error mounting "/var/lib/kubelet/pods"',
                    restarts=1,
                )
            ]
        ),
        "RunContainerError",
        "app",
    ),
    "an image that cannot be pulled on this node is moved": Moved(
        pods.pod(
            phase="Pending",
            containers=[
                waiting(
                    "ImagePullBackOff",
                    'Back-off pulling image "registry.example.com/shop/web:1.4.2"',
                )
            ],
        ),
        "ImagePullBackOff",
        "app",
    ),
    "a bare pod without any owner is moved": Moved(
        pods.pod("debug-shell", owner=None, containers=[crash_looping(restarts=6)]),
        "CrashLoopBackOff",
        "app",
    ),
}


@pytest.mark.parametrize("case", MOVED.values(), ids=MOVED.keys())
def test_failing_pods_are_moved(case: Moved) -> None:
    failure = classify(case.pod, CFG)
    assert failure is not None
    assert failure.kind is FailureKind.NODE_FIXABLE
    assert failure.reason == case.reason
    assert failure.container == case.container
    assert failure.init_container is case.init_container
    assert failure.node == "node-b"
    assert "node-b" in failure.why


LEFT_ALONE = {
    "a healthy pod": pods.pod(),
    "a crash loop below the restart threshold": pods.pod(containers=[crash_looping(restarts=2)]),
    "a container that was OOM killed long ago and runs again": pods.pod(
        containers=[
            running(restarts=1, last=last_terminated("OOMKilled", 137, attempt=0)),
        ]
    ),
    "a missing ConfigMap or Secret (fails on every node)": pods.pod(
        phase="Pending",
        containers=[waiting("CreateContainerConfigError", 'configmap "web-config" not found')],
    ),
    "an invalid image name (fails on every node)": pods.pod(
        phase="Pending",
        containers=[
            waiting(
                "InvalidImageName",
                'Failed to apply default image tag "registry.example.com/Shop/web": '
                "couldn't parse image name",
            )
        ],
    ),
    "an image that must never be pulled and is absent": pods.pod(
        phase="Pending",
        containers=[waiting("ErrImageNeverPull", 'Container image "web:dev" is not present')],
    ),
    "a crash-looping sidecar next to a container that can never start": pods.pod(
        containers=[
            crash_looping("istio-proxy", restarts=5),
            waiting("CreateContainerConfigError", 'secret "web-tls" not found'),
        ]
    ),
    "a pod that completed": pods.pod(
        "nightly-report-28512345-7xk2q",
        owner=("Job", "nightly-report-28512345"),
        phase="Succeeded",
        containers=[terminated("Completed", 0)],
    ),
    "a failed pod whose failure is the application's": pods.pod(
        owner=("Job", "nightly-report-28512345"),
        phase="Failed",
        containers=[terminated("Error", 2)],
    ),
    "a pod already being deleted": pods.pod(deleting=True, containers=[crash_looping(restarts=9)]),
    "a DaemonSet pod": pods.pod(
        "node-exporter-8kd2x",
        owner=("DaemonSet", "node-exporter"),
        containers=[crash_looping(restarts=9)],
    ),
    "a static pod's mirror": pods.mirror(),
    "a pod in kube-system": pods.pod(
        "coredns-5d78c9869d-4xv7n", "kube-system", containers=[crash_looping(restarts=9)]
    ),
    "a pod in the rescheduler's own namespace": pods.pod(
        "detect-failures-00001-deployment-6c4f9-abcde",
        "kn-rescheduler",
        containers=[crash_looping(restarts=9)],
    ),
    "a pending pod without a node and without exclusions": pods.unschedulable(excluded=None),
    "a pending pod without a node whose exclusions list is empty": pods.unschedulable(excluded=[]),
    "a pod still starting on its node": pods.pending_on_node(timedelta(seconds=20)),
}


@pytest.mark.parametrize("pod", LEFT_ALONE.values(), ids=LEFT_ALONE.keys())
def test_pods_that_are_not_node_failures_are_left_alone(pod: Pod) -> None:
    assert classify(pod, CFG) is None


def test_the_why_names_the_container_the_restarts_and_the_last_exit() -> None:
    failure = classify(pods.pod(containers=[crash_looping(restarts=4, exit_code=2)]), CFG)
    assert failure is not None
    assert failure.restart_count == 4
    assert "container app" in failure.why
    assert "4 restarts" in failure.why
    assert "code 2" in failure.why
    assert failure.message.startswith("back-off 80s restarting failed container=app")


def test_an_evicted_pod_carries_the_kubelets_message() -> None:
    failure = classify(pods.evicted(node="node-c"), CFG)
    assert failure is not None
    assert failure.node == "node-c"
    assert "low on resource: memory" in failure.message


def test_a_pod_level_failure_wins_over_container_failures() -> None:
    p = pods.evicted()
    p["status"]["containerStatuses"] = [crash_looping(restarts=8)]
    failure = classify(p, CFG)
    assert failure is not None
    assert failure.reason == "Evicted"


def test_init_containers_are_reported_before_containers() -> None:
    p = pods.pod(
        init_containers=[crash_looping("migrate-db", restarts=3)],
        containers=[crash_looping("app", restarts=3)],
    )
    failure = classify(p, CFG)
    assert failure is not None
    assert (failure.container, failure.init_container) == ("migrate-db", True)


class Unschedulable(NamedTuple):
    excluded: list[str] | None
    expected: bool


UNSCHEDULABLE = {
    "an unschedulable pod carrying our exclusions": Unschedulable(["node-a", "node-b"], True),
    "an unschedulable pod with no exclusions": Unschedulable(None, False),
    "an unschedulable pod with an empty exclusions list": Unschedulable([], False),
}


@pytest.mark.parametrize("case", UNSCHEDULABLE.values(), ids=UNSCHEDULABLE.keys())
def test_unschedulable_pods_count_only_when_they_carry_our_exclusions(
    case: Unschedulable,
) -> None:
    p = pods.unschedulable(excluded=case.excluded)
    failure = classify(p, CFG)
    assert (failure is not None) is case.expected
    assert (unschedulable_due_to_exclusions(p, CFG) is not None) is case.expected
    if failure is not None:
        assert failure.kind is FailureKind.EXCLUSIONS_UNSCHEDULABLE
        assert failure.node is None
        assert failure.reason == "Unschedulable"
        assert "node-a, node-b" in failure.why
        assert "didn't match Pod's node affinity" in failure.message


def test_a_pod_pending_for_another_reason_is_not_our_unschedulable_pod() -> None:
    p = pods.unschedulable(excluded=["node-a"])
    p["status"]["conditions"][0]["reason"] = "SchedulingGated"
    assert classify(p, CFG) is None


def test_an_unreadable_exclusions_annotation_counts_as_none() -> None:
    p = pods.unschedulable(annotations={"kn-rescheduler.io/excluded-nodes": "node-a,node-b"})
    assert excluded_nodes_of(p) == ()
    assert classify(p, CFG) is None


def test_a_deleted_unschedulable_pod_is_left_alone() -> None:
    assert classify(pods.unschedulable(excluded=["node-a"], deleting=True), CFG) is None


class Override(NamedTuple):
    cfg: Config
    pod: Pod
    moved: bool


OVERRIDES = {
    "a higher crash loop threshold leaves a pod with fewer restarts alone": Override(
        Config(crashloop_restart_threshold=5),
        pods.pod(containers=[crash_looping(restarts=4)]),
        False,
    ),
    "a lower crash loop threshold moves a pod after its first restart": Override(
        Config(crashloop_restart_threshold=1),
        pods.pod(containers=[crash_looping(restarts=1)]),
        True,
    ),
    "image pull failures can be switched off": Override(
        Config(waiting_reasons=frozenset({"RunContainerError"})),
        pods.pod(containers=[waiting("ErrImagePull", "rpc error: code = Unknown")]),
        False,
    ),
    "OOM kills can be switched off": Override(
        Config(termination_reasons=frozenset()),
        pods.pod(containers=[crash_looping(restarts=1, last_reason="OOMKilled", exit_code=137)]),
        False,
    ),
    "eviction can be switched off": Override(
        Config(failed_pod_reasons=frozenset({"NodeLost"})), pods.evicted(), False
    ),
    "kube-system can be included": Override(
        Config(excluded_namespaces=frozenset()),
        pods.pod("coredns-5d78c9869d-4xv7n", "kube-system", containers=[crash_looping()]),
        True,
    ),
    "the own namespace stays excluded whatever the list says": Override(
        Config(excluded_namespaces=frozenset({"kube-system"})),
        pods.pod("detect-failures-x", "kn-rescheduler", containers=[crash_looping()]),
        False,
    ),
    "another namespace can be excluded": Override(
        Config(excluded_namespaces=frozenset({"shop"})),
        pods.pod(containers=[crash_looping()]),
        False,
    ),
}


@pytest.mark.parametrize("case", OVERRIDES.values(), ids=OVERRIDES.keys())
def test_configuration_changes_what_counts(case: Override) -> None:
    assert (classify(case.pod, case.cfg) is not None) is case.moved


def test_skip_reason_says_why_a_pod_is_never_moved() -> None:
    assert skip_reason(pods.pod(owner=("DaemonSet", "node-exporter")), CFG) == (
        "DaemonSet pods belong on every node"
    )
    assert skip_reason(pods.mirror(), CFG) == "static (mirror) pods belong to their node"
    assert skip_reason(pods.pod(), CFG) is None


class Stuck(NamedTuple):
    pod: Pod
    stuck: bool


STUCK = {
    "a pod creating its containers for longer than the threshold": Stuck(
        pods.pending_on_node(timedelta(minutes=11)), True
    ),
    "a pod creating its containers for less than the threshold": Stuck(
        pods.pending_on_node(timedelta(minutes=9)), False
    ),
    "a pod whose kubelet never reported it, bound long ago": Stuck(
        pods.pending_on_node(timedelta(minutes=30), kubelet_seen=False), True
    ),
    "a pod whose init containers have not started": Stuck(
        pods.pending_on_node(
            timedelta(minutes=15),
            containers=[waiting("PodInitializing")],
        ),
        True,
    ),
    "a pod pulling an image that fails is judged by classify, not here": Stuck(
        pods.pending_on_node(
            timedelta(minutes=15), containers=[waiting("ImagePullBackOff", "Back-off")]
        ),
        False,
    ),
    "a running pod": Stuck(pods.pod(started=NOW - timedelta(hours=2)), False),
    "an unscheduled pod": Stuck(pods.unschedulable(excluded=["node-a"]), False),
    "a DaemonSet pod": Stuck(
        pods.pending_on_node(timedelta(hours=1), owner=("DaemonSet", "node-exporter")), False
    ),
}


@pytest.mark.parametrize("case", STUCK.values(), ids=STUCK.keys())
def test_stuck_pending_finds_pods_a_node_never_started(case: Stuck) -> None:
    failure = stuck_pending(case.pod, CFG, NOW)
    assert (failure is not None) is case.stuck
    if failure is not None:
        assert failure.kind is FailureKind.NODE_FIXABLE
        assert failure.reason == "StuckPending"
        assert failure.node == "node-b"


def test_the_stuck_threshold_is_configurable() -> None:
    p = pods.pending_on_node(timedelta(minutes=3))
    assert stuck_pending(p, Config(pending_stuck_after=timedelta(minutes=2)), NOW) is not None


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({"scheduling-retries": "3"}, 3),
        ({"scheduling-retries": "0"}, 0),
        ({}, None),
    ],
    ids=["a stamped policy", "a disabled policy", "no stamp at all"],
)
def test_policy_of_reads_the_webhooks_stamp(
    annotations: dict[str, str], expected: int | None
) -> None:
    p = pods.pod(stamp=None, annotations=annotations)
    assert policy_of(p) == expected


def test_policy_of_reports_an_invalid_stamp() -> None:
    result = policy_of(pods.pod(stamp="three"))
    assert isinstance(result, InvalidPolicy)
    assert "three" in result.reason


def test_a_failure_survives_a_round_trip_through_json() -> None:
    failure = classify(pods.pod(containers=[crash_looping(restarts=4)]), CFG)
    assert failure is not None
    assert Failure.from_dict(failure.to_dict()) == failure


@pytest.mark.parametrize(
    "data",
    [{}, {"kind": "bogus", "reason": "x"}, {"kind": "node-fixable", "reason": 3}],
    ids=["empty", "unknown kind", "reason not a string"],
)
def test_a_malformed_failure_is_rejected(data: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="not a failure"):
        Failure.from_dict(data)


def test_failures_are_frozen() -> None:
    failure = classify(pods.evicted(), CFG)
    assert failure is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        failure.reason = "x"  # type: ignore[misc]
