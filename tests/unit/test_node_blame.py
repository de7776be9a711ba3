"""Blaming nodes: which reports count, when a node turns suspect, the cap, the Node patch."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.constants import (
    EVENT_POD_EXHAUSTED,
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    NODE_HEALTH_ANNOTATION,
    NODE_OPT_OUT_LABEL,
    SUSPECT_LABEL,
)
from shared.nodehealth.blame import (
    Blame,
    NodeFacts,
    NotEvidence,
    Standing,
    Verdict,
    allowed_suspects,
    assess,
    blame_from_event,
    node_patch,
    over_cap,
    within_cap,
)
from shared.nodehealth.record import MAX_FAILURES, NodeHealth, RecordError, Seen, load
from shared.platform.config import Config
from shared.platform.events import Event
from shared.rescheduling.detect import detect
from tests.unit import nodes, pods

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
CFG = Config()


def failing_data(node: str = "node-1", restarts: int = 4) -> dict[str, Any]:
    """What detect-failures really sends about a crash-looping ReplicaSet pod."""
    pod = pods.pod(containers=[pods.crash_looping(restarts=restarts)], node=node)
    reply = detect(Event("1", "s", "dev.knative.apiserver.resource.update", {}, pod), CFG)
    assert reply is not None
    return dict(reply.data)


def outcome_data(kind: str = "ReplicaSet", name: str = "web-7c9d", node: str = "node-1") -> Any:
    """What update-annotations replies after a move (io.kn-rescheduler.pod.rescheduled)."""
    return {
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


def blame(workload: str, minutes_ago: float = 1, node: str = "node-1", pod: str = "") -> Blame:
    at = NOW - timedelta(minutes=minutes_ago)
    return Blame(node, workload, pod or f"uid-{workload}-{minutes_ago}", "CrashLoopBackOff", at)


def facts(record: NodeHealth | None = None, **kw: Any) -> NodeFacts:
    annotations = {NODE_HEALTH_ANNOTATION: record.to_json()} if record is not None else {}
    return NodeFacts.from_node(nodes.node(annotations=annotations, **kw))


# -- which reports blame a node ------------------------------------------------------------------


def test_a_failing_report_blames_the_node_of_the_pods_controller() -> None:
    found = blame_from_event(EVENT_POD_FAILING, failing_data(), "2026-11-23T09:59:00Z", NOW)
    assert (found.node, found.reason) == ("node-1", "CrashLoopBackOff")
    assert found.workload.startswith("ReplicaSet ")
    assert found.at == NOW - timedelta(minutes=1)


@pytest.mark.parametrize("event_type", [EVENT_POD_RESCHEDULED, EVENT_POD_EXHAUSTED])
def test_a_move_or_an_exhausted_budget_blames_the_node_of_the_workload(event_type: str) -> None:
    found = blame_from_event(event_type, outcome_data(), None, NOW)
    assert (found.node, found.workload, found.at) == ("node-1", "ReplicaSet shop/web-7c9d", NOW)


def test_a_report_from_the_future_counts_as_now() -> None:
    found = blame_from_event(EVENT_POD_RESCHEDULED, outcome_data(), "2027-01-01T00:00:00Z", NOW)
    assert found.at == NOW


@pytest.mark.parametrize(
    ("event_type", "change"),
    [
        ("dev.knative.apiserver.resource.update", {}),
        (EVENT_POD_FAILING, {"kind": "early"}),
        (EVENT_POD_FAILING, {"kind": "exclusions-unschedulable", "node": None}),
        (EVENT_POD_RESCHEDULED, {"node": None}),
    ],
    ids=["not-a-report", "early-report", "unschedulable", "no-node"],
)
def test_reports_that_say_nothing_against_a_node_are_not_evidence(
    event_type: str, change: dict[str, Any]
) -> None:
    data = failing_data() if event_type == EVENT_POD_FAILING else outcome_data()
    data.update(change)
    with pytest.raises(NotEvidence):
        blame_from_event(event_type, data, None, NOW)


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"namespace": "shop"},
        {**outcome_data(), "workload": "web"},
        {**outcome_data(), "node": 3},
    ],
)
def test_a_malformed_report_is_refused(data: Any) -> None:
    with pytest.raises(ValueError) as err:
        blame_from_event(EVENT_POD_RESCHEDULED, data, None, NOW)
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
    patch = node_patch(node, record, suspect=True, taint=True)
    assert patch is not None
    assert patch["metadata"]["resourceVersion"] == "48211"
    assert patch["metadata"]["labels"] == {SUSPECT_LABEL: "true"}
    assert patch["metadata"]["annotations"] == {NODE_HEALTH_ANNOTATION: record.to_json()}
    assert patch["spec"]["taints"] == [
        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
        {"key": SUSPECT_LABEL, "value": "true", "effect": "PreferNoSchedule"},
    ]


def test_clearing_removes_only_our_label_and_taint() -> None:
    ours = {"key": SUSPECT_LABEL, "value": "true", "effect": "PreferNoSchedule"}
    record = record_of(blame("A"), blame("B"), suspect_since=NOW)
    node = facts(record, labels={SUSPECT_LABEL: "true"}, unschedulable=True, taints=[ours])
    patch = node_patch(node, NodeHealth(record.failures), suspect=False, taint=True)
    assert patch is not None
    assert patch["metadata"]["labels"] == {SUSPECT_LABEL: None}
    assert patch["spec"]["taints"] == [
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    ]


def test_blame_never_adds_a_taint_that_keeps_pods_off_or_evicts_them() -> None:
    patch = node_patch(
        facts(), record_of(blame("A"), blame("B"), suspect_since=NOW), suspect=True, taint=True
    )
    assert patch is not None
    assert {t["effect"] for t in patch["spec"]["taints"]} == {"PreferNoSchedule"}


def test_without_the_taint_setting_a_suspect_node_is_only_labelled() -> None:
    patch = node_patch(
        facts(), record_of(blame("A"), blame("B"), suspect_since=NOW), suspect=True, taint=False
    )
    assert patch is not None and "spec" not in patch


def test_a_node_that_already_says_it_all_is_not_written() -> None:
    record = record_of(blame("A"), blame("B"), suspect_since=NOW)
    ours = {"key": SUSPECT_LABEL, "value": "true", "effect": "PreferNoSchedule"}
    node = facts(record, labels={SUSPECT_LABEL: "true"}, taints=[ours])
    assert node_patch(node, record, suspect=True, taint=True) is None


def test_a_seen_failure_orders_by_time_first() -> None:
    early = Seen(NOW - timedelta(minutes=1), "Z", "p", "r")
    late = Seen(NOW, "A", "p", "r")
    assert sorted([late, early]) == [early, late]
