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

Format, version 2 (version 1, written by the previous release, is still read: its per-pod
entries have no timestamp and take the state's own `updatedAt`, which is at least as recent as
any change to them, so they are never pruned earlier than they should be; a version we do not
know is refused, since acting on it could undo a newer release's bookkeeping)::

    {"version": 2, "holderUid": "<uid of the object it was written for>", "moves": 3,
     "excludedNodes": ["node-a"], "handled": ["<pod uid>", ...],
     "exhaustedRecorded": false, "updatedAt": "2026-03-14T09:26:53Z",
     "failedOn": {"node-a": "CrashLoopBackOff"},
     "stopped": {"reason": "CrashLoopBackOff", "nodes": ["node-a", "node-b"], "at": "..."},
     "pods": {"db-0": {"moves": 2, "excludedNodes": ["node-c"], "updatedAt": "..."}}}

Per-pod entries (StatefulSets only) leave out an empty `excludedNodes` and a false
`exhaustedRecorded`, so a thousand pods fit easily.

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
move clears it. Both are optional within version 2 and left out when
empty; like `holderUid`, a release that predates them refuses a state that carries them
rather than drop what it does not understand.

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

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from shared.api.keys import (
    REASON_EXCLUSIONS_CLEARED,
    REASON_MOVES_STOPPED,
    REASON_RESCHEDULED,
    REASON_RETRIES_EXHAUSTED,
)
from shared.api.kubetypes import Pod
from shared.api.times import format_duration, format_time, parse_kube_time
from shared.workloads.classify import Failure, FailureKind, excluded_nodes_of
from shared.workloads.everywhere import Stopped, Witnesses, judge
from shared.workloads.policy import (
    BudgetScope,
    OwnerKind,
    Policy,
)

# The version `dump_state` writes, and every version `load_state` reads.
STATE_VERSION: Final = 2
READABLE_VERSIONS: Final = frozenset({1, 2})
DEFAULT_HANDLED_LIMIT: Final = 64
# Excluded nodes kept per scope (the workload, or one StatefulSet pod), most recent last. Each is
# a required NotIn on every new pod of the scope; a pod that failed on 32 different nodes has a
# problem no other node fixes, and 32 names of at most 253 bytes keep a scope under 8.5 KiB.
MAX_EXCLUDED_NODES: Final = 32
# Our own cap on the serialized state: a quarter of the API server's 256 KiB for all the
# annotations of an object (see the module docstring for what happens past it).
MAX_STATE_BYTES: Final = 64 * 1024

# Kubernetes node names are DNS-1123 subdomains (ValidateNodeName is NameIsDNSSubdomain), and a
# node field selector validates its values with exactly that rule.
MAX_NODE_NAME_LENGTH: Final = 253
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
# How the StatefulSet controller reads a pod's ordinal (statefulPodRegex in its utils).
_STATEFUL_POD: Final = re.compile(r"(.*)-([0-9]+)")
_MAX_INT32: Final = 2**31 - 1
_LONG_AGO: Final = datetime.min.replace(tzinfo=UTC)
# The longest failure reason kept in `failedOn` and `stopped` (the kubelet's are short words).
MAX_REASON_LENGTH: Final = 128


def is_valid_node_name(name: object) -> bool:
    """Whether the API server accepts `name` as a node name (and so in a NotIn requirement)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NODE_NAME_LENGTH
        and _DNS1123_SUBDOMAIN.fullmatch(name) is not None
    )


class StateError(ValueError):
    """The stored state cannot be read; the caller must log it and refuse to act."""


@dataclass(frozen=True)
class PodEntry:
    """Per-pod counters, used for StatefulSet pods (keyed by pod name)."""

    moves: int = 0
    excluded_nodes: tuple[str, ...] = ()
    exhausted_recorded: bool = False
    # When `plan` last changed the entry; None when unknown (never pruned for its age then).
    updated_at: datetime | None = None


def _freeze(entries: Mapping[str, PodEntry]) -> Mapping[str, PodEntry]:
    return MappingProxyType(dict(sorted(entries.items())))


@dataclass(frozen=True)
class WorkloadState:
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
    # The uid of the object the state was written for; empty when unknown (written before the
    # field existed). See "Whose state" in the module docstring.
    holder_uid: str = ""
    # The failure reason of each excluded node a move was charged for (workload scope only).
    failed_on: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), hash=False, compare=True
    )
    # Moves stopped because the workload fails the same way everywhere (shared.workloads.
    # everywhere); None while moves are allowed.
    stopped: Stopped | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.per_pod, MappingProxyType):
            object.__setattr__(self, "per_pod", _freeze(self.per_pod))
        if not isinstance(self.failed_on, MappingProxyType):
            object.__setattr__(self, "failed_on", MappingProxyType(dict(self.failed_on)))

    def entry(self, pod_name: str) -> PodEntry:
        return self.per_pod.get(pod_name, PodEntry())


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


@dataclass(frozen=True)
class LenientState:
    """A state read for the webhook: node names Kubernetes would refuse are left out."""

    state: WorkloadState
    skipped_nodes: tuple[str, ...] = ()


def load_state(annotation_value: str | None) -> WorkloadState:
    """Read the state annotation; missing or empty means a workload never touched.

    Raises StateError for anything we cannot read exactly, invalid node names included.
    """
    return _load(annotation_value, None)


def load_state_lenient(annotation_value: str | None) -> LenientState:
    """Read the state like `load_state`, but skip (and report) node names Kubernetes would
    refuse instead of raising: the webhook must keep the valid exclusions and never patch an
    invalid one into a pod. Any other damage still raises StateError."""
    skipped: list[str] = []
    state = _load(annotation_value, skipped)
    return LenientState(state, tuple(skipped))


def _load(annotation_value: str | None, skipped: list[str] | None) -> WorkloadState:
    if not annotation_value:
        return WorkloadState()
    try:
        data = json.loads(annotation_value)
    except (ValueError, RecursionError) as err:
        raise StateError(f"state annotation is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise StateError("state annotation must be a JSON object")
    version = data.get("version")
    if type(version) is not int:
        raise StateError("state annotation has no integer version")
    if version not in READABLE_VERSIONS:
        # Written by a newer (or older, incompatible) release: acting on it could undo its
        # bookkeeping, so refuse until the functions are upgraded too.
        readable = ", ".join(str(v) for v in sorted(READABLE_VERSIONS))
        raise StateError(
            f"state version {version} is not supported (this release reads {readable})"
        )
    _only_keys(data, _TOP_KEYS_V1 if version == 1 else _TOP_KEYS, "state")
    updated_at = _time(data, "updatedAt", "state field updatedAt")
    holder_uid = data.get("holderUid", "")
    if not isinstance(holder_uid, str):
        raise StateError(f"state field holderUid must be a string, got {holder_uid!r}")
    per_pod_raw = data.get("pods", {})
    if not isinstance(per_pod_raw, dict):
        raise StateError("state field pods must be an object")
    pod_keys = _POD_KEYS_V1 if version == 1 else _POD_KEYS
    per_pod = {}
    for name, raw in per_pod_raw.items():
        if not isinstance(raw, dict):
            raise StateError(f"state entry for pod {name} must be an object")
        what = f"state entry for pod {name}"
        _only_keys(raw, pod_keys, what)
        per_pod[name] = PodEntry(
            moves=_count(raw, "moves"),
            excluded_nodes=_nodes(raw, "excludedNodes", skipped),
            exhausted_recorded=_flag(raw, "exhaustedRecorded"),
            # Version 1 kept no time per entry: the state's last write bounds it from above.
            updated_at=updated_at if version == 1 else _time(raw, "updatedAt", what),
        )
    return WorkloadState(
        moves=_count(data, "moves"),
        excluded_nodes=_nodes(data, "excludedNodes", skipped),
        per_pod=per_pod,
        handled=_names(data, "handled"),
        exhausted_recorded=_flag(data, "exhaustedRecorded"),
        updated_at=updated_at,
        holder_uid=holder_uid,
        failed_on=_failed_on(data, skipped),
        stopped=_stopped(data, skipped),
    )


def dump_state(state: WorkloadState) -> str:
    """Compact JSON with sorted keys: the same state always gives the same annotation.

    Always the current version, whatever version the state was read from.
    """
    data: dict[str, Any] = {
        "version": STATE_VERSION,
        "moves": state.moves,
        "excludedNodes": list(state.excluded_nodes),
        "handled": list(state.handled),
        "exhaustedRecorded": state.exhausted_recorded,
    }
    if state.per_pod:
        data["pods"] = {name: _entry_data(entry) for name, entry in state.per_pod.items()}
    if state.updated_at is not None:
        data["updatedAt"] = format_time(state.updated_at)
    if state.holder_uid:
        data["holderUid"] = state.holder_uid
    if state.failed_on:
        data["failedOn"] = dict(state.failed_on)
    if state.stopped is not None:
        stopped: dict[str, Any] = {
            "reason": state.stopped.reason,
            "nodes": list(state.stopped.nodes),
        }
        if state.stopped.at is not None:
            stopped["at"] = format_time(state.stopped.at)
        data["stopped"] = stopped
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _entry_data(entry: PodEntry) -> dict[str, Any]:
    data: dict[str, Any] = {"moves": entry.moves}
    if entry.excluded_nodes:
        data["excludedNodes"] = list(entry.excluded_nodes)
    if entry.exhausted_recorded:
        data["exhaustedRecorded"] = True
    if entry.updated_at is not None:
        data["updatedAt"] = format_time(entry.updated_at)
    return data


_TOP_KEYS_V1: Final = frozenset(
    {"version", "moves", "excludedNodes", "pods", "handled", "exhaustedRecorded", "updatedAt"}
)
# holderUid, failedOn and stopped are optional within version 2: states written before them
# are the holder's own, with nothing recorded about failures.
_TOP_KEYS: Final = _TOP_KEYS_V1 | {"holderUid", "failedOn", "stopped"}
_STOPPED_KEYS: Final = frozenset({"reason", "nodes", "at"})
_POD_KEYS_V1: Final = frozenset({"moves", "excludedNodes", "exhaustedRecorded"})
_POD_KEYS: Final = _POD_KEYS_V1 | {"updatedAt"}


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


def _nodes(data: dict[str, Any], key: str, skipped: list[str] | None) -> tuple[str, ...]:
    names = data.get(key, [])
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise StateError(f"state field {key} must be a list of node names, got {names!r}")
    invalid = [name for name in names if not is_valid_node_name(name)]
    if invalid and skipped is None:
        raise StateError(
            f"state field {key} lists name(s) that are not valid node names "
            f"(lowercase DNS-1123 subdomains of at most {MAX_NODE_NAME_LENGTH} characters): "
            f"{_quoted(invalid)}"
        )
    if skipped is not None:
        skipped.extend(invalid)
    return tuple(name for name in names if is_valid_node_name(name))


def _quoted(names: list[str], limit: int = 5, width: int = 64) -> str:
    """A bounded rendering of untrusted names, for messages and logs."""
    shown = [repr(name if len(name) <= width else name[:width] + "...") for name in names[:limit]]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(shown) + more


def _reason(value: object, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_REASON_LENGTH:
        raise StateError(
            f"{what} must be a failure reason of 1 to {MAX_REASON_LENGTH} characters, "
            f"got {_quoted([str(value)])}"
        )
    return value


def _failed_on(data: dict[str, Any], skipped: list[str] | None) -> Mapping[str, str]:
    raw = data.get("failedOn", {})
    if not isinstance(raw, dict):
        raise StateError("state field failedOn must be an object")
    nodes = _nodes({"failedOn": list(raw)}, "failedOn", skipped)
    return {node: _reason(raw[node], f"state field failedOn of node {node}") for node in nodes}


def _stopped(data: dict[str, Any], skipped: list[str] | None) -> Stopped | None:
    raw = data.get("stopped")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise StateError("state field stopped must be an object")
    _only_keys(raw, _STOPPED_KEYS, "state field stopped")
    return Stopped(
        reason=_reason(raw.get("reason"), "state field stopped.reason"),
        nodes=_nodes(raw, "nodes", skipped),
        at=_time(raw, "at", "state field stopped.at"),
    )


def _flag(data: dict[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise StateError(f"state field {key} must be true or false, got {value!r}")
    return value


def _time(data: dict[str, Any], key: str, what: str) -> datetime | None:
    raw = data.get(key)
    if raw is None:
        return None
    parsed = parse_kube_time(raw) if isinstance(raw, str) else None
    if parsed is None:
        raise StateError(f"{what} is not a timestamp: {raw!r}")
    return parsed


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
            f"{statefulset.name if statefulset else ''} no longer has ({_quoted(gone, width=253)})"
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
        size -= len(_entry_json(entry)) - len(_entry_json(lighter))
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


def _entry_json(entry: PodEntry) -> bytes:
    return json.dumps(_entry_data(entry), sort_keys=True, separators=(",", ":")).encode()


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
    if witnesses is not None and not per_pod and not reset:
        # A container that ran past reset-after is not failing everywhere: it ran fine here.
        kind = failure.reason[:MAX_REASON_LENGTH]
        verdict = judge(
            current.failed_on, current.stopped, failure.node, kind, witnesses, failure.kept_off
        )
        if verdict.stop and current.stopped is not None and current.stopped.reason == kind:
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
