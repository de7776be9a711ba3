"""`make demo INSTALL=1`: the demo on a cluster where Knative Eventing and kn-rescheduler are
installed from their manifests, as a platform team installs them.

Real nodes with kube-proxy and CoreDNS; Knative's controllers, webhook and data plane and the
functions run as pods (dev/stack/installed.py: docs/install-without-serving.md's
`make deploy-all` and `make webhook-cert`); the demo only creates the workloads and reads the
API. real-1's app misses a file of its node and crash-loops there.

In the full real-node suite only (`make real-nodes`): about 5 minutes, and the short suite
already installs both and moves a pod with them (test_knative_installed.py).
"""

from __future__ import annotations

import json
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
    run_dir = tmp_path_factory.mktemp("demo-installed") / "run"
    done = run_demo(run_dir, "--install", timeout=1500)
    archive = run_dir / "archive.jsonl"
    done["archive"] = archive.read_text().splitlines() if archive.exists() else []
    return done


def test_the_installed_system_recovers_every_workload(demo: dict[str, Any]) -> None:
    assert demo["code"] == 0, (
        f"stdout:\n{demo['stdout'][-4000:]}\nstderr:\n{demo['stderr'][-3000:]}"
    )
    summary = demo["summary"]
    assert set(summary["faults"]) == {"real-1"}
    for row in summary["rows"]:
        assert row["final_node"] == "real-0", row
        assert row["ended"] in ("Ready", "Succeeded"), row
        if row["nodes"][0] == "real-1":
            assert row["failed"][0] is True and row["moves"] >= 1, row


def test_the_demo_says_what_it_installed_and_how(demo: dict[str, Any]) -> None:
    out = demo["stdout"]
    assert "installing Knative Eventing from its own manifests" in out
    assert "make deploy-all COMPONENTS=without-serving" in out
    assert "kn-rescheduler running in" in out
    assert "act 2 (node pressure) reads the Prometheus of the local stack" in out


def test_the_functions_logs_are_kept_as_an_archive_that_replay_reads(
    demo: dict[str, Any],
) -> None:
    events = [json.loads(line) for line in demo["archive"]]
    assert any(e["type"] == "io.kn-rescheduler.pod.failing" for e in events), events[:3]
    assert "make replay FILE=" in demo["stdout"]
