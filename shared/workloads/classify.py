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
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from shared.api.keys import (
    EXCLUDED_NODES_ANNOTATION,
    MIRROR_POD_ANNOTATION,
    OPT_OUT_LABEL,
    POLICY_ANNOTATION,
    POLICY_STAMP_ANNOTATION,
    STUCK_AFTER_ANNOTATION,
)
from shared.api.kubetypes import ContainerStatus, OwnerReference, Pod, PodCondition
from shared.api.times import format_duration, parse_duration, parse_kube_time
from shared.platform.config import (
    IMAGE_EVERYWHERE_PATTERNS,
    MAX_RETRIES,
    NEVER_MOVE_REASONS,
    START_EVERYWHERE_PATTERNS,
    Config,
)
from shared.workloads.podevents import (
    FAILED_CREATE_POD_SANDBOX,
    ImagePull,
    PodEvent,
    missing_volume_source,
    sandbox_doubtful,
    sandbox_failures,
    sandbox_follows_pod,
)
from shared.workloads.podshape import judges_pod
from shared.workloads.policy import (
    InvalidPolicy,
    parse_retries,
)

CRASH_LOOP_BACK_OFF: Final = "CrashLoopBackOff"
# Waiting reasons of a pod the kubelet accepted but has not started yet.
_STARTING_REASONS: Final = frozenset({"ContainerCreating", "PodInitializing"})
STUCK_PENDING: Final = "StuckPending"


class FailureKind(StrEnum):
    # The pod failed on its node; moving it elsewhere may fix it.
    NODE_FIXABLE = "node-fixable"
    # The pod cannot be scheduled at all because of the nodes we excluded.
    EXCLUSIONS_UNSCHEDULABLE = "exclusions-unschedulable"
    # The pod's first node-fixable failure, below the thresholds: worth a move only when its
    # node is already suspect (the fast path, shared/workloads/fastpath.py).
    EARLY = "early"


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


@judges_pod
def skip_reason(pod: Pod, cfg: Config) -> str | None:
    """Why this pod is never ours to move, or None if it may be.

    The one skip rule every function applies (detect-failures, the sweep, update-annotations on
    the live pod, the webhook for the opt-out label): a pod labelled after creation is left
    alone from then on.
    """
    meta = pod.get("metadata", {})
    if meta.get("deletionTimestamp"):
        return "pod is already being deleted"
    if cfg.is_excluded_namespace(meta.get("namespace")):
        return f"namespace {meta.get('namespace')} is excluded"
    if OPT_OUT_LABEL in (meta.get("labels") or {}):
        return f"pod has the {OPT_OUT_LABEL} label"
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


@judges_pod
def excluded_nodes_of(pod: Pod) -> tuple[str, ...]:
    """The nodes the webhook stamped on this pod (empty when none or unreadable)."""
    raw = (pod.get("metadata", {}).get("annotations") or {}).get(EXCLUDED_NODES_ANNOTATION)
    if not raw:
        return ()
    try:
        nodes = json.loads(raw)
    except (ValueError, RecursionError):
        return ()
    if not isinstance(nodes, list):
        return ()
    return tuple(node for node in nodes if isinstance(node, str) and node)


@judges_pod
def policy_of(pod: Pod, max_retries: int = MAX_RETRIES) -> int | InvalidPolicy | None:
    """The retries in force on the pod: None if it never opted in, 0 if disabled.

    The webhook's stamp (a key of ours) first; then the pod's own `scheduling-retries`, which
    is where a bare pod keeps its policy (and where releases before the stamp had its own key
    wrote it). A pod orphaned from its ReplicaSet still carries the stamp and is forwarded;
    update-annotations then finds no controller and reads only the pod's own key.
    """
    annotations = pod.get("metadata", {}).get("annotations") or {}
    stamp = annotations.get(POLICY_STAMP_ANNOTATION)
    if stamp is None:
        stamp = annotations.get(POLICY_ANNOTATION)
    return parse_retries(stamp, max_retries)


@judges_pod
def worth_forwarding(pod: Pod, cfg: Config) -> bool:
    """Whether detect-failures and the sweep pass this pod's failure on.

    Opted-in pods (an invalid value too: update-annotations warns about it), and pods the
    webhook never saw when the operator asked for them (`forward_unstamped`). A pod that our
    own exclusions keep from being scheduled is always forwarded, whatever its policy says
    now: "0" must not leave it Pending for ever.
    """
    policy = policy_of(pod)
    if policy == 0:
        return False
    return policy is not None or cfg.forward_unstamped


@judges_pod
def classify(pod: Pod, cfg: Config, now: datetime | None = None) -> Failure | None:
    """The failure that makes this pod worth moving, or None to leave it alone.

    Pod-level failures (phase Failed by the kubelet) come first, then init containers, then
    containers, so the answer is deterministic when several things are wrong at once. ``now``
    is the clock for the rules that need the kubelet to have kept failing for a while; None
    means the current time (callers that own a clock pass it).
    """
    if skip_reason(pod, cfg) is not None:
        return None
    unschedulable = unschedulable_due_to_exclusions(pod, cfg)
    if unschedulable is not None:
        return unschedulable
    node = pod.get("spec", {}).get("nodeName")
    if not node:
        return None
    when = now if now is not None else datetime.now(UTC)
    statuses = list(_container_statuses(pod))
    # A container that can never start (missing Secret, invalid image, a tag that does not
    # exist, a command the image lacks) fails on every node: moving the pod would only spend
    # the budget, whatever else is wrong with it.
    for _, status in statuses:
        if fails_everywhere(status) is not None:
            return None
    if evicted_for_its_own_limits(pod) is not None:
        return None
    pod_failure = _pod_failed(pod, node, cfg)
    if pod_failure is not None:
        return pod_failure
    specs = _container_specs(pod)
    for is_init, status in statuses:
        failure = _container_failure(pod, status, specs, is_init, node, cfg, when)
        if failure is not None:
            return failure
    return None


def fails_everywhere(status: ContainerStatus) -> str | None:
    """Why this container would fail the same way on every node, or None.

    A never-move waiting reason, or a message that blames the image or its command (see
    IMAGE_EVERYWHERE_PATTERNS and START_EVERYWHERE_PATTERNS in shared.platform.config).
    """
    state = status.get("state", {})
    waiting = state.get("waiting", {})
    reason = waiting.get("reason", "")
    if reason in NEVER_MOVE_REASONS:
        return f"{reason} fails on every node"
    if reason in _IMAGE_PULL_REASONS:
        matched = _matches(_IMAGE_EVERYWHERE + _REGISTRY_ANSWERS, waiting.get("message", ""))
        if matched:
            return f"{reason}: the registry answered {matched!r}, which no node can change"
    messages = [waiting.get("message", "")] if reason in _START_FAILURE_REASONS else []
    for block in (state.get("terminated", {}), status.get("lastState", {}).get("terminated", {})):
        # Only the runtime's own start failures: an application's termination message
        # ("Error") is its own text and proves nothing about the image.
        if block.get("reason") in _START_FAILURE_REASONS:
            messages.append(block.get("message", ""))
    for message in messages:
        matched = _matches(_START_EVERYWHERE + _OWN_COMMAND_MISSING, message)
        if matched:
            return f"the container's command is not in its image ({matched!r})"
        matched = _matches(_OWN_READ_ONLY_MOUNT, message)
        if matched:
            return f"a mount point of the pod's own spec lies in a read-only path ({matched!r})"
    return None


def same_failure(reason: str, other: str) -> bool:
    """Whether two failure reasons name the same failure.

    The kubelet writes one failed image pull under two waiting reasons, by where its retry
    stands when the status is written: `ErrImagePull` after an attempt failed,
    `ImagePullBackOff` while it waits to try again (pkg/kubelet/images/image_manager.go returns
    ErrImagePullBackOff while the image's key is in back-off, types.go names both). Which one
    a failure event carries is the timing of one status write, not a difference in the node.
    """
    if reason == other:
        return True
    return reason in _IMAGE_PULL_REASONS and other in _IMAGE_PULL_REASONS


@judges_pod
def evicted_for_its_own_limits(pod: Pod) -> str | None:
    """Why the kubelet's eviction of this pod follows it to every node, or None.

    Besides node pressure, the eviction manager evicts a pod that outgrows its own local
    storage limits: the pod's or a container's `ephemeral-storage` limit, an emptyDir's
    `sizeLimit` (pkg/kubelet/eviction/eviction_manager.go, localStorageEviction). Those are
    the pod's own numbers and its usage comes with it: every node would evict it again.
    Only the kubelet's message tells the kinds apart (reason Evicted for all of them).
    """
    status = pod.get("status", {})
    if status.get("phase") != "Failed" or status.get("reason") != "Evicted":
        return None
    matched = _matches(_OWN_LIMIT_EVICTIONS, status.get("message", ""))
    if matched:
        return f"evicted for exceeding its own limit ({matched!r}), which every node enforces"
    return None


@judges_pod
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


@judges_pod
@dataclass(frozen=True)
class Started:
    """A container of a controller's pod that the runtime started on a node: which pod of
    which controller ran which image where (its download, if any, is the pod's Pulled Event)."""

    controller: str
    pod: str
    container: str
    image: str
    node: str
    at: datetime


@judges_pod
def started_containers(pod: Pod) -> list[Started]:
    """Every container of ``pod`` that started (running, or ended after a real start), with
    the image its spec names, when its pod has a controller and a node."""
    ref = controller_of(pod)
    node = pod.get("spec", {}).get("nodeName")
    if ref is None or not ref.get("uid") or not node:
        return []
    uid = str(pod.get("metadata", {}).get("uid", ""))
    specs = _container_specs(pod)
    found = []
    for is_init, status in _container_statuses(pod):
        state = status.get("state", {})
        block = state.get("running") or state.get("terminated") or {}
        at = parse_kube_time(block.get("startedAt"))
        image = (specs.get((is_init, status.get("name", ""))) or {}).get("image")
        if at is None or at <= _NEVER_STARTED or not image:
            continue
        found.append(Started(str(ref["uid"]), uid, status.get("name", ""), str(image), node, at))
    return found


# How much longer than a sibling's download elsewhere a pull may run before it counts as hung:
# nodes differ in bandwidth and disk.
PULL_SLOWER_THAN_SIBLING: Final = 3
# The slowest a healthy node downloads: an image of N bytes gets at least N / this before its
# pull counts as hung, whatever a sibling's pull took (a sibling that had most layers already
# "pulls" a big image in seconds).
PULL_RATE_FLOOR: Final = 10 * 1024 * 1024  # bytes per second


def _short(took: timedelta) -> str:
    """A download's time as the kubelet prints it: milliseconds under a second."""
    if took < timedelta(seconds=1):
        return f"{took // timedelta(milliseconds=1)}ms"
    return format_duration(took)


def _same_image(spec: str, pulled: str) -> bool:
    """Whether the kubelet's Pulled message names the spec's image: since v1.30 it prints the
    reference with the default tag applied (applyDefaultImageTag: "busybox" -> "busybox:latest"),
    before that the spec's text as written."""
    if spec == pulled:
        return True
    last = spec.rsplit("/", 1)[-1]
    return "@" not in spec and ":" not in last and pulled == f"{spec}:latest"


@dataclass(frozen=True)
class PulledBeside:
    """A sibling's download of the image a pod is still waiting for, on another node."""

    started: Started
    pull: ImagePull


def _pulled_now(pod: Pod) -> tuple[bool, str] | None:
    """The container whose image the kubelet pulls first, and whether it is an init container:
    the first init container in the spec, else the first container. The kubelet starts them in
    that order, each after its own pull (kuberuntime SyncPod), and every container shows
    ContainerCreating (or PodInitializing) while the first one's image comes; the statuses are
    sorted by name, not by that order. None when the spec names none."""
    spec = pod.get("spec", {})
    for is_init, key in ((True, "initContainers"), (False, "containers")):
        for container in spec.get(key) or []:  # type: ignore[attr-defined]
            if isinstance(container, dict):
                return is_init, str(container.get("name", ""))
    return None


def pulling_since(pod: Pod) -> datetime | None:
    """When a pod bound to a node began waiting for its images: its sandbox came up and every
    container is still being created. None for any other pod."""
    status = pod.get("status", {})
    if status.get("phase", "Pending") != "Pending" or not pod.get("spec", {}).get("nodeName"):
        return None
    statuses = list(_container_statuses(pod))
    if not statuses:
        return None
    for _, container in statuses:
        if container.get("state", {}).get("waiting", {}).get("reason") not in _STARTING_REASONS:
            return None
    sandbox = _condition(pod, "PodReadyToStartContainers")
    if sandbox is None or sandbox.get("status") != "True":
        return None
    return parse_kube_time(sandbox.get("lastTransitionTime"))


def _pulled_beside(
    pod: Pod,
    node: str,
    since: datetime,
    started: Sequence[Started],
    pulls: Mapping[str, Sequence[ImagePull]],
) -> PulledBeside | None:
    """The slowest download, by a pod of the same controller on another node, of the image the
    kubelet is pulling for this pod now (its first container's: ``_pulled_now``), asked for
    after this pod's sandbox came up: the registry served that image meanwhile, in that time.
    Another container's image is no evidence (a sidecar's 50 MB beside the app's 20 GB), nor is
    a sibling whose node had the image already (the kubelet wrote "already present on
    machine", or under policy Always "pulled" gigabytes in milliseconds: ImagePull.downloaded),
    nor a sibling's latest restart: its pull is when it happened, whatever ran since."""
    ref = controller_of(pod)
    now_pulled = _pulled_now(pod)
    if ref is None or not ref.get("uid") or now_pulled is None:
        return None
    specs = _container_specs(pod)
    name = now_pulled[1]
    image = (specs.get(now_pulled) or {}).get("image")
    found: list[PulledBeside] = []
    for s in started:
        if (s.controller, s.container, s.image) != (ref["uid"], name, image) or s.node == node:
            continue
        for pull in pulls.get(s.pod, ()):
            if (
                (pull.container, pull.node) == (s.container, s.node)
                and _same_image(s.image, pull.image)
                and pull.began >= since
                and pull.downloaded
            ):
                found.append(PulledBeside(s, pull))
    return max(found, key=lambda b: b.pull.took, default=None)


def stuck_pending(
    pod: Pod,
    cfg: Config,
    now: datetime,
    events: Sequence[PodEvent] = (),
    started_elsewhere: Sequence[Started] = (),
    pulls: Mapping[str, Sequence[ImagePull]] | None = None,
    pulling_on_node: Sequence[datetime] = (),
) -> Failure | None:
    """A pod bound to a node whose kubelet has not started it for too long.

    The kubelet reports nothing while it is stuck (a hung runtime, a volume that never
    attaches, a dead kubelet), so no event ever says so: the sweep calls this for every pod.
    Only starting states count (no status yet, ContainerCreating, PodInitializing); a
    running init container or any other waiting reason is progress or a failure `classify`
    judges.

    Two clocks, told apart by the kubelet's PodReadyToStartContainers condition (set True once
    the sandbox and its network are up, before any image is pulled):
    - sandbox not up: stuck after `pending_stuck_after` (10 minutes) since the pod was bound;
    - sandbox up, containers still being created (an image pull in progress, the kubelet
      reports nothing finer): stuck only after `pull_stuck_after` (1 hour) since the sandbox
      came up, because a multi-GB image takes that long on any node.
    The workload's `kn-rescheduler.io/stuck-after` (stamped on the pod by the webhook)
    replaces both.

    ``events``, the kubelet's Warning Events about the pod (shared/workloads/podevents.py),
    tell apart what the status cannot: a volume whose ConfigMap or Secret does not exist
    fails on every node (never stuck: moving it would only spend the budget), and a node that
    failed to create the pod's sandbox (``FailedCreatePodSandBox``) and still has not, for
    `waiting_failure_after` since the first failure, is the node's failure, long before
    `pending_stuck_after`.

    ``started_elsewhere``, the started containers of the other pods (started_containers), and
    ``pulls``, the kubelets' downloads by pod uid (podevents.image_pulls), are the evidence for
    a pull: a pod whose sandbox is up and whose first container's image another pod of the
    same controller downloaded on another node since, in time d, is stuck after the longest of
    `pending_stuck_after`, PULL_SLOWER_THAN_SIBLING x d and the image's size at
    PULL_RATE_FLOOR, not `pull_stuck_after`; unless a pod on its node began waiting for its
    images earlier (``pulling_on_node``): a node pulls one image at a time by default, and this
    pull may be queued behind that one. A node-local
    registry mirror that accepts connections and never answers leaves a pull with no error and
    no timeout (containerd 1.6; recorded: tests/fixtures/real-kubelet/image-pull-hangs.json),
    while the same image downloads in seconds on other nodes. A sibling that found the image
    (or its layers) already on its node proves nothing about how long a download takes (a
    20 GB image is still downloading after 10 minutes on a healthy node): the pull keeps its
    hour.
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
    if missing_volume_source(events, now - cfg.pending_stuck_after) is not None:
        return None
    sandbox = _condition(pod, "PodReadyToStartContainers")
    sandbox_up = sandbox is not None and sandbox.get("status") == "True"
    failures = None if sandbox_up else sandbox_failures(events, node)
    if failures is not None and sandbox_follows_pod(failures.message):
        # The pod's own configuration (a network attachment its namespace lacks): every node
        # fails it the same way, never stuck (as a missing ConfigMap volume).
        return None
    if failures is not None and not sandbox_doubtful(failures.message):
        failing_for = now - failures.first
        if failing_for >= cfg.waiting_failure_after:
            return Failure(
                kind=FailureKind.NODE_FIXABLE,
                reason=FAILED_CREATE_POD_SANDBOX,
                message=failures.message,
                node=node,
                ran_for_seconds=0,
                why=(
                    f"the kubelet of node {node} failed to create the pod's sandbox "
                    f"{failures.attempts} times in {format_duration(failing_for)} "
                    f"(threshold {format_duration(cfg.waiting_failure_after)}): "
                    f"{failures.message}"
                ),
            )
    override = _stuck_after_override(pod)
    if sandbox is not None and sandbox_up:
        since = parse_kube_time(sandbox.get("lastTransitionTime"))
        threshold = override or cfg.pull_stuck_after
        stage = "its sandbox is up but its containers are still being created (image pull?)"
        beside = (
            None
            if since is None
            # A node pulls one image at a time by default (serializeImagePulls): a pod of its
            # that began waiting earlier may hold this pull in the queue behind its own.
            or any(other < since for other in pulling_on_node)
            else _pulled_beside(pod, node, since, started_elsewhere, pulls or {})
        )
        if beside is not None and override is None:
            size = timedelta(seconds=(beside.pull.size or 0) / PULL_RATE_FLOOR)
            threshold = min(
                threshold,
                max(cfg.pending_stuck_after, PULL_SLOWER_THAN_SIBLING * beside.pull.took, size),
            )
            stage += (
                f", while another pod of its controller pulled {beside.pull.image} on node "
                f"{beside.pull.node} in {_short(beside.pull.took)} (asked for at "
                f"{beside.pull.began:%H:%M:%S})"
            )
    else:
        since = parse_kube_time(status.get("startTime"))
        if since is None:
            # startTime is set by the kubelet; a dead kubelet never sets it, so fall back to the
            # moment the scheduler bound the pod.
            scheduled = _condition(pod, "PodScheduled")
            if scheduled is not None and scheduled.get("status") == "True":
                since = parse_kube_time(scheduled.get("lastTransitionTime"))
        threshold = override or cfg.pending_stuck_after
        stage = "its sandbox never came up"
    if since is None:
        return None
    pending_for = now - since
    if pending_for < threshold:
        return None
    state_text = ", ".join(sorted(set(waiting_reasons))) or "no container status at all"
    return Failure(
        kind=FailureKind.NODE_FIXABLE,
        reason=STUCK_PENDING,
        message=f"pending on {node} for {format_duration(pending_for)}",
        node=node,
        ran_for_seconds=0,
        why=(
            f"pod has been bound to node {node} and {stage} for {format_duration(pending_for)} "
            f"(threshold {format_duration(threshold)}): {state_text}"
        ),
    )


def still_starting(pod: Pod, node: str, cfg: Config, *, sandbox: bool | None = None) -> bool:
    """Whether ``pod`` is still bound to ``node``, Pending, every container in a starting
    state (and its sandbox up, or not, when ``sandbox`` says which): the stage in which the
    sweep found it stuck by evidence a later read of the pod alone cannot show again (the
    kubelet's Events, the pod's siblings)."""
    if skip_reason(pod, cfg) is not None:
        return False
    status = pod.get("status", {})
    if pod.get("spec", {}).get("nodeName") != node or status.get("phase", "Pending") != "Pending":
        return False
    for _, container in _container_statuses(pod):
        state = container.get("state", {})
        if "waiting" not in state or state["waiting"].get("reason") not in _STARTING_REASONS:
            return False
    condition = _condition(pod, "PodReadyToStartContainers")
    up = condition is not None and condition.get("status") == "True"
    return sandbox is None or up == sandbox


_IMAGE_PULL_REASONS: Final = frozenset({"ErrImagePull", "ImagePullBackOff"})
# The termination reasons of an application's own exit (not the runtime's, not the kernel's).
_OWN_EXITS: Final = frozenset({"Error", "Completed", ""})
# ImagePullBackOff as kubelets before v1.32 write it, without the pull's error (v1.32 appends
# ": ErrImagePull: <the registry's answer>": recorded in image-pull-refused-imagepullbackoff.json).
_BARE_PULL_BACK_OFF: Final = re.compile(r'^\s*Back-off pulling image "[^"]*"\s*$')
# Waiting reasons and termination reasons of a container the runtime could not start; containerd
# reports a failed start as a termination with reason StartError (exit code 128).
_START_FAILURE_REASONS: Final = frozenset(
    {"RunContainerError", "CreateContainerError", "ContainerCannotRun", "StartError"}
)
_IMAGE_EVERYWHERE: Final = tuple(re.compile(p, re.IGNORECASE) for p in IMAGE_EVERYWHERE_PATTERNS)
_START_EVERYWHERE: Final = tuple(re.compile(p, re.IGNORECASE) for p in START_EVERYWHERE_PATTERNS)
# Registry answers that no other node gets differently, beyond IMAGE_EVERYWHERE_PATTERNS: DNS
# says the registry's host does not exist (Go's resolver: "lookup <host> on <server>: no such
# host"), or the registry refuses for its pull rate limit (429, Docker Hub's toomanyrequests),
# which counts per client address: nodes behind one NAT share it, and moving cannot tell.
_REGISTRY_ANSWERS: Final = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (r"lookup \S+ on \S+: no such host", r"toomanyrequests", r"\b429 Too Many Requests")
)
# crun (CRI-O's default runtime on many distributions) words a missing command its own way;
# CRI-O reports it at create time: "container create failed: executable file `x` not found
# in $PATH: No such file or directory".
_OWN_COMMAND_MISSING: Final = (re.compile(r"executable file `[^`]*` not found in \$PATH"),)
# runc making a mount point for a volume inside the container's own root filesystem, under a
# path the pod's spec made read-only (a volume nested in a read-only volume): every node does
# the same ("mkdirat /run/containerd/.../rootfs/etc/app/data: read-only file system"). A
# read-only path outside a container's rootfs is the node's own disk and stays movable.
_OWN_READ_ONLY_MOUNT: Final = (
    re.compile(r"mkdirat? \S*/rootfs/\S*: read-only file system", re.IGNORECASE),
)
# The kubelet's messages for an eviction at the pod's own limits (pkg/kubelet/eviction/
# helpers.go: podEphemeralStorageMessageFmt, containerEphemeralStorageMessageFmt,
# emptyDirMessageFmt), unchanged from v1.30 to v1.36.
_OWN_LIMIT_EVICTIONS: Final = tuple(
    re.compile(p)
    for p in (
        r"Pod ephemeral local storage usage exceeds the total limit of containers",
        r"Container \S+ exceeded its local ephemeral storage limit",
        r'Usage of EmptyDir volume "[^"]*" exceeds the limit',
    )
)
# "back-off 40s restarting failed container=app pod=..." (kuberuntime's doBackOff).
_BACK_OFF = re.compile(r"^back-off (\S+) restarting failed container", re.IGNORECASE)
# The kubelet's crash-loop back-off (pkg/kubelet/kubelet.go, newCrashLoopBackOff, v1.36): 10 s
# doubling to a 5-minute cap by default. Since v1.35 (KubeletCrashLoopBackOffMax, beta, on by
# default) a node's crashLoopBackOff.maxContainerRestartPeriod caps it anywhere from 1 s to
# 300 s, and lowers the initial back-off to the cap when that is smaller;
# ReduceDefaultCrashLoopBackOffDecay (alpha) starts it at 1 s and caps it at 60 s. So
# "back-off 40s" is the third failure in a row on a default node, and the seventh or later on
# one with the reduced decay and a 40 s cap: a node's back-off bounds its series from below only.
_DEFAULT_INITIAL_BACK_OFF: Final = timedelta(seconds=10)


def failures_behind(back_off: timedelta) -> int:
    """The fewest failures in a row a kubelet writing "back-off <back_off>" has seen, whatever
    its back-off settings: the largest initial back-off (10 s) doubling to it. 1 up to 10 s,
    2 for 20 s, 3 for 40 s (or a 30 s cap), 6 at the 5-minute cap."""
    count, step = 1, _DEFAULT_INITIAL_BACK_OFF
    while step < back_off:
        step *= 2
        count += 1
    return count


# The kubelet's default maximum crash-loop back-off (MaxContainerBackOff, 300 s) and how long
# the default doubling from 10 s takes to reach it: 10+20+40+80+160 s over the first failures.
_MAX_BACK_OFF: Final = timedelta(seconds=300)
_TO_MAX_BACK_OFF: Final = timedelta(seconds=310)


def crash_looping_for_at_least(status: ContainerStatus) -> timedelta | None:
    """How long a container's crash loop has lasted at least, when its kubelet writes the
    default maximum back-off ("back-off 5m0s"): the doubling took 310 s to get there, and each
    restart past the sixth waited the full 300 s. None for any other back-off (a node whose
    KubeletCrashLoopBackOffMax is lower never writes 5m0s, and its restarts come faster).
    restartCount is the container's lifetime count: an older series before a long run makes
    this longer than the current series, never shorter than the truth of a series at the cap."""
    waiting = (status.get("state") or {}).get("waiting") or {}
    if waiting.get("reason") != CRASH_LOOP_BACK_OFF:
        return None
    found = _BACK_OFF.match(waiting.get("message") or "")
    if not found:
        return None
    try:
        back_off = parse_duration(found.group(1))
    except ValueError:
        return None
    if back_off < _MAX_BACK_OFF:
        return None
    restarts = int(status.get("restartCount") or 0)
    return _TO_MAX_BACK_OFF + _MAX_BACK_OFF * max(restarts - failures_behind(back_off), 0)


def failures_paced(elapsed: timedelta, pace: timedelta) -> int:
    """The most failures in a row a kubelet with the default back-off can have restarted in
    ``elapsed`` from the first: at once, then ``pace``, 2 x ``pace`` ... later (restartCount k
    comes pace x (2^(k-1) - 1) after the first failure: 0, 10 s, 30 s, 70 s by default). What
    a restart count is worth on a node that backs off faster."""
    count, total, step = 1, timedelta(0), pace
    while step > timedelta(0) and total + step <= elapsed:
        total += step
        step *= 2
        count += 1
    return count


def _matches(patterns: tuple[re.Pattern[str], ...], message: str) -> str | None:
    for pattern in patterns:
        found = pattern.search(message or "")
        if found:
            return found.group(0)
    return None


def _stuck_after_override(pod: Pod) -> timedelta | None:
    raw = (pod.get("metadata", {}).get("annotations") or {}).get(STUCK_AFTER_ANNOTATION)
    if not raw:
        return None
    try:
        value = parse_duration(raw)
    except ValueError:
        # A typo must not make a pod look stuck at once (or never): the defaults apply.
        return None
    return value if value > timedelta(0) else None


def _container_statuses(pod: Pod) -> Iterator[tuple[bool, ContainerStatus]]:
    status = pod.get("status", {})
    for init in status.get("initContainerStatuses") or []:
        yield True, init
    for container in status.get("containerStatuses") or []:
        yield False, container


def _container_specs(pod: Pod) -> dict[tuple[bool, str], Mapping[str, Any]]:
    spec = pod.get("spec", {})
    specs: dict[tuple[bool, str], Mapping[str, Any]] = {}
    for is_init, key in ((True, "initContainers"), (False, "containers")):
        for container in spec.get(key) or []:  # type: ignore[attr-defined]
            if isinstance(container, dict):
                specs[(is_init, str(container.get("name", "")))] = container
    return specs


def _condition(pod: Pod, kind: str) -> PodCondition | None:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return None


# The Unix epoch, what a container that never started carries as its startedAt.
_NEVER_STARTED: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _run_length(block: Mapping[str, Any]) -> timedelta | None:
    """How long a terminated container ran (finishedAt - startedAt), if both are known.

    A container the runtime never started ran for no time at all: containerd records a failed
    start (reason StartError) without a start time, 0 ns, and the kubelet converts that with
    time.Unix(0, 0) (pkg/kubelet/kuberuntime/kuberuntime_container.go), so the API shows
    `startedAt: 1970-01-01T00:00:00Z`. Read as a time it would be a 56-year run, one that
    restarts the crash-loop series at every failure and resets the exclusions.
    """
    started = parse_kube_time(block.get("startedAt"))
    finished = parse_kube_time(block.get("finishedAt"))
    if started is None or finished is None:
        return None
    if started <= _NEVER_STARTED:
        return timedelta(0)
    if finished < started:
        return None
    return finished - started


def longest_run(pod: Pod) -> timedelta | None:
    """The longest a container of ``pod`` ran before it ended, among the runs its status
    shows (each container's current and last terminated state); None when none ended."""
    runs = []
    for _, status in _container_statuses(pod):
        for block in (
            (status.get("state") or {}).get("terminated"),
            (status.get("lastState") or {}).get("terminated"),
        ):
            ran = _run_length(block) if block else None
            if ran is not None:
                runs.append(ran)
    return max(runs) if runs else None


def _seconds(delta: timedelta | None) -> int | None:
    return None if delta is None else int(delta.total_seconds())


def _pod_failed(pod: Pod, node: str, cfg: Config) -> Failure | None:
    status = pod.get("status", {})
    if status.get("phase") != "Failed":
        return None
    reason = status.get("reason", "")
    if reason not in cfg.failed_pod_reasons:
        return None
    message = status.get("message", "")
    # The longest run any container had: an eviction after two hours of service says the node
    # went bad, not that the pod never worked anywhere.
    runs = [
        length
        for _, container in _container_statuses(pod)
        for length in [_run_length(container.get("state", {}).get("terminated", {}))]
        if length is not None
    ]
    return Failure(
        kind=FailureKind.NODE_FIXABLE,
        reason=reason,
        message=message,
        node=node,
        ran_for_seconds=_seconds(max(runs)) if runs else None,
        why=f"node {node} failed the pod ({reason}): {message or 'no message'}",
    )


def _memory_limited(pod: Pod, spec: Mapping[str, Any] | None) -> bool:
    """Whether the container (or the whole pod) has a memory limit of its own."""
    pod_limits = (pod.get("spec", {}).get("resources") or {}).get("limits") or {}
    if pod_limits.get("memory"):
        return True
    limits = ((spec or {}).get("resources") or {}).get("limits") or {}
    return bool(limits.get("memory"))


def _recent_failures(
    pod: Pod, status: ContainerStatus, last: Mapping[str, Any], cfg: Config, now: datetime
) -> tuple[int, str]:
    """How many times in a row this container failed recently, as a kubelet with the default
    back-off would count them, and how we know.

    `restartCount` is the pod's lifetime count: five restarts weeks ago say nothing about a
    crash today. A last run longer than `crashloop_recent_run` starts a new series (1), as
    the default kubelet's back-off does. Otherwise:
    - the back-off in the kubelet's message proves at least ``failures_behind`` it (10s, 20s,
      40s, 1m20s, 2m40s: 1 to 5 in a row; the 5-minute cap: 6; a node's own cap or the
      reduced decay: fewer than it may have seen, never more);
    - a pod younger than `crashloop_recent_run` has had no run long enough to start a new
      series, so its restarts are all in a row, credited no faster than the default back-off
      allows since it started (``failures_paced``): 3 crashes in 3 s on a node that backs
      off 1 s are not yet the 3 in a row a default node takes 30 s to show.
    """
    restarts = status.get("restartCount", 0)
    ran = _run_length(last)
    if ran is not None and ran >= cfg.crashloop_recent_run:
        return 1, f"its last run lasted {format_duration(ran)}, so this failure starts a series"
    message = status.get("state", {}).get("waiting", {}).get("message", "")
    found = _BACK_OFF.match(message or "")
    behind: int | None = None
    if found:
        try:
            behind = failures_behind(parse_duration(found.group(1)))
        except ValueError:
            behind = None
    started = parse_kube_time(pod.get("status", {}).get("startTime"))
    if started is not None and now - started < cfg.crashloop_recent_run:
        paced = min(restarts, failures_paced(now - started, cfg.crashloop_pace))
        in_a_row = max(paced, min(restarts, behind or 0))
        if in_a_row < restarts:
            return in_a_row, (
                f"{restarts} restarts in {format_duration(now - started)} since the pod "
                f"started, {in_a_row} in a row at the default kubelet's pace"
            )
        return restarts, f"{restarts} restarts"
    if behind is not None and behind < restarts:
        assert found is not None
        return behind, (
            f"{restarts} restarts in its lifetime, at least {behind} in a row "
            f"(kubelet back-off {found.group(1)})"
        )
    if behind is None and restarts > 1:
        # An older pod and no back-off to bound the series (an OOM kill written as
        # state.terminated before the kubelet says CrashLoopBackOff): its lifetime count says
        # nothing about today. Counted as the first; the kubelet's back-off message follows.
        return 1, (
            f"{restarts} restarts in its lifetime and no kubelet back-off yet to say how many "
            "in a row: counted as the first"
        )
    return restarts, f"{restarts} restarts"


def _container_failure(
    pod: Pod,
    status: ContainerStatus,
    specs: Mapping[tuple[bool, str], Mapping[str, Any]],
    is_init: bool,
    node: str,
    cfg: Config,
    now: datetime,
) -> Failure | None:
    name = status.get("name", "")
    what = f"{'init container' if is_init else 'container'} {name}"
    restarts = status.get("restartCount", 0)
    state = status.get("state", {})
    waiting = state.get("waiting", {})
    waiting_reason = waiting.get("reason", "")
    # The termination that matters: the current one, or the previous run's while the
    # container waits to restart. Once it runs again (or finished for good: an init container
    # that completed on retry), lastState is history, not a reason to move a recovered pod.
    if "terminated" in state:
        last = state.get("terminated", {})
    elif "waiting" in state:
        last = status.get("lastState", {}).get("terminated", {})
    else:
        return None
    ran_for = _seconds(_run_length(last)) if last else 0

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
            ran_for_seconds=ran_for,
        )

    last_reason = last.get("reason", "")
    if (
        waiting_reason in ("", CRASH_LOOP_BACK_OFF)
        and last_reason in _OWN_EXITS
        and declared_restart(specs.get((is_init, name)), last)
    ):
        # Restarts the user declared retriable (restartPolicyRules) after the application's
        # own exit: never a node's failure. Only those: a container the runtime cannot create
        # or start, or an OOM kill without a memory limit, is judged as for any container.
        return None
    if last_reason in cfg.termination_reasons:
        exit_text = f"exit code {last.get('exitCode', '?')}"
        if last_reason == "OOMKilled" and _memory_limited(pod, specs.get((is_init, name))):
            # Killed at its own memory limit: the application's doing, and it follows the pod
            # to every node. Only repeated kills count, like any crash loop (below).
            pass
        else:
            cause = (
                "without a memory limit of its own: the node ran out of memory"
                if last_reason == "OOMKilled"
                else "a termination reason configured to count at first sight"
            )
            return failure(
                last_reason,
                last.get("message", ""),
                f"was {last_reason} ({exit_text}), {cause}; it has restarted {restarts} time(s)",
            )
    if "terminated" in state and waiting_reason == "" and last_reason != "OOMKilled":
        return _between_restarts(pod, status, last, is_init, cfg, now, failure)
    if waiting_reason == CRASH_LOOP_BACK_OFF or last_reason == "OOMKilled":
        if not last:
            return None
        if last.get("exitCode") == 0 and last_reason in ("", "Completed"):
            spec = specs.get((is_init, name)) or {}
            if not (spec.get("livenessProbe") or spec.get("startupProbe")):
                # A container that ends well every time under restartPolicy Always (a
                # one-shot command in a Deployment): the kubelet backs off restarting it,
                # and every node would do the same. With a liveness or startup probe, an exit
                # 0 may be the kubelet's kill (SIGTERM on a failed probe, many servers exit 0
                # then), which a starved or broken node causes: judged as any crash loop.
                return None
        in_a_row, how = _recent_failures(pod, status, last, cfg, now)
        if in_a_row < cfg.crashloop_restart_threshold:
            return None
        cause = waiting_reason or last_reason
        last_exit = f"; last exit: {last_reason or 'unknown'} (code {last.get('exitCode', '?')})"
        return failure(
            cause,
            waiting.get("message", "") or last.get("message", ""),
            f"{cause} after {how} (threshold {cfg.crashloop_restart_threshold}){last_exit}",
        )
    if waiting_reason in cfg.waiting_reasons:
        message = waiting.get("message", "")
        if waiting_reason == "ImagePullBackOff" and _BARE_PULL_BACK_OFF.match(message):
            # A kubelet before v1.32 says only that it backs off, not what the registry
            # answered: a tag that does not exist (every node) looks like a mirror that is down
            # (this node). Judged when the kubelet tries again and writes ErrImagePull with
            # the registry's answer.
            return None
        since = _failing_since(pod, last)
        if since is None:
            return None
        failing_for = now - since
        if failing_for < cfg.waiting_failure_after:
            return None
        return failure(
            waiting_reason,
            message,
            f"waiting with {waiting_reason} for {format_duration(failing_for)} "
            f"(threshold {format_duration(cfg.waiting_failure_after)}): "
            f"{message or 'no message'}",
        )
    return None


def _between_restarts(
    pod: Pod,
    status: ContainerStatus,
    last: Mapping[str, Any],
    is_init: bool,
    cfg: Config,
    now: datetime,
    failure: Callable[[str, str, str], Failure],
) -> Failure | None:
    """A crash loop seen between two restarts, before the kubelet says CrashLoopBackOff.

    A real kubelet writes a failed run as ``state.terminated`` and leaves it there for most of
    its back-off: ``waiting: CrashLoopBackOff`` comes only when the kubelet syncs the pod
    again, at the end of the back-off. Recorded from kubelet v1.36.3 (tests/fixtures/
    real-kubelet/crashloop-terminated-restart-3.json): the fourth failed run ended at
    10:53:35 with restartCount 3, and "back-off 40s" was written at 10:54:22, 47 s later.

    Without the back-off message nothing bounds the series but time: restartCount counts the
    pod's whole life. So it is counted in a row only while the pod is younger than
    ``crashloop_recent_run`` (no run of its could have been long enough to start a new
    series); an older pod waits for the kubelet's CrashLoopBackOff and its back-off message.
    Credited no faster than a kubelet with the default back-off restarts (``failures_paced``).
    Counted only where the kubelet will restart the container (restartPolicy Always, or
    OnFailure after a failure); counted as CrashLoopBackOff, which the kubelet writes next.
    """
    exit_code = last.get("exitCode", 0)
    if not exit_code and last.get("reason", "") in ("", "Completed"):
        return None  # a run that succeeded
    if _restart_policy(pod, status.get("name", ""), is_init) == "Never":
        return None
    restarts = status.get("restartCount", 0)
    if restarts < cfg.crashloop_restart_threshold:
        return None
    started = parse_kube_time(pod.get("status", {}).get("startTime"))
    if started is None or now - started >= cfg.crashloop_recent_run:
        return None
    if failures_paced(now - started, cfg.crashloop_pace) < cfg.crashloop_restart_threshold:
        # Restarts faster than the default back-off allows (a node that backs off 1 s): not
        # yet the series the threshold means on every other node.
        return None
    age = format_duration(now - started)
    reason = last.get("reason", "") or "unknown"
    return failure(
        CRASH_LOOP_BACK_OFF,
        last.get("message", "") or f"exit code {exit_code}",
        f"{CRASH_LOOP_BACK_OFF} after {restarts} restarts in a pod started {age} ago "
        f"(threshold {cfg.crashloop_restart_threshold}); the kubelet backs off before the "
        f"next one; last exit: {reason} (code {exit_code})",
    )


def _restart_policy(pod: Pod, name: str, is_init: bool) -> str:
    """Whether the kubelet restarts this container after a failure: a sidecar (an init
    container with ``restartPolicy: Always``) always; an init container unless the pod's
    policy is Never; an app container by the pod's policy (Always by default)."""
    spec = pod.get("spec", {})
    pod_policy = spec.get("restartPolicy") or "Always"
    if is_init:
        own = next(
            (
                c.get("restartPolicy")
                for c in spec.get("initContainers") or []
                if c.get("name") == name
            ),
            None,
        )
        if own == "Always":
            return "Always"
        return "Never" if pod_policy == "Never" else "OnFailure"
    own = next(
        (c.get("restartPolicy") for c in spec.get("containers") or [] if c.get("name") == name),
        None,
    )
    # ContainerRestartRules (beta, on by default since v1.35): a regular container may carry
    # its own restartPolicy, which replaces the pod's for it.
    return str(own or pod_policy)


# The actions of a container restart rule that restart in place: the container
# (``Restart``, ContainerRestartRules) or every container of the pod (``RestartAllContainers``,
# beta in v1.36).
_RESTART_ACTIONS: Final = frozenset({"Restart", "RestartAllContainers"})


def declared_restart(spec: Mapping[str, Any] | None, last: Mapping[str, Any]) -> str | None:
    """The container's own restart rule that its last exit matched, in words, or None.

    A container's ``restartPolicyRules`` (ContainerRestartRules, beta and on by default since
    Kubernetes v1.35) ask the kubelet to restart it in place on the exit codes they name, even
    under a pod ``restartPolicy: Never``: the first rule whose ``exitCodes`` requirement
    (``In`` or ``NotIn`` the values) the exit code meets decides. Training jobs declare their
    retriable exits this way precisely so as not to be rescheduled: those restarts are the
    user's choice, not evidence against the node.
    """
    if not spec or not last:
        return None
    code = last.get("exitCode")
    if not isinstance(code, int):
        return None
    for rule in spec.get("restartPolicyRules") or []:
        if not isinstance(rule, Mapping):
            continue
        codes = rule.get("exitCodes") or {}
        values = codes.get("values") or []
        operator = codes.get("operator")
        if operator == "In":
            met = code in values
        elif operator == "NotIn":
            met = code not in values
        else:
            continue
        if met:
            action = rule.get("action")
            if action in _RESTART_ACTIONS:
                return f"exit code {code} meets its restart rule ({action}, {operator} {values})"
            return None  # the first rule met decides, and it does not restart in place
    return None


def _failing_since(pod: Pod, last: Mapping[str, Any]) -> datetime | None:
    """Since when a container has been failing to start: its previous run's end, else the
    moment its sandbox came up (the kubelet's first attempt), else the pod's start."""
    finished = parse_kube_time(last.get("finishedAt")) if last else None
    if finished is not None:
        return finished
    sandbox = _condition(pod, "PodReadyToStartContainers")
    if sandbox is not None and sandbox.get("status") == "True":
        since = parse_kube_time(sandbox.get("lastTransitionTime"))
        if since is not None:
            return since
    return parse_kube_time(pod.get("status", {}).get("startTime"))
