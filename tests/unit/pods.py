"""Realistic pod objects, shaped like what the API server returns once a kubelet has written them.

Tests that feed hand-trimmed dicts to the classifier only prove it handles hand-trimmed dicts.
These carry what a real pod carries (generated names, ownerReferences with uids, the conditions
in the kubelet's order, containerIDs and imageIDs, restart counts, lastState of the previous
run, the back-off message), so a classifier that trips over a real field trips here first.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from shared.api.keys import EXCLUDED_NODES_ANNOTATION, POLICY_STAMP_ANNOTATION
from shared.api.kubetypes import ContainerStatus, Pod

NOW = datetime(2026, 3, 14, 9, 26, 53, tzinfo=UTC)
IMAGE = "registry.example.com/shop/web:1.4.2"


def ts(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hex(seed: str, length: int = 64) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:length]


def uid(seed: str) -> str:
    h = _hex(seed, 32)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _image_id(image: str) -> str:
    return f"{image.rsplit(':', 1)[0]}@sha256:{_hex(image)}"


def _container_id(name: str, attempt: int) -> str:
    return f"containerd://{_hex(f'{name}-{attempt}')}"


def running(
    name: str = "app",
    *,
    restarts: int = 0,
    started: datetime = NOW - timedelta(minutes=4),
    ready: bool = True,
    last: Mapping[str, Any] | None = None,
    image: str = IMAGE,
) -> ContainerStatus:
    status: dict[str, Any] = {
        "name": name,
        "state": {"running": {"startedAt": ts(started)}},
        "lastState": {"terminated": dict(last)} if last else {},
        "ready": ready,
        "restartCount": restarts,
        "image": image,
        "imageID": _image_id(image),
        "containerID": _container_id(name, restarts),
        "started": True,
    }
    return cast(ContainerStatus, status)


def last_terminated(
    reason: str = "Error",
    exit_code: int = 1,
    *,
    name: str = "app",
    attempt: int = 0,
    finished: datetime = NOW - timedelta(seconds=40),
    ran_for: timedelta = timedelta(seconds=3),
) -> dict[str, Any]:
    """The `terminated` block the kubelet keeps in lastState for the previous run."""
    return {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": ts(finished - ran_for),
        "finishedAt": ts(finished),
        "containerID": _container_id(name, attempt),
    }


def _go_duration(seconds: int) -> str:
    """How Go prints a time.Duration of whole seconds (the kubelet's %s): 40s, 1m20s, 5m0s."""
    minutes, secs = divmod(seconds, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def crash_looping(
    name: str = "app",
    *,
    restarts: int = 3,
    last_reason: str = "Error",
    exit_code: int = 1,
    pod_name: str = "web-7d9c8b6f4-x2x9z",
    namespace: str = "shop",
    image: str = IMAGE,
) -> ContainerStatus:
    backoff = _go_duration(min(10 * 2 ** max(restarts - 1, 0), 300))
    status: dict[str, Any] = {
        "name": name,
        "state": {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": (
                    f"back-off {backoff} restarting failed container={name} "
                    f"pod={pod_name}_{namespace}({uid(pod_name)})"
                ),
            }
        },
        "lastState": {
            "terminated": last_terminated(
                last_reason, exit_code, name=name, attempt=max(restarts - 1, 0)
            )
        },
        "ready": False,
        "restartCount": restarts,
        "image": image,
        "imageID": _image_id(image),
        "containerID": _container_id(name, max(restarts - 1, 0)),
        "started": False,
    }
    return cast(ContainerStatus, status)


def waiting(
    reason: str,
    message: str = "",
    name: str = "app",
    *,
    restarts: int = 0,
    image: str = IMAGE,
) -> ContainerStatus:
    """A container the kubelet has not managed to start (no containerID/imageID yet)."""
    state: dict[str, Any] = {"reason": reason}
    if message:
        state["message"] = message
    status: dict[str, Any] = {
        "name": name,
        "state": {"waiting": state},
        "lastState": {},
        "ready": False,
        "restartCount": restarts,
        "image": image,
        "imageID": "",
        "started": False,
    }
    return cast(ContainerStatus, status)


def terminated(
    reason: str,
    exit_code: int,
    name: str = "app",
    *,
    restarts: int = 0,
    finished: datetime = NOW - timedelta(seconds=5),
    image: str = IMAGE,
) -> ContainerStatus:
    status: dict[str, Any] = {
        "name": name,
        "state": {
            "terminated": last_terminated(
                reason, exit_code, name=name, attempt=restarts, finished=finished
            )
        },
        "lastState": {},
        "ready": False,
        "restartCount": restarts,
        "image": image,
        "imageID": _image_id(image),
        "containerID": _container_id(name, restarts),
        "started": False,
    }
    return cast(ContainerStatus, status)


def _owner(kind: str, name: str) -> dict[str, Any]:
    api_version = {"Node": "v1", "Job": "batch/v1"}.get(kind, "apps/v1")
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid(f"{kind}/{name}"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _container_spec(name: str, image: str = IMAGE) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
        "resources": {
            "limits": {"memory": "512Mi"},
            "requests": {"cpu": "100m", "memory": "256Mi"},
        },
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        "volumeMounts": [
            {
                "name": "kube-api-access-x7k2p",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
    }


def pod(
    name: str = "web-7d9c8b6f4-x2x9z",
    namespace: str = "shop",
    *,
    owner: tuple[str, str] | None = ("ReplicaSet", "web-7d9c8b6f4"),
    node: str | None = "node-b",
    phase: str = "Running",
    containers: Iterable[ContainerStatus] | None = None,
    init_containers: Iterable[ContainerStatus] | None = None,
    stamp: str | None = "3",
    excluded: list[str] | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    started: datetime | None = NOW - timedelta(minutes=5),
    reason: str | None = None,
    message: str | None = None,
    conditions: list[dict[str, Any]] | None = None,
    deleting: bool = False,
    affinity: Mapping[str, Any] | None = None,
) -> Pod:
    """A pod of a Deployment's ReplicaSet, by default running and healthy on node-b."""
    statuses = list(containers) if containers is not None else [running()]
    init_statuses = list(init_containers) if init_containers is not None else []
    created = (started or NOW) - timedelta(seconds=2)
    all_annotations: dict[str, str] = {}
    if stamp is not None:
        all_annotations[POLICY_STAMP_ANNOTATION] = stamp
    if excluded is not None:
        all_annotations[EXCLUDED_NODES_ANNOTATION] = json.dumps(excluded)
    all_annotations.update(annotations or {})
    generate = name.rsplit("-", 1)[0] + "-" if owner and owner[0] == "ReplicaSet" else None
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid(name),
        "resourceVersion": str(int(_hex(name, 6), 16)),
        "creationTimestamp": ts(created),
        "labels": dict(labels or {"app": "web", "pod-template-hash": "7d9c8b6f4"}),
    }
    if generate:
        metadata["generateName"] = generate
    if all_annotations:
        metadata["annotations"] = all_annotations
    if owner:
        metadata["ownerReferences"] = [_owner(*owner)]
    if deleting:
        metadata["deletionTimestamp"] = ts(NOW)
        metadata["deletionGracePeriodSeconds"] = 30
    spec: dict[str, Any] = {
        "containers": [_container_spec(s.get("name", "app")) for s in statuses],
        "restartPolicy": "OnFailure" if owner and owner[0] == "Job" else "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "volumes": [
            {
                "name": "kube-api-access-x7k2p",
                "projected": {"defaultMode": 420, "sources": [{"serviceAccountToken": {}}]},
            }
        ],
    }
    if init_statuses:
        spec["initContainers"] = [_container_spec(s.get("name", "init")) for s in init_statuses]
    if node:
        spec["nodeName"] = node
    if affinity is not None:
        spec["affinity"] = copy.deepcopy(dict(affinity))
    status: dict[str, Any] = {"phase": phase, "qosClass": "Burstable"}
    if conditions is not None:
        status["conditions"] = conditions
    elif node:
        status["conditions"] = _kubelet_conditions(statuses, init_statuses, created, phase)
    if node and started is not None:
        status["hostIP"] = "10.0.0.12"
        status["hostIPs"] = [{"ip": "10.0.0.12"}]
        status["startTime"] = ts(started)
        if phase in ("Running", "Pending"):
            status["podIP"] = "10.244.2.17"
            status["podIPs"] = [{"ip": "10.244.2.17"}]
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    if started is not None and node:
        if statuses:
            status["containerStatuses"] = statuses
        if init_statuses:
            status["initContainerStatuses"] = init_statuses
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}
    return cast(Pod, body)


def _kubelet_conditions(
    statuses: list[ContainerStatus],
    init_statuses: list[ContainerStatus],
    created: datetime,
    phase: str,
) -> list[dict[str, Any]]:
    unready = [s.get("name", "") for s in statuses if not s.get("ready")]
    inits_done = all("terminated" in s.get("state", {}) or s.get("ready") for s in init_statuses)

    def condition(kind: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
        c: dict[str, Any] = {
            "type": kind,
            "status": "True" if ok else "False",
            "lastProbeTime": None,
            "lastTransitionTime": ts(created + timedelta(seconds=3)),
        }
        if not ok and reason:
            c["reason"] = reason
            c["message"] = message
        return c

    ready_message = f"containers with unready status: [{' '.join(unready)}]"
    done = phase in ("Failed", "Succeeded")
    return [
        condition("PodReadyToStartContainers", not done),
        condition(
            "Initialized",
            inits_done,
            "ContainersNotInitialized",
            "containers with incomplete status: "
            f"[{' '.join(s.get('name', '') for s in init_statuses)}]",
        ),
        condition("Ready", not unready and not done, "ContainersNotReady", ready_message),
        condition("ContainersReady", not unready and not done, "ContainersNotReady", ready_message),
        condition("PodScheduled", True),
    ]


def evicted(node: str = "node-b", **kwargs: Any) -> Pod:
    """What the kubelet leaves behind after evicting a pod under memory pressure."""
    message = (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. "
        "Container app was using 812Mi, request is 256Mi, has larger consumption of memory. "
    )
    p = pod(
        node=node,
        phase="Failed",
        reason="Evicted",
        message=message,
        containers=[terminated("ContainerStatusUnknown", 137)],
        **kwargs,
    )
    p["status"].setdefault("conditions", []).insert(
        0,
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "TerminationByKubelet",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": ts(NOW - timedelta(seconds=20)),
        },
    )
    return p


def unschedulable(excluded: list[str] | None = None, **kwargs: Any) -> Pod:
    """A pod the scheduler gave up on: no nodeName, PodScheduled False/Unschedulable."""
    kwargs.setdefault("name", "web-7d9c8b6f4-q8v4n")
    return pod(
        node=None,
        phase="Pending",
        started=None,
        excluded=excluded,
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": (
                    "0/3 nodes are available: 3 node(s) didn't match Pod's node "
                    "affinity/selector. preemption: 0/3 nodes are available: 3 Preemption "
                    "is not helpful for scheduling."
                ),
                "lastProbeTime": None,
                "lastTransitionTime": ts(NOW - timedelta(seconds=30)),
            }
        ],
        **kwargs,
    )


def pending_on_node(
    pending_for: timedelta,
    *,
    containers: Iterable[ContainerStatus] | None = None,
    kubelet_seen: bool = True,
    **kwargs: Any,
) -> Pod:
    """A pod bound to a node that has not started it (ContainerCreating for `pending_for`)."""
    bound = NOW - pending_for
    p = pod(
        phase="Pending",
        started=bound if kubelet_seen else None,
        containers=containers if containers is not None else [waiting("ContainerCreating")],
        conditions=[
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": ts(bound),
            }
        ],
        **kwargs,
    )
    return p


def mirror(node: str = "node-b") -> Pod:
    """The API mirror of a static pod the kubelet runs from a manifest file."""
    name = f"etcd-backup-{node}"
    return pod(
        name,
        "infra",
        owner=("Node", node),
        node=node,
        stamp=None,
        annotations={
            "kubernetes.io/config.hash": _hex(name, 32),
            "kubernetes.io/config.mirror": _hex(name, 32),
            "kubernetes.io/config.seen": ts(NOW - timedelta(days=3)),
            "kubernetes.io/config.source": "file",
        },
        containers=[crash_looping(restarts=12, pod_name=name, namespace="infra")],
    )


def new_pod(
    *,
    annotations: Mapping[str, str] | None = None,
    affinity: Mapping[str, Any] | None = None,
    owner: tuple[str, str] | None = ("ReplicaSet", "web-7d9c8b6f4"),
    name: str | None = None,
    labels: Mapping[str, str] | None = None,
    node: str | None = None,
) -> Pod:
    """A pod as the mutating webhook receives it on CREATE.

    Mutating admission runs before the API server fills in the object: a controller's pod
    has only generateName (no name), and there is no uid, resourceVersion or status yet.
    """
    base = pod(
        name or "web-7d9c8b6f4-zzzzz",
        owner=owner,
        node=node,
        stamp=None,
        started=None,
        annotations=annotations,
        labels=labels,
        affinity=affinity,
        conditions=[],
    )
    meta = cast(dict[str, Any], base["metadata"])
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        meta.pop(key, None)
    if name is None:
        meta.pop("name")
    if not annotations:
        meta.pop("annotations", None)
    del cast(dict[str, Any], base)["status"]
    return base


def no_memory_limit(p: Pod) -> Pod:
    """The same pod with no memory limit on any container (a BestEffort-ish memory budget): an
    OOM kill then comes from the node running out, not from the container's own limit."""
    changed = copy.deepcopy(p)
    spec = cast(dict[str, Any], changed["spec"])
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            container.get("resources", {}).get("limits", {}).pop("memory", None)
    return changed


def sandbox_ready_since(p: Pod, since: datetime) -> Pod:
    """The pod with the kubelet's PodReadyToStartContainers=True from ``since``: its sandbox
    and network are up, so what it waits for now is its images and containers."""
    changed = copy.deepcopy(p)
    conditions = cast(list[dict[str, Any]], changed["status"].setdefault("conditions", []))
    conditions[:] = [c for c in conditions if c.get("type") != "PodReadyToStartContainers"]
    conditions.insert(
        0,
        {
            "type": "PodReadyToStartContainers",
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": ts(since),
        },
    )
    return changed


def kubelet_event(
    p: Pod,
    reason: str,
    message: str,
    *,
    at: datetime,
    container: str | None = "app",
    kind: str = "Normal",
    count: int = 1,
) -> dict[str, Any]:
    """An Event about ``p`` as kubelet v1.36 writes it through its legacy recorder (recorded:
    tests/fixtures/real-kubelet/crashloop.json): the pod and its uid as involvedObject, the
    container as its fieldPath, the node as source.host and reportingInstance, repeats folded
    into count."""
    meta = p["metadata"]
    node = str(p.get("spec", {}).get("nodeName") or "")
    involved: dict[str, Any] = {
        "kind": "Pod",
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "apiVersion": "v1",
        "resourceVersion": meta.get("resourceVersion", "1"),
    }
    if container is not None:
        involved["fieldPath"] = f"spec.containers{{{container}}}"
    return {
        "metadata": {
            "name": f"{meta.get('name')}.{_hex(reason + message, 16)}",
            "namespace": meta.get("namespace"),
        },
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "source": {"component": "kubelet", "host": node},
        "firstTimestamp": ts(at),
        "lastTimestamp": ts(at),
        "count": count,
        "type": kind,
        "eventTime": None,
        "reportingComponent": "kubelet",
        "reportingInstance": node,
    }
