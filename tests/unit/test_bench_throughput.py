"""The throughput bench compares like with like: the usage it writes lets score-nodes pass every
node (so the extender filters nothing out), the second scheduler without the extender differs
from the shipped one by its extenders only, all three schedulers share one clientConnection, and
the figures it reports are the medians and ratios of what it timed."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dev.bench import report
from dev.bench.__main__ import main
from dev.bench.extender import node_object
from dev.bench.throughput import (
    CLIENTS,
    FULL_SIZES,
    QUICK_SIZES,
    extender_calls,
    extender_decisions,
    pod,
    pods_per_second,
    second_scheduler_config,
    summarise,
    usage_record,
)
from dev.stack.up import load_aware_scheduler_config
from shared.api.keys import LOAD_AWARE_SCHEDULER_NAME
from shared.nodes.score_nodes import decide as extender
from shared.nodes.score_nodes.handler import parse_args
from shared.platform.config import Config

NOW = datetime(2026, 11, 23, 18, 0, tzinfo=UTC)
URL = "http://127.0.0.1:8080"


@pytest.mark.parametrize("nodes", [QUICK_SIZES.nodes, FULL_SIZES.nodes])
def test_every_node_passes_the_filter_and_the_scores_vary(nodes: int) -> None:
    # What the second scheduler sends for one of the bench's pods (nodeCacheCapable false).
    body = {
        "Pod": pod("p1-0", LOAD_AWARE_SCHEDULER_NAME),
        "Nodes": {
            "metadata": {},
            "items": [node_object(i, usage_record(i, NOW)) for i in range(nodes)],
        },
        "NodeNames": None,
    }
    args = parse_args(json.dumps(body).encode())
    assert args.nodes is not None and len(args.nodes) == nodes
    verdicts = extender.filter_nodes(args.pod, args.nodes, Config(), NOW).verdicts
    assert {v.reason for v in verdicts} == {extender.FITS}
    scores = extender.prioritize(args.pod, args.nodes, Config(), NOW).scores
    assert {s.reason for s in scores} == {extender.SCORED}
    assert len({s.score for s in scores}) > 1


def test_the_usage_record_is_the_one_annotate_usage_writes_and_fresh() -> None:
    record = json.loads(usage_record(3, NOW))
    assert record["sampledAt"].startswith("2026-11-23T18:00:00")
    assert record["cpu"]["max1h"] < Config().cpu_threshold
    assert record["memory"]["max1h"] < Config().memory_threshold


def test_the_second_scheduler_without_the_extender_differs_only_by_its_extenders() -> None:
    client = CLIENTS["raised"]
    with_it = second_scheduler_config(URL, client, extender=True)
    without = second_scheduler_config(URL, client, extender=False)
    assert with_it["extenders"][0]["urlPrefix"] == URL
    assert "extenders" not in without
    assert {k: v for k, v in with_it.items() if k != "extenders"} == without
    shipped = load_aware_scheduler_config(URL)
    assert with_it == {**shipped, "clientConnection": {"qps": 2000, "burst": 4000}}
    assert [p["schedulerName"] for p in without["profiles"]] == [LOAD_AWARE_SCHEDULER_NAME]


def test_whole_nodes_differ_from_the_shipped_configuration_by_node_cache_capable_only() -> None:
    client = CLIENTS["defaults"]
    names = second_scheduler_config(URL, client, extender=True)
    objects = second_scheduler_config(URL, client, extender=True, node_cache=False)
    assert names["extenders"][0]["nodeCacheCapable"] is True
    assert objects["extenders"][0]["nodeCacheCapable"] is False
    objects["extenders"][0]["nodeCacheCapable"] = True
    assert objects == names


def test_the_extenders_decisions_are_read_by_verb_and_reason() -> None:
    exposition = (
        'knr_extender_node_decisions_total{verb="filter",reason="fits"} 40.0\n'
        'knr_extender_node_decisions_total{verb="filter",reason="cpu-over-threshold"} 2.0\n'
        'knr_extender_node_decisions_total{verb="prioritize",reason="scored"} 40.0\n'
    )
    assert extender_decisions(exposition) == {
        "filter/fits": 40,
        "filter/cpu-over-threshold": 2,
        "prioritize/scored": 40,
    }


@pytest.mark.parametrize(
    ("scheduler", "expected"),
    [(None, None), (LOAD_AWARE_SCHEDULER_NAME, LOAD_AWARE_SCHEDULER_NAME)],
)
def test_a_pod_names_the_second_scheduler_only_when_asked(
    scheduler: str | None, expected: str | None
) -> None:
    body = pod("p1-0", scheduler)
    assert body["spec"].get("schedulerName") == expected
    assert body["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "10m",
        "memory": "16Mi",
    }


@pytest.mark.parametrize(
    ("pods", "seconds", "rate"), [(200, 4.0, 50.0), (200, 1.6, 125.0), (20, 0.3, 66.67)]
)
def test_throughput_is_pods_over_the_seconds_until_all_are_bound(
    pods: int, seconds: float, rate: float
) -> None:
    assert pods_per_second(pods, seconds) == rate


def test_a_batch_bound_in_no_time_is_an_error() -> None:
    with pytest.raises(ValueError):
        pods_per_second(200, 0.0)


def test_the_summary_is_the_median_per_scheduler_and_the_ratios() -> None:
    out = summarise(
        {
            "default": [100.0, 120.0, 110.0],
            "extender": [60.0, 50.0, 55.0],
            "second-no-extender": [90.0, 110.0, 100.0],
        }
    )
    assert out["default"]["median_pods_per_s"] == 110.0
    assert out["extender"]["median_pods_per_s"] == 55.0
    assert out["extender"]["pods_per_s"] == [60.0, 50.0, 55.0]
    assert out["ratio_extender_to_second_no_extender"] == 0.55
    assert out["ratio_extender_to_default"] == 0.5


def test_the_table_has_a_row_per_client_setting_in_the_schedulers_order(tmp_path: Path) -> None:
    setting = summarise(
        {
            "default": [110.0],
            "extender": [95.0],
            "extender-objects": [30.0],
            "second-no-extender": [100.0],
        }
    )
    setting["client_connection"] = {"qps": 50, "burst": 100}
    measured = {
        "nodes": 20,
        "pods_per_round": 200,
        "rounds": 5,
        "warmup_rounds": 1,
        "settings": {"defaults": setting},
    }
    lines = report.throughput_section(measured)
    assert "| defaults (50 / 100) | 110.0 | 100.0 | 95.0 | 30.0 | 0.95 | 0.30 | 0.86 |" in lines
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"measurements": {"throughput": measured}}))
    assert report.main(["--throughput", str(path)]) == 0


def test_the_throughput_part_is_named_with_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--only", "throughput", "--systems", "vanilla"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--systems needs --only recovery" in error
    assert "invalid choice" not in error


# score-nodes' /metrics page as prometheus_client writes it (one gunicorn process).
EXPOSITION = """\
# HELP knr_extender_requests_total Calls from kube-scheduler to score-nodes.
# TYPE knr_extender_requests_total counter
knr_extender_requests_total{code="200",verb="filter"} 240.0
knr_extender_requests_total{code="200",verb="prioritize"} 238.0
knr_extender_requests_total{code="400",verb="filter"} 2.0
# HELP knr_extender_requests_created Calls from kube-scheduler to score-nodes.
# TYPE knr_extender_requests_created gauge
knr_extender_requests_created{code="200",verb="filter"} 1.7954609892125034e+09
# HELP knr_extender_node_decisions_total Nodes judged by score-nodes.
# TYPE knr_extender_node_decisions_total counter
knr_extender_node_decisions_total{reason="fits",verb="filter"} 4800.0
"""


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        (EXPOSITION, {"filter": 240, "prioritize": 238}),
        ("", {}),
    ],
)
def test_the_extender_calls_are_the_answered_ones_per_verb(
    page: str, expected: dict[str, int]
) -> None:
    assert extender_calls(page) == expected
