"""Is this pod failing in a way another node could fix?

detect-failures calls `classify` on every pod event, with no API access: the pod object alone
must say whether it is failing, on which node, and why. Each answer carries the evidence
(`Failure.why`) so a person reading an Event or a log line can check the decision.

The rules lean towards leaving pods alone. A pod is only moved when the failure is plausibly
the node's (a crash loop, an OOM kill, a kubelet eviction or rejection, a broken runtime or
image mirror) and never when the failure follows the pod everywhere (a missing ConfigMap, an
invalid image name), when the pod belongs on its node (DaemonSet and static pods), or when it
is already going away.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from shared.config import NEVER_MOVE_REASONS, Config
from shared.constants import EXCLUDED_NODES_ANNOTATION, POLICY_STAMP_ANNOTATION
from shared.kubetypes import ContainerStatus, OwnerReference, Pod, PodCondition
from shared.policy import (
    MAX_RETRIES,
    InvalidPolicy,
    format_duration,
    parse_kube_time,
    parse_retries,
)

# The kubelet sets this on the API mirror of a static pod; deleting a mirror does not stop the
# static pod, the kubelet just recreates the mirror.
MIRROR_POD_ANNOTATION: Final = "kubernetes.io/config.mirror"

CRASH_LOOP_BACK_OFF: Final = "CrashLoopBackOff"
# Waiting reasons of a pod the kubelet accepted but has not started yet.
_STARTING_REASONS: Final = frozenset({"ContainerCreating", "PodInitializing"})
STUCK_PENDING: Final = "StuckPending"


class FailureKind(StrEnum):
    # The pod failed on its node; moving it elsewhere may fix it.
    NODE_FIXABLE = "node-fixable"
    # The pod cannot be scheduled at all because of the nodes we excluded.
    EXCLUSIONS_UNSCHEDULABLE = "exclusions-unschedulable"


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    # The kubelet's (or scheduler's) reason: CrashLoopBackOff, OOMKilled, Evicted, ...
    reason: str
    message: str
    # The node it failed on; None for an unschedulable pod, which never reached one.
    node: str | None
    container: str | None = None
    init_container: bool = False
    restart_count: int = 0
    why: str = ""
    # How long the failing container ran before this failure (its last run), in whole seconds;
    # 0 when it never started, None when nothing on the pod says (an unschedulable pod).
    # `plan` compares it with reset-after: not the pod's age, which counts time spent
    # crash-looping or Pending as time run.
    ran_for_seconds: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for CloudEvent data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Failure:
        """Read `to_dict` output back; raise ValueError when it is not one."""
        try:
            kind = FailureKind(data["kind"])
            reason, message, why = data["reason"], data.get("message", ""), data.get("why", "")
            node, container = data.get("node"), data.get("container")
            init_container, restarts = (
                data.get("init_container", False),
                data.get("restart_count", 0),
            )
            ran_for = data.get("ran_for_seconds")
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a failure: {err}") from err
        if not (
            isinstance(reason, str)
            and isinstance(message, str)
            and isinstance(why, str)
            and (node is None or isinstance(node, str))
            and (container is None or isinstance(container, str))
            and isinstance(init_container, bool)
            and isinstance(restarts, int)
            and not isinstance(restarts, bool)
            and (ran_for is None or (type(ran_for) is int and ran_for >= 0))
        ):
            raise ValueError("not a failure: a field has the wrong type")
        return cls(kind, reason, message, node, container, init_container, restarts, why, ran_for)


def controller_of(pod: Pod) -> OwnerReference | None:
    """The ownerReference with controller=true, the one object that recreates the pod."""
    for ref in pod.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def skip_reason(pod: Pod, cfg: Config) -> str | None:
    """Why this pod is never ours to move, or None if it may be."""
    meta = pod.get("metadata", {})
    if meta.get("deletionTimestamp"):
        return "pod is already being deleted"
    if cfg.is_excluded_namespace(meta.get("namespace")):
        return f"namespace {meta.get('namespace')} is excluded"
    if MIRROR_POD_ANNOTATION in (meta.get("annotations") or {}):
        return "static (mirror) pods belong to their node"
    owner = controller_of(pod)
    if owner is not None and owner.get("kind") == "Node":
        return "static (mirror) pods belong to their node"
    if owner is not None and owner.get("kind") == "DaemonSet":
        return "DaemonSet pods belong on every node"
    phase = pod.get("status", {}).get("phase")
    if phase == "Succeeded":
        return "pod completed successfully"
    return None


def excluded_nodes_of(pod: Pod) -> tuple[str, ...]:
    """The nodes the webhook stamped on this pod (empty when none or unreadable)."""
    raw = (pod.get("metadata", {}).get("annotations") or {}).get(EXCLUDED_NODES_ANNOTATION)
    if not raw:
        return ()
    try:
        nodes = json.loads(raw)
    except ValueError:
        return ()
    if not isinstance(nodes, list):
        return ()
    return tuple(node for node in nodes if isinstance(node, str) and node)


def policy_of(pod: Pod, max_retries: int = MAX_RETRIES) -> int | InvalidPolicy | None:
    """The retries the webhook stamped on the pod: None if not stamped, 0 if disabled."""
    stamp = (pod.get("metadata", {}).get("annotations") or {}).get(POLICY_STAMP_ANNOTATION)
    return parse_retries(stamp, max_retries)


def classify(pod: Pod, cfg: Config) -> Failure | None:
    """The failure that makes this pod worth moving, or None to leave it alone.

    Pod-level failures (phase Failed by the kubelet) come first, then init containers, then
    containers, so the answer is deterministic when several things are wrong at once.
    """
    if skip_reason(pod, cfg) is not None:
        return None
    unschedulable = unschedulable_due_to_exclusions(pod, cfg)
    if unschedulable is not None:
        return unschedulable
    node = pod.get("spec", {}).get("nodeName")
    if not node:
        return None
    statuses = list(_container_statuses(pod))
    # A container that can never start (missing Secret, invalid image) fails on every node:
    # moving the pod would only spend the budget, whatever else is wrong with it.
    for _, status in statuses:
        waiting = status.get("state", {}).get("waiting", {})
        if waiting.get("reason") in NEVER_MOVE_REASONS:
            return None
    pod_failure = _pod_failed(pod, node, cfg)
    if pod_failure is not None:
        return pod_failure
    for is_init, status in statuses:
        failure = _container_failure(status, is_init, node, cfg)
        if failure is not None:
            return failure
    return None


def unschedulable_due_to_exclusions(pod: Pod, cfg: Config) -> Failure | None:
    """A pod the scheduler cannot place while it carries exclusions from us.

    We cannot tell from the pod whether the exclusions alone are to blame (the scheduler's
    message only counts nodes per filter), but clearing them is always safe: the next pod
    carries none, so this cannot loop.
    """
    if skip_reason(pod, cfg) is not None:
        return None
    if pod.get("spec", {}).get("nodeName"):
        return None
    scheduled = _condition(pod, "PodScheduled")
    if scheduled is None or scheduled.get("status") != "False":
        return None
    if scheduled.get("reason") != "Unschedulable":
        return None
    excluded = excluded_nodes_of(pod)
    if not excluded:
        return None
    message = scheduled.get("message", "")
    return Failure(
        kind=FailureKind.EXCLUSIONS_UNSCHEDULABLE,
        reason="Unschedulable",
        message=message,
        node=None,
        why=(
            f"pod cannot be scheduled while it avoids {len(excluded)} node(s) excluded by "
            f"kn-rescheduler ({', '.join(excluded)}): {message or 'no message'}"
        ),
    )


def stuck_pending(pod: Pod, cfg: Config, now: datetime) -> Failure | None:
    """A pod bound to a node whose kubelet has not started it for too long.

    The kubelet reports nothing while it is stuck (a hung runtime, a volume that never
    attaches, a dead kubelet), so no event ever says so: the sweep calls this for every pod.
    Only starting states count (no status yet, ContainerCreating, PodInitializing); a
    running init container or any other waiting reason is progress or a failure `classify`
    judges.
    """
    if skip_reason(pod, cfg) is not None:
        return None
    node = pod.get("spec", {}).get("nodeName")
    status = pod.get("status", {})
    if not node or status.get("phase", "Pending") != "Pending":
        return None
    waiting_reasons = []
    for _, container in _container_statuses(pod):
        state = container.get("state", {})
        reason = state.get("waiting", {}).get("reason")
        if "waiting" not in state or reason not in _STARTING_REASONS:
            return None
        waiting_reasons.append(reason)
    since = parse_kube_time(status.get("startTime"))
    if since is None:
        # startTime is set by the kubelet; a dead kubelet never sets it, so fall back to the
        # moment the scheduler bound the pod.
        scheduled = _condition(pod, "PodScheduled")
        if scheduled is not None and scheduled.get("status") == "True":
            since = parse_kube_time(scheduled.get("lastTransitionTime"))
    if since is None:
        return None
    pending_for = now - since
    if pending_for < cfg.pending_stuck_after:
        return None
    state_text = ", ".join(sorted(set(waiting_reasons))) or "no container status at all"
    return Failure(
        kind=FailureKind.NODE_FIXABLE,
        reason=STUCK_PENDING,
        message=f"pending on {node} for {format_duration(pending_for)}",
        node=node,
        why=(
            f"pod has been bound to node {node} for {format_duration(pending_for)} "
            f"(threshold {format_duration(cfg.pending_stuck_after)}) and is still "
            f"starting: {state_text}"
        ),
    )


def _container_statuses(pod: Pod) -> Iterator[tuple[bool, ContainerStatus]]:
    status = pod.get("status", {})
    for init in status.get("initContainerStatuses") or []:
        yield True, init
    for container in status.get("containerStatuses") or []:
        yield False, container


def _condition(pod: Pod, kind: str) -> PodCondition | None:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return None


def _pod_failed(pod: Pod, node: str, cfg: Config) -> Failure | None:
    status = pod.get("status", {})
    if status.get("phase") != "Failed":
        return None
    reason = status.get("reason", "")
    if reason not in cfg.failed_pod_reasons:
        return None
    message = status.get("message", "")
    return Failure(
        kind=FailureKind.NODE_FIXABLE,
        reason=reason,
        message=message,
        node=node,
        why=f"node {node} failed the pod ({reason}): {message or 'no message'}",
    )


def _container_failure(
    status: ContainerStatus, is_init: bool, node: str, cfg: Config
) -> Failure | None:
    name = status.get("name", "")
    what = f"{'init container' if is_init else 'container'} {name}"
    restarts = status.get("restartCount", 0)
    state = status.get("state", {})
    waiting = state.get("waiting", {})
    waiting_reason = waiting.get("reason", "")
    last = status.get("lastState", {}).get("terminated", {})
    terminated = state.get("terminated", {})

    def failure(reason: str, message: str, why: str) -> Failure:
        return Failure(
            kind=FailureKind.NODE_FIXABLE,
            reason=reason,
            message=message,
            node=node,
            container=name or None,
            init_container=is_init,
            restart_count=restarts,
            why=f"{what} on node {node}: {why}",
        )

    if terminated.get("reason") in cfg.termination_reasons:
        reason = terminated["reason"]
        return failure(reason, terminated.get("message", ""), f"terminated with {reason}")
    # lastState keeps the previous termination forever; once the container runs again that
    # old kill is history, not a reason to move a pod that has recovered.
    if last.get("reason") in cfg.termination_reasons and "running" not in state:
        reason = last["reason"]
        return failure(
            reason,
            last.get("message", ""),
            f"was {reason} (exit code {last.get('exitCode', '?')}) "
            f"and has restarted {restarts} time(s)",
        )
    if waiting_reason == CRASH_LOOP_BACK_OFF:
        if restarts < cfg.crashloop_restart_threshold:
            return None
        last_exit = (
            f"; last exit: {last.get('reason', 'unknown')} (code {last.get('exitCode', '?')})"
            if last
            else ""
        )
        return failure(
            waiting_reason,
            waiting.get("message", ""),
            f"{waiting_reason} after {restarts} restarts "
            f"(threshold {cfg.crashloop_restart_threshold}){last_exit}",
        )
    if waiting_reason in cfg.waiting_reasons:
        message = waiting.get("message", "")
        return failure(
            waiting_reason, message, f"waiting with {waiting_reason}: {message or 'no message'}"
        )
    return None
