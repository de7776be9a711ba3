"""The workload state record: a workload's moves and the nodes to keep its pods off.

Functions are stateless, so this lives in the annotation ``kn-rescheduler.io/state`` on the
pod's controller (ReplicaSet, StatefulSet, Job) or on a bare pod, as versioned JSON. This is
its format; what is decided with it (``plan``, pruning, whose state it is) is
``shared.workloads.state``.

Format, version 2 (version 1, written by the release before, is still read: its per-pod
entries have no timestamp and take the state's own ``updatedAt``, which is at least as recent
as any change to them, so they are never pruned earlier than they should be; a version we do
not know is refused, since acting on it could undo a newer release's bookkeeping)::

    {"version": 2, "holderUid": "<uid of the object it was written for>", "moves": 3,
     "excludedNodes": ["node-a"], "handled": ["<pod uid>", ...],
     "exhaustedRecorded": false, "updatedAt": "2026-03-14T09:26:53Z",
     "failedOn": {"node-a": "CrashLoopBackOff"},
     "stopped": {"reason": "CrashLoopBackOff", "nodes": ["node-a", "node-b"], "at": "..."},
     "pods": {"db-0": {"moves": 2, "excludedNodes": ["node-c"], "updatedAt": "..."}}}

Per-pod entries (StatefulSets only) leave out an empty ``excludedNodes`` and a false
``exhaustedRecorded``, so a thousand pods fit easily. ``holderUid``, ``failedOn`` and
``stopped`` are optional within version 2 and left out when empty; a release that predates
them refuses a state that carries them rather than drop what it does not understand. Keys are
sorted, so the same state always gives the same annotation.

A state we cannot read is an error, never an empty state: resetting would hand a
crash-looping workload a fresh budget on every corruption. That includes a node name
Kubernetes would refuse (a hand edit, or a tenant's own bare-pod state): it would become a
``metadata.name NotIn`` requirement that makes every new pod invalid at creation, which the
webhook's ``failurePolicy: Ignore`` does not cover. The webhook reads states with
``load_state_lenient``, which skips such names and keeps the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

from shared.api import records
from shared.api.records import RecordError
from shared.api.times import format_time, parse_kube_time

# The version `dump_state` writes, and every version `load_state` reads.
STATE_VERSION: Final = 2
READABLE_VERSIONS: Final = frozenset({1, 2})
# Our own cap on the serialized state: a quarter of the API server's 256 KiB for all the
# annotations of an object. `plan` keeps what it writes under it (shared.workloads.state,
# "Size"), except a write that only clears exclusions, so it is no cap on reading or dumping.
MAX_STATE_BYTES: Final = 64 * 1024

# Kubernetes node names are DNS-1123 subdomains (ValidateNodeName is NameIsDNSSubdomain), and a
# node field selector validates its values with exactly that rule.
MAX_NODE_NAME_LENGTH: Final = 253
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
# The longest failure reason kept in `failedOn` and `stopped` (the kubelet's are short words).
MAX_REASON_LENGTH: Final = 128


def is_valid_node_name(name: object) -> bool:
    """Whether the API server accepts `name` as a node name (and so in a NotIn requirement)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NODE_NAME_LENGTH
        and _DNS1123_SUBDOMAIN.fullmatch(name) is not None
    )


class StateError(RecordError):
    """The stored state cannot be read; the caller must log it and refuse to act."""


FORMAT: Final = records.Format(
    name="state",
    version_key="version",
    version=STATE_VERSION,
    readable=READABLE_VERSIONS,
    # None: a state over MAX_STATE_BYTES is written on purpose (clearing exclusions we caused)
    # and must be read back; the API server's 256 KiB bounds it.
    max_bytes=None,
    sort_keys=True,
    raises=StateError,
    not_json="state annotation is not valid JSON: {error}",
    not_object="state annotation must be a JSON object",
    no_version="state annotation has no integer version",
    unknown_version="state version {found} is not supported (this release reads {readable})",
)


@dataclass(frozen=True)
class Stopped:
    """A stop recorded in the holder's state: its failure reason, the nodes that showed it,
    and when it was recorded (shared.workloads.everywhere decides it)."""

    reason: str
    nodes: tuple[str, ...]
    at: datetime | None = None


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
    # field existed). See "Whose state" in shared.workloads.state.
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
    # A version this release does not know was written by a newer (or older, incompatible)
    # release: acting on it could undo its bookkeeping, so it is refused until the functions
    # are upgraded too.
    version, data = records.load(annotation_value, FORMAT)
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
    return records.dump(data, FORMAT)


def entry_bytes(entry: PodEntry) -> int:
    """The bytes a per-pod entry's value takes in the annotation (what dropping a part of it
    saves: the size cap's last resort weighs entries one by one)."""
    return len(json.dumps(_entry_data(entry), sort_keys=True, separators=(",", ":")).encode())


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
            f"{quoted_names(invalid)}"
        )
    if skipped is not None:
        skipped.extend(invalid)
    return tuple(name for name in names if is_valid_node_name(name))


def quoted_names(names: list[str], limit: int = 5, width: int = 64) -> str:
    """A bounded rendering of untrusted names, for messages and logs."""
    shown = [repr(name if len(name) <= width else name[:width] + "...") for name in names[:limit]]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(shown) + more


def _reason(value: object, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_REASON_LENGTH:
        raise StateError(
            f"{what} must be a failure reason of 1 to {MAX_REASON_LENGTH} characters, "
            f"got {quoted_names([str(value)])}"
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
