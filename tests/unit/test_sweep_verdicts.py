"""update-annotations keeps the sweep's verdicts that a pod's status cannot repeat.

The sweep finds two failures classify never sees on a pod: stuck starting on its node for
too long (StuckPending) and a node that failed to create its sandbox (FailedCreatePodSandBox,
read in the kubelet's Events). update-annotations judges the pod again as it reads it; it
used to judge by classify alone, found nothing and dropped both as "no longer failing", so
neither was ever moved. Found on real nodes (tests/e2e/test_real_node_pipeline.py).
"""

from __future__ import annotations

from datetime import timedelta

from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.pods.update_annotations.decide import current_failure
from shared.workloads.classify import STUCK_PENDING, Failure, FailureKind, stuck_pending
from shared.workloads.owners import Holder, Ref
from shared.workloads.podevents import FAILED_CREATE_POD_SANDBOX

from . import pods
from .pods import NOW, running

CFG = Config()
HOLDER = Holder(Ref("ReplicaSet", "shop", "web-7d9c8b6f4", "u"), "1", {})


def sandbox_failure(node: str = "node-b") -> Failure:
    return Failure(
        kind=FailureKind.NODE_FIXABLE,
        reason=FAILED_CREATE_POD_SANDBOX,
        message='failed to find plugin "bridge" in path [/opt/cni/bin]',
        node=node,
        ran_for_seconds=0,
        why="the kubelet of node node-b failed to create the pod's sandbox 3 times in 40s",
    )


def test_a_pod_the_sweep_found_stuck_is_still_stuck_when_read_again() -> None:
    live = pods.pending_on_node(timedelta(minutes=11))
    found = stuck_pending(live, CFG, NOW)
    assert found is not None and found.reason == STUCK_PENDING
    failure, why_not = current_failure(live, FailingPod.from_pod(live, found), HOLDER, CFG, NOW)
    assert failure is not None and failure.reason == STUCK_PENDING, why_not


def test_a_stuck_pod_that_started_meanwhile_is_no_longer_failing() -> None:
    stuck = pods.pending_on_node(timedelta(minutes=11))
    found = stuck_pending(stuck, CFG, NOW)
    assert found is not None
    live = pods.pod(containers=[running()])
    failure, why_not = current_failure(live, FailingPod.from_pod(stuck, found), HOLDER, CFG, NOW)
    assert failure is None
    assert "no longer failing" in why_not


def test_a_sandbox_failure_stands_while_the_pod_still_has_no_sandbox_on_that_node() -> None:
    live = pods.pending_on_node(timedelta(seconds=40))
    failing = FailingPod.from_pod(live, sandbox_failure())
    failure, why_not = current_failure(live, failing, HOLDER, CFG, NOW)
    assert failure is not None and failure.reason == FAILED_CREATE_POD_SANDBOX, why_not


def test_a_sandbox_failure_is_dropped_once_the_pod_runs() -> None:
    pending = pods.pending_on_node(timedelta(seconds=40))
    failing = FailingPod.from_pod(pending, sandbox_failure())
    failure, _ = current_failure(pods.pod(containers=[running()]), failing, HOLDER, CFG, NOW)
    assert failure is None


def test_a_sandbox_failure_of_another_node_is_not_this_pods() -> None:
    live = pods.pending_on_node(timedelta(seconds=40))
    failing = FailingPod.from_pod(live, sandbox_failure(node="node-z"))
    failure, _ = current_failure(live, failing, HOLDER, CFG, NOW)
    assert failure is None
