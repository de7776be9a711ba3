"""The benchmark harness still works: ``python -m dev.bench --quick`` end to end (as make
bench-quick).

Asserts that every measurement produced numbers (present, finite, positive where they must be),
never that they are fast: CI machines are shared and the quick sizes are tiny.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dev.bench.common import finite_numbers
from dev.bench.scale import FUNCTIONS as SCALE_FUNCTIONS

# The first test also runs the suite (module fixture): room for a first descheduler build.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1300)]

ROOT = Path(__file__).resolve().parents[2]


def positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench-quick")
    run = subprocess.run(
        [sys.executable, "-m", "dev.bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,  # includes building the descheduler once on a fresh machine
        check=False,
    )
    files = sorted(out.glob("*-quick.json"))
    assert files, f"no results file; exit {run.returncode}\n{run.stderr[-4000:]}"
    data: dict[str, Any] = json.loads(files[0].read_text())
    data["_dir"] = str(out)
    data["_stderr"] = run.stderr[-4000:]
    data["_returncode"] = run.returncode
    return data


def test_the_quick_suite_runs_every_measurement_without_errors(results: dict[str, Any]) -> None:
    assert results["errors"] == {}, results["_stderr"]
    assert results["_returncode"] == 0, results["_stderr"]
    assert set(results["measurements"]) == {
        "recovery",
        "detect",
        "webhook",
        "cold-start",
        "load",
        "scale",
    }
    assert all(math.isfinite(v) for v in finite_numbers(results["measurements"]))
    machine = results["machine"]
    assert positive(machine["cores"]) and positive(machine["memory_gib"])
    assert machine["python"] and machine["kubernetes"]


def test_recovery_has_numbers_for_every_system(results: dict[str, Any]) -> None:
    rec = results["measurements"]["recovery"]
    # make bench-quick measures the committed scenario on the compressed clock, and says so.
    assert (rec["scenario"], rec["kubelet_backoff"]) == ("prefer-faulty", "compressed")
    systems = rec["systems"]
    assert set(systems) == {"vanilla", "descheduler-10s", "kn-rescheduler"}
    for name, run in systems.items():
        assert run["affected"] > 0
        assert positive(run["api"]["all_requests_per_s"])
        if name != "kn-rescheduler":
            # Their pods crash-loop to the threshold: the back-off's cost is measured.
            assert positive(run["threshold_from_failure"]["p50"])
    assert systems["vanilla"]["moves_total"] == 0
    kn = systems["kn-rescheduler"]
    # kn-rescheduler moves a pod with evidence beside it before the threshold (corroborated
    # moves, docs/failure-rules.md): its pods may never reach it, and the figure is then
    # absent (no sample), never a number made up.
    reached = kn["threshold_from_failure"]
    assert (reached["n"] == 0 and reached["p50"] is None) or positive(reached["p50"])
    assert kn["recovered"] > 0 and kn["moves_total"] > 0
    assert positive(kn["recovery_from_failure"]["p50"])
    assert positive(kn["recovery_from_failure"]["p95"])
    assert positive(kn["moves_per_recovery"])
    assert positive(kn["api"]["system_requests_per_move"])
    healthy = rec["healthy_updates"]
    assert healthy["update_events_routed"] > 0
    assert healthy["pipeline_requests"] >= 0
    plots = list(Path(results["_dir"]).glob("*-recovery-cdf.png"))
    assert plots and plots[0].stat().st_size > 0


def test_detect_throughput_has_rates_and_latencies(results: dict[str, Any]) -> None:
    det = results["measurements"]["detect"]
    for tier in ("json_floor", "parse_and_detect", "detect_only"):
        assert positive(det["in_process"][tier]["events_per_s"])
    assert positive(det["in_process"]["cost_vs_floor"])
    for run in (det["http"], det["http_quiet"]):
        assert positive(run["events_per_s"])
        assert positive(run["latency_ms"]["p50"]) and positive(run["latency_ms"]["p99"])
        assert set(run["statuses"]) <= {"200", "202"}


def test_webhook_latencies_and_creation_ratio(results: dict[str, Any]) -> None:
    wh = results["measurements"]["webhook"]
    for path in ("in_process", "tls"):
        assert wh[path]["patched"] == wh[path]["reviews"] > 0
        assert positive(wh[path]["latency_ms"]["p99"])
    created = wh["pod_creation"]
    assert created["stamped"]["without"] == 0 and created["stamped"]["with"] > 0
    assert positive(created["p50_ratio"]) and positive(created["p99_ratio"])


def test_cold_start_per_function(results: dict[str, Any]) -> None:
    cold = results["measurements"]["cold-start"]
    assert set(cold) == {
        "detect-failures",
        "update-annotations",
        "mutate-admission",
        "sweep-failures",
    }
    assert all(positive(c["median_s"]) for c in cold.values())


def test_scale_rolls_out_and_recovers(results: dict[str, Any]) -> None:
    scale = results["measurements"]["scale"]
    assert scale["rollout"]["complete"]
    recovery = scale["recovery"]
    assert recovery["affected_replicas"] > 0
    assert recovery["recovered"] > 0
    # The fault hit the pods running on the faulty nodes in place: each is a replica to
    # recover, and none was removed by the harness (every removal counted is a move).
    assert recovery["pods_hit_in_place"] == recovery["affected_replicas"]
    # Every pod created called the webhook, as the API server's own metrics count it: the
    # rollout's pods, then each move's replacement.
    assert scale["rollout"]["webhook"]["calls"] >= scale["rollout"]["expected"]
    assert recovery["webhook"]["calls"] >= recovery["moves"]
    assert scale["rollout"]["webhook"]["p99_s_at_most"] is not None
    # Wasted moves are a figure of their own, with their share of the moves.
    assert 0 <= recovery["wasted_moves"] <= recovery["moves"]
    assert recovery["wasted_share"] == round(recovery["wasted_moves"] / recovery["moves"], 3)
    assert positive(recovery["time_to_all_healthy_s"])
    assert positive(sum(recovery["function_cpu_s"].values()))
    # The harness process is counted alone, the control plane by process, beside the functions.
    for phase in (scale["rollout"], recovery):
        assert positive(phase["harness_process_cpu_s"])
        assert {"kube-apiserver", "etcd", "kube-scheduler"} <= set(phase["control_plane_cpu_s"])
        assert positive(phase["control_plane_cpu_s"]["kube-apiserver"])
    assert positive(scale["peak_rss_mib"]["kube-apiserver"])
    assert positive(scale["peak_rss_mib"]["detect-failures"])
    assert scale["peak_rss_mib"]["harness-process"] < sum(scale["peak_rss_mib"].values())
    # Prometheus and the load-aware functions run beside the pipeline, as installed.
    assert positive(scale["peak_rss_mib"]["prometheus"])
    assert set(SCALE_FUNCTIONS) <= set(recovery["functions"])


def test_scale_reports_each_functions_requests_and_events(results: dict[str, Any]) -> None:
    scale = results["measurements"]["scale"]
    rollout, recovery = scale["rollout"]["functions"], scale["recovery"]["functions"]
    # Every status change of every pod reached detect-failures, which needs no API request.
    assert rollout["detect-failures"]["handled"] >= scale["rollout"]["expected"]
    assert positive(rollout["detect-failures"]["handled_per_s"])
    assert rollout["detect-failures"]["api"]["requests"] == 0
    # Each move is written by update-annotations under its own identity: the API server timed
    # its requests apart from every other function's.
    moves = scale["recovery"]["moves"]
    assert recovery["update-annotations"]["handled"] >= moves
    assert recovery["update-annotations"]["api"]["requests"] >= 2 * moves
    assert recovery["update-annotations"]["api"]["p99_s_at_most"] is not None
    assert positive(recovery["update-annotations"]["handler_mean_s"])
    assert rollout["mutate-admission"]["handled"] > 0


def test_load_aware_placement_has_numbers_for_every_system(results: dict[str, Any]) -> None:
    check_load(results["measurements"]["load"])


def check_load(load: dict[str, Any]) -> None:
    """What ``--only load`` must produce (also run by hand on a saved results file)."""
    from dev.bench.loadaware import QUICK_LOAD, system_names  # noqa: PLC0415 - only this test's

    systems = load["systems"]
    assert load["failures"] == {}
    assert set(systems) == set(system_names(QUICK_LOAD))
    expected = sum(s.replicas for s in QUICK_LOAD.shapes)
    background = sum(cpu for cpu, _ in load["background"].values()) / load["nodes"] * 100
    for name, run in systems.items():
        assert run["pods"] == expected and run["pending_after_placement"] == 0, name
        for moment in (run["after_placement"], run["end"]):
            assert positive(moment["max_cpu_percent"]) and moment["max_cpu_percent"] <= 100
            assert moment["stdev_cpu_percent"] >= 0 and moment["nodes_over_threshold"] >= 0
            # The pods' usage shows on their nodes: the model moved every node's usage.
            assert moment["mean_cpu_percent"] > background + 10, name
        assert run["evictions"] >= 0
        under = run["all_under_threshold_s"]
        assert under is None or under >= 0
        # Running pods per node (a replacement may still be starting at the end).
        assert 0 < sum(run["pods_per_node"].values()) <= expected
    for name in ("stock", "extender", "label"):
        assert systems[name]["rebalancer"] is None and systems[name]["evictions"] == 0
    # The label mode's pods got mutate-admission's affinities; no other placement's did. (The
    # extender's pods were all bound: only the second scheduler binds them.)
    assert systems["label"]["steered_by_load_label"] == expected
    assert systems["stock"]["steered_by_load_label"] == 0
    assert systems["extender"]["steered_by_load_label"] == 0
    # The descheduler read node usage from Prometheus in every cycle it ran.
    cycles = systems["descheduler"]["descheduler_cycles"]
    assert cycles["run"] > 0 and cycles["failed"] == 0, cycles
    for name in ("extender+rebalance", "label+rebalance"):
        assert systems[name]["rebalancer"] == "rebalance-nodes"
        pings = systems[name]["pings"]
        assert pings["sent"] > 0 and pings["failed"] == 0, pings
    assert load["usage_loop_errors"] == 0


def test_the_extender_part_measures_both_ways_of_calling_at_every_size(tmp_path: Path) -> None:
    """Named with --only (it is not part of the full suite): its own quick run, on a small
    control plane holding the bench's Nodes. Node names looked up in score-nodes' node cache
    and whole Node objects; in both every node is judged on its usage (the bench itself
    refuses a point where the filter failed none or every score was the same)."""
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
    assert positive(measured["floor"]["latency_ms"]["p50"])
    for mode in ("names", "objects"):
        for nodes in ("20", "240"):
            point = measured[mode][nodes]
            assert positive(point["request_bytes"])
            assert point["filter"]["passed"] + point["filter"]["failed"] == int(nodes)
            assert 0 < point["filter"]["failed"] < int(nodes)
            assert point["prioritize"]["scored"] == int(nodes)
            for verb in ("filter", "prioritize"):
                latency = point[verb]["latency_ms"]
                assert latency["n"] == measured["calls_per_point"]
                assert positive(latency["p50"]) and latency["p99"] >= latency["p50"]
                assert positive(point[verb]["server_ms_at_most"]["p99"]), (mode, nodes, verb)
    # Names only: the request does not grow with what a Node holds.
    assert (
        measured["names"]["240"]["request_bytes"] * 10
        < (measured["objects"]["240"]["request_bytes"])
    )


def test_the_broker_part_shows_a_failing_subscriber_stalling_the_next_event_only_when_sync(
    tmp_path: Path,
) -> None:
    # Named with --only: its own quick run on a small control plane.
    run = subprocess.run(
        [sys.executable, "-m", "dev.bench", "--quick", "--only", "broker", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    (path,) = tmp_path.glob("*-broker-quick.json")
    data = json.loads(path.read_text())
    assert data["errors"] == {}
    modes = data["measurements"]["broker"]["modes"]
    assert set(modes) == {"async_handler_false", "async_handler_true"}
    for mode in modes.values():
        for path_ in ("hop", "source"):
            assert mode[path_]["lost"] == 0
            latency = mode[path_]["latency_ms"]
            assert positive(latency["p50"]) and latency["p99"] >= latency["p50"]
        for via in ("direct", "source"):
            for trial in mode["failing"][via]["trials"]:
                # The shipped delivery spec: the first attempt and 5 retries, about 15.5 s,
                # then the dead-letter sink, whatever the channel's handler.
                assert trial["failing_attempts"] == 6
                assert trial["dead_letter_ms"] > 10_000
    # Synchronous: the sender waits out the retries, so the next event waits as long.
    sync = modes["async_handler_false"]["failing"]
    assert all(t["first_answer_ms"] > 10_000 for t in sync["direct"]["trials"])
    for via in ("direct", "source"):
        assert all(t["next_delivered_ms"] > 10_000 for t in sync[via]["trials"])
    # Asynchronous: the dispatcher answers at once and the next event goes through.
    fast = modes["async_handler_true"]["failing"]
    assert all(t["first_answer_ms"] < 5_000 for t in fast["direct"]["trials"])
    for via in ("direct", "source"):
        assert all(t["next_delivered_ms"] < 5_000 for t in fast[via]["trials"])
