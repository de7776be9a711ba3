"""Acting on a failing pod: the executor of update-annotations.

The order of work is what keeps it safe under at-least-once, unordered, concurrent delivery.
Steps 3 to 6 are planned by pure code as one value, the ordered requests of the move
(``shared.pods.update_annotations.decide``); this module reads, plans, sends the requests in
that order, stops at the first refusal and maps it (below), and re-plans after a lost write:

1. Read the pod as it is now. Gone, replaced by a namesake, or being deleted: nothing to do.
2. Resolve its owner chain (policy, and the object that holds the state). A Deployment's pod:
   read the Deployment too, whose policy applies, and remove any copy of our state from it
   before the ReplicaSet's state is written (``shared.pods.update_annotations.rollouts``: kubectl
   rollout undo).
3. ``plan`` against the holder's state. Before a move is charged, ask the API server whether
   the removal would go through: a server-side dry run (``dryRun=All``) of a bare pod's
   replacement and of the eviction (with ``use_eviction``). A removal it would refuse (a
   PodDisruptionBudget, RBAC, a quota, validation) spends nothing.
4. Write the new state with the holder's resourceVersion as precondition; on 409 re-read and
   re-plan (many instances acting on one workload at once lose no update).
5. For a failure counted against its node, mark the node moved off (one label of ours,
   ``shared.api.movedoff``; best effort, never stops the move), so that replacements placed in
   the same burst keep off it before assess-nodes has heard.
   Only then remove the pod (delete with a uid precondition, or evict). So no pod is ever
   removed without a record, and a redelivered event finds its uid in the state (``plan``
   answers "already handled") and finishes a removal that failed half-way, without counting it
   again.
6. Only once this delivery really removed the pod: the ``Rescheduled`` (or
   ``ExclusionsCleared``) Event and the reply. An Event never claims a move that did not
   happen.

A removal refused for now (a PodDisruptionBudget: the dry run and the real eviction both answer
429; a bare pod's replacement refused) is not a failure to redeliver at once: the answer is 202
with a deduplicated Event on the pod saying why, and the sweep sends the still-failing pod
again a few minutes later.

A bare pod has no controller to recreate it: its replacement is created first (same spec,
unbound, carrying the state, under a name derived from the old pod's uid), then the old pod
is deleted. A redelivery after a failure in between finds the replacement (409 AlreadyExists:
done) and deletes the old pod; a pod a person deleted is never brought back.

Events are deduplicated: one Event per (object, reason, key) under a deterministic name, whose
``count`` and ``lastTimestamp`` grow when it happens again. They are best effort: a failure to
record one (RBAC included) is logged and never undoes or blocks a move.
"""

from __future__ import annotations

import contextvars
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from shared.api import movedoff
from shared.api.keys import (
    DEFAULT_NAMESPACE,
    REASON_MOVE_DEFERRED,
    REASON_REPLACEMENT_NOT_ALLOWED,
    REASON_REPLACEMENT_REDIRECTED,
    REASON_REPLACEMENT_REFUSED,
    STATE_ANNOTATION,
)
from shared.api.kubetypes import Pod
from shared.platform import events, kube, metrics, recorder
from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.pods.update_annotations import decide, rollouts
from shared.pods.update_annotations.replacements import label_selector, redirects
from shared.workloads import evidence, fastpath, jobs
from shared.workloads.classify import FailureKind
from shared.workloads.owners import Holder, Ref, Resolution, holder_of, resolve
from shared.workloads.state import Action, Plan

log = logging.getLogger(__name__)

# What the messages tell people to do; the RBAC manifests define these names (the
# ServiceAccount lives in the namespace the project is installed in).
SERVICE_ACCOUNT: Final = "update-annotations"
BARE_POD_CLUSTER_ROLE: Final = "kn-rescheduler-bare-pods"
# Reads and compare-and-swaps of a node's moved-off mark before it is given up (the move goes on).
MARK_ATTEMPTS: Final = 3

_trace: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("trace", default=None)


def last_trace() -> Trace | None:
    """The trace of the last event handled in this thread (for the replay tool)."""
    return _trace.get()


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Trace:
    """What one event led to, for logs and the replay tool's decision trace."""

    steps: list[str] = field(default_factory=list)
    plan: Plan | None = None
    # What the move costs the pod's Job, when it is a Job's pod (shared.workloads.jobs).
    job_cost: jobs.MoveCost | None = None

    def note(self, message: str, **extra: Any) -> None:
        self.steps.append(message)
        log.info(message, extra=extra)


class Step(StrEnum):
    """The API calls that remove a pod, as far as a refusal is concerned."""

    # Creating a bare pod's replacement.
    REPLACEMENT = "replacement"
    # The Eviction API (with use_eviction).
    EVICTION = "eviction"


class Removal(StrEnum):
    # This delivery removed the pod: the move happened now.
    REMOVED = "removed"
    # Someone removed it first (an earlier delivery, a person): nothing more to say.
    GONE = "gone"


@dataclass(frozen=True)
class Deferral:
    """A removal the API server refuses for now: said on the pod, answered 202, tried again
    when the still-failing pod is sent again (the sweep resends failing pods)."""

    step: Step
    # Reason and sentence of the Warning Event recorded on the pod.
    reason: str
    message: str


_RETRIED_LATER: Final = (
    "it is tried again when the failing pod is sent again (the sweep sends every failing pod "
    "every few minutes)"
)


def deferral_for(
    step: Step,
    error: kube.KubeError,
    namespace: str,
    pod_name: str,
    *,
    charged: bool,
    installed_in: str = DEFAULT_NAMESPACE,
) -> Deferral | None:
    """Whether an API refusal of a removal means "not now" (and what to tell people), or is
    an error for the caller to raise (None).

    ``charged`` says whether the move is already counted in the state (a dry run passed, then
    the real call was refused: a race, or a redelivery finishing a recorded move).
    """
    counted = (
        "the move was counted once and will not be counted again"
        if charged
        else "the move was not counted"
    )
    pod = f"pod {namespace}/{pod_name}"
    account = f"{installed_in}/{SERVICE_ACCOUNT}"
    if step is Step.EVICTION and isinstance(error, kube.DisruptionBudgetRefused):
        said = "; ".join(error.causes) or "no disruption allowed now"
        return Deferral(
            step,
            REASON_MOVE_DEFERRED,
            f"a PodDisruptionBudget does not allow evicting {pod} now ({said}); {counted}, "
            f"and {_RETRIED_LATER}. A PodDisruptionBudget protects failing pods too unless "
            "it sets unhealthyPodEvictionPolicy: AlwaysAllow.",
        )
    if step is not Step.REPLACEMENT:
        return None
    if isinstance(error, kube.Forbidden) and "cannot create resource" in str(error):
        return Deferral(
            step,
            REASON_REPLACEMENT_NOT_ALLOWED,
            f"{pod} has no controller: moving it means creating a replacement, and "
            f"{account} may not create pods in namespace {namespace}. Bare-pod "
            f"replacement is opt-in per namespace: a RoleBinding in {namespace} binding the "
            f"ClusterRole {BARE_POD_CLUSTER_ROLE} to the ServiceAccount {account} "
            f"enables it. {counted[0].upper()}{counted[1:]}, and {_RETRIED_LATER}.",
        )
    if isinstance(error, (kube.Forbidden, kube.Invalid)):
        # A quota or LimitRange (403), an admission policy, validation (422).
        return Deferral(
            step,
            REASON_REPLACEMENT_REFUSED,
            f"the API server refused the replacement of {pod} ({error}); {counted}, "
            f"and {_RETRIED_LATER}.",
        )
    return None


class Rescheduler:
    def __init__(
        self,
        api: kube.Kube,
        cfg: Config,
        *,
        clock: Callable[[], datetime] = utcnow,
        max_attempts: int = 40,
    ) -> None:
        self.api = api
        self.cfg = cfg
        self.clock = clock
        self.max_attempts = max_attempts

    # -- entry point --------------------------------------------------------------------------

    def handle(self, event: events.Event) -> events.Reply | None:
        try:
            failing = FailingPod.from_data(event.data)
        except ValueError as exc:
            raise events.BadEvent(str(exc)) from exc
        trace = Trace()
        _trace.set(trace)
        return self._handle(failing, trace)

    def _handle(self, failing: FailingPod, trace: Trace) -> events.Reply | None:
        ns, name = failing.namespace, failing.name
        if self.cfg.is_excluded_namespace(ns):
            trace.note(f"namespace {ns} is excluded")
            return None
        early: decide.Early | None = None
        node: Mapping[str, Any] | None = None
        # What this delivery read, in order, and when: said in the move's reply.
        reads: list[decide.Read] = []
        if failing.failure.kind is FailureKind.EARLY:
            early, node = self._early_on_node(failing, trace, reads)
            if early is not None and not early.acted_on:
                return None
        try:
            live: Pod = self.api.get("Pod", ns, name)  # type: ignore[assignment]
        except kube.NotFound:
            if self._removed_by_its_statefulset(failing, trace, reads):
                return self._record_removed(failing, None, trace, reads)
            trace.note(f"pod {ns}/{name} is gone")
            return self._said_if_ours(failing, trace)
        reads.append(decide.Read(f"pod {ns}/{name}", self.clock()))
        meta = live.get("metadata", {})
        if meta.get("uid") != failing.uid:
            if self._removed_by_its_statefulset(failing, trace, reads, live):
                return self._record_removed(failing, live, trace, reads)
            trace.note(f"pod {ns}/{name} was replaced (uid {meta.get('uid')})")
            return self._said_if_ours(failing, trace)
        if meta.get("deletionTimestamp"):
            trace.note(f"pod {ns}/{name} is already being deleted")
            return self._said_if_ours(failing, trace)

        if failing.failure.kind is FailureKind.EARLY and early is None:
            early = self._corroborate(failing, live, node, trace, reads)
            if not early.acted_on:
                return None
        if early is not None and early.counts_against_node:
            # Corroborated, the failure is judged by its node: assess-nodes counts the move.
            failing = replace(
                failing, failure=replace(failing.failure, kind=FailureKind.NODE_FIXABLE)
            )
        resolution = resolve(self.api, ns, live)
        # A Deployment's pod: the Deployment's policy applies, and a copy of our state on it
        # (kubectl rollout undo) is removed before the ReplicaSet's state is written.
        settled = rollouts.check_deployment(self.api, resolution)
        reads.append(decide.Read("its owners and their policy", self.clock()))
        for note in settled.notes:
            trace.note(f"pod {ns}/{name}: {note}")
        return self._carry_out(
            decide.Inputs(
                failing,
                live,
                settled.resolution,
                self.cfg,
                self.clock(),
                early=early,
                reads=tuple(reads),
            ),
            trace,
        )

    # -- a pod already gone: say the move an earlier delivery recorded and made ----------------

    def _said_if_ours(self, failing: FailingPod, trace: Trace) -> events.Reply | None:
        """The pod is gone (or going): read where its move would be recorded (the holder; a
        bare pod's state went with it onto its replacement), and say the move if it is ours
        (``decide.said_late``)."""
        ns, name = failing.namespace, failing.name
        view = failing.as_failed_pod()
        owner = next((o for o in failing.owner_references if o.get("controller")), None)
        try:
            if owner is None:
                replacement = self.api.get("Pod", ns, decide.replacement_name_of(failing))
                raw = (replacement.get("metadata", {}).get("annotations") or {}).get(
                    STATE_ANNOTATION
                )
                ref = Ref("Pod", ns, name, failing.uid)
            else:
                resolution = resolve(self.api, ns, view)
                if resolution.holder is None:
                    return None
                raw = resolution.holder.annotations.get(STATE_ANNOTATION)
                ref = resolution.holder.ref
        except kube.NotFound:
            trace.note(f"pod {ns}/{name}: nothing records its move: nothing to do")
            return None
        made = decide.said_late(failing, raw, ref)
        for note in made.notes:
            trace.note(note)
        sent = self._send(view, made, made.requests, trace)
        assert not isinstance(sent, kube.Conflict)  # it writes nothing
        return sent

    # -- terminal failures: the controller replaced the pod before we recorded it ---------------

    def _removed_by_its_statefulset(
        self,
        failing: FailingPod,
        trace: Trace,
        reads: list[decide.Read],
        namesake: Pod | None = None,
    ) -> bool:
        """A StatefulSet pod the kubelet failed (Evicted, OutOf*, ...) is deleted and recreated
        under its name by the StatefulSet controller itself, usually before this delivery: the
        failure is still worth recording. The report is a claim and the pod is gone, so the
        kubelet's own Event about that pod (its uid), of that reason, on that node, is what
        the record rests on (``decide.removed_confirmed``); without it nothing is recorded."""
        if not decide.claims_removed_by_statefulset(failing, self.cfg):
            return False
        try:
            said = evidence.read_warning_events(self.api, failing.namespace, failing.uid)
        except kube.Transient:
            raise
        except kube.KubeError as exc:
            log.warning(
                "cannot read the Events of %s/%s to confirm its failure: %s",
                failing.namespace,
                failing.name,
                exc,
            )
            said = ()
        reads.append(decide.Read(f"the Warning Events about uid {failing.uid}", self.clock()))
        confirmed, why = decide.removed_confirmed(failing, said, namesake)
        trace.note(why)
        if not confirmed:
            log.warning(why)
        return confirmed

    def _record_removed(
        self, failing: FailingPod, namesake: Pod | None, trace: Trace, reads: list[decide.Read]
    ) -> events.Reply | None:
        """Record the move of a failed StatefulSet pod its controller already removed, then
        redirect its namesake if that was admitted without the exclusion."""
        ns, name = failing.namespace, failing.name
        view = failing.as_failed_pod()
        trace.note(
            f"pod {ns}/{name} (uid {failing.uid}) failed with {failing.failure.reason} and its "
            "StatefulSet already replaced it: recording the failure from the event"
        )
        resolution = resolve(self.api, ns, view)
        given = decide.Inputs(
            failing,
            view,
            resolution,
            self.cfg,
            self.clock(),
            # The kubelet's Event confirmed the node and the reason; nothing read says how long
            # the pod ran, so the report's figure is not taken (a forged one would reset the
            # workload's exclusions): unknown, as for any pod whose run cannot be read.
            failure=replace(failing.failure, ran_for_seconds=None),
            removed=True,
            namesake=namesake,
            reads=(*reads, decide.Read("its owners and their policy", self.clock())),
        )
        return self._carry_out(given, trace)

    def _redirect_replacements(
        self,
        failed: Pod,
        node: str,
        holder: Ref,
        trace: Trace,
        *,
        namesake: Pod | None = None,
    ) -> None:
        """Recreate the replacement a controller made before the failure was recorded, when it
        was admitted without the exclusion and is headed for the node
        (shared.pods.update_annotations.replacements).

        Best effort: the move is recorded, so a replacement that fails on that node again is
        moved like any other pod; a lost redirect costs a move, never a record.
        """
        meta = failed.get("metadata", {})
        ns = meta.get("namespace", "")
        try:
            if namesake is not None:
                candidates: list[Any] = [namesake]
            else:
                selector = label_selector(failed)
                if selector is None:
                    return
                candidates = list(self.api.list_all("Pod", ns, label_selector=selector))
        except kube.KubeError as exc:
            log.warning(
                "could not look for the replacement of %s/%s: %s", ns, meta.get("name"), exc
            )
            return
        for redirect in redirects(failed, node, candidates, self.clock()):
            try:
                self.api.delete("Pod", ns, redirect.name, uid=redirect.uid)
            except (kube.NotFound, kube.Conflict):
                continue  # gone or replaced meanwhile: its successor is admitted afresh
            except kube.KubeError as exc:
                log.warning("could not redirect %s/%s: %s", ns, redirect.name, exc)
                continue
            trace.note(redirect.why)
            metrics.DECISIONS.labels(action="redirected").inc()
            self._event(
                holder, REASON_REPLACEMENT_REDIRECTED, redirect.why, key=redirect.uid, repeat=False
            )

    def _early_on_node(
        self, failing: FailingPod, trace: Trace, reads: list[decide.Read]
    ) -> tuple[decide.Early | None, Mapping[str, Any] | None]:
        """An early report (a failure below the thresholds): first the Node (one GET). A
        suspect node moves the pod; None: look beside the pod next (`_corroborate`), with the
        Node as read (its health record)."""
        node = failing.failure.node
        found: Mapping[str, Any] | None = None
        if node and (self.cfg.suspect_fast_path or self.cfg.corroborated_fast_path):
            try:
                found = self.api.get("Node", None, node)
            except kube.NotFound:
                found = None
            except kube.KubeError as exc:
                # An install whose RBAC predates the fast path, or an API server that did not
                # answer: wait for the full rules (the next status update reports again).
                log.warning("cannot read node %s for the fast path: %s", node, exc)
                unread = decide.Early(False, f"early report: node {node} could not be read")
                trace.note(unread.why)
                return unread, None
            reads.append(decide.Read(f"node {node}", self.clock()))
        early = decide.early_on_node(failing, self.cfg, found)
        if early is not None:
            trace.note(early.why)
        return early, found

    def _corroborate(
        self,
        failing: FailingPod,
        live: Pod,
        node: Mapping[str, Any] | None,
        trace: Trace,
        reads: list[decide.Read],
    ) -> decide.Early:
        """Read what the corroborated rules ask for (the node's pods, then the ReplicaSet's),
        until they answer. Best effort: a LIST that fails is no evidence, and the pod waits for
        the full rules."""
        on_node: list[Any] | None = None
        twins: list[Any] | None = None
        while True:
            step = decide.corroborate(
                failing, live, self.cfg, self.clock(), node=node, on_node=on_node, twins=twins
            )
            if isinstance(step, decide.Early):
                trace.note(step.why)
                return step
            try:
                if isinstance(step, decide.ListNodePods):
                    on_node = list(
                        self.api.list_all("Pod", None, field_selector=f"spec.nodeName={step.node}")
                    )
                    reads.append(decide.Read(f"the pods on node {step.node}", self.clock()))
                else:
                    twins = list(
                        self.api.list_all("Pod", step.namespace, label_selector=step.selector)
                    )
                    reads.append(decide.Read("the pods of its ReplicaSet", self.clock()))
            except kube.KubeError as exc:
                log.warning(
                    "could not list pods for %s/%s's early report (%s): waiting for the thresholds",
                    failing.namespace,
                    failing.name,
                    exc,
                )
                unlisted = decide.Early(
                    False, f"early report: the pods for {step.why!r} could not be listed"
                )
                trace.note(unlisted.why)
                return unlisted

    # -- the executor: read, plan, send in order ----------------------------------------------

    def _carry_out(self, given: decide.Inputs, trace: Trace) -> events.Reply | None:
        """Plan, make the reads the plan asks for, and send its requests in order. A write
        lost to a conflict (someone else wrote first) is re-planned on the holder read again,
        ``max_attempts`` times at most: many instances acting on one workload at once lose no
        update."""
        while True:
            made = decide.plan_move(given)
            if isinstance(made, decide.ListSiblings):
                siblings = self._siblings(given, made, trace)
                given = replace(given, siblings=siblings, job_pods=siblings.pods)
                if siblings.pods is not None:
                    given = given.having_read("the other pods of its workload", self.clock())
                continue
            if isinstance(made, decide.ListJobPods):
                # KubeErrors propagate: without the count, no counted move.
                pods = self.api.list_all("Pod", made.namespace, label_selector=made.selector)
                given = replace(given, job_pods=tuple(pods)).having_read(
                    "the pods of its Job", self.clock()
                )
                continue
            if isinstance(made, decide.ListLine):
                given = replace(given, line_goes_on=self._line_goes_on(given.live, made, trace))
                continue
            if isinstance(made, decide.ReadNodes):
                nodes = {node: self._node_or_none(node) for node in made.nodes}
                on_nodes = {node: self._pods_on_or_none(node) for node in made.nodes}
                implicated = fastpath.implicated_nodes(
                    given.live, nodes, self.cfg, self.clock(), on_nodes
                )
                for node, why in implicated.items():
                    trace.note(f"node {node} does not count towards a stop: {why}")
                given = replace(given, implicated=implicated).having_read(
                    f"nodes {', '.join(made.nodes)} and their pods", self.clock()
                )
                continue
            if isinstance(made, decide.ReadEvidence):
                trace.note(f"pod {given.failing.namespace}/{given.failing.name}: {made.why}")
                read = evidence.read_evidence(self.api, given.live, siblings=True)
                if read.unread:
                    log.warning(
                        "%s/%s: %s", given.failing.namespace, given.failing.name, read.unread
                    )
                given = replace(given, evidence=read)
                if not read.unread:
                    given = given.having_read(
                        "its Warning Events, its controller's pods and their image pulls",
                        self.clock(),
                    )
                continue
            if made.decided is not None:
                trace.plan = made.decided
            if made.job_cost is not None or (
                made.decided is not None
                and made.decided.action in (Action.MOVE, Action.CLEAR_AND_MOVE)
            ):
                trace.job_cost = made.job_cost
            for note in made.notes:
                trace.note(note)
            sent = self._send(given.live, made, made.requests, trace, attempt=given.attempt)
            if not isinstance(sent, kube.Conflict):
                return sent
            if given.attempt >= self.max_attempts:
                raise sent
            # Someone else wrote first: read their state and decide again. A little jitter
            # keeps many instances from colliding in lockstep.
            time.sleep(random.uniform(0, 0.02 * min(given.attempt, 10)))
            holder = given.holder or given.resolution.holder
            assert holder is not None
            decided = made.decided
            given = replace(
                given,
                holder=self._reread(holder),
                reads=(*given.reads, decide.Read("its holder again", self.clock())),
                failure=made.failure,
                attempt=given.attempt + 1,
                # The dry runs passed: a re-plan removes the same pod the same way.
                checked=given.checked or (decided is not None and decided.delete_pod),
                # A Job's counts are judged afresh with its re-read status: list again.
                job_pods=None,
                now=self.clock(),
            )

    def _send(
        self,
        live: Pod,
        made: decide.MovePlan,
        requests: tuple[decide.Request, ...],
        trace: Trace,
        *,
        attempt: int = 1,
    ) -> events.Reply | kube.Conflict | None:
        """Send ``requests`` in order, stopping at the first refusal: a removal refused for
        now is deferred (202, said on the pod), a write that lost a race is returned for a
        re-plan, a pod already gone ends with what its ``gone`` requests say."""
        for request in requests:
            if isinstance(request, decide.DryRunCreate | decide.DryRunEvict):
                refused = self._dry_run(live, request, trace)
                if refused is not None:
                    trace.plan = None
                    if not isinstance(request, decide.DryRunEvict) or request.say:
                        self._defer(live, refused, trace)
                    return None
            elif isinstance(request, decide.WriteState):
                ref = request.holder
                try:
                    self.api.merge_patch(ref.kind, ref.namespace, ref.name, dict(request.body))
                except kube.Conflict as exc:
                    return exc
                decided = made.decided
                assert decided is not None
                trace.note(
                    f"plan: {decided.action} ({decided.reason}): {decided.message}",
                    action=str(decided.action),
                    holder=ref.describe(),
                    attempts=attempt,
                    **({"not_stopped": decided.goes_on} if decided.goes_on else {}),
                )
            elif isinstance(request, decide.Count):
                metrics.DECISIONS.labels(action=request.action).inc()
            elif isinstance(request, decide.RecordEvent):
                created = self._event(
                    request.involved,
                    request.reason,
                    request.message,
                    warning=request.warning,
                    key=request.key,
                    repeat=request.repeat,
                )
                if created and request.noted:
                    trace.note(request.noted)
                if request.gate and not created:
                    return None
            elif isinstance(request, decide.CreateReplacement):
                refused = self._create_replacement(live, request, trace)
                if refused is not None:
                    self._defer(live, refused, trace)
                    return None
            elif isinstance(request, decide.Evict | decide.Delete):
                removed = self._remove(live, request, trace)
                if isinstance(removed, Deferral):
                    self._defer(live, removed, trace)
                    return None
                if removed is Removal.GONE:
                    return self._send(live, made, request.gone, trace, attempt=attempt)
            elif isinstance(request, decide.MarkNode):
                self._mark_node(request, trace)
            elif isinstance(request, decide.Redirect):
                self._redirect_replacements(
                    request.failed, request.node, request.holder, trace, namesake=request.namesake
                )
            else:
                return request.reply
        return None

    def _alone_on(self, pod: Pod, node: Mapping[str, Any], now: datetime) -> str:
        """Why ``pod``'s workload is alone in failing on ``node`` (its record names no other
        workload, and no other workload's pod fails there now), or "" when it is not."""
        if fastpath.recorded_on_node(pod, node, self.cfg, now):
            return ""
        name = str((node.get("metadata") or {}).get("name", ""))
        listed = self._pods_on_or_none(name)
        if listed is None:
            return "its pods could not be listed"
        if fastpath.other_workloads_failing(pod, listed, self.cfg, now):
            return ""
        return (
            "no other workload failed there and none of this one runs elsewhere: one "
            "workload's move may follow the workload"
        )

    def _pods_on_or_none(self, node: str) -> list[Any] | None:
        """The pods bound to ``node`` (every namespace, by field selector); None when they
        cannot be listed (then the node is in doubt, and no stop rests on it)."""
        try:
            return list(self.api.list_all("Pod", None, field_selector=f"spec.nodeName={node}"))
        except kube.KubeError as exc:
            log.warning("cannot list the pods on node %s: %s", node, exc)
            return None

    def _node_or_none(self, name: str) -> Mapping[str, Any] | None:
        """The Node as read; None when it is gone or cannot be read (then in doubt)."""
        try:
            return self.api.get("Node", None, name)
        except kube.KubeError as exc:
            log.warning("cannot read node %s: %s", name, exc)
            return None

    def _mark_node(self, request: decide.MarkNode, trace: Trace) -> None:
        """Mark the node the pod is moved off (``shared.api.movedoff``): read it, then a
        compare-and-swap of our one label. Never stops the move: the mark only steers other
        replacements sooner, and assess-nodes' label follows the move's reply anyway."""
        node = request.node
        for _ in range(MARK_ATTEMPTS):
            try:
                found = self.api.get("Node", None, node)
            except kube.NotFound:
                trace.note(f"node {node} is gone: not marked")
                return
            except kube.KubeError as exc:
                log.warning("cannot read node %s to mark it moved off: %s", node, exc)
                trace.note(f"node {node} could not be read: not marked")
                return
            now = self.clock()
            patch = movedoff.mark_patch(found, now, self.cfg.moved_off_window)
            if patch is not None and request.unless_alone is not None:
                alone = self._alone_on(request.unless_alone, found, now)
                if alone:
                    trace.note(f"node {node}: not marked moved off: {alone}")
                    return
            if patch is None:
                trace.note(f"node {node}: marked moved off lately, or opted out: not marked again")
                return
            try:
                self.api.merge_patch("Node", None, node, patch)
            except kube.Conflict:
                continue  # assess-nodes or the kubelet wrote first: read it again
            except kube.KubeError as exc:
                log.warning("cannot mark node %s moved off: %s", node, exc)
                trace.note(f"node {node} could not be marked: {exc}")
                return
            trace.note(f"marked node {node} moved off")
            return
        trace.note(f"node {node} kept changing: not marked")

    def _dry_run(
        self, live: Pod, request: decide.DryRunCreate | decide.DryRunEvict, trace: Trace
    ) -> Deferral | None:
        """Server-side dry run of a call the removal will make, before the move is charged:
        admission (our webhook included, sideEffects None), RBAC, quotas, validation and
        PodDisruptionBudgets all answer, and nothing is persisted or spent."""
        meta = live.get("metadata", {})
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        dry = self.api.with_options(dry_run=True)
        if isinstance(request, decide.DryRunCreate):
            try:
                dry.create("Pod", request.namespace, dict(request.body))
            except kube.AlreadyExists:
                pass  # a replacement made earlier: the real create will find it, which is done
            except (kube.Forbidden, kube.Invalid) as exc:
                refused = self._deferral(Step.REPLACEMENT, exc, ns, name, charged=False)
                if refused is None:
                    raise
                trace.note(f"dry run: the replacement of {ns}/{name} would be refused: {exc}")
                return refused
            return None
        try:
            dry.evict(request.namespace, request.name, uid=request.uid)
        except (kube.NotFound, kube.Conflict):
            pass  # gone or replaced meanwhile: the real eviction says so and does nothing
        except kube.DisruptionBudgetRefused as exc:
            trace.note(f"dry run: evicting {ns}/{name} would be refused: {exc}")
            return self._deferral(Step.EVICTION, exc, ns, name, charged=False)
        return None

    def _create_replacement(
        self, live: Pod, request: decide.CreateReplacement, trace: Trace
    ) -> Deferral | None:
        """A bare pod's replacement; a refusal here comes after the state write (a race with
        RBAC or a quota since the dry run, or a redelivery finishing an earlier move)."""
        meta = live.get("metadata", {})
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        body = dict(request.body)
        try:
            self.api.create("Pod", request.namespace, body)
            trace.note(f"created replacement pod {ns}/{body['metadata']['name']}")
        except kube.AlreadyExists:
            trace.note(f"replacement pod {ns}/{body['metadata']['name']} already exists")
        except (kube.Forbidden, kube.Invalid) as exc:
            refused = self._deferral(Step.REPLACEMENT, exc, ns, name, charged=True)
            if refused is None:
                raise
            trace.note(f"the replacement of {ns}/{name} was refused: {exc}")
            return refused
        return None

    def _remove(
        self, live: Pod, request: decide.Evict | decide.Delete, trace: Trace
    ) -> Removal | Deferral:
        """Remove the pod whose move is recorded. A refusal here comes after the state write
        (a race with a PodDisruptionBudget since the dry run, or a redelivery finishing an
        earlier move): the uid is in ``handled``, so the next delivery finishes the removal
        without counting the move again."""
        ns, name, uid = request.namespace, request.name, request.uid
        try:
            if isinstance(request, decide.Evict):
                self.api.evict(ns, name, uid=uid)
                trace.note(f"evicted pod {ns}/{name}")
            else:
                self.api.delete("Pod", ns, name, uid=uid)
                trace.note(f"deleted pod {ns}/{name} (uid {uid})")
        except kube.NotFound:
            trace.note(f"pod {ns}/{name} already gone")
            return Removal.GONE
        except kube.Conflict:
            # The uid precondition failed: this incarnation is gone, a namesake took its place.
            trace.note(f"pod {ns}/{name} was already replaced")
            return Removal.GONE
        except kube.DisruptionBudgetRefused as exc:
            trace.note(f"evicting {ns}/{name} was refused after the move was recorded: {exc}")
            return self._deferral(Step.EVICTION, exc, ns, name, charged=True) or Removal.GONE
        return Removal.REMOVED

    def _siblings(
        self, given: decide.Inputs, asked: decide.ListSiblings, trace: Trace
    ) -> decide.Siblings:
        """The pods of the failing pod's controller: one LIST of its namespace by its labels
        (a page per 500 pods), judged.

        Best effort: a failed LIST is logged and the move records its own node only, and is
        never stopped (no witness was looked at). A node left out costs at most one more move
        of a replacement that lands there, never a record.
        """
        if asked.selector is None:
            return decide.Siblings(attempt=given.attempt)
        name = given.failing.name
        try:
            candidates: list[Any] = list(
                self.api.list_all("Pod", asked.namespace, label_selector=asked.selector)
            )
        except kube.KubeError as exc:
            log.warning(
                "could not list the other pods of %s/%s (%s): recording its own node only",
                asked.namespace,
                name,
                exc,
            )
            return decide.Siblings(
                attempt=given.attempt,
                note=f"pod {asked.namespace}/{name}: the other pods of its workload could not "
                "be listed",
            )
        return decide.judge_siblings(
            given.live, candidates, self.cfg, self.clock(), asked, attempt=given.attempt
        )

    def _line_goes_on(self, live: Pod, asked: decide.ListLine, trace: Trace) -> bool:
        """Whether a live pod already carries this bare pod's move: the replacement exists,
        or a descendant of it does. A failed LIST says no (the replacement's create then
        finds it: AlreadyExists)."""
        try:
            pods = list(self.api.list_all("Pod", asked.namespace, label_selector=asked.selector))
        except kube.KubeError as exc:
            log.warning(
                "could not look for the replacements of %s/%s: %s",
                asked.namespace,
                live.get("metadata", {}).get("name"),
                exc,
            )
            return False
        goes_on, why = decide.line_goes_on(live, pods)
        if goes_on:
            trace.note(why)
        return goes_on

    def _reread(self, holder: Holder) -> Holder:
        obj = self.api.get(holder.ref.kind, holder.ref.namespace, holder.ref.name)
        # Re-read in full (a StatefulSet's start ordinal included), keeping what we knew when
        # the answer lacks it.
        fresh = holder_of(holder.ref.kind, obj)
        return replace(
            fresh,
            ref=holder.ref,
            replicas=fresh.replicas if fresh.replicas is not None else holder.replicas,
        )

    def _deferral(
        self, step: Step, error: kube.KubeError, ns: str, name: str, *, charged: bool
    ) -> Deferral | None:
        return deferral_for(step, error, ns, name, charged=charged, installed_in=self.cfg.namespace)

    def _defer(self, live: Pod, deferral: Deferral, trace: Trace) -> None:
        meta = live.get("metadata", {})
        pod = Ref("Pod", meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""))
        trace.note(f"{deferral.reason}: {deferral.message}")
        metrics.DECISIONS.labels(action="deferred").inc()
        # One Event per pod and reason, its message kept current (a budget's numbers change).
        self._event(pod, deferral.reason, deferral.message, warning=True, key="")

    def _reply(
        self,
        failing: FailingPod,
        action: Action,
        decided: Plan,
        resolution: Resolution,
        *,
        message: str | None = None,
    ) -> events.Reply | None:
        return decide.reply_for(failing, action, decided, resolution, message=message)

    def _event(
        self,
        ref: Ref,
        reason: str,
        message: str,
        *,
        warning: bool = False,
        key: str | None = None,
        repeat: bool = True,
    ) -> bool:
        """Record an Event, once per (object, reason, key) (``shared.platform.recorder``):
        the message unless ``key`` says otherwise; a ``repeat`` Event seen again counts one
        more occurrence. True when this call created it. Best effort: failing to write one
        must not undo or block a move."""
        involved = recorder.Involved(ref.kind, ref.namespace, ref.name, ref.uid, ref.api_version)
        return recorder.Recorder(self.api, self.clock).record(
            involved, reason, message, warning=warning, key=key, repeat=repeat
        )
