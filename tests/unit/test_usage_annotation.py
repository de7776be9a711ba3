"""What annotate-usage writes on a Node: the record, the load bucket and when it writes at all.

Nodes are shaped as the API server returns them (tests/unit/nodes.py: 4 CPUs and 16283444Ki
allocatable); measurements are cores and bytes, as the sources give them.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.api.keys import (
    LOAD_LABEL,
    MAINTENANCE_LABEL,
    NODE_OPT_OUT_LABEL,
    USAGE_ANNOTATION,
)
from shared.api.usage import Estimate, Reading, UsageRecord
from shared.nodes.annotate_usage.decide import Measured, bucket_for, decide_node, to_record
from shared.nodes.usage import allocatable
from shared.platform.config import Config
from tests.unit.nodes import node

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
CFG = Config()
MEMORY = 16283444 * 1024  # the test node's allocatable memory, bytes


def measured(cpu: float, memory: float) -> Measured:
    """A measurement of ``cpu`` and ``memory`` percent of the test node's allocatable."""
    return Measured(cpu_cores=4 * cpu / 100, memory_bytes=MEMORY * memory / 100)


def record(
    cpu: float, memory: float, *, at: datetime = NOW, guess: Estimate | None = None
) -> UsageRecord:
    return UsageRecord(
        sampled_at=at,
        source="prometheus",
        cpu=Reading(now=cpu),
        memory=Reading(now=memory),
        estimate=guess or Estimate(),
    )


def carrying(
    usage: UsageRecord | str | None = None, bucket: str | None = None, **labels: str
) -> dict[str, Any]:
    annotations = {}
    if usage is not None:
        annotations[USAGE_ANNOTATION] = usage if isinstance(usage, str) else usage.to_json()
    all_labels = dict(labels)
    if bucket is not None:
        all_labels[LOAD_LABEL] = bucket
    return node("node-1", labels=all_labels, annotations=annotations)


def decide(
    n: dict[str, Any],
    m: Measured | None,
    *,
    guess: Estimate | None = None,
    now: datetime = NOW,
    cfg: Config = CFG,
) -> Any:
    return decide_node(n, m, allocatable(n), guess or Estimate(), "prometheus", cfg, now)


def test_usage_is_recorded_as_percent_of_the_nodes_allocatable() -> None:
    n = node()
    capacity = allocatable(n)
    assert capacity is not None
    got = to_record(
        Measured(cpu_cores=1.0, memory_bytes=MEMORY / 4, cpu_cores_avg5m=2.0, cpu_cores_max1h=3.0),
        capacity,
        Estimate(),
        "prometheus",
        NOW,
    )
    assert (got.cpu.now, got.cpu.avg5m, got.cpu.max1h) == (25.0, 50.0, 75.0)
    assert got.memory.now == pytest.approx(25.0)
    assert got.memory.avg5m is None and got.memory.max1h is None
    assert UsageRecord.from_json(got.to_json()) == replace(
        got, memory=Reading(now=round(got.memory.now, 1))
    )


@pytest.mark.parametrize(
    ("cpu", "memory", "previous", "expected"),
    [
        (10, 10, None, "low"),
        (29.9, 5, None, "low"),
        (30, 5, None, "medium"),
        (5, 61, None, "high"),
        (81, 5, None, "overloaded"),
        (5, 80, None, "overloaded"),
        # Rising is immediate, from any bucket.
        (65, 10, "low", "high"),
        # Falling needs the usage load_hysteresis (5) points below the boundary it crossed.
        (57, 10, "high", "high"),
        (54.9, 10, "high", "medium"),
        (77, 10, "overloaded", "overloaded"),
        (74, 10, "overloaded", "high"),
        (27, 10, "medium", "medium"),
        (24, 10, "medium", "low"),
        # From overloaded straight to low when the usage fell that far.
        (3, 3, "overloaded", "low"),
        # The higher resource decides, hysteresis included.
        (10, 57, "high", "high"),
        # A label we do not know is no bucket: the usage alone decides.
        (10, 10, "bogus", "low"),
    ],
)
def test_the_bucket_rises_at_once_and_falls_with_hysteresis(
    cpu: float, memory: float, previous: str | None, expected: str
) -> None:
    assert bucket_for(record(cpu, memory), previous, CFG) == expected


def test_just_bound_pods_count_toward_the_bucket() -> None:
    assert (
        bucket_for(record(20, 10, guess=Estimate(cpu=15.0, memory=1.0, pods=3)), None, CFG)
        == "medium"
    )


def test_a_node_in_maintenance_is_overloaded_whatever_its_usage() -> None:
    assert bucket_for(record(1, 1), "low", CFG, maintenance=True) == "overloaded"
    decision = decide(carrying(None, **{MAINTENANCE_LABEL: "true"}), None)
    assert (decision.bucket, decision.write) == ("overloaded", True)


def test_a_first_sample_writes_the_record_and_the_bucket() -> None:
    decision = decide(carrying(), measured(40, 20))
    assert decision.write and decision.reason == "first sample"
    assert decision.bucket == "medium"
    patch = decision.patch()
    assert patch["metadata"]["labels"] == {LOAD_LABEL: "medium"}
    written = UsageRecord.from_json(patch["metadata"]["annotations"][USAGE_ANNOTATION])
    assert written.cpu.now == 40.0 and written.sampled_at == NOW


def test_a_move_within_the_tolerance_writes_nothing() -> None:
    decision = decide(carrying(record(40, 20), "medium"), measured(41.5, 21))
    assert not decision.write
    assert decision.reason == "within tolerance"


def test_a_move_beyond_the_tolerance_is_written() -> None:
    decision = decide(carrying(record(40, 20), "medium"), measured(42.5, 20))
    assert decision.write
    assert "cpu moved 40.0 -> 42.5" in decision.reason


def test_a_new_estimate_is_written_even_when_usage_holds() -> None:
    decision = decide(
        carrying(record(40, 20), "medium"),
        measured(40, 20),
        guess=Estimate(cpu=1.0, memory=0.5, pods=1),
    )
    assert decision.write
    assert "recently bound pods 0 -> 1" in decision.reason


def test_a_bucket_change_is_written_even_within_the_tolerance() -> None:
    decision = decide(carrying(record(29, 20), "low"), measured(30.5, 20))
    assert (decision.write, decision.bucket) == (True, "medium")


def test_a_quiet_record_is_renewed_before_it_could_look_stale() -> None:
    older = NOW - CFG.usage_stale_after / 2
    assert decide(carrying(record(40, 20, at=older), "medium"), measured(40, 20)).write
    recent = NOW - CFG.usage_stale_after / 4
    assert not decide(carrying(record(40, 20, at=recent), "medium"), measured(40, 20)).write


def test_without_a_measurement_a_fresh_record_holds_its_bucket() -> None:
    decision = decide(carrying(record(40, 20, at=NOW - timedelta(minutes=1)), "medium"), None)
    assert (decision.write, decision.bucket) == (False, "medium")


def test_without_a_measurement_a_stale_records_bucket_is_removed() -> None:
    stale = NOW - CFG.usage_stale_after - timedelta(seconds=1)
    decision = decide(carrying(record(90, 20, at=stale), "overloaded"), None)
    assert (decision.write, decision.bucket) == (True, None)
    assert decision.patch() == {"metadata": {"labels": {LOAD_LABEL: None}}}


def test_without_a_measurement_nothing_is_written_on_a_node_without_a_bucket() -> None:
    assert not decide(carrying(), None).write


def test_an_opted_out_node_loses_its_record_and_bucket() -> None:
    decision = decide(carrying(record(40, 20), "medium", **{NODE_OPT_OUT_LABEL: "true"}), None)
    assert decision.write
    assert decision.patch() == {
        "metadata": {"labels": {LOAD_LABEL: None}, "annotations": {USAGE_ANNOTATION: None}}
    }
    untouched = decide(carrying(**{NODE_OPT_OUT_LABEL: "true"}), measured(40, 20))
    assert not untouched.write


def test_an_unreadable_record_is_replaced() -> None:
    decision = decide(carrying("{not json", "low"), measured(40, 20))
    assert (decision.write, decision.reason) == (True, "unreadable record replaced")


def test_a_node_without_readable_allocatable_gets_no_record() -> None:
    n = carrying()
    n["status"]["allocatable"] = {"pods": "110"}
    decision = decide_node(n, measured(40, 20), None, Estimate(), "prometheus", CFG, NOW)
    assert decision.record is None and not decision.write
