"""Runs of either kubelet back-off, either scenario and either kind of node (kwok, real) are put
side by side (``python -m bench.report --compare``), each row naming what it measured; the
scale run's wasted moves are an explicit figure; and the tracker measures what the kubelet's
back-off costs before any restart-count rule may act (from the first failure to the restart
threshold), on the statuses the fake kubelet writes."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, cast

from dev.bench import report
from dev.bench.common import ROOT
from dev.bench.tracker import Tracker
from dev.localcluster.podstatus import PodRun, on_exit, pod_status, restart_delay
from dev.localcluster.rest import Rest

JSON = dict[str, Any]
# The committed full run (2026-11-23): the compressed clock, the prefer-faulty scenario.
FULL_RUN = ROOT / "dev" / "bench" / "results" / "2026-11-23.json"


def a_real_backoff_spread_run(tmp_path: Path) -> Path:
    """The full run's recovery as a ``--scenario spread --kubelet-backoff real`` run records it
    (the figures are the full run's: only the labels are under test here)."""
    results = json.loads(FULL_RUN.read_text())
    results["kubelet_backoff"] = "real"
    rec = results["measurements"]["recovery"]
    rec["scenario"] = "spread"
    rec["kubelet_backoff"] = "real"
    kn = rec["systems"]["kn-rescheduler"]
    kn["threshold_from_failure"] = {**kn["recovery_from_failure"], "p50": 33.25}
    path = tmp_path / "2026-11-24-recovery-spread-real-backoff.json"
    path.write_text(json.dumps(results))
    return path


def test_the_comparison_names_each_runs_scenario_and_back_off(tmp_path: Path) -> None:
    table = report.compare([FULL_RUN, a_real_backoff_spread_run(tmp_path)])
    assert table[:2] == report.COMPARE_HEADER
    rows = [[cell.strip() for cell in row.strip("|").split("|")] for row in table[2:]]
    assert len(rows) == 8  # four systems in each run
    by = {(r[1], r[2], r[4]): r for r in rows}
    old = by[("prefer-faulty", "compressed", "kn-rescheduler")]
    new = by[("spread", "real", "kn-rescheduler")]
    # Both on kwok nodes (the full run predates real nodes).
    assert old[3] == new[3] == "20 kwok nodes, 4 faulty"
    # From the first failure and from the threshold, side by side; the full run predates the
    # threshold-from-failure figure.
    assert old[5:13] == [
        "60/60 (100%)",
        "—",
        "9.2 s",
        "30.6 s",
        "2.6 s",
        "24.0 s",
        "1.43",
        "26 of 86",
    ]
    assert new[6] == "33.2 s"
    assert [r[4] for r in rows[:4]] == [
        "vanilla",
        "descheduler-2m",
        "descheduler-10s",
        "kn-rescheduler",
    ]


def a_real_node_run(tmp_path: Path) -> Path:
    """The full run's vanilla and kn-rescheduler as a ``--real-nodes 3`` run records them (only
    the labels are under test)."""
    results = json.loads(FULL_RUN.read_text())
    results["kubelet_backoff"] = "real"
    results["nodes"] = "real"
    results["scales"]["nodes"] = 3
    rec = results["measurements"]["recovery"]
    rec.update(kubelet_backoff="real", nodes="real", node_count=3, faulty_nodes=["real-0"])
    rec["systems"] = {k: rec["systems"][k] for k in ("vanilla", "kn-rescheduler")}
    path = tmp_path / "2026-11-27-recovery-3-real-nodes-vanilla-kn-rescheduler.json"
    path.write_text(json.dumps(results))
    return path


def test_a_real_node_run_is_told_apart_from_the_kwok_runs(tmp_path: Path) -> None:
    table = report.compare([FULL_RUN, a_real_node_run(tmp_path)])
    rows = [[cell.strip() for cell in row.strip("|").split("|")] for row in table[2:]]
    assert len(rows) == 6
    assert {(r[2], r[3]) for r in rows[:4]} == {("compressed", "20 kwok nodes, 4 faulty")}
    assert [(r[2], r[3], r[4]) for r in rows[4:]] == [
        ("real", "3 real nodes, 1 faulty", "vanilla"),
        ("real", "3 real nodes, 1 faulty", "kn-rescheduler"),
    ]
    assert "recovery-3-real-nodes-vanilla-kn-rescheduler.json" in rows[5][0]


def test_the_scale_runs_wasted_moves_are_a_figure_of_their_own() -> None:
    results = json.loads(FULL_RUN.read_text())
    row = report.scale_row(results["measurements"]["scale"])
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = [c.strip() for c in report.SCALE_HEADER[0].strip("|").split("|")]
    figures = dict(zip(header, cells, strict=True))
    assert figures["nodes"] == "240" and figures["faulty"] == "5"
    assert figures["wasted moves (landed on another faulty node)"] == "**58** (46%)"
    assert figures["moves"] == "125" and figures["moves / recovery"] == "1.87"
    text = report.render(results, FULL_RUN)
    assert row in text
    assert (
        "| exactly one move per recovery at scale (240 nodes, 5 faulty) | **not met** | 1.87 "
        "moves per recovery, 58 of 125 moves landed on another faulty node |"
    ) in text


def test_the_scale_rows_of_several_runs_name_their_back_off(tmp_path: Path) -> None:
    results = json.loads(FULL_RUN.read_text())
    real = copy.deepcopy(results)
    real["kubelet_backoff"] = "real"
    path = tmp_path / "2026-11-24-scale-real-backoff.json"
    path.write_text(json.dumps(real))
    rows = report.scale_rows([FULL_RUN, path])
    assert len(rows) == 4
    assert "2026-11-23.json`](results/2026-11-23.json), compressed | 240 |" in rows[2]
    assert "scale-real-backoff.json), real | 240 |" in rows[3]


# -- the tracker, on the fake kubelet's statuses ----------------------------------------------


def a_pod(uid: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0-5d8f7c9b4-k2x7q",
            "namespace": "bench-recovery-3",
            "uid": uid,
            "generation": 1,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-0-5d8f7c9b4",
                    "uid": "3b0d2d5e-8d0e-4a57-9d0c-5c8f0f7d6a01",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "app", "image": "registry.example.com/shop/web:1.4.2"}],
            "restartPolicy": "Always",
        },
        "status": {},
    }


def test_the_tracker_measures_the_back_off_from_the_first_failure_to_the_threshold() -> None:
    """A crash loop under a real kubelet's back-off (no jitter): it fails at t=0, restarts at
    once, then after 10 s and 20 s; the threshold (3 restarts) is crossed 30 s after the first
    failure, and that is what the tracker reports."""
    # Only the bookkeeping runs (observe, result): the tracker's API client is never used.
    tracker = Tracker(cast(Rest, None), "bench-recovery-3", {"node-1"})
    pod = a_pod("7a1c4f0e-2b9d-4c8e-a6f1-0d3e5b7c9a12")
    meta = pod["metadata"]
    run = PodRun(
        meta["uid"],
        meta["namespace"],
        meta["name"],
        "node-1",
        "crashloop",
        "10.0.0.11",
        "10.244.1.5",
        1000.0,
        step="crashed",
    )
    t = 0.0
    exits: list[float] = []
    for _ in range(4):
        pod["status"] = pod_status(pod, run, 1000.0 + t)
        tracker.observe("MODIFIED", copy.deepcopy(pod), t)
        exits.append(t)
        exit_ = on_exit(run.back_off, 0.0)
        t += restart_delay(exit_.wait, lambda: 0.0)
        run.back_off = exit_.after
        run.restarts += 1
        run.step = "backoff"
    assert exits == [0.0, 0.0, 10.0, 30.0]
    result = tracker.result(0.0, 300.0)
    assert result["affected"] == 1
    assert result["threshold_from_failure_s"] == [30.0]


def test_a_move_whose_replacement_is_bound_to_a_faulty_node_is_wasted() -> None:
    tracker = Tracker(cast(Rest, None), "bench-recovery-3", {"node-1", "node-2"})
    first = a_pod("7a1c4f0e-2b9d-4c8e-a6f1-0d3e5b7c9a12")
    first["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": "app", "restartCount": 2}],
    }
    tracker.observe("MODIFIED", first, 0.0)
    tracker.observe("DELETED", first, 1.0)  # moved
    second = a_pod("0c9e8d7f-6a5b-4c3d-9e2f-1a0b9c8d7e6f")
    second["spec"]["nodeName"] = "node-2"  # another faulty node
    tracker.observe("ADDED", second, 1.1)
    tracker.observe("DELETED", second, 2.0)  # moved again
    third = a_pod("5f4e3d2c-1b0a-4988-8776-655443322110")
    third["spec"]["nodeName"] = "node-3"
    tracker.observe("ADDED", third, 2.1)
    (chain,) = tracker.snapshot()
    assert (chain.moves, chain.wasted) == (2, 1)
