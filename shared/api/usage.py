"""The usage record annotate-usage writes on a Node: CPU and memory, percent of allocatable.

annotate-usage samples each node's CPU and memory usage and writes it onto the Node as one
versioned JSON annotation (``kn-rescheduler.io/usage``), so the scheduler extender and
rebalance-nodes read usage from Node objects they already have and never call Prometheus on a
hot path. Values are percent of the node's allocatable (what the scheduler places against), as
the current usage, the 5-minute average and the 1-hour maximum, and the estimate of pods bound
too recently to show in them (``shared.nodes.usage`` computes it)::

    {"v":1,"sampledAt":"2026-11-20T09:50:00Z","source":"prometheus",
     "cpu":{"now":41.2,"avg5m":38.5,"max1h":77.0},"memory":{"now":63.1},
     "estimate":{"cpu":12.5,"memory":8.2,"pods":3}}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from shared.api import records
from shared.api.keys import USAGE_ANNOTATION
from shared.api.kubetypes import Node
from shared.api.records import RecordError
from shared.api.times import format_time, parse_time

RECORD_VERSION: Final = 1
# A percentage kept to one decimal: finer says nothing and churns the annotation.
_DECIMALS: Final = 1


class UsageError(RecordError):
    """The annotation holds something that is not a usage record we can read."""


FORMAT: Final = records.Format(
    name="usage record", version_key="v", version=RECORD_VERSION, raises=UsageError
)


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
            "sampledAt": format_time(self.sampled_at),
            "source": self.source,
            "cpu": self.cpu.to_json(),
            "memory": self.memory.to_json(),
        }
        if self.estimate != Estimate():
            out["estimate"] = self.estimate.to_json()
        return records.dump(out, FORMAT)

    @classmethod
    def from_json(cls, text: str) -> UsageRecord:
        _, data = records.load(text, FORMAT)
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
