"""A workload that fails the same way on every node is not moved round the cluster.

The issue ("Do no harm on a production cluster", part 3): a Deployment of 2 replicas with
``scheduling-retries: "3"``, crash-looping on every node, was moved 9 times across one
rollout restart on the local stack. Here every node of the local control plane crash-loops
the pods bound to it (the simulated kubelet's ``sim.kn-rescheduler.io/fault`` label, fixed
for a pod when it is bound), detect-failures and update-annotations run in-process against the
real API server and our webhook, and every failing pod is sent again every second, as the
sweep and the kubelet's status updates do. The moves stop after a few, the budget is kept,
one Warning says why, and once a pod of the workload is healthy somewhere they resume.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.api.keys import REASON_MOVES_STOPPED, REASON_RETRIES_EXHAUSTED
from shared.api.state import WorkloadState
from shared.platform.kube import Kube
from tests import builders
from tests.e2e.conftest import Loop, holds, state_of, wait_for
from tests.e2e.test_rescheduling import events_for, only, pods, ready

pytestmark = pytest.mark.e2e

REPLICAS = 2
RETRIES = 3
# After the stop, failing pods keep being sent this long: no move may follow.
QUIET = 20.0


def pump_until(
    loop: Loop, namespace: str, what: str, done: Callable[[], bool], timeout: float
) -> None:
    """Send every failing pod of ``namespace`` once a second until ``done``."""

    def sent() -> bool:
        loop.pump(namespace)
        return done()

    wait_for(what, sent, timeout=timeout, every=1.0)


def unmoved(
    loop: Loop, namespace: str, state: Callable[[], WorkloadState], stopped: WorkloadState
) -> bool:
    """Deliver every failing pod's event again; whether no move was made since ``stopped``."""
    loop.pump(namespace)
    return state().moves == stopped.moves


def test_a_deployment_crash_looping_on_every_node_stops_being_moved_until_a_pod_is_healthy(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    faults("crashloop", *cluster.nodes)
    api.create(
        "Deployment", namespace, builders.deployment("web", replicas=REPLICAS, retries=str(RETRIES))
    )
    rs = wait_for("the ReplicaSet", lambda: list(api.list_all("ReplicaSet", namespace)))[0]
    name = rs["metadata"]["name"]

    def state() -> WorkloadState:
        return state_of(api, "ReplicaSet", namespace, name)

    pump_until(loop, namespace, "the moves to stop", lambda: state().stopped is not None, 240)
    stopped = state()
    # Nothing more happens however often the failing pods are sent.
    holds(
        "stopped, with no move since", lambda: unmoved(loop, namespace, state, stopped), QUIET, 1.0
    )
    after = state()
    print(
        f"\nstopped after {stopped.moves} moves: {stopped.stopped}; excluded {after.excluded_nodes}"
    )

    assert stopped.stopped is not None and stopped.stopped.reason == "CrashLoopBackOff"
    assert len(stopped.stopped.nodes) >= 2
    assert 1 <= stopped.moves <= 3, stopped
    assert after.moves == stopped.moves and after.stopped == stopped.stopped
    said = events_for(api, namespace, name, REASON_MOVES_STOPPED)
    assert [(e["type"], e.get("count", 1)) for e in said] == [("Warning", 1)]
    assert f"{stopped.moves} of {RETRIES * REPLICAS} used" in said[0]["message"]
    assert events_for(api, namespace, name, REASON_RETRIES_EXHAUSTED) == []
    crash_looping = [p["metadata"]["uid"] for p in pods(api, namespace)]
    assert len(crash_looping) == REPLICAS

    # The cluster is fixed and a third replica starts: Ready on a healthy node.
    faults(None, *cluster.nodes)
    api.merge_patch("Deployment", namespace, "web", {"spec": {"replicas": REPLICAS + 1}})

    def healthy_one() -> bool:
        return any(
            ready(p) and p["metadata"]["uid"] not in crash_looping for p in pods(api, namespace)
        )

    pump_until(loop, namespace, "a healthy pod", healthy_one, 120)
    # Moves resume: a crash-looping pod's next failure moves it, and the stop is lifted.
    pump_until(loop, namespace, "a move", lambda: state().moves > stopped.moves, 60)
    resumed = state()
    assert resumed.stopped is None
    assert resumed.moves == stopped.moves + 1 or resumed.moves == stopped.moves + 2
    moved = events_for(api, namespace, name, "Rescheduled")
    assert any("moves resumed" in e["message"] for e in moved), [e["message"] for e in moved]
    assert only(api, "ReplicaSet", namespace)["metadata"]["name"] == name


def test_a_lone_pod_whose_image_pulls_nowhere_stops_on_its_third_node(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    # The kubelet writes one failed pull as ErrImagePull, then ImagePullBackOff while it waits
    # to retry: which one a failure event carries is timing, and both are the same failure.
    faults("imagepull", *cluster.nodes)
    api.create("Deployment", namespace, builders.deployment("web", retries="10"))
    rs = wait_for("the ReplicaSet", lambda: list(api.list_all("ReplicaSet", namespace)))[0]
    name = rs["metadata"]["name"]

    def state() -> WorkloadState:
        return state_of(api, "ReplicaSet", namespace, name)

    pump_until(loop, namespace, "the moves to stop", lambda: state().stopped is not None, 120)
    stopped = state()
    holds(
        "stopped, with no move since", lambda: unmoved(loop, namespace, state, stopped), QUIET, 1.0
    )
    after = state()

    assert after.stopped is not None
    assert after.stopped.reason in {"ErrImagePull", "ImagePullBackOff"}
    assert len(after.stopped.nodes) == 3 and after.moves == 2, after
    said = events_for(api, namespace, name, REASON_MOVES_STOPPED)
    assert [(e["type"], e.get("count", 1)) for e in said] == [("Warning", 1)]
