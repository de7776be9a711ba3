"""The short soak (``python -m dev.bench.soak --quick``, about three minutes) on a production-like
local cluster: it runs, every invariant of doing no harm looked at something, and the figures
say how much happened.

The run starts its own control plane (seven nodes, three faulty, the default scheduler calling
score-nodes as its extender, Prometheus) with the neighbours of dev/localcluster/production.py, the
whole pipeline and rebalance-nodes, then a timeline: a node runs hot, an add-on restarts, a node
joins, one is cordoned and drained, the joined one leaves. The invariants are judged on the
harness's own watches (dev/bench/soak/invariants.py). A violation is reported with its evidence;
whether the product passes is the last test, kept apart so that a finding does not hide that
the harness itself worked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dev.bench.soak.invariants import INVARIANTS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("soak-quick")
    done = subprocess.run(
        [sys.executable, "-m", "dev.bench.soak", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    files = sorted(out.glob("soak-*-quick.json"))
    assert files, f"no results; exit {done.returncode}\n{done.stderr[-4000:]}"
    data: dict[str, Any] = json.loads(files[0].read_text())
    data["_stderr"] = done.stderr[-6000:]
    data["_returncode"] = done.returncode
    return data


def test_the_run_completes(run: dict[str, Any]) -> None:
    assert "error" not in run, run["_stderr"]
    assert run["_returncode"] in (0, 1), run["_stderr"]


def test_every_invariant_looked_at_something(run: dict[str, Any]) -> None:
    checked = run["invariants"]["checked"]
    assert set(checked) == set(INVARIANTS)
    for name in (
        "healthy-pods-untouched",
        "foreign-labels-untouched",
        "system-critical-scheduled",
        "budget-kept-when-broken-everywhere",
        "node-fixable-recovered",
    ):
        assert checked[name] > 0, (name, checked)


def test_the_pipeline_moved_pods_and_the_cluster_had_neighbours(run: dict[str, Any]) -> None:
    assert run["moves"].get("Rescheduled", 0) > 0, run["moves"]
    assert run["pods"]["system_critical"] >= 3
    assert run["nodes"]["operator_writes"] >= run["scales"]["nodes"]
    assert run["events"]["failing"] > 0
    # The Deployment broken on every node was seen failing, judged, and told to stop.
    assert run["events"]["by_reason_ours"].get("MovesStopped", 0) >= 1, run["events"]


def test_no_invariant_is_violated(run: dict[str, Any]) -> None:
    found = run["invariants"]["violations"]
    assert run["violations"] == 0, json.dumps(found, indent=1)[:6000]
