"""The pressure rule file: what it may say, the defaults, and the errors a bad file gives."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from shared.platform.config import ConfigError
from shared.pressure.rules import (
    DEFAULT_RULES,
    Fires,
    Rule,
    RulesError,
    load_rules,
    parse_rules,
)

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
