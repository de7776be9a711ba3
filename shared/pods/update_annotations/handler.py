"""Acting on a failing pod: the logic of update-annotations.

The order of work is what keeps it safe under at-least-once, unordered, concurrent delivery:

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
5. Only then remove the pod (delete with a uid precondition, or evict). So no pod is ever
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
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from shared.api.keys import (
    DEFAULT_NAMESPACE,
    EVENT_POD_EXHAUSTED,
    EVENT_POD_RESCHEDULED,
    JOB_CONTROLLER_UID_LABEL,
    REASON_EXCLUSIONS_CLEARED,
    REASON_INVALID_POLICY,
    REASON_JOB_RETRIES_SPENT,
    REASON_MOVE_DEFERRED,
    REASON_MOVE_WOULD_FAIL_JOB,
    REASON_REPLACEMENT_NOT_ALLOWED,
    REASON_REPLACEMENT_REDIRECTED,
    REASON_REPLACEMENT_REFUSED,
    REASON_RESCHEDULED,
    REASON_STATE_TOO_LARGE,
    RESET_AFTER_ANNOTATION,
    STATE_ANNOTATION,
)
from shared.api.kubetypes import Pod
from shared.api.state import StateError, dump_state, load_state
from shared.platform import events, kube, metrics, recorder
from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.pods.update_annotations import bodies, rollouts
from shared.pods.update_annotations.replacements import (
    is_terminal_failure,
    label_selector,
    redirects,
)
from shared.workloads import jobs
from shared.workloads.classify import (
    Failure,
    FailureKind,
    classify,
    controller_of,
    unschedulable_due_to_exclusions,
)
from shared.workloads.everywhere import ALONE, Witnesses, witnesses_of
from shared.workloads.fastpath import early_config, is_suspect
from shared.workloads.owners import BARE, JOB, Holder, Ref, Resolution, holder_of, resolve
from shared.workloads.policy import (
    BudgetScope,
    InvalidPolicy,
    OwnerKind,
    Policy,
    parse_reset_after,
    parse_retries,
)
from shared.workloads.siblings import failing_siblings, nodes_of, sibling_selector
from shared.workloads.state import Action, FailureFacts, Plan, plan

log = logging.getLogger(__name__)

# What the messages tell people to do; the RBAC manifests define these names (the
# ServiceAccount lives in the namespace the project is installed in).
SERVICE_ACCOUNT: Final = "update-annotations"
BARE_POD_CLUSTER_ROLE: Final = "kn-rescheduler-bare-pods"

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
        if failing.failure.kind is FailureKind.EARLY and not self._on_suspect_node(failing, trace):
            return None
        try:
            live: Pod = self.api.get("Pod", ns, name)  # type: ignore[assignment]
        except kube.NotFound:
            if self._removed_by_its_statefulset(failing):
                return self._record_removed(failing, None, trace)
            trace.note(f"pod {ns}/{name} is gone")
            return self._said_if_ours(failing, trace)
        meta = live.get("metadata", {})
        if meta.get("uid") != failing.uid:
            if self._removed_by_its_statefulset(failing):
                return self._record_removed(failing, live, trace)
            trace.note(f"pod {ns}/{name} was replaced (uid {meta.get('uid')})")
            return self._said_if_ours(failing, trace)
        if meta.get("deletionTimestamp"):
            trace.note(f"pod {ns}/{name} is already being deleted")
            return self._said_if_ours(failing, trace)

        resolution = resolve(self.api, ns, live)
        # A Deployment's pod: the Deployment's policy applies, and a copy of our state on it
        # (kubectl rollout undo) is removed before the ReplicaSet's state is written.
        settled = rollouts.check_deployment(self.api, resolution)
        for note in settled.notes:
            trace.note(f"pod {ns}/{name}: {note}")
        resolution = settled.resolution
        found = self._retries(resolution, ns, name, trace)
        if found is None:
            return None
        holder, retries = found

        failure = self._current_failure(live, failing, holder, trace)
        if failure is None:
            return None
        bare = resolution.owner_kind == BARE
        done = self._record(live, failure, resolution, retries, bare, trace)
        if isinstance(done, Deferral):
            self._defer(live, done, trace)
            return None
        if not done.delete_pod:
            return self._reply(failing, done.action, done, resolution)
        removal = self._remove(live, done, bare, trace)
        if isinstance(removal, Deferral):
            self._defer(live, removal, trace)
            return None
        if removal is Removal.GONE:
            # Someone removed it first: an earlier delivery of ours that died before saying so
            # (the Event below is keyed by the uid, so it is said once), or a person.
            said = moved(done, failure, name)
            if self._event(
                holder.ref, said.event_reason, said.message, key=failing.uid, repeat=False
            ):
                return self._reply(failing, said.action, done, resolution, message=said.message)
            return None
        if failure.node and is_terminal_failure(live):
            self._redirect_replacements(live, failure.node, resolution, trace)
        said = moved(done, failure, name)
        # Keyed by the pod's uid: a redelivery that removes nothing more records nothing more.
        self._event(
            holder.ref,
            said.event_reason,
            said.message,
            key=failing.uid,
            repeat=False,
        )
        spent = trace.job_cost
        if spent is not None and spent.verdict is jobs.Verdict.LAST_RETRY:
            self._event(
                holder.ref,
                REASON_JOB_RETRIES_SPENT,
                f"{spent.message}: one more failed pod, from any cause, fails the Job",
                warning=True,
                key=failing.uid,
                repeat=False,
            )
        return self._reply(failing, said.action, done, resolution, message=said.message)

    def _retries(
        self, resolution: Resolution, ns: str, name: str, trace: Trace
    ) -> tuple[Holder, int] | None:
        """The state's holder and the moves the pod's workload allows, or None (with the
        reason traced, and an InvalidPolicy Event for a value we cannot read) when nothing is
        to be done."""
        if resolution.holder is None:
            trace.note(f"pod {ns}/{name} is left alone: {resolution.why}")
            return None
        retries = parse_retries(resolution.policy, self.cfg.max_retries)
        if retries is None:
            trace.note(f"pod {ns}/{name}: no scheduling-retries policy on its owners")
            return None
        if isinstance(retries, InvalidPolicy):
            self._invalid_policy(resolution, retries, trace)
            return None
        return resolution.holder, retries

    # -- a pod already gone: say the move an earlier delivery recorded and made ----------------

    def _said_if_ours(self, failing: FailingPod, trace: Trace) -> events.Reply | None:
        """The pod is gone (or going). If its move is recorded (its uid in the holder's
        ``handled``), an earlier delivery removed it and may have died before recording the
        `Rescheduled` Event: record it now, once (keyed by the uid). Otherwise someone else
        removed it, and there is nothing to do."""
        ns, name = failing.namespace, failing.name
        view = failing.as_failed_pod()
        owner = next((o for o in failing.owner_references if o.get("controller")), None)
        try:
            if owner is None:
                # A bare pod's state went with it onto its replacement (deterministic name).
                snapshot = {"metadata": {**dict((failing.pod or {}).get("metadata") or {})}}
                snapshot["metadata"].update({"name": name, "uid": failing.uid})
                replacement = self.api.get("Pod", ns, bodies.replacement_name(snapshot))
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
        if failing.uid not in _handled_uids(raw):
            trace.note(f"pod {ns}/{name} was not moved by us: nothing to do")
            return None
        failure = failing.failure
        message = (
            f"moved pod {name} off node {failure.node} after {failure.reason}; recorded and "
            "removed earlier by a delivery that ended before saying so"
        )
        if self._event(ref, REASON_RESCHEDULED, message, key=failing.uid, repeat=False):
            trace.note(f"pod {ns}/{name}: its recorded move is now said")
        return None

    # -- terminal failures: the controller replaced the pod before we recorded it ---------------

    def _removed_by_its_statefulset(self, failing: FailingPod) -> bool:
        """A StatefulSet pod the kubelet failed (Evicted, OutOf*, ...) is deleted and recreated
        under its name by the StatefulSet controller itself, usually before this delivery: the
        failure is still worth recording (the event is the only witness left)."""
        failure = failing.failure
        owner = next((o for o in failing.owner_references if o.get("controller")), None)
        return (
            failure.kind is FailureKind.NODE_FIXABLE
            and bool(failure.node)
            and failure.reason in self.cfg.failed_pod_reasons
            and owner is not None
            and owner.get("kind") == OwnerKind.STATEFUL_SET.value
        )

    def _record_removed(
        self, failing: FailingPod, namesake: Pod | None, trace: Trace
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
        found = self._retries(resolution, ns, name, trace)
        if found is None:
            return None
        holder, retries = found
        done = self._record(view, failing.failure, resolution, retries, False, trace)
        if isinstance(done, Deferral) or not done.delete_pod:
            if isinstance(done, Plan):
                return self._reply(failing, done.action, done, resolution)
            return None
        node = failing.failure.node or ""
        self._redirect_replacements(view, node, resolution, trace, namesake=namesake)
        if done.action not in (Action.MOVE, Action.CLEAR_AND_MOVE):
            # A redelivery: the move was recorded (and said) by the delivery that planned it;
            # nothing was removed now, so there is nothing new to say.
            return None
        said = moved(done, failing.failure, name)
        message = f"{said.message} (its StatefulSet had already deleted the failed pod)"
        self._event(holder.ref, said.event_reason, message, key=failing.uid, repeat=False)
        return self._reply(failing, said.action, done, resolution, message=message)

    def _redirect_replacements(
        self,
        failed: Pod,
        node: str,
        resolution: Resolution,
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
            if resolution.holder is not None:
                self._event(
                    resolution.holder.ref,
                    REASON_REPLACEMENT_REDIRECTED,
                    redirect.why,
                    key=redirect.uid,
                    repeat=False,
                )

    # -- steps --------------------------------------------------------------------------------

    def _current_failure(
        self, live: Pod, failing: FailingPod, holder: Holder, trace: Trace
    ) -> Failure | None:
        """The event may be old: judge the pod as it is now, falling back to the event's
        verdict only for a pod we already decided to move (its removal must finish)."""
        now_failing = classify(live, self.cfg, self.clock()) or unschedulable_due_to_exclusions(
            live, self.cfg
        )
        if now_failing is None and failing.failure.kind is FailureKind.EARLY:
            found = classify(live, early_config(self.cfg), self.clock())
            if found is not None and found.node == failing.failure.node:
                now_failing = replace(
                    found, why=f"{found.why}; node {found.node} is suspect: moved at first failure"
                )
        if now_failing is not None:
            return now_failing
        if failing.uid in _handled_uids(holder.annotations.get(STATE_ANNOTATION)):
            return failing.failure
        trace.note(
            f"pod {failing.namespace}/{failing.name} is no longer failing "
            f"({failing.failure.reason} in the event): nothing to do"
        )
        return None

    def _on_suspect_node(self, failing: FailingPod, trace: Trace) -> bool:
        """An early report (the pod's first failure) is acted on only on a suspect node."""
        node = failing.failure.node
        if not self.cfg.suspect_fast_path or not node:
            trace.note("early report: the fast path is off")
            return False
        try:
            found = self.api.get("Node", None, node)
        except kube.NotFound:
            trace.note(f"early report: node {node} is gone")
            return False
        except kube.Forbidden as exc:
            # An install whose RBAC predates the fast path: wait for the full rules.
            log.warning("cannot read node %s for the fast path: %s", node, exc)
            return False
        if not is_suspect(found):
            trace.note(f"early report: node {node} is not suspect, waiting for the thresholds")
            return False
        trace.note(f"early report on suspect node {node}: the fast path")
        return True

    def _record(
        self,
        live: Pod,
        failure: Failure,
        resolution: Resolution,
        retries: int,
        bare: bool,
        trace: Trace,
    ) -> Plan | Deferral:
        """Plan, check that the removal would go through, and write the state,
        compare-and-swap on resourceVersion.

        A move of a workload-wide budget (a ReplicaSet's or a Job's pod) also records the nodes
        where other pods of the same controller are failing now (`_failing_elsewhere`): one
        LIST of pods per move, made once the first plan says "move" (a re-plan after a
        conflict reuses it); none for an event that moves nothing (a duplicate, an exhausted
        budget), a StatefulSet's pod or a bare pod. The same list says whether the workload
        fails the same way everywhere (``shared.workloads.everywhere``): then the move is
        stopped instead, charged nothing. A bare pod is alone by definition, no list needed.
        """
        holder = resolution.holder
        assert holder is not None
        owner_kind = OwnerKind(resolution.owner_kind)
        facts = FailureFacts.from_pod(live, failure, owner_kind)
        attempt = 0
        checked = False
        # The nodes of the pods of the workload failing elsewhere; None until listed.
        also_failing: tuple[str, ...] | None = None
        # The workload's pods as that list found them, while still fresh (this attempt).
        listed: list[Any] | None = None
        # The other pods of the controller, judged; None until listed (never stopped then).
        witnesses: Witnesses | None = ALONE if bare else None
        while True:
            attempt += 1
            reset = parse_reset_after(
                holder.annotations.get(RESET_AFTER_ANNOTATION), self.cfg.reset_after
            )
            if reset.fallback_reason and attempt == 1:
                # Not a reason to do nothing (the user opted in); said once, in the trace.
                trace.note(f"{holder.ref.describe()}: {reset.fallback_reason}")
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
            decide = functools.partial(
                plan,
                state,
                facts,
                policy,
                self.clock(),
                holder_uid=holder.ref.uid,
                handled_limit=self.cfg.handled_uids_max,
                statefulset=holder.statefulset,
            )
            decided = decide(also_failing=also_failing or (), witnesses=witnesses)
            if (
                decided.action is Action.MOVE
                and also_failing is None
                and policy.scope is BudgetScope.WORKLOAD
                and not bare
            ):
                # Listed only now that a move is decided: nothing else needs it.
                wanted = holder.replicas if holder.ref.kind == OwnerKind.REPLICA_SET else None
                also_failing, listed, witnesses = self._failing_elsewhere(
                    live, policy.reset_after, trace, replicas=wanted
                )
                if also_failing or witnesses is not None:
                    decided = decide(also_failing=also_failing, witnesses=witnesses)
            trace.plan = decided
            if decided.new_state is None:
                trace.note(f"plan: {decided.action} ({decided.reason}): {decided.message}")
                if decided.reason == "state-too-large":
                    # Nobody else would ever hear of it: the pod stays failing where it is.
                    self._event(holder.ref, REASON_STATE_TOO_LARGE, decided.message, warning=True)
                return decided
            if decided.action in (Action.MOVE, Action.CLEAR_AND_MOVE):
                # A Job's pod: never the move that fails the Job (shared.workloads.jobs). Judged
                # again on every re-plan, with the re-read Job's counts and state.
                cost = self._job_cost(live, decided, holder, listed)
                trace.job_cost = cost
                if cost is not None and not cost.allowed:
                    return self._job_refused(live, failure, decided, holder, cost, trace)
                if cost is not None:
                    decided = replace(decided, message=f"{decided.message}; {cost.message}")
                    trace.plan = decided
            assert decided.new_state is not None
            if decided.delete_pod and not checked:
                # Once is enough: a re-plan after a conflict removes the same pod the same way.
                refused = self._preflight(live, decided, bare, trace)
                if refused is not None:
                    trace.plan = None
                    return refused
                checked = True
            body = bodies.state_patch(holder.resource_version, dump_state(decided.new_state))
            try:
                self.api.merge_patch(holder.ref.kind, holder.ref.namespace, holder.ref.name, body)
            except kube.Conflict:
                if attempt >= self.max_attempts:
                    raise
                # Someone else wrote first: read their state and decide again. A little
                # jitter keeps many instances from colliding in lockstep.
                time.sleep(random.uniform(0, 0.02 * min(attempt, 10)))
                holder = self._reread(holder)
                # A Job's counts are judged afresh with its re-read status: list again.
                listed = None
                continue
            trace.note(
                f"plan: {decided.action} ({decided.reason}): {decided.message}",
                action=str(decided.action),
                holder=holder.ref.describe(),
                attempts=attempt,
            )
            metrics.DECISIONS.labels(action=str(decided.action)).inc()
            if decided.event_reason and not decided.delete_pod:
                # RetriesExhausted, MovesStopped: nothing to remove, so nothing to wait for. A
                # move's Event waits until the pod is really gone. Said once: the state records
                # it, and a redelivery or a concurrent delivery plans "already recorded".
                self._event(
                    holder.ref,
                    decided.event_reason,
                    decided.message,
                    warning=decided.action in (Action.EXHAUSTED, Action.STOPPED),
                )
            return decided

    def _failing_elsewhere(
        self, live: Pod, reset_after: timedelta, trace: Trace, *, replicas: int | None
    ) -> tuple[tuple[str, ...], list[Any] | None, Witnesses | None]:
        """The nodes where other pods of the failing pod's controller are failing now, for a
        reason another node could fix (shared.workloads.siblings): one LIST of the pod's
        namespace by its labels (a page per 500 pods). Also the pods listed (None when not
        listed), which a Job's move reuses to count its pending failures, and those pods
        judged as witnesses (shared.workloads.everywhere; ``replicas`` is how many the
        controller wants, None when not fixed).

        Best effort: a failed LIST is logged and the move records its own node only, and is
        never stopped (no witness was looked at). A node left out costs at most one more move
        of a replacement that lands there, never a record.
        """
        meta = live.get("metadata", {})
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        selector = sibling_selector(live)
        if selector is None:
            return (), None, None
        try:
            candidates: list[Any] = list(self.api.list_all("Pod", ns, label_selector=selector))
        except kube.KubeError as exc:
            log.warning(
                "could not list the other pods of %s/%s (%s): recording its own node only",
                ns,
                name,
                exc,
            )
            trace.note(f"pod {ns}/{name}: the other pods of its workload could not be listed")
            return (), None, None
        now = self.clock()
        found = failing_siblings(live, candidates, self.cfg, now, reset_after=reset_after)
        others = witnesses_of(live, candidates, self.cfg, now, replicas=replicas)
        if found:
            said = ", ".join(f"{s.name} on {s.node} ({s.reason})" for s in found[:10])
            more = f" and {len(found) - 10} more" if len(found) > 10 else ""
            trace.note(f"pod {ns}/{name}: other pods of its workload failing now: {said}{more}")
        return nodes_of(found), candidates, others

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

    def _preflight(self, live: Pod, decided: Plan, bare: bool, trace: Trace) -> Deferral | None:
        """Server-side dry runs of the calls the removal will make, before the move is
        charged: admission (our webhook included, sideEffects None), RBAC, quotas,
        validation and PodDisruptionBudgets all answer, and nothing is persisted or spent.

        A plain delete is not checked: the cluster-wide right to delete pods is part of the
        install, and its refusal (a deployment problem) is a 500 a person must see anyway.
        """
        meta = live.get("metadata", {})
        ns, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
        dry = self.api.with_options(dry_run=True)
        if bare:
            body = self._replacement(live, decided)
            try:
                dry.create("Pod", ns, body)
            except kube.AlreadyExists:
                pass  # a replacement made earlier: the real create will find it, which is done
            except (kube.Forbidden, kube.Invalid) as exc:
                refused = self._deferral(Step.REPLACEMENT, exc, ns, name, charged=False)
                if refused is None:
                    raise
                trace.note(f"dry run: the replacement of {ns}/{name} would be refused: {exc}")
                return refused
        if self._evicts(live):
            try:
                dry.evict(ns, name, uid=uid)
            except (kube.NotFound, kube.Conflict):
                pass  # gone or replaced meanwhile: the real eviction says so and does nothing
            except kube.DisruptionBudgetRefused as exc:
                trace.note(f"dry run: evicting {ns}/{name} would be refused: {exc}")
                return self._deferral(Step.EVICTION, exc, ns, name, charged=False)
        return None

    def _job_cost(
        self, live: Pod, decided: Plan, holder: Holder, listed: list[Any] | None
    ) -> jobs.MoveCost | None:
        """What removing ``live`` costs its Job (``shared.workloads.jobs``), for a Job's pod
        about to be removed by a move planned now; None otherwise.

        A move the Job ignores (an eviction its pod failure policy ignores) costs one
        judgement and no API call. One the Job counts needs the failures not yet in
        ``status.failed``: the Job's pods, from ``listed`` (the sibling list of this attempt,
        which the pod's labels, controller-uid among them, selected) or else one LIST by the
        controller-uid label the Job controller puts on them (KubeErrors propagate: without
        the count, no counted move).
        """
        facts = holder.job
        if facts is None or decided.new_state is None or not decided.delete_pod:
            return None
        if not facts.builtin:
            return None  # another controller decides what a removed pod costs
        evicting = self._evicts(live)
        if jobs.judge_removal(facts, live, evicting=evicting).outcome is jobs.Outcome.IGNORED:
            return jobs.move_cost(facts, live, evicting=evicting, pending=frozenset())
        if listed is None:
            selector = f"{JOB_CONTROLLER_UID_LABEL}={holder.ref.uid}"
            listed = list(self.api.list_all("Pod", holder.ref.namespace, label_selector=selector))
        # Only the Job's own pods, whatever labels another pod may share with them.
        pods = [p for p in listed if (controller_of(p) or {}).get("uid") == holder.ref.uid]
        pending = jobs.pending_failures(facts, pods, decided.new_state.handled)
        return jobs.move_cost(facts, live, evicting=evicting, pending=pending)

    def _job_refused(
        self,
        live: Pod,
        failure: Failure,
        decided: Plan,
        holder: Holder,
        cost: jobs.MoveCost,
        trace: Trace,
    ) -> Plan:
        """The move would fail the pod's Job: nothing is written or removed, and a Warning on
        the Job (one per pod, counted when the sweep sends the pod again) says why."""
        meta = live.get("metadata", {})
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
        trace.plan = refused
        trace.note(f"plan: {refused.action} ({refused.reason}): {message}")
        metrics.DECISIONS.labels(action=str(cost.verdict)).inc()
        self._event(
            holder.ref,
            REASON_MOVE_WOULD_FAIL_JOB,
            message,
            warning=True,
            key=str(meta.get("uid", "")),
        )
        return refused

    def _replacement(self, live: Pod, decided: Plan) -> dict[str, Any]:
        meta = live.get("metadata", {})
        snapshot = {"metadata": dict(meta), "spec": live.get("spec", {})}
        state_json = (meta.get("annotations") or {}).get(STATE_ANNOTATION)
        if decided.new_state is not None:
            state_json = dump_state(decided.new_state)
        return bodies.replacement_pod(snapshot, state_json or "")

    def _lineage_goes_on(self, live: Pod, trace: Trace) -> bool:
        """Whether a live pod already carries this bare pod's move (its uid in the state it
        inherited): the replacement exists, or a descendant of it does."""
        meta = live.get("metadata", {})
        ns, uid = meta.get("namespace", ""), meta.get("uid", "")
        try:
            siblings = list(self.api.list_all("Pod", ns, label_selector=label_selector(live)))
        except kube.KubeError as exc:
            log.warning(
                "could not look for the replacements of %s/%s: %s", ns, meta.get("name"), exc
            )
            return False
        for pod in siblings:
            pmeta = pod.get("metadata") or {}
            if pmeta.get("uid") == uid or pmeta.get("deletionTimestamp"):
                continue
            if uid in _handled_uids((pmeta.get("annotations") or {}).get(STATE_ANNOTATION)):
                trace.note(f"pod {ns}/{pmeta.get('name')} already carries the move of {uid}")
                return True
        return False

    def _remove(self, live: Pod, decided: Plan, bare: bool, trace: Trace) -> Removal | Deferral:
        """Remove the pod whose move is recorded. A refusal here comes after the state write
        (a race with a PodDisruptionBudget or RBAC since the dry run, or a redelivery
        finishing an earlier move): the uid is in ``handled``, so the next delivery finishes
        the removal without counting the move again."""
        meta = live.get("metadata", {})
        ns, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
        if bare and decided.action is Action.NOTHING and self._lineage_goes_on(live, trace):
            # A redelivery after a death between the replacement's create and this delete,
            # and the replacement has since been moved on in its turn: creating it again would
            # make one bare pod two.
            bare = False
        if bare:
            body = self._replacement(live, decided)
            try:
                self.api.create("Pod", ns, body)
                trace.note(f"created replacement pod {ns}/{body['metadata']['name']}")
            except kube.AlreadyExists:
                trace.note(f"replacement pod {ns}/{body['metadata']['name']} already exists")
            except (kube.Forbidden, kube.Invalid) as exc:
                refused = self._deferral(Step.REPLACEMENT, exc, ns, name, charged=True)
                if refused is None:
                    raise
                trace.note(f"the replacement of {ns}/{name} was refused: {exc}")
                return refused
        try:
            if self._evicts(live):
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

    def _evicts(self, live: Pod) -> bool:
        """Whether the pod is removed with the Eviction API rather than a DELETE: with
        ``use_eviction``, and always for a Job's pod, whose eviction sets the
        ``DisruptionTarget`` condition a pod failure policy can ignore
        (``shared.workloads.jobs``; a DELETE sets none, and the Job counts the pod against its
        backoffLimit)."""
        owner = controller_of(live)
        return self.cfg.use_eviction or (owner is not None and owner.get("kind") == JOB)

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
            },
        )

    def _invalid_policy(self, resolution: Resolution, bad: InvalidPolicy, trace: Trace) -> None:
        where = resolution.policy_ref or (resolution.holder.ref if resolution.holder else None)
        trace.note(f"invalid scheduling-retries: {bad.reason}")
        if where is not None:
            self._event(where, REASON_INVALID_POLICY, bad.reason, warning=True)

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


def _handled_uids(raw: str | None) -> tuple[str, ...]:
    try:
        return load_state(raw).handled
    except StateError:
        return ()
