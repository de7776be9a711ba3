"""Pod statuses shaped the way kubelet v1.36 with containerd writes them (pure functions).

The fake kubelet (:mod:`localcluster.kubelet`) keeps a :class:`PodRun` per pod and asks
:func:`pod_status` for the status of the step the pod has reached. The shapes follow the
kubelet's code: ``generateAPIPodStatus`` (conditions in the kubelet's order, non-kubelet
conditions first), ``convertToAPIContainerStatuses`` (containers that never ran carry the spec's
image and no IDs; containers that ran carry containerd's normalised image, a digest imageID and a
containerID, resources and user), the status manager (a condition's ``lastTransitionTime`` moves
only when its status changes; ``observedGeneration`` is the pod's generation) and the messages of
the image manager, the back-off of ``kuberuntime`` and the eviction manager.

:func:`on_exit` and :func:`restart_delay` are the kubelet's crash-loop back-off: when a crashed
container starts again and which back-off its CrashLoopBackOff message names. The fake kubelet
always keeps the kubelet's entry (so every message reads as a real kubelet's); it waits the
back-off out only with ``Timing.real()``, and restarts every few seconds otherwise.

:func:`terminated_status` is the last status of a deleted pod: what ``SyncTerminatingPod``
(containers stopped) and the status manager's ``TerminatePod`` (phase terminal, what cannot be
accounted for failed) leave before the pod is removed. It works on the pod's last status, not
on a :class:`PodRun`, as ``TerminatePod`` works on the status manager's cache.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

JSON = dict[str, Any]

# The node fault modes (values of the SIM_FAULT_LABEL node label); "none" marks a healthy bind.
# "pullhang": a pull that never answers (a registry mirror that accepts connections and never
# replies): the sandbox up, every container ContainerCreating for ever, one Pulling Event.
FAULT_MODES: Final = ("crashloop", "oom", "imagepull", "evict", "createcontainer", "pullhang")
HEALTHY: Final = "none"

# Pod-level behaviours, read from the pod's own annotations (its template's, for a controller's
# pods); only the local cluster reads them (like dev/localcluster/keys.py's keys):
# - seconds a container of a crashing pod (``crashloop``, ``oom``) runs, Ready, before each
#   exit (0, the default: it exits at once). An image that crashes 20 s after start;
SIM_RUNS_FOR_ANNOTATION: Final = "sim.kn-rescheduler.io/runs-for"
# - the exit code of a crashing container (default 1; 137 for ``oom``). With the container's
#   ``restartPolicyRules`` it decides whether the kubelet restarts it in place;
SIM_EXIT_CODE_ANNOTATION: Final = "sim.kn-rescheduler.io/exit-code"
# - seconds a node's first pull of the pod's image takes (the sandbox up, ContainerCreating,
#   one ``Pulling`` Event, then ``Pulled`` with that time); a node that has the image starts the
#   pod at once, with no ``Pulled`` Event;
SIM_PULL_TAKES_ANNOTATION: Final = "sim.kn-rescheduler.io/pull-takes"
# - ``Evicted``, ``Terminated`` or ``OutOfcpu``: the pod is written terminal once, as the kubelet
#   left it ``terminal-age`` seconds ago (default three days), and never run: a pod left from
#   an eviction, a graceful node shutdown or an admission rejection long ago.
SIM_TERMINAL_ANNOTATION: Final = "sim.kn-rescheduler.io/terminal"
SIM_TERMINAL_AGE_ANNOTATION: Final = "sim.kn-rescheduler.io/terminal-age"
TERMINAL_KINDS: Final = ("Evicted", "Terminated", "OutOfcpu")
TERMINAL_AGE: Final = 3 * 24 * 3600.0
# What the fake kubelet stamps as the fate of a pod it wrote terminal at once.
TERMINAL_FATE: Final = "terminal"
# Multus' pod annotation naming the network attachments the pod asks for. The local cluster has
# no NetworkAttachmentDefinition: a pod naming one never gets its sandbox, as on a cluster whose
# namespace lacks the attachment (the kubelet's FailedCreatePodSandBox, retried for ever).
MULTUS_NETWORKS_ANNOTATION: Final = "k8s.v1.cni.cncf.io/networks"
# What the fake kubelet stamps as the fate of such a pod.
SANDBOX_FATE: Final = "multus"

Step = Literal[
    "creating",  # sandbox up, containers being created (Pending, ContainerCreating)
    "running",  # containers running and ready
    "crashed",  # first run exited (state.terminated); restartCount 0
    "backoff",  # CrashLoopBackOff; restartCount >= 1
    "pull_error",  # ErrImagePull
    "pull_backoff",  # ImagePullBackOff
    "create_error",  # CreateContainerError
    "evicted",  # Failed, reason Evicted
    "shutdown",  # Failed, reason Terminated (a graceful node shutdown)
    "sandbox_error",  # Pending: the sandbox cannot be created (FailedCreatePodSandBox)
    "failed",  # Failed: the container exited and restartPolicy is Never
    "completed",  # Succeeded (Job pods on a healthy node)
]

KUBELET_CONDITIONS: Final = (
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
)

EVICTION_THRESHOLD: Final = "100Mi"
EVICTION_AVAILABLE: Final = "12Mi"
EVICTION_USAGE: Final = "1843Mi"


def rfc3339(t: float) -> str:
    """Seconds-precision UTC time, the way metav1.Time serialises."""
    return datetime.datetime.fromtimestamp(int(t), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def normalize_image(image: str) -> str:
    """containerd's full reference: ``busybox`` -> ``docker.io/library/busybox:latest``."""
    name = image
    first, sep, _ = name.partition("/")
    if not sep:
        name = "docker.io/library/" + name
    elif not ("." in first or ":" in first or first == "localhost"):
        name = "docker.io/" + name
    elif first == "docker.io" and name.count("/") == 1:
        name = "docker.io/library/" + name.split("/", 1)[1]
    last = name.rsplit("/", 1)[1]
    if "@" not in name and ":" not in last:
        name += ":latest"
    return name


def image_repo(normalized: str) -> str:
    """The repository of a normalised reference (no tag, no digest)."""
    if "@" in normalized:
        return normalized.split("@", 1)[0]
    head, _, last = normalized.rpartition("/")
    return head + "/" + last.split(":", 1)[0]


def image_id(image: str) -> str:
    """A repo digest like containerd reports: ``docker.io/library/busybox@sha256:...``."""
    normalized = normalize_image(image)
    if "@" in normalized:
        return normalized
    digest = hashlib.sha256(normalized.encode()).hexdigest()
    return f"{image_repo(normalized)}@sha256:{digest}"


def container_id(pod_uid: str, container: str, attempt: int) -> str:
    """A stable containerd ID for one run (``attempt``) of a container."""
    digest = hashlib.sha256(f"{pod_uid}/{container}/{attempt}".encode()).hexdigest()
    return "containerd://" + digest


def go_duration(seconds: int) -> str:
    """Go's time.Duration String() for whole seconds: 10s, 1m20s, 5m0s."""
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes}m{secs}s"


def crashloop_backoff(restarts: int) -> str:
    """The kubelet's back-off after ``restarts`` restarts in a row: 10s doubling, capped at 5m."""
    return go_duration(int(back_off_after(restarts)))


# -- the crash-loop back-off ------------------------------------------------------------------
#
# kubelet v1.36 keeps one back-off entry per container (``flowcontrol.Backoff``, keyed by pod and
# container; ``pkg/kubelet/kubelet.go`` ``newCrashLoopBackOff``): 10 s initial, doubled at every
# restart, capped at ``MaxContainerBackOff`` 300 s (the KubeletCrashLoopBackOffMax gate, on by
# default since 1.35, reads ``crashLoopBackOff.maxContainerRestartPeriod``, which defaults to the
# same 300 s; ReduceDefaultCrashLoopBackOffDecay's 1 s / 60 s is alpha and off). The entry's
# ``HasExpiredFunc`` resets it when a container exits more than 600 s after the entry was last
# updated, i.e. after it ran 10 minutes since its last restart.
#
# ``kuberuntime`` ``doBackOff`` runs on every sync of a pod whose container exited, with the
# exit's ``FinishedAt``: no entry (or an expired one) means the container is restarted at once
# and the entry set (``Next``: 10 s, or doubled); otherwise, while less than the entry's back-off
# has passed since the exit, the container waits in CrashLoopBackOff with the message
# "back-off <entry> restarting failed container=<c> pod=<name>_<ns>(<uid>)" and the sync ends in
# a ``BackoffError`` at exit + back-off. The pod worker requeues such a sync after
# ``wait.Jitter(min(remaining, syncFrequency), 0.5)`` (``pod_workers.go``; syncFrequency 1 m by
# default), so a restart comes between 1x and 1.5x the back-off after the exit, and a back-off
# over a minute is waited out in steps of at most 60-90 s.


@dataclass(frozen=True)
class BackOffPolicy:
    """The kubelet's crash-loop back-off settings (seconds); the defaults are v1.36's."""

    initial: float = 10.0
    cap: float = 300.0
    # An exit this long after the entry's last update (the container's last restart) resets it.
    reset_after: float = 600.0
    # The pod worker's requeue of a sync that ended in back-off: at most syncFrequency, then
    # jittered by up to this factor.
    resync: float = 60.0
    jitter: float = 0.5


KUBELET_BACK_OFF: Final = BackOffPolicy()


def back_off_after(restarts: int, policy: BackOffPolicy = KUBELET_BACK_OFF) -> float:
    """The entry after ``restarts`` restarts in a row (the first at once, each later one after
    the back-off): 10 s after the first, doubling, capped."""
    return float(min(policy.initial * 2 ** max(restarts - 1, 0), policy.cap))


@dataclass(frozen=True)
class Exit:
    """What the kubelet does about a container that exited: ``doBackOff``, then ``Next``."""

    # The back-off it waits out in CrashLoopBackOff before the restart (0: restarted at once).
    wait: float
    # The entry once the container is restarted: the back-off its next exit reports and waits.
    after: float
    why: str


def on_exit(back_off: float, ran_for: float, policy: BackOffPolicy = KUBELET_BACK_OFF) -> Exit:
    """The kubelet's answer to an exit, given the container's entry ``back_off`` (0: none yet)
    and how long the container ran since its last restart (``ran_for``, seconds).

    Here the entry's last update is the restart itself (``Next`` runs just before the container
    starts), so "exited more than ``reset_after`` after the last update" is "ran that long"."""
    if back_off <= 0:
        return Exit(0.0, policy.initial, "first exit: restarted at once")
    if ran_for > policy.reset_after:
        return Exit(
            0.0,
            policy.initial,
            f"ran {go_duration(int(ran_for))} since its last restart (over "
            f"{go_duration(int(policy.reset_after))}): back-off reset, restarted at once",
        )
    return Exit(
        back_off,
        min(back_off * 2, policy.cap),
        f"in back-off {go_duration(int(back_off))} from its exit",
    )


def restart_delay(
    wait: float, uniform: Callable[[], float], policy: BackOffPolicy = KUBELET_BACK_OFF
) -> float:
    """Seconds from an exit to the restart when the kubelet waits out ``wait``: the pod worker
    requeues the pod at ``Jitter(min(remaining, resync), jitter)`` until the back-off is over
    (``uniform`` draws from [0, 1), as Go's ``rand.Float64``). 0 for a restart at once (the
    next sync, which the caller times)."""
    waited = 0.0
    while waited < wait:
        step = min(wait - waited, policy.resync)
        waited += step * (1.0 + policy.jitter * uniform())
    return waited


def pull_error_message(image: str) -> str:
    """What containerd answers when the node cannot reach the registry."""
    ref = normalize_image(image)
    domain, _, rest = ref.partition("/")
    host = "registry-1.docker.io" if domain == "docker.io" else domain
    repo = image_repo(ref).partition("/")[2]
    tag = rest.rsplit(":", 1)[1] if "@" not in rest else rest.rsplit("@", 1)[1]
    return (
        f'rpc error: code = Unknown desc = failed to pull and unpack image "{ref}": '
        f'failed to resolve reference "{ref}": failed to do request: '
        f'Head "https://{host}/v2/{repo}/manifests/{tag}": dial tcp: lookup {host}: i/o timeout'
    )


def _owner_kind(pod: JSON) -> str:
    for ref in pod.get("metadata", {}).get("ownerReferences", []) or []:
        if ref.get("controller"):
            return str(ref.get("kind", ""))
    return ""


def is_job_pod(pod: JSON) -> bool:
    return _owner_kind(pod) == "Job"


def restart_policy(pod: JSON) -> str:
    return str(pod.get("spec", {}).get("restartPolicy", "Always"))


# The restart rules' actions that restart in place (ContainerRestartRules: ``Restart``; beta in
# v1.36: ``RestartAllContainers``).
RESTART_ACTIONS: Final = frozenset({"Restart", "RestartAllContainers"})


def should_restart(container: JSON, pod: JSON, exit_code: int) -> bool:
    """``podutil.ContainerShouldRestart``: whether the kubelet restarts ``container`` after it
    exited with ``exit_code``. Its ``restartPolicyRules`` first (ContainerRestartRules, beta and
    on by default since v1.35: the first rule whose ``exitCodes`` the code meets decides), then
    its own ``restartPolicy``, then the pod's."""
    for rule in container.get("restartPolicyRules") or []:
        codes = (rule or {}).get("exitCodes") or {}
        values = codes.get("values") or []
        operator = codes.get("operator")
        if operator == "In":
            met = exit_code in values
        elif operator == "NotIn":
            met = exit_code not in values
        else:
            continue
        if met:
            return rule.get("action") in RESTART_ACTIONS
    policy = container.get("restartPolicy") or restart_policy(pod)
    if policy == "Never":
        return False
    if policy == "OnFailure":
        return exit_code != 0
    return True


def restarts_after_exit(pod: JSON, exit_code: int) -> bool:
    """Whether the kubelet restarts the pod's containers after they all exited with
    ``exit_code`` (a fault hits every regular container alike: the first one decides)."""
    containers = pod.get("spec", {}).get("containers") or [{}]
    return should_restart(containers[0], pod, exit_code)


def _annotation(pod: JSON, key: str) -> str:
    return str((pod.get("metadata", {}).get("annotations") or {}).get(key) or "")


def _seconds(raw: str, default: float = 0.0) -> float:
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value >= 0 else default


def runs_for(pod: JSON) -> float:
    """Seconds a crashing container of ``pod`` runs before each exit (SIM_RUNS_FOR_ANNOTATION)."""
    return _seconds(_annotation(pod, SIM_RUNS_FOR_ANNOTATION))


def exit_code_of(pod: JSON) -> int | None:
    """The exit code a crashing container of ``pod`` exits with (SIM_EXIT_CODE_ANNOTATION)."""
    raw = _annotation(pod, SIM_EXIT_CODE_ANNOTATION)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def pull_takes(pod: JSON) -> float:
    """Seconds a node's first pull of ``pod``'s image takes (SIM_PULL_TAKES_ANNOTATION)."""
    return _seconds(_annotation(pod, SIM_PULL_TAKES_ANNOTATION))


def terminal_kind(pod: JSON) -> str | None:
    """The terminal status ``pod`` asks to be written at once (SIM_TERMINAL_ANNOTATION)."""
    kind = _annotation(pod, SIM_TERMINAL_ANNOTATION)
    return kind if kind in TERMINAL_KINDS else None


def terminal_age(pod: JSON) -> float:
    return _seconds(_annotation(pod, SIM_TERMINAL_AGE_ANNOTATION), TERMINAL_AGE) or TERMINAL_AGE


def multus_networks(pod: JSON) -> list[str]:
    """The network attachments the pod names in Multus' annotation: a comma-separated list of
    ``[namespace/]name[@interface]``, or a JSON list of objects with ``name``."""
    raw = _annotation(pod, MULTUS_NETWORKS_ANNOTATION).strip()
    if not raw:
        return []
    if raw.startswith("["):
        try:
            items = json.loads(raw)
        except ValueError:
            return []
        return [str(i.get("name")) for i in items if isinstance(i, dict) and i.get("name")]
    return [part.strip().split("@", 1)[0] for part in raw.split(",") if part.strip()]


def sandbox_id(pod_uid: str, attempt: int) -> str:
    """A stable containerd sandbox ID for one attempt at the pod's sandbox."""
    return hashlib.sha256(f"{pod_uid}/sandbox/{attempt}".encode()).hexdigest()


def multus_sandbox_message(pod: JSON, attempt: int) -> str:
    """The kubelet's ``FailedCreatePodSandBox`` message when Multus cannot find the network
    attachment the pod names in its namespace (Multus' getKubernetesDelegate, through
    containerd's CNI call)."""
    meta = pod.get("metadata", {})
    ns, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
    networks = multus_networks(pod) or ["macvlan-conf"]
    wanted = networks[0]
    nad_ns, _, nad = wanted.rpartition("/")
    nad_ns = nad_ns or ns
    return (
        "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network "
        f'for sandbox "{sandbox_id(uid, attempt)}": plugin type="multus" '
        f'name="multus-cni-network" failed (add): Multus: [{ns}/{name}/{uid}]: error loading k8s '
        "delegates k8s args: TryLoadPodDelegates: error in getting k8s network for pod: "
        "GetNetworkDelegates: failed getting the delegate: getKubernetesDelegate: cannot find a "
        f"network-attachment-definition ({nad}) in namespace ({nad_ns}): "
        f'network-attachment-definitions.k8s.cni.cncf.io "{nad}" not found'
    )


def go_duration_ms(seconds: float) -> str:
    """Go's time.Duration String() of a duration truncated to milliseconds, as the kubelet's
    Pulled Event prints it: 500ms, 1.5s, 2m30.25s."""
    ms = int(seconds * 1000)
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    hours, minutes = divmod(minutes, 60)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


@dataclass
class PodRun:
    """What the fake kubelet knows about one pod it runs."""

    uid: str
    namespace: str
    name: str
    node: str
    mode: str
    host_ip: str
    pod_ip: str
    start_time: float
    step: Step = "creating"
    restarts: int = 0
    # The kubelet's back-off entry for the container (seconds; 0: none yet): what the
    # CrashLoopBackOff message says (see on_exit).
    back_off: float = 0.0
    # When the current (or last) container run started and ended.
    run_started: float = 0.0
    run_finished: float = 0.0
    # The run before the current one (a container restarted and running again).
    prev_started: float = 0.0
    prev_finished: float = 0.0
    # Pod-level behaviours (see SIM_RUNS_FOR_ANNOTATION ...): how long a crashing container
    # runs before each exit; its exit code (None: the mode's); when a slow pull began (0: none).
    runs_for: float = 0.0
    exit_code: int | None = None
    pull_started: float = 0.0
    # FailedCreatePodSandBox attempts recorded (the Event's count).
    sandbox_attempts: int = 0
    # Condition type -> (status, lastTransitionTime) as last written, for transition times.
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)


def _volume_mounts(container: JSON) -> list[JSON]:
    out = []
    for vm in container.get("volumeMounts", []) or []:
        status: JSON = {"name": vm["name"], "mountPath": vm["mountPath"]}
        if vm.get("readOnly"):
            status["readOnly"] = True
            rro = vm.get("recursiveReadOnly")
            status["recursiveReadOnly"] = (
                "Enabled" if rro in ("Enabled", "IfPossible") else "Disabled"
            )
        out.append(status)
    return out


def _user(pod: JSON, container: JSON) -> JSON:
    pod_sc = pod.get("spec", {}).get("securityContext", {}) or {}
    sc = container.get("securityContext", {}) or {}
    uid = int(sc.get("runAsUser", pod_sc.get("runAsUser", 0)))
    gid = int(sc.get("runAsGroup", pod_sc.get("runAsGroup", 0)))
    groups = [gid] + [int(g) for g in pod_sc.get("supplementalGroups", []) or [] if int(g) != gid]
    return {"linux": {"uid": uid, "gid": gid, "supplementalGroups": groups}}


def _never_ran(container: JSON, waiting: JSON, restarts: int = 0) -> JSON:
    """A container the runtime has no record of: spec image, no IDs."""
    status: JSON = {
        "name": container["name"],
        "image": container["image"],
        "imageID": "",
        "ready": False,
        "restartCount": restarts,
        "started": False,
        "state": {"waiting": waiting},
        "lastState": {},
    }
    mounts = _volume_mounts(container)
    if mounts:
        status["volumeMounts"] = mounts
    return status


def _ran(pod: JSON, container: JSON, attempt: int, state: JSON, restarts: int) -> JSON:
    """A container the runtime created (running or exited): normalised image, IDs, resources."""
    uid = pod["metadata"]["uid"]
    image = normalize_image(container["image"])
    status: JSON = {
        "name": container["name"],
        "image": image,
        "imageID": image_id(image),
        "containerID": container_id(uid, container["name"], attempt),
        "ready": False,
        "restartCount": restarts,
        "started": False,
        "state": state,
        "lastState": {},
    }
    mounts = _volume_mounts(container)
    if mounts:
        status["volumeMounts"] = mounts
    resources = copy.deepcopy(container.get("resources", {}) or {})
    resources.pop("claims", None)
    status["resources"] = resources
    if resources.get("requests"):
        status["allocatedResources"] = copy.deepcopy(resources["requests"])
    status["user"] = _user(pod, container)
    return status


def _terminated(
    pod: JSON,
    container: JSON,
    attempt: int,
    *,
    exit_code: int,
    reason: str,
    start: float,
    end: float,
) -> JSON:
    return {
        "containerID": container_id(pod["metadata"]["uid"], container["name"], attempt),
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": rfc3339(start),
        "finishedAt": rfc3339(end),
    }


def _crash(mode: str, exit_code: int | None = None) -> tuple[int, str]:
    """A crash's exit code and the runtime's reason: the pod's own code (its exit-code
    annotation), else 137 OOMKilled for ``oom`` and 1 Error otherwise."""
    if exit_code is not None:
        if exit_code == 0:
            return 0, "Completed"
        return exit_code, "OOMKilled" if mode == "oom" and exit_code == 137 else "Error"
    return (137, "OOMKilled") if mode == "oom" else (1, "Error")


def crash_exit_code(run: PodRun) -> int:
    """The code the containers of ``run`` exit with when they crash."""
    return _crash(run.mode, run.exit_code)[0]


def _previous_run(pod: JSON, run: PodRun, container: JSON) -> JSON:
    """The run before the current one of a restarted container (its ``lastState``)."""
    code, reason = _crash(run.mode, run.exit_code)
    return _terminated(
        pod,
        container,
        max(run.restarts - 1, 0),
        exit_code=code,
        reason=reason,
        start=run.prev_started,
        end=run.prev_finished,
    )


def _back_off_text(run: PodRun) -> str:
    """The entry as Go prints a time.Duration; a run with no entry recorded (made before the
    field existed) takes the entry of that many restarts in a row."""
    if run.back_off > 0:
        return go_duration(int(run.back_off))
    return crashloop_backoff(run.restarts)


def _regular_status(pod: JSON, run: PodRun, container: JSON, has_init: bool) -> JSON:
    """One regular container's status at ``run.step``."""
    name = container["name"]
    uid = pod["metadata"]["uid"]
    step = run.step
    if step == "creating":
        reason = "PodInitializing" if has_init else "ContainerCreating"
        return _never_ran(container, {"reason": reason})
    if step == "running":
        attempt = run.restarts
        st = _ran(
            pod, container, attempt, {"running": {"startedAt": rfc3339(run.run_started)}}, attempt
        )
        st["ready"] = True
        st["started"] = True
        if attempt:
            # Restarted after a crash (a container that runs a while before each exit).
            st["lastState"] = {"terminated": _previous_run(pod, run, container)}
        return st
    if step in ("crashed", "failed"):
        code, reason = _crash(run.mode, run.exit_code)
        attempt = run.restarts
        term = _terminated(
            pod,
            container,
            attempt,
            exit_code=code,
            reason=reason,
            start=run.run_started,
            end=run.run_finished,
        )
        st = _ran(pod, container, attempt, {"terminated": term}, attempt)
        if attempt:
            st["lastState"] = {"terminated": _previous_run(pod, run, container)}
        return st
    if step == "shutdown":
        # Stopped by the node's graceful shutdown: SIGTERM, which the process does not catch.
        term = _terminated(
            pod,
            container,
            0,
            exit_code=SIGTERM_EXIT_CODE,
            reason="Error",
            start=run.run_started,
            end=run.run_finished,
        )
        return _ran(pod, container, 0, {"terminated": term}, 0)
    if step == "sandbox_error":
        return _never_ran(container, {"reason": "ContainerCreating"})
    if step == "backoff":
        code, reason = _crash(run.mode, run.exit_code)
        attempt = run.restarts
        term = _terminated(
            pod,
            container,
            attempt,
            exit_code=code,
            reason=reason,
            start=run.run_started,
            end=run.run_finished,
        )
        message = (
            f"back-off {_back_off_text(run)} restarting failed "
            f"container={name} pod={run.name}_{run.namespace}({uid})"
        )
        st = _ran(
            pod,
            container,
            attempt,
            {"waiting": {"reason": "CrashLoopBackOff", "message": message}},
            run.restarts,
        )
        st["lastState"] = {"terminated": term}
        return st
    if step == "pull_error":
        return _never_ran(
            container, {"reason": "ErrImagePull", "message": pull_error_message(container["image"])}
        )
    if step == "pull_backoff":
        message = (
            f'Back-off pulling image "{container["image"]}": ErrImagePull: '
            + pull_error_message(container["image"])
        )
        return _never_ran(container, {"reason": "ImagePullBackOff", "message": message})
    if step == "create_error":
        cname = f"{name}_{run.name}_{run.namespace}_{uid}_0"
        holder = hashlib.sha256(f"{uid}/{name}/reserved".encode()).hexdigest()
        message = (
            f'failed to reserve container name "{cname}": name "{cname}" is reserved for "{holder}"'
        )
        return _never_ran(container, {"reason": "CreateContainerError", "message": message})
    if step == "evicted":
        term = _terminated(
            pod,
            container,
            0,
            exit_code=137,
            reason="Error",
            start=run.run_started,
            end=run.run_finished,
        )
        return _ran(pod, container, 0, {"terminated": term}, 0)
    # completed
    term = _terminated(
        pod,
        container,
        0,
        exit_code=0,
        reason="Completed",
        start=run.run_started,
        end=run.run_finished,
    )
    return _ran(pod, container, 0, {"terminated": term}, 0)


def _init_status(pod: JSON, run: PodRun, container: JSON) -> JSON:
    """Init containers: waiting while the sandbox starts, then done (or running, for sidecars)."""
    if run.step in ("creating", "sandbox_error"):
        return _never_ran(container, {"reason": "PodInitializing"})
    sidecar = container.get("restartPolicy") == "Always"
    if sidecar and run.step not in ("evicted", "shutdown", "failed", "completed"):
        st = _ran(pod, container, 0, {"running": {"startedAt": rfc3339(run.start_time)}}, 0)
        st["ready"] = True
        st["started"] = True
        return st
    exit_code, reason = (0, "Completed")
    if sidecar:
        if run.step == "evicted":
            exit_code, reason = (137, "Error")
        elif run.step == "shutdown":
            exit_code, reason = (SIGTERM_EXIT_CODE, "Error")
    term = _terminated(
        pod,
        container,
        0,
        exit_code=exit_code,
        reason=reason,
        start=run.start_time,
        end=run.start_time,
    )
    st = _ran(pod, container, 0, {"terminated": term}, 0)
    st["ready"] = not sidecar
    return st


def phase_of(pod: JSON, run: PodRun) -> str:
    step = run.step
    if step in ("creating", "pull_error", "pull_backoff", "create_error", "sandbox_error"):
        return "Pending"
    if step in ("evicted", "shutdown", "failed"):
        return "Failed"
    if step == "completed":
        return "Succeeded"
    return "Running"


def _names(items: list[str]) -> str:
    # Go's %s of a []string.
    return "[" + " ".join(items) + "]"


def _condition(run: PodRun, ctype: str, status: str, now: float, **extra: str) -> JSON:
    previous = run.conditions.get(ctype)
    ltt = previous[1] if previous and previous[0] == status else rfc3339(now)
    run.conditions[ctype] = (status, ltt)
    cond: JSON = {"type": ctype, "status": status, "lastProbeTime": None, "lastTransitionTime": ltt}
    # In a strategic merge patch null deletes: a reason or message from an earlier state must
    # not outlive it (the kubelet's two-way merge patch does the same).
    cond["reason"] = extra.get("reason") or None
    cond["message"] = extra.get("message") or None
    return cond


def pod_status(pod: JSON, run: PodRun, now: float) -> JSON:
    """The whole status the kubelet would report for ``pod`` at ``run.step``.

    Updates ``run.conditions`` (transition times). The result is meant for a strategic merge
    patch of ``pods/status``; it carries ``$setElementOrder/conditions`` so the conditions
    appear in the kubelet's order.
    """
    spec = pod.get("spec", {})
    generation = int(pod.get("metadata", {}).get("generation", 1))
    containers: list[JSON] = spec.get("containers", [])
    inits: list[JSON] = spec.get("initContainers", []) or []
    phase = phase_of(pod, run)
    init_statuses = [_init_status(pod, run, c) for c in inits]
    statuses = [_regular_status(pod, run, c, bool(inits)) for c in containers]

    terminal = phase in ("Failed", "Succeeded")
    conds: list[JSON] = []
    sandbox_up = not terminal and run.step != "sandbox_error"
    sandbox = "True" if sandbox_up else "False"
    conds.append(_condition(run, "PodReadyToStartContainers", sandbox, now))
    if run.step in ("creating", "sandbox_error") and inits:
        conds.append(
            _condition(
                run,
                "Initialized",
                "False",
                now,
                reason="ContainersNotInitialized",
                # Sidecars too: one is initialized only once started (isInitContainerInitialized).
                message="containers with incomplete status: " + _names([c["name"] for c in inits]),
            )
        )
    else:
        conds.append(
            _condition(
                run,
                "Initialized",
                "True",
                now,
                reason="PodCompleted" if phase == "Succeeded" else "",
            )
        )
    # Sidecars first, then the regular containers (GenerateContainersReadyCondition's order).
    unready = [
        s["name"]
        for s, c in zip(init_statuses, inits, strict=True)
        if c.get("restartPolicy") == "Always" and not s["ready"]
    ]
    unready += [s["name"] for s in statuses if not s["ready"]]
    if terminal:
        reason = "PodFailed" if phase == "Failed" else "PodCompleted"
        ready = _condition(run, "Ready", "False", now, reason=reason)
        containers_ready = _condition(run, "ContainersReady", "False", now, reason=reason)
    elif unready:
        message = "containers with unready status: " + _names(unready)
        ready = _condition(run, "Ready", "False", now, reason="ContainersNotReady", message=message)
        containers_ready = _condition(
            run, "ContainersReady", "False", now, reason="ContainersNotReady", message=message
        )
    else:
        containers_ready = _condition(run, "ContainersReady", "True", now)
        gates = _unready_gates(pod)
        if gates:
            ready = _condition(
                run, "Ready", "False", now, reason="ReadinessGatesNotReady", message=gates
            )
        else:
            ready = _condition(run, "Ready", "True", now)
    conds += [ready, containers_ready, _condition(run, "PodScheduled", "True", now)]
    for c in conds:
        c["observedGeneration"] = generation

    order = [{"type": t} for t in KUBELET_CONDITIONS]
    disrupted = _disruption(pod, run)
    if disrupted is not None:
        # The eviction manager (and the node shutdown manager) add DisruptionTarget; conditions
        # the kubelet does not own come first in its list.
        disruption = _condition(
            run,
            "DisruptionTarget",
            "True",
            now,
            reason="TerminationByKubelet",
            message=disrupted[1],
        )
        disruption["observedGeneration"] = generation
        conds = [disruption, *conds]
        order = [{"type": "DisruptionTarget"}, *order]

    status: JSON = {
        "observedGeneration": generation,
        "phase": phase,
        "conditions": conds,
        "$setElementOrder/conditions": order,
        "hostIP": run.host_ip,
        "hostIPs": [{"ip": run.host_ip}],
        "podIP": run.pod_ip,
        "podIPs": [{"ip": run.pod_ip}],
        "startTime": rfc3339(run.start_time),
        "containerStatuses": statuses,
    }
    if not run.pod_ip:
        # No sandbox, no network: the kubelet reports no pod IP.
        for key in ("podIP", "podIPs"):
            status.pop(key)
    if inits:
        status["initContainerStatuses"] = init_statuses
    if disrupted is not None:
        status["reason"], status["message"] = disrupted
    return status


# The node shutdown manager's reason and message for the pods it stops
# (pkg/kubelet/nodeshutdown: nodeShutdownReason, nodeShutdownMessage).
SHUTDOWN_REASON: Final = "Terminated"
SHUTDOWN_MESSAGE: Final = "Pod was terminated in response to imminent node shutdown."


def _disruption(pod: JSON, run: PodRun) -> tuple[str, str] | None:
    """The pod's ``status.reason`` and message, and the DisruptionTarget message, of a pod the
    kubelet itself ended: evicted, or stopped by a graceful node shutdown."""
    if run.step == "evicted":
        return "Evicted", eviction_message(pod)
    if run.step == "shutdown":
        return SHUTDOWN_REASON, SHUTDOWN_MESSAGE
    return None


def rejected_status(pod: JSON, reason: str, now: float) -> JSON:
    """What the kubelet writes on a pod its admission rejected (``rejectPod``: phase Failed,
    the reason, "Pod was rejected: " and the predicate's message; no sandbox, no containers
    run, no conditions of its own). For ``OutOfcpu``: the lifecycle predicate's
    "Node didn't have enough resource" with the pod's request and a node already full."""
    requested = 0
    for c in pod.get("spec", {}).get("containers", []) or []:
        cpu = str(((c.get("resources") or {}).get("requests") or {}).get("cpu") or "0")
        requested += int(cpu[:-1]) if cpu.endswith("m") else int(float(cpu) * 1000)
    capacity = 7800
    message = (
        f"Pod was rejected: Node didn't have enough resource: cpu, requested: {requested}, "
        f"used: {capacity - requested // 2}, capacity: {capacity}"
    )
    return {
        "observedGeneration": int(pod.get("metadata", {}).get("generation", 1)),
        "phase": "Failed",
        "reason": reason,
        "message": message,
        "startTime": rfc3339(now),
    }


def left_terminal(pod: JSON, run: PodRun, kind: str, ended: float) -> JSON:
    """The status a pod was left with ``kind`` (TERMINAL_KINDS) at ``ended``, long ago: evicted
    or stopped by a node shutdown after running an hour, or rejected at admission. A
    ``pods/status`` strategic merge patch body."""
    if kind == "OutOfcpu":
        return rejected_status(pod, kind, ended)
    run.start_time = ended - 3600.0
    run.run_started = run.start_time + 1.0
    run.run_finished = ended
    run.step = "evicted" if kind == "Evicted" else "shutdown"
    return pod_status(pod, run, ended)


def _unready_gates(pod: JSON) -> str:
    gates = pod.get("spec", {}).get("readinessGates", []) or []
    current = {
        c.get("type"): c.get("status") for c in pod.get("status", {}).get("conditions", []) or []
    }
    messages = []
    for gate in gates:
        ctype = gate.get("conditionType", "")
        if ctype not in current:
            messages.append(
                f'corresponding condition of pod readiness gate "{ctype}" does not exist.'
            )
        elif current[ctype] != "True":
            messages.append(
                f'the status of pod readiness gate "{ctype}" is not "True", but {current[ctype]}'
            )
    return ", ".join(messages)


def eviction_message(pod: JSON) -> str:
    """The eviction manager's message for a memory-pressure eviction of ``pod``."""
    message = (
        f"The node was low on resource: memory. Threshold quantity: {EVICTION_THRESHOLD}, "
        f"available: {EVICTION_AVAILABLE}. "
    )
    for c in pod.get("spec", {}).get("containers", []):
        requests = (c.get("resources", {}) or {}).get("requests", {}) or {}
        if "memory" not in requests:
            message += (
                f"Container {c['name']} was using {EVICTION_USAGE}, request is 0, "
                "has larger consumption of memory. "
            )
    return message


# -- a deleted pod's last status ------------------------------------------------------------------
#
# What the kubelet writes between a pod's deletion and its removal (kubelet v1.36:
# SyncTerminatingPod kills the containers and writes generateAPIPodStatus(podIsTerminal=true);
# SyncTerminatedPod then calls the status manager's TerminatePod, which makes the phase terminal
# and marks what it cannot account for as failed; the status manager deletes the pod for good
# once the API shows it terminal).

TERMINAL_PHASES: Final = ("Succeeded", "Failed")
# 128 + SIGTERM, as containerd reports a process the signal killed. The simulated processes do
# not catch SIGTERM and die of it at once: well inside any grace period (the kubelet grants at
# least 2 s, kuberuntime's minimumGracePeriodInSeconds), so they are never SIGKILLed (137).
SIGTERM_EXIT_CODE: Final = 143
# kubecontainer.ContainerReasonStatusUnknown and the message TerminatePod gives it.
STATUS_UNKNOWN: Final = "ContainerStatusUnknown"
STATUS_UNKNOWN_MESSAGE: Final = "The container could not be located when the pod was terminated"


def _state(status: JSON, key: str) -> JSON:
    block = status.get(key)
    return block if isinstance(block, dict) else {}


def _is_sidecar(container: JSON) -> bool:
    return container.get("restartPolicy") == "Always"


def _stopped(status: JSON, default_waiting: str, now: float) -> JSON:
    """One container's status once the kubelet stopped it for good.

    ``convertToAPIContainerStatuses`` after ``killPod``: a running container is now an exited
    one (the same containerID, its ``startedAt``, finished now); a container waiting to be
    restarted (crash loop back-off) is not restarted any more (``ShouldContainerBeRestarted`` is
    false once the pod has a deletionTimestamp), so its last run is its final state (the run
    before it is taken to be garbage-collected already, as the kubelet keeps one dead instance
    per container); a container that never ran is back to the default waiting state.
    """
    out = copy.deepcopy(status)
    state = _state(status, "state")
    last = _state(status, "lastState")
    if "terminated" in state:
        return out
    out["ready"] = False
    out["started"] = False
    if "running" in state:
        terminated: JSON = {
            "exitCode": SIGTERM_EXIT_CODE,
            "reason": "Error",
            "startedAt": (state.get("running") or {}).get("startedAt"),
            "finishedAt": rfc3339(now),
        }
        if status.get("containerID"):
            terminated["containerID"] = status["containerID"]
        out["state"] = {"terminated": terminated}
    elif "terminated" in last:
        out["state"] = {"terminated": copy.deepcopy(last["terminated"])}
        out["lastState"] = {}
    else:
        out["state"] = {"waiting": {"reason": default_waiting}}
    return out


def _statuses_of(containers: list[JSON], previous: list[JSON], default_waiting: str) -> list[JSON]:
    """The previous statuses in the spec's order; a container without one never ran."""
    by_name = {s.get("name"): s for s in previous if isinstance(s, dict)}
    return [
        by_name.get(c["name"]) or _never_ran(c, {"reason": default_waiting}) for c in containers
    ]


def phase_after_kill(pod: JSON, init_statuses: list[JSON], statuses: list[JSON]) -> str:
    """The kubelet's ``getPhase(podIsTerminal=true)`` for the statuses of stopped containers.

    Before ``TerminatePod``: a pod whose containers never ran is still Pending here.
    """
    spec = pod.get("spec", {})
    inits: list[JSON] = spec.get("initContainers", []) or []
    init_by_name = {s.get("name"): s for s in init_statuses}
    by_name = {s.get("name"): s for s in statuses}
    pending_init = failed_init = pending_sidecars = 0
    for c in inits:
        s = init_by_name.get(c["name"])
        state = _state(s or {}, "state")
        last = _state(s or {}, "lastState")
        if _is_sidecar(c):
            never_ran = s is None or ("waiting" in state and "terminated" not in last)
            if never_ran or ("running" in state and not (s or {}).get("started")):
                pending_sidecars += 1
            continue
        if s is None or "running" in state:
            pending_init += 1
        elif "terminated" in state or "terminated" in last:
            code = int((state.get("terminated") or last.get("terminated") or {}).get("exitCode", 0))
            if code != 0 and not should_restart(c, pod, code):
                failed_init += 1
        else:
            pending_init += 1
    running = waiting = stopped = succeeded = unknown = 0
    for c in spec.get("containers", []):
        s = by_name.get(c["name"])
        if s is None:
            unknown += 1
            continue
        state = _state(s, "state")
        last = _state(s, "lastState")
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            if int(state["terminated"].get("exitCode", 0)) == 0:
                succeeded += 1
        elif "waiting" in state and "terminated" in last:
            stopped += 1
        elif "waiting" in state:
            waiting += 1
        else:
            unknown += 1
    initialized = any(
        "terminated" in _state(s, "state") or "running" in _state(s, "state") for s in statuses
    )
    if failed_init:
        return "Failed"
    if pending_init or (pending_sidecars and not initialized) or waiting:
        return "Pending"
    if running and not unknown:
        return "Running"
    if not running and stopped and not unknown:
        return "Succeeded" if stopped == succeeded else "Failed"
    return "Pending"


def has_pod_initialized(pod: JSON) -> bool:
    """The status manager's ``hasPodInitialized``: any evidence a regular container started."""
    inits: list[JSON] = pod.get("spec", {}).get("initContainers", []) or []
    if not inits:
        return True
    status = pod.get("status", {}) or {}
    for s in status.get("containerStatuses", []) or []:
        if "terminated" in _state(s, "lastState") or "waiting" not in _state(s, "state"):
            return True
    init_statuses: list[JSON] = status.get("initContainerStatuses", []) or []
    if init_statuses and len(init_statuses) <= len(inits):
        last_spec = inits[len(init_statuses) - 1]
        s = init_statuses[-1]
        if _is_sidecar(last_spec):
            return "running" in _state(s, "state") and bool(s.get("started"))
        for key in ("lastState", "state"):
            terminated = _state(s, key).get("terminated")
            if isinstance(terminated, dict) and int(terminated.get("exitCode", 0)) == 0:
                return True
    return False


def _attempted(init_statuses: list[JSON]) -> int:
    """How many init containers (a prefix) ``initializedContainers`` counts as started: up to
    the last one not waiting for its first run; at least one."""
    for i in range(len(init_statuses) - 1, -1, -1):
        s = init_statuses[i]
        if "waiting" not in _state(s, "state") or "terminated" in _state(s, "lastState"):
            return i + 1
    return min(len(init_statuses), 1)


def _status_unknown(status: JSON) -> JSON:
    out = copy.deepcopy(status)
    out["state"] = {
        "terminated": {
            "exitCode": 137,
            "reason": STATUS_UNKNOWN,
            "message": STATUS_UNKNOWN_MESSAGE,
        }
    }
    return out


def _transition(previous: dict[str, JSON], ctype: str, status: str, now: float) -> str:
    """The status manager's ``updateLastTransitionTime``: kept while the status stays."""
    old = previous.get(ctype)
    if old is not None and old.get("status") == status and old.get("lastTransitionTime"):
        return str(old["lastTransitionTime"])
    return rfc3339(now)


def terminated_status(pod: JSON, now: float) -> JSON | None:
    """The status the kubelet leaves on a deleted ``pod`` once it stopped its containers.

    ``pod`` is the pod as last written (its status is the kubelet's own last status). ``None``
    when the pod is terminal already: the kubelet writes nothing more and only removes it.
    Otherwise the result is a whole ``pods/status`` strategic merge patch body:

    - containers stopped (:func:`_stopped`), then ``TerminatePod``: once the pod has
      initialized (:func:`has_pod_initialized`), a regular container still not terminated
      becomes ``ContainerStatusUnknown``, exit 137, with no times (the Job controller then
      takes the pod's finish time from its Ready=False transition); so does the first init
      container that never ran, when none did;
    - phase: what ``getPhase`` gives for the stopped containers (Succeeded only when every
      regular container exited 0), then Pending or Running become Failed;
    - conditions generated for that pre-``TerminatePod`` phase: Ready and ContainersReady False
      with reason PodFailed / PodCompleted for a pod whose containers ran, ContainersNotReady
      for one whose containers never did; PodReadyToStartContainers False (the sandbox is
      gone); a condition's ``lastTransitionTime`` moves only when its status changes;
      conditions the kubelet does not own (``DisruptionTarget`` from the Eviction API,
      readiness gates) are not sent, so the merge keeps them, and come first in the order.
    """
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status: JSON = pod.get("status", {}) or {}
    if status.get("phase") in TERMINAL_PHASES:
        return None
    generation = int(meta.get("generation", 1))
    containers: list[JSON] = spec.get("containers", [])
    inits: list[JSON] = spec.get("initContainers", []) or []
    default_waiting = "PodInitializing" if inits else "ContainerCreating"
    init_statuses = [
        _stopped(s, "PodInitializing", now)
        for s in _statuses_of(inits, status.get("initContainerStatuses") or [], "PodInitializing")
    ]
    statuses = [
        _stopped(s, default_waiting, now)
        for s in _statuses_of(containers, status.get("containerStatuses") or [], default_waiting)
    ]
    phase = phase_after_kill(pod, init_statuses, statuses)

    previous = {
        c.get("type", ""): c for c in status.get("conditions", []) or [] if isinstance(c, dict)
    }

    def condition(ctype: str, value: str, reason: str = "", message: str = "") -> JSON:
        # In a strategic merge patch null deletes: an earlier reason or message must not stay.
        return {
            "type": ctype,
            "status": value,
            "observedGeneration": generation,
            "lastProbeTime": None,
            "lastTransitionTime": _transition(previous, ctype, value, now),
            "reason": reason or None,
            "message": message or None,
        }

    ran = any("terminated" in _state(s, "state") for s in statuses)
    init_by_name = {s["name"]: s for s in init_statuses}
    incomplete = [
        c["name"]
        for c in inits
        if not (
            init_by_name[c["name"]].get("started")
            if _is_sidecar(c)
            else init_by_name[c["name"]].get("ready")
        )
    ]
    if phase == "Succeeded":
        initialized = condition("Initialized", "True", "PodCompleted")
    elif ran or not incomplete:
        initialized = condition("Initialized", "True")
    else:
        initialized = condition(
            "Initialized",
            "False",
            "ContainersNotInitialized",
            "containers with incomplete status: " + _names(incomplete),
        )
    if phase in TERMINAL_PHASES:
        reason = "PodFailed" if phase == "Failed" else "PodCompleted"
        ready = condition("Ready", "False", reason)
        containers_ready = condition("ContainersReady", "False", reason)
    else:
        unready = [c["name"] for c in inits if _is_sidecar(c)] + [c["name"] for c in containers]
        message = "containers with unready status: " + _names(unready)
        ready = condition("Ready", "False", "ContainersNotReady", message)
        containers_ready = condition("ContainersReady", "False", "ContainersNotReady", message)
    conditions = [
        condition("PodReadyToStartContainers", "False"),
        initialized,
        ready,
        containers_ready,
        condition("PodScheduled", "True"),
    ]

    # TerminatePod: whatever the kubelet cannot account for failed.
    if has_pod_initialized(pod):
        statuses = [
            s if "terminated" in _state(s, "state") else _status_unknown(s) for s in statuses
        ]
    attempted = _attempted(init_statuses)
    init_statuses = [
        _status_unknown(s) if i < attempted and "terminated" not in _state(s, "state") else s
        for i, s in enumerate(init_statuses)
    ]
    if phase not in TERMINAL_PHASES:
        phase = "Failed"

    others = [
        {"type": c["type"]}
        for c in status.get("conditions", []) or []
        if isinstance(c, dict) and c.get("type") not in KUBELET_CONDITIONS
    ]
    result: JSON = {
        "observedGeneration": generation,
        "phase": phase,
        "conditions": conditions,
        "$setElementOrder/conditions": [*others, *({"type": t} for t in KUBELET_CONDITIONS)],
        "containerStatuses": statuses,
    }
    if inits:
        result["initContainerStatuses"] = init_statuses
    return result
