"""What annotate-usage writes on one Node: the pure decision, clock passed in.

From what a source measured on a node (cores and bytes in use), the node's allocatable, the
requests of pods bound there recently and what the Node carries now, `decide_node` returns the
usage record and load bucket the node should carry and whether a write is worth it:

- The record is rewritten only when a value moved by more than ``usage_tolerance`` points, the
  estimate or the bucket changed, or the record would otherwise go stale before the next
  chance (half of ``usage_stale_after``): a quiet cluster costs no writes, and a node's record
  never looks stale while its source answers.
- The bucket (``low``, ``medium``, ``high``, ``overloaded``) follows the estimated usage (measured
  plus just-bound requests), each resource against its own boundaries (``low_load_threshold``,
  ``high_load_threshold``, ``cpu_threshold`` / ``memory_threshold``), the higher resource winning;
  a node in maintenance is ``overloaded``. It rises at once and falls only when the usage is
  ``load_hysteresis`` points below the boundary it crossed: no flapping on a node that hovers.
- No measurement for a node (the source does not know it, or is down): nothing new is written;
  once the record is older than ``usage_stale_after`` the bucket label is removed (a stale label
  would steer pods by a load nobody measures any more) and the record stays, with its time, for
  people to read. The extender ignores a stale record by itself.
- A node carrying the opt-out label gets neither, and loses what it had.

`bindings_over_limit` finds the pods bound to a node since the last evaluation whose node's
predicted usage with them (the new record: measured plus the estimate, which counts them) is
over ``predicted_usage_limit``, the limit score-nodes' filter holds a placement to. Such a
binding got past the filter (a scheduler without the extender, pods of one burst placed before
the next sample, every node hot): the origin's PreBind warns about it, and so does
annotate-usage, after the fact, never blocking. Pods their load never keeps off a node
(``shared.nodes.usage.exemption``) are not warned about.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from shared.api.keys import (
    LOAD_BUCKETS,
    LOAD_LABEL,
    LOAD_OVERLOADED,
    MAINTENANCE_LABEL,
    MAINTENANCE_VALUE,
    USAGE_ANNOTATION,
    opted_out,
)
from shared.api.kubetypes import Node, Pod
from shared.api.times import format_time
from shared.api.usage import Estimate, Reading, UsageError, UsageRecord, read_usage
from shared.nodes.usage import Resources, exemption, scheduled_at
from shared.platform.config import Config

# Write when this share of usage_stale_after has passed since the record's sample, even if
# nothing moved, so that a record is renewed well before the extender would call it stale.
_REFRESH_SHARE: Final = 0.5


@dataclass(frozen=True)
class Measured:
    """What a source measured on one node: cores and bytes in use, now and (when the source
    keeps history) the 5-minute average and 1-hour maximum."""

    cpu_cores: float
    memory_bytes: float
    cpu_cores_avg5m: float | None = None
    memory_bytes_avg5m: float | None = None
    cpu_cores_max1h: float | None = None
    memory_bytes_max1h: float | None = None


@dataclass(frozen=True)
class NodeDecision:
    """What one node should carry after this evaluation, and whether to write it."""

    node: str
    # This evaluation's record of the node (None: not measured; the annotation stays as it is
    # unless `remove_record`). Written only when `write`.
    record: UsageRecord | None
    # The bucket label's value afterwards (None: no label).
    bucket: str | None
    write: bool
    reason: str
    # Remove the usage annotation (an opted-out node).
    remove_record: bool = False

    def patch(self) -> dict[str, object]:
        """The merge patch of the annotation and the label alone."""
        annotations: dict[str, str | None] = {}
        if self.remove_record:
            annotations[USAGE_ANNOTATION] = None
        elif self.record is not None:
            annotations[USAGE_ANNOTATION] = self.record.to_json()
        metadata: dict[str, object] = {"labels": {LOAD_LABEL: self.bucket}}
        if annotations:
            metadata["annotations"] = annotations
        return {"metadata": metadata}


def _percent(part: float | None, whole: float) -> float | None:
    return None if part is None else max(0.0, 100.0 * part / whole)


def to_record(
    measured: Measured,
    allocatable: Resources,
    estimate: Estimate,
    source: str,
    now: datetime,
) -> UsageRecord:
    """The measurement as percent of the node's allocatable."""
    cores = allocatable.cpu_millis / 1000
    memory = float(allocatable.memory_bytes)
    cpu_now = _percent(measured.cpu_cores, cores)
    memory_now = _percent(measured.memory_bytes, memory)
    assert cpu_now is not None and memory_now is not None
    return UsageRecord(
        sampled_at=now,
        source=source,
        cpu=Reading(
            now=cpu_now,
            avg5m=_percent(measured.cpu_cores_avg5m, cores),
            max1h=_percent(measured.cpu_cores_max1h, cores),
        ),
        memory=Reading(
            now=memory_now,
            avg5m=_percent(measured.memory_bytes_avg5m, memory),
            max1h=_percent(measured.memory_bytes_max1h, memory),
        ),
        estimate=estimate,
    )


def _index(value: float, bounds: tuple[float, float, float]) -> int:
    """0 low, 1 medium, 2 high, 3 overloaded: how many boundaries ``value`` reaches."""
    return sum(1 for bound in bounds if value >= bound)


def bucket_for(
    record: UsageRecord, previous: str | None, cfg: Config, *, maintenance: bool = False
) -> str:
    """The load bucket of a node with this record, given the bucket it has now."""
    if maintenance:
        return LOAD_OVERLOADED
    cpu_bounds = (cfg.low_load_threshold, cfg.high_load_threshold, cfg.cpu_threshold)
    memory_bounds = (cfg.low_load_threshold, cfg.high_load_threshold, cfg.memory_threshold)
    cpu, memory = record.estimated_cpu, record.estimated_memory
    raw = max(_index(cpu, cpu_bounds), _index(memory, memory_bounds))
    if previous in LOAD_BUCKETS:
        before = LOAD_BUCKETS.index(previous)
        if raw < before:
            # Falling: only as far as the usage is clear of each boundary by the hysteresis.
            sticky = max(
                _index(cpu + cfg.load_hysteresis, cpu_bounds),
                _index(memory + cfg.load_hysteresis, memory_bounds),
            )
            raw = min(before, sticky)
    return LOAD_BUCKETS[raw]


def _moved(old: UsageRecord, new: UsageRecord, tolerance: float) -> str | None:
    """Which value moved by more than ``tolerance`` points, if any."""
    pairs = (
        ("cpu", old.cpu.now, new.cpu.now),
        ("memory", old.memory.now, new.memory.now),
        ("cpu avg5m", old.cpu.avg5m, new.cpu.avg5m),
        ("memory avg5m", old.memory.avg5m, new.memory.avg5m),
        ("cpu max1h", old.cpu.max1h, new.cpu.max1h),
        ("memory max1h", old.memory.max1h, new.memory.max1h),
        ("estimated cpu", old.estimate.cpu, new.estimate.cpu),
        ("estimated memory", old.estimate.memory, new.estimate.memory),
    )
    for name, before, after in pairs:
        if (before is None) != (after is None):
            return f"{name} appeared or went"
        if before is not None and after is not None and abs(after - before) > tolerance:
            return f"{name} moved {before:.1f} -> {after:.1f}"
    if old.estimate.pods != new.estimate.pods:
        return f"recently bound pods {old.estimate.pods} -> {new.estimate.pods}"
    if old.source != new.source:
        return f"source {old.source} -> {new.source}"
    return None


def decide_node(
    node: Node,
    measured: Measured | None,
    allocatable: Resources | None,
    estimate: Estimate,
    source: str,
    cfg: Config,
    now: datetime,
) -> NodeDecision:
    """What ``node`` should carry after an evaluation at ``now``; see the module docstring."""
    metadata = node.get("metadata") or {}
    name = metadata.get("name", "")
    labels = metadata.get("labels") or {}
    current_bucket = labels.get(LOAD_LABEL)
    try:
        current = read_usage(node)
    except UsageError:
        # Ours to overwrite: only annotate-usage writes it, and it is a cache of a measurement.
        current = None
        unreadable = True
    else:
        unreadable = False
    if opted_out(labels):
        has_any = current is not None or unreadable or current_bucket is not None
        return NodeDecision(
            name, None, None, has_any, "opted out of kn-rescheduler", remove_record=has_any
        )
    maintenance = labels.get(MAINTENANCE_LABEL) == MAINTENANCE_VALUE
    if measured is None or allocatable is None:
        why = "no measurement" if measured is None else "no readable allocatable CPU and memory"
        if current is not None and not current.is_stale(now, cfg.usage_stale_after):
            return NodeDecision(name, None, current_bucket, False, f"{why}; the record holds")
        # Stale or no record: no bucket (unless maintenance, which needs no measurement).
        bucket = LOAD_OVERLOADED if maintenance else None
        return NodeDecision(
            name, None, bucket, bucket != current_bucket, f"{why}; the record is stale"
        )
    record = to_record(measured, allocatable, estimate, source, now)
    bucket = bucket_for(record, current_bucket, cfg, maintenance=maintenance)
    if current is None:
        reason = "unreadable record replaced" if unreadable else "first sample"
        return NodeDecision(name, record, bucket, True, reason)
    moved = _moved(current, record, cfg.usage_tolerance)
    if moved is not None:
        return NodeDecision(name, record, bucket, True, moved)
    if bucket != current_bucket:
        return NodeDecision(name, record, bucket, True, f"bucket {current_bucket} -> {bucket}")
    if current.age(now) >= cfg.usage_stale_after * _REFRESH_SHARE:
        return NodeDecision(name, record, bucket, True, "record renewed before it goes stale")
    return NodeDecision(name, record, bucket, False, "within tolerance")


# How far past the sample a binding's time may be (the API server's clock against ours).
FUTURE_SLACK: Final = timedelta(minutes=1)


@dataclass(frozen=True)
class OverLimit:
    """A pod bound to a node whose predicted usage with it is over the limit."""

    namespace: str
    name: str
    uid: str
    node: str
    bound_at: datetime
    # (resource, predicted percent of allocatable), each over the limit.
    over: tuple[tuple[str, float], ...]
    limit: float

    @property
    def message(self) -> str:
        said = " and ".join(f"{resource} {value:.1f}%" for resource, value in self.over)
        return (
            f"bound to node {self.node} at {format_time(self.bound_at)}, whose predicted usage "
            f"(measured, plus the requests of the pods bound there lately) is {said} of "
            "allocatable, over "
            f"the limit of {self.limit:g}% (predicted_usage_limit) that score-nodes' filter holds "
            "a placement to; nothing is blocked or moved (docs/load-aware.md, "
            '"Against its origin")'
        )


def bindings_over_limit(
    node: str, record: UsageRecord, pods: Iterable[Pod], since: datetime, cfg: Config
) -> tuple[OverLimit, ...]:
    """The pods bound to ``node`` after ``since`` while its predicted usage (``record``, this
    evaluation's) is over ``predicted_usage_limit``; see the module docstring."""
    over = tuple(
        (resource, value)
        for resource, value in (("CPU", record.estimated_cpu), ("memory", record.estimated_memory))
        if value > cfg.predicted_usage_limit
    )
    if not over:
        return ()
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if (pod.get("spec") or {}).get("nodeName") != node:
            continue
        bound = scheduled_at(pod)
        # The condition's time has whole seconds: a pod bound in the second of ``since`` is
        # judged again rather than never (its Event is said once, whatever the evaluations).
        # A time past the sample (a status someone wrote) is no binding seen yet.
        if bound is None or bound < since.replace(microsecond=0):
            continue
        if bound > record.sampled_at + FUTURE_SLACK:
            continue
        if exemption(pod, cfg) is not None:
            continue
        found.append(
            OverLimit(
                namespace=str(meta.get("namespace", "")),
                name=str(meta.get("name", "")),
                uid=str(meta.get("uid", "")),
                node=node,
                bound_at=bound,
                over=over,
                limit=cfg.predicted_usage_limit,
            )
        )
    return tuple(found)
