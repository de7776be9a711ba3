"""The requests that estimate load not measured yet, for the usage record on a Node.

annotate-usage writes each node's measured usage onto the Node (the record and its format are
``shared.api.usage``), percent of the node's allocatable (what the scheduler places against).

Herding: a measured usage lags the pods placed on a node (a container needs time to start and
to load, and a rate over a minute needs a minute). The record therefore also carries an
estimate: the requests of pods bound to the node within a window before the sample, which the
extender adds to the measured usage (Koordinator's estimated usage of just-placed pods, crane's
"hot value"). It is computed by the annotator, stateless, from the pods' PodScheduled times.

Requests follow the scheduler's own arithmetic (k8s.io/component-helpers resource.PodRequests):
the containers' sum, raised to the largest init container (a restartable "sidecar" init
container runs beside the others, so it adds to both), plus the pod overhead; pod-level
requests, when set, replace the containers'.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, cast

from shared.api import quantity
from shared.api.keys import MIRROR_POD_ANNOTATION, opted_out
from shared.api.kubetypes import Node, Pod
from shared.api.times import parse_time
from shared.api.usage import Estimate
from shared.platform.config import Config

# -- requests and allocatable ---------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    """CPU in millicores and memory in bytes."""

    cpu_millis: int = 0
    memory_bytes: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu_millis + other.cpu_millis, self.memory_bytes + other.memory_bytes)

    def most(self, other: Resources) -> Resources:
        """Per resource, the larger of the two."""
        return Resources(
            max(self.cpu_millis, other.cpu_millis), max(self.memory_bytes, other.memory_bytes)
        )

    def scaled(self, factor: float) -> Resources:
        return Resources(math.ceil(self.cpu_millis * factor), math.ceil(self.memory_bytes * factor))


def _resources(raw: object) -> Resources:
    """{"cpu": "250m", "memory": "64Mi"} as Resources; a missing resource is 0.

    Raises quantity.QuantityError for a value that is not a quantity.
    """
    if not isinstance(raw, Mapping):
        return Resources()
    cpu = raw.get("cpu")
    memory = raw.get("memory")
    return Resources(
        cpu_millis=0 if cpu is None else quantity.millicores(cpu),
        memory_bytes=0 if memory is None else quantity.bytes_of(memory),
    )


def _requests_of(container: Mapping[str, Any]) -> Resources:
    return _resources((container.get("resources") or {}).get("requests"))


def pod_requests(pod: Pod) -> Resources:
    """The pod's effective requests, as the scheduler counts them.

    Raises quantity.QuantityError for a request that is not a quantity.
    """
    spec = pod.get("spec") or {}
    pod_level = (spec.get("resources") or {}).get("requests")
    total = Resources()
    for container in spec.get("containers") or []:
        total = total + _requests_of(container)
    sidecars = Resources()
    init_peak = Resources()
    for container in spec.get("initContainers") or []:
        own = _requests_of(container)
        if container.get("restartPolicy") == "Always":
            # A sidecar keeps running beside later init containers and the app containers.
            total = total + own
            sidecars = sidecars + own
            running = sidecars
        else:
            running = own + sidecars
        init_peak = init_peak.most(running)
    total = total.most(init_peak)
    if pod_level:
        # Pod-level resources (PodLevelResources): the pod's own requests win where set.
        level = _resources(pod_level)
        total = Resources(
            level.cpu_millis if "cpu" in pod_level else total.cpu_millis,
            level.memory_bytes if "memory" in pod_level else total.memory_bytes,
        )
    overhead = _resources(spec.get("overhead"))
    return total + overhead


def allocatable(node: Node) -> Resources | None:
    """The node's allocatable CPU and memory; None when either is missing, zero or unreadable."""
    raw = (node.get("status") or {}).get("allocatable") or {}
    try:
        found = _resources(raw)
    except quantity.QuantityError:
        return None
    if found.cpu_millis <= 0 or found.memory_bytes <= 0:
        return None
    return found


def percent_of(part: Resources, whole: Resources) -> tuple[float, float]:
    """``part`` as percent of ``whole``, CPU and memory."""
    return (
        100.0 * part.cpu_millis / whole.cpu_millis,
        100.0 * part.memory_bytes / whole.memory_bytes,
    )


# -- the estimate --------------------------------------------------------------------------------


def scheduled_at(pod: Pod) -> datetime | None:
    """When the scheduler bound the pod: its PodScheduled=True condition's transition time."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            raw = condition.get("lastTransitionTime")
            if isinstance(raw, str):
                try:
                    return parse_time(raw)
                except (TypeError, ValueError):
                    return None
    return None


def estimate(
    pods: Iterable[Pod],
    node_allocatable: Resources,
    sampled_at: datetime,
    window: timedelta,
    factor: float,
) -> Estimate:
    """The requests (times ``factor``) of the node's pods bound within ``window`` before the
    sample (or after it), percent of allocatable. Terminal pods use nothing; a pod whose
    requests cannot be read counts as none (the API server validated them on create, so this
    is only ever a malformed object in a test)."""
    since = sampled_at - window
    total = Resources()
    count = 0
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        bound = scheduled_at(pod)
        if bound is None or bound <= since:
            continue
        try:
            total = total + pod_requests(pod)
        except quantity.QuantityError:
            continue
        count += 1
    if count == 0:
        return Estimate()
    cpu, memory = percent_of(total.scaled(factor), node_allocatable)
    return Estimate(cpu=cpu, memory=memory, pods=count)


# -- pods their load never keeps off a node -------------------------------------------------

# Why a pod passes every node (score-nodes' verdict reason, and why annotate-usage does not warn
# about its binding).
DAEMON_POD: Final = "daemonset-pod"
STATIC_POD: Final = "static-pod"
CRITICAL_POD: Final = "system-critical-pod"
EXCLUDED_NAMESPACE: Final = "excluded-namespace"
OPTED_OUT_POD: Final = "opted-out-pod"


def is_daemon_pod(pod: Pod) -> bool:
    """Controlled by a DaemonSet: one pod per node, pinned there by its controller."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(
        isinstance(o, dict) and o.get("kind") == "DaemonSet" and o.get("controller") is True
        for o in owners
    )


# k8s.io/api/scheduling/v1: the two built-in priority classes, and SystemCriticalPriority
# (2 * HighestUserDefinablePriority), from which the kubelet calls a pod critical.
_CRITICAL_CLASSES: Final = frozenset({"system-cluster-critical", "system-node-critical"})
SYSTEM_CRITICAL_PRIORITY: Final = 2_000_000_000


@dataclass(frozen=True)
class Exemption:
    """Why a pod passes every node whatever its load: a reason (a label) and the text."""

    reason: str
    message: str


def exemption(pod: Pod, cfg: Config) -> Exemption | None:
    """Why ``pod`` must not be kept off any node by its load, or None.

    System-critical pods (kube-proxy, CoreDNS, a CNI's agents) keep a cluster working; pods of
    a DaemonSet or a static pod belong to one node; an excluded namespace and the opt-out
    label are the project's own "leave it alone", as for every other function.
    """
    # A TypedDict from the API server, but only ever checked here (a hand-made object may not
    # be one): read as plain maps.
    metadata: object = pod.get("metadata")
    meta: dict[str, Any] = cast(dict[str, Any], metadata) if isinstance(metadata, dict) else {}
    raw_spec: object = pod.get("spec")
    spec: dict[str, Any] = cast(dict[str, Any], raw_spec) if isinstance(raw_spec, dict) else {}
    if is_daemon_pod(pod):
        return Exemption(DAEMON_POD, "a DaemonSet's pod")
    annotations = meta.get("annotations")
    owners = meta.get("ownerReferences")
    if (isinstance(annotations, dict) and MIRROR_POD_ANNOTATION in annotations) or any(
        isinstance(o, dict) and o.get("kind") == "Node" and o.get("controller") is True
        for o in (owners if isinstance(owners, list) else ())
    ):
        return Exemption(STATIC_POD, "a static pod")
    priority = spec.get("priority")
    if spec.get("priorityClassName") in _CRITICAL_CLASSES or (
        isinstance(priority, int) and priority >= SYSTEM_CRITICAL_PRIORITY
    ):
        return Exemption(CRITICAL_POD, "a system-critical pod")
    namespace = meta.get("namespace")
    if isinstance(namespace, str) and cfg.is_excluded_namespace(namespace):
        return Exemption(EXCLUDED_NAMESPACE, f"a pod of the excluded namespace {namespace}")
    labels = meta.get("labels")
    if opted_out(labels if isinstance(labels, dict) else None):
        return Exemption(OPTED_OUT_POD, "an opted-out pod")
    return None
