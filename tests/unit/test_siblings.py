"""Which other pods of a workload say that their node is failing it now.

The decisions of shared.workloads.siblings.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple, cast

import pytest

from shared.api.kubetypes import Pod
from shared.platform.config import Config
from shared.workloads.classify import classify
from shared.workloads.everywhere import ALONE, Health, health_of, witnesses_of
from shared.workloads.siblings import (
    JOB_COMPLETION_INDEX_LABEL,
    FailingSibling,
    failing_siblings,
    nodes_of,
    sibling_evidence,
    sibling_selector,
)

from . import pods
from .pods import NOW

RESET_AFTER = Config().reset_after
PULL_TIMEOUT = (
    'failed to pull and unpack image "registry.example.com/shop/web:1.4.2": failed to do '
    'request: Head "https://registry.example.com/v2/shop/web/manifests/1.4.2": dial tcp '
    "10.0.0.5:443: i/o timeout"
)
PULL_NOT_FOUND = (
    'rpc error: code = NotFound desc = failed to pull and unpack image "registry.example.com/'
    'shop/web:1.4.2": failed to resolve reference "registry.example.com/shop/web:1.4.2": '
    "registry.example.com/shop/web:1.4.2: not found"
)
# The pod being moved: crash-looping on node-a.
MOVING = pods.pod("web-7d9c8b6f4-x2x9z", node="node-a", containers=[pods.crash_looping(restarts=4)])


def sibling(
    name: str = "web-7d9c8b6f4-k8m2p",
    *,
    node: str | None = "node-b",
    restarts: int = 4,
    **kwargs: Any,
) -> Pod:
    """Another pod of web's ReplicaSet, crash-looping past the threshold on node-b unless told
    otherwise."""
    kwargs.setdefault("containers", [pods.crash_looping(restarts=restarts, pod_name=name)])
    return pods.pod(name, node=node, **kwargs)


def ran_long_then_evicted(node: str) -> Pod:
    """Evicted after its container had run for two hours."""
    evicted = copy.deepcopy(pods.evicted(node=node, name="web-7d9c8b6f4-l0ng1"))
    status = cast(dict[str, Any], evicted["status"])
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    terminated["startedAt"] = pods.ts(NOW - timedelta(hours=2))
    return evicted


class Case(NamedTuple):
    candidate: Pod
    counts: bool


CASES = {
    "a pod of the same ReplicaSet crash-looping on another node": Case(sibling(), True),
    "a pod of the same ReplicaSet the kubelet evicted from another node": Case(
        pods.evicted(node="node-c", name="web-7d9c8b6f4-e4v1c"), True
    ),
    "a pod in its first crash-loop back-off, below the threshold a move needs": Case(
        sibling(restarts=1), True
    ),
    # The kubelet's status after a first run exits 1 (kubelet v1.36.3 keeps state.terminated,
    # restartCount 0, until its next sync restarts the container; see
    # tests/fixtures/real-kubelet/crashloop-terminated-restart-2.json one run later).
    "a pod whose first run just ended in an error, not restarted yet": Case(
        sibling(containers=[pods.terminated("Error", 1)]), True
    ),
    "a pod whose first run was killed at its own memory limit": Case(
        sibling(containers=[pods.terminated("OOMKilled", 137)]), False
    ),
    "a pod whose first run exited 0 (restartPolicy Always restarts it)": Case(
        sibling(containers=[pods.terminated("Completed", 0)]), False
    ),
    "a pod whose image pull on another node times out": Case(
        sibling(containers=[pods.waiting("ErrImagePull", PULL_TIMEOUT)]), True
    ),
    "a pod whose image the registry says does not exist": Case(
        sibling(containers=[pods.waiting("ErrImagePull", PULL_NOT_FOUND)]), False
    ),
    "a pod that crashed once and runs again": Case(
        sibling(containers=[pods.running(restarts=1, last=pods.last_terminated())]), False
    ),
    "a pod crash-looping beside a container no node can start": Case(
        sibling(
            containers=[
                pods.crash_looping(restarts=4),
                pods.waiting("CreateContainerConfigError", 'secret "db" not found', "sidecar"),
            ]
        ),
        False,
    ),
    "a healthy pod": Case(sibling(containers=[pods.running()]), False),
    "a pod of another ReplicaSet (an older rollout)": Case(
        sibling(owner=("ReplicaSet", "web-55d8f9c7b")), False
    ),
    "a pod without a controller": Case(sibling(owner=None), False),
    "a pod already being deleted": Case(sibling(deleting=True), False),
    "a pod failing on the moving pod's own node": Case(sibling(node="node-a"), False),
    "a pod no node has taken yet": Case(pods.unschedulable(excluded=["node-a"]), False),
    "a pod that opted out": Case(sibling(labels={"kn-rescheduler.io/ignore": "true"}), False),
    "a pod whose container ran past reset-after before it failed": Case(
        ran_long_then_evicted("node-c"), False
    ),
    "the moving pod itself": Case(MOVING, False),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_only_another_pod_of_the_controller_failing_where_a_node_is_to_blame_counts(
    case: Case,
) -> None:
    found = failing_siblings(MOVING, [case.candidate], Config(), NOW, reset_after=RESET_AFTER)
    assert bool(found) is case.counts
    if case.counts:
        (only,) = found
        assert only.node == case.candidate["spec"]["nodeName"]
        assert only.name == case.candidate["metadata"]["name"]


def test_the_nodes_are_listed_once_each_in_order() -> None:
    candidates = [
        sibling("web-7d9c8b6f4-c2", node="node-c"),
        sibling("web-7d9c8b6f4-b2", node="node-b"),
        sibling("web-7d9c8b6f4-c1", node="node-c"),
        sibling("web-7d9c8b6f4-h1", node="node-h", containers=[pods.running()]),
    ]
    found = failing_siblings(MOVING, candidates, Config(), NOW, reset_after=RESET_AFTER)
    assert [(s.node, s.name) for s in found] == [
        ("node-b", "web-7d9c8b6f4-b2"),
        ("node-c", "web-7d9c8b6f4-c1"),
        ("node-c", "web-7d9c8b6f4-c2"),
    ]
    assert {s.reason for s in found} == {"CrashLoopBackOff"}
    assert nodes_of(found) == ("node-b", "node-c")


def test_a_sibling_counts_from_its_first_failure_whatever_a_move_needs() -> None:
    strict = Config(crashloop_restart_threshold=10, waiting_failure_after=timedelta(hours=1))
    first_crash = sibling(restarts=1)
    assert failing_siblings(MOVING, [first_crash], strict, NOW, reset_after=RESET_AFTER)
    # What a move itself needs is unchanged: the same pod is not failing enough to be moved.
    assert classify(first_crash, strict, NOW) is None
    # The evidence keeps every other rule of the configuration.
    assert sibling_evidence(strict).waiting_reasons == strict.waiting_reasons
    pull = sibling(containers=[pods.waiting("ErrImagePull", PULL_TIMEOUT)])
    assert failing_siblings(MOVING, [pull], strict, NOW, reset_after=RESET_AFTER)
    not_configured = replace(strict, waiting_reasons=frozenset({"ImagePullBackOff"}))
    assert not failing_siblings(MOVING, [pull], not_configured, NOW, reset_after=RESET_AFTER)


def test_a_shorter_reset_after_leaves_out_a_pod_that_ran_longer() -> None:
    evicted = pods.evicted(node="node-c", name="web-7d9c8b6f4-e4v1c")
    assert failing_siblings(MOVING, [evicted], Config(), NOW, reset_after=RESET_AFTER)
    # Its container ran 3 s (pods.terminated): longer than a reset-after of 1 s.
    assert not failing_siblings(MOVING, [evicted], Config(), NOW, reset_after=timedelta(seconds=1))


def test_a_bare_pod_has_no_siblings() -> None:
    bare = pods.pod("debug-shell", owner=None, node="node-a", containers=[pods.crash_looping()])
    assert (
        failing_siblings(bare, [sibling(owner=None)], Config(), NOW, reset_after=RESET_AFTER) == ()
    )


SELECTORS = {
    "a Deployment's pod: the hash its controller sets": (
        {"app": "web", "pod-template-hash": "7d9c8b6f4"},
        "pod-template-hash=7d9c8b6f4",
    ),
    # As the API server stores it on 1.35+ after binding (PodTopologyLabels admission copies
    # the Node's zone and region), and with a label a cluster policy copied from the Node: its
    # twin in another zone has other values, yet is found.
    "a Deployment's pod after binding in a zone": (
        {
            "app": "web",
            "pod-template-hash": "7d9c8b6f4",
            "topology.kubernetes.io/zone": "europe-west1-c",
            "topology.kubernetes.io/region": "europe-west1",
            "node-pool": "highmem",
        },
        "pod-template-hash=7d9c8b6f4",
    ),
    "an Indexed Job's pod: its controller's uid": (
        {
            "batch.kubernetes.io/controller-uid": "0b6a1f0e-1c2d-4e5f-8a9b-0c1d2e3f4a5b",
            "batch.kubernetes.io/job-name": "render",
            JOB_COMPLETION_INDEX_LABEL: "3",
            "controller-uid": "0b6a1f0e-1c2d-4e5f-8a9b-0c1d2e3f4a5b",
            "job-name": "render",
        },
        "batch.kubernetes.io/controller-uid=0b6a1f0e-1c2d-4e5f-8a9b-0c1d2e3f4a5b",
    ),
    "a StatefulSet's pod in a zone: every label but its name, index and place": (
        {
            "app": "db",
            "apps.kubernetes.io/pod-index": "2",
            "controller-revision-hash": "db-6c4f8d9b7",
            "statefulset.kubernetes.io/pod-name": "db-2",
            "topology.kubernetes.io/zone": "europe-west1-b",
        },
        "app=db,controller-revision-hash=db-6c4f8d9b7",
    ),
    "a ReplicaSet of its own (no hash) in a zone: its labels but the zone": (
        {"app": "legacy", "topology.kubernetes.io/zone": "europe-west1-b"},
        "app=legacy",
    ),
    "the same with the topology.k8s.io keys the plugin's documentation names": (
        {"app": "legacy", "topology.k8s.io/zone": "europe-west1-b"},
        "app=legacy",
    ),
}


@pytest.mark.parametrize(("labels", "selector"), SELECTORS.values(), ids=SELECTORS.keys())
def test_the_selector_finds_every_pod_of_the_controller(
    labels: dict[str, str], selector: str
) -> None:
    assert sibling_selector(pods.pod(labels=labels)) == selector


def test_a_pod_without_labels_has_no_selector() -> None:
    unlabelled = copy.deepcopy(MOVING)
    cast(dict[str, Any], unlabelled["metadata"])["labels"] = {}
    assert sibling_selector(unlabelled) is None
    only_index = pods.pod(labels={JOB_COMPLETION_INDEX_LABEL: "0"})
    assert sibling_selector(only_index) is None


def test_a_failing_sibling_says_where_and_why() -> None:
    (found,) = failing_siblings(MOVING, [sibling()], Config(), NOW, reset_after=RESET_AFTER)
    assert found == FailingSibling("web-7d9c8b6f4-k8m2p", "node-b", "CrashLoopBackOff")


# -- the other pods as witnesses: is the workload healthy anywhere? (shared.workloads.everywhere)


def ready_since(p: Pod, since: datetime) -> Pod:
    """``p`` with its Ready condition last turned True at ``since``: the kubelet's status
    manager moves lastTransitionTime only when a condition's status changes
    (updateLastTransitionTime in pkg/kubelet/status/status_manager.go), so a container that
    crashed and came back shows the moment it came back."""
    out = copy.deepcopy(p)
    status = cast(dict[str, Any], out["status"])
    for condition in status["conditions"]:
        if condition["type"] in ("Ready", "ContainersReady"):
            condition["lastTransitionTime"] = pods.ts(since)
    return out


def back_between_crashes(name: str, node: str, *, up_for: timedelta) -> Pod:
    """A crash-looping container without a readiness probe, running again for ``up_for``
    after its fourth crash: Ready, as the kubelet reports any running container without one."""
    started = NOW - up_for
    container = pods.running(
        restarts=4, started=started, last=pods.last_terminated(finished=started), ready=True
    )
    return ready_since(pods.pod(name, node=node, containers=[container]), started)


class Standing(NamedTuple):
    pod: Pod
    health: Health


HEALTH = {
    "crash-looping now": Standing(sibling(), Health.FAILED),
    "back for 5 seconds between two crashes (Ready, no probe)": Standing(
        back_between_crashes("web-7d9c8b6f4-k8m2p", "node-b", up_for=timedelta(seconds=5)),
        Health.FAILED,
    ),
    "back and Ready for longer than crashloop_recent_run": Standing(
        back_between_crashes("web-7d9c8b6f4-k8m2p", "node-b", up_for=timedelta(minutes=11)),
        Health.HEALTHY,
    ),
    "Ready and never restarted": Standing(pods.pod("web-7d9c8b6f4-k8m2p"), Health.HEALTHY),
    "running, not Ready yet, never restarted": Standing(
        pods.pod("web-7d9c8b6f4-k8m2p", containers=[pods.running(ready=False)]),
        Health.UNPROVEN,
    ),
    "bound, containers being created": Standing(
        pods.pending_on_node(timedelta(seconds=3), name="web-7d9c8b6f4-k8m2p"), Health.UNPROVEN
    ),
    "not bound yet": Standing(
        pods.pod("web-7d9c8b6f4-k8m2p", node=None, phase="Pending", conditions=[]),
        Health.UNPROVEN,
    ),
    "a Job's pod that completed": Standing(
        pods.pod(
            "train-6xk2p",
            owner=("Job", "train"),
            phase="Succeeded",
            containers=[pods.terminated("Completed", 0)],
        ),
        Health.HEALTHY,
    ),
}


@pytest.mark.parametrize("case", HEALTH.values(), ids=HEALTH.keys())
def test_how_another_pod_of_the_workload_stands(case: Standing) -> None:
    health, why = health_of(case.pod, Config(), NOW)
    assert health is case.health, why


def test_the_witnesses_are_the_other_live_pods_of_the_same_controller() -> None:
    other_rs = pods.pod("web-5f6b7c8d9-aaaaa", owner=("ReplicaSet", "web-5f6b7c8d9"))
    candidates = [
        MOVING,
        sibling("web-7d9c8b6f4-k8m2p"),
        sibling("web-7d9c8b6f4-going", deleting=True),
        sibling("web-7d9c8b6f4-ended", phase="Failed", reason="Evicted"),
        other_rs,
    ]
    found = witnesses_of(MOVING, candidates, Config(), NOW, replicas=2)
    assert [(w.name, w.health) for w in found.pods] == [("web-7d9c8b6f4-k8m2p", Health.FAILED)]
    assert found.missing == 0


def test_a_replacement_not_created_yet_counts_as_missing() -> None:
    found = witnesses_of(MOVING, [MOVING, sibling()], Config(), NOW, replicas=3)
    assert found.missing == 1
    # A Job wants no fixed number of pods: nothing is missing.
    assert witnesses_of(MOVING, [MOVING], Config(), NOW, replicas=None).missing == 0


def test_a_bare_pod_is_alone() -> None:
    bare = pods.pod("solo", owner=None, node="node-a", containers=[pods.crash_looping()])
    assert witnesses_of(bare, [bare, sibling()], Config(), NOW, replicas=None) == ALONE


# -- a fresh twin proves nothing yet --------------------------------------------------------------


def crashing_after(ran_for: timedelta) -> Any:
    """The failing pod: its container crashed twice in a row, each run lasting ``ran_for``
    (an image that fails some seconds after start, as the kubelet records its last run)."""
    looping = pods.crash_looping(restarts=2)
    looping["lastState"]["terminated"] = pods.last_terminated(ran_for=ran_for)
    return pods.pod("web-7d9c8b6f4-x2x9z", node="node-b", containers=[looping])


def twin_ready_for(ready_for: timedelta) -> Any:
    """A twin on another node, Ready for ``ready_for``, never restarted (the kubelet turns a
    pod Ready 3 s after its creation in these builders)."""
    return pods.pod(
        "web-7d9c8b6f4-zksvb",
        node="node-d",
        started=NOW - ready_for - timedelta(seconds=1),
        containers=[pods.running(started=NOW - ready_for)],
    )


@pytest.mark.parametrize(
    ("ran_for", "ready_for", "health"),
    [
        # The demo's lookalike: an image crashing 20 s after start, a twin Ready for 7 s.
        (timedelta(seconds=20), timedelta(seconds=7), Health.UNPROVEN),
        (timedelta(seconds=20), timedelta(seconds=30), Health.UNPROVEN),
        (timedelta(seconds=20), timedelta(seconds=45), Health.HEALTHY),
        # A container failing at start: a twin Ready for the minimum has outlived it.
        (timedelta(seconds=1), timedelta(seconds=5), Health.UNPROVEN),
        (timedelta(seconds=1), timedelta(seconds=12), Health.HEALTHY),
        # A run longer than the crash-loop horizon: ten minutes of Ready are proof enough.
        (timedelta(minutes=30), timedelta(minutes=11), Health.HEALTHY),
    ],
    ids=["20s-vs-7s", "20s-vs-30s", "20s-vs-45s", "at-start-vs-5s", "at-start-vs-12s", "long-run"],
)
def test_a_twin_that_never_restarted_is_healthy_only_once_it_outlived_the_failing_pods_runs(
    ran_for: timedelta, ready_for: timedelta, health: Health
) -> None:
    failing = crashing_after(ran_for)
    found = witnesses_of(failing, [failing, twin_ready_for(ready_for)], Config(), NOW, replicas=2)
    assert [w.health for w in found.pods] == [health], found.pods[0].why
