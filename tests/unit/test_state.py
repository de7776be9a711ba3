"""The state model and `plan`: counting moves, excluding nodes, and staying idempotent."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from datetime import timedelta
from typing import NamedTuple

import pytest

from shared.api.keys import REASON_MOVES_STOPPED
from shared.api.kubetypes import Pod
from shared.api.state import (
    MAX_STATE_BYTES,
    PodEntry,
    StateError,
    Stopped,
    WorkloadState,
    dump_state,
    is_valid_node_name,
    load_state,
    load_state_lenient,
)
from shared.platform.config import Config
from shared.workloads.classify import Failure, FailureKind, classify
from shared.workloads.everywhere import ALONE, Health, Witness, Witnesses
from shared.workloads.policy import OwnerKind, Policy
from shared.workloads.state import (
    MAX_EXCLUDED_NODES,
    Action,
    FailureFacts,
    Plan,
    StatefulSetRange,
    exclusions_for,
    foreign_copy,
    plan,
)

from . import pods
from .pods import NOW, crash_looping

RS = OwnerKind.REPLICA_SET
STS = OwnerKind.STATEFUL_SET


def failed(
    uid: str = "uid-1",
    node: str = "node-a",
    name: str = "web-7d9c8b6f4-x2x9z",
    kind: OwnerKind = RS,
    *,
    ran_for: timedelta | None = timedelta(minutes=5),
    unschedulable: bool = False,
    reason: str = "CrashLoopBackOff",
    kept_off: tuple[str, ...] = (),
) -> FailureFacts:
    return FailureFacts(
        pod_name=name,
        pod_uid=uid,
        owner_kind=kind,
        node=None if unschedulable else node,
        reason="Unschedulable" if unschedulable else reason,
        ran_for=ran_for,
        unschedulable=unschedulable,
        kept_off=kept_off,
    )


def apply(state: WorkloadState, result: Plan) -> WorkloadState:
    return result.new_state if result.new_state is not None else state


class Case(NamedTuple):
    state: WorkloadState
    failure: FailureFacts
    policy: Policy
    action: Action
    moves: int
    excluded: tuple[str, ...]
    event_reason: str | None
    delete_pod: bool


THREE = Policy(3, RS)
PLAN = {
    "the first failure moves the pod and excludes its node": Case(
        WorkloadState(),
        failed(),
        THREE,
        Action.MOVE,
        1,
        ("node-a",),
        "Rescheduled",
        True,
    ),
    "a later failure adds its node to the exclusions": Case(
        WorkloadState(moves=1, excluded_nodes=("node-a",), handled=("uid-0",)),
        failed(node="node-b"),
        THREE,
        Action.MOVE,
        2,
        ("node-a", "node-b"),
        "Rescheduled",
        True,
    ),
    "a node already excluded is not listed twice": Case(
        WorkloadState(moves=1, excluded_nodes=("node-a",), handled=("uid-0",)),
        failed(node="node-a"),
        THREE,
        Action.MOVE,
        2,
        ("node-a",),
        "Rescheduled",
        True,
    ),
    "the last move of the budget is still allowed": Case(
        WorkloadState(moves=2, excluded_nodes=("node-a", "node-b")),
        failed(node="node-c"),
        THREE,
        Action.MOVE,
        3,
        ("node-a", "node-b", "node-c"),
        "Rescheduled",
        True,
    ),
    "a spent budget is recorded and the pod left in place": Case(
        WorkloadState(moves=3, excluded_nodes=("node-a", "node-b", "node-c")),
        failed(node="node-d"),
        THREE,
        Action.EXHAUSTED,
        3,
        ("node-a", "node-b", "node-c"),
        "RetriesExhausted",
        False,
    ),
    "a spent budget already recorded records nothing more": Case(
        WorkloadState(moves=3, excluded_nodes=("node-a",), exhausted_recorded=True),
        failed(node="node-d"),
        THREE,
        Action.NOTHING,
        3,
        ("node-a",),
        None,
        False,
    ),
    "a pod we already moved is a duplicate event, not a new failure": Case(
        WorkloadState(moves=1, excluded_nodes=("node-a",), handled=("uid-1",)),
        failed(),
        THREE,
        Action.NOTHING,
        1,
        ("node-a",),
        None,
        True,
    ),
    "a policy of 0 does nothing": Case(
        WorkloadState(), failed(), Policy(0, RS), Action.NOTHING, 0, (), None, False
    ),
    "a pod that ran longer than reset-after clears the exclusions but counts": Case(
        WorkloadState(moves=2, excluded_nodes=("node-x", "node-y")),
        failed(ran_for=timedelta(hours=2)),
        THREE,
        Action.MOVE,
        3,
        (),
        "Rescheduled",
        True,
    ),
    "a pod that ran exactly reset-after keeps the exclusions": Case(
        WorkloadState(moves=1, excluded_nodes=("node-x",)),
        failed(ran_for=timedelta(minutes=30)),
        THREE,
        Action.MOVE,
        2,
        ("node-x", "node-a"),
        "Rescheduled",
        True,
    ),
    "a container that never started keeps the exclusions": Case(
        WorkloadState(moves=1, excluded_nodes=("node-x",)),
        failed(ran_for=timedelta(0)),
        THREE,
        Action.MOVE,
        2,
        ("node-x", "node-a"),
        "Rescheduled",
        True,
    ),
    "a failure whose run time is unknown keeps the exclusions": Case(
        WorkloadState(moves=1, excluded_nodes=("node-x",)),
        failed(ran_for=None),
        THREE,
        Action.MOVE,
        2,
        ("node-x", "node-a"),
        "Rescheduled",
        True,
    ),
    "exclusions that made a pod unschedulable are cleared, the count stays": Case(
        WorkloadState(moves=2, excluded_nodes=("node-a", "node-b")),
        failed(unschedulable=True),
        THREE,
        Action.CLEAR_AND_MOVE,
        2,
        (),
        "ExclusionsCleared",
        True,
    ),
    "exclusions are cleared even when the budget is spent": Case(
        WorkloadState(moves=3, excluded_nodes=("node-a",), exhausted_recorded=True),
        failed(unschedulable=True),
        THREE,
        Action.CLEAR_AND_MOVE,
        3,
        (),
        "ExclusionsCleared",
        True,
    ),
    "exclusions are cleared even when the policy was turned off since": Case(
        WorkloadState(moves=1, excluded_nodes=("node-a",)),
        failed(unschedulable=True),
        Policy(0, RS),
        Action.CLEAR_AND_MOVE,
        1,
        (),
        "ExclusionsCleared",
        True,
    ),
    "a ReplicaSet may move retries times replicas pods": Case(
        WorkloadState(moves=5),
        failed(),
        Policy(2, RS, replicas=3),
        Action.MOVE,
        6,
        ("node-a",),
        "Rescheduled",
        True,
    ),
    "a ReplicaSet past retries times replicas is exhausted": Case(
        WorkloadState(moves=6),
        failed(),
        Policy(2, RS, replicas=3),
        Action.EXHAUSTED,
        6,
        (),
        "RetriesExhausted",
        False,
    ),
    "a Job's budget is its retries, however many pods it runs": Case(
        WorkloadState(moves=2),
        failed(kind=OwnerKind.JOB),
        Policy(2, OwnerKind.JOB, replicas=5),
        Action.EXHAUSTED,
        2,
        (),
        "RetriesExhausted",
        False,
    ),
    "a bare pod is moved once within a budget of one": Case(
        WorkloadState(),
        failed(name="debug-shell", kind=OwnerKind.POD),
        Policy(1, OwnerKind.POD),
        Action.MOVE,
        1,
        ("node-a",),
        "Rescheduled",
        True,
    ),
}


@pytest.mark.parametrize("case", PLAN.values(), ids=PLAN.keys())
def test_plan(case: Case) -> None:
    result = plan(case.state, case.failure, case.policy, NOW)
    assert result.action is case.action
    assert result.moves == case.moves
    assert result.excluded_nodes == case.excluded
    assert result.event_reason == case.event_reason
    assert result.delete_pod is case.delete_pod
    assert result.budget == case.policy.budget
    assert result.message
    if case.action is Action.NOTHING:
        assert result.new_state is None
    else:
        assert result.new_state is not None
        assert result.new_state.updated_at == NOW
        assert result.new_state.moves == case.moves
        assert result.new_state.excluded_nodes == case.excluded


def test_a_budget_of_n_allows_exactly_n_moves() -> None:
    for budget in (1, 2, 5):
        state = WorkloadState()
        actions = []
        for i in range(budget + 2):
            result = plan(state, failed(f"uid-{i}", f"node-{i}"), Policy(budget, RS), NOW)
            actions.append(result.action)
            state = apply(state, result)
        assert actions == [Action.MOVE] * budget + [Action.EXHAUSTED, Action.NOTHING]
        assert state.moves == budget
        assert state.exhausted_recorded


def test_applying_the_same_failure_twice_equals_applying_it_once() -> None:
    once = apply(WorkloadState(), plan(WorkloadState(), failed(), THREE, NOW))
    later = NOW + timedelta(minutes=3)
    twice = apply(once, plan(once, failed(), THREE, later))
    assert twice == once


def test_a_repeated_unschedulable_event_clears_only_once() -> None:
    state = WorkloadState(moves=1, excluded_nodes=("node-a",))
    first = plan(state, failed("uid-9", unschedulable=True), THREE, NOW)
    state = apply(state, first)
    again = plan(state, failed("uid-9", unschedulable=True), THREE, NOW)
    assert again.action is Action.NOTHING
    assert again.reason == "already-handled"


def test_events_in_any_order_give_the_same_end_state() -> None:
    # Two redeliveries of pod 1 and single events for pods 2 and 3, in every order.
    events = [
        failed("uid-1", "node-a"),
        failed("uid-1", "node-a"),
        failed("uid-2", "node-b"),
        failed("uid-3", "node-c"),
    ]
    ends = set()
    for order in itertools.permutations(events):
        state = WorkloadState()
        for event in order:
            state = apply(state, plan(state, event, Policy(10, RS), NOW))
        assert state.moves == 3
        ends.add((state.moves, frozenset(state.excluded_nodes), frozenset(state.handled)))
    assert len(ends) == 1


def test_a_late_event_about_a_replaced_pod_does_not_count_again() -> None:
    state = WorkloadState()
    state = apply(state, plan(state, failed("uid-old", "node-a"), THREE, NOW))
    state = apply(state, plan(state, failed("uid-new", "node-b"), THREE, NOW))
    late = plan(state, failed("uid-old", "node-a"), THREE, NOW)
    assert late.action is Action.NOTHING
    assert late.new_state is None
    assert state.moves == 2


def test_a_reset_move_records_why_the_exclusions_went() -> None:
    state = WorkloadState(moves=1, excluded_nodes=("node-x",))
    result = plan(state, failed(ran_for=timedelta(hours=3)), THREE, NOW)
    assert result.exclusions_cleared
    assert result.reason == "ran-past-reset-after"
    assert "3h0m0s" in result.message


def test_reset_after_comes_from_the_policy() -> None:
    state = WorkloadState(moves=1, excluded_nodes=("node-x",))
    policy = Policy(3, RS, reset_after=timedelta(minutes=2))
    result = plan(state, failed(ran_for=timedelta(minutes=5)), policy, NOW)
    assert result.excluded_nodes == ()


def test_statefulset_pods_keep_their_own_exclusions_and_budgets() -> None:
    policy = Policy(2, STS, replicas=3)
    state = WorkloadState()
    for uid, name, node in [
        ("u1", "db-0", "node-a"),
        ("u2", "db-1", "node-b"),
        ("u3", "db-0", "node-c"),
    ]:
        state = apply(state, plan(state, failed(uid, node, name, STS), policy, NOW))
    assert state.per_pod == {
        "db-0": PodEntry(moves=2, excluded_nodes=("node-a", "node-c"), updated_at=NOW),
        "db-1": PodEntry(moves=1, excluded_nodes=("node-b",), updated_at=NOW),
    }
    assert state.moves == 3
    assert state.excluded_nodes == ()
    assert exclusions_for(state, STS, "db-0") == ("node-a", "node-c")
    assert exclusions_for(state, STS, "db-1") == ("node-b",)
    assert exclusions_for(state, STS, "db-2") == ()

    # db-0 has spent its budget; db-1 has not.
    spent = plan(state, failed("u4", "node-d", "db-0", STS), policy, NOW)
    assert spent.action is Action.EXHAUSTED
    state = apply(state, spent)
    assert state.per_pod["db-0"].exhausted_recorded
    assert plan(state, failed("u5", "node-d", "db-1", STS), policy, NOW).action is Action.MOVE


def test_clearing_a_statefulset_pods_exclusions_leaves_its_siblings_alone() -> None:
    state = WorkloadState(
        moves=2,
        per_pod={
            "db-0": PodEntry(1, ("node-a",)),
            "db-1": PodEntry(1, ("node-b",)),
        },
    )
    facts = failed("u9", name="db-0", kind=STS, unschedulable=True)
    result = plan(state, facts, Policy(3, STS), NOW)
    assert result.action is Action.CLEAR_AND_MOVE
    assert result.new_state is not None
    assert result.new_state.per_pod["db-0"] == PodEntry(1, (), updated_at=NOW)
    assert result.new_state.per_pod["db-1"] == PodEntry(1, ("node-b",))
    assert result.new_state.moves == 2


def test_a_bigger_budget_after_exhaustion_allows_moves_and_a_new_exhaustion_record() -> None:
    state = WorkloadState(moves=3, exhausted_recorded=True)
    result = plan(state, failed(), Policy(4, RS), NOW)
    assert result.action is Action.MOVE
    assert result.new_state is not None
    assert not result.new_state.exhausted_recorded


def test_an_exhausted_pod_can_still_be_moved_when_the_budget_grows() -> None:
    state = apply(WorkloadState(moves=3), plan(WorkloadState(moves=3), failed(), THREE, NOW))
    assert "uid-1" not in state.handled
    assert plan(state, failed(), Policy(4, RS), NOW).action is Action.MOVE


def test_handled_uids_are_bounded_and_the_oldest_dropped() -> None:
    state = WorkloadState()
    for i in range(5):
        state = apply(state, plan(state, failed(f"u{i}"), Policy(10, RS), NOW, handled_limit=3))
    assert state.handled == ("u2", "u3", "u4")


def test_exclusions_for_other_workloads_are_shared_by_all_their_pods() -> None:
    state = WorkloadState(excluded_nodes=("node-a",), per_pod={"x": PodEntry(1, ("node-z",))})
    for kind in (RS, OwnerKind.JOB, OwnerKind.POD, "ReplicaSet"):
        assert exclusions_for(state, kind, None) == ("node-a",)
    assert exclusions_for(state, "StatefulSet", None) == ()


def test_plan_refuses_a_policy_for_another_kind_of_owner() -> None:
    with pytest.raises(ValueError, match="StatefulSet pod planned with a ReplicaSet policy"):
        plan(WorkloadState(), failed(name="db-0", kind=STS), THREE, NOW)


def test_plan_needs_an_aware_clock() -> None:
    with pytest.raises(ValueError, match="timezone"):
        plan(WorkloadState(), failed(), THREE, NOW.replace(tzinfo=None))


def test_failure_facts_come_from_a_real_pod_and_its_failure() -> None:
    pod = pods.pod(containers=[crash_looping(restarts=4)])
    failure = classify(pod, Config())
    assert failure is not None
    # The last run in the pod's lastState lasted 3 s.
    failure = replace(failure, ran_for_seconds=3)
    facts = FailureFacts.from_pod(pod, failure, "ReplicaSet")
    assert facts == FailureFacts(
        pod_name="web-7d9c8b6f4-x2x9z",
        pod_uid=pods.uid("web-7d9c8b6f4-x2x9z"),
        owner_kind=RS,
        node="node-b",
        reason="CrashLoopBackOff",
        ran_for=timedelta(seconds=3),
        unschedulable=False,
    )


def test_failure_facts_of_an_unschedulable_pod() -> None:
    pod = pods.unschedulable(excluded=["node-a"])
    failure = classify(pod, Config())
    assert failure is not None
    facts = FailureFacts.from_pod(pod, failure, RS)
    assert facts.unschedulable
    assert facts.node is None
    assert facts.ran_for is None


# How long the container ran decides whether the exclusions are cleared (not the pod's age).


class RunTime(NamedTuple):
    pod: Pod
    failure: Failure
    cleared: bool


def _failure(reason: str, ran_for_seconds: int, restarts: int = 0) -> Failure:
    return Failure(
        kind=FailureKind.NODE_FIXABLE,
        reason=reason,
        message="",
        node="node-b",
        container="app",
        restart_count=restarts,
        ran_for_seconds=ran_for_seconds,
    )


def _oom_killed_after(ran: timedelta) -> Pod:
    status = crash_looping(restarts=1, last_reason="OOMKilled", exit_code=137)
    status["lastState"] = {"terminated": pods.last_terminated("OOMKilled", 137, ran_for=ran)}  # type: ignore[typeddict-item]
    return pods.pod(containers=[status], started=NOW - ran - timedelta(minutes=1))


RUN_TIMES = {
    "a pod crash-looping for 45 minutes whose container ran 3 s keeps the exclusions": RunTime(
        pods.pod(containers=[crash_looping(restarts=9)], started=NOW - timedelta(minutes=45)),
        _failure("CrashLoopBackOff", 3, restarts=9),
        cleared=False,
    ),
    "a pod Pending on its node for 45 minutes that never started keeps the exclusions": RunTime(
        pods.pending_on_node(timedelta(minutes=45)),
        _failure("StuckPending", 0),
        cleared=False,
    ),
    "a container that ran 2 h and was then OOM-killed clears the exclusions": RunTime(
        _oom_killed_after(timedelta(hours=2)),
        _failure("OOMKilled", 7200, restarts=1),
        cleared=True,
    ),
}


@pytest.mark.parametrize("case", RUN_TIMES.values(), ids=RUN_TIMES.keys())
def test_reset_after_is_measured_on_the_failing_containers_last_run(case: RunTime) -> None:
    facts = FailureFacts.from_pod(case.pod, case.failure, RS)
    state = WorkloadState(moves=1, excluded_nodes=("node-x",), updated_at=NOW)
    result = plan(state, facts, THREE, NOW)
    assert result.action is Action.MOVE
    assert result.moves == 2
    assert result.exclusions_cleared is case.cleared
    assert result.excluded_nodes == (() if case.cleared else ("node-x", "node-b"))


# Pruning: the state stays bounded without handing a failing pod a fresh budget.

DB = StatefulSetRange("db", replicas=3)


def entries(count: int, *, age: timedelta, nodes: int = 0, moves: int = 1) -> dict[str, PodEntry]:
    return {
        f"db-{i}": PodEntry(
            moves,
            tuple(f"node-{i}-{n}" for n in range(nodes)),
            updated_at=NOW - age,
        )
        for i in range(count)
    }


def sts_state(per_pod: dict[str, PodEntry]) -> WorkloadState:
    return WorkloadState(
        moves=sum(e.moves for e in per_pod.values()), per_pod=per_pod, updated_at=NOW
    )


def test_a_scale_down_prunes_the_entries_of_ordinals_at_or_above_replicas() -> None:
    state = sts_state(entries(5, age=timedelta(minutes=5), nodes=1))
    result = plan(
        state, failed("u9", "node-z", "db-1", STS), Policy(3, STS, 3), NOW, statefulset=DB
    )
    assert result.new_state is not None
    assert sorted(result.new_state.per_pod) == ["db-0", "db-1", "db-2"]
    assert result.new_state.per_pod["db-0"] == state.per_pod["db-0"]
    # The total stays the count of every move ever made.
    assert result.new_state.moves == 6
    assert "dropped 2 entries of pods db no longer has ('db-3', 'db-4')" in result.message
    assert result.pruned


def test_spec_ordinals_start_shifts_the_range_of_pods_kept() -> None:
    state = sts_state(entries(10, age=timedelta(minutes=5)))
    shifted = StatefulSetRange("db", replicas=3, start=5)
    result = plan(
        state, failed("u9", "node-z", "db-6", STS), Policy(3, STS, 3), NOW, statefulset=shifted
    )
    assert result.new_state is not None
    assert sorted(result.new_state.per_pod) == ["db-5", "db-6", "db-7"]


def test_the_failing_pods_own_entry_stays_even_outside_the_range() -> None:
    # A pod failing while the set scales down: its move is recorded like any other.
    state = sts_state(entries(5, age=timedelta(minutes=5)))
    result = plan(
        state, failed("u9", "node-z", "db-4", STS), Policy(3, STS, 3), NOW, statefulset=DB
    )
    assert result.new_state is not None
    assert sorted(result.new_state.per_pod) == ["db-0", "db-1", "db-2", "db-4"]
    assert result.new_state.per_pod["db-4"].moves == 2


def test_without_the_sets_range_no_entry_is_pruned_for_its_name() -> None:
    state = sts_state(entries(5, age=timedelta(minutes=5)))
    result = plan(state, failed("u9", "node-z", "db-1", STS), Policy(3, STS, 3), NOW)
    assert result.new_state is not None
    assert len(result.new_state.per_pod) == 5


@pytest.mark.parametrize(
    ("name", "member"),
    [
        ("db-0", True),
        ("db-2", True),
        ("db-3", False),
        ("web-0", False),
        ("db", False),
        ("db-x", False),
        ("db-1-0", False),
        ("db-99999999999", False),
    ],
)
def test_statefulset_pod_names_are_read_as_the_controller_reads_them(
    name: str, member: bool
) -> None:
    assert DB.wants(name) is member


def test_an_entry_older_than_reset_after_is_pruned_while_a_recent_one_stays() -> None:
    state = sts_state(
        {
            "db-0": PodEntry(2, ("node-a",), updated_at=NOW - timedelta(minutes=31)),
            "db-1": PodEntry(1, ("node-b",), updated_at=NOW - timedelta(minutes=29)),
        }
    )
    result = plan(
        state, failed("u9", "node-c", "db-2", STS), Policy(3, STS, 3), NOW, statefulset=DB
    )
    assert result.new_state is not None
    assert sorted(result.new_state.per_pod) == ["db-1", "db-2"]
    assert result.new_state.per_pod["db-1"] == state.per_pod["db-1"]
    assert "dropped 1 pod entry not updated for more than 30m0s" in result.message


def test_an_exhausted_entry_keeps_its_count_however_old() -> None:
    # The pod may be failing in place still; nothing refreshes its entry while it does.
    spent = PodEntry(3, ("node-a",), exhausted_recorded=True, updated_at=NOW - timedelta(days=2))
    state = sts_state({"db-0": spent})
    policy = Policy(3, STS, 3)
    other = plan(state, failed("u8", "node-c", "db-1", STS), policy, NOW, statefulset=DB)
    assert other.new_state is not None
    assert other.new_state.per_pod["db-0"] == replace(spent, excluded_nodes=())
    again = plan(other.new_state, failed("u9", "node-d", "db-0", STS), policy, NOW, statefulset=DB)
    assert again.action is Action.NOTHING
    assert again.reason == "exhausted-already-recorded"


def test_a_pod_failing_again_within_reset_after_never_gets_a_fresh_budget() -> None:
    # Four failures 20 minutes apart: the first is long past reset-after by the last, but each
    # move refreshed the entry, so the budget of three holds.
    state, policy = WorkloadState(), Policy(3, STS, 3)
    actions = []
    for i in range(4):
        now = NOW + timedelta(minutes=20 * i)
        facts = failed(f"u{i}", f"node-{i}", "db-0", STS)
        result = plan(state, facts, policy, now, statefulset=DB)
        actions.append(result.action)
        state = apply(state, result)
    assert actions == [Action.MOVE, Action.MOVE, Action.MOVE, Action.EXHAUSTED]


def test_workload_exclusions_older_than_reset_after_are_dropped_but_the_count_stays() -> None:
    old = WorkloadState(moves=1, excluded_nodes=("node-x",), updated_at=NOW - timedelta(hours=2))
    result = plan(old, failed(), THREE, NOW)
    assert (result.moves, result.excluded_nodes) == (2, ("node-a",))
    recent = replace(old, updated_at=NOW - timedelta(minutes=10))
    assert plan(recent, failed(), THREE, NOW).excluded_nodes == ("node-x", "node-a")


def test_excluded_nodes_are_bounded_per_scope_keeping_the_most_recent() -> None:
    many = tuple(f"node-{i:04d}" for i in range(1000))
    state = WorkloadState(moves=1, excluded_nodes=many, updated_at=NOW)
    result = plan(state, failed(node="node-new"), Policy(100, RS, 20), NOW)
    assert result.excluded_nodes == (*many[-(MAX_EXCLUDED_NODES - 1) :], "node-new")
    assert result.new_state is not None
    assert result.new_state.excluded_nodes == result.excluded_nodes


def test_a_node_failing_again_becomes_the_most_recent() -> None:
    state = WorkloadState(moves=2, excluded_nodes=("node-a", "node-b"), updated_at=NOW)
    assert plan(state, failed(node="node-a"), THREE, NOW).excluded_nodes == ("node-b", "node-a")


def _big_states() -> dict[str, tuple[WorkloadState, FailureFacts, Policy, StatefulSetRange | None]]:
    sts, recent = Policy(3, STS, 3), timedelta(minutes=5)
    return {
        "10,000 entries after a scale-down to 3": (
            sts_state(entries(10_000, age=recent, nodes=3)),
            failed("u9", "node-z", "db-1", STS),
            sts,
            DB,
        ),
        "10,000 entries of a big set, not updated for 2 h": (
            sts_state(entries(10_000, age=timedelta(hours=2), nodes=3)),
            failed("u9", "node-z", "db-1", STS),
            Policy(3, STS, 10_000),
            StatefulSetRange("db", 10_000),
        ),
        "1,000 recent entries with 32 excluded nodes each": (
            sts_state(entries(1_000, age=recent, nodes=32)),
            failed("u9", "node-z", "db-1", STS),
            Policy(100, STS, 1_000),
            StatefulSetRange("db", 1_000),
        ),
        "1,000 excluded nodes of a ReplicaSet": (
            WorkloadState(
                moves=1_000,
                excluded_nodes=tuple(
                    f"ip-10-0-{i // 250}-{i % 250}.ec2.internal" for i in range(1000)
                ),
                handled=tuple(pods.uid(f"p{i}") for i in range(64)),
                updated_at=NOW,
            ),
            failed(),
            Policy(100, RS, 20),
            None,
        ),
    }


BIG = _big_states()


@pytest.mark.parametrize("case", BIG.values(), ids=BIG.keys())
def test_a_huge_state_is_under_the_cap_after_one_plan(
    case: tuple[WorkloadState, FailureFacts, Policy, StatefulSetRange | None],
) -> None:
    state, facts, policy, members = case
    assert len(dump_state(state)) > 30 * 1024
    result = plan(state, facts, policy, NOW, statefulset=members)
    assert result.action is Action.MOVE
    assert result.new_state is not None
    text = dump_state(result.new_state)
    assert len(text.encode()) <= MAX_STATE_BYTES
    assert load_state(text) == result.new_state
    # No count was dropped for room: every kept entry has its moves, the total is unchanged.
    for name, entry in result.new_state.per_pod.items():
        before = state.per_pod.get(name)
        if before is not None and name != facts.pod_name:
            assert entry.moves == before.moves
    assert result.new_state.moves == state.moves + 1
    assert len(result.new_state.excluded_nodes) <= MAX_EXCLUDED_NODES


def test_the_cap_drops_the_exclusions_of_the_least_recently_updated_entries_first() -> None:
    per_pod = {
        f"db-{i}": PodEntry(
            1, tuple(f"node-{i}-{n}" for n in range(32)), updated_at=NOW - timedelta(seconds=i)
        )
        for i in range(400)
    }
    result = plan(
        sts_state(per_pod), failed("u9", "node-z", "db-399", STS), Policy(3, STS, 400), NOW
    )
    assert result.new_state is not None
    kept = result.new_state.per_pod
    # db-399 is the oldest entry but the failing pod: its exclusions stay.
    assert kept["db-399"].excluded_nodes[-1] == "node-z"
    forgot = [i for i in range(399) if not kept[f"db-{i}"].excluded_nodes]
    assert forgot == list(range(399 - len(forgot), 399))
    assert all(kept[f"db-{i}"].moves == 1 for i in range(399))
    assert "least recently updated" in result.message


def test_counts_that_cannot_fit_refuse_the_move_instead_of_dropping_one() -> None:
    huge = sts_state(entries(10_000, age=timedelta(minutes=5)))
    policy, members = Policy(3, STS, 10_000), StatefulSetRange("db", 10_000)
    result = plan(huge, failed("u9", "node-z", "db-7", STS), policy, NOW, statefulset=members)
    assert result.action is Action.NOTHING
    assert result.reason == "state-too-large"
    assert result.new_state is None
    assert not result.delete_pod
    # Clearing exclusions that made a pod unschedulable is still written: we caused that.
    clear = failed("u10", name="db-7", kind=STS, unschedulable=True)
    assert plan(huge, clear, policy, NOW, statefulset=members).action is Action.CLEAR_AND_MOVE


# Storage.


def test_a_missing_annotation_is_an_untouched_workload() -> None:
    assert load_state(None) == WorkloadState()
    assert load_state("") == WorkloadState()


def test_the_state_round_trips_through_its_annotation() -> None:
    state = WorkloadState(
        moves=3,
        excluded_nodes=("node-b", "node-a"),
        per_pod={"db-1": PodEntry(1, ("node-c",)), "db-0": PodEntry(2, ("node-a",), True)},
        handled=("u1", "u2"),
        exhausted_recorded=True,
        updated_at=NOW,
        holder_uid=pods.uid("ReplicaSet/web-7d9c8b6f4"),
    )
    text = dump_state(state)
    assert load_state(text) == state
    assert dump_state(load_state(text)) == text


def test_the_dump_is_compact_deterministic_and_sorted() -> None:
    state = WorkloadState(
        moves=1,
        excluded_nodes=("node-a",),
        per_pod={"db-1": PodEntry(1, updated_at=NOW), "db-0": PodEntry(1, ("node-b",), True)},
        handled=("u1",),
        updated_at=NOW,
    )
    text = dump_state(state)
    assert text == (
        '{"excludedNodes":["node-a"],"exhaustedRecorded":false,"handled":["u1"],"moves":1,'
        '"pods":{"db-0":{"excludedNodes":["node-b"],"exhaustedRecorded":true,"moves":1},'
        '"db-1":{"moves":1,"updatedAt":"2026-03-14T09:26:53Z"}},'
        '"updatedAt":"2026-03-14T09:26:53Z","version":2}'
    )


# What the previous release wrote (version 1): per-pod entries without a timestamp.
V1_STATE = (
    '{"excludedNodes":[],"exhaustedRecorded":false,"handled":["u1","u2"],"moves":3,'
    '"pods":{"db-0":{"excludedNodes":["node-a"],"exhaustedRecorded":false,"moves":2},'
    '"db-1":{"excludedNodes":[],"exhaustedRecorded":true,"moves":1}},'
    '"updatedAt":"2026-03-14T09:00:00Z","version":1}'
)


def test_a_version_1_state_is_read_and_written_as_version_2() -> None:
    written_at = pods.NOW.replace(minute=0, second=0)
    state = load_state(V1_STATE)
    # An entry's last change is no later than the state's last write: the conservative time.
    assert state.per_pod == {
        "db-0": PodEntry(2, ("node-a",), updated_at=written_at),
        "db-1": PodEntry(1, (), exhausted_recorded=True, updated_at=written_at),
    }
    assert (state.moves, state.handled, state.updated_at) == (3, ("u1", "u2"), written_at)
    text = dump_state(state)
    assert json.loads(text)["version"] == 2
    assert json.loads(text)["pods"]["db-0"] == {
        "excludedNodes": ["node-a"],
        "moves": 2,
        "updatedAt": "2026-03-14T09:00:00Z",
    }
    assert load_state(text) == state


def test_a_version_1_state_without_a_timestamp_is_never_pruned_for_age() -> None:
    old = '{"version":1,"moves":1,"pods":{"db-0":{"moves":1,"excludedNodes":["node-a"]}}}'
    state = load_state(old)
    assert state.per_pod["db-0"].updated_at is None
    result = plan(
        state, failed("u9", "node-b", "db-1", STS), Policy(3, STS), NOW + timedelta(days=9)
    )
    assert result.new_state is not None
    assert result.new_state.per_pod["db-0"] == PodEntry(1, ("node-a",))


def test_a_planned_v1_state_is_written_as_version_2() -> None:
    result = plan(load_state(V1_STATE), failed("u9", "node-c", "db-0", STS), Policy(3, STS), NOW)
    assert result.new_state is not None
    assert json.loads(dump_state(result.new_state))["version"] == 2


def test_a_planned_state_round_trips() -> None:
    result = plan(WorkloadState(), failed(), THREE, NOW.replace(microsecond=123456))
    assert result.new_state is not None
    assert load_state(dump_state(result.new_state)) == result.new_state


def test_states_compare_by_value_and_hash() -> None:
    a = WorkloadState(per_pod={"db-0": PodEntry(1)})
    b = WorkloadState(per_pod={"db-0": PodEntry(1)})
    assert a == b
    assert hash(a) == hash(b)


def test_a_state_cannot_be_changed_through_its_per_pod_map() -> None:
    entries = {"db-0": PodEntry(1)}
    state = WorkloadState(per_pod=entries)
    entries["db-1"] = PodEntry(2)
    assert "db-1" not in state.per_pod
    with pytest.raises(TypeError):
        state.per_pod["db-2"] = PodEntry(3)  # type: ignore[index]


CORRUPT = {
    "not JSON": "{moves: 1",
    "a JSON list": "[1, 2]",
    "no version": '{"moves": 1}',
    "a future version": '{"version": 3, "moves": 1}',
    "a version 1 entry with a version 2 field": (
        '{"version": 1, "pods": {"db-0": {"moves": 1, "updatedAt": "2026-03-14T09:00:00Z"}}}'
    ),
    "a per-pod entry with an unreadable timestamp": (
        '{"version": 2, "pods": {"db-0": {"moves": 1, "updatedAt": "soon"}}}'
    ),
    "an invalid node name": '{"version": 2, "excludedNodes": ["node-1", "Bad_Name!"]}',
    "an invalid node name of a pod": (
        '{"version": 2, "pods": {"db-0": {"moves": 1, "excludedNodes": ["node_1"]}}}'
    ),
    "a node name of 254 characters": '{"version": 2, "excludedNodes": ["' + "a" * 254 + '"]}',
    "a version that is a string": '{"version": "1"}',
    "a negative count": '{"version": 1, "moves": -1}',
    "a count that is a string": '{"version": 1, "moves": "2"}',
    "a count that is a boolean": '{"version": 1, "moves": true}',
    "exclusions that are not a list": '{"version": 1, "excludedNodes": "node-a"}',
    "an empty node name": '{"version": 1, "excludedNodes": [""]}',
    "handled uids that are numbers": '{"version": 1, "handled": [1]}',
    "an unknown field": '{"version": 1, "moves": 1, "excluded": ["node-a"]}',
    "per-pod entries that are not an object": '{"version": 1, "pods": []}',
    "a per-pod entry with an unknown field": '{"version": 1, "pods": {"db-0": {"count": 1}}}',
    "an unreadable timestamp": '{"version": 1, "updatedAt": "yesterday"}',
    "a flag that is not a boolean": '{"version": 1, "exhaustedRecorded": "yes"}',
    "a holder uid that is not a string": '{"version": 2, "holderUid": 7}',
    "a holder uid in a version 1 state": '{"version": 1, "holderUid": "uid-rs"}',
}


@pytest.mark.parametrize("text", CORRUPT.values(), ids=CORRUPT.keys())
def test_a_corrupt_state_is_an_error_never_a_fresh_start(text: str) -> None:
    with pytest.raises(StateError):
        load_state(text)


def test_a_future_version_says_so() -> None:
    with pytest.raises(StateError, match="version 3 is not supported"):
        load_state('{"version": 3}')


def test_an_invalid_node_name_says_which() -> None:
    with pytest.raises(StateError, match="'Bad_Name!'"):
        load_state('{"version": 2, "excludedNodes": ["node-1", "Bad_Name!"]}')


def test_a_lenient_read_skips_invalid_node_names_and_keeps_the_valid_ones() -> None:
    text = json.dumps(
        {
            "version": 2,
            "excludedNodes": ["Bad_Name!", "node-1", ""],
            "pods": {"db-0": {"moves": 1, "excludedNodes": ["node-2", "NODE-3"]}},
        }
    )
    loaded = load_state_lenient(text)
    assert loaded.state.excluded_nodes == ("node-1",)
    assert loaded.state.per_pod["db-0"].excluded_nodes == ("node-2",)
    assert loaded.skipped_nodes == ("NODE-3", "Bad_Name!", "")


def test_a_lenient_read_still_refuses_a_damaged_state() -> None:
    with pytest.raises(StateError):
        load_state_lenient('{"version": 2, "excludedNodes": [1]}')


NODE_NAMES = {
    "node-1": True,
    "ip-10-0-0-12.eu-west-1.compute.internal": True,
    "worker7": True,
    "a" * 253: True,
    "a" * 254: False,
    "Bad_Name!": False,
    "Node-1": False,
    "-node": False,
    "node-": False,
    "node..1": False,
    ".node": False,
    "node 1": False,
    "n\u00f6de": False,
    "": False,
}


@pytest.mark.parametrize(("name", "valid"), NODE_NAMES.items(), ids=[n[:20] for n in NODE_NAMES])
def test_node_names_are_dns_1123_subdomains(name: str, valid: bool) -> None:
    assert is_valid_node_name(name) is valid


# Whose state: a copy of another object's state is not the holder's.

RS_UID = pods.uid("ReplicaSet/web-7d9c8b6f4")
OLD_RS_UID = pods.uid("ReplicaSet/web-5f6b7c8d9")
OLD_POD_UID = pods.uid("web-debug")
POD = OwnerKind.POD

# The state of a ReplicaSet that spent 2 of its 3 moves, then copied elsewhere.
SPENT = WorkloadState(
    moves=2,
    excluded_nodes=("node-a", "node-c"),
    handled=("u1", "u2"),
    updated_at=NOW - timedelta(minutes=3),
    holder_uid=OLD_RS_UID,
)


class Whose(NamedTuple):
    state: WorkloadState
    kind: OwnerKind
    holder_uid: str
    foreign: bool


WHOSE = {
    "a state written for this ReplicaSet is its own": Whose(
        replace(SPENT, holder_uid=RS_UID), RS, RS_UID, False
    ),
    "a state written for another ReplicaSet is a copy": Whose(SPENT, RS, RS_UID, True),
    "a state written for another StatefulSet is a copy": Whose(SPENT, STS, RS_UID, True),
    "a state written before holderUid existed is the holder's own": Whose(
        replace(SPENT, holder_uid=""), RS, RS_UID, False
    ),
    "a holder whose uid is unknown keeps what it has": Whose(SPENT, RS, "", False),
    "a bare pod's replacement carries the old pod's state on purpose": Whose(
        replace(SPENT, holder_uid=OLD_POD_UID), POD, pods.uid("web-debug-x7k2p"), False
    ),
}


@pytest.mark.parametrize("case", WHOSE.values(), ids=WHOSE.keys())
def test_a_state_is_its_holders_own_unless_written_for_another_object(case: Whose) -> None:
    reason = foreign_copy(case.state, case.kind, case.holder_uid)
    assert (reason is not None) is case.foreign
    if case.foreign:
        assert reason is not None and case.state.holder_uid in reason


def test_a_copy_of_another_replicasets_state_counts_as_empty() -> None:
    # The next rollout's ReplicaSet is born with its Deployment's copy of an old state.
    result = plan(SPENT, failed("u9", "node-b"), THREE, NOW, holder_uid=RS_UID)
    assert (result.action, result.moves) == (Action.MOVE, 1)
    assert result.excluded_nodes == ("node-b",)
    assert result.new_state is not None
    assert result.new_state.handled == ("u9",)
    assert result.new_state.holder_uid == RS_UID
    assert result.ignored_copy is not None and OLD_RS_UID in result.ignored_copy
    assert "ignored" in result.message and OLD_RS_UID in result.message


def test_the_holders_own_state_keeps_counting_to_the_budget() -> None:
    own = replace(SPENT, holder_uid=RS_UID)
    moved = plan(own, failed("u9", "node-b"), THREE, NOW, holder_uid=RS_UID)
    assert (moved.action, moved.moves, moved.ignored_copy) == (Action.MOVE, 3, None)
    spent = plan(apply(own, moved), failed("u10", "node-d"), THREE, NOW, holder_uid=RS_UID)
    assert spent.action is Action.EXHAUSTED


def test_a_copy_never_hides_that_a_pod_was_already_moved_by_its_holder() -> None:
    # A redelivery about a pod its own holder recorded: finish the removal, count nothing.
    own = replace(SPENT, holder_uid=RS_UID)
    again = plan(own, failed("u2", "node-c"), THREE, NOW, holder_uid=RS_UID)
    assert (again.reason, again.delete_pod, again.new_state) == ("already-handled", True, None)


def test_a_state_written_before_holder_uids_keeps_its_count_and_gains_the_uid() -> None:
    legacy = replace(SPENT, holder_uid="")
    result = plan(legacy, failed("u9", "node-b"), THREE, NOW, holder_uid=RS_UID)
    assert (result.moves, result.ignored_copy) == (3, None)
    assert result.new_state is not None and result.new_state.holder_uid == RS_UID


def test_a_bare_pods_replacement_counts_on_from_the_old_pods_state() -> None:
    carried = replace(SPENT, moves=1, holder_uid=OLD_POD_UID)
    replacement = pods.uid("web-debug-x7k2p")
    result = plan(
        carried,
        failed("u9", "node-b", "web-debug-x7k2p", POD),
        Policy(2, POD),
        NOW,
        holder_uid=replacement,
    )
    assert (result.action, result.moves, result.ignored_copy) == (Action.MOVE, 2, None)
    assert result.new_state is not None and result.new_state.holder_uid == replacement


WRITES = {
    "a move": (WorkloadState(), failed(), THREE),
    "a cleared exclusion": (
        WorkloadState(moves=1, excluded_nodes=("node-a",)),
        failed("u5", unschedulable=True),
        THREE,
    ),
    "an exhausted budget": (WorkloadState(moves=3, excluded_nodes=("node-a",)), failed(), THREE),
    "a StatefulSet pod's move": (
        WorkloadState(),
        failed("u1", "node-a", "db-0", STS),
        Policy(3, STS),
    ),
}


@pytest.mark.parametrize(("state", "failure", "policy"), WRITES.values(), ids=WRITES.keys())
def test_every_state_written_names_its_holder(
    state: WorkloadState, failure: FailureFacts, policy: Policy
) -> None:
    result = plan(state, failure, policy, NOW, holder_uid=RS_UID)
    assert result.new_state is not None
    assert json.loads(dump_state(result.new_state))["holderUid"] == RS_UID


def test_a_state_without_a_holder_uid_is_written_without_one() -> None:
    # States from before the field, planned by a caller that does not know its holder.
    result = plan(WorkloadState(), failed(), THREE, NOW)
    assert result.new_state is not None
    assert "holderUid" not in json.loads(dump_state(result.new_state))


# -- what a move records besides its own node: where the workload's other pods fail now ---------


class Siblings(NamedTuple):
    state: WorkloadState
    failure: FailureFacts
    policy: Policy
    also_failing: tuple[str, ...]
    action: Action
    excluded: tuple[str, ...]
    also_excluded: tuple[str, ...]


JOB = OwnerKind.JOB
SIBLINGS = {
    "a move also excludes the node where another pod of the workload is failing now": Siblings(
        WorkloadState(),
        failed(node="node-a"),
        THREE,
        ("node-b",),
        Action.MOVE,
        ("node-b", "node-a"),
        ("node-b",),
    ),
    "sibling nodes are listed once, and the failing pod's own node last": Siblings(
        WorkloadState(),
        failed(node="node-a"),
        THREE,
        ("node-b", "node-a", "node-c", "node-b"),
        Action.MOVE,
        ("node-b", "node-c", "node-a"),
        ("node-b", "node-c"),
    ),
    "a sibling node excluded before becomes recent again and is not announced as new": Siblings(
        WorkloadState(moves=1, excluded_nodes=("node-b", "node-x"), updated_at=NOW),
        failed(node="node-a"),
        THREE,
        ("node-b",),
        Action.MOVE,
        ("node-x", "node-b", "node-a"),
        (),
    ),
    "a Job's move excludes its other pods' failing nodes too": Siblings(
        WorkloadState(),
        failed(node="node-a", name="report-5xk2p", kind=JOB),
        Policy(3, JOB, replicas=4),
        ("node-b",),
        Action.MOVE,
        ("node-b", "node-a"),
        ("node-b",),
    ),
    "a StatefulSet pod's exclusions stay its own": Siblings(
        WorkloadState(),
        failed(node="node-a", name="db-0", kind=STS),
        Policy(3, STS, replicas=3),
        ("node-b",),
        Action.MOVE,
        ("node-a",),
        (),
    ),
    "a bare pod has no siblings": Siblings(
        WorkloadState(),
        failed(node="node-a", name="debug-shell", kind=OwnerKind.POD),
        Policy(1, OwnerKind.POD),
        ("node-b",),
        Action.MOVE,
        ("node-a",),
        (),
    ),
    "a reset records no sibling's node either": Siblings(
        WorkloadState(moves=1, excluded_nodes=("node-x",), updated_at=NOW),
        failed(node="node-a", ran_for=timedelta(hours=2)),
        THREE,
        ("node-b",),
        Action.MOVE,
        (),
        (),
    ),
    "a name Kubernetes would refuse is dropped, never written": Siblings(
        WorkloadState(),
        failed(node="node-a"),
        THREE,
        ("Node_B", "", "node-c", "x" * 254),
        Action.MOVE,
        ("node-c", "node-a"),
        ("node-c",),
    ),
    "a spent budget records its exhaustion and nothing more": Siblings(
        WorkloadState(moves=3, excluded_nodes=("node-x",), updated_at=NOW),
        failed(node="node-a"),
        THREE,
        ("node-b",),
        Action.EXHAUSTED,
        ("node-x",),
        (),
    ),
    "a duplicate event of a pod already moved records nothing": Siblings(
        WorkloadState(moves=1, excluded_nodes=("node-a",), handled=("uid-1",), updated_at=NOW),
        failed(node="node-a"),
        THREE,
        ("node-b",),
        Action.NOTHING,
        ("node-a",),
        (),
    ),
    "clearing exclusions that made a pod unschedulable adds none back": Siblings(
        WorkloadState(moves=1, excluded_nodes=("node-a",), updated_at=NOW),
        failed(unschedulable=True),
        THREE,
        ("node-b",),
        Action.CLEAR_AND_MOVE,
        (),
        (),
    ),
}


@pytest.mark.parametrize("case", SIBLINGS.values(), ids=SIBLINGS.keys())
def test_what_a_move_records_besides_its_own_node(case: Siblings) -> None:
    result = plan(
        case.state,
        case.failure,
        case.policy,
        NOW,
        statefulset=DB if case.policy.owner_kind is STS else None,
        also_failing=case.also_failing,
    )
    assert result.action is case.action
    assert result.excluded_nodes == case.excluded
    assert result.also_excluded == case.also_excluded
    alone = plan(case.state, case.failure, case.policy, NOW)
    # Sibling nodes are never charged: the count is what the move alone would have made it.
    assert result.moves == alone.moves
    if result.new_state is not None:
        assert alone.new_state is not None
        assert result.new_state.moves == alone.new_state.moves
        assert exclusions_for(result.new_state, case.policy.owner_kind, "db-0") == case.excluded
    for node in case.also_excluded:
        assert node in result.message
    if case.also_excluded:
        assert "no move counted" in result.message


def test_a_moves_record_of_sibling_nodes_is_bounded_and_keeps_the_failing_node() -> None:
    state = WorkloadState(moves=1, excluded_nodes=("node-old",), updated_at=NOW)
    siblings = tuple(f"node-{i:02d}" for i in range(40))
    result = plan(state, failed(node="node-a"), THREE, NOW, also_failing=siblings)
    assert result.excluded_nodes == (*siblings[-(MAX_EXCLUDED_NODES - 1) :], "node-a")
    assert result.also_excluded == siblings[-(MAX_EXCLUDED_NODES - 1) :]
    assert result.moves == 2


def test_recording_sibling_nodes_twice_equals_recording_them_once() -> None:
    first = plan(WorkloadState(), failed("u1", "node-a"), THREE, NOW, also_failing=("node-b",))
    state = apply(WorkloadState(), first)
    again = plan(state, failed("u1", "node-a"), THREE, NOW, also_failing=("node-b",))
    assert again.action is Action.NOTHING and again.new_state is None
    # The other pod, failing on node-b, moves in its turn: one more move, no node lost.
    other = plan(state, failed("u2", "node-b"), THREE, NOW, also_failing=("node-a",))
    assert other.moves == 2
    assert other.excluded_nodes == ("node-a", "node-b")
    assert other.also_excluded == ()


# -- a workload that fails the same way everywhere (shared.workloads.everywhere) ---------------

TWO = Policy(3, RS, replicas=2)
CRASHING = Witness("web-7d9c8b6f4-b7k2m", "node-c", Health.FAILED, "failing on node-c")
READY = Witness("web-7d9c8b6f4-b7k2m", "node-c", Health.HEALTHY, "Ready on node node-c")
STARTING = Witness("web-7d9c8b6f4-b7k2m", "node-c", Health.UNPROVEN, "not failed yet")
# A replacement of a pod moved off node-a: the webhook kept it off node-a.
REPLACEMENT = failed(node="node-b", kept_off=("node-a",))
MOVED_OFF_A = WorkloadState(
    moves=1,
    excluded_nodes=("node-a",),
    failed_on={"node-a": "CrashLoopBackOff"},
    updated_at=NOW,
)


class Everywhere(NamedTuple):
    state: WorkloadState
    failure: FailureFacts
    policy: Policy
    witnesses: Witnesses | None
    action: Action


EVERYWHERE = {
    "a replacement failing the same way on a second node, the other pod failing too: stop": (
        Everywhere(MOVED_OFF_A, REPLACEMENT, TWO, Witnesses((CRASHING,)), Action.STOPPED)
    ),
    "a pod placed before the move failing on a second node: it never had a chance, move": (
        Everywhere(MOVED_OFF_A, failed(node="node-b"), TWO, Witnesses((CRASHING,)), Action.MOVE)
    ),
    "a replacement kept off a node no failure was recorded on: move": Everywhere(
        MOVED_OFF_A,
        failed(node="node-b", kept_off=("node-z",)),
        TWO,
        Witnesses((CRASHING,)),
        Action.MOVE,
    ),
    "another pod Ready elsewhere: a node fixed it, move": Everywhere(
        MOVED_OFF_A, failed(node="node-b"), TWO, Witnesses((READY,)), Action.MOVE
    ),
    "another pod not failed yet is not healthy: stop until it turns Ready": Everywhere(
        MOVED_OFF_A, REPLACEMENT, TWO, Witnesses((STARTING,)), Action.STOPPED
    ),
    "a replacement not created yet: move": Everywhere(
        MOVED_OFF_A, failed(node="node-b"), TWO, Witnesses((CRASHING,), missing=1), Action.MOVE
    ),
    "a different failure on the second node: move": Everywhere(
        MOVED_OFF_A,
        failed(node="node-b", reason="OOMKilled"),
        TWO,
        Witnesses((CRASHING,)),
        Action.MOVE,
    ),
    "the same node again: one node, move": Everywhere(
        MOVED_OFF_A, failed(node="node-a"), TWO, Witnesses((CRASHING,)), Action.MOVE
    ),
    "no move recorded yet, however many pods fail: move": Everywhere(
        WorkloadState(), failed(node="node-b"), TWO, Witnesses((CRASHING,)), Action.MOVE
    ),
    "the other pods not looked at: never stop": Everywhere(
        MOVED_OFF_A, failed(node="node-b"), TWO, None, Action.MOVE
    ),
    "a lone pod on its second node: two bad nodes in a row happen, move": Everywhere(
        MOVED_OFF_A, failed(node="node-b"), THREE, ALONE, Action.MOVE
    ),
    "a lone pod on its third node: stop": Everywhere(
        replace(
            MOVED_OFF_A,
            moves=2,
            excluded_nodes=("node-a", "node-c"),
            failed_on={"node-a": "CrashLoopBackOff", "node-c": "CrashLoopBackOff"},
        ),
        failed(node="node-b", kept_off=("node-a", "node-c")),
        THREE,
        ALONE,
        Action.STOPPED,
    ),
    # The kubelet writes one failed pull as ErrImagePull after an attempt and ImagePullBackOff
    # while it waits (pkg/kubelet/images/image_manager.go): which one an event carries is timing.
    "a lone pod on its third node, its image pull read at different steps: stop": Everywhere(
        replace(
            MOVED_OFF_A,
            moves=2,
            excluded_nodes=("node-a", "node-c"),
            failed_on={"node-a": "ErrImagePull", "node-c": "ImagePullBackOff"},
        ),
        failed(node="node-b", reason="ErrImagePull", kept_off=("node-a", "node-c")),
        THREE,
        ALONE,
        Action.STOPPED,
    ),
    "an image pull on the second node after a crash loop on the first: move": Everywhere(
        MOVED_OFF_A,
        failed(node="node-b", reason="ImagePullBackOff", kept_off=("node-a",)),
        TWO,
        Witnesses((CRASHING,)),
        Action.MOVE,
    ),
    "a container that ran past reset-after: it ran fine here, move": Everywhere(
        MOVED_OFF_A,
        failed(node="node-b", ran_for=timedelta(hours=2)),
        TWO,
        Witnesses((CRASHING,)),
        Action.MOVE,
    ),
    "the budget spent first: exhausted, as before": Everywhere(
        replace(MOVED_OFF_A, moves=6),
        failed(node="node-b"),
        TWO,
        Witnesses((CRASHING,)),
        Action.EXHAUSTED,
    ),
    "a StatefulSet pod (budget per pod): not judged here, move": Everywhere(
        WorkloadState(
            moves=1,
            per_pod={"db-0": PodEntry(1, ("node-a",), updated_at=NOW)},
            failed_on={},
            updated_at=NOW,
        ),
        failed(node="node-b", name="db-0", kind=STS),
        Policy(3, STS),
        Witnesses((CRASHING,)),
        Action.MOVE,
    ),
}


@pytest.mark.parametrize("case", EVERYWHERE.values(), ids=EVERYWHERE.keys())
def test_moving_stops_only_when_it_cannot_help(case: Everywhere) -> None:
    result = plan(case.state, case.failure, case.policy, NOW, witnesses=case.witnesses)
    assert result.action is case.action, result.message


def test_a_stop_charges_nothing_removes_nothing_and_records_itself_for_one_warning() -> None:
    result = plan(MOVED_OFF_A, REPLACEMENT, TWO, NOW, witnesses=Witnesses((CRASHING,)))
    assert (result.action, result.event_reason) == (Action.STOPPED, REASON_MOVES_STOPPED)
    assert not result.delete_pod
    assert (result.moves, result.budget) == (1, 6)
    assert result.new_state is not None
    assert result.new_state.moves == 1
    assert result.new_state.excluded_nodes == ("node-a",)
    assert "uid-1" not in result.new_state.handled  # a later resume may still move it
    assert result.new_state.stopped == Stopped("CrashLoopBackOff", ("node-a", "node-b"), NOW)
    assert "CrashLoopBackOff on 2 nodes (node-a, node-b)" in result.message
    assert "1 of 6 used" in result.message


def test_a_recorded_stop_is_not_recorded_or_said_again() -> None:
    stopped = apply(
        MOVED_OFF_A,
        plan(MOVED_OFF_A, REPLACEMENT, TWO, NOW, witnesses=Witnesses((CRASHING,))),
    )
    # The redelivery, the other pod's failure, the sweep's resend: nothing to write or say.
    for failure in (failed(node="node-b"), failed("uid-2", node="node-c")):
        again = plan(stopped, failure, TWO, NOW, witnesses=Witnesses((CRASHING,)))
        assert (again.action, again.reason) == (Action.NOTHING, "stopped-already-recorded")
        assert again.new_state is None and again.event_reason is None
        assert not again.delete_pod


def test_a_stop_recorded_for_a_failed_pull_holds_for_its_back_off_and_is_said_once() -> None:
    pulling = replace(MOVED_OFF_A, failed_on={"node-a": "ImagePullBackOff"})
    first = plan(
        pulling,
        failed(node="node-b", reason="ErrImagePull", kept_off=("node-a",)),
        TWO,
        NOW,
        witnesses=Witnesses((CRASHING,)),
    )
    assert first.action is Action.STOPPED
    stopped = apply(pulling, first)
    # The same pull, read while the kubelet backs off: the stop holds, nothing is said again.
    again = plan(
        stopped,
        failed("uid-2", node="node-c", reason="ImagePullBackOff"),
        TWO,
        NOW,
        witnesses=Witnesses((CRASHING,)),
    )
    assert (again.action, again.reason) == (Action.NOTHING, "stopped-already-recorded")


def test_a_stop_holds_while_pods_only_start_and_lifts_when_one_is_healthy() -> None:
    stopped = apply(
        MOVED_OFF_A,
        plan(MOVED_OFF_A, REPLACEMENT, TWO, NOW, witnesses=Witnesses((CRASHING,))),
    )
    # A pod that has not failed yet proves nothing: the stop holds.
    held = plan(stopped, failed(node="node-b"), TWO, NOW, witnesses=Witnesses((STARTING,)))
    assert held.action is Action.NOTHING
    # A healthy pod: moves resume, and the move clears the stop.
    resumed = plan(stopped, failed(node="node-b"), TWO, NOW, witnesses=Witnesses((READY,)))
    assert resumed.action is Action.MOVE
    assert "moves resumed (pod web-7d9c8b6f4-b7k2m is Ready on node node-c)" in resumed.message
    assert resumed.new_state is not None and resumed.new_state.stopped is None
    assert resumed.moves == 2


def test_a_stop_outlives_the_pruning_of_the_failures_that_led_to_it() -> None:
    stopped = apply(
        MOVED_OFF_A,
        plan(MOVED_OFF_A, REPLACEMENT, TWO, NOW, witnesses=Witnesses((CRASHING,))),
    )
    later = NOW + THREE.reset_after + timedelta(minutes=1)
    held = plan(stopped, failed(node="node-b"), TWO, later, witnesses=Witnesses((CRASHING,)))
    assert held.action is Action.NOTHING, held.message


def test_a_move_records_the_failure_of_its_own_node_only() -> None:
    result = plan(
        MOVED_OFF_A,
        failed(node="node-b", reason="OOMKilled"),
        TWO,
        NOW,
        also_failing=("node-c",),
        witnesses=Witnesses((STARTING,)),
    )
    assert result.new_state is not None
    assert result.new_state.excluded_nodes == ("node-a", "node-c", "node-b")
    assert dict(result.new_state.failed_on) == {
        "node-a": "CrashLoopBackOff",
        "node-b": "OOMKilled",
    }


def test_failure_reasons_age_out_and_are_trimmed_with_their_nodes() -> None:
    old = replace(MOVED_OFF_A, updated_at=NOW - THREE.reset_after - timedelta(minutes=1))
    result = plan(old, failed(node="node-b"), TWO, NOW)
    assert result.new_state is not None
    assert dict(result.new_state.failed_on) == {"node-b": "CrashLoopBackOff"}


def test_failures_and_a_stop_round_trip_through_the_annotation() -> None:
    state = replace(MOVED_OFF_A, stopped=Stopped("OOMKilled", ("node-a", "node-b"), NOW))
    text = dump_state(state)
    assert json.loads(text)["failedOn"] == {"node-a": "CrashLoopBackOff"}
    assert json.loads(text)["stopped"] == {
        "reason": "OOMKilled",
        "nodes": ["node-a", "node-b"],
        "at": "2026-03-14T09:26:53Z",
    }
    assert load_state(text) == state
    # Nothing recorded, nothing written: a state without them reads as before.
    assert "failedOn" not in dump_state(WorkloadState(moves=1))
    assert "stopped" not in dump_state(WorkloadState(moves=1))


@pytest.mark.parametrize(
    "text",
    [
        '{"version": 2, "failedOn": ["node-a"]}',
        '{"version": 2, "failedOn": {"node-a": ""}}',
        '{"version": 2, "failedOn": {"node-a": 7}}',
        '{"version": 2, "failedOn": {"Node_A": "CrashLoopBackOff"}}',
        '{"version": 2, "failedOn": {"node-a": "' + "x" * 129 + '"}}',
        '{"version": 2, "stopped": true}',
        '{"version": 2, "stopped": {"nodes": ["node-a"]}}',
        '{"version": 2, "stopped": {"reason": "Oops", "nodes": ["node-a"], "why": "x"}}',
        '{"version": 2, "stopped": {"reason": "Oops", "nodes": ["node-a"], "at": "soon"}}',
        '{"version": 1, "failedOn": {"node-a": "CrashLoopBackOff"}}',
    ],
)
def test_a_damaged_failure_record_or_stop_is_an_error(text: str) -> None:
    with pytest.raises(StateError):
        load_state(text)


def test_a_lenient_read_skips_an_invalid_node_among_the_failures() -> None:
    text = '{"version": 2, "failedOn": {"Node_A": "x", "node-b": "CrashLoopBackOff"}}'
    lenient = load_state_lenient(text)
    assert dict(lenient.state.failed_on) == {"node-b": "CrashLoopBackOff"}
    assert lenient.skipped_nodes == ("Node_A",)


def test_clearing_exclusions_that_made_a_pod_unschedulable_keeps_where_it_failed() -> None:
    result = plan(MOVED_OFF_A, failed("uid-9", unschedulable=True), TWO, NOW)
    assert result.action is Action.CLEAR_AND_MOVE
    assert result.new_state is not None and result.new_state.excluded_nodes == ()
    assert dict(result.new_state.failed_on) == {"node-a": "CrashLoopBackOff"}


def test_a_reset_move_forgets_where_the_workload_failed() -> None:
    result = plan(MOVED_OFF_A, failed(node="node-b", ran_for=timedelta(hours=2)), TWO, NOW)
    assert result.new_state is not None and dict(result.new_state.failed_on) == {}
