"""The demo's account of the nodes: what it tells a person about suspect and pressured nodes.

The inputs are shaped as the pipeline and the API server produce them: assess-nodes' reply
``io.kn-rescheduler.node.suspected``, detect-failures' early report, a Node as assess-nodes and
label-nodes leave it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dev.stack.demo_model import Note, Timeline, Workload

WEB = Workload("Deployment", "web", 3)


def node(name: str, *, suspect: bool = False, pressure: float | None = None) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "type": "kwok"}
    annotations: dict[str, str] = {}
    taints: list[dict[str, str]] = []
    if suspect:
        labels["kn-rescheduler.io/suspect"] = "true"
        taints.append(
            {"key": "kn-rescheduler.io/suspect", "value": "true", "effect": "PreferNoSchedule"}
        )
    if pressure is not None:
        labels["status"] = "presure"
        annotations["kn-rescheduler.io/pressure"] = json.dumps(
            {
                "rule": "cpu-usage",
                "value": pressure,
                "since": "2026-11-23T15:38:50Z",
                "seen": "2026-11-23T15:38:50Z",
            }
        )
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"taints": taints},
    }


SUSPECTED = {
    "node": "node-3",
    "since": "2026-11-23T15:38:29Z",
    "workloads": [
        {"workload": "Job demo/report", "reason": "OOMKilled"},
        {"workload": "ReplicaSet demo/web-7f4498597c", "reason": "OOMKilled"},
    ],
    "tainted": True,
    "message": "2 distinct workloads failed on node node-3 in the last 10m0s (suspect from 2)",
}


@pytest.fixture
def told() -> list[Note]:
    return []


@pytest.fixture
def timeline(told: list[Note]) -> Timeline:
    return Timeline([WEB], {"node-3": "oom"}, told.append)


def test_a_suspicion_is_told_once_with_its_workloads_although_delivered_twice(
    timeline: Timeline, told: list[Note]
) -> None:
    timeline.on_node_suspected(1.0, SUSPECTED, source="assess-nodes")
    timeline.on_node_suspected(1.2, SUSPECTED, source="assess-nodes")
    assert [(n.subject, n.kind, n.source) for n in told] == [("node-3", "suspect", "assess-nodes")]
    assert "Job demo/report (OOMKilled), ReplicaSet demo/web-7f4498597c (OOMKilled)" in told[0].text
    assert timeline.nodes["node-3"].suspected == 1.0


@pytest.mark.parametrize(
    ("snapshots", "told_kinds", "labelled", "tainted", "cleared"),
    [
        # A quiet node is not told about at all.
        ([node("node-0")], [], None, None, None),
        # Label and taint appear together: one line, naming both; seen again, nothing new.
        ([node("node-3"), node("node-3", suspect=True), node("node-3", suspect=True)],
         ["suspect"], 2.0, 2.0, None),
        # The label goes (the window passed): told as cleared.
        ([node("node-3", suspect=True), node("node-3")], ["suspect", "info"], 1.0, 1.0, 2.0),
    ],
)  # fmt: skip
def test_the_suspect_label_and_taint_are_told_as_the_node_shows_them(
    timeline: Timeline,
    told: list[Note],
    snapshots: list[dict[str, Any]],
    told_kinds: list[str],
    labelled: float | None,
    tainted: float | None,
    cleared: float | None,
) -> None:
    for t, snapshot in enumerate(snapshots, start=1):
        timeline.on_node(float(t), snapshot)
    assert [n.kind for n in told] == told_kinds
    marks = timeline.nodes.get(snapshots[0]["metadata"]["name"])
    assert (marks.suspect_labelled if marks else None) == labelled
    assert (marks.suspect_tainted if marks else None) == tainted
    assert (marks.suspect_cleared if marks else None) == cleared
    if told_kinds[:1] == ["suspect"]:
        assert "tainted kn-rescheduler.io/suspect=true:PreferNoSchedule" in told[0].text


def test_the_pressure_label_is_told_with_its_rule_and_value_when_it_comes_and_goes(
    timeline: Timeline, told: list[Note]
) -> None:
    timeline.on_node(1.0, node("node-2"))
    timeline.on_node(2.0, node("node-2", pressure=78.4))
    timeline.on_node(3.0, node("node-2", pressure=80.1))
    timeline.on_node(4.0, node("node-2"))
    marks = timeline.nodes["node-2"]
    assert (marks.pressure_labelled, marks.pressure_cleared) == (2.0, 4.0)
    assert (marks.pressure_rule, marks.pressure_value) == ("cpu-usage", 78.4)
    assert [n.text for n in told] == [
        "label-nodes labelled it status=presure: rule cpu-usage read 78",
        "label-nodes removed its label status=presure",
    ]


def web_pod(name: str, uid: str, node: str) -> dict[str, Any]:
    """A running pod of the demo's Deployment web, as the timeline's pod feed passes it."""
    return {
        "metadata": {"namespace": "demo", "name": name, "uid": uid, "labels": {"app": "web"}},
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


def test_an_early_report_is_a_first_failure_not_the_failure_that_moves_the_pod(
    timeline: Timeline, told: list[Note]
) -> None:
    pod = web_pod("web-7f4498597c-l7n9x", "0f130265-a747-4832-9497-beb4d540be79", "node-1")
    timeline.on_pod(0.5, pod)
    early = {
        "namespace": "demo",
        "name": "web-7f4498597c-l7n9x",
        "uid": "0f130265-a747-4832-9497-beb4d540be79",
        "node": "node-1",
        "kind": "early",
        "reason": "CrashLoopBackOff",
        "restartCount": 1,
    }
    timeline.on_failing(1.0, early, source="detect-failures")
    life = timeline.pods["0f130265-a747-4832-9497-beb4d540be79"]
    assert (life.first_failure, life.failing) == (1.0, None)
    assert told[-1].kind == "early"
    assert told[-1].text == (
        "first failure on node-1: CrashLoopBackOff after 1 restart; "
        "node-1 is not suspect: moved at the threshold, or sooner with evidence beside it"
    )
    # At the threshold: the failure that moves it.
    timeline.on_failing(
        7.0, {**early, "kind": "node-fixable", "restartCount": 3}, source="detect-failures"
    )
    assert life.failing == 7.0 and told[-1].kind == "failing"
    assert "node-1" in timeline.bad_nodes()


def test_a_move_before_the_thresholds_says_the_evidence_it_rested_on(
    timeline: Timeline, told: list[Note]
) -> None:
    pod = web_pod("web-7f4498597c-l7n9x", "u-3", "node-1")
    timeline.on_pod(0.5, pod)
    # update-annotations' reply after a corroborated move (its plan's message, as sent).
    moved = {
        "namespace": "demo",
        "name": "web-7f4498597c-l7n9x",
        "uid": "u-3",
        "node": "node-1",
        "reason": "CrashLoopBackOff",
        "kind": "node-fixable",
        "action": "move",
        "workload": {"kind": "ReplicaSet", "name": "web-7f4498597c"},
        "moves": 1,
        "budget": 9,
        "excludedNodes": ["node-1"],
        "message": (
            "moved web-7f4498597c-l7n9x off node node-1 after CrashLoopBackOff (move 1 of 9); "
            "before the thresholds: corroborated: 1 other workload(s) fail on node node-1 now "
            "(demo/Job/report)"
        ),
    }
    timeline.on_decision(4.0, moved, source="update-annotations")
    assert told[-1].kind == "moved"
    assert told[-1].text.endswith(
        "moved before the thresholds: corroborated: 1 other workload(s) fail on node node-1 now "
        "(demo/Job/report)"
    )


def test_an_early_report_on_a_suspect_node_is_told_as_the_fast_path(
    timeline: Timeline, told: list[Note]
) -> None:
    timeline.on_node_suspected(1.0, SUSPECTED, source="assess-nodes")
    pod = web_pod("web-7f4498597c-9t2kq", "u-2", "node-3")
    timeline.on_pod(1.5, pod)
    early = {
        "namespace": "demo",
        "name": "web-7f4498597c-9t2kq",
        "uid": "u-2",
        "node": "node-3",
        "kind": "early",
        "reason": "OOMKilled",
        "restartCount": 0,
    }
    timeline.on_failing(2.0, early, source="detect-failures")
    assert told[-1].text == (
        "first failure on node-3: OOMKilled; node-3 is suspect: moved now (the fast path)"
    )
