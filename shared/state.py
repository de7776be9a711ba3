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
workload a fresh budget on every corruption.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from shared.classify import Failure, FailureKind
from shared.constants import (
    REASON_EXCLUSIONS_CLEARED,
    REASON_RESCHEDULED,
    REASON_RETRIES_EXHAUSTED,
)
from shared.kubetypes import Pod
from shared.policy import (
    BudgetScope,
    OwnerKind,
    Policy,
    format_duration,
    format_kube_time,
    parse_kube_time,
)

STATE_VERSION: Final = 1
DEFAULT_HANDLED_LIMIT: Final = 64


class StateError(ValueError):
    """The stored state cannot be read; the caller must log it and refuse to act."""


@dataclass(frozen=True)
class PodEntry:
    """Per-pod counters, used for StatefulSet pods (keyed by pod name)."""

    moves: int = 0
    excluded_nodes: tuple[str, ...] = ()
    exhausted_recorded: bool = False


def _freeze(entries: Mapping[str, PodEntry]) -> Mapping[str, PodEntry]:
    return MappingProxyType(dict(sorted(entries.items())))


@dataclass(frozen=True)
class WorkloadState:
    version: int = STATE_VERSION
    # Every move of the workload; for a StatefulSet the budget is per pod (per_pod) and this is
    # only the total.
    moves: int = 0
    # Nodes to keep the workload's next pods off (unused for StatefulSets: see per_pod).
    excluded_nodes: tuple[str, ...] = ()
    per_pod: Mapping[str, PodEntry] = field(
        default_factory=lambda: _freeze({}), hash=False, compare=True
    )
    # Uids of pods we decided to move, oldest first, bounded.
    handled: tuple[str, ...] = ()
    # Set when RetriesExhausted was recorded, so it is recorded once, not on every event.
    exhausted_recorded: bool = False
    updated_at: datetime | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.per_pod, MappingProxyType):
            object.__setattr__(self, "per_pod", _freeze(self.per_pod))

    def entry(self, pod_name: str) -> PodEntry:
        return self.per_pod.get(pod_name, PodEntry())


def load_state(annotation_value: str | None) -> WorkloadState:
    """Read the state annotation; missing or empty means a workload never touched."""
    if not annotation_value:
        return WorkloadState()
    try:
        data = json.loads(annotation_value)
    except ValueError as err:
        raise StateError(f"state annotation is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise StateError("state annotation must be a JSON object")
    version = data.get("version")
    if type(version) is not int:
        raise StateError("state annotation has no integer version")
    if version != STATE_VERSION:
        # Written by a newer (or older, incompatible) release: acting on it could undo its
        # bookkeeping, so refuse until the functions are upgraded too.
        raise StateError(f"state version {version} is not supported (this release reads 1)")
    _only_keys(data, _TOP_KEYS, "state")
    per_pod_raw = data.get("pods", {})
    if not isinstance(per_pod_raw, dict):
        raise StateError("state field pods must be an object")
    per_pod = {}
    for name, raw in per_pod_raw.items():
        if not isinstance(raw, dict):
            raise StateError(f"state entry for pod {name} must be an object")
        _only_keys(raw, _POD_KEYS, f"state entry for pod {name}")
        per_pod[name] = PodEntry(
            moves=_count(raw, "moves"),
            excluded_nodes=_names(raw, "excludedNodes"),
            exhausted_recorded=_flag(raw, "exhaustedRecorded"),
        )
    updated_raw = data.get("updatedAt")
    updated_at = None
    if updated_raw is not None:
        updated_at = parse_kube_time(updated_raw) if isinstance(updated_raw, str) else None
        if updated_at is None:
            raise StateError(f"state field updatedAt is not a timestamp: {updated_raw!r}")
    return WorkloadState(
        version=version,
        moves=_count(data, "moves"),
        excluded_nodes=_names(data, "excludedNodes"),
        per_pod=per_pod,
        handled=_names(data, "handled"),
        exhausted_recorded=_flag(data, "exhaustedRecorded"),
        updated_at=updated_at,
    )


def dump_state(state: WorkloadState) -> str:
    """Compact JSON with sorted keys: the same state always gives the same annotation."""
    data: dict[str, Any] = {
        "version": state.version,
        "moves": state.moves,
        "excludedNodes": list(state.excluded_nodes),
        "handled": list(state.handled),
        "exhaustedRecorded": state.exhausted_recorded,
    }
    if state.per_pod:
        data["pods"] = {
            name: {
                "moves": entry.moves,
                "excludedNodes": list(entry.excluded_nodes),
                "exhaustedRecorded": entry.exhausted_recorded,
            }
            for name, entry in state.per_pod.items()
        }
    if state.updated_at is not None:
        data["updatedAt"] = format_kube_time(state.updated_at)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


_TOP_KEYS: Final = frozenset(
    {"version", "moves", "excludedNodes", "pods", "handled", "exhaustedRecorded", "updatedAt"}
)
_POD_KEYS: Final = frozenset({"moves", "excludedNodes", "exhaustedRecorded"})


def _only_keys(data: dict[str, Any], known: frozenset[str], what: str) -> None:
    # A key we do not know means a hand edit or a writer we do not understand; dropping it on
    # the next write would lose information, so refuse instead.
    unknown = sorted(set(data) - known)
    if unknown:
        raise StateError(f"{what} has unknown field(s): {', '.join(unknown)}")


def _count(data: dict[str, Any], key: str) -> int:
    value = data.get(key, 0)
    if type(value) is not int or value < 0:
        raise StateError(f"state field {key} must be a non-negative integer, got {value!r}")
    return value


def _names(data: dict[str, Any], key: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise StateError(f"state field {key} must be a list of names, got {value!r}")
    return tuple(value)


def _flag(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise StateError(f"state field {key} must be true or false, got {value!r}")
    return value


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


@dataclass(frozen=True)
class FailureFacts:
    """What `plan` needs to know about the failing pod, taken from the pod and its failure."""

    pod_name: str
    pod_uid: str
    owner_kind: OwnerKind
    # The node to exclude; None when the pod never reached one (unschedulable).
    node: str | None
    reason: str
    # When the pod started (status.startTime); None if the kubelet never reported it.
    started_at: datetime | None = None
    unschedulable: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "owner_kind", OwnerKind(self.owner_kind))

    @classmethod
    def from_pod(cls, pod: Pod, failure: Failure, owner_kind: OwnerKind | str) -> FailureFacts:
        meta = pod.get("metadata", {})
        return cls(
            pod_name=meta.get("name", ""),
            pod_uid=meta.get("uid", ""),
            owner_kind=OwnerKind(owner_kind),
            node=failure.node,
            reason=failure.reason,
            started_at=parse_kube_time(pod.get("status", {}).get("startTime")),
            unschedulable=failure.kind is FailureKind.EXCLUSIONS_UNSCHEDULABLE,
        )


class Action(StrEnum):
    # Record the move (count + 1, exclude the node) and delete the pod.
    MOVE = "move"
    # Clear the exclusions that made the pod unschedulable and delete it; count unchanged.
    CLEAR_AND_MOVE = "clear-and-move"
    # The budget is spent: record that once, leave the pod where it is.
    EXHAUSTED = "exhausted"
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


def plan(
    state: WorkloadState,
    failure: FailureFacts,
    policy: Policy,
    now: datetime,
    *,
    handled_limit: int = DEFAULT_HANDLED_LIMIT,
) -> Plan:
    """Decide what to do about one failing pod, given the workload's state and policy."""
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
    entry = state.entry(failure.pod_name)
    moves = entry.moves if per_pod else state.moves
    excluded = entry.excluded_nodes if per_pod else state.excluded_nodes
    budget = policy.budget
    pod = f"pod {failure.pod_name}"

    def nothing(reason: str, message: str, *, delete_pod: bool = False) -> Plan:
        return Plan(
            Action.NOTHING,
            None,
            reason,
            None,
            message,
            delete_pod=delete_pod,
            moves=moves,
            budget=budget,
            excluded_nodes=excluded,
        )

    if failure.pod_uid and failure.pod_uid in state.handled:
        return nothing(
            "already-handled",
            f"{pod} (uid {failure.pod_uid}) was already moved; nothing more to record",
            delete_pod=True,
        )

    def with_scope(
        new_moves: int, new_excluded: tuple[str, ...], exhausted: bool, remember: bool
    ) -> WorkloadState:
        handled = state.handled
        if remember and failure.pod_uid:
            handled = (*handled, failure.pod_uid)[-max(handled_limit, 1) :]
        total = state.moves + (new_moves - moves)
        if per_pod:
            entries = dict(state.per_pod)
            entries[failure.pod_name] = PodEntry(new_moves, new_excluded, exhausted)
            return replace(state, moves=total, per_pod=entries, handled=handled, updated_at=now)
        return replace(
            state,
            moves=new_moves,
            excluded_nodes=new_excluded,
            exhausted_recorded=exhausted,
            handled=handled,
            updated_at=now,
        )

    # Our own exclusions keep this pod from being scheduled at all. Clear them even when the
    # budget is spent or the policy was turned off since: we caused the problem.
    if failure.unschedulable:
        was_exhausted = entry.exhausted_recorded if per_pod else state.exhausted_recorded
        new_state = with_scope(moves, (), was_exhausted, remember=True)
        cleared = f"cleared {len(excluded)} excluded node(s)" if excluded else "no exclusions left"
        return Plan(
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

    if policy.disabled:
        return nothing("policy-disabled", f"{pod}: scheduling-retries is 0, rescheduling is off")
    if not failure.node:
        return nothing("no-node", f"{pod} failed without a node to move it off")

    if moves >= budget:
        already = entry.exhausted_recorded if per_pod else state.exhausted_recorded
        if already:
            return nothing(
                "exhausted-already-recorded",
                f"{pod} failed on {failure.node} ({failure.reason}) but all {budget} moves "
                "are spent; leaving it in place",
            )
        return Plan(
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

    running_for = now - failure.started_at if failure.started_at is not None else None
    reset = running_for is not None and running_for > policy.reset_after
    if running_for is not None and reset:
        # The pod ran fine for a long time: the nodes excluded before it was placed say
        # nothing about today's cluster, so let the default scheduler choose freely.
        new_excluded: tuple[str, ...] = ()
        detail = (
            f"it had run {format_duration(running_for)} (more than "
            f"{format_duration(policy.reset_after)}), so the exclusions were cleared"
        )
    else:
        new_excluded = excluded if failure.node in excluded else (*excluded, failure.node)
        detail = f"excluded nodes now: {', '.join(new_excluded)}"
    new_moves = moves + 1
    return Plan(
        Action.MOVE,
        with_scope(new_moves, new_excluded, exhausted=False, remember=True),
        "ran-past-reset-after" if reset else "node-failure",
        REASON_RESCHEDULED,
        f"moved {pod} off node {failure.node} after {failure.reason} "
        f"(move {new_moves} of {budget}); {detail}",
        delete_pod=True,
        moves=new_moves,
        budget=budget,
        excluded_nodes=new_excluded,
        exclusions_cleared=reset,
    )
