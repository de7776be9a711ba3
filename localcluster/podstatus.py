"""Pod statuses shaped the way kubelet v1.36 with containerd writes them (pure functions).

The fake kubelet (:mod:`localcluster.kubelet`) keeps a :class:`PodRun` per pod and asks
:func:`pod_status` for the status of the step the pod has reached. The shapes follow the
kubelet's code: ``generateAPIPodStatus`` (conditions in the kubelet's order, non-kubelet
conditions first), ``convertToAPIContainerStatuses`` (containers that never ran carry the spec's
image and no IDs; containers that ran carry containerd's normalised image, a digest imageID and a
containerID, resources and user), the status manager (a condition's ``lastTransitionTime`` moves
only when its status changes; ``observedGeneration`` is the pod's generation) and the messages of
the image manager, the back-off of ``kuberuntime`` and the eviction manager.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
from dataclasses import dataclass, field
from typing import Any, Final, Literal

JSON = dict[str, Any]

# The node fault modes (values of the SIM_FAULT_LABEL node label); "none" marks a healthy bind.
FAULT_MODES: Final = ("crashloop", "oom", "imagepull", "evict", "createcontainer")
HEALTHY: Final = "none"

Step = Literal[
    "creating",  # sandbox up, containers being created (Pending, ContainerCreating)
    "running",  # containers running and ready
    "crashed",  # first run exited (state.terminated); restartCount 0
    "backoff",  # CrashLoopBackOff; restartCount >= 1
    "pull_error",  # ErrImagePull
    "pull_backoff",  # ImagePullBackOff
    "create_error",  # CreateContainerError
    "evicted",  # Failed, reason Evicted
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
    """The kubelet's back-off after ``restarts`` restarts: 10s doubling, capped at 5m."""
    return go_duration(min(10 * 2 ** max(restarts - 1, 0), 300))


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
    # When the current (or last) container run started and ended.
    run_started: float = 0.0
    run_finished: float = 0.0
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


def _crash(mode: str) -> tuple[int, str]:
    return (137, "OOMKilled") if mode == "oom" else (1, "Error")


def _regular_status(pod: JSON, run: PodRun, container: JSON, has_init: bool) -> JSON:
    """One regular container's status at ``run.step``."""
    name = container["name"]
    uid = pod["metadata"]["uid"]
    step = run.step
    if step == "creating":
        reason = "PodInitializing" if has_init else "ContainerCreating"
        return _never_ran(container, {"reason": reason})
    if step == "running":
        st = _ran(pod, container, 0, {"running": {"startedAt": rfc3339(run.run_started)}}, 0)
        st["ready"] = True
        st["started"] = True
        return st
    if step in ("crashed", "failed"):
        code, reason = _crash(run.mode)
        term = _terminated(
            pod,
            container,
            0,
            exit_code=code,
            reason=reason,
            start=run.run_started,
            end=run.run_finished,
        )
        return _ran(pod, container, 0, {"terminated": term}, 0)
    if step == "backoff":
        code, reason = _crash(run.mode)
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
            f"back-off {crashloop_backoff(run.restarts)} restarting failed "
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
    if run.step == "creating":
        return _never_ran(container, {"reason": "PodInitializing"})
    sidecar = container.get("restartPolicy") == "Always"
    if sidecar and run.step not in ("evicted", "failed", "completed"):
        st = _ran(pod, container, 0, {"running": {"startedAt": rfc3339(run.start_time)}}, 0)
        st["ready"] = True
        st["started"] = True
        return st
    exit_code, reason = (0, "Completed")
    if sidecar:
        exit_code, reason = (137, "Error") if run.step == "evicted" else (0, "Completed")
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
    if step in ("creating", "pull_error", "pull_backoff", "create_error"):
        return "Pending"
    if step in ("evicted", "failed"):
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
    conds.append(_condition(run, "PodReadyToStartContainers", "False" if terminal else "True", now))
    if run.step == "creating" and inits:
        conds.append(
            _condition(
                run,
                "Initialized",
                "False",
                now,
                reason="ContainersNotInitialized",
                message="containers with incomplete status: "
                + _names([c["name"] for c in inits if c.get("restartPolicy") != "Always"]),
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
    unready = [s["name"] for s in statuses if not s["ready"]]
    unready += [
        s["name"]
        for s, c in zip(init_statuses, inits, strict=True)
        if c.get("restartPolicy") == "Always" and not s["ready"]
    ]
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
    if run.step == "evicted":
        # The eviction manager adds DisruptionTarget; conditions the kubelet does not own come
        # first in its list.
        disruption = _condition(
            run,
            "DisruptionTarget",
            "True",
            now,
            reason="TerminationByKubelet",
            message=eviction_message(pod),
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
    if inits:
        status["initContainerStatuses"] = init_statuses
    if run.step == "evicted":
        status["reason"] = "Evicted"
        status["message"] = eviction_message(pod)
    return status


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
