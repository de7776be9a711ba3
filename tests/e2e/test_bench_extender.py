"""The extender part (``python -m dev.bench --quick --only extender``) end to end: score-nodes
answers the scheduler's two kinds of call, node names looked up in its node cache (filled from
a real API server holding the bench's Nodes) and whole Node objects, and in both every node is
judged on its usage (the bench itself refuses a point where the filter failed none or every
score was the same). Asserts numbers exist, never that they are fast: CI machines are shared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dev.bench.extender import QUICK_SIZES, VERBS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]


def test_both_ways_of_calling_answer_every_node_on_its_usage(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "dev.bench",
            "--quick",
            "--only",
            "extender",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=360,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    (path,) = tmp_path.glob("*-extender-quick.json")
    data = json.loads(path.read_text())
    assert data["errors"] == {}
    measured = data["measurements"]["extender"]
    assert measured["names"]["cache_listed_s"] >= 0
    for mode in ("names", "objects"):
        for nodes in QUICK_SIZES:
            point = measured[mode][str(nodes)]
            for verb in VERBS:
                assert point[verb]["latency_ms"]["p50"] > 0, (mode, nodes, verb)
                assert point[verb]["server_ms_at_most"]["p99"] is not None, (mode, nodes, verb)
            assert point["filter"]["passed"] + point["filter"]["failed"] == nodes
            assert point["prioritize"]["scored"] == nodes
    # Names only: the request does not grow with what a Node holds.
    biggest = str(max(QUICK_SIZES))
    assert (
        measured["names"][biggest]["request_bytes"] * 10
        < (measured["objects"][biggest]["request_bytes"])
    )
