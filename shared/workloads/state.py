"""The rescheduler's memory: how often a workload's pods were moved and which nodes to avoid.

Functions are stateless, so this lives in the annotation `kn-rescheduler.io/state` on the pod's
controller (ReplicaSet, StatefulSet, Job) or on a bare pod, as versioned JSON. update-annotations
reads it, asks `plan` what to do, and writes the new state back with the resourceVersion it
read (optimistic concurrency), so concurrent instances cannot lose an update.

Events arrive at least once and in any order, so `plan` must be idempotent: the uid of every pod
we decided to move is remembered (`handled`), and a second event about the same pod changes
nothing. The state is written before the pod is deleted; if the delete is lost, the redelivered
event finds the uid handled and `Plan.delete_pod` tells the handler to finish the job.

A state we cannot read is an error, never an empty state: resetting would hand a crash-looping
workload a fresh budget on every corruption. That includes a node name Kubernetes would refuse
(a hand edit, or a tenant's own bare-pod state): it would become a `metadata.name NotIn`
requirement that makes every new pod invalid at creation, which the webhook's `failurePolicy:
Ignore` does not cover. The webhook reads states with `load_state_lenient`, which skips such
names and keeps the rest, and `shared.admission.decide` checks every name again before it patches.

The record itself (its versions, fields and how strictly it is read) is `shared.api.state`;
this module decides with it.

What a move records. A move charges one move and excludes the node the pod failed on. For a
budget kept for the whole workload (a ReplicaSet, a Job) it also excludes, free of charge, the
nodes where other pods of the same controller are failing now for a reason another node could
fix (`also_failing`, listed by update-annotations). Without them a replacement admitted before
the second faulty node is recorded is drawn to it (a preferred affinity, or an emptied node
scoring best) and fails again: one move wasted per race. A StatefulSet's exclusions are its
pods' own (web-0 failing somewhere says nothing about where web-1 may run: its own volume, its
own identity), so nothing is added there; a bare pod has no siblings.

What a move remembers of its failure. A move of a workload-wide budget also records, in
`failedOn`, the reason that moved the pod off its node (it ages out like the exclusions, each
scope keeps its `MAX_EXCLUDED_NODES` most recent; clearing exclusions that made a pod
unschedulable keeps it, since where the workload failed is still true; a reset drops it; a
sibling's node, excluded free of charge, records nothing). That is the evidence
`shared.workloads.everywhere` weighs to stop moving a workload that fails the same way on
every node; when it stops, `stopped` records it (so its Warning is said once), and the next
move clears it.

Whose state. Annotations get copied: `kubectl rollout undo` copies a ReplicaSet's annotations
onto its Deployment, and the Deployment controller copies a Deployment's annotations onto the
ReplicaSets it creates; a manifest exported with `kubectl get -o yaml` and applied as a new
object carries them too. A copy says nothing about the object it landed on: taken for that
object's own, it would hand the next rollout another ReplicaSet's exclusions and count. So every
state `plan` writes records the uid of its holder (`holderUid`, optional within version 2), and a
state recorded for another uid is a foreign copy: `plan` starts from an empty state instead (and
says so), and the webhook injects no exclusions from it. That is never a fresh budget for the
rightful holder: its own writes always carry its own uid. A state without `holderUid` (written
before the field) is taken as the holder's own. A bare pod's state is the exception: it is
carried on purpose to the pod's replacement, which has a new uid, so a pod's state is always
its own. (What keeps the Deployment controller from overwriting a ReplicaSet's own state with
a copy is in `shared.pods.update_annotations.rollouts`.)

Size. The API server refuses an object whose annotations add up to more than 256 KiB, and a
state that grew past it would make every later write fail for ever. So every state `plan`
writes is pruned first:

- per-pod entries of pods the StatefulSet no longer has (name not `<set>-<ordinal>` with the
  ordinal in `[spec.ordinals.start, start + replicas)`, e.g. after a scale-down), except the
  failing pod's own entry;
- per-pod entries not updated for longer than reset-after, and the workload's excluded nodes
  when the state was not updated for longer than reset-after: after that long the nodes say
  nothing about today's cluster. An entry that recorded an exhausted budget keeps its count
  (only its excluded nodes go): its pod may still be failing in place, and nothing refreshes
  the entry while it does, so dropping it would hand that pod a fresh budget;
- each scope keeps its `MAX_EXCLUDED_NODES` most recent excluded nodes.

An entry touched within reset-after is never pruned, so no pod failing within reset-after of
its last move gets a fresh budget. If the state is still larger than `MAX_STATE_BYTES` (64 KiB,
a quarter of the limit, leaving room for everyone else's annotations), the last resort is
deterministic: first the excluded nodes of the least recently updated per-pod entries go
(ties by pod name; never the failing pod's): a pod that forgets where it failed may land
there again and cost one more move, still within its budget. Move counts are never dropped to
make room: if the counts alone do not fit, `plan` records no new move and leaves the pod where
it is, saying so (`state-too-large`), rather than let a workload exceed its budget. Only
clearing exclusions that made a pod unschedulable is written anyway: we caused that problem,
and clearing only shrinks the state.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Final

from shared.api.keys import (
    REASON_EXCLUSIONS_CLEARED,
    REASON_MOVES_STOPPED,
    REASON_RESCHEDULED,
    REASON_RETRIES_EXHAUSTED,
)
from shared.api.kubetypes import Pod
from shared.api.state import (
    MAX_REASON_LENGTH,
    MAX_STATE_BYTES,
    PodEntry,
    Stopped,
    WorkloadState,
    dump_state,
    entry_bytes,
    is_valid_node_name,
    quoted_names,
)
from shared.api.times import format_duration
from shared.workloads.classify import Failure, FailureKind, excluded_nodes_of, same_failure
from shared.workloads.everywhere import Witnesses, judge
from shared.workloads.policy import (
    BudgetScope,
    OwnerKind,
    Policy,
)

DEFAULT_HANDLED_LIMIT: Final = 64
# Excluded nodes kept per scope (the workload, or one StatefulSet pod), most recent last. Each is
# a required NotIn on every new pod of the scope; a pod that failed on 32 different nodes has a
# problem no other node fixes, and 32 names of at most 253 bytes keep a scope under 8.5 KiB.
MAX_EXCLUDED_NODES: Final = 32
# How the StatefulSet controller reads a pod's ordinal (statefulPodRegex in its utils).
_STATEFUL_POD: Final = re.compile(r"(.*)-([0-9]+)")
_MAX_INT32: Final = 2**31 - 1
_LONG_AGO: Final = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class StatefulSetRange:
    """The pods a StatefulSet wants now: `<name>-<ordinal>` for ordinals in
    `[start, start + replicas)` (`start` is `spec.ordinals.start`, 0 when unset)."""

    name: str
    replicas: int
    start: int = 0

    def ordinal_of(self, pod_name: str) -> int | None:
        """The pod's ordinal if the name is one of this set's pod names, else None."""
        match = _STATEFUL_POD.fullmatch(pod_name)
        if match is None or match.group(1) != self.name:
            return None
        # The controller parses the ordinal as a 32-bit int; a bigger one is no ordinal at all.
        digits = match.group(2)
        if len(digits) > 10 or int(digits) > _MAX_INT32:
            return None
        return int(digits)

    def wants(self, pod_name: str) -> bool:
        ordinal = self.ordinal_of(pod_name)
        return ordinal is not None and self.start <= ordinal < self.start + self.replicas


def foreign_copy(state: WorkloadState, owner_kind: OwnerKind | str, holder_uid: str) -> str | None:
    """Why `state`, read from the object with `holder_uid`, is a copy written for another
    object (see "Whose state" in the module docstring); None when it is the holder's own.

    Own when either uid is unknown, and always for a bare pod (its state travels to its
    replacement on purpose).
    """
    if owner_kind == OwnerKind.POD or not state.holder_uid or not holder_uid:
        return None
    if state.holder_uid == holder_uid:
        return None
    return (
        f"it is a copy of the state of another object (uid {state.holder_uid[:64]}; this "
        f"one is {holder_uid})"
    )


def exclusions_for(
    state: WorkloadState, owner_kind: OwnerKind | str, pod_name: str | None
) -> tuple[str, ...]:
    """The nodes a new pod of this workload must avoid (what the webhook stamps on it).

    For a StatefulSet the pod's name is known at admission (the controller sets it) and only
    that pod's exclusions apply; the pods of other workloads share one list.
    """
    if owner_kind == OwnerKind.STATEFUL_SET:
        if not pod_name:
            return ()
        return state.entry(pod_name).excluded_nodes
    return state.excluded_nodes


# Pruning (see the module docstring for the rules and why).


@dataclass(frozen=True)
class Pruned:
    state: WorkloadState
    # What was dropped, in words, for the plan's message and logs; empty when nothing was.
    notes: tuple[str, ...] = ()


def prune(
    state: WorkloadState,
    now: datetime,
    reset_after: timedelta,
    *,
    keep_pod: str | None = None,
    statefulset: StatefulSetRange | None = None,
) -> Pruned:
    """Drop what no longer says anything: entries of pods the StatefulSet no longer has
    (`statefulset` given), entries and exclusions older than `reset_after`, and exclusions past
    `MAX_EXCLUDED_NODES` per scope. `keep_pod`'s entry is never dropped for its name."""
    notes: list[str] = []
    entries: dict[str, PodEntry] = {}
    gone: list[str] = []
    aged = forgotten = trimmed = 0
    for name, stored in state.per_pod.items():
        if statefulset is not None and name != keep_pod and not statefulset.wants(name):
            gone.append(name)
            continue
        nodes = stored.excluded_nodes
        if stored.updated_at is not None and now - stored.updated_at > reset_after:
            if not stored.exhausted_recorded:
                aged += 1
                continue
            if nodes:
                forgotten += 1
                nodes = ()
        if len(nodes) > MAX_EXCLUDED_NODES:
            trimmed += 1
            nodes = nodes[-MAX_EXCLUDED_NODES:]
        entries[name] = (
            stored if nodes == stored.excluded_nodes else replace(stored, excluded_nodes=nodes)
        )
    if gone:
        notes.append(
            f"dropped {len(gone)} entr{'y' if len(gone) == 1 else 'ies'} of pods "
            f"{statefulset.name if statefulset else ''} no longer has "
            f"({quoted_names(gone, width=253)})"
        )
    if aged:
        notes.append(
            f"dropped {aged} pod entr{'y' if aged == 1 else 'ies'} not updated for more than "
            f"{format_duration(reset_after)}"
        )
    if forgotten:
        notes.append(
            f"forgot the excluded nodes of {forgotten} exhausted pod entr"
            f"{'y' if forgotten == 1 else 'ies'} not updated for more than "
            f"{format_duration(reset_after)} (their counts stay)"
        )
    if trimmed:
        notes.append(
            f"kept the {MAX_EXCLUDED_NODES} most recent excluded nodes of {trimmed} pod entr"
            f"{'y' if trimmed == 1 else 'ies'}"
        )
    excluded = state.excluded_nodes
    if excluded and state.updated_at is not None and now - state.updated_at > reset_after:
        notes.append(
            f"dropped {len(excluded)} excluded node(s) recorded more than "
            f"{format_duration(reset_after)} ago"
        )
        excluded = ()
    if len(excluded) > MAX_EXCLUDED_NODES:
        notes.append(f"kept the {MAX_EXCLUDED_NODES} most recent of {len(excluded)} excluded nodes")
        excluded = excluded[-MAX_EXCLUDED_NODES:]
    # Failure reasons age out like the exclusions, but clearing exclusions that made a pod
    # unschedulable keeps them: where the workload failed is still true.
    failed_on = dict(state.failed_on)
    if failed_on and state.updated_at is not None and now - state.updated_at > reset_after:
        notes.append(f"dropped the failures recorded more than {format_duration(reset_after)} ago")
        failed_on = {}
    pruned = replace(state, excluded_nodes=excluded, per_pod=entries, failed_on=failed_on)
    if pruned == state:
        return Pruned(state)
    return Pruned(pruned, tuple(notes))


def _fit(state: WorkloadState, keep_pod: str | None) -> tuple[WorkloadState, str | None, bool]:
    """The last resort of the size cap: drop the excluded nodes of the least recently updated
    per-pod entries (never `keep_pod`'s, never a count) until the state fits in
    `MAX_STATE_BYTES`. Returns the state, a note about what went, and whether it fits."""
    size = len(dump_state(state).encode())
    if size <= MAX_STATE_BYTES:
        return state, None, True
    candidates = sorted(
        (entry.updated_at or _LONG_AGO, name)
        for name, entry in state.per_pod.items()
        if name != keep_pod and entry.excluded_nodes
    )
    entries = dict(state.per_pod)
    cleared = 0
    for _, name in candidates:
        if size <= MAX_STATE_BYTES:
            break
        entry = entries[name]
        lighter = replace(entry, excluded_nodes=())
        size -= entry_bytes(entry) - entry_bytes(lighter)
        entries[name] = lighter
        cleared += 1
    fitted = replace(state, per_pod=entries)
    note = (
        f"forgot the excluded nodes of the {cleared} least recently updated pod entr"
        f"{'y' if cleared == 1 else 'ies'} to stay under {MAX_STATE_BYTES // 1024} KiB"
        if cleared
        else None
    )
    return fitted, note, len(dump_state(fitted).encode()) <= MAX_STATE_BYTES


@dataclass(frozen=True)
class FailureFacts:
    """What `plan` needs to know about the failing pod, taken from the pod and its failure."""

    pod_name: str
    pod_uid: str
    owner_kind: OwnerKind
    # The node to exclude; None when the pod never reached one (unschedulable).
    node: str | None
    reason: str
    # How long the failing container ran in its last run before this failure
    # (`Failure.ran_for_seconds`): zero when it never started, None when unknown. Not the pod's
    # age, which counts time spent crash-looping or Pending as time run.
    ran_for: timedelta | None = None
    unschedulable: bool = False
    # The nodes the webhook kept this pod off when it was admitted (its excluded-nodes stamp):
    # a replacement's, after earlier moves. What says the workload failed again elsewhere.
    kept_off: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "owner_kind", OwnerKind(self.owner_kind))

    @classmethod
    def from_pod(cls, pod: Pod, failure: Failure, owner_kind: OwnerKind | str) -> FailureFacts:
        meta = pod.get("metadata", {})
        seconds = failure.ran_for_seconds
        return cls(
            pod_name=meta.get("name", ""),
            pod_uid=meta.get("uid", ""),
            owner_kind=OwnerKind(owner_kind),
            node=failure.node,
            reason=failure.reason,
            ran_for=None if seconds is None else timedelta(seconds=seconds),
            unschedulable=failure.kind is FailureKind.EXCLUSIONS_UNSCHEDULABLE,
            kept_off=excluded_nodes_of(pod),
        )


class Action(StrEnum):
    # Record the move (count + 1, exclude the node) and delete the pod.
    MOVE = "move"
    # Clear the exclusions that made the pod unschedulable and delete it; count unchanged.
    CLEAR_AND_MOVE = "clear-and-move"
    # The budget is spent: record that once, leave the pod where it is.
    EXHAUSTED = "exhausted"
    # The workload fails the same way everywhere (shared.workloads.everywhere): record the
    # stop once, charge nothing, leave the pod where it is.
    STOPPED = "stopped"
    NOTHING = "nothing"


@dataclass(frozen=True)
class Plan:
    action: Action
    # The state to write, or None when it must stay as it is.
    new_state: WorkloadState | None
    # A short, stable, machine-readable cause (for logs and metrics), e.g. "already-handled".
    reason: str
    # Reason of the Kubernetes Event to record, or None to record none.
    event_reason: str | None
    # The human sentence for that Event and the logs.
    message: str
    # Whether the handler must delete (or evict, or recreate) the pod. True for MOVE and
    # CLEAR_AND_MOVE, and for a duplicate of a pod we already decided to move: the state was
    # written first, so a lost delete is finished by the redelivery. Delete with a uid
    # precondition, and treat "not found" as done.
    delete_pod: bool = False
    moves: int = 0
    budget: int = 0
    # The exclusions the workload's next pod (or this pod name) will get.
    excluded_nodes: tuple[str, ...] = ()
    exclusions_cleared: bool = False
    # What pruning dropped from the state to write (see the module docstring), in words.
    pruned: tuple[str, ...] = ()
    # Why the stored state was not the holder's own and was ignored (`foreign_copy`), if so.
    ignored_copy: str | None = None
    # Nodes this move excluded besides the failing pod's own, because other pods of the
    # workload are failing there now (`also_failing`); no move is counted for them. Only the
    # ones not excluded before.
    also_excluded: tuple[str, ...] = ()
    # Why the moves-stop rule (``shared.workloads.everywhere.judge``) let this move go on, for
    # the logs; "" when it was not asked.
    goes_on: str = ""


def plan(
    state: WorkloadState,
    failure: FailureFacts,
    policy: Policy,
    now: datetime,
    *,
    holder_uid: str = "",
    handled_limit: int = DEFAULT_HANDLED_LIMIT,
    statefulset: StatefulSetRange | None = None,
    also_failing: Iterable[str] = (),
    witnesses: Witnesses | None = None,
    implicated: Mapping[str, str] | None = None,
) -> Plan:
    """Decide what to do about one failing pod, given the workload's state and policy.

    `holder_uid` is the uid of the object the state was read from: a state recorded for
    another object is a copy and counts as empty (`foreign_copy`), and every state written
    records it. `statefulset` is the range of pods a StatefulSet wants now (from its spec);
    entries of other pod names are pruned. Without it nothing is pruned for its name.
    `also_failing` are the nodes where other pods of the same controller are failing now for
    a reason another node could fix: a move of a workload-wide budget excludes them too,
    uncharged (see "What a move records" in the module docstring); otherwise they are ignored.
    `witnesses` are the other pods of the controller as they are now
    (`shared.workloads.everywhere.witnesses_of`): with them, a move of a workload-wide
    budget that cannot help (the same failure on enough distinct nodes, no pod healthy
    anywhere) is stopped instead (`Action.STOPPED`, or nothing when the stop is recorded
    already). None means they were not looked at, and then a move is never stopped.
    `implicated` are the nodes the failure was seen on that are evidence against themselves
    (`shared.workloads.everywhere.judge`): they do not count towards a stop.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if failure.owner_kind is not policy.owner_kind:
        # Two sources for one fact: counting per pod under a workload budget (or the reverse)
        # would corrupt the state, so a handler that mixes them up fails loudly.
        raise ValueError(
            f"failure of a {failure.owner_kind} pod planned with a {policy.owner_kind} policy"
        )
    now = now.replace(microsecond=0)
    per_pod = policy.scope is BudgetScope.PER_POD
    budget = policy.budget
    pod = f"pod {failure.pod_name}"
    ignored = foreign_copy(state, failure.owner_kind, holder_uid)
    if ignored is not None:
        # Another object's bookkeeping: neither its count nor its exclusions are this
        # holder's. Its own count, if it had one, was overwritten by the copy; see
        # shared.pods.update_annotations.rollouts for what stops that.
        state = WorkloadState()
    ignored_note = f" (the holder's stored state was ignored: {ignored})" if ignored else ""

    if failure.pod_uid and failure.pod_uid in state.handled:
        stored = state.entry(failure.pod_name) if per_pod else None
        return Plan(
            Action.NOTHING,
            None,
            "already-handled",
            None,
            f"{pod} (uid {failure.pod_uid}) was already moved; nothing more to record",
            delete_pod=True,
            moves=stored.moves if stored else state.moves,
            budget=budget,
            excluded_nodes=stored.excluded_nodes if stored else state.excluded_nodes,
        )

    # Decide on the pruned state, so the decision does not depend on whether another pod's
    # plan happened to prune it first.
    pruned = prune(
        state,
        now,
        policy.reset_after,
        keep_pod=failure.pod_name if per_pod else None,
        statefulset=statefulset if per_pod else None,
    )
    current = pruned.state
    entry = current.entry(failure.pod_name)
    moves = entry.moves if per_pod else current.moves
    excluded = entry.excluded_nodes if per_pod else current.excluded_nodes

    def nothing(reason: str, message: str) -> Plan:
        return Plan(
            Action.NOTHING,
            None,
            reason,
            None,
            message + ignored_note,
            moves=moves,
            budget=budget,
            excluded_nodes=excluded,
            ignored_copy=ignored,
        )

    def with_scope(
        new_moves: int,
        new_excluded: tuple[str, ...],
        exhausted: bool,
        remember: bool,
        *,
        failed: str | None = None,
        stopped: Stopped | None = None,
    ) -> WorkloadState:
        """The state to write. ``failed`` is the failure reason of a move off the failing pod's
        node (workload scope), ``stopped`` a stop to record; a move (``failed``) clears an
        earlier stop."""
        handled = current.handled
        if remember and failure.pod_uid:
            handled = (*handled, failure.pod_uid)[-max(handled_limit, 1) :]
        total = current.moves + (new_moves - moves)
        # Every write names its holder, so a copy of it elsewhere is recognised as one.
        uid = holder_uid or current.holder_uid
        if per_pod:
            entries = dict(current.per_pod)
            entries[failure.pod_name] = PodEntry(new_moves, new_excluded, exhausted, now)
            return replace(
                current,
                moves=total,
                per_pod=entries,
                handled=handled,
                updated_at=now,
                holder_uid=uid,
            )
        failed_on = dict(current.failed_on)
        if failed is not None and failure.node:
            if not new_excluded:
                failed_on = {}  # a reset: the container ran fine, its history says nothing
            else:
                failed_on.pop(failure.node, None)  # most recent last, like excluded nodes
                failed_on[failure.node] = failed[:MAX_REASON_LENGTH]
                failed_on = dict(list(failed_on.items())[-MAX_EXCLUDED_NODES:])
        return replace(
            current,
            moves=new_moves,
            excluded_nodes=new_excluded,
            exhausted_recorded=exhausted,
            handled=handled,
            updated_at=now,
            holder_uid=uid,
            failed_on=failed_on,
            stopped=stopped if stopped is not None else (None if failed else current.stopped),
        )

    def decided(result: Plan) -> Plan:
        """Fit the state to write under the size cap; refuse to record a move if it cannot."""
        assert result.new_state is not None
        fitted, note, fits = _fit(result.new_state, failure.pod_name if per_pod else None)
        notes = (*pruned.notes, note) if note else pruned.notes
        if not fits and result.action is not Action.CLEAR_AND_MOVE:
            return nothing(
                "state-too-large",
                f"{pod} failed on {failure.node} ({failure.reason}) but the workload's state "
                f"would exceed {MAX_STATE_BYTES // 1024} KiB even after pruning, and move "
                "counts are never dropped to make room: leaving the pod in place",
            )
        message = result.message
        if notes:
            message = f"{message} (state pruned: {'; '.join(notes)})"
        return replace(
            result,
            new_state=fitted,
            message=message + ignored_note,
            pruned=notes,
            ignored_copy=ignored,
        )

    # Our own exclusions keep this pod from being scheduled at all. Clear them even when the
    # budget is spent or the policy was turned off since: we caused the problem.
    if failure.unschedulable:
        was_exhausted = entry.exhausted_recorded if per_pod else current.exhausted_recorded
        new_state = with_scope(moves, (), was_exhausted, remember=True)
        cleared = f"cleared {len(excluded)} excluded node(s)" if excluded else "no exclusions left"
        return decided(
            Plan(
                Action.CLEAR_AND_MOVE,
                new_state,
                "exclusions-made-unschedulable",
                REASON_EXCLUSIONS_CLEARED,
                f"{pod} could not be scheduled while avoiding excluded nodes; {cleared} and "
                f"deleted it so the scheduler may use every node (moves stay {moves}/{budget})",
                delete_pod=True,
                moves=moves,
                budget=budget,
                excluded_nodes=(),
                exclusions_cleared=True,
            )
        )

    if policy.disabled:
        return nothing("policy-disabled", f"{pod}: scheduling-retries is 0, rescheduling is off")
    if not failure.node:
        return nothing("no-node", f"{pod} failed without a node to move it off")

    if moves >= budget:
        already = entry.exhausted_recorded if per_pod else current.exhausted_recorded
        if already:
            return nothing(
                "exhausted-already-recorded",
                f"{pod} failed on {failure.node} ({failure.reason}) but all {budget} moves "
                "are spent; leaving it in place",
            )
        return decided(
            Plan(
                Action.EXHAUSTED,
                with_scope(moves, excluded, exhausted=True, remember=False),
                "budget-exhausted",
                REASON_RETRIES_EXHAUSTED,
                f"{pod} failed on {failure.node} ({failure.reason}) after all {budget} moves "
                "allowed by scheduling-retries were used; leaving it in place",
                moves=moves,
                budget=budget,
                excluded_nodes=excluded,
            )
        )

    ran_for = failure.ran_for
    # Unknown means "do not reset": keeping the node excluded is the conservative reading.
    reset = ran_for is not None and ran_for > policy.reset_after
    resumed = ""
    goes_on = ""
    if witnesses is not None and not per_pod and not reset:
        # A container that ran past reset-after is not failing everywhere: it ran fine here.
        kind = failure.reason[:MAX_REASON_LENGTH]
        verdict = judge(
            current.failed_on,
            current.stopped,
            failure.node,
            kind,
            witnesses,
            failure.kept_off,
            implicated,
        )
        if (
            verdict.stop
            and current.stopped is not None
            and same_failure(current.stopped.reason, kind)
        ):
            return nothing(
                "stopped-already-recorded",
                f"{pod} failed on {failure.node} ({failure.reason}); {verdict.why}, leaving "
                "it in place",
            )
        if verdict.stop:
            return decided(
                Plan(
                    Action.STOPPED,
                    with_scope(
                        moves,
                        excluded,
                        current.exhausted_recorded,
                        remember=False,
                        stopped=Stopped(kind, verdict.nodes, now),
                    ),
                    "fails-everywhere",
                    REASON_MOVES_STOPPED,
                    f"{pod} failed on {failure.node} ({failure.reason}), but moving it cannot "
                    f"help: {verdict.why}. The application (or the whole cluster) is broken, "
                    f"not the node. Moves stop here with {moves} of {budget} used and resume "
                    "when a pod of the workload is healthy or its template changes",
                    moves=moves,
                    budget=budget,
                    excluded_nodes=excluded,
                )
            )
        if current.stopped is not None:
            resumed = f"moves resumed ({verdict.why}); "
        goes_on = verdict.why
    siblings: tuple[str, ...] = ()
    if ran_for is not None and reset:
        # No sibling's node is recorded either: a reset hands placement back to the default
        # scheduler in full (not even the node this pod failed on is kept), and a sibling's
        # node is recorded when that sibling itself moves.
        # The container ran fine for a long time: the nodes excluded before it was placed say
        # nothing about today's cluster, so let the default scheduler choose freely.
        new_excluded: tuple[str, ...] = ()
        detail = (
            f"its container had run {format_duration(ran_for)} (more than "
            f"{format_duration(policy.reset_after)}), so the exclusions were cleared"
        )
    else:
        if not per_pod and failure.owner_kind is not OwnerKind.POD:
            siblings = _sibling_nodes(also_failing, failure.node)
        # Most recent last: a node failing again moves to the end, and the bound keeps the
        # most recent ones; the failing pod's own node is the most recent of all.
        recorded = {*siblings, failure.node}
        kept = tuple(node for node in excluded if node not in recorded)
        new_excluded = (*kept, *siblings, failure.node)[-MAX_EXCLUDED_NODES:]
        siblings = tuple(n for n in siblings if n in new_excluded and n not in excluded)
        detail = f"excluded nodes now: {', '.join(new_excluded)}"
        if siblings:
            them = "it" if len(siblings) == 1 else "them"
            detail = (
                f"also excluded {_nodes_word(siblings)} {', '.join(siblings)}, where other pods "
                f"of the workload are failing now (no move counted for {them}); {detail}"
            )
    new_moves = moves + 1
    return decided(
        Plan(
            Action.MOVE,
            with_scope(
                new_moves,
                new_excluded,
                exhausted=False,
                remember=True,
                failed=None if per_pod else failure.reason,
            ),
            "ran-past-reset-after" if reset else "node-failure",
            REASON_RESCHEDULED,
            f"moved {pod} off node {failure.node} after {failure.reason} "
            f"(move {new_moves} of {budget}); {resumed}{detail}",
            delete_pod=True,
            moves=new_moves,
            budget=budget,
            excluded_nodes=new_excluded,
            exclusions_cleared=reset,
            also_excluded=siblings,
            goes_on=goes_on,
        )
    )


def _sibling_nodes(also_failing: Iterable[str], failing_node: str) -> tuple[str, ...]:
    """The valid, distinct nodes of `also_failing` other than the failing pod's, in order.

    A name Kubernetes would refuse would make every new pod invalid (see the module
    docstring): it is dropped, never written."""
    seen: dict[str, None] = {}
    for node in also_failing:
        if node != failing_node and is_valid_node_name(node):
            seen.setdefault(node, None)
    return tuple(seen)


def _nodes_word(nodes: tuple[str, ...]) -> str:
    return "node" if len(nodes) == 1 else "nodes"
