"""Blaming nodes: when the failures of several workloads make a node suspect. Pure decisions.

One workload failing on a node says little: its image, its config or its code may be broken
everywhere. Several **distinct** workloads failing on the same node within a short window say
the node is the common cause. So a node turns suspect when at least ``suspect_workloads``
distinct workloads (2 by default) failed there within ``suspect_window`` (10 minutes). A
workload is a top-level one (a Deployment, a CronJob, not each rollout's ReplicaSet or each
run's Job: ``shared.api.workloadid``), counted from the events the pipeline already emits:

- ``io.kn-rescheduler.pod.failing`` (a pod judged failing in a way another node could fix, at
  the restart threshold),
- ``io.kn-rescheduler.pod.rescheduled`` and ``.exhausted`` (the move that followed, or the
  budget that ran out), when their ``kind`` says the full rules called the pod failing.

Only the full rules' verdict is evidence. A fast-path report (``kind: early``: a pod's first
failure) and the fast-path move that follows it on a node already suspect are not: counted,
any one-off crash there would keep the node suspect, and suspicion would feed itself. A move
reported without its ``kind`` (an older update-annotations) is not counted either: it may have
been a fast-path one, and a threshold move's own ``pod.failing`` report counted already.

A node can also say itself that it is broken. node-problem-detector (and the kubelet) report
node problems as Node conditions: ``KernelDeadlock``, ``ReadonlyFilesystem``,
``FrequentContainerdRestart`` ... set ``True`` while the problem lasts. A condition of the
configured set (``suspect_conditions``) that is ``True`` makes the node suspect before any pod
fails there, under the same cap and opt-out; when it is no longer ``True`` (node-problem-detector
writes ``False`` with its default reason, or the condition goes) and no failures keep the node
suspect, the suspicion is cleared. The conditions are read from the Node at each review (the
assess-nodes PingSource, every minute), so a condition counts within a minute.

A suspect node gets a label and a ``PreferNoSchedule`` taint (never ``NoSchedule`` or
``NoExecute``; blame never drains a node): soft signals, so a cluster with no other room still
schedules there. Suspicion expires when the window passes without a new failure there, and at
most ``suspect_max_share`` of the schedulable nodes are suspect at once: a cluster-wide outage,
or two workloads broken everywhere, must not mark every node. Nodes carrying the opt-out label
are never marked.

update-annotations marks a node it moves a pod off (``shared.api.movedoff``) and nobody else
removes the mark: the review removes one whose window passed, in the patch it writes anyway or
in a patch of that one label, on an opted-out node too (the label is ours).

Everything here is pure: the Node as read, the event, the clock and the settings in; the
decision, with its reasons, and the request bodies out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from shared.api import movedoff
from shared.api.keys import (
    EVENT_POD_EXHAUSTED,
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    FAILING_WORKLOADS_LABEL,
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    NODE_OPT_OUT_LABEL,
    SUSPECT_LABEL,
    SUSPECT_TAINT_EFFECT,
    SUSPECT_VALUE,
    opted_out,
)
from shared.api.nodehealth import NodeHealth, Seen, load
from shared.api.times import format_duration, format_time, parse_time
from shared.api.workloadid import family, workload_id
from shared.platform.config import Config

# The pipeline's events that count as evidence against the node a pod failed on.
BLAME_EVENT_TYPES: Final = frozenset(
    {EVENT_POD_FAILING, EVENT_POD_RESCHEDULED, EVENT_POD_EXHAUSTED}
)
# Only failures the full rules judged another node could fix blame the node (not
# "unschedulable because of our exclusions", not an early report or move for the fast path):
# the ``kind`` of a pod.failing report, and of the reply after its move.
_NODE_FIXABLE: Final = "node-fixable"


# A condition's message can be a log excerpt of several lines (node-problem-detector puts the
# matched kernel log lines there): Events and the record say this much of it.
MESSAGE_SHOWN: Final = 200


@dataclass(frozen=True)
class Problem:
    """A condition the Node reports ``True``, as node-problem-detector or the kubelet writes it
    (type, reason, message, lastTransitionTime)."""

    type: str
    reason: str
    message: str
    since: datetime | None

    def describe(self) -> str:
        said = ": ".join(x for x in (self.reason, _shortened(self.message)) if x)
        return f"{self.type}=True" + (f" ({said})" if said else "")


def _shortened(text: str) -> str:
    one_line = " ".join(text.split())
    if len(one_line) <= MESSAGE_SHOWN:
        return one_line
    return one_line[: MESSAGE_SHOWN - 3] + "..."


def _problems(node: Mapping[str, Any]) -> tuple[Problem, ...]:
    """Every condition of the Node whose status is ``True``, in the order the Node lists them."""
    found: list[Problem] = []
    for condition in (node.get("status") or {}).get("conditions") or []:
        if not isinstance(condition, dict) or condition.get("status") != "True":
            continue
        kind = condition.get("type")
        if not isinstance(kind, str) or not kind:
            continue
        since: datetime | None = None
        try:
            since = parse_time(condition.get("lastTransitionTime"))
        except ValueError:
            since = None  # unreadable or missing: the reviewer's clock is used
        found.append(
            Problem(
                kind, str(condition.get("reason") or ""), str(condition.get("message") or ""), since
            )
        )
    return tuple(found)


def reports_problem(node: Mapping[str, Any], types: frozenset[str]) -> bool:
    """Whether the Node reports one of ``types`` True (the review looks at such nodes too)."""
    return any(p.type in types for p in _problems(node))


class NotEvidence(ValueError):
    """The event is well formed but says nothing against a node (the reason says why)."""


@dataclass(frozen=True)
class Blame:
    """A failure of a workload's pod on a node, as an event reported it."""

    node: str
    workload: str
    pod: str
    reason: str
    at: datetime

    def seen(self) -> Seen:
        return Seen(self.at, self.workload, self.pod, self.reason)


def blame_from_event(event_type: str, data: object, event_time: str | None, now: datetime) -> Blame:
    """The blame an event carries. ValueError: malformed; NotEvidence: nothing to blame.

    The time is the event's own (the CloudEvent ``time`` attribute), so redeliveries and
    reordering give the same record; a missing or unreadable one is now, a future one is now.
    """
    if event_type not in BLAME_EVENT_TYPES:
        raise NotEvidence(f"{event_type} is not a pod failure report")
    if not isinstance(data, dict):
        raise ValueError("event data must be a JSON object")
    namespace, uid, reason = data.get("namespace"), data.get("uid"), data.get("reason")
    for key, value in (("namespace", namespace), ("uid", uid), ("reason", reason)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"event data needs a non-empty string {key!r}")
    node = data.get("node")
    if node is not None and not isinstance(node, str):
        raise ValueError("node must be a string")
    if not node:
        raise NotEvidence("the pod never reached a node")
    kind = data.get("kind")
    if event_type != EVENT_POD_FAILING and kind is None:
        raise NotEvidence(
            "a move reported without its kind may be a fast-path one; a threshold move's "
            "pod.failing report counted already"
        )
    if kind != _NODE_FIXABLE:
        raise NotEvidence(f"a {kind} report is no evidence against the node")
    if event_type == EVENT_POD_FAILING:
        workload = _workload_of_failing(data, str(namespace))
    else:
        workload = _workload_of_outcome(data, str(namespace))
    at = now
    if event_time:
        try:
            at = min(parse_time(event_time), now)
        except ValueError:
            at = now
    return Blame(node, workload, str(uid), str(reason), at)


def _workload_of_failing(data: Mapping[str, Any], namespace: str) -> str:
    owners = data.get("ownerReferences") or []
    if not isinstance(owners, list):
        raise ValueError("ownerReferences must be a list")
    for owner in owners:
        if isinstance(owner, dict) and owner.get("controller") is True:
            kind, name = owner.get("kind"), owner.get("name")
            if isinstance(kind, str) and kind and isinstance(name, str) and name:
                return workload_id(kind, namespace, name)
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("event data needs the pod's name")
    return workload_id("Pod", namespace, name)


def _workload_of_outcome(data: Mapping[str, Any], namespace: str) -> str:
    """The top-level workload a reply names; the holder for a reply from before it did."""
    field = "topWorkload" if data.get("topWorkload") is not None else "workload"
    workload = data.get(field)
    if not isinstance(workload, dict):
        raise ValueError(f"event data needs the {field}")
    kind, name = workload.get("kind"), workload.get("name")
    if not (isinstance(kind, str) and kind and isinstance(name, str) and name):
        raise ValueError(f"the {field} needs a kind and a name")
    return workload_id(kind, namespace, name)


@dataclass(frozen=True)
class NodeFacts:
    """What the decisions need of a Node, read from the object the API server returned."""

    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...]
    record_raw: str | None
    record: NodeHealth
    schedulable: bool
    # Every condition the Node reports True (which of them count is a setting: problems()).
    conditions: tuple[Problem, ...] = ()

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> NodeFacts:
        """RecordError when the node-health annotation cannot be read."""
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        raw = (meta.get("annotations") or {}).get(NODE_HEALTH_ANNOTATION)
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            labels=dict(meta.get("labels") or {}),
            taints=tuple(dict(t) for t in spec.get("taints") or [] if isinstance(t, dict)),
            record_raw=raw,
            record=load(raw),
            schedulable=not spec.get("unschedulable", False),
            conditions=_problems(node),
        )

    def problems(self, types: frozenset[str]) -> tuple[Problem, ...]:
        """The conditions of ``types`` the Node reports True: evidence against it."""
        return tuple(p for p in self.conditions if p.type in types)

    @property
    def opted_out(self) -> bool:
        return opted_out(self.labels)

    @property
    def labelled(self) -> bool:
        return self.labels.get(SUSPECT_LABEL) == SUSPECT_VALUE

    @property
    def failing_label(self) -> str | None:
        return self.labels.get(FAILING_WORKLOADS_LABEL)

    @property
    def tainted(self) -> bool:
        return any(_is_our_taint(t) for t in self.taints)


def _is_our_taint(taint: Mapping[str, Any]) -> bool:
    return taint.get("key") == SUSPECT_LABEL and taint.get("effect") == SUSPECT_TAINT_EFFECT


class Verdict(StrEnum):
    # Enough distinct workloads failed here: mark it (if the cap allows).
    MARK = "mark"
    # Suspect, and failures keep coming: stays suspect.
    STAYS = "stays"
    # Suspect, but the window passed without a new failure (or the node opted out): clear it.
    CLEAR = "clear"
    # Not suspect and not enough evidence (or opted out): nothing to mark.
    HEALTHY = "healthy"


@dataclass(frozen=True)
class Assessment:
    verdict: Verdict
    # The record to write when the verdict is carried out (MARK: already marked suspect).
    record: NodeHealth
    # The distinct top-level workloads that failed here inside the window, each with its latest
    # report's name and reason.
    workloads: tuple[tuple[str, str], ...]
    why: str
    # The conditions of the configured set the Node reports True.
    problems: tuple[Problem, ...] = ()

    @property
    def evidence(self) -> int:
        """How much speaks against the node: the cap ranks nodes by it."""
        return len(self.workloads) + len(self.problems)

    @property
    def suspect(self) -> bool:
        return self.verdict in (Verdict.MARK, Verdict.STAYS)

    def failing_label(self, node: NodeFacts) -> str | None:
        """The failing-workloads label the node should carry: the number of distinct workloads
        that failed there within the window; none on a node without any, or opted out."""
        if node.opted_out or not self.workloads:
            return None
        return str(len(self.workloads))


def assess(node: NodeFacts, blame: Blame | None, now: datetime, cfg: Config) -> Assessment:
    """The node's verdict after ``blame`` (None: only the clock moved, as on a Ping), and the
    conditions it reports."""
    window = cfg.suspect_window
    record = node.record
    if blame is not None and blame.at > now - window:
        record = record.with_failure(blame.seen())
    record = record.pruned(now, window)
    # One entry per top-level workload, named as its newest report names it.
    latest: dict[str, Seen] = {}
    for seen in record.recent(now, window):
        latest[family(seen.workload)] = seen
    workloads = tuple(sorted((s.workload, s.reason) for s in latest.values()))
    names = tuple(w for w, _ in workloads)
    problems = node.problems(cfg.suspect_conditions)
    types = tuple(p.type for p in problems)
    count = f"{len(names)} distinct workload{'s' if len(names) != 1 else ''}"
    span = format_duration(window)
    reports = f"node {node.name} reports {', '.join(p.describe() for p in problems)}"

    def judged(verdict: Verdict, kept: NodeHealth, why: str) -> Assessment:
        return Assessment(verdict, kept, workloads, why, problems)

    if node.opted_out:
        ours = record.suspect or node.labelled or node.tainted or node.failing_label is not None
        verdict = Verdict.CLEAR if ours else None
        why = f"node {node.name} carries the opt-out label {NODE_OPT_OUT_LABEL}"
        return judged(verdict or Verdict.HEALTHY, unmarked(record), why)
    if record.suspect:
        if not names and not problems:
            why = f"no failure on node {node.name} in the last {span}" + (
                " and none of its conditions counted reports a problem now: suspicion expired"
                if record.suspect_conditions
                else ": suspicion expired"
            )
            return judged(Verdict.CLEAR, unmarked(record), why)
        said = [f"{count} failed on node {node.name} in the last {span}"] if names else []
        why = "; ".join([*said, *([reports] if problems else [])])
        kept = replace(record, suspect_workloads=names, suspect_conditions=types)
        return judged(Verdict.STAYS, kept, why)
    by_failures = len(names) >= cfg.suspect_workloads
    if by_failures or problems:
        # The newest evidence: the newest failure, or when a condition turned True (never
        # later than now: a node's clock may run ahead).
        times = [t for t in (record.last_failure(),) if t is not None and by_failures]
        times += [min(p.since, now) if p.since else now for p in problems]
        said = []
        if by_failures:
            said.append(
                f"{count} failed on node {node.name} in the last {span} "
                f"(suspect from {cfg.suspect_workloads})"
            )
        if problems:
            said.append(reports)
        marked = replace(
            record,
            suspect_since=max(times),
            suspect_workloads=names,
            suspect_conditions=types,
        )
        return judged(Verdict.MARK, marked, "; ".join(said))
    why = (
        f"{count} failed on node {node.name} in the last {span}, "
        f"fewer than the {cfg.suspect_workloads} that make it suspect"
    )
    return judged(Verdict.HEALTHY, record, why)


def unmarked(record: NodeHealth) -> NodeHealth:
    """The record without its suspicion (its failures kept)."""
    return replace(record, suspect_since=None, suspect_workloads=(), suspect_conditions=())


# -- the cap -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Standing:
    """A node as the cap ranks it: by its evidence (distinct workloads failed there, and the
    problem conditions it reports), marked ones first on a tie (no churn between equals), then
    by name (every instance ranks alike)."""

    node: str
    workloads: int
    marked: bool
    conditions: int = 0

    def rank(self) -> tuple[int, bool, str]:
        return (-(self.workloads + self.conditions), not self.marked, self.node)

    def describe(self) -> str:
        said = f"{self.workloads} failing workloads"
        if self.conditions:
            said += f", {self.conditions} problem condition{'s' if self.conditions != 1 else ''}"
        return f"node {self.node} ({said})"


def allowed_suspects(schedulable_nodes: int, share: float) -> int:
    """How many nodes may be suspect at once: the share of schedulable nodes, rounded down.
    (A hair of tolerance so that 30 % of 10 is 3, not 2.9999.)"""
    return max(0, math.floor(schedulable_nodes * share + 1e-9))


@dataclass(frozen=True)
class CapDecision:
    mark: bool
    # Suspect nodes that rank below the candidate and must be cleared to make room.
    displaced: tuple[str, ...]
    why: str


def within_cap(candidate: Standing, others: Iterable[Standing], allowed: int) -> CapDecision:
    """May ``candidate`` be marked, given the other suspect nodes and the cap?

    The nodes with the most distinct failing workloads keep the marks: a candidate ranking
    among the first ``allowed`` is marked (displacing the weakest marked node when the cap is
    full); one ranking below them is not, and the message says why.
    """
    marked = [s for s in others if s.marked and s.node != candidate.node]
    ranked = sorted([*marked, candidate], key=Standing.rank)
    kept = {s.node for s in ranked[:allowed]}
    if candidate.node not in kept:
        return CapDecision(
            False,
            (),
            f"{len(marked)} of the schedulable nodes are suspect already, the most "
            f"{allowed} allows; {candidate.describe()} ranks below them and is not marked",
        )
    displaced = tuple(sorted(s.node for s in marked if s.node not in kept))
    why = f"within the cap of {allowed} suspect nodes"
    if displaced:
        why += f"; {', '.join(displaced)} (less evidence) cleared to make room"
    return CapDecision(True, displaced, why)


def over_cap(marked: Sequence[Standing], allowed: int) -> tuple[str, ...]:
    """The marked nodes beyond the cap (two instances marking at once may overshoot it)."""
    ranked = sorted(marked, key=Standing.rank)
    return tuple(s.node for s in ranked[allowed:])


# -- the request ---------------------------------------------------------------------------------


def node_patch(
    node: NodeFacts,
    record: NodeHealth,
    *,
    suspect: bool,
    taint: bool,
    failing: str | None,
    drop_moved_off: bool = False,
) -> dict[str, Any] | None:
    """A merge patch making the Node say what ``record``, ``suspect`` and ``failing`` (the
    failing-workloads label's value, None: no label) say; None when it already does (no write).
    ``drop_moved_off``: also remove the moved-off mark (the review found it expired), so that
    a write the node needs anyway takes it along rather than a second compare-and-swap.

    The resourceVersion makes it a compare-and-swap: the node lifecycle controller and the
    kubelet write taints too, and a merge patch replaces the whole ``spec.taints`` list, so
    a list built from a stale read must not land.
    """
    metadata: dict[str, Any] = {}
    if drop_moved_off and MOVED_OFF_LABEL in node.labels:
        metadata.setdefault("labels", {})[MOVED_OFF_LABEL] = None
    raw = record.to_json()
    if raw != node.record_raw:
        metadata["annotations"] = {NODE_HEALTH_ANNOTATION: raw}
    if suspect and not node.labelled:
        metadata.setdefault("labels", {})[SUSPECT_LABEL] = SUSPECT_VALUE
    if not suspect and SUSPECT_LABEL in node.labels:
        metadata.setdefault("labels", {})[SUSPECT_LABEL] = None
    if failing != node.failing_label:
        metadata.setdefault("labels", {})[FAILING_WORKLOADS_LABEL] = failing
    body: dict[str, Any] = {}
    want_taint = suspect and taint
    if want_taint != node.tainted:
        others = [dict(t) for t in node.taints if not _is_our_taint(t)]
        if want_taint:
            others.append(
                {"key": SUSPECT_LABEL, "value": SUSPECT_VALUE, "effect": SUSPECT_TAINT_EFFECT}
            )
        body["spec"] = {"taints": others}
    if not metadata and not body:
        return None
    metadata["resourceVersion"] = node.resource_version
    body["metadata"] = metadata
    return body


def moved_off_removal(node: NodeFacts) -> dict[str, Any] | None:
    """A merge patch removing the node's moved-off mark and nothing else; None when it carries
    none. For a review that found the mark expired and nothing else to write: ``node_patch``
    would also write the record as the clock pruned it (or an empty one on a node that never
    had one), and on an opted-out node nothing but our own label is ours to write.

    With the resourceVersion, as every write of the Node's labels: update-annotations may have
    marked the node again since it was read, and a fresh mark must not be removed.
    """
    if MOVED_OFF_LABEL not in node.labels:
        return None
    return {
        "metadata": {
            "resourceVersion": node.resource_version,
            "labels": {MOVED_OFF_LABEL: None},
        }
    }


def moved_off_expiry(node: NodeFacts, window: timedelta) -> str:
    """Why the node's moved-off mark (found expired) is removed, for the log."""
    at = movedoff.marked_at(node.labels)
    if at is None:
        raw = node.labels.get(MOVED_OFF_LABEL)
        return f"removed its moved-off mark {MOVED_OFF_LABEL}={raw!r}: not a time"
    return f"removed its moved-off mark of {format_time(at)}: older than {format_duration(window)}"
