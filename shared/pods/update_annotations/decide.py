"""The plan of a move, as a value: every request update-annotations will send, in order.

Why a value: what keeps a move safe under at-least-once, unordered, concurrent delivery (see
``shared.pods.update_annotations.handler``) is the order of its requests: the dry runs before
anything is charged, the state written with the holder's resourceVersion as precondition
before the pod is removed with its uid as precondition, the Event only once the pod is gone.
Built by pure code from what was read, that order is a property of a value and is asserted
as one (tests/unit/test_move_plan.py); the handler reads, plans, sends the requests in order
and maps the API server's refusals, nothing more.

This module is update-annotations' ``decide.py`` (the pure half of a function's folder): the
move's state decision (``shared.workloads.state.plan``) and the requests that carry it out are
one idea, what this delivery decides to do.

Some reads depend on the decision itself, so the planner asks for them rather than doing
them: the other pods of the workload (``ListSiblings``, only once a move is decided, as a LIST
per move costs), a Job's pods (``ListJobPods``, to count what the move costs the Job), a bare
pod's line (``ListLine``, when a redelivery finds its move recorded). The handler reads and
plans again with the answer, so a plan stays a function of what was read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from shared.api import avoidnodes
from shared.api.keys import (
    EVENT_POD_EXHAUSTED,
    EVENT_POD_RESCHEDULED,
    JOB_CONTROLLER_UID_LABEL,
    REASON_EXCLUSIONS_CLEARED,
    REASON_INVALID_POLICY,
    REASON_JOB_RETRIES_SPENT,
    REASON_MOVE_WOULD_FAIL_JOB,
    REASON_RESCHEDULED,
    REASON_STATE_TOO_LARGE,
    RESET_AFTER_ANNOTATION,
    STATE_ANNOTATION,
)
from shared.api.kubetypes import Pod
from shared.api.state import StateError, dump_state, load_state, load_state_lenient
from shared.api.times import format_duration, format_time
from shared.platform import events
from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.pods.update_annotations import bodies
from shared.pods.update_annotations.replacements import is_terminal_failure, label_selector
from shared.workloads import jobs
from shared.workloads.classify import (
    Failure,
    FailureKind,
    classify,
    controller_of,
    evicted_for_its_own_limits,
    still_starting,
    unschedulable_due_to_exclusions,
)
from shared.workloads.everywhere import (
    ALONE,
    Witnesses,
    follows_its_workload,
    proven_elsewhere,
    witnesses_of,
)
from shared.workloads.evidence import SWEEP_VERDICTS, PodEvidence, failing_now, kubelet_recorded
from shared.workloads.fastpath import (
    corroborated_config,
    corroborated_failure,
    early_config,
    fast_failure,
    is_suspect,
    other_workloads_failing,
    ready_elsewhere,
    recorded_on_node,
)
from shared.workloads.owners import BARE, JOB, Holder, Ref, Resolution
from shared.workloads.podevents import PodEvent
from shared.workloads.policy import (
    BudgetScope,
    InvalidPolicy,
    OwnerKind,
    Policy,
    parse_reset_after,
    parse_retries,
)
from shared.workloads.siblings import failing_siblings, nodes_of, sibling_selector
from shared.workloads.state import (
    Action,
    FailureFacts,
    Plan,
    plan,
)

# -- what was read ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Siblings:
    """The other pods of the failing pod's controller, as one LIST found them, judged.

    ``pods`` is None when they were not listed (the LIST failed, or the pod has no labels to
    select on): the move then records its own node only and is never stopped.
    """

    also_failing: tuple[str, ...] = ()
    pods: tuple[Mapping[str, Any], ...] | None = None
    witnesses: Witnesses | None = None
    # The attempt whose plan asked for the LIST, and what it found, in words.
    attempt: int = 1
    note: str | None = None


@dataclass(frozen=True)
class Read:
    """One thing this delivery read from the API, and when: what its decision rests on."""

    what: str
    at: datetime


@dataclass(frozen=True)
class Inputs:
    """What a plan is made of: the report, what was read, the settings and the clock."""

    failing: FailingPod
    # The pod as read now; for a StatefulSet's pod its controller already removed, the pod as
    # the report describes it.
    live: Pod
    # The owner chain as resolved (a Deployment's policy settled): policy and holder.
    resolution: Resolution
    cfg: Config
    now: datetime
    # The holder as last read; None: the resolution's (the first read).
    holder: Holder | None = None
    # The failure as judged on the first attempt (re-plans after a conflict keep it); None:
    # judge the pod now.
    failure: Failure | None = None
    # 1 for the first plan, one more after every write lost to a conflict.
    attempt: int = 1
    # The dry runs passed on an earlier attempt: a re-plan removes the same pod the same way.
    checked: bool = False
    siblings: Siblings | None = None
    # The pods of a Job holder, from this attempt's LIST; None until listed.
    job_pods: tuple[Mapping[str, Any], ...] | None = None
    # Whether a live pod already carries this bare pod's move; None until looked for.
    line_goes_on: bool | None = None
    # The pod is a StatefulSet's its controller removed already (the report is the only
    # witness of its failure), and the pod now holding its name, if any.
    removed: bool = False
    namesake: Pod | None = None
    # What an early report (a failure below the thresholds) was acted on for; None: the full
    # rules' report.
    early: Early | None = None
    # What was read beside the pod for a verdict of the sweep's; None until read.
    evidence: PodEvidence | None = None
    # The nodes a stop would rest on that speak against themselves, and why; None until read.
    implicated: Mapping[str, str] | None = None
    # Everything read for this decision, in order: said in the move's reply.
    reads: tuple[Read, ...] = ()

    def having_read(self, what: str, at: datetime) -> Inputs:
        return replace(self, reads=(*self.reads, Read(what, at)))


# -- what a plan asks to be read first ----------------------------------------------------------


@dataclass(frozen=True)
class ListSiblings:
    """LIST the pods of the failing pod's controller (``selector`` None: nothing to select
    on, nothing to list), then judge them with ``judge_siblings``."""

    namespace: str
    selector: str | None
    reset_after: timedelta
    replicas: int | None
    why: str


@dataclass(frozen=True)
class ListJobPods:
    """LIST a Job's pods by the controller-uid label its controller puts on them."""

    namespace: str
    selector: str
    why: str


@dataclass(frozen=True)
class ListLine:
    """LIST the bare pod's siblings, to see whether its replacement (or a descendant) exists
    (``line_goes_on``)."""

    namespace: str
    selector: str | None
    uid: str
    why: str


@dataclass(frozen=True)
class ReadEvidence:
    """Read what beside the pod the sweep judged it on (its Warning Events, its siblings'
    started containers: ``shared.workloads.evidence``), then judge it again with them."""

    why: str


@dataclass(frozen=True)
class ReadNodes:
    """GET the nodes a stop would rest on and LIST the pods on each, then plan again with the
    ones that are evidence against themselves (``shared.workloads.fastpath.implicated_nodes``):
    suspect, failing other workloads lately, or failing another workload's pods now."""

    nodes: tuple[str, ...]
    why: str


Lookup = ListSiblings | ListJobPods | ListLine | ReadEvidence | ReadNodes


# -- the requests of a plan ---------------------------------------------------------------------


@dataclass(frozen=True)
class DryRunCreate:
    """``dryRun=All`` create of a bare pod's replacement: admission, RBAC, quotas and
    validation answer before the move is charged. AlreadyExists passes (made earlier)."""

    namespace: str
    body: Mapping[str, Any]
    why: str


@dataclass(frozen=True)
class DryRunEvict:
    """``dryRun=All`` eviction, uid precondition: a PodDisruptionBudget answers before the move
    is charged. ``say`` False: a refusal is not recorded on the pod (it is gone already)."""

    namespace: str
    name: str
    uid: str
    why: str
    say: bool = True


@dataclass(frozen=True)
class WriteState:
    """The state written on the holder, compare-and-swap on the resourceVersion read."""

    holder: Ref
    resource_version: str
    body: Mapping[str, Any]
    why: str


@dataclass(frozen=True)
class Count:
    """One more decision counted in the metrics, under ``action``."""

    action: str
    why: str


@dataclass(frozen=True)
class RecordEvent:
    """An Event, once per (object, reason, key) (``shared.platform.recorder``). ``gate``: the
    rest of the plan is sent only when this call created the Event (a removal someone else
    made is said once, with its reply)."""

    involved: Ref
    reason: str
    message: str
    why: str
    warning: bool = False
    key: str | None = None
    repeat: bool = True
    gate: bool = False
    # Said in the trace when this call created the Event.
    noted: str | None = None


@dataclass(frozen=True)
class CreateReplacement:
    """A bare pod's replacement, created before the pod is deleted (AlreadyExists: done)."""

    namespace: str
    body: Mapping[str, Any]
    why: str


@dataclass(frozen=True)
class Evict:
    """The Eviction API, uid precondition. ``gone``: what is sent instead of the rest of the
    plan when the pod is gone already (404, or 409: a namesake holds the name)."""

    namespace: str
    name: str
    uid: str
    why: str
    gone: tuple[Request, ...] = ()


@dataclass(frozen=True)
class Delete:
    """DELETE, uid precondition; ``gone`` as for ``Evict``."""

    namespace: str
    name: str
    uid: str
    why: str
    gone: tuple[Request, ...] = ()


@dataclass(frozen=True)
class Redirect:
    """Recreate the replacements a controller made before the failure was recorded
    (``shared.pods.update_annotations.replacements``): best effort, a LIST (or the namesake)
    then DELETEs with uid preconditions."""

    failed: Pod
    node: str
    holder: Ref
    why: str
    namesake: Pod | None = None


@dataclass(frozen=True)
class MarkNode:
    """Mark the node the pod is moved off (the moved-off label, ``shared.api.movedoff``) before
    the pod is removed: its replacement, and every other workload's placed in the same burst,
    are kept softly off it seconds before assess-nodes has heard. Best effort: a read or
    write that fails is logged, and the move goes on."""

    node: str
    why: str
    # The failing pod, when nothing this plan read says the node fails others too (a move at
    # the thresholds with no pod of its workload proven healthy elsewhere): the node is then
    # marked only if its health record names another workload, or another workload's pod
    # fails there now (``fastpath.recorded_on_node``, ``other_workloads_failing``). One
    # workload's move alone may follow the workload (a rollout whose image crashes 20 s after
    # start, an application broken everywhere), and no node is marked by one workload.
    unless_alone: Pod | None = None


@dataclass(frozen=True)
class Answer:
    """The end of the plan: what the delivery replies (None: no reply, 202)."""

    reply: events.Reply | None
    why: str


Request = (
    DryRunCreate
    | DryRunEvict
    | WriteState
    | Count
    | RecordEvent
    | CreateReplacement
    | Evict
    | Delete
    | Redirect
    | MarkNode
    | Answer
)


@dataclass(frozen=True)
class MovePlan:
    """What this delivery does about the failing pod."""

    # The state decision (None when the pod is left alone before any was made).
    decided: Plan | None
    requests: tuple[Request, ...]
    # Said in the trace before the requests are sent.
    notes: tuple[str, ...] = ()
    # The failure judged (kept by re-plans after a conflict).
    failure: Failure | None = None
    # What the move costs the pod's Job, when it is a Job's pod moved now.
    job_cost: jobs.MoveCost | None = field(default=None, compare=False)


# -- what is said once a pod is gone ------------------------------------------------------------


@dataclass(frozen=True)
class Moved:
    """What to say once a pod is really gone: the Event and the reply's action."""

    action: Action
    event_reason: str
    message: str


def moved(decided: Plan, failure: Failure, pod_name: str) -> Moved:
    """The Event for a removal this delivery completed.

    For a move planned now, the plan's own. For a move an earlier delivery recorded whose
    removal did not happen then (a PodDisruptionBudget, a crash between the state write and
    the delete), the plan only says "already handled": the Event is composed here.
    """
    if decided.action in (Action.MOVE, Action.CLEAR_AND_MOVE) and decided.event_reason:
        return Moved(decided.action, decided.event_reason, decided.message)
    if failure.kind is FailureKind.EXCLUSIONS_UNSCHEDULABLE:
        return Moved(
            Action.CLEAR_AND_MOVE,
            REASON_EXCLUSIONS_CLEARED,
            f"pod {pod_name} could not be scheduled while avoiding excluded nodes; its "
            "exclusions were cleared earlier and it was deleted now so the scheduler may use "
            f"every node (moves stay {decided.moves}/{decided.budget})",
        )
    # The plan's own wording (the demo's timeline reads it back from the Events).
    excluded = ", ".join(decided.excluded_nodes) or "none"
    return Moved(
        Action.MOVE,
        REASON_RESCHEDULED,
        f"moved pod {pod_name} off node {failure.node} after {failure.reason} "
        f"(move {decided.moves} of {decided.budget}); recorded earlier, removed now; "
        f"excluded nodes now: {excluded}",
    )


def reply_for(
    failing: FailingPod,
    action: Action,
    decided: Plan,
    resolution: Resolution,
    *,
    message: str | None = None,
    evidence: Mapping[str, Any] | None = None,
) -> events.Reply | None:
    """The follow-up event: rescheduled or exhausted; nothing for any other action.
    ``evidence`` (``evidence_of``) says what the decision rested on, when this delivery made
    it."""
    if action in (Action.MOVE, Action.CLEAR_AND_MOVE):
        kind = EVENT_POD_RESCHEDULED
    elif action is Action.EXHAUSTED:
        kind = EVENT_POD_EXHAUSTED
    else:
        return None
    holder = resolution.holder
    assert holder is not None
    # What assess-nodes counts a node's distinct failing workloads by: the holder's own
    # controller as its ownerReference names it (a ReplicaSet's Deployment, a Job's
    # CronJob: each rollout or run makes a new holder), else the holder.
    top = holder.controller or holder.ref
    return events.Reply(
        type=kind,
        subject=failing.subject,
        # A pod is moved (or found out of budget) once: every delivery that says so, a
        # redelivery finishing a removal or a racing report of the same pod, says one event.
        id=events.stable_id(kind, failing.uid),
        data={
            "namespace": failing.namespace,
            "name": failing.name,
            "uid": failing.uid,
            "node": failing.failure.node,
            "reason": failing.failure.reason,
            # The report's kind: "early" for a fast-path move (the pod's first failure, on
            # a suspect node), which assess-nodes must not count against the node.
            "kind": str(failing.failure.kind),
            "action": str(action),
            "workload": {"kind": holder.ref.kind, "name": holder.ref.name},
            "topWorkload": {"kind": top.kind, "name": top.name},
            "moves": decided.moves,
            "budget": decided.budget,
            "excludedNodes": list(decided.excluded_nodes),
            "exclusionsCleared": decided.exclusions_cleared or action is Action.CLEAR_AND_MOVE,
            "message": decided.message if message is None else message,
            **({"evidence": dict(evidence)} if evidence is not None else {}),
        },
    )


def evidence_of(given: Inputs, failure: Failure) -> dict[str, Any]:
    """What a decision rested on, for its reply: the rule that moved the pod (the full
    thresholds, or the evidence beside it that allowed a move before them, or for a pod its
    StatefulSet already replaced the kubelet's own Event), the failure as judged on what was
    read, and everything read, when. Never the report's claims."""
    if given.removed:
        rule = "kubelet-event"
    elif given.early is not None and given.early.evidence is not None:
        rule = str(given.early.evidence)
    else:
        rule = "thresholds"
    return {
        "rule": rule,
        "why": failure.why,
        **({"early": given.early.why} if given.early is not None else {}),
        "judgedAt": format_time(given.now),
        "read": [{"what": r.what, "at": format_time(r.at)} for r in given.reads],
    }


# -- judgements on what was read ----------------------------------------------------------------


class Evidence(StrEnum):
    """What beside the pod moves it before its thresholds (shared/workloads/fastpath.py)."""

    SUSPECT_NODE = "suspect-node"
    OTHER_WORKLOADS = "other-workloads"
    READY_ELSEWHERE = "ready-elsewhere"


@dataclass(frozen=True)
class Early:
    """Whether an early report is acted on, on what evidence, and why."""

    acted_on: bool
    why: str
    evidence: Evidence | None = None

    @property
    def counts_against_node(self) -> bool:
        """A corroborated move is evidence against its node; a suspect node's is not (it
        would keep the node suspect on any one-off crash)."""
        return self.acted_on and self.evidence in (
            Evidence.OTHER_WORKLOADS,
            Evidence.READY_ELSEWHERE,
        )

    def rules(self, cfg: Config) -> Config:
        """The classifier's thresholds this evidence allows."""
        if self.evidence is Evidence.SUSPECT_NODE:
            return early_config(cfg)
        return corroborated_config(cfg)


@dataclass(frozen=True)
class ListNodePods:
    """LIST the pods bound to ``node`` (every namespace, by field selector), then corroborate
    again with them."""

    node: str
    why: str


@dataclass(frozen=True)
class ListTwins:
    """LIST the pods of the failing pod's ReplicaSet, then corroborate again with them."""

    namespace: str
    selector: str
    why: str


def early_on_node(failing: FailingPod, cfg: Config, node: Mapping[str, Any] | None) -> Early | None:
    """The first step for an early report: the Node as read (None: gone). An answer when the
    Node decides it (suspect, or nothing else may); None: look beside the pod next."""
    name = failing.failure.node
    if not name or not (cfg.suspect_fast_path or cfg.corroborated_fast_path):
        return Early(False, "early report: the fast path is off")
    if node is None:
        return Early(False, f"early report: node {name} is gone")
    if cfg.suspect_fast_path and is_suspect(node):
        return Early(True, f"node {name} is suspect: moved at first failure", Evidence.SUSPECT_NODE)
    if not cfg.corroborated_fast_path:
        return Early(False, f"early report: node {name} is not suspect, waiting for the thresholds")
    return None


def corroborate(
    failing: FailingPod,
    live: Pod,
    cfg: Config,
    now: datetime,
    *,
    node: Mapping[str, Any] | None = None,
    on_node: Sequence[Mapping[str, Any]] | None = None,
    twins: Sequence[Mapping[str, Any]] | None = None,
) -> Early | ListNodePods | ListTwins:
    """Whether an early report on a node that is not suspect is acted on: the pod as it is now
    must fail by the corroborated thresholds on that node, and another workload must have
    failed there within the window (``node``'s record, already read), or fail there now, or a
    pod of its ReplicaSet be Ready elsewhere. Asks for the LISTs it needs, the cheaper
    evidence first (the node's pods are few; a ReplicaSet's may be many)."""
    name = failing.failure.node or ""
    found = corroborated_failure(live, cfg, now)
    if found is None or found.node != name:
        return Early(
            False,
            f"early report: node {name} is not suspect and the pod has not restarted "
            f"{cfg.corroborated_restart_threshold} time(s) in a row (or failed for "
            f"{format_duration(cfg.corroborated_waiting_after)}) there: waiting for the "
            "thresholds",
        )
    recorded = recorded_on_node(live, node, cfg, now)
    if recorded:
        shown = ", ".join(recorded[:3]) + (
            f" and {len(recorded) - 3} more" if len(recorded) > 3 else ""
        )
        return Early(
            True,
            f"corroborated: {len(recorded)} other workload(s) failed on node {name} within "
            f"{format_duration(cfg.suspect_window)} ({shown}; its health record)",
            Evidence.OTHER_WORKLOADS,
        )
    if on_node is None:
        return ListNodePods(name, f"{found.why}: is another workload failing there?")
    others = other_workloads_failing(live, on_node, cfg, now)
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        return Early(
            True,
            f"corroborated: {len(others)} other workload(s) fail on node {name} now ({shown})",
            Evidence.OTHER_WORKLOADS,
        )
    owner = controller_of(live)
    selector = sibling_selector(live) if owner and owner.get("kind") == "ReplicaSet" else None
    if selector is None:
        return Early(
            False,
            f"early report: no other workload fails on node {name} now: waiting for the thresholds",
        )
    if twins is None:
        namespace = str((live.get("metadata") or {}).get("namespace") or failing.namespace)
        return ListTwins(namespace, selector, "does its ReplicaSet run elsewhere?")
    ready = ready_elsewhere(live, twins, cfg, now)
    elsewhere = failing_siblings(live, twins, cfg, now, reset_after=cfg.reset_after)
    if ready and not elsewhere:
        shown = ", ".join(ready[:3]) + (f" and {len(ready) - 3} more" if len(ready) > 3 else "")
        return Early(
            True,
            f"corroborated: {len(ready)} pod(s) of its ReplicaSet are Ready elsewhere ({shown})",
            Evidence.READY_ELSEWHERE,
        )
    why = (
        f"its ReplicaSet fails on {', '.join(nodes_of(elsewhere))} too"
        if elsewhere
        else "no pod of its ReplicaSet is Ready elsewhere"
    )
    return Early(
        False,
        f"early report: no other workload fails on node {name} now and {why}: waiting for "
        "the thresholds",
    )


def current_failure(
    live: Pod,
    failing: FailingPod,
    holder: Holder,
    cfg: Config,
    now: datetime,
    early: Early | None = None,
    evidence: PodEvidence | None = None,
) -> tuple[Failure | None, str] | ReadEvidence:
    """The report may be old, or forged: judge the pod as it is now, by the full rules, on
    what this delivery read. The report's own verdict stands only for a pod whose move we
    recorded already (its removal must finish). None, and why, when it is not failing now;
    ``ReadEvidence`` when the verdict needs what is read beside the pod first."""
    now_failing = classify(live, cfg, now) or unschedulable_due_to_exclusions(live, cfg)
    if now_failing is None and _may_be_stuck(live, failing.failure, cfg):
        if evidence is None:
            return ReadEvidence(
                f"{failing.failure.reason} rests on the kubelet's Events and the pod's "
                "siblings: read them, then judge again"
            )
        if evidence.unread:
            return None, (
                f"pod {failing.namespace}/{failing.name}: {failing.failure.reason} in the "
                f"report, but {evidence.unread}: not judged, nothing done"
            )
        found = failing_now(live, cfg, now, evidence)
        if found is not None and found.node == failing.failure.node:
            now_failing = found
    if now_failing is None and early is not None and early.acted_on:
        found = fast_failure(live, early.rules(cfg), cfg, now)
        if found is not None and found.node == failing.failure.node:
            now_failing = replace(found, why=f"{found.why}; {early.why}")
    if now_failing is not None:
        return now_failing, ""
    if failing.uid in handled_uids(holder.annotations.get(STATE_ANNOTATION)):
        # Our own record says we moved it: its removal must finish, on the node it is bound
        # to as read (not the one the report names).
        bound = (live.get("spec") or {}).get("nodeName")
        return replace(failing.failure, node=bound or failing.failure.node), ""
    return None, (
        f"pod {failing.namespace}/{failing.name} is no longer failing by the full rules "
        f"({failing.failure.reason} in the report): nothing to do"
    )


def _may_be_stuck(live: Pod, reported: Failure, cfg: Config) -> bool:
    """Whether the pod is in the stage where the sweep's own verdicts (stuck starting on its
    node, a sandbox its node fails to create) can hold: bound to the reported node, Pending,
    not started. Only then is the evidence beside it worth reading; the verdict itself is
    judged again from that evidence with the full thresholds, never taken from the report."""
    if reported.reason not in SWEEP_VERDICTS or not reported.node:
        return False
    return still_starting(live, reported.node, cfg)


def claims_removed_by_statefulset(failing: FailingPod, cfg: Config) -> bool:
    """Whether the report says a StatefulSet's pod failed terminally on a node (a reason
    the kubelet writes when it fails a pod: Evicted, OutOf*, ...), so that its controller may
    have removed it before this delivery."""
    failure = failing.failure
    owner = next((o for o in failing.owner_references if o.get("controller")), None)
    return (
        failure.kind is FailureKind.NODE_FIXABLE
        and bool(failure.node)
        and failure.reason in cfg.failed_pod_reasons
        and owner is not None
        and owner.get("kind") == OwnerKind.STATEFUL_SET.value
    )


def removed_confirmed(
    failing: FailingPod, said: Sequence[PodEvent], namesake: Pod | None = None
) -> tuple[bool, str]:
    """Whether the kubelet itself said what the report claims of a pod that is gone: a Warning
    Event about that pod (its uid) of the reported reason, from the reported node. The kubelet
    records one for each of its rejections (``rejectPod``: OutOfcpu, NodeAffinity,
    UnexpectedAdmissionError, ...) and evictions (``Evicted``); a failure it records none for
    (a graceful node shutdown's ``Terminated``) is not recorded from a report alone."""
    failure = failing.failure
    who = f"pod {failing.namespace}/{failing.name} (uid {failing.uid})"
    found = kubelet_recorded(
        tuple(said),
        failure.reason,
        failure.node or "",
        namespace=failing.namespace,
        name=failing.name,
    )
    if found is None:
        return False, (
            f"{who} is gone and no Event of the kubelet of node {failure.node} says it failed "
            f"with {failure.reason}: the report alone records nothing"
        )
    owner = next((o for o in failing.owner_references if o.get("controller")), None) or {}
    if namesake is not None and (controller_of(namesake) or {}).get("uid") != owner.get("uid"):
        return False, f"{who}: the pod of that name now belongs to another controller"
    # The kubelet's own message decides what the eviction was for: the pod's own storage
    # limits follow it to every node (classify's rule, on the message the Event kept).
    view = failing.as_failed_pod()
    view["status"] = {**view.get("status", {}), "reason": failure.reason, "message": found.message}
    own = evicted_for_its_own_limits(view)
    if own is not None:
        return False, f"{who} was evicted for its own limits ({own}): no node is why"
    return True, (
        f"{who} failed with {failure.reason} on node {failure.node}, as its kubelet recorded "
        f"({found.message.strip()[:200]}), and its StatefulSet already replaced it"
    )


def judge_siblings(
    live: Pod,
    candidates: Sequence[Mapping[str, Any]],
    cfg: Config,
    now: datetime,
    asked: ListSiblings,
    *,
    attempt: int = 1,
) -> Siblings:
    """The listed pods of the workload judged: the nodes where others are failing now for a
    reason another node could fix (``shared.workloads.siblings``), and the witnesses of a
    failure the same everywhere (``shared.workloads.everywhere``)."""
    meta = live.get("metadata", {})
    found = failing_siblings(live, candidates, cfg, now, reset_after=asked.reset_after)
    others = witnesses_of(live, candidates, cfg, now, replicas=asked.replicas)
    note = None
    if found:
        said = ", ".join(f"{s.name} on {s.node} ({s.reason})" for s in found[:10])
        more = f" and {len(found) - 10} more" if len(found) > 10 else ""
        note = (
            f"pod {meta.get('namespace', '')}/{meta.get('name', '')}: other pods of its "
            f"workload failing now: {said}{more}"
        )
    return Siblings(nodes_of(found), tuple(candidates), others, attempt, note)


def line_goes_on(live: Pod, pods: Sequence[Mapping[str, Any]]) -> tuple[bool, str]:
    """Whether a live pod already carries this bare pod's move (its uid in the state it
    inherited): the replacement exists, or a descendant of it does."""
    meta = live.get("metadata", {})
    ns, uid = meta.get("namespace", ""), meta.get("uid", "")
    for pod in pods:
        pmeta = pod.get("metadata") or {}
        if pmeta.get("uid") == uid or pmeta.get("deletionTimestamp"):
            continue
        if uid in handled_uids((pmeta.get("annotations") or {}).get(STATE_ANNOTATION)):
            return True, f"pod {ns}/{pmeta.get('name')} already carries the move of {uid}"
    return False, ""


def evicts(live: Pod, cfg: Config) -> bool:
    """Whether the pod is removed with the Eviction API rather than a DELETE: with
    ``use_eviction``, and always for a Job's pod, whose eviction sets the
    ``DisruptionTarget`` condition a pod failure policy can ignore
    (``shared.workloads.jobs``; a DELETE sets none, and the Job counts the pod against its
    backoffLimit)."""
    owner = controller_of(live)
    return cfg.use_eviction or (owner is not None and owner.get("kind") == JOB)


def replacement_for(live: Pod, decided: Plan) -> dict[str, Any]:
    """A bare pod's replacement, carrying the state this plan writes (or the one it has)."""
    meta = live.get("metadata", {})
    snapshot = {"metadata": dict(meta), "spec": live.get("spec", {})}
    state_json = (meta.get("annotations") or {}).get(STATE_ANNOTATION)
    state = decided.new_state
    if state is not None:
        state_json = dump_state(state)
    else:
        try:
            state = load_state_lenient(state_json).state
        except StateError:
            state = None  # carried as it is; no exclusions for the policies to read
    flat = None if state is None else avoidnodes.render(state, per_pod=False, holder_uid="")
    return bodies.replacement_pod(snapshot, state_json or "", flat)


def handled_uids(raw: str | None) -> tuple[str, ...]:
    try:
        return load_state(raw).handled
    except StateError:
        return ()


# -- the plan -----------------------------------------------------------------------------------


def plan_move(given: Inputs) -> MovePlan | Lookup:
    """The whole plan of this delivery's move, or the read it needs first.

    The order of the requests is the rule (see the handler's docstring): dry runs, then the
    state write with the holder's resourceVersion, then the removal with the pod's uid, then
    the Events and the reply. A plan that writes nothing removes nothing a plan did not
    record earlier (an already handled pod's removal, finished by a redelivery).
    """
    failing, live, resolution, cfg = given.failing, given.live, given.resolution, given.cfg
    ns, name = failing.namespace, failing.name
    if resolution.holder is None:
        return _nothing(f"pod {ns}/{name} is left alone: {resolution.why}")
    retries = parse_retries(resolution.policy, cfg.max_retries)
    if retries is None:
        return _nothing(f"pod {ns}/{name}: no scheduling-retries policy on its owners")
    if isinstance(retries, InvalidPolicy):
        where = resolution.policy_ref or resolution.holder.ref
        return MovePlan(
            None,
            (
                RecordEvent(
                    where,
                    REASON_INVALID_POLICY,
                    retries.reason,
                    "said where the policy is written, for the person who wrote it",
                    warning=True,
                ),
                Answer(None, "a policy we cannot read moves nothing"),
            ),
            notes=(f"invalid scheduling-retries: {retries.reason}",),
        )
    failure = given.failure
    if failure is None:
        verdict = current_failure(
            live, failing, resolution.holder, cfg, given.now, given.early, given.evidence
        )
        if isinstance(verdict, ReadEvidence):
            return verdict
        failure, why_not = verdict
        if failure is None:
            return _nothing(why_not)
    # What the move says of the failure (its Event, the reply assess-nodes counts) is what was
    # judged here, never the report's words: a report may name another node or reason. A move
    # on a suspect node's evidence stays kind early, which assess-nodes does not count.
    early = given.early
    said_kind = (
        FailureKind.EARLY if early is not None and not early.counts_against_node else failure.kind
    )
    failing = replace(failing, failure=replace(failure, kind=said_kind))
    given = replace(given, failing=failing)
    holder = given.holder or resolution.holder
    bare = resolution.owner_kind == BARE and not given.removed
    owner_kind = OwnerKind(resolution.owner_kind)
    reset = parse_reset_after(holder.annotations.get(RESET_AFTER_ANNOTATION), cfg.reset_after)
    notes: list[str] = []
    if reset.fallback_reason and given.attempt == 1:
        # Not a reason to do nothing (the user opted in); said once, in the trace.
        notes.append(f"{holder.ref.describe()}: {reset.fallback_reason}")
    policy = Policy(
        retries=retries,
        owner_kind=owner_kind,
        replicas=holder.replicas if holder.replicas is not None else 1,
        reset_after=reset.duration,
    )
    try:
        state = load_state(holder.annotations.get(STATE_ANNOTATION))
    except StateError as exc:
        raise events.MustNotAct(
            f"{holder.ref.describe()} has a state annotation we cannot read ({exc}); "
            "refusing to act rather than overwrite it"
        ) from exc
    siblings = given.siblings
    # A bare pod is alone by definition; a workload's other pods are witnesses once listed.
    witnesses = ALONE if bare else (siblings.witnesses if siblings is not None else None)
    decided = plan(
        state,
        FailureFacts.from_pod(live, failure, owner_kind),
        policy,
        given.now,
        holder_uid=holder.ref.uid,
        handled_limit=cfg.handled_uids_max,
        statefulset=holder.statefulset,
        also_failing=siblings.also_failing if siblings is not None else (),
        witnesses=witnesses,
        implicated=given.implicated,
    )
    if (
        decided.action is Action.STOPPED
        and given.implicated is None
        and decided.new_state is not None
        and decided.new_state.stopped is not None
    ):
        # A stop says the application is broken: it must rest on nodes where other workloads
        # run fine. Read them and their pods (a few requests, only when a stop is planned),
        # then plan again.
        return ReadNodes(
            decided.new_state.stopped.nodes,
            "a stop rests only on nodes where other workloads run fine",
        )
    if (
        decided.action is Action.MOVE
        and siblings is None
        and policy.scope is BudgetScope.WORKLOAD
        and not bare
    ):
        # One LIST per move, asked for only now that a move is decided: an event that moves
        # nothing (a duplicate, an exhausted budget) costs none.
        meta = live.get("metadata", {})
        return ListSiblings(
            meta.get("namespace", ""),
            sibling_selector(live),
            policy.reset_after,
            holder.replicas if holder.ref.kind == OwnerKind.REPLICA_SET else None,
            "the nodes where other pods of the workload fail now are excluded with this one, "
            "and a workload failing the same everywhere is stopped instead",
        )
    if siblings is not None and siblings.note and siblings.attempt == given.attempt:
        notes.append(siblings.note)
    if decided.action in (Action.MOVE, Action.CLEAR_AND_MOVE):
        # Said on the workload's Event and in the reply: the failure as judged on what was
        # read, and why it did not wait for the thresholds (said last: the demo reads it).
        decided = replace(decided, message=f"{decided.message}; judged: {failure.why}")
        if given.early is not None:
            decided = replace(
                decided, message=f"{decided.message}; before the thresholds: {given.early.why}"
            )
    said = f"plan: {decided.action} ({decided.reason}): {decided.message}"
    if decided.new_state is None:
        notes.append(said)
        requests: list[Request] = []
        if decided.reason == "state-too-large":
            # Nobody else would ever hear of it: the pod stays failing where it is.
            requests.append(
                RecordEvent(
                    holder.ref,
                    REASON_STATE_TOO_LARGE,
                    decided.message,
                    "nobody else would ever hear of it",
                    warning=True,
                )
            )
        after = _after_record(given, decided, failure, None)
        if not isinstance(after, tuple):
            return after
        return MovePlan(decided, (*requests, *after), tuple(notes), failure)
    cost: jobs.MoveCost | None = None
    if decided.action in (Action.MOVE, Action.CLEAR_AND_MOVE):
        # A Job's pod: never the move that fails the Job (shared.workloads.jobs). Judged
        # again on every re-plan, with the re-read Job's counts and state.
        judged = _job_cost(given, decided, holder)
        if isinstance(judged, ListJobPods):
            return judged
        cost = judged
        if cost is not None and not cost.allowed:
            return _job_refused(given, failure, decided, holder, cost, notes)
        if cost is not None:
            decided = replace(decided, message=f"{decided.message}; {cost.message}")
    assert decided.new_state is not None
    requests = []
    meta = live.get("metadata", {})
    uid = str(meta.get("uid", ""))
    if decided.delete_pod and not given.checked:
        # Before anything is charged: a removal the API server would refuse spends nothing.
        # A plain delete is not checked: the cluster-wide right to delete pods is part of the
        # install, and its refusal (a deployment problem) is a 500 a person must see anyway.
        if bare:
            requests.append(
                DryRunCreate(
                    ns, replacement_for(live, decided), "a refused replacement spends nothing"
                )
            )
        if evicts(live, cfg):
            requests.append(
                DryRunEvict(
                    ns,
                    name,
                    uid,
                    "an eviction a PodDisruptionBudget refuses spends nothing",
                    say=not given.removed,
                )
            )
    requests.append(
        WriteState(
            holder.ref,
            holder.resource_version,
            bodies.state_patch(
                holder.resource_version,
                dump_state(decided.new_state),
                avoidnodes.render(
                    decided.new_state,
                    per_pod=holder.ref.kind == OwnerKind.STATEFUL_SET,
                    holder_uid=holder.ref.uid,
                ),
            ),
            "recorded before anything is removed, compare-and-swap on the version read",
        )
    )
    requests.append(Count(str(decided.action), "the decision, once recorded"))
    if decided.event_reason and not decided.delete_pod:
        # RetriesExhausted, MovesStopped: nothing to remove, so nothing to wait for. A
        # move's Event waits until the pod is really gone. Said once: the state records
        # it, and a redelivery or a concurrent delivery plans "already recorded".
        requests.append(
            RecordEvent(
                holder.ref,
                decided.event_reason,
                decided.message,
                "nothing to remove: said once recorded",
                warning=decided.action in (Action.EXHAUSTED, Action.STOPPED),
            )
        )
    after = _after_record(given, decided, failure, cost)
    if not isinstance(after, tuple):
        return after
    return MovePlan(decided, (*requests, *after), tuple(notes), failure, cost)


def replacement_name_of(failing: FailingPod) -> str:
    """The name a bare pod's replacement has (``bodies.replacement_name``), from the report."""
    snapshot = {"metadata": {**dict((failing.pod or {}).get("metadata") or {})}}
    snapshot["metadata"].update({"name": failing.name, "uid": failing.uid})
    return bodies.replacement_name(snapshot)


def said_late(failing: FailingPod, state: str | None, involved: Ref) -> MovePlan:
    """The pod is gone (or going). If its move is recorded (its uid in ``state``, the
    holder's, or for a bare pod its replacement's), an earlier delivery removed it and may have
    died before recording the ``Rescheduled`` Event: record it now, once (keyed by the uid).
    Otherwise someone else removed it, and there is nothing to do."""
    ns, name = failing.namespace, failing.name
    if failing.uid not in handled_uids(state):
        return _nothing(f"pod {ns}/{name} was not moved by us: nothing to do")
    failure = failing.failure
    message = (
        f"moved pod {name} off node {failure.node} after {failure.reason}; recorded and "
        "removed earlier by a delivery that ended before saying so"
    )
    return MovePlan(
        None,
        (
            RecordEvent(
                involved,
                REASON_RESCHEDULED,
                message,
                "an earlier delivery removed it and may have ended before saying so",
                key=failing.uid,
                repeat=False,
                noted=f"pod {ns}/{name}: its recorded move is now said",
            ),
            Answer(None, "said only: the reply was the earlier delivery's"),
        ),
    )


def _nothing(note: str) -> MovePlan:
    return MovePlan(None, (Answer(None, note),), (note,))


def _after_record(
    given: Inputs, decided: Plan, failure: Failure, cost: jobs.MoveCost | None
) -> tuple[Request, ...] | ListLine:
    """What follows the record: the reply when nothing is removed; else the removal (a bare
    pod's replacement first), and what is said once the pod is really gone."""
    failing, live, resolution = given.failing, given.live, given.resolution
    holder = resolution.holder
    assert holder is not None
    if not decided.delete_pod:
        return (
            Answer(
                reply_for(
                    failing,
                    decided.action,
                    decided,
                    resolution,
                    evidence=evidence_of(given, failure),
                ),
                "nothing to remove",
            ),
        )
    name, uid = failing.name, failing.uid
    if given.removed:
        return _recorded_removed(given, decided, holder.ref)
    meta = live.get("metadata", {})
    ns = meta.get("namespace", "")
    bare = resolution.owner_kind == BARE
    if bare and decided.action is Action.NOTHING:
        # A redelivery after a death between the replacement's create and this delete: when
        # the replacement has since been moved on in its turn, creating it again would make
        # one bare pod two.
        if given.line_goes_on is None:
            return ListLine(
                ns,
                label_selector(live),
                str(meta.get("uid", "")),
                "a bare pod's replacement, or its descendant, may carry the move already",
            )
        bare = not given.line_goes_on
    requests: list[Request] = []
    if failure.node and _marks_its_node(given, failure, decided):
        requests.append(
            MarkNode(
                failure.node,
                "the earliest signal of a broken node: other replacements keep off it now",
                unless_alone=None if _against_the_node(given) else live,
            )
        )
    if bare:
        requests.append(
            CreateReplacement(
                ns,
                replacement_for(live, decided),
                "a bare pod has no controller to recreate it: its replacement comes first",
            )
        )
    said = moved(decided, failure, name)
    # Someone removed it first: an earlier delivery of ours that died before saying so (the
    # Event is keyed by the uid, so it is said once), or a person.
    gone = (
        RecordEvent(
            holder.ref,
            said.event_reason,
            said.message,
            "removed before this delivery: said once",
            key=uid,
            repeat=False,
            gate=True,
        ),
        Answer(
            reply_for(
                failing,
                said.action,
                decided,
                resolution,
                message=said.message,
                evidence=evidence_of(given, failure),
            ),
            "the move, said by this delivery",
        ),
    )
    pod_uid = str(meta.get("uid", ""))
    why = "the move is recorded: only this incarnation of the pod is removed"
    if evicts(live, cfg=given.cfg):
        requests.append(Evict(ns, name, pod_uid, why, gone))
    else:
        requests.append(Delete(ns, name, pod_uid, why, gone))
    if failure.node and is_terminal_failure(live):
        requests.append(
            Redirect(
                live,
                failure.node,
                holder.ref,
                "its controller replaced the failed pod before the failure was recorded",
            )
        )
    # Keyed by the pod's uid: a redelivery that removes nothing more records nothing more. A
    # removal recorded by an earlier delivery (this plan writes nothing) is said and replied
    # only by the delivery that creates the Event: two deliveries racing on one pod both find
    # it in the state after the first write, and both evictions of a terminating pod succeed
    # (the Eviction API skips the PodDisruptionBudget check and deletes again once the pod has
    # a deletionTimestamp: canIgnorePDB in pkg/registry/core/pod/storage/eviction.go).
    recorded_now = bool(
        decided.action in (Action.MOVE, Action.CLEAR_AND_MOVE) and decided.event_reason
    )
    requests.append(
        RecordEvent(
            holder.ref,
            said.event_reason,
            said.message,
            "the pod is really gone",
            key=uid,
            repeat=False,
            gate=not recorded_now,
        )
    )
    if cost is not None and cost.verdict is jobs.Verdict.LAST_RETRY:
        requests.append(
            RecordEvent(
                holder.ref,
                REASON_JOB_RETRIES_SPENT,
                f"{cost.message}: one more failed pod, from any cause, fails the Job",
                "the Job has no retry left",
                warning=True,
                key=uid,
                repeat=False,
            )
        )
    requests.append(
        Answer(
            reply_for(
                failing,
                said.action,
                decided,
                resolution,
                message=said.message,
                evidence=evidence_of(given, failure),
            ),
            "the move",
        )
    )
    return tuple(requests)


def _marks_its_node(given: Inputs, failure: Failure, decided: Plan) -> bool:
    """Whether this move marks its node moved-off: only for a failure counted against the
    node, the ones assess-nodes counts. A pod moved off a node already suspect (the suspect
    fast path) says nothing new about it; one that never reached a node has none."""
    if not given.cfg.moved_off_mark or not failure.node:
        return False
    if given.early is not None and not given.early.counts_against_node:
        return False
    # Siblings not listed: nothing proves the workload runs elsewhere.
    pods = (given.siblings.pods if given.siblings is not None else None) or ()
    state = decided.new_state
    failed_before = tuple(state.failed_on) if state is not None else ()
    if follows_its_workload(given.live, pods, given.cfg, given.now, failed_before=failed_before):
        # Its workload fails on other nodes too and runs nowhere else (an application
        # broken everywhere): assess-nodes will not count it against the node either.
        return False
    return failure.kind is FailureKind.NODE_FIXABLE


def _against_the_node(given: Inputs) -> bool:
    """Whether what this plan read already speaks against the node beyond this one workload:
    an early move corroborated by other workloads (or by twins Ready elsewhere), or a pod of
    its workload proven healthy on another node."""
    if given.early is not None and given.early.counts_against_node:
        return True
    pods = (given.siblings.pods if given.siblings is not None else None) or ()
    return proven_elsewhere(given.live, pods, given.cfg, given.now)


def _recorded_removed(given: Inputs, decided: Plan, holder: Ref) -> tuple[Request, ...]:
    """A failed StatefulSet pod its controller removed: nothing to remove, its namesake to
    redirect if it was admitted without the exclusion, and the move to say."""
    failing = given.failing
    requests: list[Request] = [
        Redirect(
            given.live,
            failing.failure.node or "",
            holder,
            "its StatefulSet recreated the failed pod before the failure was recorded",
            namesake=given.namesake,
        )
    ]
    if decided.action not in (Action.MOVE, Action.CLEAR_AND_MOVE):
        # A redelivery: the move was recorded (and said) by the delivery that planned it;
        # nothing was removed now, so there is nothing new to say.
        return (*requests, Answer(None, "recorded and said earlier"))
    said = moved(decided, failing.failure, failing.name)
    message = f"{said.message} (its StatefulSet had already deleted the failed pod)"
    return (
        *requests,
        RecordEvent(holder, said.event_reason, message, "the move", key=failing.uid, repeat=False),
        Answer(
            reply_for(
                failing,
                said.action,
                decided,
                given.resolution,
                message=message,
                evidence=evidence_of(given, failing.failure),
            ),
            "the move",
        ),
    )


def _job_cost(given: Inputs, decided: Plan, holder: Holder) -> jobs.MoveCost | ListJobPods | None:
    """What removing the pod costs its Job (``shared.workloads.jobs``), for a Job's pod
    about to be removed by a move planned now; None otherwise.

    A move the Job ignores (an eviction its pod failure policy ignores) costs one judgement
    and no read. One the Job counts needs the failures not yet in ``status.failed``: the
    Job's pods, from this attempt's LIST of the workload, or else one LIST by the
    controller-uid label (without the count, no counted move).
    """
    facts = holder.job
    if facts is None or decided.new_state is None or not decided.delete_pod:
        return None
    if not facts.builtin:
        return None  # another controller decides what a removed pod costs
    live = given.live
    evicting = evicts(live, given.cfg)
    if jobs.judge_removal(facts, live, evicting=evicting).outcome is jobs.Outcome.IGNORED:
        return jobs.move_cost(facts, live, evicting=evicting, pending=frozenset())
    listed = given.job_pods
    if listed is None:
        return ListJobPods(
            holder.ref.namespace,
            f"{JOB_CONTROLLER_UID_LABEL}={holder.ref.uid}",
            "the Job's failures not yet in its status count against its limits",
        )
    # Only the Job's own pods, whatever labels another pod may share with them.
    pods: list[Pod] = [
        p  # type: ignore[misc]
        for p in listed
        if (controller_of(p) or {}).get("uid") == holder.ref.uid  # type: ignore[arg-type]
    ]
    pending = jobs.pending_failures(facts, pods, decided.new_state.handled)
    return jobs.move_cost(facts, live, evicting=evicting, pending=pending)


def _job_refused(
    given: Inputs,
    failure: Failure,
    decided: Plan,
    holder: Holder,
    cost: jobs.MoveCost,
    notes: list[str],
) -> MovePlan:
    """The move would fail the pod's Job: nothing is written or removed, and a Warning on
    the Job (one per pod, counted when the sweep sends the pod again) says why."""
    meta = given.live.get("metadata", {})
    where = f"on node {failure.node}" if failure.node else "Pending, unscheduled"
    message = f"pod {meta.get('name', '')} stays {where} ({failure.reason}): {cost.message}"
    refused = Plan(
        Action.NOTHING,
        None,
        str(cost.verdict),
        None,
        message,
        moves=decided.moves - (1 if decided.action is Action.MOVE else 0),
        budget=decided.budget,
    )
    return MovePlan(
        refused,
        (
            Count(str(cost.verdict), "a move refused for its Job"),
            RecordEvent(
                holder.ref,
                REASON_MOVE_WOULD_FAIL_JOB,
                message,
                "the pod stays: say why, on the Job",
                warning=True,
                key=str(meta.get("uid", "")),
            ),
            Answer(
                reply_for(given.failing, refused.action, refused, given.resolution),
                "nothing moved",
            ),
        ),
        (*notes, f"plan: {refused.action} ({refused.reason}): {message}"),
        failure,
        cost,
    )
