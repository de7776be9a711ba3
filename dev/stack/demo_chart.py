"""The demo's timeline chart: one row per replica, one bar per pod, coloured by its node.

A bar starts when the pod was created (grey until it is scheduled), takes the colour of the
node it was placed on (green for a healthy node, lighter until the pod is Ready; one colour per
fault) and ends when the pod was deleted, completed, or the demo ended. Markers: a cross where
detect-failures reported the failure, a triangle where update-annotations deleted the pod to move
it, a dot where the pod became Ready, a star where a Job pod completed. A shaded band is a
time a node was labelled under pressure (the second act).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from dev.stack.demo_model import HEALTHY, Lineage, PodLife, Timeline, Workload

FAULT_COLORS: Final = {
    "crashloop": "#d62728",
    "oom": "#8c3fbf",
    "imagepull": "#ff8c00",
    "evict": "#8c564b",
    "createcontainer": "#e377c2",
    "pullhang": "#7f7f7f",
}
GOOD: Final = "#2ca02c"
GOOD_STARTING: Final = "#a6dba0"
PENDING: Final = "#c7c7c7"
PRESSURE: Final = "#f2b600"
BAR_HEIGHT: Final = 0.56


def _color(fault: str) -> str:
    return GOOD if fault == HEALTHY else FAULT_COLORS.get(fault, "#7f7f7f")


def _rows(timeline: Timeline, workloads: Sequence[Workload]) -> list[Lineage]:
    rows: list[Lineage] = []
    for w in workloads:
        rows.extend(sorted(timeline.lineages_of(w), key=lambda lin: lin.start))
    return rows


def _pod_end(p: PodLife, now: float) -> float:
    ends = [t for t in (p.ended, p.succeeded) if t is not None]
    return min(ends) if ends else now


def render(
    timeline: Timeline,
    workloads: Sequence[Workload],
    path: Path,
    *,
    title_faults: Mapping[str, str] | None = None,
    healthy_at: float | None = None,
    retries: int | None = None,
    spans: Sequence[tuple[float, float | None, str]] = (),
) -> None:
    rows = _rows(timeline, workloads)
    zero = timeline.started or min((lin.start for lin in rows), default=0.0)
    times = [
        t
        for p in timeline.pods.values()
        for t in (p.created, p.scheduled, p.ready, p.failing, p.moved, p.gone, p.succeeded)
        if t is not None
    ]
    span_ends = [t for start, end, _ in spans for t in (start, end) if t is not None]
    now = max([*times, *span_ends, healthy_at or 0.0], default=zero + 1) + (2.5 if spans else 1.0)
    height = 1.9 + 0.5 * max(len(rows), 1)
    fig, ax = plt.subplots(figsize=(11, height), dpi=100)
    faults_seen: set[str] = set()
    for i, lineage in enumerate(rows):
        y = len(rows) - 1 - i
        for p in lineage.pods:
            start, end = p.created - zero, _pod_end(p, now) - zero
            bound = (p.scheduled - zero) if p.scheduled is not None else end
            ax.barh(y, bound - start, left=start, height=BAR_HEIGHT, color=PENDING, lw=0)
            if p.scheduled is None:
                continue
            if p.fault == HEALTHY:
                ready = (p.ready - zero) if p.ready is not None else end
                ax.barh(y, ready - bound, left=bound, height=BAR_HEIGHT, color=GOOD_STARTING, lw=0)
                ax.barh(y, end - ready, left=ready, height=BAR_HEIGHT, color=GOOD, lw=0)
            else:
                faults_seen.add(p.fault)
                ax.barh(y, end - bound, left=bound, height=BAR_HEIGHT, color=_color(p.fault), lw=0)
            if end - bound > 2.2 and p.node:
                ax.text(
                    (bound + end) / 2,
                    y,
                    p.node,
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white",
                    fontweight="bold",
                )
            top = y + BAR_HEIGHT / 2 + 0.1
            if p.failing is not None:
                ax.plot(p.failing - zero, y, "x", color="white", ms=6, mew=2.2, zorder=5)
            if p.moved is not None:
                ax.plot(p.moved - zero, top, "v", color="black", ms=7, zorder=5)
            if p.ready is not None and p.fault == HEALTHY:
                ax.plot(p.ready - zero, y, "o", mfc="white", mec="black", ms=5, zorder=5)
            if p.succeeded is not None:
                ax.plot(p.succeeded - zero, y, "*", color="gold", mec="black", ms=12, zorder=5)
        # Between two pods of a replica no pod exists (a controller's back-off, or a moment).
        for before, after in zip(lineage.pods, lineage.pods[1:], strict=False):
            gap_from, gap_to = _pod_end(before, now) - zero, after.created - zero
            if gap_to - gap_from > 0.3:
                ax.plot([gap_from, gap_to], [y, y], color="#7f7f7f", lw=1, ls=(0, (2, 2)))
            if gap_to - gap_from > 3:
                ax.text(
                    (gap_from + gap_to) / 2,
                    y + 0.08,
                    f"no pod for {gap_to - gap_from:.0f}s",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="#555555",
                )
    # Thin lines between workloads.
    y = len(rows)
    for w in workloads:
        y -= len(timeline.lineages_of(w))
        if 0 < y < len(rows):
            ax.axhline(y - 0.5, color="#999999", lw=0.6, ls=":")
    for start, span_end, label in spans:
        right = (span_end if span_end is not None else now) - zero
        ax.axvspan(start - zero, right, color=PRESSURE, alpha=0.18, lw=0, zorder=0)
        ax.text(
            start - zero,
            len(rows) - 0.45,
            f" {label}",
            color="#9a6a00",
            fontsize=8,
            va="bottom",
        )
    if healthy_at is not None:
        ax.axvline(healthy_at - zero, color=GOOD, lw=1.2, ls="--")
        ax.text(
            healthy_at - zero,
            len(rows) - 0.45,
            f" all healthy: {healthy_at - zero:.1f}s",
            color=GOOD,
            fontsize=8,
            va="bottom",
        )
    ax.set_yticks(
        range(len(rows)),
        [f"{lin.workload.kind}  {lin.label}" for lin in reversed(rows)],
        fontsize=9,
    )
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(min(0.0, *(lin.start - zero for lin in rows)) - 0.5, now - zero)
    ax.set_xlabel("seconds since the workloads were created")
    ax.grid(axis="x", color="#e6e6e6", lw=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    faults = title_faults or timeline.faults
    bad = ", ".join(f"{n} {m}" for n, m in sorted(faults.items()) if m != HEALTHY)
    policy = f'   ·   every workload has scheduling-retries: "{retries}"' if retries else ""
    ax.set_title(
        "kn-rescheduler: pods failing because of their node are moved off it\n"
        f"faulty nodes: {bad or 'none'}{policy}",
        fontsize=10,
        loc="left",
    )
    handles: list[Patch | Line2D] = [
        Patch(color=PENDING, label="not scheduled yet"),
        Patch(color=GOOD_STARTING, label="healthy node, starting"),
        Patch(color=GOOD, label="healthy node, Ready"),
    ]
    handles += [
        Patch(color=_color(mode), label=f"faulty node: {mode}") for mode in sorted(faults_seen)
    ]
    if spans:
        handles.append(Patch(color=PRESSURE, alpha=0.18, label="a node under pressure"))
    handles += [
        Line2D([], [], ls="", marker="x", color="#555555", mew=2, label="failure detected"),
        Line2D([], [], ls="", marker="v", color="black", label="deleted to move it"),
        Line2D([], [], ls="", marker="o", mfc="white", mec="black", label="Ready"),
        Line2D([], [], ls="", marker="*", color="gold", mec="black", ms=10, label="Job completed"),
        Line2D(
            [],
            [],
            color="#7f7f7f",
            lw=1,
            ls=(0, (2, 2)),
            label="no pod (its controller has not replaced it yet)",
        ),
    ]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.55 / height - 0.1),
        ncol=5,
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
