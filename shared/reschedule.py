"""Acting on a failing pod: the logic of update-annotations.

The order of work is what keeps it safe under at-least-once, unordered, concurrent delivery:

1. Read the pod as it is now. Gone, replaced by a namesake, or being deleted: nothing to do.
2. Resolve its owner chain (policy, and the object that holds the state).
3. ``plan`` against the holder's state and write the new state with the holder's
   resourceVersion as precondition; on 409 re-read and re-plan (many instances acting on one
   workload at once lose no update).
4. Only then remove the pod (delete with a uid precondition, or evict). So no pod is ever
   moved without a record, and a redelivered event finds its uid in the state (``plan``
   answers "already handled") and finishes a removal that failed half-way.

A bare pod has no controller to recreate it: its replacement is created first (same spec,
unbound, carrying the state, under a name derived from the old pod's uid), then the old pod
is deleted. A redelivery after a failure in between finds the replacement (409 AlreadyExists:
done) and deletes the old pod; a pod a person deleted is never brought back.
"""

from __future__ import annotations

import contextvars
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared import bodies, events, kube, metrics
from shared.classify import Failure, classify, unschedulable_due_to_exclusions
from shared.config import Config
from shared.constants import (
    EVENT_POD_EXHAUSTED,
    EVENT_POD_RESCHEDULED,
    REASON_INVALID_POLICY,
    RESET_AFTER_ANNOTATION,
    STATE_ANNOTATION,
)
from shared.failing import FailingPod
from shared.kubetypes import Pod
from shared.owners import BARE, Holder, Ref, Resolution, resolve
from shared.policy import InvalidPolicy, OwnerKind, Policy, parse_reset_after, parse_retries
from shared.state import Action, FailureFacts, Plan, StateError, dump_state, load_state, plan

log = logging.getLogger(__name__)


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

    def note(self, message: str, **extra: Any) -> None:
        self.steps.append(message)
        log.info(message, extra=extra)


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
        try:
            live: Pod = self.api.get("Pod", ns, name)  # type: ignore[assignment]
        except kube.NotFound:
            trace.note(f"pod {ns}/{name} is gone: nothing to do")
            return None
        meta = live.get("metadata", {})
        if meta.get("uid") != failing.uid:
            trace.note(f"pod {ns}/{name} was replaced (uid {meta.get('uid')}): nothing to do")
            return None
        if meta.get("deletionTimestamp"):
            trace.note(f"pod {ns}/{name} is already being deleted: nothing to do")
            return None

        resolution = resolve(self.api, ns, live)
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

        failure = self._current_failure(live, failing, resolution.holder, trace)
        if failure is None:
            return None
        done = self._record(live, failure, resolution, retries, trace)
        if done.delete_pod:
            self._remove(live, done, resolution.owner_kind == BARE, trace)
        return self._reply(failing, done, resolution)

    # -- steps --------------------------------------------------------------------------------

    def _current_failure(
        self, live: Pod, failing: FailingPod, holder: Holder, trace: Trace
    ) -> Failure | None:
        """The event may be old: judge the pod as it is now, falling back to the event's
        verdict only for a pod we already decided to move (its removal must finish)."""
        now_failing = classify(live, self.cfg) or unschedulable_due_to_exclusions(live, self.cfg)
        if now_failing is not None:
            return now_failing
        if failing.uid in _handled_uids(holder.annotations.get(STATE_ANNOTATION)):
            return failing.failure
        trace.note(
            f"pod {failing.namespace}/{failing.name} is no longer failing "
            f"({failing.failure.reason} in the event): nothing to do"
        )
        return None

    def _record(
        self,
        live: Pod,
        failure: Failure,
        resolution: Resolution,
        retries: int,
        trace: Trace,
    ) -> Plan:
        """Plan and write the state, compare-and-swap on resourceVersion."""
        holder = resolution.holder
        assert holder is not None
        owner_kind = OwnerKind(resolution.owner_kind)
        facts = FailureFacts.from_pod(live, failure, owner_kind)
        attempt = 0
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
            decided = plan(
                state, facts, policy, self.clock(), handled_limit=self.cfg.handled_uids_max
            )
            trace.plan = decided
            if decided.new_state is None:
                trace.note(f"plan: {decided.action} ({decided.reason}): {decided.message}")
                return decided
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
                continue
            trace.note(
                f"plan: {decided.action} ({decided.reason}): {decided.message}",
                action=str(decided.action),
                holder=holder.ref.describe(),
                attempts=attempt,
            )
            metrics.DECISIONS.labels(action=str(decided.action)).inc()
            if decided.event_reason:
                self._event(
                    holder.ref,
                    decided.event_reason,
                    decided.message,
                    warning=decided.action is Action.EXHAUSTED,
                )
            return decided

    def _reread(self, holder: Holder) -> Holder:
        obj = self.api.get(holder.ref.kind, holder.ref.namespace, holder.ref.name)
        meta = obj.get("metadata") or {}
        replicas = (obj.get("spec") or {}).get("replicas")
        return Holder(
            ref=holder.ref,
            resource_version=str(meta.get("resourceVersion", "")),
            annotations=dict(meta.get("annotations") or {}),
            replicas=replicas if isinstance(replicas, int) else holder.replicas,
        )

    def _remove(self, live: Pod, decided: Plan, bare: bool, trace: Trace) -> None:
        meta = live.get("metadata", {})
        ns, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
        if bare:
            snapshot = {"metadata": dict(meta), "spec": live.get("spec", {})}
            state_json = (meta.get("annotations") or {}).get(STATE_ANNOTATION)
            if decided.new_state is not None:
                state_json = dump_state(decided.new_state)
            body = bodies.replacement_pod(snapshot, state_json or "")
            try:
                self.api.create("Pod", ns, body)
                trace.note(f"created replacement pod {ns}/{body['metadata']['name']}")
            except kube.AlreadyExists:
                trace.note(f"replacement pod {ns}/{body['metadata']['name']} already exists")
        try:
            if self.cfg.use_eviction:
                self.api.evict(ns, name, uid=uid)
                trace.note(f"evicted pod {ns}/{name}")
            else:
                self.api.delete("Pod", ns, name, uid=uid)
                trace.note(f"deleted pod {ns}/{name} (uid {uid})")
        except kube.NotFound:
            trace.note(f"pod {ns}/{name} already gone")
        except kube.Conflict:
            # The uid precondition failed: this incarnation is gone, a namesake took its place.
            trace.note(f"pod {ns}/{name} was already replaced")

    def _reply(
        self, failing: FailingPod, decided: Plan, resolution: Resolution
    ) -> events.Reply | None:
        if decided.action in (Action.MOVE, Action.CLEAR_AND_MOVE):
            kind = EVENT_POD_RESCHEDULED
        elif decided.action is Action.EXHAUSTED:
            kind = EVENT_POD_EXHAUSTED
        else:
            return None
        holder = resolution.holder
        assert holder is not None
        return events.Reply(
            type=kind,
            subject=failing.subject,
            data={
                "namespace": failing.namespace,
                "name": failing.name,
                "uid": failing.uid,
                "node": failing.failure.node,
                "reason": failing.failure.reason,
                "action": str(decided.action),
                "workload": {"kind": holder.ref.kind, "name": holder.ref.name},
                "moves": decided.moves,
                "budget": decided.budget,
                "excludedNodes": list(decided.excluded_nodes),
                "exclusionsCleared": decided.exclusions_cleared,
                "message": decided.message,
            },
        )

    def _invalid_policy(self, resolution: Resolution, bad: InvalidPolicy, trace: Trace) -> None:
        where = resolution.policy_ref or (resolution.holder.ref if resolution.holder else None)
        trace.note(f"invalid scheduling-retries: {bad.reason}")
        if where is not None:
            self._event(where, REASON_INVALID_POLICY, bad.reason, warning=True)

    def _event(self, ref: Ref, reason: str, message: str, *, warning: bool = False) -> None:
        """Best effort: an Event is for people; failing to write one must not undo a move."""
        body = bodies.event_body(ref, reason, message, self.clock(), warning=warning)
        try:
            self.api.create("Event", ref.namespace, body)
        except kube.KubeError as exc:
            log.warning("could not record Event %s on %s: %s", reason, ref.describe(), exc)


def _handled_uids(raw: str | None) -> tuple[str, ...]:
    try:
        return load_state(raw).handled
    except StateError:
        return ()
