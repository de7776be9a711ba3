"""The throughput part (``python -m dev.bench --quick --only throughput``) end to end: each
scheduler bound every batch, the extender's schedulers (node names, whole Nodes) called
score-nodes for every pod and the other two never did, all under the one clientConnection, and
with names every node was judged from score-nodes' node cache. Asserts numbers exist, never that
they are fast: CI machines are shared and the quick sizes are tiny."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dev.bench.throughput import CLIENTS, QUICK_SIZES, SYSTEMS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]


def test_each_scheduler_binds_every_batch_and_only_the_second_calls_the_extender(
    tmp_path: Path,
) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "dev.bench",
            "--quick",
            "--only",
            "throughput",
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
    (path,) = tmp_path.glob("*-throughput-quick.json")
    data = json.loads(path.read_text())
    assert data["errors"] == {}
    measured = data["measurements"]["throughput"]
    assert set(measured["settings"]) == set(QUICK_SIZES.clients)
    counted = QUICK_SIZES.pods * QUICK_SIZES.rounds
    for name, setting in measured["settings"].items():
        assert setting["client_connection"] == CLIENTS[name]
        for system in SYSTEMS:
            rates = setting[system]["pods_per_s"]
            assert len(rates) == QUICK_SIZES.rounds
            assert all(math.isfinite(r) and r > 0 for r in rates)
        calls = setting["extender_calls"]
        # One filter call per pod (and a prioritize per pod with several feasible nodes), with
        # node names (the shipped configuration) and with whole Nodes.
        for system in ("extender", "extender-objects"):
            assert calls[system]["filter"] >= counted, system
            assert calls[system]["prioritize"] >= counted, system
        # With names, every node was judged on its usage from the node cache: none passed
        # for want of it (node-cache-cold), none unmeasured.
        decided = setting["extender_decisions"]["extender"]
        assert decided.get("filter/fits", 0) >= counted * QUICK_SIZES.nodes
        assert not {k for k in decided if k.endswith(("node-cache-cold", "no-usage"))}
        assert calls["default"] == {"filter": 0, "prioritize": 0}
        assert calls["second-no-extender"] == {"filter": 0, "prioritize": 0}
        assert setting["ratio_extender_to_second_no_extender"] > 0
