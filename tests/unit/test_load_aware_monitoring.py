"""The load-aware alerts and dashboard: they parse, and every series they read is one the code
exports, with the labels it carries.

A rule on a metric nobody exports never fires: it is as good as no rule. So the names come from
the metric objects themselves (shared/platform/metrics.py and the load-aware modules), not from
a list kept beside them. ``promtool`` (Prometheus's own parser) checks the rule file's syntax
when it is installed (the local stack installs it with Prometheus).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram

from shared.nodes.annotate_usage import handler as annotator
from shared.nodes.rebalance_nodes import handler as rebalancer
from shared.nodes.score_nodes import handler as extender_http
from shared.platform import metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "knative" / "monitoring" / "prometheusrule.yaml"
DASHBOARD = ROOT / "knative" / "monitoring" / "load-aware-dashboard.json"
MODULES: tuple[ModuleType, ...] = (metrics, annotator, extender_http, rebalancer)

# Series of Prometheus itself (its scrape's `up`) and PromQL words, not metrics of ours.
_NOT_OURS = {"up", "sum", "max", "avg", "min", "by", "rate", "increase", "absent", "or", "le"}
_NAME = re.compile(r"\b([a-z_][a-z0-9_]*)\b\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'(\w+)\s*(?:=~|!~|!=|=)\s*"')


def exported() -> dict[str, set[str]]:
    """Every series name the functions export, with its labels."""
    series: dict[str, set[str]] = {}
    for module in MODULES:
        for value in vars(module).values():
            labels = set(getattr(value, "_labelnames", ()))
            if isinstance(value, Histogram):
                series[value._name + "_bucket"] = labels | {"le"}
                series[value._name + "_sum"] = labels
                series[value._name + "_count"] = labels
            elif isinstance(value, Counter):
                series[value._name + "_total"] = labels
            elif isinstance(value, Gauge):
                series[value._name] = labels
    return series


def series_in(expr: str, known: dict[str, set[str]]) -> set[str]:
    """The metric names ``expr`` reads; fails on a name or label matcher nobody exports."""
    # Strings (label values, durations in brackets) are not names.
    bare = re.sub(r"\[[^\]]*\]", "", expr)
    used = set()
    for name, selector in _NAME.findall(bare):
        if name in _NOT_OURS or not (_ours(name) or selector):
            continue
        assert name in known, f"{name} is exported by no function ({expr})"
        for label in _MATCHER.findall(selector or ""):
            assert label in known[name], f"{name} has no label {label} ({expr})"
        used.add(name)
    return used


def _ours(name: str) -> bool:
    return name.startswith(("knr_", "rescheduler_", "node_"))


def load_aware_rules() -> list[dict[str, Any]]:
    (rule,) = [d for d in yaml.safe_load_all(RULES.read_text()) if d]
    (group,) = [g for g in rule["spec"]["groups"] if g["name"] == "kn-rescheduler.load-aware"]
    rules: list[dict[str, Any]] = group["rules"]
    return rules


def test_the_load_aware_alerts_read_only_series_the_code_exports() -> None:
    known = exported()
    alerts = {r["alert"]: series_in(r["expr"], known) for r in load_aware_rules()}
    for r in load_aware_rules():
        assert r["labels"]["severity"] in {"info", "warning", "critical"}
        assert r["annotations"]["summary"] and r["annotations"]["description"]
    # The three the issue asks for: rebalancing too often, load imbalance, extender errors.
    assert "rescheduler_pod_evictions_total" in alerts["KnReschedulerRebalancingTooOften"]
    assert {"node_cpu_usage_percent", "node_memory_usage_percent"} <= alerts[
        "KnReschedulerLoadImbalance"
    ]
    assert "knr_extender_requests_total" in alerts["KnReschedulerExtenderErrors"]


def test_a_misspelt_series_or_label_is_caught() -> None:
    known = exported()
    with pytest.raises(AssertionError, match="exported by no function"):
        series_in('sum(rate(rescheduler_pod_eviction_total{result="evicted"}[5m]))', known)
    with pytest.raises(AssertionError, match="has no label node"):
        series_in('sum(rate(rescheduler_pod_evictions_total{node="a"}[5m]))', known)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_prometheus_parses_every_rule(tmp_path: Path) -> None:
    (rule,) = [d for d in yaml.safe_load_all(RULES.read_text()) if d]
    file = tmp_path / "rules.yaml"
    file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run(
        ["promtool", "check", "rules", str(file)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_is_grafana_json_on_exported_series_only() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = exported()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    used: set[str] = set()
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            used |= series_in(target["expr"], known)
    # Node usage, rebalancing and the extender each have their panels.
    assert {
        "node_cpu_usage_percent",
        "rescheduler_pod_evictions_total",
        "knr_rebalance_hot_nodes",
        "knr_extender_requests_total",
        "knr_extender_seconds_bucket",
    } <= used
