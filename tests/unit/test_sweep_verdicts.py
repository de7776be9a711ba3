"""update-annotations judges the sweep's verdicts again, on evidence it reads itself.

The sweep finds two failures classify never sees on a pod: stuck starting on its node for
too long (StuckPending) and a node that failed to create its sandbox (FailedCreatePodSandBox,
read in the kubelet's Events). A report of either is a claim: any pod of the cluster can post
one to update-annotations. So the verdict is never taken from the report: the pod is read, and
while it is still starting on the reported node its Warning Events and its siblings are read
too (``ReadEvidence``), and the verdict is reached again with the full thresholds. It used to
be kept whenever the pod was still starting: a forged StuckPending report naming a pod created
3 s earlier deleted it and marked its node.

The sandbox scenario is the recorded one (tests/fixtures/real-kubelet/sandbox-cni-broken.json,
kubelet v1.36.3 with a broken CNI plugin: the pod and the kubelet's Events as written).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from shared.api.kubetypes import Pod
from shared.api.times import parse_kube_time
from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.pods.update_annotations.decide import ReadEvidence, current_failure
from shared.workloads.classify import STUCK_PENDING, Failure, FailureKind, stuck_pending
from shared.workloads.evidence import PodEvidence
from shared.workloads.owners import Holder, Ref
from shared.workloads.podevents import FAILED_CREATE_POD_SANDBOX, warning_events

from . import pods
from .pods import NOW, running

CFG = Config()
HOLDER = Holder(Ref("ReplicaSet", "shop", "web-7d9c8b6f4", "u"), "1", {})
RECORDED = json.loads(
    (
        Path(__file__).resolve().parent.parent
        / "fixtures"
        / "real-kubelet"
        / "sandbox-cni-broken.json"
    ).read_text()
)


def report(live: Pod, reason: str, node: str = "node-b") -> FailingPod:
    """A report of ``reason`` about ``live``, as the sweep (or a forger) sends it."""
    failure = Failure(
        kind=FailureKind.NODE_FIXABLE,
        reason=reason,
        message=f"{reason} on {node}",
        node=node,
        ran_for_seconds=0,
        why="as the report says",
    )
    return FailingPod.from_pod(live, failure)


def judged(live: Pod, failing: FailingPod, evidence: PodEvidence | None, now: Any = NOW) -> Any:
    return current_failure(live, failing, HOLDER, CFG, now, evidence=evidence)


def test_a_stuck_report_is_judged_again_only_after_the_evidence_is_read() -> None:
    live = pods.pending_on_node(timedelta(minutes=11))
    assert isinstance(judged(live, report(live, STUCK_PENDING), None), ReadEvidence)


def test_a_pod_stuck_past_the_threshold_is_still_stuck_when_read_again() -> None:
    live = pods.pending_on_node(timedelta(minutes=11))
    found = stuck_pending(live, CFG, NOW)
    assert found is not None and found.reason == STUCK_PENDING
    failure, why_not = judged(live, FailingPod.from_pod(live, found), PodEvidence())
    assert failure is not None and failure.reason == STUCK_PENDING, why_not


def test_a_forged_stuck_report_about_a_pod_three_seconds_old_moves_nothing() -> None:
    live = pods.pending_on_node(timedelta(seconds=3))
    failure, why_not = judged(live, report(live, STUCK_PENDING), PodEvidence())
    assert failure is None
    assert "no longer failing by the full rules" in why_not


def test_a_forged_stuck_report_about_a_pull_under_way_for_ninety_seconds_moves_nothing() -> None:
    live = pods.sandbox_ready_since(
        pods.pending_on_node(timedelta(seconds=95)), NOW - timedelta(seconds=90)
    )
    failure, _ = judged(live, report(live, STUCK_PENDING), PodEvidence())
    assert failure is None


def test_a_stuck_report_whose_evidence_could_not_be_read_moves_nothing() -> None:
    live = pods.pending_on_node(timedelta(minutes=11))
    unread = PodEvidence(unread="its Events could not be listed (403)")
    failure, why_not = judged(live, report(live, STUCK_PENDING), unread)
    assert failure is None and "could not be listed" in why_not


def test_a_stuck_pod_that_started_meanwhile_is_no_longer_failing() -> None:
    stuck = pods.pending_on_node(timedelta(minutes=11))
    live = pods.pod(containers=[running()])
    failure, why_not = judged(live, report(stuck, STUCK_PENDING), None)
    assert failure is None
    assert "no longer failing" in why_not


# -- the sandbox failure, as the kubelet recorded it ---------------------------------------------


def recorded() -> tuple[Pod, PodEvidence, Any]:
    """The recorded pod, its kubelet's Events read as update-annotations reads them, and the
    moment of the recording."""
    live = cast(Pod, RECORDED["pod"])
    uid = live["metadata"]["uid"]
    events = warning_events(RECORDED["events"]).get(uid, ())
    first = parse_kube_time(live["metadata"]["creationTimestamp"])
    assert first is not None
    return live, PodEvidence(events), first


def test_a_sandbox_failure_stands_once_the_kubelet_failed_for_the_threshold() -> None:
    live, evidence, first = recorded()
    node = live["spec"]["nodeName"]
    failing = report(live, FAILED_CREATE_POD_SANDBOX, node)
    failure, why_not = judged(live, failing, evidence, first + CFG.waiting_failure_after)
    assert failure is not None and failure.reason == FAILED_CREATE_POD_SANDBOX, why_not
    assert failure.node == node


def test_a_sandbox_failure_is_not_taken_before_its_threshold() -> None:
    live, evidence, first = recorded()
    failing = report(live, FAILED_CREATE_POD_SANDBOX, live["spec"]["nodeName"])
    failure, _ = judged(live, failing, evidence, first + timedelta(seconds=5))
    assert failure is None


def test_a_sandbox_failure_the_kubelet_never_recorded_is_not_taken() -> None:
    live, _, first = recorded()
    failing = report(live, FAILED_CREATE_POD_SANDBOX, live["spec"]["nodeName"])
    failure, _ = judged(live, failing, PodEvidence(), first + timedelta(minutes=2))
    assert failure is None


def test_a_sandbox_failure_reported_on_another_node_is_not_this_pods() -> None:
    live, evidence, first = recorded()
    failing = report(live, FAILED_CREATE_POD_SANDBOX, "node-z")
    failure, _ = judged(live, failing, evidence, first + timedelta(minutes=2))
    assert failure is None


def test_a_sandbox_failure_is_dropped_once_the_pod_runs() -> None:
    pending = pods.pending_on_node(timedelta(seconds=40))
    failing = report(pending, FAILED_CREATE_POD_SANDBOX)
    failure, _ = judged(pods.pod(containers=[running()]), failing, None)
    assert failure is None
