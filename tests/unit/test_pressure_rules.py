"""The pressure rule file: what it may say, the defaults, and the errors a bad file gives."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from shared.nodes.label_nodes.rules import (
    CPU_USAGE,
    DEFAULT_RULES,
    MEMORY_AVAILABLE,
    Fires,
    Rule,
    RulesError,
    load_rules,
    parse_rules,
)
from shared.platform.config import ConfigError

A_FILE = """
rules:
  - name: cpu-usage
    expr: 100 * (1 - avg by (node, instance) (rate(node_cpu_seconds_total{mode="idle"}[2m])))
    threshold: 80
    clear: 70
    for: 1m
  - name: memory-available
    expr: node_memory_MemAvailable_bytes
    threshold: 512Mi
    clear: 768Mi
    fires: below
"""

# dynamicScheduler's rule-template.yaml, as its users have it.
SEED_FILE = """
PromJob:
  Name: "k8s nodes"
Rulename:
  Node_cpu1:
    Promsql: "(1-(sum(increase(node_cpu_seconds_total{mode='idle'}[1m]))by(instance))/\\
      (sum(increase(node_cpu_seconds_total[1m]))by(instance)))*100"
    Threshold: 70
  Node_mem:
    Promsql: "(1 - (node_memory_MemAvailable_bytes / (node_memory_MemTotal_bytes)))* 100"
    Threshold: 70
"""


def test_a_rule_file_gives_its_rules_with_their_hysteresis_duration_and_direction(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(A_FILE)
    cpu, memory = load_rules(path)
    assert cpu == Rule(
        name="cpu-usage",
        expr='100 * (1 - avg by (node, instance) (rate(node_cpu_seconds_total{mode="idle"}[2m])))',
        threshold=80,
        clear=70,
        for_=timedelta(minutes=1),
        fires=Fires.ABOVE,
    )
    assert memory.threshold == 512 * 2**20
    assert memory.clear == 768 * 2**20
    assert memory.fires is Fires.BELOW
    assert memory.for_ == timedelta(0)


def test_the_clear_threshold_defaults_to_the_threshold() -> None:
    (rule,) = parse_rules({"rules": [{"name": "load", "expr": "node_load1", "threshold": 4}]})
    assert rule.clear == rule.threshold == 4


def test_the_seeds_rule_yaml_is_read_as_rules_firing_above_their_threshold() -> None:
    cpu, memory = parse_rules(yaml.safe_load(SEED_FILE))
    assert (cpu.name, cpu.threshold, cpu.clear, cpu.fires) == ("Node_cpu1", 70, 70, Fires.ABOVE)
    assert memory.expr.startswith("(1 - (node_memory_MemAvailable_bytes")


def test_no_file_means_the_built_in_rules() -> None:
    assert load_rules("") == DEFAULT_RULES
    assert load_rules(None) == DEFAULT_RULES


@pytest.mark.parametrize(
    ("rule", "value", "firing", "holding"),
    [
        # usage 70 % / clears at 60 %: fires over 70, holds a label down to 60
        ("cpu-usage", 95.0, True, True),
        ("cpu-usage", 70.0, False, True),
        ("cpu-usage", 65.0, False, True),
        ("cpu-usage", 60.0, False, False),
        ("cpu-usage", 12.0, False, False),
        # memory.available fires below 512 MiB and holds up to 768 MiB
        ("memory-available", 100 * 2**20, True, True),
        ("memory-available", 600 * 2**20, False, True),
        ("memory-available", 768 * 2**20, False, False),
        ("memory-available", 4 * 2**30, False, False),
    ],
)
def test_the_built_in_rules_fire_and_hold_on_the_right_side(
    rule: str, value: float, firing: bool, holding: bool
) -> None:
    chosen = {r.name: r for r in DEFAULT_RULES}[rule]
    assert chosen.firing(value) is firing
    assert chosen.holding(value) is holding


def test_the_built_in_rules_read_only_node_exporters_metrics() -> None:
    exprs = " ".join(rule.expr for rule in DEFAULT_RULES)
    for metric in (
        "node_cpu_seconds_total",
        "node_memory_MemAvailable_bytes",
        "node_memory_MemTotal_bytes",
    ):
        assert metric in exprs
    # The kubelet's memory.available falls back to MemAvailable where the cgroup-like pair
    # (MemFree + Inactive(file)) is not exported.
    available = {r.name: r for r in DEFAULT_RULES}["memory-available"]
    assert available.expr.endswith(" or node_memory_MemAvailable_bytes")


def test_severity_compares_rules_in_different_units() -> None:
    cpu = Rule("cpu", "x", threshold=80, clear=80)
    memory = Rule("mem", "y", threshold=500, clear=500, fires=Fires.BELOW)
    # 10 % past 80 (88) is less severe than 50 % below 500 (250)
    assert cpu.severity(88) == pytest.approx(0.1)
    assert memory.severity(250) == pytest.approx(0.5)
    assert cpu.severity(70) < 0


def rule_with(**fields: object) -> dict[str, object]:
    return {"rules": [{"name": "cpu", "expr": "x", "threshold": 80, **fields}]}


@pytest.mark.parametrize(
    ("document", "names"),
    [
        ("just a string", "expected a mapping"),
        ({"rules": "cpu"}, "rules: expected a list"),
        ({"rules": []}, "no rules"),
        ({"rule": []}, "expected a list of `rules`"),
        ({"rules": [], "extra": 1}, "unknown key(s) extra"),
        ({"rules": ["cpu"]}, "rule #1: expected a mapping"),
        ({"rules": [{"expr": "x", "threshold": 1}]}, "rule #1, field name"),
        ({"rules": [{"name": "has space", "expr": "x", "threshold": 1}]}, "rule #1, field name"),
        (rule_with(expr=""), "rule 'cpu', field expr"),
        (rule_with(expr=None), "rule 'cpu', field expr"),
        ({"rules": [{"name": "cpu", "expr": "x"}]}, "rule 'cpu', field threshold: missing"),
        (rule_with(threshold="high"), "rule 'cpu', field threshold: expected a number"),
        (rule_with(threshold=True), "rule 'cpu', field threshold"),
        (rule_with(threshold=".inf"), "rule 'cpu', field threshold"),
        (rule_with(clear="low"), "rule 'cpu', field clear"),
        (rule_with(clear=90), "rule 'cpu', field clear: a rule that fires above"),
        (rule_with(fires="below", clear=70), "field clear: a rule that fires below"),
        (rule_with(fires="sideways"), "rule 'cpu', field fires: expected above or below"),
        (rule_with(**{"for": "soon"}), "rule 'cpu', field for"),
        (rule_with(**{"for": 60}), "rule 'cpu', field for: expected a duration"),
        (rule_with(treshold=80), "rule 'cpu': unknown field(s) treshold"),
        (
            {"rules": [{"name": "a", "expr": "x", "threshold": 1}] * 2},
            "rule 'a': the name is used twice",
        ),
        ({"Rulename": {"Node_cpu": {"Promsql": "x"}}}, "rule 'Node_cpu', field threshold"),
    ],
)
def test_a_malformed_rule_file_is_refused_naming_the_rule_and_the_field(
    document: object, names: str
) -> None:
    with pytest.raises(RulesError) as caught:
        parse_rules(document, "rules.yaml")
    assert names in str(caught.value)
    assert str(caught.value).startswith("pressure rules rules.yaml")
    # A ConfigError: the function stops at start-up like it does for a bad setting.
    assert isinstance(caught.value, ConfigError)


def test_a_file_that_is_not_yaml_or_not_there_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules: [\n")
    with pytest.raises(RulesError, match=r"broken\.yaml: not valid YAML"):
        load_rules(broken)
    with pytest.raises(RulesError, match="cannot read it"):
        load_rules(tmp_path / "missing.yaml")


def test_rules_describe_themselves_for_the_logs_and_status() -> None:
    rule = Rule("cpu", "x", 80, 70, timedelta(minutes=1))
    assert rule.describe() == "cpu: > 80 (clears at 70) for 1m0s"
    assert Rule("mem", "y", 5, 5, fires=Fires.BELOW).describe() == "mem: < 5"


# --- two scrape jobs, one node-exporter ----------------------------------------------------------
# Many clusters scrape the same node-exporter twice: a static or file_sd job, plus the job their
# monitoring stack brings. Each job's series differ by `job` and by the labels its relabelling
# adds, so a rule that sums across series would count the node twice. The check runs the rules
# with the real PromQL engine (`promtool test rules`, from Prometheus's own package, which the
# local cluster needs anyway) over series shaped as each scrape configuration labels them.

NODE_IP = "10.0.0.7"
# A plain job (a file_sd or static target, as dev/localcluster/prometheus.py scrapes it).
PLAIN = {"job": "node-exporter", "instance": f"{NODE_IP}:9100"}
WITH_NODE = {**PLAIN, "node": "node-a"}
# The Prometheus community Helm chart's `kubernetes-service-endpoints` job: the endpoint's
# address as instance (node-exporter runs on the host network), the Service's labels, its
# namespace and name, and `node` from the pod's node name.
SERVICE_ENDPOINTS = {
    "job": "kubernetes-service-endpoints",
    "instance": f"{NODE_IP}:9100",
    "app_kubernetes_io_name": "prometheus-node-exporter",
    "namespace": "monitoring",
    "service": "prometheus-node-exporter",
    "node": "node-a",
}
# kube-prometheus's node-exporter ServiceMonitor: `instance` relabelled to the pod's node name,
# plus the labels the Prometheus Operator adds to every ServiceMonitor target.
SERVICE_MONITOR = {
    "job": "node-exporter",
    "instance": "node-a",
    "namespace": "monitoring",
    "service": "node-exporter",
    "endpoint": "https",
    "pod": "node-exporter-x7k2p",
    "container": "kube-rbac-proxy",
}
TWO_JOBS = {
    "a second job with a node label": (PLAIN, SERVICE_ENDPOINTS),
    "two jobs with the same instance and node": (WITH_NODE, SERVICE_ENDPOINTS),
    "kube-prometheus beside a plain job": (PLAIN, SERVICE_MONITOR),
}

# What the node-exporter says: 2 CPUs each idle a quarter of the time, 4 GiB of 16 GiB
# available, 300 MiB free plus 100 MiB of inactive file pages.
IDLE_PER_SECOND = 0.25
MIB = 2**20
MEMORY = {
    "node_memory_MemTotal_bytes": 16 * 1024 * MIB,
    "node_memory_MemAvailable_bytes": 4 * 1024 * MIB,
    "node_memory_MemFree_bytes": 300 * MIB,
    "node_memory_Inactive_file_bytes": 100 * MIB,
}
# What each rule must read for that node, one job or two.
EXPECTED = {"cpu-usage": 75.0, "memory-usage": 75.0, "memory-available": 400.0 * MIB}


def selector(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def promtool_check(
    rules: Sequence[Rule], jobs: Sequence[dict[str, str]], step: int, *, young: int = 0
) -> str:
    """``promtool test rules`` asserting that every series each rule yields reads the expected
    value (the smallest and the largest: label-nodes takes the one nearest pressure). With
    ``young``, the series began only ``young`` scrapes before the evaluation (a node just
    added), their counters at what a machine up for days has. Returns promtool's output;
    raises AssertionError with it when a value is wrong."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    samples = 40
    # Missing samples (`_`) until the series begins.
    gap = f"_x{samples - young} " if young else ""
    count = young if young else samples
    series = []
    for job in jobs:
        for cpu in ("0", "1"):
            # node-exporter's modes: the busy time here is all user time.
            for mode, share in (("idle", IDLE_PER_SECOND), ("user", 1 - IDLE_PER_SECOND)):
                labels = {**job, "cpu": cpu, "mode": mode}
                start = 86_400 * share if young else 0
                series.append(
                    {
                        "series": "node_cpu_seconds_total" + selector(labels),
                        "values": f"{gap}{start:g}+{share * step:g}x{count}",
                    }
                )
        for name, value in MEMORY.items():
            series.append({"series": name + selector(job), "values": f"{gap}{value}x{count}"})
    checks = [
        {
            "expr": f"{aggregate}({rule.expr})",
            "eval_time": f"{samples * step}s",
            "exp_samples": [{"labels": "{}", "value": EXPECTED[rule.name]}],
        }
        for rule in rules
        for aggregate in ("min", "max")
    ]
    document = {
        "rule_files": [],
        "evaluation_interval": f"{step}s",
        "tests": [{"interval": f"{step}s", "input_series": series, "promql_expr_test": checks}],
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "two-jobs.yaml"
        path.write_text(yaml.safe_dump(document))
        done = subprocess.run(
            [promtool, "test", "rules", str(path)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


STACK_RULES = Path(__file__).resolve().parents[2] / "dev" / "stack" / "pressure-rules.yaml"


@pytest.mark.parametrize("jobs", TWO_JOBS.values(), ids=TWO_JOBS.keys())
def test_the_built_in_rules_read_a_node_scraped_by_two_jobs_as_once(
    jobs: tuple[dict[str, str], dict[str, str]],
) -> None:
    # One job first: the expected values are the node's own.
    promtool_check(DEFAULT_RULES, jobs[:1], step=15)
    promtool_check(DEFAULT_RULES, jobs, step=15)


@pytest.mark.parametrize("scrapes", [2, 3, 4, 8])
def test_the_built_in_rules_read_a_node_just_added_as_it_is(scrapes: int) -> None:
    # Its series began 15 to 105 s ago, inside the CPU rule's two-minute window. Idle time over
    # the window's length read this node (75 % busy) as 94 % busy after two scrapes.
    promtool_check(DEFAULT_RULES, [WITH_NODE], step=15, young=scrapes)


def test_the_young_series_check_catches_idle_time_over_the_windows_length() -> None:
    over_window = replace(
        CPU_USAGE,
        expr='100 * (1 - avg by (node, instance) (rate(node_cpu_seconds_total{mode="idle"}[2m])))',
    )
    promtool_check([over_window], [WITH_NODE], step=15)
    with pytest.raises(AssertionError, match="cpu_seconds_total"):
        promtool_check([over_window], [WITH_NODE], step=15, young=3)


@pytest.mark.parametrize("jobs", TWO_JOBS.values(), ids=TWO_JOBS.keys())
def test_the_local_stacks_rules_read_a_node_scraped_by_two_jobs_as_once(
    jobs: tuple[dict[str, str], dict[str, str]],
) -> None:
    # Its CPU window is 10 s: the local Prometheus scrapes every second.
    promtool_check(load_rules(STACK_RULES), jobs, step=1)


def test_the_two_job_check_catches_a_rule_that_adds_the_jobs_up() -> None:
    # The shape of defect 11: a sum by (instance, node) is right for one job and counts the
    # node twice when two jobs with the same instance and node scrape it (800 MiB for 400).
    summed = replace(
        MEMORY_AVAILABLE,
        expr="sum by (node, instance) "
        "(node_memory_MemFree_bytes + node_memory_Inactive_file_bytes)",
    )
    promtool_check([summed], [WITH_NODE], step=15)
    with pytest.raises(AssertionError, match=r"got: \{\} 8\.388608E\+08"):
        promtool_check([summed], TWO_JOBS["two jobs with the same instance and node"], step=15)


def test_the_installs_rule_file_is_the_built_in_rules() -> None:
    # knative/label-nodes.yaml mounts its rules from a ConfigMap: what is tested above is what
    # an install reads.
    manifest = Path(__file__).resolve().parents[2] / "knative" / "label-nodes.yaml"
    config_map = next(
        d
        for d in yaml.safe_load_all(manifest.read_text())
        if d and d.get("kind") == "ConfigMap" and d["metadata"]["name"] == "label-nodes-rules"
    )
    assert parse_rules(yaml.safe_load(config_map["data"]["rules.yaml"])) == DEFAULT_RULES
