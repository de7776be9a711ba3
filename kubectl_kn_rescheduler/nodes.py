"""``nodes [NAME...]``: every mark of ours on each Node, why, since when and until when.

A Node carries up to five labels, four annotations and a taint of ours, written by four
functions. Each is read here with the parser its writer uses, and the suspicion is judged with
assess-nodes' own ``assess`` at this moment with the installed settings: what its next review
will do (keep, clear, mark) and why, not a second rule. Marks that people set and the functions
only read (``maintenance``, ``ignore``) are listed apart: cleanup never removes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubectl_kn_rescheduler.reading import ago
from shared.api import movedoff
from shared.api.keys import (
    FAILING_WORKLOADS_LABEL,
    HOT_STREAK_ANNOTATION,
    LOAD_LABEL,
    MAINTENANCE_LABEL,
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    OPT_OUT_LABEL,
    PRESSURE_ANNOTATION,
    SUSPECT_LABEL,
    USAGE_ANNOTATION,
)
from shared.api.pressure import Record as PressureRecord
from shared.api.rebalance import read_streak
from shared.api.records import RecordError
from shared.api.times import format_duration, format_time
from shared.api.usage import Reading, UsageError, read_usage
from shared.nodes.assess_nodes.decide import NodeFacts, Verdict, assess, is_our_taint
from shared.platform.config import Config


@dataclass(frozen=True)
class NodeMarks:
    """What one Node carries of ours, in sentences, and the keys (for JSON and tests)."""

    name: str
    lines: tuple[str, ...]
    keys: tuple[str, ...]
    people: tuple[str, ...] = field(default=())

    @property
    def marked(self) -> bool:
        return bool(self.keys)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "marks": list(self.keys),
            "said": list(self.lines),
            "setByPeople": list(self.people),
        }


def node_marks(node: Mapping[str, Any], now: datetime, cfg: Config) -> NodeMarks:
    """Our marks on ``node`` and what they mean now (pure)."""
    meta = node.get("metadata") or {}
    name = str(meta.get("name", ""))
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    taints = (node.get("spec") or {}).get("taints") or []
    lines: list[str] = []
    keys: list[str] = []

    keys += [k for k in (SUSPECT_LABEL, FAILING_WORKLOADS_LABEL) if k in labels]
    keys += [f"taint {SUSPECT_LABEL}" for t in taints if isinstance(t, dict) and is_our_taint(t)]
    if NODE_HEALTH_ANNOTATION in annotations:
        keys.append(NODE_HEALTH_ANNOTATION)
    lines += _health(node, now, cfg)

    at = movedoff.marked_at(labels)
    if MOVED_OFF_LABEL in labels:
        keys.append(MOVED_OFF_LABEL)
        if at is None:
            lines.append(
                f"moved-off: {labels[MOVED_OFF_LABEL]!r} is not a time; assess-nodes' "
                "review removes it"
            )
        else:
            until = at + cfg.moved_off_window
            steering = "steers new pods away" if until > now else "no longer steers"
            lines.append(
                f"moved-off: a pod was moved off it {ago(at, now)} ({format_time(at)}); "
                f"{steering} until {format_time(until)} ({ago(until, now)}), "
                f"moved_off_window {format_duration(cfg.moved_off_window)}"
            )

    pressure_key = cfg.pressure_label.partition("=")[0]
    if PRESSURE_ANNOTATION in annotations:
        keys.append(PRESSURE_ANNOTATION)
        lines.append(_pressure(annotations[PRESSURE_ANNOTATION], labels, pressure_key, now))

    if LOAD_LABEL in labels:
        keys.append(LOAD_LABEL)
        lines.append(f"load: {labels[LOAD_LABEL]} (annotate-usage's bucket, with hysteresis)")
    if USAGE_ANNOTATION in annotations:
        keys.append(USAGE_ANNOTATION)
        try:
            usage = read_usage(node)  # type: ignore[arg-type]
        except UsageError as exc:
            lines.append(f"usage: unreadable ({exc}); score-nodes treats the node as unmeasured")
        else:
            if usage is not None:
                stale = (
                    ", stale: score-nodes ignores it"
                    if usage.is_stale(now, cfg.usage_stale_after)
                    else ""
                )
                lines.append(
                    f"usage: cpu {_reading(usage.cpu)}, memory {_reading(usage.memory)}, from "
                    f"{usage.source} {ago(usage.sampled_at, now)}{stale}"
                )
    if HOT_STREAK_ANNOTATION in annotations:
        keys.append(HOT_STREAK_ANNOTATION)
        streak = read_streak(node)  # type: ignore[arg-type]
        if streak is not None and streak.hot:
            lines.append(
                f"hot: {streak.hot} sample(s) in a row since {format_time(streak.since)} "
                f"(rebalance-nodes acts at {cfg.rebalance_hot_samples})"
                if streak.since is not None
                else f"hot: {streak.hot} sample(s) in a row"
            )
        else:
            lines.append("hot streak: none counting (the last one was acted on or cooled)")

    people = []
    if MAINTENANCE_LABEL in labels:
        people.append(
            f"{MAINTENANCE_LABEL}={labels[MAINTENANCE_LABEL]}: set by people; the extender "
            "filters the node and rebalance-nodes drains it"
        )
    if OPT_OUT_LABEL in labels:
        people.append(f"{OPT_OUT_LABEL}: set by people; every function leaves the node alone")
    return NodeMarks(name, tuple(lines), tuple(keys), tuple(people))


def _health(node: Mapping[str, Any], now: datetime, cfg: Config) -> list[str]:
    try:
        facts = NodeFacts.from_node(node)
    except RecordError as exc:
        return [
            f"node-health: unreadable ({exc}); assess-nodes refuses to overwrite it, and a "
            "person must look"
        ]
    record = facts.record
    ours = record.failures or record.suspect or facts.labelled or facts.tainted
    if not ours and facts.failing_label is None:
        return []
    verdict = assess(facts, None, now, cfg)
    lines = []
    window = cfg.suspect_window
    if record.suspect or facts.labelled or facts.tainted:
        since = record.suspect_since
        label = (
            "label and taint"
            if facts.labelled and facts.tainted
            else ("label" if facts.labelled else ("taint" if facts.tainted else "record only"))
        )
        lines.append(
            f"suspect ({label}) since {format_time(since) if since else 'an unknown time'}"
            + (f" ({ago(since, now)})" if since else "")
            + (
                f", blamed for {', '.join(record.suspect_workloads)}"
                if record.suspect_workloads
                else ""
            )
        )
    if facts.failing_label is not None:
        lines.append(
            f"failing-workloads={facts.failing_label}: workloads failed here lately; the "
            "webhook keeps replacements softly off it while a failure spreads (docs/node-health"
            ".md#a-burst-nodes-where-other-workloads-fail-now)"
        )
    recent = record.recent(now, window)
    if recent:
        lines.append(
            f"failures in the last {format_duration(window)}: "
            + "; ".join(f"{s.workload} {s.reason} {ago(s.at, now)}" for s in recent)
        )
        last = max(s.at for s in recent)
        lines.append(
            f"  the last one counts until {format_time(last + window)} ({ago(last + window, now)})"
        )
    said = {
        Verdict.STAYS: "assess-nodes' next review keeps it suspect",
        Verdict.CLEAR: "assess-nodes' next review clears it",
        Verdict.MARK: "assess-nodes' next review marks it suspect (if the cap allows)",
        Verdict.HEALTHY: "assess-nodes' next review leaves it unmarked",
    }[verdict.verdict]
    lines.append(f"{said}: {verdict.why} (docs/node-health.md#what-it-does)")
    carried, after = facts.failing_label, verdict.failing_label(facts)
    if carried != after:
        lines.append(
            f"  and sets {FAILING_WORKLOADS_LABEL}={after}"
            if after
            else f"  and removes its {FAILING_WORKLOADS_LABEL}={carried} label"
        )
    return lines


def _reading(reading: Reading) -> str:
    more = [
        f"{what} {value:.0f}%"
        for what, value in (("5m avg", reading.avg5m), ("1h max", reading.max1h))
        if value is not None
    ]
    return f"{reading.now:.0f}%" + (f" ({', '.join(more)})" if more else "")


def _pressure(raw: str, labels: Mapping[str, str], key: str, now: datetime) -> str:
    try:
        record = PressureRecord.from_json(raw)
    except RecordError as exc:
        return f"pressure: record unreadable ({exc})"
    value = f" = {record.value:g}" if record.value is not None else ""
    label = f", label {key}={labels[key]}" if key and key in labels else ""
    since = f" since {format_time(record.since)} ({ago(record.since, now)})" if record.since else ""
    return f"pressure: rule {record.rule or '(none)'}{value}{since}{label} (label-nodes)"
