"""The short soak (``python -m dev.bench.soak --quick``, about three minutes) on a production-like
local cluster: it runs, every invariant of doing no harm looked at something, and the figures
say how much happened.

The run starts its own control plane (nine nodes, three crash-looping every pod and one failing
container creation, the default scheduler calling score-nodes as its extender, Prometheus) with
the neighbours of dev/localcluster/production.py (pods left terminal days ago, an image
pre-puller), the whole pipeline and rebalance-nodes, the lookalikes of a node's failure (an
application broken everywhere, a rollout whose image crashes 20 s after start, a big image
pulling for minutes beside siblings that had it, a missing Multus network attachment, a
container its own restart rules restart in place), then a timeline: a node runs hot, the
rollout, an add-on restarts, a node joins, one is cordoned and drained, the joined one leaves,
and a forger posts claims to every function and to the Broker. The invariants are judged on the
harness's own watches (dev/bench/soak/invariants.py). A violation is reported with its evidence;
whether the product passes is the last test, kept apart so that a finding does not hide that
the harness itself worked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

from dev.bench.soak.invariants import INVARIANTS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

# Known and open (docs/reliability.md, "Blame races the stop"): a Deployment of two replicas
# that prefers the three crash-looping nodes can meet two of them before assess-nodes' suspect
# label steers its replacements off; every pod then failed CrashLoopBackOff on two recorded
# nodes and update-annotations stops moving it, so it does not recover within the run. Seen in
# 2 of 4 runs on 2026-11-29. Only these two invariants, only for the soak's own Deployments of
# the bad nodes: every other violation fails the test.
BLAME_RACE: Final = frozenset({"node-fixable-recovered", "bad-nodes-at-once-recovered"})
BAD_NODE_APPS: Final = "Deployment soak-apps/"

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
    # Not no-mark-from-a-lookalike: a moved-off mark needs moves of more than one workload off
    # a node (docs/node-health.md, "The mark at the move"), and in this world every workload of
    # a bad node also fails on another bad node, so most runs write none (docs/reliability.md:
    # 0 marks on 2026-11-29, and two CI runs that day wrote none). Whether a run writes one is the
    # world's timing, not the harness working; the invariant's own table tests
    # (tests/unit/test_soak_invariants.py) show it finds a lookalike's mark.
    checked = run["invariants"]["checked"]
    assert set(checked) == set(INVARIANTS)
    empty = []
    for name in (
        "healthy-pods-untouched",
        "foreign-labels-untouched",
        "system-critical-scheduled",
        "budget-kept-when-broken-everywhere",
        "node-fixable-recovered",
        "bad-nodes-at-once-recovered",
        "lookalikes-left-alone",
        "moved-on-evidence",
        "forged-claims-change-nothing",
    ):
        if checked[name] == 0:
            empty.append(name)
    assert empty == [], (empty, checked)


def test_the_pipeline_moved_pods_and_the_cluster_had_neighbours(run: dict[str, Any]) -> None:
    assert run["moves"].get("Rescheduled", 0) > 0, run["moves"]
    assert run["pods"]["system_critical"] >= 3
    assert run["nodes"]["operator_writes"] >= run["scales"]["nodes"]
    assert run["events"]["failing"] > 0
    # The workloads broken on every node were seen failing and judged: moved, then told to stop
    # or out of budget (whether they kept their budget is budget-kept-when-broken-everywhere's).
    everywhere = [v for v in run["lookalikes"].values() if v["looks_like"] == "everywhere"]
    assert len(everywhere) == 2 and all(v["removed_by_us"] > 0 for v in everywhere), everywhere
    said = run["events"]["by_reason_ours"]
    assert said.get("MovesStopped", 0) + said.get("RetriesExhausted", 0) >= 1, run["events"]


def test_no_invariant_is_violated(run: dict[str, Any]) -> None:
    found = run["invariants"]["violations"]
    assert run["violations"] == len(found)
    raced = [
        v for v in found if v["invariant"] in BLAME_RACE and v["subject"].startswith(BAD_NODE_APPS)
    ]
    others = [v for v in found if v not in raced]
    assert others == [], json.dumps(others, indent=1)[:6000]
    if raced:
        stranded = sorted({v["subject"] for v in raced})
        pytest.xfail(f"blame raced the stop rule, still open: {', '.join(stranded)} stranded")


def test_the_lookalikes_were_there_for_long_enough(run: dict[str, Any]) -> None:
    looks = {v["looks_like"]: v for v in run["lookalikes"].values()}
    assert set(looks) == {
        "terminal",
        "everywhere",
        "slow-pull",
        "multus",
        "restart-rules",
    }, run["lookalikes"]
    stuck_after = float(run["scales"]["pending_stuck_after"].rstrip("s"))
    # The slow pull and the missing network attachment outlasted pending_stuck_after.
    for kind in ("slow-pull", "multus"):
        assert (looks[kind]["longest_pending_s"] or 0) > stuck_after, run["lookalikes"]
    assert looks["terminal"]["pods"] >= 6
    assert looks["restart-rules"]["pods"] >= 1


def test_the_forger_reached_every_function_and_the_broker(run: dict[str, Any]) -> None:
    forger = run["forger"]
    reached = {answer.split(" ", 1)[0] for answer in forger["answers"]}
    assert {
        "broker",
        "detect-failures",
        "update-annotations",
        "assess-nodes",
        "sweep-failures",
        "mutate-admission",
        "rebalance-nodes",
    } <= reached, forger
    assert forger["real_pods_named"] > 0 and forger["made_up_pods"] > 0
