"""Blaming nodes: which reports count, when a node turns suspect, the cap, the Node patch."""

from __future__ import annotations

import copy
import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.api import movedoff
from shared.api.keys import (
    EVENT_POD_EXHAUSTED,
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    FAILING_WORKLOADS_LABEL,
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    NODE_OPT_OUT_LABEL,
    REASON_RESCHEDULED,
    SUSPECT_LABEL,
)
from shared.api.nodehealth import MAX_FAILURES, NodeHealth, Seen, load
from shared.api.records import RecordError
from shared.api.workloadid import family, workload_id
from shared.nodes.assess_nodes import decide
from shared.nodes.assess_nodes.decide import (
    Blame,
    NodeFacts,
    NotEvidence,
    Standing,
    Verdict,
    allowed_suspects,
    assess,
    claim_from_event,
    moved_off_removal,
    node_patch,
    over_cap,
    within_cap,
    workload_of_pod,
)
from shared.nodes.assess_nodes.handler import Assessor
from shared.platform import kube
from shared.platform.config import Config
from shared.platform.events import Event, Reply
from shared.pods.detect_failures.decide import detect
from shared.pods.failing import FailingPod
from shared.pods.update_annotations.bodies import replacement_name
from shared.pods.update_annotations.handler import Rescheduler
from shared.workloads.owners import Resolution, holder_of
from shared.workloads.state import Action, Plan
from tests.unit import nodes, pods
from tests.unit import test_jobs as jobs_builder
from tests.unit.test_owners import replicaset

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
CFG = Config()


def failing_data(node: str = "node-1", restarts: int = 4) -> dict[str, Any]:
    """What detect-failures really sends about a crash-looping ReplicaSet pod."""
    pod = pods.pod(containers=[pods.crash_looping(restarts=restarts)], node=node)
    reply = detect(Event("1", "s", "dev.knative.apiserver.resource.update", {}, pod), CFG)
    assert reply is not None
    return dict(reply.data)


def outcome_data(
    kind: str = "ReplicaSet",
    name: str = "web-7c9d",
    node: str = "node-1",
    report: str | None = None,
) -> Any:
    """What update-annotations replies after a move (io.kn-rescheduler.pod.rescheduled);
    ``report``: the kind of the failure report it acted on (None: a reply from before it said,
    shaped as update-annotations wrote it then)."""
    data = {
        "namespace": "shop",
        "name": f"{name}-x2k9p",
        "uid": f"uid-{name}-x2k9p",
        "node": node,
        "reason": "CrashLoopBackOff",
        "action": "move",
        "workload": {"kind": kind, "name": name},
        "moves": 1,
        "budget": 6,
        "excludedNodes": [node],
        "exclusionsCleared": False,
        "message": "moved",
    }
    if report is not None:
        data["kind"] = report
    return data


def blame(workload: str, minutes_ago: float = 1, node: str = "node-1", pod: str = "") -> Blame:
    at = NOW - timedelta(minutes=minutes_ago)
    return Blame(node, workload, pod or f"uid-{workload}-{minutes_ago}", "CrashLoopBackOff", at)


def facts(record: NodeHealth | None = None, **kw: Any) -> NodeFacts:
    annotations = {NODE_HEALTH_ANNOTATION: record.to_json()} if record is not None else {}
    return NodeFacts.from_node(nodes.node(annotations=annotations, **kw))


# -- which reports blame a node ------------------------------------------------------------------


def test_a_failing_report_claims_its_node_reason_and_time() -> None:
    # Only a claim: what is counted comes from the API (tests/unit/test_report_confirmation.py).
    found = claim_from_event(EVENT_POD_FAILING, failing_data(), "2026-11-23T09:59:00Z", NOW)
    assert (found.node, found.reason, found.holder) == ("node-1", "CrashLoopBackOff", None)
    assert found.at == NOW - timedelta(minutes=1)


@pytest.mark.parametrize("event_type", [EVENT_POD_RESCHEDULED, EVENT_POD_EXHAUSTED])
def test_a_move_or_an_exhausted_budget_names_the_holder_to_confirm_it_on(event_type: str) -> None:
    found = claim_from_event(event_type, outcome_data(report="node-fixable"), None, NOW)
    assert (found.node, found.holder, found.at) == ("node-1", ("ReplicaSet", "web-7c9d"), NOW)


def test_a_report_from_the_future_counts_as_now() -> None:
    data = outcome_data(report="node-fixable")
    found = claim_from_event(EVENT_POD_RESCHEDULED, data, "2027-01-01T00:00:00Z", NOW)
    assert found.at == NOW


@pytest.mark.parametrize(
    ("event_type", "change"),
    [
        ("dev.knative.apiserver.resource.update", {}),
        (EVENT_POD_FAILING, {"kind": "early"}),
        (EVENT_POD_FAILING, {"kind": "exclusions-unschedulable", "node": None}),
        (EVENT_POD_RESCHEDULED, {"node": None}),
        (EVENT_POD_RESCHEDULED, {"kind": "early"}),
        (EVENT_POD_EXHAUSTED, {"kind": "early"}),
    ],
    ids=[
        "not-a-report",
        "early-report",
        "unschedulable",
        "no-node",
        "fast-path-move",
        "fast-path-exhausted",
    ],
)
def test_reports_that_say_nothing_against_a_node_are_not_evidence(
    event_type: str, change: dict[str, Any]
) -> None:
    data = (
        failing_data() if event_type == EVENT_POD_FAILING else outcome_data(report="node-fixable")
    )
    data.update(change)
    with pytest.raises(NotEvidence):
        claim_from_event(event_type, data, None, NOW)


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"namespace": "shop"},
        {**outcome_data(report="node-fixable"), "workload": "web"},
        {**outcome_data(report="node-fixable"), "node": 3},
    ],
)
def test_a_malformed_report_is_refused(data: Any) -> None:
    with pytest.raises(ValueError) as err:
        claim_from_event(EVENT_POD_RESCHEDULED, data, None, NOW)
    assert not isinstance(err.value, NotEvidence)


# -- the record ----------------------------------------------------------------------------------


def test_the_same_failure_reported_twice_is_one_entry() -> None:
    first = NodeHealth().with_failure(blame("A", 2, pod="p1").seen())
    again = first.with_failure(blame("A", 2, pod="p1").seen())
    assert again == first


def test_reports_in_any_order_give_the_same_record() -> None:
    reports = [blame("A", 3), blame("B", 2), blame("A", 1), blame("C", 4)]
    records = set()
    for order in itertools.permutations(reports):
        record = NodeHealth()
        for report in order:
            record = record.with_failure(report.seen())
        records.add(record.to_json())
    assert len(records) == 1


def test_the_record_keeps_the_newest_failures_only() -> None:
    record = NodeHealth()
    for i in range(MAX_FAILURES + 10):
        record = record.with_failure(blame(f"W{i}", minutes_ago=100 - i).seen())
    assert len(record.failures) == MAX_FAILURES
    assert record.failures[-1].workload == f"W{MAX_FAILURES + 9}"


def test_a_record_reads_back_what_was_written() -> None:
    record = NodeHealth((blame("A").seen(),), NOW, ("A",))
    assert load(record.to_json()) == record


@pytest.mark.parametrize(
    "raw",
    [
        "{",
        "[]",
        '{"version": 2, "failures": []}',
        '{"version": 1}',
        '{"version": 1, "failures": [{"workload": "A"}]}',
        '{"version": 1, "failures": [], "suspect": {"since": "yesterday"}}',
        json.dumps({"version": 1, "failures": [], "pad": "x" * 20000}),
    ],
)
def test_an_unreadable_record_is_an_error_not_an_empty_record(raw: str) -> None:
    with pytest.raises(RecordError):
        load(raw)


# -- when a node turns suspect -------------------------------------------------------------------


def record_of(*reports: Blame, suspect_since: datetime | None = None) -> NodeHealth:
    record = NodeHealth()
    for report in reports:
        record = record.with_failure(report.seen())
    if suspect_since is not None:
        record = NodeHealth(
            record.failures, suspect_since, record.workloads(NOW, CFG.suspect_window)
        )
    return record


@pytest.mark.parametrize(
    ("before", "report", "verdict"),
    [
        # One workload, however many of its pods fail, says nothing about the node.
        (record_of(blame("A", 3, pod="a1")), blame("A", 1, pod="a2"), Verdict.HEALTHY),
        # A second distinct workload within the window does.
        (record_of(blame("A", 3)), blame("B", 1), Verdict.MARK),
        # The first failure is outside the window (10 min): still one workload.
        (record_of(blame("A", 11)), blame("B", 1), Verdict.HEALTHY),
        # A report older than the window is ignored.
        (record_of(blame("A", 3)), blame("B", 12), Verdict.HEALTHY),
        # Suspect, and failures keep coming: it stays suspect.
        (record_of(blame("A", 3), blame("B", 2), suspect_since=NOW), blame("A", 0), Verdict.STAYS),
    ],
    ids=["one-workload", "two-workloads", "first-too-old", "report-too-old", "stays"],
)
def test_a_node_turns_suspect_when_enough_distinct_workloads_fail_there_recently(
    before: NodeHealth, report: Blame, verdict: Verdict
) -> None:
    assert assess(facts(before), report, NOW, CFG).verdict is verdict


def test_marking_says_which_workloads_failed_and_why() -> None:
    done = assess(facts(record_of(blame("A", 3))), blame("B", 1), NOW, CFG)
    assert [w for w, _ in done.workloads] == ["A", "B"]
    assert done.record.suspect_since == NOW - timedelta(minutes=1)
    assert "2 distinct workloads failed on node node-1 in the last 10m" in done.why


def test_the_threshold_is_a_setting() -> None:
    three = Config(suspect_workloads=3)
    assert assess(facts(record_of(blame("A", 3))), blame("B", 1), NOW, three).verdict is (
        Verdict.HEALTHY
    )


def test_a_suspicion_expires_when_the_window_passes_without_a_new_failure() -> None:
    old = record_of(blame("A", 15), blame("B", 12), suspect_since=NOW - timedelta(minutes=12))
    done = assess(facts(old, labels={SUSPECT_LABEL: "true"}), None, NOW, CFG)
    assert done.verdict is Verdict.CLEAR
    assert done.record.suspect_since is None and done.record.failures == ()
    assert "suspicion expired" in done.why


def test_a_node_with_the_opt_out_label_is_never_marked_and_loses_old_marks() -> None:
    opted = {NODE_OPT_OUT_LABEL: "true"}
    fresh = assess(facts(record_of(blame("A", 3)), labels=opted), blame("B", 1), NOW, CFG)
    assert fresh.verdict is Verdict.HEALTHY
    marked = record_of(blame("A", 3), blame("B", 2), suspect_since=NOW)
    later = assess(facts(marked, labels={**opted, SUSPECT_LABEL: "true"}), None, NOW, CFG)
    assert later.verdict is Verdict.CLEAR


# -- the cap -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedulable", "share", "allowed"), [(4, 0.3, 1), (10, 0.3, 3), (3, 0.3, 0), (240, 0.3, 72)]
)
def test_the_cap_is_the_share_of_schedulable_nodes_rounded_down(
    schedulable: int, share: float, allowed: int
) -> None:
    assert allowed_suspects(schedulable, share) == allowed


def test_with_room_under_the_cap_a_candidate_is_marked() -> None:
    decision = within_cap(Standing("node-2", 2, False), [Standing("node-1", 3, True)], 2)
    assert decision.mark and decision.displaced == ()


def test_at_the_cap_a_candidate_with_fewer_failures_is_not_marked_and_told_why() -> None:
    decision = within_cap(Standing("node-2", 2, False), [Standing("node-1", 3, True)], 1)
    assert not decision.mark
    assert "1 of the schedulable nodes are suspect already" in decision.why


def test_at_the_cap_a_tie_keeps_the_node_already_marked() -> None:
    assert not within_cap(Standing("node-0", 2, False), [Standing("node-9", 2, True)], 1).mark


def test_at_the_cap_a_candidate_with_more_failures_displaces_the_weakest() -> None:
    decision = within_cap(Standing("node-2", 4, False), [Standing("node-1", 2, True)], 1)
    assert decision.mark and decision.displaced == ("node-1",)


def test_two_marks_made_at_once_beyond_the_cap_take_back_the_lower_ranked() -> None:
    marked = [Standing("node-2", 2, True), Standing("node-1", 2, True), Standing("node-3", 5, True)]
    assert over_cap(marked, 2) == ("node-2",)


# -- the Node patch ------------------------------------------------------------------------------


def test_marking_labels_taints_and_records_in_one_compare_and_swap() -> None:
    node = facts(taints=[{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])
    record = record_of(blame("A"), blame("B"), suspect_since=NOW)
    patch = node_patch(node, record, suspect=True, taint=True, failing="2")
    assert patch is not None
    assert patch["metadata"]["resourceVersion"] == "48211"
    assert patch["metadata"]["labels"] == {SUSPECT_LABEL: "true", FAILING_WORKLOADS_LABEL: "2"}
    assert patch["metadata"]["annotations"] == {NODE_HEALTH_ANNOTATION: record.to_json()}
    assert patch["spec"]["taints"] == [
        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
        {"key": SUSPECT_LABEL, "value": "true", "effect": "PreferNoSchedule"},
    ]


def test_clearing_removes_only_our_label_and_taint() -> None:
    ours = {"key": SUSPECT_LABEL, "value": "true", "effect": "PreferNoSchedule"}
    record = record_of(blame("A"), blame("B"), suspect_since=NOW)
    node = facts(
        record,
        labels={SUSPECT_LABEL: "true", FAILING_WORKLOADS_LABEL: "2"},
        unschedulable=True,
        taints=[ours],
    )
    patch = node_patch(node, NodeHealth(record.failures), suspect=False, taint=True, failing="2")
    assert patch is not None
    assert patch["metadata"]["labels"] == {SUSPECT_LABEL: None}
    assert patch["spec"]["taints"] == [
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    ]


def test_blame_never_adds_a_taint_that_keeps_pods_off_or_evicts_them() -> None:
    patch = node_patch(
        facts(),
        record_of(blame("A"), blame("B"), suspect_since=NOW),
        suspect=True,
        taint=True,
        failing="2",
    )
    assert patch is not None
    assert {t["effect"] for t in patch["spec"]["taints"]} == {"PreferNoSchedule"}


def test_without_the_taint_setting_a_suspect_node_is_only_labelled() -> None:
    patch = node_patch(
        facts(),
        record_of(blame("A"), blame("B"), suspect_since=NOW),
        suspect=True,
        taint=False,
        failing="2",
    )
    assert patch is not None and "spec" not in patch


def test_a_node_that_already_says_it_all_is_not_written() -> None:
    record = record_of(blame("A"), blame("B"), suspect_since=NOW)
    ours = {"key": SUSPECT_LABEL, "value": "true", "effect": "PreferNoSchedule"}
    node = facts(
        record, labels={SUSPECT_LABEL: "true", FAILING_WORKLOADS_LABEL: "2"}, taints=[ours]
    )
    assert node_patch(node, record, suspect=True, taint=True, failing="2") is None


@pytest.mark.parametrize(
    ("failures", "labels", "expected"),
    [
        # One workload failing: no suspicion, but the node says it (the webhook reads it).
        (("A",), {}, "1"),
        # A second workload: the count follows.
        (("A", "B"), {}, "2"),
        # The same workload again (another pod, a redelivery): still one.
        (("A", "A"), {}, "1"),
        # The operator opted the node out: nothing of ours on it.
        (("A",), {NODE_OPT_OUT_LABEL: ""}, None),
    ],
    ids=["one-workload", "two-workloads", "same-workload-twice", "opted-out"],
)
def test_a_node_is_labelled_with_how_many_workloads_fail_there_now(
    failures: tuple[str, ...], labels: dict[str, str], expected: str | None
) -> None:
    node = facts(labels=labels)
    assessment = None
    for workload in failures:
        assessment = assess(node, blame(workload), NOW, CFG)
        node = facts(assessment.record, labels=labels)
    assert assessment is not None
    assert assessment.failing_label(node) == expected


def test_the_failing_workloads_label_goes_when_the_failures_age_out_of_the_window() -> None:
    record = record_of(blame("A"))
    node = facts(record, labels={FAILING_WORKLOADS_LABEL: "1"})
    later = NOW + CFG.suspect_window + timedelta(seconds=1)
    assessment = assess(node, None, later, CFG)
    patch = node_patch(node, assessment.record, suspect=False, taint=True, failing=None)
    assert assessment.failing_label(node) is None
    assert patch is not None
    assert patch["metadata"]["labels"] == {FAILING_WORKLOADS_LABEL: None}


def test_an_opted_out_node_loses_the_failing_workloads_label_it_carried() -> None:
    labels = {NODE_OPT_OUT_LABEL: "", FAILING_WORKLOADS_LABEL: "1"}
    node = facts(record_of(blame("A")), labels=labels)
    assessment = assess(node, blame("B"), NOW, CFG)
    assert assessment.verdict is Verdict.CLEAR
    patch = node_patch(
        node, assessment.record, suspect=False, taint=True, failing=assessment.failing_label(node)
    )
    assert patch is not None and patch["metadata"]["labels"] == {FAILING_WORKLOADS_LABEL: None}


def moved_off(age: timedelta) -> dict[str, str]:
    """A moved-off mark as update-annotations writes it, for a move ``age`` before NOW."""
    return {MOVED_OFF_LABEL: movedoff.mark_value(NOW - age)}


EXPIRED = moved_off(CFG.moved_off_window + timedelta(minutes=3))


@pytest.mark.parametrize(
    ("labels", "drop", "suspect", "expected"),
    [
        # Only the mark to remove: a patch of it alone (the record as read is written as read).
        (EXPIRED, True, False, {MOVED_OFF_LABEL: None}),
        # Not told: the mark stays, and nothing else to write is no write.
        (EXPIRED, False, False, None),
        # Told, but there is no mark: no write for it.
        ({}, True, False, None),
        # Alongside another change: one patch, both labels.
        (EXPIRED, True, True, {MOVED_OFF_LABEL: None, SUSPECT_LABEL: "true"}),
        # Not told, alongside another change: the mark is not in the patch.
        (EXPIRED, False, True, {SUSPECT_LABEL: "true"}),
    ],
    ids=["only-the-mark", "not-told", "no-mark", "with-a-mark", "not-told-with-a-mark"],
)
def test_the_node_patch_removes_the_moved_off_mark_when_told(
    labels: dict[str, str], drop: bool, suspect: bool, expected: dict[str, Any] | None
) -> None:
    record = record_of(blame("A"), blame("B"), suspect_since=NOW if suspect else None)
    node = facts(record, labels=labels)
    patch = node_patch(
        node,
        node.record,
        suspect=suspect,
        taint=False,
        failing=node.failing_label,
        drop_moved_off=drop,
    )
    if expected is None:
        assert patch is None
        return
    assert patch is not None
    assert patch["metadata"]["labels"] == expected
    assert patch["metadata"]["resourceVersion"] == "48211"


def test_the_moved_off_removal_is_a_compare_and_swap_of_that_label_alone() -> None:
    node = facts(record_of(blame("A", 30)), labels={**EXPIRED, FAILING_WORKLOADS_LABEL: "1"})
    assert moved_off_removal(node) == {
        "metadata": {"resourceVersion": "48211", "labels": {MOVED_OFF_LABEL: None}}
    }
    assert moved_off_removal(facts()) is None


def test_a_seen_failure_orders_by_time_first() -> None:
    early = Seen(NOW - timedelta(minutes=1), "Z", "p", "r")
    late = Seen(NOW, "A", "p", "r")
    assert sorted([late, early]) == [early, late]


# -- which moves are evidence (the fast path) ---------------------------------------------------


class NoApi(kube.Kube):
    """Building a reply reads nothing: any call would be a test failure."""

    def __init__(self) -> None:
        pass


def move_plan(node: str) -> Plan:
    return Plan(
        Action.MOVE,
        None,
        "node-failure",
        REASON_RESCHEDULED,
        f"moved off node {node}",
        delete_pod=True,
        moves=1,
        budget=3,
        excluded_nodes=(node,),
    )


def reply_after_move(
    pod: Any, holder_kind: str = "ReplicaSet", holder: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """The type and data update-annotations replies after moving ``pod``."""
    reply = move_reply(pod, holder_kind, holder)
    return reply.type, dict(reply.data)


def move_reply(
    pod: Any, holder_kind: str = "ReplicaSet", holder: dict[str, Any] | None = None
) -> Reply:
    """What update-annotations replies after moving ``pod``: detect-failures' report of it,
    read as update-annotations reads it, and the holder as the API returns it."""
    report = detect(
        Event("1", "s", "dev.knative.apiserver.resource.update", {}, pod), CFG, pods.NOW
    )
    assert report is not None
    failing = FailingPod.from_data(report.data)
    held = holder_of(holder_kind, holder if holder is not None else replicaset())
    resolution = Resolution(holder_kind, held, "3", held.ref, chain=(held.ref,))
    node = failing.failure.node or ""
    reply = Rescheduler(NoApi(), CFG)._reply(failing, Action.MOVE, move_plan(node), resolution)
    assert reply is not None
    return reply


def test_every_delivery_that_says_a_pod_was_moved_says_the_same_event() -> None:
    # Two reports of one pod race (or the Broker redelivers one): each delivery that finds the
    # move recorded replies, and a consumer drops the second as a duplicate (same source, id).
    crashing = pods.pod("web-1", containers=[pods.crash_looping(restarts=3)])
    first, again = move_reply(crashing), move_reply(copy.deepcopy(crashing))
    assert first.id and first.id == again.id
    other = pods.pod("web-2", containers=[pods.crash_looping(restarts=3)])
    assert move_reply(other).id != first.id


@pytest.mark.parametrize(
    ("restarts", "evidence"),
    [
        # The fast path: the pod's first crash, on a node already suspect, moved at once.
        (1, False),
        # The restart threshold (3 in a row): the full rules called it failing.
        (3, True),
    ],
    ids=["fast-path-move", "threshold-move"],
)
def test_a_move_is_evidence_only_when_the_full_rules_called_the_pod_failing(
    restarts: int, evidence: bool
) -> None:
    pod = pods.pod(containers=[pods.crash_looping(restarts=restarts)])
    event_type, data = reply_after_move(pod)
    assert event_type == EVENT_POD_RESCHEDULED
    if evidence:
        assert claim_from_event(event_type, data, None, NOW).node == "node-b"
    else:
        with pytest.raises(NotEvidence, match="early"):
            claim_from_event(event_type, data, None, NOW)


def test_a_move_reported_without_its_kind_is_not_counted_again() -> None:
    # An update-annotations older than the kind in its replies: the move may have been a
    # fast-path one, and a threshold move's own pod.failing report has counted it already.
    old = outcome_data()
    assert "kind" not in old
    with pytest.raises(NotEvidence):
        claim_from_event(EVENT_POD_RESCHEDULED, old, None, NOW)


# -- distinct workloads are top-level workloads ----------------------------------------------


def cronjob_run(cronjob: str = "nightly", minutes: int = 29_383_920) -> dict[str, Any]:
    """A Job as the CronJob controller makes it: ``<cronjob>-<scheduled time in minutes>``,
    controlled by the CronJob (pkg/controller/cronjob/utils.go getJobFromTemplate2)."""
    run = jobs_builder.job()
    run["metadata"]["name"] = f"{cronjob}-{minutes}"
    run["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "name": cronjob,
            "uid": pods.uid(f"CronJob/{cronjob}"),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    return dict(run)


@pytest.mark.parametrize(
    ("holder_kind", "holder", "top"),
    [
        ("ReplicaSet", replicaset("web-7d9c8b6f4", deployment="web"), ("Deployment", "web")),
        ("Job", cronjob_run("nightly"), ("CronJob", "nightly")),
        # A ReplicaSet nobody controls is its own top-level workload.
        (
            "ReplicaSet",
            replicaset("web-7d9c8b6f4", deployment=None),
            ("ReplicaSet", "web-7d9c8b6f4"),
        ),
    ],
    ids=["deployment", "cronjob", "bare-replicaset"],
)
def test_the_reply_after_a_move_names_the_holder_and_its_top_level_workload(
    holder_kind: str, holder: dict[str, Any], top: tuple[str, str]
) -> None:
    pod = pods.pod(containers=[pods.crash_looping(restarts=3)])
    _, data = reply_after_move(pod, holder_kind, holder)
    assert data["workload"] == {"kind": holder_kind, "name": holder["metadata"]["name"]}
    assert data["topWorkload"] == {"kind": top[0], "name": top[1]}
    assert data["kind"] == "node-fixable"
    # What assess-nodes counts is the holder's own controller as it reads the holder.
    assert claim_from_event(EVENT_POD_RESCHEDULED, data, None, NOW).holder == (
        holder_kind,
        holder["metadata"]["name"],
    )
    assert decide.record_of(holder_of(holder_kind, holder)).workload == workload_id(
        top[0], "shop", top[1]
    )


def failing_of(owner: tuple[str, str] | None, name: str, restarts: int = 4) -> dict[str, Any]:
    """detect-failures' report of a crash-looping pod of ``owner`` on node-1."""
    pod = pods.pod(
        name, owner=owner, containers=[pods.crash_looping(restarts=restarts)], node="node-1"
    )
    reply = detect(Event("1", "s", "dev.knative.apiserver.resource.update", {}, pod), CFG)
    assert reply is not None
    return dict(reply.data)


def moved_of(kind: str, name: str, top: tuple[str, str] | None, pod: str) -> dict[str, Any]:
    """update-annotations' reply after moving ``pod`` off node-1 (``top``: None for a reply
    from a version that did not say it)."""
    data = {**outcome_data(kind, name, report="node-fixable"), "name": pod, "uid": f"uid-{pod}"}
    if top is not None:
        data["topWorkload"] = {"kind": top[0], "name": top[1]}
    return data


def counted(event_type: str, data: dict[str, Any], at: str) -> Blame:
    """The blame assess-nodes records once it confirmed the report: a failing report's
    workload as the live pod's controller names it (the pod as the report describes it), a
    reply's as the holder's own controller names it (the reply's topWorkload, as
    update-annotations read it; the holder itself when it has none)."""
    claim = claim_from_event(event_type, data, at, NOW)
    if event_type == EVENT_POD_FAILING:
        pod = {"metadata": {k: data[k] for k in ("namespace", "name", "ownerReferences")}}
        workload = workload_of_pod(pod)
    else:
        top = data.get("topWorkload") or data["workload"]
        workload = workload_id(top["kind"], claim.namespace, top["name"])
    return Blame(claim.node, workload, claim.uid, claim.reason, claim.at)


# Reports of pods of one Deployment across a `kubectl rollout restart` (a new ReplicaSet,
# named <deployment>-<pod-template-hash> by pkg/controller/deployment/sync.go), of one CronJob
# across two runs (a new Job each, <cronjob>-<minutes>), and of two Deployments.
ROLLOUT = [
    (EVENT_POD_FAILING, failing_of(("ReplicaSet", "web-7d9c8b6f4"), "web-7d9c8b6f4-x2x9z")),
    (EVENT_POD_FAILING, failing_of(("ReplicaSet", "web-5c8f9d7b6"), "web-5c8f9d7b6-q8w2n")),
]
ROLLOUT_MOVES = [
    (EVENT_POD_RESCHEDULED, moved_of("ReplicaSet", "web-7d9c8b6f4", ("Deployment", "web"), "a")),
    (EVENT_POD_RESCHEDULED, moved_of("ReplicaSet", "web-5c8f9d7b6", ("Deployment", "web"), "b")),
]
MIXED = [
    (EVENT_POD_FAILING, failing_of(("ReplicaSet", "web-7d9c8b6f4"), "web-7d9c8b6f4-x2x9z")),
    (EVENT_POD_RESCHEDULED, moved_of("ReplicaSet", "web-5c8f9d7b6", ("Deployment", "web"), "b")),
    # A reply from before topWorkload: its ReplicaSet's name still says its Deployment.
    (EVENT_POD_RESCHEDULED, moved_of("ReplicaSet", "web-9f6d4b8c7", None, "c")),
]
CRONJOB_RUNS = [
    (EVENT_POD_FAILING, failing_of(("Job", "nightly-29383920"), "nightly-29383920-k2v7d")),
    (EVENT_POD_FAILING, failing_of(("Job", "nightly-29383980"), "nightly-29383980-m4x8p")),
    (EVENT_POD_RESCHEDULED, moved_of("Job", "nightly-29384040", ("CronJob", "nightly"), "d")),
]
# A bare pod and its replacement (update-annotations names it after the pod it replaces).
BARE_POD_MOVES = [
    (EVENT_POD_FAILING, failing_of(None, "solo")),
    (
        EVENT_POD_FAILING,
        failing_of(None, replacement_name({"metadata": {"name": "solo", "uid": pods.uid("solo")}})),
    ),
]
TWO_DEPLOYMENTS = [
    (EVENT_POD_FAILING, failing_of(("ReplicaSet", "web-7d9c8b6f4"), "web-7d9c8b6f4-x2x9z")),
    (EVENT_POD_FAILING, failing_of(("ReplicaSet", "api-6b9f8d5c4"), "api-6b9f8d5c4-r7t2w")),
]


@pytest.mark.parametrize(
    ("reports", "verdict", "count"),
    [
        (ROLLOUT, Verdict.HEALTHY, 1),
        (ROLLOUT_MOVES, Verdict.HEALTHY, 1),
        (MIXED, Verdict.HEALTHY, 1),
        (CRONJOB_RUNS, Verdict.HEALTHY, 1),
        (BARE_POD_MOVES, Verdict.HEALTHY, 1),
        (TWO_DEPLOYMENTS, Verdict.MARK, 2),
    ],
    ids=[
        "rollout",
        "rollout-moves",
        "old-and-new-replies",
        "cronjob-runs",
        "bare-pod-moves",
        "two-deployments",
    ],
)
def test_a_workloads_successive_controllers_are_one_distinct_workload(
    reports: list[tuple[str, dict[str, Any]]], verdict: Verdict, count: int
) -> None:
    record = NodeHealth()
    for minutes_ago, (event_type, data) in enumerate(reversed(reports), start=1):
        at = (NOW - timedelta(minutes=minutes_ago)).isoformat().replace("+00:00", "Z")
        found = counted(event_type, data, at)
        assert found.node == "node-1"
        done = assess(facts(record), found, NOW, CFG)
        record = done.record
    assert done.verdict is verdict
    assert len(done.workloads) == count
    assert len(record.workloads(NOW, CFG.suspect_window)) == count


@pytest.mark.parametrize(
    ("workload", "top"),
    [
        ("Deployment shop/web", "shop/web"),
        # The Deployment controller's <deployment>-<pod-template-hash>, also of a Deployment
        # whose own name ends like a hash: only the last suffix goes.
        ("ReplicaSet shop/web-7d9c8b6f4", "shop/web"),
        ("ReplicaSet shop/web-v2-5c8f9d7b6", "shop/web-v2"),
        ("Deployment shop/web-v2", "shop/web-v2"),
        # A vowel, a 0, 1 or 3 is never in a pod-template-hash: a ReplicaSet's own name.
        ("ReplicaSet shop/web-api", "shop/web-api"),
        ("ReplicaSet shop/web-7d9c8b6f1", "shop/web-7d9c8b6f1"),
        # The CronJob controller's <cronjob>-<minutes>; a Job of its own keeps its name.
        ("CronJob shop/nightly", "shop/nightly"),
        ("Job shop/nightly-29383920", "shop/nightly"),
        ("Job shop/migrate", "shop/migrate"),
        # Only a ReplicaSet's, a Job's or a bare pod's suffix is a controller's doing.
        ("StatefulSet shop/db-2", "shop/db-2"),
        ("Pod shop/solo-a65df", "shop/solo"),
        ("not a workload id", "not a workload id"),
    ],
)
def test_a_workload_is_counted_by_its_top_level_workload(workload: str, top: str) -> None:
    assert family(workload) == top


# -- one writer per node (a burst of reports about one node) ------------------------------------


class OneNodeApi:
    """The API server as a compare-and-swap sees it, for one Node: a merge patch carrying a
    stale resourceVersion is refused (409), as the API server refuses it."""

    def __init__(self) -> None:
        self.node = nodes.node("node-1")
        self.node["metadata"]["resourceVersion"] = "1"
        self.guard = threading.Lock()
        self.conflicts = 0

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        with self.guard:
            return copy.deepcopy(self.node)

    def merge_patch(self, kind: str, namespace: str | None, name: str, body: Any) -> Any:
        time.sleep(0.002)  # the round trip, during which another writer may read
        with self.guard:
            meta = self.node["metadata"]
            if body["metadata"]["resourceVersion"] != meta["resourceVersion"]:
                self.conflicts += 1
                raise kube.Conflict(409, "the object has been modified")
            for key in ("labels", "annotations"):
                merged = {**(meta.get(key) or {}), **(body["metadata"].get(key) or {})}
                meta[key] = {k: v for k, v in merged.items() if v is not None}
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
            return copy.deepcopy(self.node)


def test_reports_about_one_node_arriving_at_once_are_written_one_after_another() -> None:
    api = OneNodeApi()
    assessor = Assessor(api, Config(suspect_workloads=99), clock=lambda: NOW)  # type: ignore[arg-type]
    reports = [blame(f"W{i}", pod=f"uid-{i}") for i in range(12)]
    threads = [threading.Thread(target=assessor.blame, args=(b,)) for b in reports]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Every report is on record, and none had to be read again after losing a race.
    assert len(load(api.node["metadata"]["annotations"][NODE_HEALTH_ANNOTATION]).failures) == 12
    assert api.node["metadata"]["labels"][FAILING_WORKLOADS_LABEL] == "12"
    assert api.conflicts == 0


# -- the review removes expired moved-off marks ---------------------------------------------------


class Cluster(kube.Kube):
    """The API server as the review sees it: Nodes listed and read; a Node merge patch recorded,
    then refused (409) when its resourceVersion is stale, as the API server refuses it, or
    applied; Events (NodeCleared) recorded. ``marked_meanwhile``: update-annotations marks the
    node again between the review's read and its first write."""

    def __init__(self, *listed: dict[str, Any], marked_meanwhile: bool = False) -> None:
        self.nodes = {n["metadata"]["name"]: copy.deepcopy(n) for n in listed}
        self.patches: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.marked_meanwhile = marked_meanwhile

    def list_all(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        limit: int = 500,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        assert kind == "Node"
        return iter(copy.deepcopy(list(self.nodes.values())))

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        if kind != "Node" or name not in self.nodes:
            raise kube.NotFound(f"{kind} {name} not found", 404, "NotFound")
        return copy.deepcopy(self.nodes[name])

    def merge_patch(
        self, kind: str, namespace: str | None, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        assert kind == "Node"
        self.patches.append(copy.deepcopy(body))
        meta = self.nodes[name]["metadata"]
        if self.marked_meanwhile:
            self.marked_meanwhile = False
            meta["labels"].update(moved_off(timedelta(0)))
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        if body["metadata"]["resourceVersion"] != meta["resourceVersion"]:
            raise kube.Conflict("the object has been modified", 409, "Conflict")
        for key in ("labels", "annotations"):
            merged = {**(meta.get(key) or {}), **(body["metadata"].get(key) or {})}
            meta[key] = {k: v for k, v in merged.items() if v is not None}
        if "spec" in body:
            self.nodes[name]["spec"].update(body["spec"])
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return copy.deepcopy(self.nodes[name])

    def create(self, kind: str, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        assert kind == "Event"
        self.events.append(body)
        return body


def review(api: Cluster) -> list[Any]:
    return Assessor(api, CFG, clock=lambda: NOW).review()


ONLY_THE_MARK = {"metadata": {"resourceVersion": "48211", "labels": {MOVED_OFF_LABEL: None}}}


@pytest.mark.parametrize(
    ("age", "told"),
    [
        (CFG.moved_off_window, "2026-11-23T09:58:00Z"),
        (CFG.moved_off_window + timedelta(hours=5), "2026-11-23T04:58:00Z"),
    ],
    ids=["at-the-window", "hours-old"],
)
def test_the_review_removes_a_moved_off_mark_older_than_its_window(
    age: timedelta, told: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A node assess-nodes never blamed: the mark is all of ours on it, and all that is written
    # (no empty record added).
    api = Cluster(nodes.node("node-1", labels=moved_off(age)))
    with caplog.at_level(logging.INFO, logger="shared.nodes.assess_nodes.handler"):
        outcomes = review(api)
    assert api.patches == [ONLY_THE_MARK]
    assert MOVED_OFF_LABEL not in api.nodes["node-1"]["metadata"]["labels"]
    assert [(o.node, o.verdict, o.written) for o in outcomes] == [("node-1", Verdict.HEALTHY, True)]
    said = f"removed its moved-off mark of {told}: older than 2m0s"
    assert outcomes[0].moved_off == said
    [line] = [r for r in caplog.records if r.getMessage().startswith("node node-1: ")]
    assert line.getMessage().endswith(f"; {said}")
    assert line.__dict__["moved_off_removed"] is True


@pytest.mark.parametrize(
    "age",
    [timedelta(0), timedelta(seconds=30), CFG.moved_off_window - timedelta(seconds=1)],
    ids=["now", "30s", "last-second"],
)
def test_the_review_leaves_a_fresh_moved_off_mark_alone(age: timedelta) -> None:
    api = Cluster(nodes.node("node-1", labels=moved_off(age)))
    assert review(api) == []
    assert api.patches == []


@pytest.mark.parametrize("value", ["", "soon", "-60", "1.5e9", "99999999999999999999999"])
def test_the_review_removes_a_moved_off_value_that_is_not_a_time(value: str) -> None:
    api = Cluster(nodes.node("node-1", labels={MOVED_OFF_LABEL: value}))
    outcomes = review(api)
    assert api.patches == [ONLY_THE_MARK]
    assert outcomes[0].moved_off == (
        f"removed its moved-off mark {MOVED_OFF_LABEL}={value!r}: not a time"
    )


def test_an_opted_out_node_loses_its_expired_mark_and_nothing_else_is_written() -> None:
    # An old record whose failures aged out: a write of the node's state would prune it. The
    # node is not ours: only our expired mark comes off it.
    record = record_of(blame("A", 30))
    opted = nodes.node(
        "node-1",
        labels={NODE_OPT_OUT_LABEL: "", **EXPIRED},
        annotations={NODE_HEALTH_ANNOTATION: record.to_json()},
    )
    api = Cluster(opted)
    outcomes = review(api)
    assert api.patches == [ONLY_THE_MARK]
    assert api.nodes["node-1"]["metadata"]["annotations"][NODE_HEALTH_ANNOTATION] == (
        record.to_json()
    )
    assert [(o.verdict, o.marked, bool(o.moved_off)) for o in outcomes] == [
        (Verdict.HEALTHY, False, True)
    ]
    # With a fresh mark the opted-out node is not written at all.
    fresh = copy.deepcopy(opted)
    fresh["metadata"]["labels"].update(moved_off(timedelta(seconds=10)))
    api = Cluster(fresh)
    assert review(api) == []
    assert api.patches == []


@pytest.mark.parametrize(
    ("mark", "removed"),
    [(EXPIRED, True), (moved_off(timedelta(0)), False)],
    ids=["expired", "fresh"],
)
def test_an_expired_mark_rides_along_with_a_suspicion_cleared_in_one_patch(
    mark: dict[str, str], removed: bool
) -> None:
    ours = {"key": SUSPECT_LABEL, "value": "true", "effect": "PreferNoSchedule"}
    record = record_of(blame("A", 20), blame("B", 20), suspect_since=NOW - timedelta(minutes=20))
    suspect = nodes.node(
        "node-1",
        labels={SUSPECT_LABEL: "true", **mark},
        annotations={NODE_HEALTH_ANNOTATION: record.to_json()},
        taints=[ours],
    )
    api = Cluster(suspect)
    outcomes = review(api)
    assert len(api.patches) == 1
    patch = api.patches[0]
    expected = {SUSPECT_LABEL: None, **({MOVED_OFF_LABEL: None} if removed else {})}
    assert patch["metadata"]["labels"] == expected
    assert patch["metadata"]["resourceVersion"] == "48211"
    assert NODE_HEALTH_ANNOTATION in patch["metadata"]["annotations"]
    assert patch["spec"] == {"taints": []}
    assert [(o.verdict, bool(o.moved_off)) for o in outcomes] == [(Verdict.CLEAR, removed)]
    assert [e["reason"] for e in api.events] == ["NodeCleared"]
    left = api.nodes["node-1"]["metadata"]["labels"]
    assert (MOVED_OFF_LABEL in left) is not removed


def test_a_suspect_node_with_nothing_else_to_write_loses_only_its_expired_mark() -> None:
    # Still suspect (failures keep coming): nothing the clock changed but the mark's age.
    record = record_of(blame("A", 3), blame("B", 2), suspect_since=NOW - timedelta(minutes=3))
    ours = {"key": SUSPECT_LABEL, "value": "true", "effect": "PreferNoSchedule"}
    api = Cluster(
        nodes.node(
            "node-1",
            labels={SUSPECT_LABEL: "true", FAILING_WORKLOADS_LABEL: "2", **EXPIRED},
            annotations={NODE_HEALTH_ANNOTATION: record.to_json()},
            taints=[ours],
        )
    )
    outcomes = review(api)
    assert api.patches == [ONLY_THE_MARK]
    assert [(o.verdict, o.marked) for o in outcomes] == [(Verdict.STAYS, True)]


def test_a_mark_renewed_between_the_read_and_the_removal_stays() -> None:
    # update-annotations moved another pod off the node meanwhile: the removal, a compare-and-
    # swap, is refused; read again, the mark is fresh and left alone.
    api = Cluster(nodes.node("node-1", labels=EXPIRED), marked_meanwhile=True)
    assert review(api) == []
    assert api.patches == [ONLY_THE_MARK]
    left = api.nodes["node-1"]["metadata"]["labels"][MOVED_OFF_LABEL]
    assert left == movedoff.mark_value(NOW)
