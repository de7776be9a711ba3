"""The usage record on a Node, and the requests that estimate load not measured yet.

annotate-usage samples each node's CPU and memory usage and writes it onto the Node as one
versioned JSON annotation (``kn-rescheduler.io/usage``), so the scheduler extender and
rebalance-nodes read usage from Node objects they already have and never call Prometheus on a
hot path. Values are percent of the node's allocatable (what the scheduler places against), as
the current usage, the 5-minute average and the 1-hour maximum.

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

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from shared.api import quantity
from shared.api.keys import USAGE_ANNOTATION
from shared.api.kubetypes import Node, Pod
from shared.api.times import format_time, parse_time

RECORD_VERSION: Final = 1
# A percentage kept to one decimal: finer says nothing and churns the annotation.
_DECIMALS: Final = 1


class UsageError(ValueError):
    """The annotation holds something that is not a usage record we can read."""


@dataclass(frozen=True)
class Reading:
    """One resource's usage, percent of allocatable: now, 5-minute average, 1-hour maximum."""

    now: float
    avg5m: float | None = None
    max1h: float | None = None

    def to_json(self) -> dict[str, float]:
        out = {"now": round(self.now, _DECIMALS)}
        if self.avg5m is not None:
            out["avg5m"] = round(self.avg5m, _DECIMALS)
        if self.max1h is not None:
            out["max1h"] = round(self.max1h, _DECIMALS)
        return out

    @classmethod
    def from_json(cls, raw: object) -> Reading:
        if not isinstance(raw, Mapping):
            raise TypeError(f"expected a reading, got {raw!r}")
        return cls(
            now=_percent(raw.get("now")),
            avg5m=None if raw.get("avg5m") is None else _percent(raw.get("avg5m")),
            max1h=None if raw.get("max1h") is None else _percent(raw.get("max1h")),
        )


@dataclass(frozen=True)
class Estimate:
    """Requests of pods bound too recently to show in the usage, percent of allocatable."""

    cpu: float = 0.0
    memory: float = 0.0
    pods: int = 0

    def to_json(self) -> dict[str, float | int]:
        return {
            "cpu": round(self.cpu, _DECIMALS),
            "memory": round(self.memory, _DECIMALS),
            "pods": self.pods,
        }

    @classmethod
    def from_json(cls, raw: object) -> Estimate:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise TypeError(f"expected an estimate, got {raw!r}")
        pods = raw.get("pods", 0)
        if isinstance(pods, bool) or not isinstance(pods, int) or pods < 0:
            raise TypeError(f"expected a pod count, got {pods!r}")
        return cls(
            cpu=_percent(raw.get("cpu", 0)), memory=_percent(raw.get("memory", 0)), pods=pods
        )


@dataclass(frozen=True)
class UsageRecord:
    """What the usage annotation on a Node says."""

    sampled_at: datetime
    source: str
    cpu: Reading
    memory: Reading
    estimate: Estimate = field(default_factory=Estimate)

    @property
    def estimated_cpu(self) -> float:
        """Measured CPU plus the estimate of what is bound but not measured yet."""
        return self.cpu.now + self.estimate.cpu

    @property
    def estimated_memory(self) -> float:
        return self.memory.now + self.estimate.memory

    def age(self, now: datetime) -> timedelta:
        return now - self.sampled_at

    def is_stale(self, now: datetime, limit: timedelta) -> bool:
        """Older than ``limit`` (or from the future by more than it: a skewed clock)."""
        return abs(self.age(now)) > limit

    def to_json(self) -> str:
        out: dict[str, Any] = {
            "v": RECORD_VERSION,
            "sampledAt": format_time(self.sampled_at),
            "source": self.source,
            "cpu": self.cpu.to_json(),
            "memory": self.memory.to_json(),
        }
        if self.estimate != Estimate():
            out["estimate"] = self.estimate.to_json()
        return json.dumps(out, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> UsageRecord:
        try:
            data = json.loads(text)
        except ValueError as err:
            raise UsageError(f"not JSON: {err}") from err
        if not isinstance(data, dict) or data.get("v") != RECORD_VERSION:
            raise UsageError(f"not a version {RECORD_VERSION} usage record")
        try:
            return cls(
                sampled_at=parse_time(data.get("sampledAt")),
                source=str(data.get("source") or ""),
                cpu=Reading.from_json(data.get("cpu")),
                memory=Reading.from_json(data.get("memory")),
                estimate=Estimate.from_json(data.get("estimate")),
            )
        except (TypeError, ValueError) as err:
            raise UsageError(f"unreadable usage record: {err}") from err


def read_usage(node: Node) -> UsageRecord | None:
    """The Node's usage record; None when it has none. Raises UsageError when unreadable."""
    raw = (node.get("metadata") or {}).get("annotations", {}).get(USAGE_ANNOTATION)
    if raw is None:
        return None
    return UsageRecord.from_json(raw)


def _percent(raw: object) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise TypeError(f"expected a percentage, got {raw!r}")
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected a percentage of 0 or more, got {raw!r}")
    return value


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
