"""The plan of a move (shared.pods.update_annotations.decide): the ordering rules that keep a
move safe, asserted on the value the handler sends request by request.

The rules (the handler's docstring): nothing is removed without a record, so the state write
comes before the eviction or delete; the write is a compare-and-swap on the resourceVersion
read; the removal names the pod's uid, so a namesake is never removed; a move is said only once
the pod is gone. The inputs are shaped as the API server returns them: pods as a kubelet wrote
them, holders as the controllers made them, and the report as detect-failures sends it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from shared.api import avoidnodes, nodehealth
from shared.api.keys import (
    EVENT_POD_EXHAUSTED,
    EVENT_POD_RESCHEDULED,
    JOB_CONTROLLER_UID_LABEL,
    NODE_HEALTH_ANNOTATION,
    REASON_INVALID_POLICY,
    REASON_JOB_RETRIES_SPENT,
    REASON_MOVE_WOULD_FAIL_JOB,
    REASON_RESCHEDULED,
    REASON_RETRIES_EXHAUSTED,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
    SUSPECT_VALUE,
)
from shared.api.kubetypes import Pod
from shared.api.state import WorkloadState, dump_state, load_state
from shared.api.workloadid import workload_id
from shared.platform import kube
from shared.platform.config import Config
from shared.platform.events import Event, Reply
from shared.pods.detect_failures.decide import detect
from shared.pods.failing import FailingPod
from shared.pods.update_annotations import decide
from shared.pods.update_annotations.bodies import replacement_name
from shared.pods.update_annotations.decide import (
    Answer,
    CreateReplacement,
    Delete,
    DryRunCreate,
    DryRunEvict,
    Evict,
    Inputs,
    ListJobPods,
    ListLine,
    ListSiblings,
    MovePlan,
    RecordEvent,
    Redirect,
    Request,
    WriteState,
)
from shared.pods.update_annotations.handler import Rescheduler
from shared.workloads.evidence import PodEvidence
from shared.workloads.fastpath import implicated_nodes
from shared.workloads.owners import BARE, JOB, REPLICASET, STATEFUL, Resolution, holder_of
from shared.workloads.state import Action
from tests.unit import nodes, pods
from tests.unit import test_jobs as jobs_builder
from tests.unit.test_owners import replicaset, statefulset

CFG = Config()
NOW = pods.NOW
CRASHING = pods.pod(containers=[pods.crash_looping(restarts=4)])


def report(pod: Pod, cfg: Config = CFG) -> FailingPod:
    """What detect-failures sends about ``pod``, read as update-annotations reads it."""
    sent = detect(Event("1", "s", "dev.knative.apiserver.resource.update", {}, pod), cfg, NOW)
    assert sent is not None
    return FailingPod.from_data(sent.data)


def resolution(kind: str, obj: Mapping[str, Any], policy: str | None = "3") -> Resolution:
    held = holder_of(kind, obj)
    return Resolution(kind, held, policy, held.ref if policy is not None else None, (held.ref,))


def with_state(obj: Mapping[str, Any], state: WorkloadState) -> dict[str, Any]:
    """``obj`` as read after a move of ours recorded ``state`` on it."""
    changed = copy.deepcopy(dict(obj))
    changed["metadata"].setdefault("annotations", {})[STATE_ANNOTATION] = dump_state(state)
    return changed


def plan_of(
    live: Pod,
    resolved: Resolution,
    *,
    cfg: Config = CFG,
    siblings: Sequence[Mapping[str, Any]] = (),
    line: Sequence[Mapping[str, Any]] = (),
    node_objects: Mapping[str, Any] | None = None,
    node_pods: Mapping[str, Sequence[Mapping[str, Any]] | None] | None = None,
    reported: FailingPod | None = None,
    **inputs: Any,
) -> MovePlan:
    """The plan for ``live``, the reads it asks for answered as the handler answers them:
    ``siblings`` are the pods a LIST of the workload (or of a Job's pods) finds, ``line`` those
    a LIST of a bare pod's siblings finds, ``node_objects`` the Nodes GETs find (by default
    each one a Node nothing speaks against), ``node_pods`` the pods LISTs by node find (by
    default none)."""
    given = Inputs(reported or report(live, cfg), live, resolved, cfg, NOW, **inputs)
    for _ in range(5):
        made = decide.plan_move(given)
        if isinstance(made, MovePlan):
            return made
        if isinstance(made, ListSiblings):
            judged = decide.judge_siblings(live, siblings, cfg, NOW, made)
            given = replace(given, siblings=judged, job_pods=judged.pods)
        elif isinstance(made, ListJobPods):
            given = replace(given, job_pods=tuple(siblings))
        elif isinstance(made, decide.ReadNodes):
            read = {name: (node_objects or {}).get(name, nodes.node(name)) for name in made.nodes}
            listed = {name: (node_pods or {}).get(name, []) for name in made.nodes}
            given = replace(given, implicated=implicated_nodes(live, read, cfg, NOW, listed))
        elif isinstance(made, decide.ReadEvidence):
            given = replace(given, evidence=PodEvidence())
        else:
            goes_on, _ = decide.line_goes_on(live, line)
            given = replace(given, line_goes_on=goes_on)
    raise AssertionError("the planner keeps asking")


def kinds(made: MovePlan) -> list[type[Request]]:
    return [type(r) for r in made.requests]


def first(made: MovePlan, kind: type[Request]) -> Any:
    return next(r for r in made.requests if isinstance(r, kind))


def removals(requests: Sequence[Request]) -> list[Evict | Delete]:
    return [r for r in requests if isinstance(r, Evict | Delete)]


def rs_move() -> MovePlan:
    return plan_of(CRASHING, resolution(REPLICASET, replicaset()))


# -- a ReplicaSet's pod, the common move ---------------------------------------------------------


def test_a_move_writes_the_state_before_it_deletes_the_pod_and_says_it_last() -> None:
    made = rs_move()
    assert made.decided is not None and made.decided.action is Action.MOVE
    order = kinds(made)
    assert order.index(WriteState) < order.index(Delete)
    assert order.index(Delete) < order.index(RecordEvent) < order.index(Answer)
    assert order[-1] is Answer


def test_the_state_write_carries_the_resource_version_it_read_as_its_precondition() -> None:
    write = first(rs_move(), WriteState)
    assert write.holder.kind == REPLICASET and write.holder.name == "web-7d9c8b6f4"
    assert write.resource_version == "51877"
    assert write.body["metadata"]["resourceVersion"] == "51877"
    recorded = load_state(write.body["metadata"]["annotations"][STATE_ANNOTATION])
    assert recorded.moves == 1
    assert recorded.excluded_nodes == ("node-b",)
    assert CRASHING["metadata"]["uid"] in recorded.handled


def test_the_state_write_carries_the_exclusions_flat_for_the_admission_policies() -> None:
    write = first(rs_move(), WriteState)
    flat = write.body["metadata"]["annotations"][avoidnodes.ANNOTATION]
    # The holder's own uid first: a copy on another object is not applied by the policies.
    parsed = avoidnodes.parse(flat)
    assert parsed is not None
    assert parsed.holder_uid == replicaset()["metadata"]["uid"]
    assert parsed.for_pod("web-7d9c8b6f4-new", per_pod=False) == ("node-b",)


def test_a_re_plan_after_a_conflict_writes_on_the_version_read_again() -> None:
    again = with_state(replicaset(), WorkloadState(moves=1, excluded_nodes=("node-c",)))
    again["metadata"]["resourceVersion"] = "51990"
    made = plan_of(
        CRASHING,
        resolution(REPLICASET, replicaset()),
        holder=holder_of(REPLICASET, again),
        attempt=2,
        checked=True,
    )
    write = first(made, WriteState)
    assert write.body["metadata"]["resourceVersion"] == "51990"
    recorded = load_state(write.body["metadata"]["annotations"][STATE_ANNOTATION])
    # The other delivery's move is kept, this one is added to it.
    assert recorded.moves == 2
    assert set(recorded.excluded_nodes) == {"node-b", "node-c"}


def test_the_delete_names_the_pods_uid_so_a_namesake_is_never_removed() -> None:
    delete = first(rs_move(), Delete)
    assert (delete.namespace, delete.name) == ("shop", "web-7d9c8b6f4-x2x9z")
    assert delete.uid == CRASHING["metadata"]["uid"]


def test_the_move_is_said_once_keyed_by_the_pods_uid_and_replied() -> None:
    made = rs_move()
    said = [r for r in made.requests if isinstance(r, RecordEvent)]
    assert [(e.reason, e.key, e.repeat) for e in said] == [
        (REASON_RESCHEDULED, CRASHING["metadata"]["uid"], False)
    ]
    reply = made.requests[-1]
    assert isinstance(reply, Answer) and reply.reply is not None
    assert reply.reply.type == EVENT_POD_RESCHEDULED
    assert reply.reply.data["workload"] == {"kind": REPLICASET, "name": "web-7d9c8b6f4"}
    assert reply.reply.data["topWorkload"] == {"kind": "Deployment", "name": "web"}


def test_a_pod_gone_before_its_delete_is_said_only_if_no_one_said_it_and_not_counted_again() -> (
    None
):
    gone = first(rs_move(), Delete).gone
    assert [type(r) for r in gone] == [RecordEvent, Answer]
    assert gone[0].gate
    assert not any(isinstance(r, WriteState) for r in gone)


def test_a_removal_recorded_by_an_earlier_delivery_is_replied_only_by_who_says_it() -> None:
    # Two deliveries of one report race: the second loses the write, reads the state again,
    # finds the pod handled and still there (a terminating pod is evicted again with 200), and
    # must not reply a second "rescheduled" for the same move.
    recorded = WorkloadState(
        moves=1, excluded_nodes=("node-b",), handled=(CRASHING["metadata"]["uid"],)
    )
    again = plan_of(
        CRASHING,
        resolution(REPLICASET, replicaset()),
        holder=holder_of(REPLICASET, with_state(replicaset(), recorded)),
    )
    assert not any(isinstance(r, WriteState) for r in again.requests)
    said = [r for r in again.requests if isinstance(r, RecordEvent)]
    assert [(e.reason, e.gate) for e in said] == [(REASON_RESCHEDULED, True)]
    assert kinds(again)[-2:] == [RecordEvent, Answer]
    fresh = [r for r in rs_move().requests if isinstance(r, RecordEvent)]
    assert [e.gate for e in fresh] == [False]


def test_every_request_says_why() -> None:
    assert all(r.why for r in rs_move().requests)


def test_with_use_eviction_the_pod_is_evicted_after_a_dry_run_and_the_write() -> None:
    cfg = Config(use_eviction=True)
    made = plan_of(CRASHING, resolution(REPLICASET, replicaset()), cfg=cfg)
    assert kinds(made)[:2] == [DryRunEvict, WriteState]
    order = kinds(made)
    assert order.index(WriteState) < order.index(Evict)
    dry, evict = first(made, DryRunEvict), first(made, Evict)
    assert dry.uid == evict.uid == CRASHING["metadata"]["uid"]
    assert Delete not in order


def test_a_re_plan_after_a_conflict_does_not_dry_run_again() -> None:
    made = plan_of(
        CRASHING, resolution(REPLICASET, replicaset()), cfg=Config(use_eviction=True), checked=True
    )
    assert DryRunEvict not in kinds(made)


def test_other_pods_of_the_workload_are_listed_only_once_a_move_is_decided() -> None:
    given = Inputs(report(CRASHING), CRASHING, resolution(REPLICASET, replicaset()), CFG, NOW)
    asked = decide.plan_move(given)
    assert isinstance(asked, ListSiblings)
    assert asked.selector == "pod-template-hash=7d9c8b6f4"
    spent = with_state(replicaset(), WorkloadState(moves=9, exhausted_recorded=True))
    given = Inputs(report(CRASHING), CRASHING, resolution(REPLICASET, spent), CFG, NOW)
    assert isinstance(decide.plan_move(given), MovePlan)


def test_a_sibling_failing_on_another_node_is_excluded_with_the_move() -> None:
    sibling = pods.pod(
        name="web-7d9c8b6f4-q8w7e", node="node-c", containers=[pods.crash_looping(restarts=4)]
    )
    made = plan_of(CRASHING, resolution(REPLICASET, replicaset()), siblings=[CRASHING, sibling])
    write = first(made, WriteState)
    recorded = load_state(write.body["metadata"]["annotations"][STATE_ANNOTATION])
    assert set(recorded.excluded_nodes) == {"node-b", "node-c"}
    assert any("other pods of its workload failing now" in n for n in made.notes)


# -- nothing to move: nothing written but what today writes ---------------------------------------


# scheduling-retries "3" on a ReplicaSet of 3 replicas: 9 moves.
SPENT = WorkloadState(moves=9, excluded_nodes=("node-a", "node-c", "node-d"))


def test_an_exhausted_budget_is_recorded_once_and_removes_nothing() -> None:
    spent = with_state(replicaset(), SPENT)
    made = plan_of(CRASHING, resolution(REPLICASET, spent))
    assert made.decided is not None and made.decided.action is Action.EXHAUSTED
    assert kinds(made) == [WriteState, decide.Count, RecordEvent, Answer]
    assert first(made, RecordEvent).reason == REASON_RETRIES_EXHAUSTED
    assert first(made, RecordEvent).warning
    reply = made.requests[-1]
    assert isinstance(reply, Answer) and reply.reply is not None
    assert reply.reply.type == EVENT_POD_EXHAUSTED


def test_an_exhaustion_already_recorded_writes_nothing_and_says_nothing() -> None:
    said = replace(SPENT, exhausted_recorded=True)
    made = plan_of(CRASHING, resolution(REPLICASET, with_state(replicaset(), said)))
    assert not removals(made.requests)
    assert WriteState not in kinds(made)
    assert RecordEvent not in kinds(made)


def failed_on_three_nodes() -> Pod:
    """A bare pod (one lineage) that failed the same way on node-a and node-c, was kept off
    them, and fails the same way again on node-b: a stop, unless the nodes say otherwise."""
    bare = pods.pod(
        name="solo",
        owner=None,
        stamp=None,
        excluded=["node-a", "node-c"],
        annotations={"scheduling-retries": "5"},
        containers=[pods.crash_looping(restarts=4)],
    )
    state = WorkloadState(
        moves=2,
        excluded_nodes=("node-a", "node-c"),
        holder_uid=bare["metadata"]["uid"],
        failed_on={"node-a": "CrashLoopBackOff", "node-c": "CrashLoopBackOff"},
    )
    return with_state(bare, state)  # type: ignore[return-value]


def test_moves_stopped_for_a_workload_failing_everywhere_record_the_stop_and_remove_nothing() -> (
    None
):
    live = failed_on_three_nodes()
    made = plan_of(live, resolution(BARE, live, "5"))  # type: ignore[arg-type]
    assert made.decided is not None and made.decided.action is Action.STOPPED
    assert kinds(made) == [WriteState, decide.Count, RecordEvent, Answer]
    assert not removals(made.requests)
    assert not any(isinstance(r, CreateReplacement | DryRunCreate) for r in made.requests)


def another_workload_failed_on(name: str) -> dict[str, Any]:
    """A Node whose health record (assess-nodes') names another workload failing there a
    minute ago."""
    record = nodehealth.NodeHealth().with_failure(
        nodehealth.Seen(
            NOW - timedelta(minutes=1),
            workload_id("ReplicaSet", "shop", "api-5f6b9c7d8"),
            "uid-api-x",
            "CrashLoopBackOff",
        )
    )
    return nodes.node(name, annotations={NODE_HEALTH_ANNOTATION: record.to_json()})


def test_no_stop_rests_on_a_node_failing_another_workloads_pods_now_opted_in_or_not() -> None:
    # A Deployment that never opted in crash-loops on the node too: the node's record (which
    # names opted-in workloads only) says nothing, the pods on it do.
    live = failed_on_three_nodes()
    neighbour = pods.pod(
        "batch-6b8d9c7f5-qq1zz",
        node="node-c",
        owner=("ReplicaSet", "batch-6b8d9c7f5"),
        stamp=None,
        containers=[pods.crash_looping(restarts=4)],
    )
    made = plan_of(live, resolution(BARE, live, "5"), node_pods={"node-c": [neighbour]})
    assert made.decided is not None and made.decided.action is Action.MOVE, made.decided
    # Not listed: in doubt, no stop either.
    made = plan_of(live, resolution(BARE, live, "5"), node_pods={"node-c": None})
    assert made.decided is not None and made.decided.action is Action.MOVE, made.decided
    # Nothing else fails there: the stop stands.
    made = plan_of(live, resolution(BARE, live, "5"), node_pods={"node-c": []})
    assert made.decided is not None and made.decided.action is Action.STOPPED, made.decided


@pytest.mark.parametrize(
    ("against", "node"),
    [
        ("suspect", nodes.node("node-c", labels={SUSPECT_LABEL: SUSPECT_VALUE})),
        ("another workload failed there", another_workload_failed_on("node-c")),
        ("could not be read", None),
    ],
    ids=["suspect", "other-workload-in-its-record", "unread"],
)
def test_no_stop_rests_on_a_node_that_speaks_against_itself(against: str, node: Any) -> None:
    """Three bad nodes out of eight used to stop workloads after 1-2 moves, their replicas
    left crash-looping beside five healthy nodes: failing where other workloads fail too is
    evidence against the nodes, not the application."""
    live = failed_on_three_nodes()
    made = plan_of(live, resolution(BARE, live, "5"), node_objects={"node-c": node})  # type: ignore[arg-type]
    assert made.decided is not None and made.decided.action is Action.MOVE, made.decided
    assert removals(made.requests)


def test_the_move_says_the_node_and_reason_judged_never_the_reports() -> None:
    """A report naming a pod really failing on node-b, but another node and reason: the move
    is the pod's real one, and what it says (the reply assess-nodes counts, the Event) is what
    was judged, or the report would blame the node of the sender's choice."""
    sent = report(CRASHING)
    forged = replace(sent, failure=replace(sent.failure, node="node-z", reason="Evicted"))
    made = plan_of(CRASHING, resolution(REPLICASET, replicaset()), reported=forged)
    answer = first(made, Answer).reply
    assert answer is not None and answer.type == EVENT_POD_RESCHEDULED
    assert (answer.data["node"], answer.data["reason"]) == ("node-b", "CrashLoopBackOff")
    assert "off node node-b" in first(made, RecordEvent).message


def test_rescheduling_off_writes_nothing_and_removes_nothing() -> None:
    made = plan_of(CRASHING, resolution(REPLICASET, replicaset(), "0"))
    assert not removals(made.requests)
    assert WriteState not in kinds(made)


def test_a_policy_that_cannot_be_read_is_said_and_nothing_is_written() -> None:
    made = plan_of(CRASHING, resolution(REPLICASET, replicaset(), "three"))
    assert kinds(made) == [RecordEvent, Answer]
    assert first(made, RecordEvent).reason == REASON_INVALID_POLICY


def test_a_pod_no_longer_failing_plans_nothing() -> None:
    healthy = pods.pod()
    given = Inputs(report(CRASHING), healthy, resolution(REPLICASET, replicaset()), CFG, NOW)
    made = decide.plan_move(given)
    assert isinstance(made, MovePlan)
    assert kinds(made) == [Answer]
    assert "no longer failing" in made.notes[0]


# -- the fast path: an early report ----------------------------------------------------------------


def early_report() -> FailingPod:
    first_crash = pods.pod(containers=[pods.crash_looping(restarts=1)])
    failing = report(first_crash)
    assert failing.failure.kind.value == "early"
    return failing


def node(*, suspect: bool) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": "node-b"}
    if suspect:
        labels[SUSPECT_LABEL] = SUSPECT_VALUE
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b", "labels": labels}}


def test_an_early_report_on_a_node_that_is_not_suspect_waits_for_more_evidence() -> None:
    # Not acted on by the node alone: corroboration looks beside the pod next (its own tests:
    # tests/unit/test_corroborated_moves.py), and with it off the report is dropped.
    assert decide.early_on_node(early_report(), CFG, node(suspect=False)) is None
    off = decide.early_on_node(
        early_report(), Config(corroborated_fast_path=False), node(suspect=False)
    )
    assert off is not None and not off.acted_on and "not suspect" in off.why


def test_an_early_report_on_a_suspect_node_moves_the_pod_at_its_first_failure() -> None:
    early = decide.early_on_node(early_report(), CFG, node(suspect=True))
    assert early is not None and early.acted_on
    live = pods.pod(containers=[pods.crash_looping(restarts=1)])
    given = Inputs(
        early_report(), live, resolution(REPLICASET, replicaset()), CFG, NOW, early=early
    )
    made = decide.plan_move(given)
    assert isinstance(made, ListSiblings)
    # The same report planned without the Node's verdict is not a failure yet.
    unproven = Inputs(early_report(), live, resolution(REPLICASET, replicaset()), CFG, NOW)
    assert not isinstance(decide.plan_move(unproven), ListSiblings)


def test_a_moves_reply_says_the_rule_the_judged_failure_and_what_was_read_when() -> None:
    # What a person (and the soak's invariants) reads to see why a pod was moved: never the
    # report's claims, the failure as judged on the pod read, and every read with its time.
    read = (decide.Read("pod shop/web-7d9c8b6f4-x2x9z", NOW - timedelta(seconds=1)),)
    made = plan_of(CRASHING, resolution(REPLICASET, replicaset()), reads=read)
    reply = first(made, Answer).reply
    evidence = reply.data["evidence"]
    assert evidence["rule"] == "thresholds"
    assert "CrashLoopBackOff" in evidence["why"] and "early" not in evidence
    assert evidence["judgedAt"] == "2026-03-14T09:26:53Z"
    assert evidence["read"][0] == {
        "what": "pod shop/web-7d9c8b6f4-x2x9z",
        "at": "2026-03-14T09:26:52Z",
    }
    # The Event says the judged failure too.
    assert f"judged: {evidence['why']}" in first(made, RecordEvent).message


def test_an_early_moves_reply_names_the_evidence_beside_the_pod() -> None:
    early = decide.early_on_node(early_report(), CFG, node(suspect=True))
    assert early is not None and early.acted_on
    live = pods.pod(containers=[pods.crash_looping(restarts=1)])
    made = plan_of(live, resolution(REPLICASET, replicaset()), reported=early_report(), early=early)
    evidence = first(made, Answer).reply.data["evidence"]
    assert evidence["rule"] == "suspect-node"
    assert evidence["early"] == early.why
    assert "before the thresholds: " + early.why in first(made, RecordEvent).message


def test_an_early_report_of_an_oom_kill_at_its_own_limit_moves_nothing_even_on_a_suspect_node() -> (
    None
):
    # detect-failures never reports one early (the application's own limit follows it to every
    # node); a report that claims so, forged or not, is judged the same.
    early = decide.early_on_node(early_report(), CFG, node(suspect=True))
    assert early is not None and early.acted_on
    oom = pods.pod(
        containers=[pods.crash_looping(restarts=1, last_reason="OOMKilled", exit_code=137)]
    )
    # The report of its first crash, as if it were any crash; the pod read is OOM-killed.
    claimed = early_report()
    assert claimed.uid == oom["metadata"]["uid"]
    given = Inputs(claimed, oom, resolution(REPLICASET, replicaset()), CFG, NOW, early=early)
    made = decide.plan_move(given)
    assert isinstance(made, MovePlan) and made.decided is None
    assert not any(isinstance(r, WriteState) for r in made.requests)


def test_an_early_report_with_the_fast_path_off_is_not_acted_on() -> None:
    off = Config(suspect_fast_path=False, corroborated_fast_path=False)
    early = decide.early_on_node(early_report(), off, node(suspect=True))
    assert early is not None and not early.acted_on
    only_corroborated = decide.early_on_node(
        early_report(), Config(suspect_fast_path=False), node(suspect=True)
    )
    assert only_corroborated is None  # the suspect label alone no longer moves it


# -- a Job's pod -----------------------------------------------------------------------------------


def job_resolution(the_job: Mapping[str, Any]) -> Resolution:
    return resolution(JOB, the_job)


def test_a_jobs_pod_is_evicted_never_deleted_after_a_dry_run_and_the_write() -> None:
    the_job = jobs_builder.job(rules=[jobs_builder.IGNORE_DISRUPTIONS])
    made = plan_of(jobs_builder.CRASH_LOOPING, job_resolution(the_job))
    order = kinds(made)
    assert order[:2] == [DryRunEvict, WriteState]
    assert Delete not in order
    assert order.index(WriteState) < order.index(Evict)
    assert first(made, Evict).uid == jobs_builder.CRASH_LOOPING["metadata"]["uid"]


def test_a_jobs_counted_move_lists_its_pods_by_the_controller_uid() -> None:
    the_job = jobs_builder.job(backoff_limit=6)
    given = Inputs(
        report(jobs_builder.CRASH_LOOPING),
        jobs_builder.CRASH_LOOPING,
        job_resolution(the_job),
        CFG,
        NOW,
        siblings=decide.Siblings(),
    )
    asked = decide.plan_move(given)
    assert isinstance(asked, ListJobPods)
    assert asked.selector == f"{JOB_CONTROLLER_UID_LABEL}={jobs_builder.JOB_UID}"


def test_a_move_that_would_fail_the_job_writes_nothing_and_removes_nothing() -> None:
    the_job = jobs_builder.job(backoff_limit=1, failed=1)
    made = plan_of(
        jobs_builder.CRASH_LOOPING,
        job_resolution(the_job),
        siblings=[jobs_builder.CRASH_LOOPING],
    )
    assert WriteState not in kinds(made)
    assert not removals(made.requests)
    assert first(made, RecordEvent).reason == REASON_MOVE_WOULD_FAIL_JOB
    assert made.requests[-1] == Answer(None, "nothing moved")


def test_the_jobs_last_retry_is_said_after_the_move() -> None:
    the_job = jobs_builder.job(backoff_limit=1)
    made = plan_of(
        jobs_builder.CRASH_LOOPING,
        job_resolution(the_job),
        siblings=[jobs_builder.CRASH_LOOPING],
    )
    order = kinds(made)
    assert order.index(WriteState) < order.index(Evict)
    said = [r.reason for r in made.requests if isinstance(r, RecordEvent)]
    assert said == [REASON_RESCHEDULED, REASON_JOB_RETRIES_SPENT]


# -- a StatefulSet's pod ---------------------------------------------------------------------------


def set_pod(name: str = "db-1") -> Pod:
    return pods.pod(
        name=name,
        owner=(STATEFUL, "db"),
        labels={"app": "db", "statefulset.kubernetes.io/pod-name": name},
        containers=[pods.crash_looping(restarts=4)],
    )


def test_a_statefulset_pod_is_moved_on_its_own_budget_without_listing_its_siblings() -> None:
    live = set_pod()
    given = Inputs(report(live), live, resolution(STATEFUL, statefulset()), CFG, NOW)
    made = decide.plan_move(given)
    assert isinstance(made, MovePlan)
    order = kinds(made)
    assert order.index(WriteState) < order.index(Delete)
    assert first(made, Delete).uid == live["metadata"]["uid"]
    recorded = load_state(first(made, WriteState).body["metadata"]["annotations"][STATE_ANNOTATION])
    assert recorded.entry("db-1").moves == 1


def test_a_statefulset_pods_flat_exclusions_are_its_own_scope() -> None:
    live = set_pod("db-1")
    given = Inputs(report(live), live, resolution(STATEFUL, statefulset()), CFG, NOW)
    made = decide.plan_move(given)
    assert isinstance(made, MovePlan)
    write = first(made, WriteState)
    parsed = avoidnodes.parse(write.body["metadata"]["annotations"][avoidnodes.ANNOTATION])
    assert parsed is not None
    node = live["spec"]["nodeName"]
    assert parsed.for_pod("db-1", per_pod=True) == (node,)
    assert parsed.for_pod("db-0", per_pod=True) == ()


def test_a_statefulset_pod_its_controller_removed_is_recorded_and_its_namesake_redirected() -> None:
    failed = pods.evicted(
        name="db-1",
        owner=(STATEFUL, "db"),
        labels={"app": "db", "statefulset.kubernetes.io/pod-name": "db-1"},
    )
    failing = report(failed)
    view = failing.as_failed_pod()
    namesake = set_pod()
    given = Inputs(
        failing,
        view,
        resolution(STATEFUL, statefulset()),
        CFG,
        NOW,
        failure=failing.failure,
        removed=True,
        namesake=namesake,
    )
    made = decide.plan_move(given)
    assert isinstance(made, MovePlan)
    assert not removals(made.requests)
    order = kinds(made)
    assert order.index(WriteState) < order.index(Redirect) < order.index(RecordEvent)
    assert first(made, Redirect).namesake is namesake
    assert "its StatefulSet had already deleted the failed pod" in first(made, RecordEvent).message


# -- a bare pod ------------------------------------------------------------------------------------


def bare_pod() -> Pod:
    return pods.pod(
        name="solo",
        owner=None,
        stamp=None,
        labels={"app": "solo"},
        annotations={"scheduling-retries": "3"},
        containers=[pods.crash_looping(restarts=4)],
    )


def test_a_bare_pods_replacement_is_created_after_the_write_and_before_the_delete() -> None:
    live = bare_pod()
    made = plan_of(live, resolution(BARE, live))
    order = kinds(made)
    assert order[:2] == [DryRunCreate, WriteState]
    assert order.index(WriteState) < order.index(CreateReplacement) < order.index(Delete)
    created = first(made, CreateReplacement).body
    assert created == first(made, DryRunCreate).body
    assert created["metadata"]["name"] == replacement_name(live)
    # The replacement carries the state this move writes.
    written = first(made, WriteState).body["metadata"]["annotations"][STATE_ANNOTATION]
    assert created["metadata"]["annotations"][STATE_ANNOTATION] == written
    assert first(made, Delete).uid == live["metadata"]["uid"]


def recorded_bare_pod() -> Pod:
    live = bare_pod()
    state = WorkloadState(
        moves=1,
        excluded_nodes=("node-b",),
        handled=(live["metadata"]["uid"],),
        holder_uid=live["metadata"]["uid"],
    )
    return with_state(live, state)  # type: ignore[return-value]


def test_a_redelivery_finishes_a_recorded_bare_pod_move_without_writing_again() -> None:
    live = recorded_bare_pod()
    made = plan_of(live, resolution(BARE, live))
    assert WriteState not in kinds(made)
    assert DryRunCreate not in kinds(made)
    order = kinds(made)
    assert order.index(CreateReplacement) < order.index(Delete)


def test_a_redelivery_never_recreates_a_bare_pod_whose_line_went_on() -> None:
    live = recorded_bare_pod()
    given = Inputs(report(live), live, resolution(BARE, live), CFG, NOW)
    asked = decide.plan_move(given)
    assert isinstance(asked, ListLine)
    successor = copy.deepcopy(live)
    successor["metadata"]["name"] = replacement_name(live)
    successor["metadata"]["uid"] = pods.uid("successor")
    made = plan_of(live, resolution(BARE, live), line=[live, successor])
    assert CreateReplacement not in kinds(made)
    assert [type(r) for r in removals(made.requests)] == [Delete]


@pytest.mark.parametrize(
    "live",
    [CRASHING, jobs_builder.CRASH_LOOPING, bare_pod(), set_pod()],
    ids=["replicaset", "job", "bare", "statefulset"],
)
def test_for_every_owner_no_pod_is_removed_before_its_move_is_recorded(live: Pod) -> None:
    owner = (live["metadata"].get("ownerReferences") or [{}])[0]
    obj: Mapping[str, Any] = {
        REPLICASET: replicaset(),
        JOB: jobs_builder.job(rules=[jobs_builder.IGNORE_DISRUPTIONS]),
        STATEFUL: statefulset(),
    }.get(owner.get("kind", BARE), live)
    made = plan_of(live, resolution(owner.get("kind", BARE), obj), siblings=[live])
    order = kinds(made)
    removal = removals(made.requests)
    assert len(removal) == 1
    assert order.index(WriteState) < order.index(type(removal[0]))
    assert removal[0].uid == live["metadata"]["uid"]
    write = first(made, WriteState)
    read = holder_of(owner.get("kind", BARE), obj).resource_version
    assert write.body["metadata"]["resourceVersion"] == read


def test_a_terminal_failure_redirects_the_early_replacement_once_the_pod_is_deleted() -> None:
    failed = pods.evicted()
    made = plan_of(failed, resolution(REPLICASET, replicaset()))
    order = kinds(made)
    assert order.index(Delete) < order.index(Redirect)
    assert first(made, Redirect).node == "node-b"


def test_the_plan_is_the_same_for_the_same_reads() -> None:
    assert rs_move() == rs_move()


# -- the executor: refusals mapped as before ------------------------------------------------------


class Scripted(kube.Kube):
    """An API server answering update-annotations' calls from ``objects`` and ``refusals``
    (by call, e.g. ``"patch"``: the error to raise), recording every call. A real server gives
    a lost write or a pod removed between two calls only under timings no test controls; the
    end-to-end tests (tests/e2e/test_moves.py, test_rescheduling_safety.py) cover the rest."""

    def __init__(
        self,
        objects: Mapping[str, Mapping[str, Any]],
        refusals: Mapping[str, kube.KubeError],
        listed: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    ) -> None:
        self.objects = objects
        self.refusals = refusals
        self.listed = listed or {}
        self.calls: list[str] = []
        self.patches: list[dict[str, Any]] = []

    def _call(self, call: str) -> None:
        self.calls.append(call)
        if call in self.refusals:
            raise self.refusals[call]

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        self._call(f"get {kind}")
        if kind not in self.objects:
            raise kube.NotFound(f"{kind} {name} not found", 404, "NotFound")
        return copy.deepcopy(dict(self.objects[kind]))

    def list_all(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        limit: int = 500,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        self._call(f"list {kind}")
        return iter([copy.deepcopy(dict(o)) for o in self.listed.get(kind, ())])

    def merge_patch(
        self, kind: str, namespace: str | None, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        self._call("patch")
        self.patches.append(copy.deepcopy(body))
        return {}

    def create(self, kind: str, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        self._call(f"create {kind}")
        return body

    def delete(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        grace_seconds: int | None = None,
    ) -> dict[str, Any]:
        self._call(f"delete {kind}")
        return {}

    def evict(self, namespace: str, name: str, *, uid: str | None = None) -> dict[str, Any]:
        self._call("evict")
        return {}

    def with_options(
        self, *, dry_run: bool | None = None, timeout: float | None = None
    ) -> Scripted:
        return self


def deliver(api: Scripted, cfg: Config = CFG, live: Pod = CRASHING) -> Reply | None:
    failing = report(live, cfg)
    event = Event("2", "/kn-rescheduler/detect-failures", "failing", {}, failing.to_data())
    return Rescheduler(api, cfg, clock=lambda: NOW, max_attempts=3).handle(event)


def conflict() -> kube.Conflict:
    return kube.Conflict("the object has been modified", 409, "Conflict")


def test_a_write_that_keeps_losing_its_race_is_re_planned_a_bounded_number_of_times() -> None:
    api = Scripted({"Pod": CRASHING, "ReplicaSet": replicaset()}, {"patch": conflict()})
    with pytest.raises(kube.Conflict):
        deliver(api)
    assert api.calls.count("patch") == 3
    # Each re-plan reads the holder again; nothing is removed without a record.
    assert api.calls.count("get ReplicaSet") == 1 + 2
    assert "delete Pod" not in api.calls


def test_a_pod_a_budget_protects_is_deferred_and_its_move_not_charged() -> None:
    refused = kube.DisruptionBudgetRefused(
        "Cannot evict pod as it would violate the pod's disruption budget.",
        429,
        "TooManyRequests",
        ("The disruption budget web needs 1 healthy pods and has 1 currently",),
    )
    api = Scripted({"Pod": CRASHING, "ReplicaSet": replicaset()}, {"evict": refused})
    assert deliver(api, Config(use_eviction=True)) is None
    # The dry run was refused: nothing written, the refusal said on the pod.
    assert api.calls.count("evict") == 1
    assert "patch" not in api.calls
    assert "create Event" in api.calls


@pytest.mark.parametrize("said_already", [False, True])
def test_a_pod_gone_before_its_delete_is_said_and_replied_once(said_already: bool) -> None:
    refusals: dict[str, kube.KubeError] = {
        "delete Pod": kube.NotFound("pods not found", 404, "NotFound")
    }
    if said_already:
        # Another delivery recorded the Rescheduled Event keyed by this pod's uid.
        refusals["create Event"] = kube.AlreadyExists("exists", 409, "AlreadyExists")
    api = Scripted({"Pod": CRASHING, "ReplicaSet": replicaset()}, refusals)
    reply = deliver(api)
    assert api.calls.index("patch") < api.calls.index("delete Pod")
    if said_already:
        assert reply is None
    else:
        assert reply is not None and reply.type == EVENT_POD_RESCHEDULED


# -- a pod already gone: its move said late, or nothing ------------------------------------------


def test_a_pod_gone_whose_move_we_recorded_is_said_once_and_nothing_else() -> None:
    failing = report(CRASHING)
    holder = holder_of(REPLICASET, replicaset())
    recorded = WorkloadState(moves=1, excluded_nodes=("node-b",), handled=(failing.uid,))
    made = decide.said_late(failing, dump_state(recorded), holder.ref)
    assert kinds(made) == [RecordEvent, Answer]
    said = first(made, RecordEvent)
    assert (said.reason, said.key, said.repeat) == (REASON_RESCHEDULED, failing.uid, False)
    assert made.requests[-1] == Answer(None, "said only: the reply was the earlier delivery's")


def test_a_pod_someone_else_removed_plans_nothing() -> None:
    failing = report(CRASHING)
    holder = holder_of(REPLICASET, replicaset())
    made = decide.said_late(failing, dump_state(WorkloadState(moves=1)), holder.ref)
    assert kinds(made) == [Answer]
    assert "not moved by us" in made.notes[0]


def test_a_gone_bare_pods_move_is_looked_for_on_its_replacement() -> None:
    live = bare_pod()
    assert decide.replacement_name_of(report(live)) == replacement_name(live)


def test_a_removed_statefulset_pods_run_length_is_never_taken_from_the_report() -> None:
    # The kubelet's Evicted Event confirms the node and the reason; nothing read says how long
    # the pod ran. A report claiming days would reset the pod's exclusions (the evicting node
    # among them) and still charge the move.
    failed = pods.evicted(
        name="db-1",
        owner=(STATEFUL, "db"),
        labels={"app": "db", "statefulset.kubernetes.io/pod-name": "db-1"},
    )
    said = pods.kubelet_event(
        failed,
        "Evicted",
        "The node had condition: [DiskPressure]. ",
        at=NOW - timedelta(seconds=5),
        container=None,
        kind="Warning",
    )
    api = Scripted({"StatefulSet": statefulset()}, {}, listed={"Event": [said]})
    data = report(failed).to_data() | {"ranForSeconds": 10_000_000}
    event = Event("3", "/a-pod-of-the-cluster", "failing", {}, data)
    Rescheduler(api, CFG, clock=lambda: NOW).handle(event)
    [patch] = api.patches
    state = load_state(patch["metadata"]["annotations"][STATE_ANNOTATION])
    assert state.per_pod["db-1"].excluded_nodes == ("node-b",)
