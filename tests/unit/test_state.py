"""The state model and `plan`: counting moves, excluding nodes, and staying idempotent."""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from typing import NamedTuple

import pytest

from shared.classify import classify
from shared.config import Config
from shared.policy import OwnerKind, Policy
from shared.state import (
    Action,
    FailureFacts,
    Plan,
    PodEntry,
    StateError,
    WorkloadState,
    dump_state,
    exclusions_for,
    load_state,
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
) -> FailureFacts:
    return FailureFacts(
        pod_name=name,
        pod_uid=uid,
        owner_kind=kind,
        node=None if unschedulable else node,
        reason="Unschedulable" if unschedulable else reason,
        started_at=None if ran_for is None else NOW - ran_for,
        unschedulable=unschedulable,
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
    "a pod whose start time is unknown keeps the exclusions": Case(
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
        "db-0": PodEntry(moves=2, excluded_nodes=("node-a", "node-c")),
        "db-1": PodEntry(moves=1, excluded_nodes=("node-b",)),
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
    assert result.new_state.per_pod["db-0"] == PodEntry(1, ())
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
    facts = FailureFacts.from_pod(pod, failure, "ReplicaSet")
    assert facts == FailureFacts(
        pod_name="web-7d9c8b6f4-x2x9z",
        pod_uid=pods.uid("web-7d9c8b6f4-x2x9z"),
        owner_kind=RS,
        node="node-b",
        reason="CrashLoopBackOff",
        started_at=NOW - timedelta(minutes=5),
        unschedulable=False,
    )


def test_failure_facts_of_an_unschedulable_pod() -> None:
    pod = pods.unschedulable(excluded=["node-a"])
    failure = classify(pod, Config())
    assert failure is not None
    facts = FailureFacts.from_pod(pod, failure, RS)
    assert facts.unschedulable
    assert facts.node is None
    assert facts.started_at is None


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
    )
    text = dump_state(state)
    assert load_state(text) == state
    assert dump_state(load_state(text)) == text


def test_the_dump_is_compact_deterministic_and_sorted() -> None:
    state = WorkloadState(
        moves=1,
        excluded_nodes=("node-a",),
        per_pod={"db-1": PodEntry(1), "db-0": PodEntry(1)},
        handled=("u1",),
        updated_at=NOW,
    )
    text = dump_state(state)
    assert text == (
        '{"excludedNodes":["node-a"],"exhaustedRecorded":false,"handled":["u1"],"moves":1,'
        '"pods":{"db-0":{"excludedNodes":[],"exhaustedRecorded":false,"moves":1},'
        '"db-1":{"excludedNodes":[],"exhaustedRecorded":false,"moves":1}},'
        '"updatedAt":"2026-03-14T09:26:53Z","version":1}'
    )
    assert json.loads(text)["version"] == 1


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
    "a future version": '{"version": 2, "moves": 1}',
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
}


@pytest.mark.parametrize("text", CORRUPT.values(), ids=CORRUPT.keys())
def test_a_corrupt_state_is_an_error_never_a_fresh_start(text: str) -> None:
    with pytest.raises(StateError):
        load_state(text)


def test_a_future_version_says_so() -> None:
    with pytest.raises(StateError, match="version 2 is not supported"):
        load_state('{"version": 2}')
