"""`make demo` end to end: its own cluster and pipeline, its verdict, its summary, its chart.

The demo runs as its users run it (``python -m dev.stack.demo`` in a subprocess, its own control
plane and pipeline, nothing shared with the session's cluster), and the test then checks what
it claims against what it wrote: summary.json (built from the API server's state and the
Broker's archive) and the PNG. Its first act moves pods off faulty nodes and turns one of them
suspect; its second labels a node under CPU pressure, read from the cluster's real Prometheus.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One demo run: its exit code, output, summary.json, chart and archive."""
    base = tmp_path_factory.mktemp("demo")
    run_dir, png = base / "run", base / "chart" / "timeline.png"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "dev.stack.demo", "--run-dir", str(run_dir), "--png", str(png)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    summary_file = run_dir / "summary.json"
    return {
        "code": result.returncode,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "seconds": time.monotonic() - started,
        "summary": json.loads(summary_file.read_text()) if summary_file.exists() else None,
        "png": png,
        "archive": run_dir / "stack" / "archive.jsonl",
    }


def test_the_demo_exits_0_once_every_workload_recovered(demo: dict[str, Any]) -> None:
    assert demo["code"] == 0, (
        f"stdout:\n{demo['stdout'][-4000:]}\nstderr:\n{demo['stderr'][-4000:]}"
    )
    summary = demo["summary"]
    assert summary is not None and summary["ok"] is True and summary["problems"] == []
    assert "every workload recovered on a good node" in demo["stdout"]
    # With warm binaries the whole demo, both acts, cluster start and stop included, stays well
    # inside 3 min.
    assert demo["seconds"] < 150, f"the demo took {demo['seconds']:.0f}s"


def test_every_replica_ends_ready_on_a_good_node_within_its_budget(demo: dict[str, Any]) -> None:
    summary = demo["summary"]
    faulty = set(summary["faults"])
    assert faulty == {"node-1", "node-3", "node-5"}
    rows = summary["rows"]
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_workload.setdefault(row["workload"], []).append(row)
    assert sorted(by_workload) == [
        "Deployment/api",
        "Deployment/web",
        "Job/report",
        "StatefulSet/db",
    ]
    assert len(by_workload["Deployment/web"]) == 3
    assert sorted(r["pod"] for r in by_workload["StatefulSet/db"]) == ["db-0", "db-1"]
    assert len(by_workload["Job/report"]) == 1

    assert len(by_workload["Deployment/api"]) == 3
    for row in rows:
        assert row["final_node"] not in faulty, row
        assert row["final_node_faulty"] is False, row
        assert row["ended"] in ("Ready", "Succeeded"), row
        assert row["recovered_seconds"] is not None, row
        # Every node the replica left was a faulty one it failed on; the last one it did not.
        assert row["failed"] == [True] * (len(row["nodes"]) - 1) + [False], row
        assert set(row["nodes"][:-1]) <= faulty, row
        assert row["moves"] == len(row["nodes"]) - 1, row
        assert row["workload_moves"] <= row["budget"], row

    # The Deployment shares retries x replicas among its pods, and really used some.
    web = by_workload["Deployment/web"]
    assert {r["budget"] for r in web} == {9}
    assert 1 <= web[0]["workload_moves"] == sum(r["moves"] for r in web) <= 9
    # The StatefulSet's first pod fails first on the node it prefers; each pod keeps its own
    # count. (Where db-1, created once db-0 is Ready, goes first depends on whether node-3 is
    # suspect by then: the scheduler's choice.)
    db = {row["pod"]: row for row in by_workload["StatefulSet/db"]}
    assert db["db-0"]["nodes"][0] == "node-3" and db["db-0"]["moves"] >= 1
    for row in db.values():
        assert row["budget"] == 3 and row["workload_moves"] == row["moves"]
    # The Job fails once on its pool's bad node, then completes on a good one of its pool.
    (job,) = by_workload["Job/report"]
    assert job["nodes"][0] == "node-3" and job["moves"] == job["workload_moves"] == 1
    assert job["final_node"] in ("node-2", "node-4") and job["ended"] == "Succeeded"


def test_the_output_tells_the_story_as_it_happens(demo: dict[str, Any]) -> None:
    out = demo["stdout"]
    for expected in (
        # The early report of a crash loop's first restart is told apart from the failure
        # that moves the pod (node-1 is not the suspect node: the cap allows one of six).
        "first failure on node-1: CrashLoopBackOff after 1 restart; node-1 is not suspect",
        "failing on node-1: CrashLoopBackOff",
        "failing on node-3: OOMKilled",
        "[detect-failures]",
        "[update-annotations]",
        "[assess-nodes]",
        "Warning Event NodeSuspected",
        "act 2: node pressure",
        "label-nodes labelled it status=presure",
        "label-nodes removed its label status=presure",
        "the Job controller's back-off",
        "summary",
    ):
        assert expected in out, f"{expected!r} not in the output:\n{out[-4000:]}"
    # Which nodes a replacement is kept off depends on its path (the scheduler's choice).
    assert re.search(r"admission kept it off node-\d", out), out[-4000:]
    # A failed image pull is written under two waiting reasons by where the kubelet's retry
    # stands (ErrImagePull, then ImagePullBackOff during its back-off); the event that reports
    # it carries whichever the status had when it was written, which under load may be either.
    assert re.search(r"failing on node-5: (ErrImagePull|ImagePullBackOff)", out), out[-4000:]
    # Not a terminal: no colour codes.
    assert "\033[" not in out
    # The pipeline's own account agrees: one rescheduled event per move.
    events = [json.loads(line) for line in demo["archive"].read_text().splitlines()]
    moved = [e for e in events if e["type"] == "io.kn-rescheduler.pod.rescheduled"]
    assert len(moved) == sum(r["moves"] for r in demo["summary"]["rows"])


def test_its_last_lines_give_the_replay_command_that_works_with_its_cluster_stopped(
    demo: dict[str, Any], tmp_path: Path
) -> None:
    out = demo["stdout"]
    tail = out[out.index("stopped everything") :]
    commands = [line.strip() for line in tail.splitlines() if "make replay FILE=" in line]
    assert len(commands) == 1, tail
    (command,) = commands
    words = shlex.split(command)
    assert words[:3] == ["make", "replay", f"FILE={demo['archive'].resolve()}"], command
    # The functions that act need a cluster, and the demo says how to get one.
    assert "act on a cluster" in tail and "`make up`" in tail, tail
    # A newcomer copies it as it is, the demo's cluster gone and no kubeconfig of theirs.
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "MAKEFLAGS", "MAKELEVEL")}
    env["HOME"] = str(tmp_path)
    replayed = subprocess.run(
        words, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    output = replayed.stdout + replayed.stderr
    assert replayed.returncode == 0, output[-4000:]
    assert "Traceback" not in output
    # detect-failures finds again, from the archive alone, the failures it found in the run.
    assert "decision: failing: OOMKilled on node-3" in replayed.stdout, output[-4000:]
    assert " 0 failed" in replayed.stdout


def test_the_timeline_chart_is_a_png(demo: dict[str, Any]) -> None:
    png: Path = demo["png"]
    data = png.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert 10_000 < len(data) < 200_000
    pixels = matplotlib.image.imread(png)
    height, width = pixels.shape[:2]
    assert width >= 800 and height >= 300


def test_a_faulty_node_where_two_workloads_failed_turns_suspect_and_the_cap_holds(
    demo: dict[str, Any],
) -> None:
    summary = demo["summary"]
    nodes = {n["name"]: n for n in summary["nodes"]}
    suspects = [n for n in nodes.values() if n["suspect_labelled"] is not None]
    # 30 % of six schedulable nodes: one may be suspect, and one is.
    assert len(suspects) == 1, nodes
    (suspect,) = suspects
    assert suspect["name"] in summary["faults"]
    # Label, taint, the Warning Event and the reply event, all seen.
    assert suspect["suspect_tainted"] is not None
    assert suspect["suspected"] is not None
    assert re.match(rf"\d distinct workloads failed on node {suspect['name']} ", suspect["event"])
    workloads = {w.split(" (")[0] for w in suspect["workloads"]}
    assert len(workloads) >= 2, suspect
    assert suspect["suspect_cleared"] is None
    # The pipeline's own account agrees: one reply naming the node and its workloads.
    events = [json.loads(line) for line in demo["archive"].read_text().splitlines()]
    replies = [e for e in events if e["type"] == "io.kn-rescheduler.node.suspected"]
    assert [e["data"]["node"] for e in replies] == [suspect["name"]]
    assert replies[0]["source"].endswith("/assess-nodes")
    # Another faulty node that qualifies too (when db and web both failed on it) is held back.
    held = [n for n in nodes.values() if n["why"].startswith("cap: ")]
    assert all(n["suspect_labelled"] is None for n in held), nodes


def test_act_2_labels_the_pressed_node_and_new_pods_go_elsewhere_until_it_is_cleared(
    demo: dict[str, Any],
) -> None:
    act = demo["summary"]["pressure"]
    assert act is not None and act["ok"] is True and act["problems"] == [], act
    node, label_every = act["node"], act["label_every"]
    assert node == "node-2" and act["pool"] == ["node-0", "node-2", "node-4"]
    # Labelled within two evaluations of Prometheus reading the node over the threshold.
    assert act["climbed"] < act["read_over"] <= act["labelled"]
    assert act["labelled"] - act["read_over"] <= 2 * label_every + 0.5, act
    assert act["read_over_value"] > act["threshold"]
    # The pods created meanwhile went to the other nodes of the pool, although they prefer it.
    assert len(act["placed_while_labelled"]) == 2
    assert set(act["placed_while_labelled"].values()) == {"node-0", "node-4"}
    # The load fell, the label went within two evaluations, and the next pod went there.
    assert act["labelled"] < act["fell"] < act["read_under"] <= act["cleared"]
    assert act["cleared"] - act["read_under"] <= 2 * label_every + 0.5, act
    assert list(act["placed_after"].values()) == [node]
    marks = {n["name"]: n for n in demo["summary"]["nodes"]}[node]
    assert marks["pressure_rule"] == "cpu-usage" and marks["pressure_value"] > act["threshold"]
    assert marks["pressure_cleared"] == act["cleared"]
