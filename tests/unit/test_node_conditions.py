"""Node conditions as evidence: a node that reports a problem itself is suspect before any pod
fails there, cleared when the problem is gone, under the same cap and opt-out.

The conditions are shaped as node-problem-detector writes them, with the types, reasons and
messages of its shipped monitors (config/kernel-monitor.json, readonly-monitor.json,
systemd-monitor-counter.json of kubernetes/node-problem-detector); the kubelet's own pressure
conditions as the kubelet writes them (pkg/kubelet/nodestatus/setters.go).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.api.keys import NODE_HEALTH_ANNOTATION, NODE_OPT_OUT_LABEL, SUSPECT_LABEL
from shared.api.nodehealth import NodeHealth, load
from shared.nodes.assess_nodes.decide import (
    Blame,
    NodeFacts,
    Standing,
    Verdict,
    assess,
    reports_problem,
    within_cap,
)
from shared.platform.config import DEFAULT_SUSPECT_CONDITIONS, Config, ConfigError
from tests.unit import nodes

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
CFG = Config()

# kernel-monitor.json: the rule "task docker:\w+ blocked for more than \w+ seconds\." sets
# KernelDeadlock True with reason DockerHung; the message is the matched kernel log line.
DEADLOCK = nodes.npd_condition(
    "KernelDeadlock",
    problem=True,
    reason="DockerHung",
    message="kernel: INFO: task docker:20744 blocked for more than 120 seconds.",
)
NO_DEADLOCK = nodes.npd_condition(
    "KernelDeadlock", problem=False, reason="KernelHasNoDeadlock", message="kernel has no deadlock"
)
READ_ONLY = nodes.npd_condition(
    "ReadonlyFilesystem",
    problem=True,
    reason="FilesystemIsReadOnly",
    message="EXT4-fs error (device sda1): ext4_journal_check_start:83: Detected aborted journal\n"
    "EXT4-fs (sda1): Remounting filesystem read-only",
)
CONTAINERD_RESTARTS = nodes.npd_condition(
    "FrequentContainerdRestart",
    problem=True,
    reason="FrequentContainerdRestart",
    message="Found 5 matching logs, which meets the threshold of 5",
)
# The kubelet's, while the node is short of memory (it also taints it NoSchedule and evicts).
MEMORY_PRESSURE = {
    "type": "MemoryPressure",
    "status": "True",
    "lastHeartbeatTime": "2026-11-23T09:59:40Z",
    "lastTransitionTime": "2026-11-23T09:57:00Z",
    "reason": "KubeletHasInsufficientMemory",
    "message": "kubelet has insufficient memory available",
}


def facts(
    conditions: list[dict[str, Any]], record: NodeHealth | None = None, **kw: Any
) -> NodeFacts:
    annotations = {NODE_HEALTH_ANNOTATION: record.to_json()} if record is not None else {}
    return NodeFacts.from_node(nodes.node(annotations=annotations, conditions=conditions, **kw))


def blame(workload: str, minutes_ago: float = 1) -> Blame:
    at = NOW - timedelta(minutes=minutes_ago)
    return Blame("node-1", workload, f"uid-{workload}", "CrashLoopBackOff", at)


# -- what counts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("conditions", "verdict"),
    [
        ([DEADLOCK], Verdict.MARK),
        ([READ_ONLY], Verdict.MARK),
        ([CONTAINERD_RESTARTS], Verdict.MARK),
        # What node-problem-detector writes when there is no problem.
        ([NO_DEADLOCK], Verdict.HEALTHY),
        # The kubelet acts on its pressure conditions itself; not counted unless configured.
        ([MEMORY_PRESSURE], Verdict.HEALTHY),
        # Ready=True (the kubelet's, on every node) is health, not a problem.
        ([], Verdict.HEALTHY),
    ],
    ids=["kernel-deadlock", "read-only", "containerd-restarts", "npd-default", "memory", "ready"],
)
def test_a_node_reporting_a_problem_condition_is_suspect_with_no_pod_failing_there(
    conditions: list[dict[str, Any]], verdict: Verdict
) -> None:
    assert assess(facts(conditions), None, NOW, CFG).verdict is verdict


def test_the_mark_says_which_condition_with_its_reason_and_message() -> None:
    done = assess(facts([DEADLOCK]), None, NOW, CFG)
    assert done.why == (
        "node node-1 reports KernelDeadlock=True (DockerHung: kernel: INFO: task docker:20744 "
        "blocked for more than 120 seconds.)"
    )
    assert done.workloads == () and [p.type for p in done.problems] == ["KernelDeadlock"]
    # Suspect since the condition turned True.
    assert done.record.suspect_since == datetime(2026, 11, 23, 9, 58, tzinfo=UTC)
    assert done.record.suspect_conditions == ("KernelDeadlock",)


def test_a_long_log_excerpt_is_told_on_one_line_and_shortened() -> None:
    noisy = nodes.npd_condition(
        "KernelDeadlock", problem=True, reason="AUFSUmountHung", message="line\n" * 200
    )
    said = assess(facts([noisy]), None, NOW, CFG).why
    assert "\n" not in said and len(said) < 300 and said.endswith("...)")


def test_a_transition_time_ahead_of_the_reviewer_counts_as_now() -> None:
    ahead = {**DEADLOCK, "lastTransitionTime": "2026-11-23T10:05:00Z"}
    assert assess(facts([ahead]), None, NOW, CFG).record.suspect_since == NOW


def test_the_set_of_conditions_is_a_setting() -> None:
    with_memory = Config(suspect_conditions=DEFAULT_SUSPECT_CONDITIONS | {"MemoryPressure"})
    assert assess(facts([MEMORY_PRESSURE]), None, NOW, with_memory).verdict is Verdict.MARK
    none = Config(suspect_conditions=frozenset())
    assert assess(facts([DEADLOCK]), None, NOW, none).verdict is Verdict.HEALTHY


@pytest.mark.parametrize("value", ["Ready", "KernelDeadlock,Ready"])
def test_ready_cannot_be_configured_as_a_problem(value: str) -> None:
    with pytest.raises(ConfigError, match="KN_RESCHEDULER_SUSPECT_CONDITIONS: Ready is True"):
        Config.from_env({"KN_RESCHEDULER_SUSPECT_CONDITIONS": value})


def test_the_setting_reads_a_comma_separated_list() -> None:
    cfg = Config.from_env({"KN_RESCHEDULER_SUSPECT_CONDITIONS": "KernelDeadlock, MemoryPressure"})
    assert cfg.suspect_conditions == {"KernelDeadlock", "MemoryPressure"}


def test_the_review_looks_at_a_node_only_for_a_counted_condition() -> None:
    types = DEFAULT_SUSPECT_CONDITIONS
    assert reports_problem(nodes.node(conditions=[DEADLOCK]), types)
    assert not reports_problem(nodes.node(conditions=[NO_DEADLOCK, MEMORY_PRESSURE]), types)
    assert not reports_problem(nodes.node(), types)


# -- while it lasts, and after -------------------------------------------------------------------


def marked_by(conditions: list[dict[str, Any]]) -> NodeHealth:
    return assess(facts(conditions), None, NOW, CFG).record


def test_while_the_condition_lasts_the_node_stays_suspect() -> None:
    later = NOW + timedelta(hours=3)  # far past the failure window
    done = assess(
        facts([DEADLOCK], marked_by([DEADLOCK]), labels={SUSPECT_LABEL: "true"}), None, later, CFG
    )
    assert done.verdict is Verdict.STAYS


def test_when_node_problem_detector_clears_the_condition_so_is_the_suspicion() -> None:
    done = assess(
        facts([NO_DEADLOCK], marked_by([DEADLOCK]), labels={SUSPECT_LABEL: "true"}),
        None,
        NOW,
        CFG,
    )
    assert done.verdict is Verdict.CLEAR
    assert done.record.suspect_since is None and done.record.suspect_conditions == ()
    assert "none of its conditions counted reports a problem now" in done.why


def test_a_condition_gone_from_the_node_clears_it_too() -> None:
    done = assess(facts([], marked_by([DEADLOCK]), labels={SUSPECT_LABEL: "true"}), None, NOW, CFG)
    assert done.verdict is Verdict.CLEAR


def test_failures_still_coming_keep_the_node_suspect_after_its_condition_clears() -> None:
    record = marked_by([DEADLOCK]).with_failure(blame("A").seen())
    done = assess(facts([NO_DEADLOCK], record, labels={SUSPECT_LABEL: "true"}), None, NOW, CFG)
    assert done.verdict is Verdict.STAYS
    assert done.record.suspect_conditions == () and done.record.suspect_workloads == ("A",)


def test_a_condition_and_failures_are_both_told() -> None:
    record = NodeHealth().with_failure(blame("A", 3).seen())
    done = assess(facts([READ_ONLY], record), blame("B"), NOW, CFG)
    assert done.verdict is Verdict.MARK
    assert "2 distinct workloads failed on node node-1" in done.why
    assert "ReadonlyFilesystem=True (FilesystemIsReadOnly: EXT4-fs error" in done.why
    assert done.evidence == 3


def test_a_node_with_the_opt_out_label_is_never_marked_for_its_conditions() -> None:
    opted = facts([DEADLOCK], labels={NODE_OPT_OUT_LABEL: "true"})
    assert assess(opted, None, NOW, CFG).verdict is Verdict.HEALTHY


# -- the record and the cap ----------------------------------------------------------------------


def test_the_record_keeps_the_conditions_it_was_marked_for() -> None:
    record = marked_by([DEADLOCK, READ_ONLY])
    assert load(record.to_json()) == record
    assert load(record.to_json()).suspect_conditions == ("KernelDeadlock", "ReadonlyFilesystem")


def test_a_record_from_before_conditions_counted_reads_as_marked_for_none() -> None:
    older = (
        '{"failures":[],"suspect":{"since":"2026-11-23T09:50:00Z","workloads":["A","B"]},'
        '"version":1}'
    )
    assert load(older).suspect_conditions == ()


def test_the_cap_ranks_a_problem_condition_as_evidence() -> None:
    # At the cap (1), a node with two failing workloads and a deadlock takes the mark from one
    # with two failing workloads only.
    decision = within_cap(Standing("node-2", 2, False, 1), [Standing("node-1", 2, True)], 1)
    assert decision.mark and decision.displaced == ("node-1",)
    held = within_cap(Standing("node-3", 0, False, 1), [Standing("node-1", 2, True)], 1)
    assert not held.mark
    assert "node node-3 (0 failing workloads, 1 problem condition) ranks below" in held.why
