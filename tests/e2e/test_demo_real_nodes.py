"""`make demo REAL_NODES=2`: the demo on real nodes, a kubelet and containerd each.

The same demo as tests/e2e/test_demo.py, run as its users run it, on a cluster of two real
nodes: real-1's app misses a file of its node and crash-loops there, with the real kubelet's
back-off; the functions run at their default thresholds. Act 2 needs two healthy nodes and is
skipped, which the demo says.

In the full real-node suite only (`make real-nodes`): about 2 minutes, and the short suite
already moves a crash loop on real nodes end to end (test_knative_installed.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import needs_real_nodes, run_demo

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.e2e,
    needs_real_nodes,
    pytest.mark.real_nodes,
    pytest.mark.real_nodes_full,
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run_dir = tmp_path_factory.mktemp("demo-real") / "run"
    return run_demo(run_dir, "--real-nodes", "2", timeout=300)


def test_the_real_node_demo_recovers_every_workload(demo: dict[str, Any]) -> None:
    assert demo["code"] == 0, (
        f"stdout:\n{demo['stdout'][-4000:]}\nstderr:\n{demo['stderr'][-3000:]}"
    )
    summary = demo["summary"]
    assert set(summary["faults"]) == {"real-1"}
    workloads = {row["workload"] for row in summary["rows"]}
    assert workloads == {"Deployment/web", "StatefulSet/db", "Job/report"}
    for row in summary["rows"]:
        assert row["final_node"] == "real-0", row
        assert row["ended"] in ("Ready", "Succeeded"), row
        # Every replica that started on the broken node failed there and moved once.
        if row["nodes"][0] == "real-1":
            assert row["failed"][0] is True and row["moves"] >= 1, row


def test_the_real_node_demo_says_what_it_runs_on(demo: dict[str, Any]) -> None:
    out = demo["stdout"]
    assert "2 real nodes (a kubelet and containerd each)" in out
    assert "real-1" in out and "app-crash" in out
    assert "act 2 (node pressure) needs two healthy nodes: skipped" in out
