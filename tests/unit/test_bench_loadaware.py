"""The load bench's usage model and figures (bench.loadaware): a node's simulated usage is its
background plus what the pods running on it use, never what they request; the figures, the
evictions and the convergence time are read from the samples as the report states them; the
descheduler gets a query and a policy its v0.36 accepts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dev.bench.loadaware import (
    BENCH_LABEL,
    FULL_LOAD,
    POD_CPU_ANNOTATION,
    POD_MEMORY_ANNOTATION,
    QUICK_LOAD,
    SA_DIR,
    SYSTEMS,
    Shape,
    Spread,
    Usage,
    background,
    convergence,
    deployment,
    descheduler_cycles,
    descheduler_policy,
    descheduler_query,
    evicted,
    in_pod_argv,
    node_usage,
    phases,
    pod_usage,
    running_on,
    spread,
    steered_by_load,
    system_names,
    to_write,
    under_for,
)
from dev.bench.report import load_section
from dev.bench.report import main as report_main
from shared.api.keys import LOAD_AWARE_KEY, LOAD_AWARE_SCHEDULER_NAME, LOAD_LABEL, REBALANCE_KEY

GI = 1024**3
CPUS = {"node-0": 8.0, "node-1": 8.0}
MEMORY = {"node-0": 32.0 * GI, "node-1": 32.0 * GI}


def pod(
    name: str,
    node: str | None,
    cpu: str | None = "1.5",
    memory: str | None = str(2 * GI),
    *,
    phase: str = "Running",
    deleting: bool = False,
) -> dict[str, Any]:
    """A burst pod as the API server returns it once the kubelet reported it."""
    annotations = {}
    if cpu is not None:
        annotations[POD_CPU_ANNOTATION] = cpu
    if memory is not None:
        annotations[POD_MEMORY_ANNOTATION] = memory
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "bench-load-0-api",
        "uid": f"uid-{name}",
        "labels": {"app": "api", BENCH_LABEL: "true", "pod-template-hash": "6b7d9c5f4"},
        "annotations": annotations,
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "api-6b7d9c5f4"}
        ],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T18:20:00Z"
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "app",
                "image": "registry.example.com/shop/app:2.3.1",
                "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
            }
        ],
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("the_pod", "node"),
    [
        (pod("a", "node-0"), "node-0"),
        (pod("pending", None, phase="Pending"), None),
        (pod("bound-not-started", "node-0", phase="Pending"), None),
        (pod("terminating", "node-0", deleting=True), None),
        (pod("done", "node-0", phase="Succeeded"), None),
    ],
)
def test_a_pod_uses_its_node_only_while_it_runs_there(
    the_pod: dict[str, Any], node: str | None
) -> None:
    assert running_on(the_pod) == node


@pytest.mark.parametrize(
    ("cpu", "memory", "expected"),
    [
        ("1.5", str(GI), (1.5, float(GI))),
        ("0.02", "41943040", (0.02, 41943040.0)),
        (None, None, (0.0, 0.0)),
        ("lots", "-5", (0.0, 0.0)),
        ("nan", "inf", (0.0, 0.0)),
    ],
)
def test_what_a_pod_uses_comes_from_its_annotations_and_nonsense_is_nothing(
    cpu: str | None, memory: str | None, expected: tuple[float, float]
) -> None:
    assert pod_usage(pod("a", "node-0", cpu, memory)) == expected


def test_a_nodes_usage_is_its_background_plus_its_running_pods_usage_not_their_requests() -> None:
    base = {"node-0": (0.10, 0.20), "node-1": (0.55, 0.40)}
    pods = [
        pod("a", "node-0", "1.5", str(2 * GI)),
        pod("b", "node-0", "0.5", str(2 * GI)),
        pod("c", "node-1", "1.0", str(GI)),
        pod("pending", None, "3"),
        pod("leaving", "node-1", "3", deleting=True),
        pod("elsewhere", "node-9", "3"),
    ]
    usage = node_usage(base, pods, CPUS, MEMORY)
    # node-0: 0.8 cores of background + 2 cores of pods = 2.8 of 8; memory 6.4 + 4 of 32 GiB.
    assert usage["node-0"].cpu == pytest.approx(0.35)
    assert usage["node-0"].memory == pytest.approx(0.325)
    # node-1: 4.4 + 1 = 5.4 cores; the terminating pod no longer counts.
    assert usage["node-1"].cpu == pytest.approx(0.675)
    assert set(usage) == {"node-0", "node-1"}


def test_a_saturated_node_measures_100_percent_and_the_rest_is_demand() -> None:
    usage = node_usage(
        {"node-0": (0.55, 0.40)}, [pod(f"b{i}", "node-0", "1.8") for i in range(3)], CPUS, MEMORY
    )
    assert usage["node-0"].cpu == 1.0
    assert usage["node-0"].cpu_demand == pytest.approx((4.4 + 5.4) / 8)


def test_the_background_pattern_is_the_same_for_every_run_and_not_even() -> None:
    nodes = [f"node-{i}" for i in range(20)]
    base = background(nodes)
    assert base == background(nodes)
    cpu = sorted(b[0] for b in base.values())
    assert cpu.count(0.55) == 4 and cpu.count(0.35) == 4 and cpu.count(0.10) == 12


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ({}, {"node-0": (0.35, 0.325)}),  # never written
        ({"node-0": (0.35, 0.325)}, {}),  # unchanged
        ({"node-0": (0.351, 0.325)}, {}),  # within the tolerance
        ({"node-0": (0.30, 0.325)}, {"node-0": (0.35, 0.325)}),  # a pod left
        ({"node-0": (0.35, 0.30)}, {"node-0": (0.35, 0.325)}),  # memory moved alone
    ],
)
def test_only_a_node_whose_usage_moved_is_written_again(
    written: dict[str, tuple[float, float]], expected: dict[str, tuple[float, float]]
) -> None:
    assert to_write({"node-0": Usage(0.35, 0.325, 0.35)}, written) == expected


def test_the_figures_are_percent_of_the_machine_over_the_nodes() -> None:
    usage = {
        "node-0": Usage(0.9, 0.3, 1.2),
        "node-1": Usage(0.5, 0.3, 0.5),
        "node-2": Usage(0.1, 0.3, 0.1),
        "node-3": Usage(0.8, 0.3, 0.8),  # at the threshold is not over it
    }
    s = spread(usage)
    assert s.max_cpu == pytest.approx(90.0)
    assert s.mean_cpu == pytest.approx(57.5)
    # Population deviation: sqrt((32.5² + 7.5² + 47.5² + 22.5²) / 4).
    assert s.stdev_cpu == pytest.approx(31.1247, abs=1e-3)
    assert s.over == ("node-0",)
    assert s.max_demand == pytest.approx(120.0)
    assert s.to_json()["nodes_over_threshold"] == 1


def at(over: tuple[str, ...]) -> Spread:
    return Spread(
        max_cpu=85.0 if over else 70.0, stdev_cpu=10, mean_cpu=50, over=over, max_demand=0
    )


HOT = at(("node-3",))
COOL = at(())


@pytest.mark.parametrize(
    ("samples", "first", "held", "cool_for"),
    [
        ([(0.0, HOT), (1.0, HOT), (2.0, COOL), (3.0, COOL)], 2.0, True, 1.0),
        ([(0.0, HOT), (5.0, COOL), (6.0, HOT), (9.0, COOL)], 5.0, True, 0.0),  # came back
        ([(0.0, HOT), (5.0, COOL), (6.0, HOT)], 5.0, False, 0.0),  # ping-pong at the end
        ([(0.0, HOT), (1.0, HOT)], None, False, 0.0),  # never within the bound
        ([(0.0, COOL), (1.0, COOL)], 0.0, True, 1.0),  # the placement was already fine
    ],
)
def test_convergence_is_when_every_node_was_first_under_and_whether_it_lasted(
    samples: list[tuple[float, Spread]], first: float | None, held: bool, cool_for: float
) -> None:
    c = convergence(samples)
    assert (c.first_all_under_s, c.held_to_end) == (first, held)
    assert under_for(samples) == cool_for


def test_evictions_count_every_pod_seen_during_rebalancing_that_is_gone_replacements_too() -> None:
    at_start = {"a", "b", "c"}
    # b was evicted, its replacement d too, and e replaced d.
    seen = at_start | {"d", "e"}
    present = {"a", "c", "e"}
    assert evicted(seen, present) == 2
    assert evicted(at_start, at_start) == 0


def test_a_deployment_carries_its_usage_and_both_opt_ins_and_names_its_scheduler() -> None:
    shape = Shape("batch", 10, "250m", "256Mi", 1.8, 1024**3)
    body = deployment(shape, LOAD_AWARE_SCHEDULER_NAME)
    assert body["metadata"]["annotations"] == {LOAD_AWARE_KEY: "true", REBALANCE_KEY: "true"}
    template = body["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        POD_CPU_ANNOTATION: "1.8",
        POD_MEMORY_ANNOTATION: str(1024**3),
    }
    assert template["metadata"]["labels"][BENCH_LABEL] == "true"
    assert template["spec"]["schedulerName"] == LOAD_AWARE_SCHEDULER_NAME
    requests = template["spec"]["containers"][0]["resources"]["requests"]
    assert requests == {"cpu": "250m", "memory": "256Mi"}
    assert "schedulerName" not in deployment(shape, None)["spec"]["template"]["spec"]


def test_the_burst_uses_more_than_it_requests_in_some_pods_and_less_in_others() -> None:
    for scales in (FULL_LOAD, QUICK_LOAD):
        ratios = [s.cpu_usage * 1000 / _millicores(s.cpu_request) for s in scales.shapes]
        assert max(ratios) > 5 and min(ratios) < 0.25


def _millicores(raw: str) -> float:
    return float(raw[:-1]) if raw.endswith("m") else float(raw) * 1000


def test_the_descheduler_query_labels_each_sample_instance_with_the_node_name_within_0_and_1() -> (
    None
):
    query = descheduler_query("10s")
    assert query == (
        'clamp(label_replace(1 - avg by (node) (rate(node_cpu_seconds_total{mode="idle"}[10s])), '
        '"instance", "$1", "node", "(.+)"), 0, 1)'
    )


def test_the_descheduler_policy_is_low_node_utilization_on_prometheus_as_v0_36_validates_it() -> (
    None
):
    policy = descheduler_policy("http://127.0.0.1:9090", "q")
    assert policy["metricsProviders"] == [
        {"source": "Prometheus", "prometheus": {"url": "http://127.0.0.1:9090"}}
    ]
    (profile,) = policy["profiles"]
    assert profile["plugins"]["balance"] == {"enabled": ["LowNodeUtilization"]}
    args = next(p["args"] for p in profile["pluginConfig"] if p["name"] == "LowNodeUtilization")
    # validatePrometheusMetricsUtilization: exactly MetricResource in both, and a query.
    assert set(args["thresholds"]) == set(args["targetThresholds"]) == {"MetricResource"}
    assert args["thresholds"]["MetricResource"] < args["targetThresholds"]["MetricResource"] == 80
    assert args["metricsUtilization"] == {"source": "Prometheus", "prometheus": {"query": "q"}}


def test_the_descheduler_runs_with_a_pods_service_account_directory_of_its_own(
    tmp_path: Any,
) -> None:
    argv = in_pod_argv(tmp_path, ["/bin/descheduler", "--v=2"])
    assert argv[:2] == ["unshare", "--mount"]
    script = argv[argv.index("-c") + 1]
    assert "mount -t tmpfs" in script and f"mkdir -p {SA_DIR}" in script
    assert f"{tmp_path}/token" in script and f"{tmp_path}/ca.crt" in script
    assert argv[-2:] == ["/bin/descheduler", "--v=2"]


def test_every_system_the_issue_names_is_measured_and_the_full_run_adds_stock_rebalanced() -> None:
    issue = ["stock", "descheduler", "extender", "extender+rebalance", "label", "label+rebalance"]
    assert system_names(QUICK_LOAD) == issue
    assert system_names(FULL_LOAD) == list(SYSTEMS) == [*issue[:2], "stock+rebalance", *issue[2:]]
    # Each placement is measured once without rebalancing.
    without = [p.names[0] for p in phases(FULL_LOAD) if p.names[0]]
    assert without == ["stock", "extender", "label"]


# The descheduler v0.36's log at --v=2: a cycle whose query failed, one that evicted, and the
# query of a third cut short when the harness stopped it.
DESCHEDULER_LOG = """\
I1123 18:16:16.124797   12723 profile.go:417] "Total number of evictions/requests" \
extension point="Balance" evictedPods=0 evictionRequests=0
E1123 18:16:16.124825   12723 descheduler.go:300] "running balance extension point failed \
with error" err="plugin \\"LowNodeUtilization\\" finished with error: error getting node usage: \
unable to capture prometheus metrics" profile="kn-rescheduler-bench-load"
I1123 18:16:16.124838   12723 descheduler.go:252] "Number of evictions/requests" \
totalEvicted=0 evictionRequests=0
I1123 18:20:33.024638   17296 evictions.go:589] "Evicted pod" \
pod="bench-load-0-web/web-7448f59595-zc4xc" reason="" strategy="LowNodeUtilization" \
node="node-0" profile="kn-rescheduler-bench-load"
I1123 18:20:33.024753   17296 profile.go:417] "Total number of evictions/requests" \
extension point="Balance" evictedPods=1 evictionRequests=0
I1123 18:20:33.024803   17296 descheduler.go:252] "Number of evictions/requests" \
totalEvicted=1 evictionRequests=0
E1123 18:20:48.002344   17296 descheduler.go:300] "running balance extension point failed \
with error" err="plugin \\"LowNodeUtilization\\" finished with error: error getting node usage: \
unable to capture prometheus metrics: Post \\"http://127.0.0.1:50087/api/v1/query\\": \
terminated signal received" profile="kn-rescheduler-bench-load"
"""


def test_the_descheduler_log_tells_its_cycles_and_those_without_usage_but_not_its_stop() -> None:
    assert descheduler_cycles(DESCHEDULER_LOG) == {"run": 2, "failed": 1}


def system(
    name: str, rebalancer: str | None, placed: float, end: float, under: float | None
) -> dict[str, Any]:
    def figures(max_cpu: float) -> dict[str, Any]:
        return {
            "max_cpu_percent": max_cpu,
            "stdev_cpu_percent": 12.5,
            "nodes_over_threshold": int(max_cpu > 80),
        }

    return {
        "system": name,
        "rebalancer": rebalancer,
        "after_placement": figures(placed),
        "end": figures(end),
        "evictions": 0 if rebalancer is None else 4,
        "all_under_threshold_s": under,
        "held_to_end": under is not None,
        "pending_after_placement": 0,
    }


def report_input() -> dict[str, Any]:
    return {
        "nodes": 20,
        "pods": 80,
        "shapes": [{"name": "api", "replicas": 12, "cpu_request": "500m", "cpu_usage": 1.2}],
        "scales": {
            "rate_window": "10s",
            "rebalance_bound_s": 240.0,
            "hold_s": 60.0,
            "rebalance_every_s": 10,
            "usage_every_s": 5,
        },
        "descheduler_version": "v0.36.0",
        "background": {"node-0": [0.55, 0.4], "node-1": [0.1, 0.2]},
        # As the results file holds them: keys sorted.
        "systems": {
            "descheduler": system("descheduler", "descheduler", 96.2, 91.0, None),
            "extender": system("extender", None, 88.0, 88.0, None),
            "extender+rebalance": system("extender+rebalance", "rebalance-nodes", 88, 70, 31.5),
            "label": system("label", None, 75.0, 75.0, 0.0),
            "label+rebalance": system("label+rebalance", "rebalance-nodes", 75.0, 75.0, 0.0),
            "stock": system("stock", None, 96.2, 96.2, None),
            "stock+rebalance": system("stock+rebalance", "rebalance-nodes", 93.0, 77.0, 48.0),
        },
    }


def test_the_report_shows_every_system_in_the_issues_order_and_never_as_a_dash() -> None:
    load = report_input()
    rows = [line for line in load_section(load) if line.startswith("| ") and "---" not in line]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows[1:]] == list(SYSTEMS)
    descheduler_row = rows[2].split(" | ")
    assert descheduler_row[1] == "descheduler"
    assert descheduler_row[5:7] == ["4", "—"]  # evictions, never under 80 % within the bound
    assert rows[5].split(" | ")[6] == "31.5 s"


def test_the_report_names_a_system_that_could_not_be_measured_and_why() -> None:
    load = report_input()
    del load["systems"]["descheduler"]
    load["failures"] = {"descheduler": "RuntimeError: the descheduler exited"}
    lines = load_section(load)
    assert "descheduler: not measured (RuntimeError: the descheduler exited)." in lines
    assert not any(line.startswith("| descheduler |") for line in lines)


def test_the_section_of_a_load_only_run_is_printed_for_results_md(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "2026-11-23-load.json"
    path.write_text(json.dumps({"measurements": {"load": report_input()}}))
    assert report_main(["--load", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## 9. Load-aware placement and rebalancing")
    assert "| stock+rebalance | rebalance-nodes | 93.0 % |" in out


def test_a_pod_is_steered_by_load_when_it_prefers_nodes_by_their_load_label() -> None:
    steered = pod("a", "node-1")
    # What mutate-admission injects (shared/admission/decide.py SoftAvoid on the load label).
    steered["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 30,
                    "preference": {
                        "matchExpressions": [
                            {
                                "key": LOAD_LABEL,
                                "operator": "NotIn",
                                "values": ["high", "overloaded"],
                            }
                        ]
                    },
                }
            ]
        }
    }
    other = pod("b", "node-1")
    other["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/zone",
                                "operator": "In",
                                "values": ["eu-west-1a"],
                            }
                        ]
                    },
                }
            ]
        }
    }
    assert steered_by_load(steered)
    assert not steered_by_load(other)
    assert not steered_by_load(pod("c", "node-1"))


@pytest.mark.parametrize(("scales", "nodes"), [(FULL_LOAD, 20), (QUICK_LOAD, 6)])
def test_every_node_under_80_percent_is_possible_but_a_blind_placement_can_miss_it(
    scales: Any, nodes: int
) -> None:
    base = background([f"node-{i}" for i in range(nodes)])
    cores = sum(cpu * 8 for cpu, _ in base.values()) + sum(
        s.replicas * s.cpu_usage for s in scales.shapes
    )
    mean = cores / (8 * nodes) * 100
    # Enough room for a balanced placement, with the busiest nodes left near their background.
    assert 45 < mean < 65
    # Two of the heaviest pods on a node already at 55 % take it over 80 %.
    heaviest = max(s.cpu_usage for s in scales.shapes)
    assert (0.55 * 8 + 2 * heaviest) / 8 * 100 > 80
