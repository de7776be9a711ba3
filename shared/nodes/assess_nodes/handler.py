"""assess-nodes: pod failure reports in, node health records, suspect marks and Events out.

The I/O around ``shared.nodes.assess_nodes.decide``'s decisions:

- a failure report (``io.kn-rescheduler.pod.failing`` / ``.rescheduled`` / ``.exhausted``)
  is added to the failing node's record with a resourceVersion compare-and-swap (a conflict
  reads the Node again and decides again). When the node turns suspect, the cap is checked
  against a list of the nodes, the label, taint and record are written in one patch, a
  ``NodeSuspected`` Warning is recorded on the Node and the reply
  ``io.kn-rescheduler.node.suspected`` goes back to the Broker;
- a Ping (the PingSource, or the local stack's timer) reviews every node with a record, our
  marks, or a problem condition of the configured set reported True: suspicions whose window
  passed (and whose conditions cleared) are cleared (``NodeCleared``), a node reporting a problem
  condition is marked, and a node the cap held back is marked once room is free. Expiry
  therefore does not wait for a failure event that may never come. A moved-off mark
  (``shared.api.movedoff``, update-annotations') whose window passed is removed too: it steers
  nothing any more, and nobody else removes it.

Two instances marking two nodes at once may both see room under the cap; after marking, each
lists the suspect nodes again and takes its own mark back if it ranks beyond the cap, so the
cap holds once both are done (and both rank alike: the ranking is deterministic).

A report is a claim: any pod of the cluster can post a CloudEvent to the function's Service.
So before a report is added to a record it is confirmed against the API in this request
(verify, then act; the decisions are ``decide.confirm_*``, pure): the live pod of a
``pod.failing`` or ``.exhausted`` report (one GET; the pod's Warning Events and its siblings,
two LISTs, only when its status alone does not show the failure) and its holder's state
(``shared.workloads.owners.resolve``: one GET, two for a Job under a CronJob); for a
``pod.rescheduled`` reply, the holder it names (one GET; for a bare pod, its replacement). What
is counted, the workload, the reason and a bound on the time, comes from what was read, never
from the report. A report that does not hold is answered 202 and logged saying why.

Answers follow the pipeline's rules: 202 for nothing to do (not evidence, not confirmed, node
gone, nothing changed), 400 for a malformed report, 503 (Transient) when the API is unreachable
or the compare-and-swap keeps losing, 500 for a record we cannot read (a person must look). A
report the API could not confirm for another reason (403: RBAC) is logged and not counted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from shared.api import movedoff
from shared.api.keys import (
    EVENT_NODE_SUSPECTED,
    EVENT_POD_EXHAUSTED,
    EVENT_POD_RESCHEDULED,
    FAILING_WORKLOADS_LABEL,
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    PING_EVENT_TYPE,
    REASON_NODE_CLEARED,
    REASON_NODE_SUSPECTED,
    REASON_SUSPECT_CAP_REACHED,
    SUSPECT_LABEL,
)
from shared.api.kubetypes import Pod
from shared.api.records import RecordError
from shared.api.times import format_duration, format_time
from shared.api.workloadid import family
from shared.nodes.assess_nodes import decide
from shared.nodes.assess_nodes.decide import (
    Assessment,
    Blame,
    CapDecision,
    Claim,
    Confirmation,
    Confirmed,
    NodeFacts,
    NotEvidence,
    Record,
    Standing,
    Unconfirmed,
    Verdict,
)
from shared.platform import events, kube
from shared.platform.config import Config
from shared.platform.recorder import Involved, Recorder
from shared.platform.ticks import TickGate
from shared.workloads.classify import Failure, classify, controller_of, still_starting
from shared.workloads.everywhere import (
    elsewhere_nodes,
    follows_its_workload,
    moves_follow_the_workload,
    reply_elsewhere_nodes,
)
from shared.workloads.evidence import failing_now, read_evidence
from shared.workloads.fastpath import speaks_against_itself
from shared.workloads.owners import BARE, STATEFUL, holder_of, resolve
from shared.workloads.siblings import sibling_selector

log = logging.getLogger(__name__)

# Compare-and-swap rounds on one Node before answering 503 (the Broker redelivers).
MAX_ATTEMPTS: Final = 10
# Nodes read, at most, to tell several bad nodes from an application broken everywhere: one
# GET each, only for a report the rule would otherwise not count.
MAX_ELSEWHERE_READS: Final = 3
# Nodes whose writer lock an instance keeps (forgotten all at once beyond: a lock forgotten
# while held only lets two writers race, which the compare-and-swap settles).
NODE_LOCKS_MAX: Final = 10_000


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Outcome:
    """What one node's assessment led to, for the reply and the log."""

    node: str
    uid: str
    verdict: Verdict
    marked: bool
    written: bool
    assessment: Assessment
    cap: CapDecision | None = None
    # The review removed the node's expired moved-off mark in this outcome's write: why
    # (empty: it did not).
    moved_off: str = ""


class Assessor:
    def __init__(
        self, api: kube.Kube, cfg: Config, *, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self.api = api
        self.cfg = cfg
        self.clock = clock
        # One writer per Node within this instance. When a node breaks under many pods, their
        # reports arrive at once; racing each other's compare-and-swap, most of each round's
        # writes lost and were read and tried again (p90 1.4 s per report, and the other nodes'
        # first reports waited behind them: 13 s for the second node of a burst).
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # A review reads every Node: at most one per min_tick_interval (shared.platform.ticks).
        self._ticks = TickGate(cfg.min_tick_interval)

    def _node_lock(self, name: str) -> threading.Lock:
        with self._locks_guard:
            lock = self._locks.get(name)
            if lock is None:
                if len(self._locks) >= NODE_LOCKS_MAX:
                    self._locks.clear()
                lock = self._locks[name] = threading.Lock()
            return lock

    # -- entry point --------------------------------------------------------------------------

    def handle(self, event: events.Event) -> events.Reply | None:
        if event.type == PING_EVENT_TYPE:
            self._ticks.run(self.review)
            return None
        now = self.clock()
        try:
            claim = decide.claim_from_event(
                event.type, event.data, event.attributes.get("time"), now
            )
        except NotEvidence as why:
            log.info("not evidence against a node: %s", why)
            return None
        except ValueError as exc:
            raise events.BadEvent(str(exc)) from exc
        confirmation = self.confirm(claim, now)
        if isinstance(confirmation, Unconfirmed):
            log.log(
                logging.WARNING if confirmation.warning else logging.INFO,
                "not counted: %s",
                confirmation.why,
                extra={"node": claim.node, "confirmed": False},
            )
            return None
        log.info("confirmed: %s", confirmation.why, extra={"node": claim.node, "confirmed": True})
        outcome = self.blame(confirmation.blame)
        if outcome is None or not (outcome.marked and outcome.verdict is Verdict.MARK):
            return None
        return self._suspected_reply(outcome)

    # -- confirming a report against the API ----------------------------------------------------

    def confirm(self, claim: Claim, now: datetime) -> Confirmation:
        """What the API shows of ``claim``, read once per object in this request.

        kube.Transient (5xx, timeouts) is raised: the Broker redelivers. Any other API error
        (403: RBAC; a name the API server refuses) leaves the report unconfirmed, logged."""
        try:
            if claim.event_type == EVENT_POD_RESCHEDULED:
                return self._confirm_move(claim)
            return self._confirm_live(claim, now)
        except kube.Transient:
            raise
        except kube.NotFound as exc:
            return Unconfirmed(f"{claim.describe()}: not found ({decide.shown(str(exc))})")
        except kube.KubeError as exc:
            said = f"HTTP {exc.status}: {decide.shown(str(exc))}"
            return Unconfirmed(f"{claim.describe()}: could not be read ({said})", warning=True)

    def _confirm_live(self, claim: Claim, now: datetime) -> Confirmation:
        """``pod.failing`` and ``pod.exhausted``: the pod is there, failing now, and its
        holder's state says what the report needs."""
        try:
            pod: dict[str, Any] | None = self.api.get("Pod", claim.namespace, claim.name)
        except kube.NotFound:
            pod = None
        wrong = decide.pod_contradicts(claim, pod, self.cfg)
        if wrong is not None:
            return wrong
        assert pod is not None
        failure, unread = self._failure(pod, claim.node, now)
        wrong = decide.failure_contradicts(claim, failure, unread)
        if wrong is not None:
            return wrong
        resolution = resolve(self.api, claim.namespace, pod)
        if resolution.holder is None:
            return Unconfirmed(f"{claim.describe()}: no state of ours: {resolution.why}")
        record = decide.record_of(resolution.holder)
        confirm = (
            decide.confirm_exhausted
            if claim.event_type == EVENT_POD_EXHAUSTED
            else decide.confirm_failing
        )
        confirmed = confirm(claim, pod, failure, record, self.cfg, unread=unread)
        if not isinstance(confirmed, Confirmed) or claim.event_type == EVENT_POD_EXHAUSTED:
            return confirmed
        selector = sibling_selector(pod) if controller_of(pod) else None  # type: ignore[arg-type]
        siblings = (
            list(self.api.list_all("Pod", claim.namespace, label_selector=selector))
            if selector
            else []
        )
        # Our own record of where the workload failed before: a twin moved off another node
        # moments ago is gone from the LIST, and this pod, admitted before, has no stamp.
        before = decide.failed_before(record.state, claim.name, now, self.cfg.reset_after)
        live: Pod = pod  # type: ignore[assignment]
        why = follows_its_workload(live, siblings, self.cfg, now, failed_before=before)
        if why is None:
            return confirmed
        # Failing elsewhere only on nodes that are bad themselves is several bad nodes, not an
        # application broken everywhere: this node is still to blame.
        nodes = elsewhere_nodes(live, siblings, self.cfg, now, failed_before=before)
        implicated = self._implicated(nodes, decide.workload_of_pod(pod), now)
        why = follows_its_workload(
            live, siblings, self.cfg, now, failed_before=before, implicated=implicated
        )
        return confirmed if why is None else decide.follows_workload(claim, why)

    def _implicated(self, nodes: Sequence[str], workload: str, now: datetime) -> dict[str, str]:
        """Of ``nodes`` (the first few), those that speak against themselves for a workload
        other than ``workload``: suspect, or their record names another workload. A node that
        cannot be read is not: in doubt, the failure elsewhere stands and nothing is counted."""
        found: dict[str, str] = {}
        for name in nodes[:MAX_ELSEWHERE_READS]:
            try:
                node = self.api.get("Node", None, name)
            except kube.Transient:
                raise
            except kube.KubeError:
                continue
            why = speaks_against_itself(node, family(workload), self.cfg, now)
            if why is not None:
                found[name] = why
        return found

    def _failure(self, pod: dict[str, Any], node: str, now: datetime) -> tuple[Failure | None, str]:
        """The pod's failure by the full rules, and what could not be read beside it. Its
        status first; its Warning Events and its siblings (LISTs) only when the status alone
        shows nothing and the pod is still starting on ``node`` (the only stage that evidence
        judges: a report naming a running pod costs no LIST). A transient error reading them
        is raised (503), not taken as "healthy"."""
        failure = classify(pod, self.cfg, now)  # type: ignore[arg-type]
        if failure is not None:
            return failure, ""
        if not still_starting(pod, node, self.cfg):  # type: ignore[arg-type]
            return None, ""
        evidence = read_evidence(self.api, pod, siblings=True)  # type: ignore[arg-type]
        return failing_now(pod, self.cfg, now, evidence), evidence.unread  # type: ignore[arg-type]

    def _confirm_move(self, claim: Claim) -> Confirmation:
        """``pod.rescheduled``: the pod is gone; the holder the reply names must record the
        move (a bare pod's state went with it to its replacement)."""
        assert claim.holder is not None
        try:
            node: Mapping[str, Any] | None = self.api.get("Node", None, claim.node)
        except kube.NotFound:
            node = None
        suspect = decide.move_off_suspect(claim, node)
        if suspect is not None:
            return suspect
        kind, name = claim.holder
        if kind not in decide.HOLDER_KINDS:
            return Unconfirmed(
                f"{claim.describe()}: a {decide.shown(kind)} holds no state of ours", warning=True
            )
        record: Record | None = None
        if kind == BARE:
            for candidate in decide.replacement_candidates(claim):
                try:
                    replacement = self.api.get("Pod", claim.namespace, candidate)
                except kube.NotFound:
                    continue
                record = decide.record_of(holder_of(BARE, replacement))
                break
            if record is None:
                return Unconfirmed(f"{claim.describe()}: the pod has no replacement of ours")
        else:
            obj = self.api.get(kind, claim.namespace, name)
            record = decide.record_of(holder_of(kind, obj))
        confirmed = decide.confirm_rescheduled(claim, record)
        state = record.state
        if not isinstance(confirmed, Confirmed) or state is None or kind == BARE:
            return confirmed
        now = self.clock()
        before = decide.failed_before(state, claim.name, now, self.cfg.reset_after) or ()
        selector = decide.selector_of(obj) if kind != STATEFUL else None
        # A StatefulSet pod's identity is its own: another ordinal proves nothing for it.
        pods = (
            list(self.api.list_all("Pod", claim.namespace, label_selector=selector))
            if selector
            else []
        )
        uid = str((obj.get("metadata") or {}).get("uid") or "") or None
        why = moves_follow_the_workload(before, claim.node, pods, self.cfg, now, holder_uid=uid)
        if why is None:
            return confirmed
        nodes = reply_elsewhere_nodes(before, claim.node, pods, self.cfg, now, holder_uid=uid)
        implicated = self._implicated(nodes, record.workload, now)
        why = moves_follow_the_workload(
            before, claim.node, pods, self.cfg, now, holder_uid=uid, implicated=implicated
        )
        return confirmed if why is None else decide.follows_workload(claim, why)

    # -- one failure ------------------------------------------------------------------------------

    def blame(self, blame: Blame) -> Outcome | None:
        """Add ``blame`` to its node's record and act on the verdict; None if the node is gone."""
        with self._node_lock(blame.node):
            return self._blame(blame)

    def _blame(self, blame: Blame) -> Outcome | None:
        for _ in range(MAX_ATTEMPTS):
            try:
                node = self.api.get("Node", None, blame.node)
            except kube.NotFound:
                log.info("node %s is gone: nothing to record", blame.node)
                return None
            try:
                outcome = self._settle(self._facts(node), blame, None)
            except kube.Conflict:
                continue
            self._tell(outcome)
            return outcome
        raise kube.Transient(f"node {blame.node} kept changing: gave up after {MAX_ATTEMPTS} tries")

    # -- the Ping -------------------------------------------------------------------------------

    def review(self) -> list[Outcome]:
        """Expire old suspicions, mark nodes the cap held back and remove expired moved-off
        marks, across the cluster."""
        nodes = list(self.api.list_all("Node"))
        outcomes: list[Outcome] = []
        for node in nodes:
            meta = node.get("metadata") or {}
            labels = meta.get("labels") or {}
            # A node with nothing of ours is skipped. A moved-off mark is ours (on a node
            # assess-nodes never blamed, or opted out, too): it is looked at to be removed once
            # expired, as nobody else removes it.
            if (
                NODE_HEALTH_ANNOTATION not in (meta.get("annotations") or {})
                and SUSPECT_LABEL not in labels
                and FAILING_WORKLOADS_LABEL not in labels
                and MOVED_OFF_LABEL not in labels
                and not decide.reports_problem(node, self.cfg.suspect_conditions)
            ):
                continue
            name = str(meta.get("name", ""))
            try:
                outcome = self._review_one(node, nodes)
            except events.MustNotAct as exc:
                # One unreadable record must not stop the review of the others.
                log.error("%s; left alone", exc)
                continue
            except kube.Transient as exc:
                log.warning("node %s: %s; next review", name, exc)
                continue
            if outcome is not None:
                self._tell(outcome)
                outcomes.append(outcome)
        return outcomes

    def _review_one(
        self, node: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]
    ) -> Outcome | None:
        name = str((node.get("metadata") or {}).get("name", ""))
        for attempt in range(MAX_ATTEMPTS):
            if attempt:
                try:
                    node = self.api.get("Node", None, name)
                except kube.NotFound:
                    return None
            facts = self._facts(node)
            now = self.clock()
            assessment = decide.assess(facts, None, now, self.cfg)
            # Only what the clock changed is worth a write: an expiry, a held-back mark, a
            # failing workload's report aging out of the window (the label's count), or a
            # moved-off mark older than its window. A fresh mark steers replacements: never
            # touched. An expired one is removed whether or not update-annotations still marks
            # (moved_off_mark off leaves the old marks behind).
            changed = (
                assessment.verdict in (Verdict.CLEAR, Verdict.MARK)
                or facts.labelled != assessment.suspect
                or facts.failing_label != assessment.failing_label(facts)
            )
            expired = movedoff.expired(facts.labels, now, self.cfg.moved_off_window)
            if not changed and not expired:
                return None
            try:
                if not changed:
                    return self._remove_moved_off(facts, assessment)
                return self._settle(
                    facts, None, nodes if attempt == 0 else None, drop_moved_off=expired
                )
            except kube.Conflict:
                continue
        raise kube.Transient(f"node {name} kept changing: gave up after {MAX_ATTEMPTS} tries")

    # -- deciding and writing -------------------------------------------------------------------

    def _facts(self, node: Mapping[str, Any]) -> NodeFacts:
        try:
            return NodeFacts.from_node(node)
        except RecordError as exc:
            name = (node.get("metadata") or {}).get("name")
            raise events.MustNotAct(f"node {name}: {exc}") from exc

    def _settle(
        self,
        facts: NodeFacts,
        blame: Blame | None,
        nodes: Sequence[Mapping[str, Any]] | None,
        *,
        drop_moved_off: bool = False,
    ) -> Outcome:
        """Decide for one node as read and write the result (Conflict: read again).
        ``drop_moved_off``: the review found the moved-off mark expired; it goes in the same
        patch (a failure's blame leaves the mark to the next review)."""
        now = self.clock()
        assessment = decide.assess(facts, blame, now, self.cfg)
        verdict = assessment.verdict
        suspect = assessment.suspect
        cap: CapDecision | None = None
        record = assessment.record
        if verdict is Verdict.MARK and not facts.labelled:
            cap = self._cap(facts, assessment, nodes)
            if not cap.mark:
                suspect = False
                record = decide.unmarked(record)
        if facts.opted_out and verdict is Verdict.HEALTHY:
            # Never marked, never written: a node its operator opted out is not ours. Only our
            # expired moved-off mark is removed from it, and nothing else written.
            if drop_moved_off:
                return self._remove_moved_off(facts, assessment)
            return Outcome(facts.name, facts.uid, verdict, False, False, assessment, cap)
        patch = decide.node_patch(
            facts,
            record,
            suspect=suspect,
            taint=self.cfg.suspect_taint,
            failing=assessment.failing_label(facts),
            drop_moved_off=drop_moved_off,
        )
        if patch is not None:
            self.api.merge_patch("Node", None, facts.name, patch)
        if cap is not None and cap.mark:
            for other in cap.displaced:
                self._clear(other, f"cleared to make room under the cap for node {facts.name}")
            if self._beyond_cap(facts.name):
                self._clear(
                    facts.name, "another instance marked a node at the same time: over the cap"
                )
                cap = CapDecision(False, (), "over the cap after a concurrent mark: taken back")
                suspect = False
        removed = drop_moved_off and MOVED_OFF_LABEL in facts.labels and patch is not None
        return Outcome(
            facts.name,
            facts.uid,
            verdict,
            suspect,
            patch is not None,
            assessment,
            cap,
            moved_off=decide.moved_off_expiry(facts, self.cfg.moved_off_window) if removed else "",
        )

    def _remove_moved_off(self, facts: NodeFacts, assessment: Assessment) -> Outcome:
        """Remove the node's expired moved-off mark in a patch of that one label, when nothing
        else is to be written: the record is left as it was read (a review writes it only for
        a change the clock made), and an opted-out node gets nothing of ours but this removal.
        Conflict: read again (update-annotations may have marked it anew)."""
        patch = decide.moved_off_removal(facts)
        if patch is not None:
            self.api.merge_patch("Node", None, facts.name, patch)
        return Outcome(
            facts.name,
            facts.uid,
            assessment.verdict,
            assessment.suspect,
            patch is not None,
            assessment,
            moved_off=decide.moved_off_expiry(facts, self.cfg.moved_off_window) if patch else "",
        )

    def _cap(
        self, facts: NodeFacts, assessment: Assessment, nodes: Iterable[Mapping[str, Any]] | None
    ) -> CapDecision:
        listed = list(nodes) if nodes is not None else list(self.api.list_all("Node"))
        standings, schedulable = _standings(listed, facts.name, self.clock(), self.cfg)
        allowed = decide.allowed_suspects(schedulable, self.cfg.suspect_max_share)
        candidate = Standing(facts.name, len(assessment.workloads), False, len(assessment.problems))
        return decide.within_cap(candidate, standings, allowed)

    def _beyond_cap(self, name: str) -> bool:
        listed = list(self.api.list_all("Node"))
        standings, schedulable = _standings(listed, None, self.clock(), self.cfg)
        allowed = decide.allowed_suspects(schedulable, self.cfg.suspect_max_share)
        return name in decide.over_cap([s for s in standings if s.marked], allowed)

    def _clear(self, name: str, why: str) -> None:
        """Take the suspect marks off ``name`` (its failures stay on record)."""
        for _ in range(MAX_ATTEMPTS):
            try:
                facts = self._facts(self.api.get("Node", None, name))
            except kube.NotFound:
                return
            record = decide.unmarked(facts.record)
            # The failures stay on record, and so does the count of failing workloads.
            patch = decide.node_patch(
                facts,
                record,
                suspect=False,
                taint=self.cfg.suspect_taint,
                failing=facts.failing_label,
            )
            if patch is None:
                return
            try:
                self.api.merge_patch("Node", None, name, patch)
            except kube.Conflict:
                continue
            self._recorder().record(
                _node_ref(facts), REASON_NODE_CLEARED, f"node {name}: {why}", key=why
            )
            return
        raise kube.Transient(f"node {name} kept changing: gave up after {MAX_ATTEMPTS} tries")

    # -- telling people -------------------------------------------------------------------------

    def _recorder(self) -> Recorder:
        return Recorder(self.api, self.clock)

    def _tell(self, outcome: Outcome) -> None:
        a = outcome.assessment
        ref = Involved("Node", "", outcome.node, outcome.uid)
        log.info(
            "node %s: %s (%s)%s",
            outcome.node,
            outcome.verdict,
            a.why,
            f"; {outcome.moved_off}" if outcome.moved_off else "",
            extra={
                "node": outcome.node,
                "verdict": str(outcome.verdict),
                "marked": outcome.marked,
                "moved_off_removed": bool(outcome.moved_off),
            },
        )
        if outcome.verdict is Verdict.MARK and outcome.marked:
            since = a.record.suspect_since
            self._recorder().record(
                ref,
                REASON_NODE_SUSPECTED,
                f"{a.why}{': ' + _listing(a.workloads) if a.workloads else ''}; labelled "
                f"{SUSPECT_LABEL}=true"
                + (" and tainted PreferNoSchedule" if self.cfg.suspect_taint else "")
                + f"; cleared after {format_duration(self.cfg.suspect_window)} "
                "without a new failure",
                warning=True,
                key=format_time(since) if since else "",
                repeat=False,
            )
        elif outcome.verdict is Verdict.MARK and outcome.cap is not None:
            self._recorder().record(
                ref, REASON_SUSPECT_CAP_REACHED, outcome.cap.why, warning=True, key=""
            )
        elif outcome.verdict is Verdict.CLEAR and outcome.written:
            self._recorder().record(ref, REASON_NODE_CLEARED, a.why, key=a.why)

    def _suspected_reply(self, outcome: Outcome) -> events.Reply:
        a = outcome.assessment
        since = a.record.suspect_since
        return events.Reply(
            type=EVENT_NODE_SUSPECTED,
            subject=f"nodes/{outcome.node}",
            data={
                "node": outcome.node,
                "since": format_time(since) if since else None,
                "workloads": [{"workload": w, "reason": r} for w, r in a.workloads],
                "conditions": [
                    {"type": p.type, "reason": p.reason, "message": p.message} for p in a.problems
                ],
                "tainted": self.cfg.suspect_taint,
                "message": a.why,
            },
        )


def _node_ref(facts: NodeFacts) -> Involved:
    return Involved("Node", "", facts.name, facts.uid)


def _listing(workloads: Iterable[tuple[str, str]]) -> str:
    return ", ".join(f"{w} ({r})" for w, r in workloads)


def _standings(
    nodes: Iterable[Mapping[str, Any]], exclude: str | None, now: datetime, cfg: Config
) -> tuple[list[Standing], int]:
    """The marked nodes as the cap ranks them, and how many nodes are schedulable."""
    standings: list[Standing] = []
    schedulable = 0
    for node in nodes:
        try:
            facts = NodeFacts.from_node(node)
        except RecordError:
            continue
        if facts.schedulable:
            schedulable += 1
        if facts.name == exclude or not facts.labelled:
            continue
        workloads = len(facts.record.workloads(now, cfg.suspect_window))
        problems = len(facts.problems(cfg.suspect_conditions))
        standings.append(Standing(facts.name, workloads, True, problems))
    return standings, schedulable
