"""The health record assess-nodes keeps on each Node: which workloads failed there, and when.

Functions are stateless, so the record lives on the Node itself, in the versioned JSON
annotation ``kn-rescheduler.io/node-health``, written with a resourceVersion compare-and-swap
exactly like a workload's state. It must stay right under at-least-once, unordered delivery:

- a failure is identified by the failing pod's uid, so the same failure delivered twice (or
  reported by several events: ``failing``, then ``rescheduled``) is one entry;
- its time is the time the reporting event carries, not the time we handled it, so the same
  events in any order give the same record;
- it is bounded: failures older than the window are dropped at every write, and at most
  ``MAX_FAILURES`` entries are kept (the newest).

A record we cannot read is never trusted and never overwritten blindly: the handler answers
500 (the event is kept in the dead-letter sink) and a person looks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final

from shared.api import records
from shared.api.records import RecordError
from shared.api.times import format_time, parse_time
from shared.api.workloadid import family

RECORD_VERSION: Final = 1
# Enough for any node a handful of workloads fail on; a node where more fail at once is
# suspect long before the oldest entries matter.
MAX_FAILURES: Final = 32
# The annotation stays far below the API's 256 KiB limit on all annotations of an object.
MAX_RECORD_BYTES: Final = 16 * 1024

FORMAT: Final = records.Format(
    name="node-health record",
    version_key="version",
    version=RECORD_VERSION,
    # Written as well as read: a record over it would be refused by every later read, and the
    # node's events would all go to the dead-letter sink (the writer drops old failures instead).
    max_bytes=MAX_RECORD_BYTES,
    sort_keys=True,
    not_json="the node-health record is not JSON: {error}",
)


@dataclass(frozen=True, order=True)
class Seen:
    """One failure seen on the node: a pod of a workload, its reason, when it was reported."""

    at: datetime
    # "Kind namespace/name" as the report named it: the top-level workload (a reply's
    # topWorkload), or the pod's controller (a pod.failing report, an older reply), or the bare
    # pod; counted by its family (shared.api.workloadid).
    workload: str
    pod: str  # the failing pod's uid
    reason: str

    def to_json(self) -> dict[str, str]:
        return {
            "at": format_time(self.at),
            "workload": self.workload,
            "pod": self.pod,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class NodeHealth:
    failures: tuple[Seen, ...] = ()
    # When the node was marked suspect (None: it is not), and by which workloads and which of
    # its conditions (their types; a record of a release before conditions counted has none).
    suspect_since: datetime | None = None
    suspect_workloads: tuple[str, ...] = ()
    suspect_conditions: tuple[str, ...] = ()

    @property
    def suspect(self) -> bool:
        return self.suspect_since is not None

    def recent(self, now: datetime, window: timedelta) -> tuple[Seen, ...]:
        """The failures inside the window ending now, oldest first."""
        return tuple(seen for seen in self.failures if seen.at > now - window)

    def workloads(self, now: datetime, window: timedelta) -> tuple[str, ...]:
        """The distinct top-level workloads that failed here inside the window, each named as
        its newest report names it, sorted (``shared.api.workloadid.family``)."""
        newest = {family(seen.workload): seen.workload for seen in self.recent(now, window)}
        return tuple(sorted(newest.values()))

    def last_failure(self) -> datetime | None:
        return max((seen.at for seen in self.failures), default=None)

    def with_failure(self, seen: Seen) -> NodeHealth:
        """The record with ``seen`` added; the same pod seen again keeps its newest report."""
        kept = [old for old in self.failures if old.pod != seen.pod]
        previous = [old for old in self.failures if old.pod == seen.pod]
        newest = max([seen, *previous], key=lambda s: s.at)
        merged = sorted([*kept, newest])
        return replace(self, failures=tuple(merged[-MAX_FAILURES:]))

    def pruned(self, now: datetime, window: timedelta) -> NodeHealth:
        return replace(self, failures=self.recent(now, window))

    def to_json(self) -> str:
        """The annotation, within ``MAX_RECORD_BYTES``: the oldest failures give way first.

        Names and reasons come from events and can be long (a namespace of 63 characters, a
        workload and a pod of 253 each): 32 such failures are over the cap. Refusing to write
        would fail every later event about the node the same way, and a record over the cap
        would be refused by every read; dropping the oldest is what ``MAX_FAILURES`` does
        already. RecordError only if the suspicion alone is over the cap.
        """
        failures = self.failures
        while True:
            out: dict[str, Any] = {"failures": [seen.to_json() for seen in failures]}
            if self.suspect_since is not None:
                out["suspect"] = {
                    "since": format_time(self.suspect_since),
                    "workloads": list(self.suspect_workloads),
                }
                if self.suspect_conditions:
                    out["suspect"]["conditions"] = list(self.suspect_conditions)
            try:
                return records.dump(out, FORMAT)
            except records.RecordError:
                if not failures:
                    raise
                failures = failures[1:]


def load(raw: str | None) -> NodeHealth:
    """The record in the annotation; an empty one when there is none."""
    if raw is None or raw == "":
        return NodeHealth()
    _, data = records.load(raw, FORMAT)
    entries = data.get("failures")
    if not isinstance(entries, list):
        raise RecordError("the node-health record has no list of failures")
    failures: list[Seen] = []
    try:
        for entry in entries:
            if not isinstance(entry, dict):
                raise ValueError("a failure is not an object")
            fields = [entry.get(key) for key in ("workload", "pod", "reason")]
            if not all(isinstance(value, str) and value for value in fields):
                raise ValueError(f"a failure without workload, pod or reason: {entry}")
            failures.append(
                Seen(parse_time(entry.get("at")), str(fields[0]), str(fields[1]), str(fields[2]))
            )
        suspect = data.get("suspect")
        since: datetime | None = None
        workloads: tuple[str, ...] = ()
        conditions: tuple[str, ...] = ()
        if suspect is not None:
            if not isinstance(suspect, dict):
                raise ValueError("suspect is not an object")
            since = parse_time(suspect.get("since"))
            listed = suspect.get("workloads") or []
            if not isinstance(listed, list) or not all(isinstance(w, str) for w in listed):
                raise ValueError("suspect workloads is not a list of names")
            workloads = tuple(listed)
            types = suspect.get("conditions") or []
            if not isinstance(types, list) or not all(isinstance(c, str) for c in types):
                raise ValueError("suspect conditions is not a list of condition types")
            conditions = tuple(types)
    except ValueError as err:
        raise RecordError(f"the node-health record is malformed: {err}") from err
    return NodeHealth(tuple(sorted(failures)[-MAX_FAILURES:]), since, workloads, conditions)
