"""The short chaos run (``python -m dev.bench.chaos --quick``, about a minute and a half) holds
every invariant, and its faults really happened.

The run starts its own local control plane (six nodes, two of them faulty) and the whole
pipeline, creates a storm of failing pods across Deployments, StatefulSets, Jobs and bare pods,
and for 50 s SIGKILLs update-annotations (on state writes and at random), restarts
kube-apiserver and etcd, and has the forwards of Knative's data plane (dev/pipeline/faults.py) lose
source events at the ingress, reset connections to the functions before a request or instead of
its answer, repeat and hold back requests, Knative's dispatcher retrying (25 s and one more wave
of pods at a time, twice at most, until a kill has landed between a state write and the removal
it was for: that moment is a race). Then
it waits for every replica to be healthy and judges the invariants on what the API server says
(dev/bench/chaos/invariants.py). A run that injected no fault of some kind proves nothing about
it, so each kind is counted here too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dev.bench.chaos.invariants import INVARIANTS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("chaos-quick")
    done = subprocess.run(
        [sys.executable, "-m", "dev.bench.chaos", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    files = sorted(out.glob("chaos-*-quick.json"))
    assert files, f"no results; exit {done.returncode}\n{done.stderr[-4000:]}"
    data: dict[str, Any] = json.loads(files[0].read_text())
    data["_stderr"] = done.stderr[-6000:]
    data["_returncode"] = done.returncode
    return data


def test_the_run_completes(run: dict[str, Any]) -> None:
    assert "error" not in run, run["_stderr"]
    assert run["_returncode"] in (0, 1), run["_stderr"]


def test_no_invariant_is_violated(run: dict[str, Any]) -> None:
    found = run["invariants"]["violations"]
    assert run["violations"] == 0, json.dumps(found, indent=1)[:6000]
    assert run["_returncode"] == 0


def test_every_invariant_looked_at_something(run: dict[str, Any]) -> None:
    checked = run["invariants"]["checked"]
    assert set(checked) == set(INVARIANTS)
    for name in ("removed-pods-recorded", "within-budget", "counted-once", "replicas-healthy"):
        assert checked[name] > 0, name
    assert run["storm"]["pods_removed"] > 0 and run["moves"]["recorded"] > 0


def test_every_replica_recovered_on_a_healthy_node(run: dict[str, Any]) -> None:
    assert run["recovery"]["healthy_after_faults_s"] is not None, run["_stderr"]


def test_update_annotations_was_killed_and_came_back_every_time(run: dict[str, Any]) -> None:
    f = run["faults"]
    assert f["update_annotations_kills"] > 0
    assert f["kills_on_state_write"] > 0 and f["kills_at_random"] > 0
    assert f["function_restarts"]["update-annotations"] >= f["update_annotations_kills"]


def test_some_kills_landed_between_a_state_write_and_the_removal(run: dict[str, Any]) -> None:
    f = run["faults"]
    assert f["kills_between_state_write_and_delete"] > 0, run["kills"]
    assert f["moves_cut_by_a_kill"] >= f["kills_between_state_write_and_delete"]


def test_the_api_server_and_etcd_were_restarted(run: dict[str, Any]) -> None:
    assert run["faults"]["apiserver_restarts"] >= 1
    assert run["faults"]["etcd_restarts"] >= 1


def test_the_data_plane_lost_dropped_duplicated_and_reordered_requests(run: dict[str, Any]) -> None:
    injected = run["faults"]["data_plane"]
    for fault in ("ingress_dropped", "attempts_dropped", "answers_lost", "duplicated", "reordered"):
        assert injected[fault] > 0, fault
    # Knative's dispatcher, not the harness, sent the failed deliveries again: the functions
    # saw an event id once more at least once per dropped attempt or lost answer.
    assert run["events"]["retries"] >= injected["attempts_dropped"] + injected["answers_lost"]
    # What the ingress lost, only the sweep could find again.
    assert run["events"]["failing_from_the_sweep"] > 0
