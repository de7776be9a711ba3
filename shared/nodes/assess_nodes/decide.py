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

A report is a claim, not evidence: any pod of the cluster can post one to the function's
Service. It counts only once confirmed against the API in the same request (``Claim``, then
``confirm_failing`` / ``confirm_rescheduled`` / ``confirm_exhausted`` over what the handler
read: the live pod, its failure now by the full rules, its holder's state), and what is counted
(workload, reason, a bound on the time) comes from what was read, never from the report
(docs/node-health.md, "What a report must show before it counts").

Only the full rules' verdict is evidence. A fast-path report (``kind: early``: a pod's first
failure) and the fast-path move that follows it on a node already suspect are not: counted,
any one-off crash there would keep the node suspect, and suspicion would feed itself. A move
reported without its ``kind`` (an older update-annotations) is not counted either: it may have
been a fast-path one, and a threshold move's own ``pod.failing`` report counted already. Nor is
any move off a node that is suspect when the reply comes: our record of a move (the state on its
holder) does not say which path made it, and the reply's ``kind`` is the sender's word, so a
re-posted fast-path reply saying ``node-fixable`` would keep the node suspect. A suspect node
stays so on live failures confirmed against their pods only.

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

Everything here is pure: the Node, the pod and the holder as read, the event, the clock and
the settings in; the decision, with its reasons, and the request bodies out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from shared.api import movedoff
from shared.api.barepods import ORIGIN_ANNOTATION, replacement_name
from shared.api.keys import (
    EVENT_POD_EXHAUSTED,
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    FAILING_WORKLOADS_LABEL,
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    NODE_OPT_OUT_LABEL,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
    SUSPECT_TAINT_EFFECT,
    SUSPECT_VALUE,
    opted_out,
)
from shared.api.nodehealth import NodeHealth, Seen, load
from shared.api.state import StateError, WorkloadState, load_state
from shared.api.times import format_duration, format_time, parse_time
from shared.api.workloadid import family, workload_id
from shared.platform.config import Config
from shared.workloads.classify import Failure, FailureKind, controller_of, worth_forwarding
from shared.workloads.owners import Holder
from shared.workloads.state import foreign_copy

# The pipeline's events that count as evidence against the node a pod failed on.
BLAME_EVENT_TYPES: Final = frozenset(
    {EVENT_POD_FAILING, EVENT_POD_RESCHEDULED, EVENT_POD_EXHAUSTED}
)
# Only failures the full rules judged another node could fix blame the node (not
# "unschedulable because of our exclusions", not an early report or move for the fast path):
# the ``kind`` of a pod.failing report, and of the reply after its move.
_NODE_FIXABLE: Final = "node-fixable"
# A bare pod's replacement is named after the first pod of its line and 5 hex digits.
_REPLACEMENT: Final = re.compile(r"^(?P<base>.+)-[0-9a-f]{5}$")


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
    """A failure of a workload's pod on a node, as the API confirmed it (``Confirmed``)."""

    node: str
    workload: str
    pod: str
    reason: str
    at: datetime

    def seen(self) -> Seen:
        return Seen(self.at, self.workload, self.pod, self.reason)


@dataclass(frozen=True)
class Claim:
    """What a report says, unverified. Any pod of the cluster can post a CloudEvent to the
    function's Service, so nothing in it counts until this request has read it back from the
    API (``confirm_failing``, ``confirm_rescheduled``, ``confirm_exhausted``): the claim only
    says where to look.

    ``at`` is the event's own time (the CloudEvent ``time``), never later than now, so
    redeliveries and reordering give the same record; ``holder`` is a reply's ``workload``
    (kind, name), the object update-annotations says it recorded the move on.
    """

    event_type: str
    namespace: str
    name: str
    uid: str
    node: str
    reason: str
    at: datetime
    holder: tuple[str, str] | None = None

    def describe(self) -> str:
        what = self.event_type.rsplit(".", 1)[-1]
        return (
            f"{what} report about pod {shown(self.namespace)}/{shown(self.name)} "
            f"(uid {shown(self.uid)}) on node {shown(self.node)}"
        )


def claim_from_event(event_type: str, data: object, event_time: str | None, now: datetime) -> Claim:
    """What an event claims. ValueError: malformed; NotEvidence: nothing to blame.

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
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("event data needs the pod's name")
    holder: tuple[str, str] | None = None
    if event_type != EVENT_POD_FAILING:
        workload = data.get("workload")
        if not isinstance(workload, dict):
            raise ValueError("event data needs the workload")
        holder_kind, holder_name = workload.get("kind"), workload.get("name")
        if not (
            isinstance(holder_kind, str)
            and holder_kind
            and isinstance(holder_name, str)
            and holder_name
        ):
            raise ValueError("the workload needs a kind and a name")
        holder = (holder_kind, holder_name)
    at = now
    if event_time:
        try:
            at = min(parse_time(event_time), now)
        except ValueError:
            at = now
    return Claim(event_type, str(namespace), name, str(uid), node, str(reason), at, holder)


# -- what a report must show before it counts -----------------------------------------------------

# The objects update-annotations keeps a state on: the holders a reply may name.
HOLDER_KINDS: Final = frozenset({"ReplicaSet", "StatefulSet", "Job", "Pod"})
# The longest piece of a report quoted in a log line or a record (a forged report may carry
# anything).
SAID_MAX: Final = 128


def shown(text: str) -> str:
    """A piece of a report, bounded and on one line, for messages."""
    one_line = " ".join(str(text).split())
    return one_line if len(one_line) <= SAID_MAX else one_line[: SAID_MAX - 3] + "..."


@dataclass(frozen=True)
class Confirmed:
    """The report holds: ``blame`` is what the API showed (never the report's own words)."""

    blame: Blame
    why: str


@dataclass(frozen=True)
class Unconfirmed:
    """The report is not counted: ``why`` says what did not hold. ``warning``: the API
    contradicts the report (another pod, another node, no such record), which a report the
    pipeline sent does not do; otherwise the ordinary races (the pod moved or healed since)."""

    why: str
    warning: bool = False


Confirmation = Confirmed | Unconfirmed


@dataclass(frozen=True)
class Record:
    """A holder's state as read for a confirmation: ``holder`` names the object read,
    ``workload`` the top-level workload counted (the holder's own controller as its
    ownerReference names it, a ReplicaSet's Deployment, or the holder itself); ``state`` is
    None when it cannot be taken as the holder's own (``unreadable`` says why)."""

    holder: str
    workload: str
    state: WorkloadState | None
    unreadable: str = ""


def record_of(holder: Holder) -> Record:
    """The state ``holder`` carries, as a confirmation reads it: a state that cannot be read,
    or a copy of another object's (``shared.workloads.state.foreign_copy``), records nothing
    for it."""
    ref = holder.ref
    top = holder.controller or ref
    named = workload_id(ref.kind, ref.namespace, ref.name)
    workload = workload_id(top.kind, top.namespace or ref.namespace, top.name)
    try:
        state = load_state(holder.annotations.get(STATE_ANNOTATION))
    except StateError as exc:
        return Record(named, workload, None, f"its state cannot be read: {exc}")
    copied = foreign_copy(state, ref.kind, ref.uid)
    if copied is not None:
        return Record(named, workload, None, f"its state is not its own: {copied}")
    return Record(named, workload, state)


def workload_of_pod(pod: Mapping[str, Any]) -> str:
    """The workload a live pod's failure is counted for: its controller as its own
    ownerReference names it (``workload_id``; ``family`` groups a Deployment's ReplicaSets),
    or the pod itself."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    owner = controller_of(pod)  # type: ignore[arg-type]
    if owner is not None and owner.get("kind") and owner.get("name"):
        return workload_id(str(owner["kind"]), namespace, str(owner["name"]))
    return workload_id("Pod", namespace, str(meta.get("name", "")))


def pod_contradicts(claim: Claim, pod: Mapping[str, Any] | None, cfg: Config) -> Unconfirmed | None:
    """What the live pod (None: there is none) says against the report's pod: another pod of
    that name, another node, a pod not opted in; None when it is the report's pod."""
    said = claim.describe()
    if pod is None:
        return Unconfirmed(f"{said}: there is no such pod")
    meta = pod.get("metadata") or {}
    if meta.get("uid") != claim.uid:
        return Unconfirmed(
            f"{said}: the pod of that name is another one (uid {shown(str(meta.get('uid')))})",
            warning=True,
        )
    node = (pod.get("spec") or {}).get("nodeName")
    if node != claim.node:
        where = f"on node {shown(str(node))}" if node else "bound to no node"
        return Unconfirmed(f"{said}: the pod is {where}", warning=True)
    if not worth_forwarding(pod, cfg):  # type: ignore[arg-type]
        return Unconfirmed(f"{said}: the pod is not opted in", warning=True)
    return None


def failure_contradicts(
    claim: Claim, failure: Failure | None, unread: str = ""
) -> Unconfirmed | None:
    """Whether the pod's failure now, by the full rules on what was read (``unread``: what
    could not be read beside the pod), is the node-fixable failure on the report's node."""
    said = claim.describe()
    if failure is None:
        also = f" ({unread})" if unread else ""
        return Unconfirmed(f"{said}: the pod is not failing now by the full rules{also}")
    if failure.kind is not FailureKind.NODE_FIXABLE:
        return Unconfirmed(f"{said}: the pod's failure now is {failure.kind}, not node-fixable")
    if failure.node != claim.node:
        return Unconfirmed(
            f"{said}: the pod fails on node {shown(str(failure.node))} now", warning=True
        )
    return None


def _exhausted(state: WorkloadState, pod_name: str) -> bool:
    return state.exhausted_recorded or state.entry(pod_name).exhausted_recorded


def _no_later_than_record(claim: Claim, state: WorkloadState) -> datetime | None:
    """The report's time, never later than our own last write of the state (a replayed
    reply cannot refresh the node's record beyond it); None when the state does not say."""
    if state.updated_at is None:
        return None
    return min(claim.at, state.updated_at)


def confirm_failing(
    claim: Claim,
    pod: Mapping[str, Any] | None,
    failure: Failure | None,
    record: Record,
    cfg: Config,
    *,
    unread: str = "",
) -> Confirmation:
    """A ``pod.failing`` report counts when its pod is there, the same pod (uid) on the same
    node, opted in, failing now in a way another node could fix, and its workload's state does
    not say it was stopped or ran out of budget: those failures were counted when the moves
    and the exhaustion were reported, and the sweep re-sends such a pod every 5 minutes."""
    found = pod_contradicts(claim, pod, cfg) or failure_contradicts(claim, failure, unread)
    if found is not None:
        return found
    assert pod is not None and failure is not None
    said = claim.describe()
    state = record.state
    if state is None:
        return Unconfirmed(f"{said}: {record.holder}: {record.unreadable}", warning=True)
    if state.stopped is not None:
        return Unconfirmed(
            f"{said}: {record.holder} was stopped ({shown(state.stopped.reason)} on every "
            "node): not new evidence, its failures were counted when its moves were reported"
        )
    if _exhausted(state, claim.name):
        return Unconfirmed(
            f"{said}: {record.holder} ran out of its budget: not new evidence, its failures "
            "were counted when its moves and its exhaustion were reported"
        )
    blame = Blame(claim.node, workload_of_pod(pod), claim.uid, failure.reason, claim.at)
    return Confirmed(blame, f"{said}: failing now ({failure.reason})")


def follows_workload(claim: Claim, why: str) -> Unconfirmed:
    """A failure that may follow its workload rather than its node
    (``everywhere.follows_its_workload``, ``moves_follow_the_workload``) is no evidence against
    the node: an application broken everywhere would make every node it meets suspect."""
    return Unconfirmed(f"{claim.describe()}: {why}: no evidence against node {claim.node}")


def failed_before(
    state: WorkloadState | None, pod_name: str, now: datetime, reset_after: timedelta
) -> tuple[str, ...] | None:
    """The nodes a workload's state says it failed on, as ``follows_its_workload`` takes them:
    a StatefulSet pod's own entry (its budget is per pod), else the workload's ``failedOn``;
    empty once older than ``reset_after`` (update-annotations' pruning would drop it, and a
    stale record must not excuse a node failing this workload today). None: no state known."""
    if state is None:
        return None
    entry = state.per_pod.get(pod_name)
    if entry is not None:
        fresh = entry.updated_at is not None and now - entry.updated_at <= reset_after
        return entry.excluded_nodes if fresh else ()
    fresh = state.updated_at is not None and now - state.updated_at <= reset_after
    return tuple(state.failed_on) if fresh else ()


def selector_of(holder: Mapping[str, Any]) -> str | None:
    """The label selector of a holder's pods, from its ``spec.selector.matchLabels`` (None
    when it selects otherwise: its pods are then not read, and nothing proves them healthy)."""
    selector = (holder.get("spec") or {}).get("selector") or {}
    labels = selector.get("matchLabels") or {}
    if not labels or selector.get("matchExpressions"):
        return None
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def confirm_exhausted(
    claim: Claim,
    pod: Mapping[str, Any] | None,
    failure: Failure | None,
    record: Record,
    cfg: Config,
    *,
    unread: str = "",
) -> Confirmation:
    """A ``pod.exhausted`` reply counts when its pod is there and failing now as for a
    ``pod.failing`` report, and its holder's state records the exhausted budget; its time is
    never later than that state's last write."""
    found = pod_contradicts(claim, pod, cfg) or failure_contradicts(claim, failure, unread)
    if found is not None:
        return found
    assert failure is not None
    said = claim.describe()
    state = record.state
    if state is None:
        return Unconfirmed(f"{said}: {record.holder}: {record.unreadable}", warning=True)
    if not _exhausted(state, claim.name):
        return Unconfirmed(f"{said}: {record.holder} records no exhausted budget", warning=True)
    at = _no_later_than_record(claim, state)
    if at is None:
        return Unconfirmed(f"{said}: {record.holder}'s state does not say when it was written")
    blame = Blame(claim.node, record.workload, claim.uid, failure.reason, at)
    return Confirmed(blame, f"{said}: {record.holder} records its exhausted budget")


def move_off_suspect(claim: Claim, node: Mapping[str, Any] | None) -> Unconfirmed | None:
    """A ``pod.rescheduled`` reply about a node that is suspect now is not counted: the move
    may have been the suspect fast path's, which no record of ours tells from a threshold
    move. None: the node is not suspect (or gone: nothing will be recorded on it anyway)."""
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(SUSPECT_LABEL) != SUSPECT_VALUE:
        return None
    return Unconfirmed(
        f"{claim.describe()}: node {claim.node} is suspect, and a move off it may be the fast "
        "path's (the reply's kind is the sender's word): only live failures count there"
    )


def confirm_rescheduled(claim: Claim, record: Record) -> Confirmation:
    """A ``pod.rescheduled`` reply counts when the holder it names records the move: the pod's
    uid among the pods it moved (``handled``) and the node among the nodes it failed on
    (``failedOn``) or excluded (the workload's, or the pod's own entry of a StatefulSet). Its
    time is never later than the state's last write: a replay of an old real reply cannot date
    a failure later than our own record.

    What it cannot bound: the state dates its last write, not each move. A replay of an older
    real reply after a later write (a move off another node) is dated by that write, so a node
    the workload really failed on within ``reset-after`` can be counted again as of it. A time
    per node in ``failedOn`` would close that; counting only the latest move would instead lose
    replies delivered out of order, which must give the same record.
    """
    said = claim.describe()
    state = record.state
    if state is None:
        return Unconfirmed(f"{said}: {record.holder}: {record.unreadable}", warning=True)
    if claim.uid not in state.handled:
        return Unconfirmed(f"{said}: {record.holder} records no move of that pod", warning=True)
    excluded = (*state.excluded_nodes, *state.entry(claim.name).excluded_nodes)
    if claim.node not in state.failed_on and claim.node not in excluded:
        return Unconfirmed(f"{said}: {record.holder} records no failure on that node", warning=True)
    at = _no_later_than_record(claim, state)
    if at is None:
        return Unconfirmed(f"{said}: {record.holder}'s state does not say when it was written")
    reason = state.failed_on.get(claim.node) or shown(claim.reason)
    blame = Blame(claim.node, record.workload, claim.uid, reason, at)
    return Confirmed(blame, f"{said}: {record.holder} records the move")


def replacement_candidates(claim: Claim) -> tuple[str, ...]:
    """Where a bare pod's move is recorded: its replacement, whose name update-annotations
    derives from the first pod of the line and the uid of the pod replaced
    (``shared.api.barepods``). The reply does not say the first pod's name: the pod's own,
    and, for a name that looks like a replacement's, the name it was derived from."""
    names = [replacement_name({"metadata": {"name": claim.name, "uid": claim.uid}})]
    found = _REPLACEMENT.match(claim.name)
    if found is not None:
        origin = found.group("base")
        names.append(
            replacement_name(
                {
                    "metadata": {
                        "name": claim.name,
                        "uid": claim.uid,
                        "annotations": {ORIGIN_ANNOTATION: origin},
                    }
                }
            )
        )
    return tuple(dict.fromkeys(names))


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
        return any(is_our_taint(t) for t in self.taints)


def is_our_taint(taint: Mapping[str, Any]) -> bool:
    """The suspect taint: our key with PreferNoSchedule (the same key with another effect is
    someone else's)."""
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
        others = [dict(t) for t in node.taints if not is_our_taint(t)]
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
