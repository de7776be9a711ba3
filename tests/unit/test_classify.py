"""Which pods are failing in a way another node could fix, and which are left alone."""

from __future__ import annotations

import copy
import dataclasses
from datetime import timedelta
from typing import Any, NamedTuple

import pytest

from shared.api.kubetypes import Pod
from shared.platform.config import Config
from shared.pods.sweep_failures.handler import find_failures
from shared.workloads.classify import (
    Failure,
    FailureKind,
    classify,
    excluded_nodes_of,
    fails_everywhere,
    policy_of,
    skip_reason,
    stuck_pending,
    unschedulable_due_to_exclusions,
    worth_forwarding,
)
from shared.workloads.policy import InvalidPolicy

from . import pods
from .pods import (
    NOW,
    crash_looping,
    last_terminated,
    no_memory_limit,
    running,
    terminated,
    waiting,
)

CFG = Config()


def never_restarted(p: Pod) -> Pod:
    p["spec"]["restartPolicy"] = "Never"
    return p


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
    "a container without a memory limit, OOM-killed and waiting to restart, is moved at once": (
        Moved(
            no_memory_limit(
                pods.pod(
                    containers=[crash_looping(restarts=1, last_reason="OOMKilled", exit_code=137)]
                )
            ),
            "OOMKilled",
            "app",
        )
    ),
    "a container without a memory limit, OOM-killed just now, is moved at once": Moved(
        no_memory_limit(pods.pod(containers=[terminated("OOMKilled", 137, restarts=2)])),
        "OOMKilled",
        "app",
    ),
    "a Job pod whose unlimited container the node OOM-killed is moved": Moved(
        no_memory_limit(
            pods.pod(
                "nightly-report-28512345-7xk2q",
                owner=("Job", "nightly-report-28512345"),
                phase="Failed",
                containers=[terminated("OOMKilled", 137)],
            )
        ),
        "OOMKilled",
        "app",
    ),
    "a container OOM-killed at its own limit three times in a row is moved as a crash loop": Moved(
        pods.pod(containers=[crash_looping(restarts=3, last_reason="OOMKilled", exit_code=137)]),
        "CrashLoopBackOff",
        "app",
    ),
    "an image pull timing out on this node for minutes is moved": Moved(
        pods.pod(
            phase="Pending",
            containers=[
                waiting(
                    "ErrImagePull",
                    "rpc error: code = Unknown desc = failed to pull and unpack image "
                    '"registry.example.com/shop/web:1.4.2": failed to resolve reference '
                    '"registry.example.com/shop/web:1.4.2": failed to do request: Head '
                    '"https://registry.example.com/v2/shop/web/manifests/1.4.2": dial tcp: '
                    "lookup registry.example.com: i/o timeout",
                )
            ],
        ),
        "ErrImagePull",
        "app",
    ),
    "an evicted pod is moved": Moved(pods.evicted(), "Evicted", None),
    # A real kubelet leaves a failed run as state.terminated for most of its back-off
    # (tests/fixtures/real-kubelet/crashloop-terminated-restart-3.json).
    "a young pod's container between two restarts, at the threshold, is moved as a crash loop": (
        Moved(
            pods.pod(
                started=NOW - timedelta(minutes=1), containers=[terminated("Error", 1, restarts=3)]
            ),
            "CrashLoopBackOff",
            "app",
        )
    ),
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
                    # As kubelet v1.36 words it (image-pull-refused-imagepullbackoff.json).
                    'Back-off pulling image "registry.example.com/shop/web:1.4.2": ErrImagePull: '
                    'failed to pull and unpack image "registry.example.com/shop/web:1.4.2": '
                    "failed to do request: dial tcp 10.0.0.5:5000: connect: connection refused",
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
    failure = classify(case.pod, CFG, NOW)
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
    "a young pod's container between two restarts, below the threshold": pods.pod(
        started=NOW - timedelta(minutes=1), containers=[terminated("Error", 1, restarts=2)]
    ),
    "an old pod's container between two restarts: its restartCount spans its whole life": (
        pods.pod(started=NOW - timedelta(hours=2), containers=[terminated("Error", 1, restarts=3)])
    ),
    "a container that exited 0 between two restarts, until the kubelet says CrashLoopBackOff": (
        pods.pod(
            started=NOW - timedelta(minutes=1), containers=[terminated("Completed", 0, restarts=4)]
        )
    ),
    "a container the kubelet will not restart (restartPolicy Never)": never_restarted(
        pods.pod(
            started=NOW - timedelta(minutes=1),
            containers=[terminated("Error", 1, restarts=3), running("log-shipper")],
        )
    ),
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
    # An init container OOM-killed once, retried and completed; the app is Running and Ready:
    # the old kill stays in lastState for ever, and is history.
    "an init container OOM-killed once, then completed, with the app running": pods.pod(
        init_containers=[
            {
                **terminated("Completed", 0, "migrate-db", restarts=1),
                "lastState": {
                    "terminated": last_terminated("OOMKilled", 137, name="migrate-db", attempt=0)
                },
                "ready": True,
            }
        ],
        containers=[running(restarts=0)],
    ),
    "a container OOM-killed at its own memory limit on its first restart": pods.pod(
        containers=[crash_looping(restarts=1, last_reason="OOMKilled", exit_code=137)]
    ),
    "an image tag that does not exist (fails on every node)": pods.pod(
        phase="Pending",
        containers=[
            waiting(
                "ErrImagePull",
                "rpc error: code = NotFound desc = failed to pull and unpack image "
                '"registry.example.com/shop/web:1.4.3": failed to resolve reference '
                '"registry.example.com/shop/web:1.4.3": registry.example.com/shop/web:1.4.3: '
                "not found",
            )
        ],
    ),
    "an older kubelet's back-off that does not say what the registry answered": pods.pod(
        phase="Pending",
        containers=[
            # Kubelets before v1.32 (the registry's error appended from v1.32): a tag that does
            # not exist and a mirror that is down look the same; judged at the next
            # ErrImagePull, which carries the answer.
            waiting(
                "ImagePullBackOff", 'Back-off pulling image "registry.example.com/shop/web:1.4.3"'
            )
        ],
    ),
    "a manifest the registry does not know (fails on every node)": pods.pod(
        phase="Pending",
        containers=[
            waiting(
                "ImagePullBackOff",
                'Back-off pulling image "registry.example.com/shop/web:1.4.3": ErrImagePull: '
                "failed to resolve reference: unexpected status: manifest unknown",
            )
        ],
    ),
    "credentials the registry refuses (fails on every node)": pods.pod(
        phase="Pending",
        containers=[
            waiting(
                "ErrImagePull",
                'failed to pull and unpack image "registry.example.com/shop/web:1.4.2": failed '
                "to authorize: failed to fetch oauth token: unexpected status from GET request "
                "to https://registry.example.com/token: 401 Unauthorized",
            )
        ],
    ),
    "a private repository without access (fails on every node)": pods.pod(
        phase="Pending",
        containers=[
            waiting(
                "ErrImagePull",
                "pull access denied, repository does not exist or may require authorization: "
                "server message: insufficient_scope: authorization failed",
            )
        ],
    ),
    "a registry answering 403 Forbidden (fails on every node)": pods.pod(
        phase="Pending",
        containers=[
            waiting(
                "ImagePullBackOff",
                'Back-off pulling image "registry.example.com/shop/web:1.4.2": ErrImagePull: '
                "unexpected status from HEAD request: 403 Forbidden",
            )
        ],
    ),
    "an entrypoint that is not in the image (fails on every node)": pods.pod(
        containers=[
            waiting(
                "RunContainerError",
                "failed to create containerd task: failed to create shim task: OCI runtime "
                "create failed: runc create failed: unable to start container process: exec: "
                '"/app/server": stat /app/server: no such file or directory: unknown',
                restarts=1,
            )
        ]
    ),
    "a crash loop whose last start failed for a command missing from the image": pods.pod(
        containers=[
            {
                **crash_looping(restarts=4),
                "lastState": {
                    "terminated": {
                        **last_terminated("StartError", 128, attempt=3),
                        "message": "failed to create containerd task: failed to create shim "
                        "task: OCI runtime create failed: runc create failed: unable to start "
                        'container process: exec: "serve": executable file not found in $PATH: '
                        "unknown",
                    }
                },
            }
        ]
    ),
    "an image pull that failed once a few seconds ago": pods.pod(
        phase="Pending",
        started=NOW - timedelta(seconds=8),
        containers=[
            waiting(
                "ErrImagePull",
                "failed to do request: dial tcp 10.0.0.5:443: connect: connection refused",
            )
        ],
    ),
    # Five restarts weeks ago, then six days of service, then one crash: the kubelet's
    # back-off is back at 10s, the lifetime count says 6.
    "a single crash after six days of running, with old restarts": pods.pod(
        started=NOW - timedelta(days=30),
        containers=[
            {
                **crash_looping(restarts=6),
                "lastState": {
                    "terminated": last_terminated("Error", 1, attempt=5, ran_for=timedelta(days=6))
                },
            }
        ],
    ),
    "two crashes in a row on a pod with many old restarts": pods.pod(
        containers=[
            {
                **crash_looping(restarts=9),
                "state": {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": "back-off 20s restarting failed container=app "
                        "pod=web-7d9c8b6f4-x2x9z_shop(0d7f5c4e-8f4b-4f6e-9a3c-2b7d1e5f6a90)",
                    }
                },
            }
        ],
        # Old restarts: the pod has run for days.
        started=NOW - timedelta(days=3),
    ),
    "a crash-looping pod labelled kn-rescheduler.io/ignore after creation": pods.pod(
        labels={"app": "web", "kn-rescheduler.io/ignore": "true"},
        containers=[crash_looping(restarts=9)],
    ),
}


LEFT_ALONE["a pod failed by a graceful node shutdown (no fault of the node)"] = pods.pod(
    phase="Failed",
    reason="Terminated",
    message="Pod was terminated in response to imminent node shutdown.",
    containers=[terminated("Error", 143)],
)
LEFT_ALONE["a container that exits 0 every time under restartPolicy Always"] = pods.pod(
    containers=[crash_looping(restarts=6, last_reason="Completed", exit_code=0)]
)
LEFT_ALONE["an image without an entry for this node's platform"] = pods.pod(
    phase="Pending",
    containers=[
        waiting(
            "ErrImagePull",
            # containerd's words for a single-arch image on a node of another architecture.
            # Another architecture's node would pull it, but moving blindly would count a
            # healthy node against itself; the pod's own kubernetes.io/arch selector is the fix.
            'failed to pull and unpack image "registry.example.com/shop/web:1.4.2": '
            "no match for platform in manifest: not found",
        )
    ],
)


def test_an_exit_0_crash_loop_under_a_liveness_probe_is_judged_as_any_crash_loop() -> None:
    # The kubelet kills a container whose liveness probe fails (a starved or broken node can
    # cause it), and many servers exit 0 on SIGTERM: the exit says nothing about the app.
    probed = pods.pod(containers=[crash_looping(restarts=6, last_reason="Completed", exit_code=0)])
    probed["spec"]["containers"][0]["livenessProbe"] = {"httpGet": {"path": "/", "port": 8080}}  # type: ignore[typeddict-item]
    assert classify(probed, CFG, NOW) is not None


@pytest.mark.parametrize("pod", LEFT_ALONE.values(), ids=LEFT_ALONE.keys())
def test_pods_that_are_not_node_failures_are_left_alone(pod: Pod) -> None:
    assert classify(pod, CFG, NOW) is None


def test_the_why_names_the_container_the_restarts_and_the_last_exit() -> None:
    failure = classify(pods.pod(containers=[crash_looping(restarts=4, exit_code=2)]), CFG)
    assert failure is not None
    assert failure.restart_count == 4
    assert "container app" in failure.why
    assert "4 restarts" in failure.why
    assert "code 2" in failure.why
    assert failure.message.startswith("back-off 1m20s restarting failed container=app")


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


class Pull(NamedTuple):
    pod: Pod
    stuck: bool


def _pulling(bound_for: timedelta, sandbox_for: timedelta, **kwargs: object) -> Pod:
    """Bound ``bound_for`` ago; sandbox up for ``sandbox_for``; ContainerCreating since."""
    return pods.sandbox_ready_since(
        pods.pending_on_node(bound_for, **kwargs),  # type: ignore[arg-type]
        NOW - sandbox_for,
    )


PULLS = {
    "a big image pulling for 15 minutes with its sandbox up is not stuck": Pull(
        _pulling(timedelta(minutes=16), timedelta(minutes=15)), False
    ),
    "an image pull that has not finished in over an hour is stuck": Pull(
        _pulling(timedelta(minutes=65), timedelta(minutes=61)), True
    ),
    "a workload that allows 3 hours keeps a 2-hour pull": Pull(
        _pulling(
            timedelta(hours=2, minutes=1),
            timedelta(hours=2),
            annotations={"kn-rescheduler.io/stuck-after": "3h"},
        ),
        False,
    ),
    "a workload that allows 5 minutes calls a 6-minute sandbox wait stuck": Pull(
        pods.pending_on_node(
            timedelta(minutes=6), annotations={"kn-rescheduler.io/stuck-after": "5m"}
        ),
        True,
    ),
    "a stuck-after typo falls back to the defaults": Pull(
        pods.pending_on_node(
            timedelta(minutes=6), annotations={"kn-rescheduler.io/stuck-after": "5 minutes"}
        ),
        False,
    ),
}


@pytest.mark.parametrize("case", PULLS.values(), ids=PULLS.keys())
def test_an_image_pull_in_progress_is_told_apart_from_a_stuck_sandbox(case: Pull) -> None:
    assert (stuck_pending(case.pod, CFG, NOW) is not None) is case.stuck


class RanFor(NamedTuple):
    pod: Pod
    seconds: int | None


RAN_FOR = {
    # The pod is 45 minutes old; each run lasted 3 seconds.
    "a crash loop reports its last short run, not the pod's age": RanFor(
        pods.pod(started=NOW - timedelta(minutes=45), containers=[crash_looping(restarts=5)]), 3
    ),
    "a container that never started ran for nothing": RanFor(
        pods.pod(
            phase="Pending",
            started=NOW - timedelta(minutes=45),
            containers=[waiting("ErrImagePull", "dial tcp: i/o timeout")],
        ),
        0,
    ),
    "an unlimited container OOM-killed after two hours of service": RanFor(
        no_memory_limit(
            pods.pod(
                containers=[
                    {
                        **crash_looping(restarts=1, last_reason="OOMKilled", exit_code=137),
                        "lastState": {
                            "terminated": last_terminated(
                                "OOMKilled", 137, ran_for=timedelta(hours=2)
                            )
                        },
                    }
                ]
            )
        ),
        7200,
    ),
}


@pytest.mark.parametrize("case", RAN_FOR.values(), ids=RAN_FOR.keys())
def test_a_failure_says_how_long_the_container_ran(case: RanFor) -> None:
    failure = classify(case.pod, CFG, NOW)
    assert failure is not None
    assert failure.ran_for_seconds == case.seconds


def test_an_evicted_pod_reports_its_longest_container_run() -> None:
    failure = classify(pods.evicted(), CFG, NOW)
    assert failure is not None
    assert failure.ran_for_seconds == 3


def test_a_waiting_failure_counts_once_it_outlasted_the_threshold() -> None:
    p = pods.pod(
        phase="Pending",
        started=NOW - timedelta(seconds=40),
        containers=[waiting("ErrImagePull", "dial tcp: lookup registry: i/o timeout")],
    )
    assert classify(p, CFG, NOW - timedelta(seconds=20)) is None
    failure = classify(p, CFG, NOW)
    assert failure is not None
    assert "waiting with ErrImagePull for" in failure.why


def test_a_crash_loop_counts_its_restarts_in_a_row_from_the_kubelets_back_off() -> None:
    p = pods.pod(containers=[crash_looping(restarts=9)], started=NOW - timedelta(days=2))
    status = p["status"]["containerStatuses"][0]
    status["state"]["waiting"]["message"] = status["state"]["waiting"]["message"].replace(
        "back-off 5m0s", "back-off 40s"
    )
    failure = classify(p, CFG, NOW)
    assert failure is not None
    assert "9 restarts in its lifetime, at least 3 in a row" in failure.why


def test_an_oom_kill_at_the_containers_own_limit_says_so_only_as_a_crash_loop() -> None:
    limited = pods.pod(containers=[crash_looping(restarts=3, last_reason="OOMKilled")])
    failure = classify(limited, CFG, NOW)
    assert failure is not None
    assert failure.reason == "CrashLoopBackOff"
    unlimited = classify(no_memory_limit(limited), CFG, NOW)
    assert unlimited is not None
    assert unlimited.reason == "OOMKilled"
    assert "node ran out of memory" in unlimited.why


def test_a_pod_level_memory_limit_counts_as_the_containers_own() -> None:
    p = no_memory_limit(pods.pod(containers=[crash_looping(restarts=1, last_reason="OOMKilled")]))
    p["spec"]["resources"] = {"limits": {"memory": "1Gi"}}
    assert classify(p, CFG, NOW) is None


EVERYWHERE = {
    "a tag that does not exist": (
        waiting("ErrImagePull", "docker.io/library/web:nope: not found"),
        "not found",
    ),
    "a refused pull credential": (
        waiting("ImagePullBackOff", "failed to authorize: 401 Unauthorized"),
        "Unauthorized",
    ),
    "a missing entrypoint": (
        waiting("RunContainerError", 'exec: "/srv/run": stat /srv/run: no such file or directory'),
        'exec: "/srv/run"',
    ),
    "a config error": (waiting("CreateContainerConfigError", 'secret "x" not found'), "every node"),
}


@pytest.mark.parametrize(("status", "says"), EVERYWHERE.values(), ids=EVERYWHERE.keys())
def test_fails_everywhere_says_why(status: object, says: str) -> None:
    why = fails_everywhere(status)  # type: ignore[arg-type]
    assert why is not None
    assert says in why


NODE_LOCAL = {
    "a registry timeout": waiting("ErrImagePull", "dial tcp: lookup registry: i/o timeout"),
    "a refused connection to the node's mirror": waiting(
        "ErrImagePull", "dial tcp 127.0.0.1:5000: connect: connection refused"
    ),
    "a host path missing on this node": waiting(
        "RunContainerError",
        'error mounting "/mnt/data" to rootfs at "/data": no such file or directory',
    ),
    "an application whose own message mentions a missing file": {
        **crash_looping(restarts=4),
        "lastState": {
            "terminated": {
                **last_terminated("Error", 1),
                "message": 'exec: "/srv/run": no such file or directory',
            }
        },
    },
}


@pytest.mark.parametrize("status", NODE_LOCAL.values(), ids=NODE_LOCAL.keys())
def test_node_local_errors_do_not_count_as_failing_everywhere(status: object) -> None:
    assert fails_everywhere(status) is None  # type: ignore[arg-type]


FORWARDED = {
    "an opted-in pod": (pods.pod(), Config(), True),
    "a pod that turned rescheduling off": (pods.pod(stamp="0"), Config(), False),
    "a pod with an invalid policy (update-annotations warns)": (
        pods.pod(stamp="many"),
        Config(),
        True,
    ),
    "a pod that never opted in": (pods.pod(stamp=None), Config(), False),
    "an unstamped pod when the operator forwards them": (
        pods.pod(stamp=None),
        Config(forward_unstamped=True),
        True,
    ),
}


@pytest.mark.parametrize(("pod", "cfg", "forwarded"), FORWARDED.values(), ids=FORWARDED.keys())
def test_which_pods_are_worth_forwarding(pod: Pod, cfg: Config, forwarded: bool) -> None:
    assert worth_forwarding(pod, cfg) is forwarded


def test_the_opt_out_label_is_one_skip_rule_for_every_function() -> None:
    p = pods.pod(labels={"kn-rescheduler.io/ignore": ""}, containers=[crash_looping(restarts=9)])
    assert skip_reason(p, CFG) == "pod has the kn-rescheduler.io/ignore label"
    assert (
        stuck_pending(
            pods.pending_on_node(timedelta(hours=2), labels={"kn-rescheduler.io/ignore": "true"}),
            CFG,
            NOW,
        )
        is None
    )


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({"kn-rescheduler.io/scheduling-retries": "3"}, 3),
        ({"kn-rescheduler.io/scheduling-retries": "0"}, 0),
        ({"scheduling-retries": "2"}, 2),
        ({"kn-rescheduler.io/scheduling-retries": "0", "scheduling-retries": "5"}, 0),
        ({}, None),
    ],
    ids=[
        "the webhook's stamp",
        "a disabled stamp",
        "a bare pod's own policy (or a pod stamped by an earlier release)",
        "the stamp wins over a copied user key",
        "no policy at all",
    ],
)
def test_policy_of_reads_the_stamp_then_the_pods_own_key(
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


def test_the_sweep_forwards_a_disabled_pod_only_to_clear_our_exclusions() -> None:
    blocked = pods.unschedulable(excluded=["node-a"], stamp="0")
    crashing = pods.pod("web-7d9c8b6f4-k2k2k", stamp="0", containers=[crash_looping(restarts=9)])
    found = find_failures([blocked, crashing], CFG, NOW)
    assert [f.name for f in found] == [blocked["metadata"]["name"]]


# Statuses shaped exactly as a kubelet (v1.30 to v1.36) and its runtime write them; each row
# names the source that writes the shape. docs/failure-rules.md has the verdict of every reason.
CONTAINERD_START_FAILED = (
    "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
    "runc create failed: unable to start container process: error during container init: "
    "error setting cgroup config for procHooks process: unable to freeze: unknown"
)


def _start_error(
    message: str, *, restarts: int, back_off: str, started: timedelta = timedelta(days=2)
) -> Pod:
    """A container containerd never managed to start, waiting in CrashLoopBackOff.

    containerd (internal/cri/server/container_start.go) records a failed start as an exit with
    reason StartError, code 128, a finishedAt and no startedAt (0 ns); the kubelet
    (pkg/kubelet/kuberuntime/kuberuntime_container.go, toKubeContainerStatus) converts that 0
    with time.Unix(0, 0), which the API server writes as 1970-01-01T00:00:00Z, not null.
    """
    status = crash_looping(restarts=restarts)
    status["state"]["waiting"]["message"] = status["state"]["waiting"]["message"].replace(
        status["state"]["waiting"]["message"].split(" ")[1], back_off, 1
    )
    status["lastState"] = {
        "terminated": {
            **last_terminated("StartError", 128, attempt=restarts - 1),
            "startedAt": "1970-01-01T00:00:00Z",
            "message": message,
        }
    }
    # Its restarts span a pod of two days by default: old restarts, bounded by the back-off.
    return pods.pod(containers=[status], started=NOW - started)


def _evicted(message: str, *, disruption_condition: bool) -> Pod:
    """A pod the kubelet's eviction manager failed (pkg/kubelet/eviction/eviction_manager.go,
    evictPod): phase Failed, reason Evicted, the message as the kubelet formats it
    (pkg/kubelet/eviction/helpers.go). Node-pressure evictions add a DisruptionTarget condition
    (TerminationByKubelet); the local-storage limit evictions pass none."""
    p = pods.pod(
        phase="Failed",
        reason="Evicted",
        message=message,
        containers=[terminated("Error", 137)],
    )
    if disruption_condition:
        p["status"]["conditions"].insert(
            0,
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "TerminationByKubelet",
                "message": message,
                "lastProbeTime": None,
                "lastTransitionTime": pods.ts(NOW - timedelta(seconds=20)),
            },
        )
    return p


class Judged(NamedTuple):
    pod: Pod
    moved: bool
    # Where the shape comes from (a file of the kubelet, containerd or CRI-O).
    source: str


KUBELET_STATUSES = {
    "a container containerd never started (StartError, startedAt 1970), 3 in a row": Judged(
        _start_error(CONTAINERD_START_FAILED, restarts=3, back_off="40s"),
        True,
        "containerd internal/cri/server/container_start.go; kubelet kuberuntime_container.go",
    ),
    "a container containerd never started, on a pod with old restarts, twice in a row": Judged(
        _start_error(CONTAINERD_START_FAILED, restarts=9, back_off="20s"),
        False,
        "containerd internal/cri/server/container_start.go; kubelet kuberuntime_manager.go",
    ),
    "an eviction for the pod's own ephemeral-storage limit": Judged(
        _evicted(
            "Pod ephemeral local storage usage exceeds the total limit of containers 2Gi. ",
            disruption_condition=False,
        ),
        False,
        "kubelet pkg/kubelet/eviction/helpers.go podEphemeralStorageMessageFmt",
    ),
    "an eviction for a container's own ephemeral-storage limit": Judged(
        _evicted(
            'Container app exceeded its local ephemeral storage limit "1Gi". ',
            disruption_condition=False,
        ),
        False,
        "kubelet pkg/kubelet/eviction/helpers.go containerEphemeralStorageMessageFmt",
    ),
    "an eviction for an emptyDir over its sizeLimit": Judged(
        _evicted(
            'Usage of EmptyDir volume "cache" exceeds the limit "500Mi". ',
            disruption_condition=False,
        ),
        False,
        "kubelet pkg/kubelet/eviction/helpers.go emptyDirMessageFmt",
    ),
    "an eviction under the node's disk pressure": Judged(
        _evicted(
            "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, "
            "available: 9765432Ki. Container app was using 2Gi, request is 0, has larger "
            "consumption of ephemeral-storage. ",
            disruption_condition=True,
        ),
        True,
        "kubelet pkg/kubelet/eviction/helpers.go nodeLowMessageFmt, containerMessageFmt",
    ),
    "a pod rejected at admission by the eviction manager (node condition)": Judged(
        _evicted(
            "Pod was rejected: The node had condition: [DiskPressure]. ",
            disruption_condition=False,
        ),
        True,
        "kubelet pkg/kubelet/eviction/eviction_manager.go Admit; kubelet.go rejectPod",
    ),
    "CRI-O with crun: the command is not in the image": Judged(
        pods.pod(
            phase="Pending",
            containers=[
                waiting(
                    "CreateContainerError",
                    "container create failed: executable file `/bin/alloy` not found in $PATH: "
                    "No such file or directory\n",
                )
            ],
        ),
        False,
        "CRI-O internal/oci/runtime_oci.go (container create failed: %s) with crun's message",
    ),
    "CRI-O with runc: the command is not in the image": Judged(
        pods.pod(
            phase="Pending",
            containers=[
                waiting(
                    "CreateContainerError",
                    "container create failed: runc create failed: unable to start container "
                    'process: exec: "/usr/bin/pod": stat /usr/bin/pod: no such file or directory',
                )
            ],
        ),
        False,
        "CRI-O internal/oci/runtime_oci.go (container create failed: %s) with runc's message",
    ),
    "a registry host that does not exist (containerd)": Judged(
        pods.pod(
            phase="Pending",
            containers=[
                waiting(
                    "ErrImagePull",
                    'failed to pull and unpack image "registry.exmaple.com/shop/web:1.4.2": '
                    'failed to resolve reference "registry.exmaple.com/shop/web:1.4.2": failed '
                    'to do request: Head "https://registry.exmaple.com/v2/shop/web/manifests/'
                    '1.4.2": dial tcp: lookup registry.exmaple.com on 127.0.0.53:53: no such host',
                )
            ],
        ),
        False,
        "containerd core/remotes/docker/resolver.go (failed to do request) and Go's net package",
    ),
    "a registry host that does not exist (CRI-O)": Judged(
        pods.pod(
            phase="Pending",
            containers=[
                waiting(
                    "ErrImagePull",
                    "pinging container registry registry.exmaple.com: Get "
                    '"https://registry.exmaple.com/v2/": dial tcp: lookup registry.exmaple.com '
                    "on 10.0.0.2:53: no such host",
                )
            ],
        ),
        False,
        "containers/image docker/docker_client.go (pinging container registry), used by CRI-O",
    ),
    "a registry's pull rate limit": Judged(
        pods.pod(
            phase="Pending",
            containers=[
                waiting(
                    "ErrImagePull",
                    'failed to pull and unpack image "docker.io/library/nginx:1.27": failed to '
                    "copy: httpReadSeeker: failed open: unexpected status code https://registry-1."
                    "docker.io/v2/library/nginx/manifests/sha256:0a3f: 429 Too Many Requests - "
                    "Server message: toomanyrequests: You have reached your unauthenticated pull "
                    "rate limit.",
                )
            ],
        ),
        False,
        "containerd core/remotes/docker/fetcher.go (unexpected status code)",
    ),
    "a registry that times out on this node for minutes": Judged(
        pods.pod(
            phase="Pending",
            containers=[
                waiting(
                    "ErrImagePull",
                    'failed to pull and unpack image "registry.example.com/shop/web:1.4.2": '
                    'failed to resolve reference "registry.example.com/shop/web:1.4.2": failed '
                    'to do request: Head "https://registry.example.com/v2/shop/web/manifests/'
                    '1.4.2": dial tcp 10.0.0.5:443: i/o timeout',
                )
            ],
        ),
        True,
        "containerd core/remotes/docker/resolver.go (failed to do request)",
    ),
    "a mount point inside a read-only volume of the pod's own spec": Judged(
        pods.pod(
            containers=[
                waiting(
                    "RunContainerError",
                    "failed to create containerd task: failed to create shim task: OCI runtime "
                    "create failed: runc create failed: unable to start container process: "
                    'error during container init: error mounting "/var/lib/kubelet/pods/'
                    '0d7f5c4e/volumes/kubernetes.io~empty-dir/data" to rootfs at "/etc/app/data":'
                    " create mountpoint for /etc/app/data mount: mkdirat /run/containerd/"
                    "io.containerd.runtime.v2.task/k8s.io/4b1c/rootfs/etc/app/data: read-only "
                    "file system: unknown",
                    restarts=1,
                )
            ]
        ),
        False,
        "runc libcontainer/rootfs_linux.go (create mountpoint for %s mount) via containerd",
    ),
    "a node whose own disk turned read-only": Judged(
        pods.pod(
            containers=[
                waiting(
                    "CreateContainerError",
                    "failed to create containerd container: failed to prepare extraction "
                    "snapshot: mkdir /var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/"
                    "snapshots/812: read-only file system",
                )
            ]
        ),
        True,
        "containerd internal/cri/server/container_create.go via its overlayfs snapshotter",
    ),
    "a pod the kubelet preempted to admit a critical pod": Judged(
        pods.pod(
            phase="Failed",
            reason="Preempting",
            message="Preempted in order to admit critical pod",
            containers=[terminated("Error", 137)],
        ),
        False,
        "kubelet pkg/kubelet/preemption/preemption.go",
    ),
    "a postStart hook that failed": Judged(
        pods.pod(
            containers=[
                waiting(
                    "PostStartHookError",
                    'Exec lifecycle hook ([/bin/sh -c /warm-cache]) for Container "app" in Pod '
                    '"web-7d9c8b6f4-x2x9z_shop(0d7f5c4e)" failed - error: command \'/bin/sh -c '
                    '/warm-cache\' exited with 1: , message: ""',
                    restarts=2,
                )
            ]
        ),
        False,
        "kubelet pkg/kubelet/kuberuntime/kuberuntime_container.go (ErrPostStartHook)",
    ),
}


@pytest.mark.parametrize("case", KUBELET_STATUSES.values(), ids=KUBELET_STATUSES.keys())
def test_statuses_shaped_as_kubelets_write_them_are_judged_right(case: Judged) -> None:
    failure = classify(case.pod, CFG, NOW)
    if case.moved:
        assert failure is not None, case.source
        assert failure.kind is FailureKind.NODE_FIXABLE
    else:
        assert failure is None, f"{case.source}: {failure and failure.why}"


def test_a_container_that_never_started_ran_for_no_time_at_all() -> None:
    failure = classify(_start_error(CONTAINERD_START_FAILED, restarts=3, back_off="40s"), CFG, NOW)
    assert failure is not None
    assert failure.ran_for_seconds == 0
    assert "3 restarts" in failure.why


# -- restarts the user declared (ContainerRestartRules, beta and on by default since v1.35) ------


def with_restart_rules(p: Pod, *rules: dict[str, Any], policy: str | None = None) -> Pod:
    """``p`` with its container's ``restartPolicyRules`` (and ``restartPolicy``), as the API
    server stores them (core/v1 Container.restartPolicyRules: action, exitCodes)."""
    container = p["spec"]["containers"][0]  # type: ignore[typeddict-item]
    container["restartPolicyRules"] = list(rules)
    if policy is not None:
        container["restartPolicy"] = policy
    return p


def restart_on(operator: str, *codes: int, action: str = "Restart") -> dict[str, Any]:
    return {"action": action, "exitCodes": {"operator": operator, "values": list(codes)}}


@pytest.mark.parametrize(
    ("rules", "exit_code", "moved"),
    [
        # A training job's retriable exit: restarted in place by the user's own rule.
        ([restart_on("In", 42)], 42, False),
        ([restart_on("NotIn", 0, 1)], 42, False),
        ([restart_on("In", 42, action="RestartAllContainers")], 42, False),
        # An exit the rules do not name: the pod's policy decides, and the crash loop counts.
        ([restart_on("In", 42)], 1, True),
        ([restart_on("NotIn", 1)], 1, True),
    ],
    ids=["in", "not-in", "restart-all", "other-exit", "not-in-excluded"],
)
def test_restarts_a_container_rule_declares_are_the_users_choice(
    rules: list[dict[str, Any]], exit_code: int, moved: bool
) -> None:
    p = with_restart_rules(
        pods.pod(containers=[crash_looping(restarts=5, exit_code=exit_code)]), *rules
    )
    assert (classify(p, CFG, NOW) is not None) is moved


def test_a_restart_rule_excuses_the_applications_exits_only() -> None:
    # The previous run exited 42 (declared retriable); now the node's runtime cannot create
    # the container: that is judged as for any container, and moved after 30 s.
    stuck = waiting(
        "CreateContainerError", "failed to reserve container name: context deadline exceeded"
    )
    stuck["lastState"] = {
        "terminated": last_terminated("Error", 42, finished=NOW - timedelta(minutes=3))
    }
    p = with_restart_rules(pods.pod(containers=[stuck]), restart_on("In", 42))
    assert classify(p, CFG, NOW) is not None
    # An OOM kill without a memory limit is the node running out, whatever the rules say.
    oom = crash_looping(restarts=1, last_reason="OOMKilled", exit_code=137)
    p = with_restart_rules(no_memory_limit(pods.pod(containers=[oom])), restart_on("NotIn", 0))
    assert classify(p, CFG, NOW) is not None


def test_a_containers_own_restart_policy_replaces_the_pods() -> None:
    # Under a pod restartPolicy Never, a container with restartPolicy Always is restarted in
    # place: its crash loop between restarts is one the kubelet will keep restarting.
    looping = terminated("Error", 1, restarts=4)
    never = pods.pod(containers=[looping], started=NOW - timedelta(minutes=2))
    never["spec"]["restartPolicy"] = "Never"  # type: ignore[typeddict-item]
    assert classify(never, CFG, NOW) is None
    always = with_restart_rules(copy.deepcopy(never), policy="Always")
    assert classify(always, CFG, NOW) is not None
