"""The usage record on a Node and the requests behind its estimate.

Pods are shaped as the API server returns them (tests/unit/pods.py), Nodes as a kubelet
registers them (tests/unit/nodes.py: 4 CPUs, 16283444Ki allocatable memory). Requests follow
k8s.io/component-helpers resource.PodRequests, which is what the scheduler places against.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from shared.api import quantity
from shared.api.keys import USAGE_ANNOTATION
from shared.api.kubetypes import Node, Pod
from shared.api.usage import Estimate, Reading, UsageError, UsageRecord, read_usage
from shared.nodes.usage import (
    Resources,
    allocatable,
    estimate,
    percent_of,
    pod_requests,
    scheduled_at,
)
from tests.unit.nodes import node
from tests.unit.pods import pod, ts

SAMPLED = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
NODE_ALLOCATABLE = Resources(cpu_millis=4000, memory_bytes=16283444 * 1024)
Mi = 2**20


def container(name: str, cpu: str | None, memory: str | None, **extra: Any) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    out: dict[str, Any] = {
        "name": name,
        "image": f"registry.example.com/{name}:1",
        "resources": {"requests": requests} if requests else {},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    out.update(extra)
    return out


def with_spec(**spec: Any) -> Pod:
    """A running pod of a ReplicaSet with its spec fields replaced."""
    p = cast(dict[str, Any], pod())
    p["spec"].update(copy.deepcopy(spec))
    return cast(Pod, p)


# -- pod_requests ---------------------------------------------------------------------------------

APP = container("app", "100m", "256Mi")
SIDECAR = container("log-shipper", "50m", "32Mi", restartPolicy="Always")
MIGRATE = container("migrate", "500m", "64Mi")


@pytest.mark.parametrize(
    ("spec", "cpu", "memory"),
    [
        pytest.param({}, 100, 256 * Mi, id="the helper's one container: 100m, 256Mi"),
        pytest.param(
            {"containers": [APP, container("cache", "0.25", "1Gi")]},
            350,
            256 * Mi + 1024 * Mi,
            id="containers add up",
        ),
        pytest.param(
            {"containers": [container("app", None, None)]},
            0,
            0,
            id="a best-effort pod requests nothing",
        ),
        pytest.param(
            {"containers": [APP], "initContainers": [container("warm", "1", "128Mi")]},
            1000,
            256 * Mi,
            id="an init container larger than the app raises that resource only",
        ),
        pytest.param(
            {"containers": [APP], "initContainers": [SIDECAR, MIGRATE]},
            550,
            288 * Mi,
            id="a sidecar runs beside the app and beside the init containers after it",
        ),
        pytest.param(
            {"containers": [APP], "initContainers": [MIGRATE, SIDECAR]},
            500,
            288 * Mi,
            id="an init container before the sidecar runs without it",
        ),
        pytest.param(
            {"containers": [APP], "overhead": {"cpu": "250m", "memory": "120Mi"}},
            350,
            376 * Mi,
            id="the RuntimeClass overhead is added",
        ),
        pytest.param(
            {"containers": [APP], "resources": {"requests": {"cpu": "2"}}},
            2000,
            256 * Mi,
            id="pod-level requests replace the containers' where set",
        ),
        pytest.param(
            {
                "containers": [APP],
                "resources": {"requests": {"cpu": "2", "memory": "1Gi"}},
                "overhead": {"cpu": "100m", "memory": "0"},
            },
            2100,
            1024 * Mi,
            id="pod-level requests plus the overhead",
        ),
    ],
)
def test_pod_requests_are_counted_as_the_scheduler_counts_them(
    spec: dict[str, Any], cpu: int, memory: int
) -> None:
    assert pod_requests(with_spec(**spec)) == Resources(cpu, memory)


def test_a_request_that_is_not_a_quantity_is_an_error() -> None:
    with pytest.raises(quantity.QuantityError):
        pod_requests(with_spec(containers=[container("app", "lots", None)]))


# -- allocatable ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"cpu": "4", "memory": "16283444Ki", "pods": "110"}, NODE_ALLOCATABLE),
        ({"cpu": "7800m", "memory": "32158316Ki"}, Resources(7800, 32158316 * 1024)),
        ({"cpu": "4"}, None),
        ({"cpu": "0", "memory": "1Gi"}, None),
        ({"cpu": "four", "memory": "1Gi"}, None),
        ({}, None),
    ],
)
def test_a_nodes_allocatable(values: dict[str, str], expected: Resources | None) -> None:
    n = node()
    n["status"]["allocatable"] = values
    assert allocatable(cast(Node, n)) == expected


def test_requests_as_percent_of_allocatable() -> None:
    assert percent_of(Resources(1000, 16283444 * 1024 // 4), NODE_ALLOCATABLE) == (25.0, 25.0)


# -- the record -----------------------------------------------------------------------------------


def test_a_record_round_trips_through_its_annotation_text() -> None:
    record = UsageRecord(
        sampled_at=SAMPLED,
        source="prometheus",
        cpu=Reading(now=42.5, avg5m=40.1, max1h=77.0),
        memory=Reading(now=61.2, avg5m=60.0, max1h=63.4),
        estimate=Estimate(cpu=5.0, memory=3.2, pods=2),
    )
    text = record.to_json()
    assert json.loads(text) == {
        "v": 1,
        "sampledAt": "2026-11-23T10:00:00Z",
        "source": "prometheus",
        "cpu": {"now": 42.5, "avg5m": 40.1, "max1h": 77.0},
        "memory": {"now": 61.2, "avg5m": 60.0, "max1h": 63.4},
        "estimate": {"cpu": 5.0, "memory": 3.2, "pods": 2},
    }
    assert UsageRecord.from_json(text) == record
    assert record.estimated_cpu == pytest.approx(47.5)
    assert record.estimated_memory == pytest.approx(64.4)


def test_a_record_without_an_estimate_writes_none_and_reads_back_a_zero_estimate() -> None:
    record = UsageRecord(SAMPLED, "metrics-api", Reading(now=10.0), Reading(now=20.0))
    assert "estimate" not in json.loads(record.to_json())
    back = UsageRecord.from_json(record.to_json())
    assert back == record
    assert (back.estimated_cpu, back.estimated_memory) == (10.0, 20.0)


GOOD: dict[str, Any] = {
    "v": 1,
    "sampledAt": "2026-11-23T10:00:00Z",
    "source": "prometheus",
    "cpu": {"now": 42.5},
    "memory": {"now": 61.2},
}


def changed(**fields: Any) -> str:
    out = copy.deepcopy(GOOD)
    for key, value in fields.items():
        if value is None:
            out.pop(key)
        else:
            out[key] = value
    return json.dumps(out)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("not json", id="not JSON"),
        pytest.param("[]", id="not an object"),
        pytest.param(changed(v=2), id="another version"),
        pytest.param(changed(v=None), id="no version"),
        pytest.param(changed(sampledAt=None), id="no time"),
        pytest.param(changed(sampledAt="2026-11-23T10:00:00"), id="a time without a zone"),
        pytest.param(changed(sampledAt="yesterday"), id="not a time"),
        pytest.param(changed(cpu=None), id="no CPU reading"),
        pytest.param(changed(cpu={"now": "42"}), id="a percentage as a string"),
        pytest.param(changed(cpu={"now": True}), id="a percentage as a boolean"),
        pytest.param(changed(memory={"now": -1}), id="a negative percentage"),
        pytest.param(
            '{"v":1,"sampledAt":"2026-11-23T10:00:00Z","cpu":{"now":NaN},"memory":{"now":1}}',
            id="NaN",
        ),
        pytest.param(changed(estimate={"cpu": 1, "memory": 1, "pods": -1}), id="negative pods"),
        pytest.param(changed(estimate={"cpu": 1, "memory": 1, "pods": True}), id="pods a bool"),
        pytest.param(changed(estimate=[1, 2]), id="an estimate that is not an object"),
    ],
)
def test_a_malformed_record_is_refused(text: str) -> None:
    with pytest.raises(UsageError):
        UsageRecord.from_json(text)


def test_read_usage_finds_the_record_on_a_node_or_none() -> None:
    assert read_usage(cast(Node, node())) is None
    annotated = node(annotations={USAGE_ANNOTATION: json.dumps(GOOD)})
    record = read_usage(cast(Node, annotated))
    assert record is not None and record.cpu.now == 42.5
    with pytest.raises(UsageError):
        read_usage(cast(Node, node(annotations={USAGE_ANNOTATION: "{"})))


@pytest.mark.parametrize(
    ("age", "stale"),
    [
        (timedelta(seconds=0), False),
        (timedelta(minutes=2, seconds=59), False),
        (timedelta(minutes=3), False),
        (timedelta(minutes=3, seconds=1), True),
        (timedelta(hours=2), True),
        # A sample "from the future": the annotator's clock is ahead of ours.
        (timedelta(seconds=-30), False),
        (timedelta(minutes=-5), True),
    ],
)
def test_a_record_is_stale_beyond_the_limit_either_way(age: timedelta, stale: bool) -> None:
    record = UsageRecord(SAMPLED, "prometheus", Reading(now=1.0), Reading(now=1.0))
    assert record.is_stale(SAMPLED + age, timedelta(minutes=3)) is stale


# -- the estimate ---------------------------------------------------------------------------------


def bound_at(moment: datetime | None, *, phase: str = "Running", **kwargs: Any) -> Pod:
    """A pod whose PodScheduled condition is as the scheduler's binding leaves it."""
    conditions: list[dict[str, Any]] = []
    if moment is not None:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": ts(moment),
            }
        )
    return pod(phase=phase, conditions=conditions, **kwargs)


UNSCHEDULABLE = pod(
    node=None,
    phase="Pending",
    started=None,
    conditions=[
        {
            "type": "PodScheduled",
            "status": "False",
            "lastProbeTime": None,
            "lastTransitionTime": ts(SAMPLED - timedelta(seconds=5)),
            "reason": "Unschedulable",
            "message": "0/4 nodes are available: 4 Insufficient cpu.",
        }
    ],
)


@pytest.mark.parametrize(
    ("pods", "factor", "expected"),
    [
        pytest.param([], 1.0, Estimate(), id="no pods"),
        pytest.param(
            [bound_at(SAMPLED - timedelta(seconds=20))],
            1.0,
            Estimate(cpu=2.5, memory=100 * 256 * Mi / NODE_ALLOCATABLE.memory_bytes, pods=1),
            id="a pod bound 20 s before the sample counts",
        ),
        pytest.param(
            [
                bound_at(SAMPLED - timedelta(seconds=20)),
                bound_at(SAMPLED + timedelta(seconds=10)),
            ],
            1.0,
            Estimate(cpu=5.0, memory=100 * 512 * Mi / NODE_ALLOCATABLE.memory_bytes, pods=2),
            id="and one bound after it",
        ),
        pytest.param(
            [bound_at(SAMPLED - timedelta(minutes=2))],
            1.0,
            Estimate(),
            id="a pod bound before the window shows in the usage already",
        ),
        pytest.param(
            [bound_at(SAMPLED - timedelta(seconds=60))],
            1.0,
            Estimate(),
            id="the window's edge is outside it",
        ),
        pytest.param(
            [bound_at(SAMPLED - timedelta(seconds=5), phase="Succeeded")],
            1.0,
            Estimate(),
            id="a finished pod uses nothing",
        ),
        pytest.param(
            [bound_at(SAMPLED - timedelta(seconds=5), deleting=True)],
            1.0,
            Estimate(),
            id="a pod being deleted is leaving",
        ),
        pytest.param([UNSCHEDULABLE], 1.0, Estimate(), id="a pod not scheduled"),
        pytest.param(
            [bound_at(None)], 1.0, Estimate(), id="a pod without a PodScheduled condition"
        ),
        pytest.param(
            [bound_at(SAMPLED - timedelta(seconds=20))],
            2.0,
            Estimate(cpu=5.0, memory=100 * 512 * Mi / NODE_ALLOCATABLE.memory_bytes, pods=1),
            id="the factor scales the requests",
        ),
    ],
)
def test_the_estimate_counts_pods_bound_within_the_window(
    pods: list[Pod], factor: float, expected: Estimate
) -> None:
    got = estimate(pods, NODE_ALLOCATABLE, SAMPLED, timedelta(minutes=1), factor)
    assert got.pods == expected.pods
    assert got.cpu == pytest.approx(expected.cpu)
    assert got.memory == pytest.approx(expected.memory)


def test_scheduled_at_reads_the_binding_time_and_ignores_a_false_condition() -> None:
    moment = SAMPLED - timedelta(seconds=7)
    assert scheduled_at(bound_at(moment)) == moment
    assert scheduled_at(UNSCHEDULABLE) is None
