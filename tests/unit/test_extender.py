"""The extender's decisions: filter (thresholds, maintenance, predicted usage), prioritize
(weighted free capacity, the low-load bonus, the 0..10 range), and nodes whose usage cannot be
trusted (neither failed nor penalised).

Nodes are shaped as a kubelet registers them (tests/unit/nodes.py: 4 CPUs, 16283444Ki
allocatable) with the usage annotation annotate-usage writes; the pod is one the scheduler is
placing (pending, not bound yet), shaped as the API server returns it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from shared.constants import MAINTENANCE_LABEL, USAGE_ANNOTATION
from shared.loadaware import extender
from shared.loadaware.usage import Estimate, Reading, UsageRecord
from shared.platform.config import Config
from shared.platform.kubetypes import Node, Pod
from tests.unit.nodes import node
from tests.unit.pods import pod

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
CFG = Config()
Mi = 2**20
MEMORY = 16283444 * 1024


def usage(
    cpu: float,
    memory: float = 20.0,
    *,
    estimate: tuple[float, float] = (0.0, 0.0),
    age: timedelta = timedelta(seconds=20),
) -> str:
    guess = Estimate(cpu=estimate[0], memory=estimate[1], pods=1) if any(estimate) else Estimate()
    return UsageRecord(
        sampled_at=NOW - age,
        source="prometheus",
        cpu=Reading(now=cpu, avg5m=cpu, max1h=cpu),
        memory=Reading(now=memory, avg5m=memory, max1h=memory),
        estimate=guess,
    ).to_json()


def a_node(
    name: str = "node-1",
    annotation: str | None = None,
    *,
    labels: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
) -> Node:
    n = node(name, labels=labels, annotations={USAGE_ANNOTATION: annotation} if annotation else {})
    if allocatable is not None:
        n["status"]["allocatable"] = allocatable
    return cast(Node, n)


def pending(cpu: str = "100m", memory: str = "256Mi") -> Pod:
    """A pod the scheduler is placing: no node yet, requests ``cpu`` and ``memory``."""
    p = cast(dict[str, Any], pod("web-7d9c8b6f4-q8w2k", node=None, phase="Pending", started=None))
    p["status"] = {"phase": "Pending", "qosClass": "Burstable"}
    p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu, "memory": memory}
    return cast(Pod, p)


# -- filter ---------------------------------------------------------------------------------------

CPU_OVER = "node CPU usage over 80 percent"
MEMORY_OVER = "node memory usage over 80 percent"
CPU_PREDICTED = "node CPU usage with the pod would exceed 95 percent"
MEMORY_PREDICTED = "node memory usage with the pod would exceed 95 percent"


@pytest.mark.parametrize(
    ("n", "p", "passed", "reason", "message"),
    [
        pytest.param(a_node(annotation=usage(20, 30)), pending(), True, "fits", "fits", id="quiet"),
        pytest.param(
            a_node(annotation=usage(80, 80)),
            pending(),
            True,
            "fits",
            "fits",
            id="at 80 is not over",
        ),
        pytest.param(
            a_node(annotation=usage(80.1)),
            pending(),
            False,
            extender.CPU_OVER,
            CPU_OVER,
            id="CPU over the threshold",
        ),
        pytest.param(
            a_node(annotation=usage(20, 85)),
            pending(),
            False,
            extender.MEMORY_OVER,
            MEMORY_OVER,
            id="memory over the threshold",
        ),
        pytest.param(
            a_node(annotation=usage(90, 90)),
            pending(),
            False,
            extender.CPU_OVER,
            CPU_OVER,
            id="both over: one reason, CPU's, so that reasons stay countable",
        ),
        pytest.param(
            a_node(annotation=usage(70, estimate=(15, 0))),
            pending(),
            False,
            extender.CPU_OVER,
            CPU_OVER,
            id="measured 70 plus 15 of pods bound since: over (herding)",
        ),
        pytest.param(
            a_node(annotation=usage(20), labels={MAINTENANCE_LABEL: "true"}),
            pending(),
            False,
            extender.MAINTENANCE,
            "node in maintenance",
            id="maintenance",
        ),
        pytest.param(
            a_node(labels={MAINTENANCE_LABEL: "true"}),
            pending(),
            False,
            extender.MAINTENANCE,
            "node in maintenance",
            id="maintenance without any usage record",
        ),
        pytest.param(
            a_node(annotation=usage(20), labels={MAINTENANCE_LABEL: "false"}),
            pending(),
            True,
            "fits",
            "fits",
            id="maintenance label false",
        ),
        pytest.param(
            a_node(annotation=usage(79)),
            pending(cpu="1"),
            False,
            extender.CPU_PREDICTED_OVER,
            CPU_PREDICTED,
            id="79 plus a pod of 1 of 4 CPUs (25) would be 104",
        ),
        pytest.param(
            a_node(annotation=usage(45)),
            pending(cpu="2"),
            True,
            "fits",
            "fits",
            id="45 plus 2 of 4 CPUs (50) is 95: at the limit, not over",
        ),
        pytest.param(
            a_node(annotation=usage(20, 70)),
            pending(memory="8Gi"),
            False,
            extender.MEMORY_PREDICTED_OVER,
            MEMORY_PREDICTED,
            id="memory 70 plus 8Gi of 15.5Gi would be 121",
        ),
        pytest.param(
            a_node(annotation=usage(60, estimate=(10, 0))),
            pending(cpu="1"),
            True,
            "fits",
            "fits",
            id="60 plus 10 estimated plus 25 is 95",
        ),
        pytest.param(
            a_node(annotation=usage(79)),
            pending(cpu="lots"),
            True,
            "fits",
            "fits",
            id="a pod whose requests cannot be read adds nothing",
        ),
    ],
)
def test_filter(n: Node, p: Pod, passed: bool, reason: str, message: str) -> None:
    (verdict,) = extender.filter_nodes(p, [n], CFG, NOW).verdicts
    assert (verdict.passed, verdict.reason, verdict.message) == (passed, reason, message)


@pytest.mark.parametrize(
    ("n", "reason"),
    [
        pytest.param(a_node(), extender.NO_USAGE, id="no record"),
        pytest.param(
            a_node(annotation=usage(99, 99, age=timedelta(minutes=4))),
            extender.STALE_USAGE,
            id="a record older than usage_stale_after",
        ),
        pytest.param(
            a_node(annotation=usage(99, 99, age=-timedelta(minutes=4))),
            extender.STALE_USAGE,
            id="a record from a clock 4 minutes ahead",
        ),
        pytest.param(a_node(annotation="{oops"), extender.UNREADABLE_USAGE, id="not JSON"),
        pytest.param(
            a_node(annotation=json.dumps({"v": 7})), extender.UNREADABLE_USAGE, id="unknown version"
        ),
        pytest.param(
            a_node(annotation=usage(99, 99), allocatable={"pods": "110"}),
            extender.UNREADABLE_ALLOCATABLE,
            id="no CPU and memory allocatable",
        ),
        pytest.param(
            a_node(annotation=usage(99, 99), allocatable={"cpu": "x", "memory": "1Gi"}),
            extender.UNREADABLE_ALLOCATABLE,
            id="an allocatable that is not a quantity",
        ),
    ],
)
def test_a_node_whose_usage_cannot_be_trusted_passes_the_filter(n: Node, reason: str) -> None:
    (verdict,) = extender.filter_nodes(pending(cpu="3"), [n], CFG, NOW).verdicts
    assert verdict.passed
    assert verdict.reason == reason


def test_nodes_failing_for_one_cause_carry_one_text_so_the_scheduler_counts_them() -> None:
    nodes = [
        a_node("node-0", usage(91)),
        a_node("node-1", usage(85)),
        a_node("node-2", usage(20), labels={MAINTENANCE_LABEL: "true"}),
        a_node("node-3", usage(10)),
        a_node("node-4", usage(99)),
    ]
    result = extender.filter_nodes(pending(), nodes, CFG, NOW)
    assert result.passed == ("node-3",)
    assert result.failed == {
        "node-0": CPU_OVER,
        "node-1": CPU_OVER,
        "node-2": "node in maintenance",
        "node-4": CPU_OVER,
    }
    assert "%" not in "".join(result.failed.values())


def test_thresholds_come_from_the_configuration() -> None:
    cfg = replace(CFG, cpu_threshold=60.0, memory_threshold=70.5, predicted_usage_limit=90.0)
    result = extender.filter_nodes(
        pending(cpu="1.5"),  # 37.5 % of 4 CPUs
        [
            a_node("a", usage(61)),
            a_node("b", usage(20, 71)),
            a_node("c", usage(59)),
            a_node("d", usage(20, 20)),
        ],
        cfg,
        NOW,
    )
    assert result.failed == {
        "a": "node CPU usage over 60 percent",
        "b": "node memory usage over 70.5 percent",
        "c": "node CPU usage with the pod would exceed 90 percent",
    }


def test_the_pods_requests_are_counted_as_the_scheduler_counts_them() -> None:
    p = cast(dict[str, Any], pending(cpu="100m", memory="256Mi"))
    p["spec"]["initContainers"] = [
        {"name": "warm", "image": "busybox", "resources": {"requests": {"cpu": "3"}}}
    ]
    p["spec"]["overhead"] = {"cpu": "100m"}
    result = extender.filter_nodes(cast(Pod, p), [a_node(annotation=usage(20))], CFG, NOW)
    # 3 CPUs of init container plus 100m overhead: 77.5 % of 4 CPUs on top of 20.
    assert result.pod_requests.cpu_millis == 3100
    assert result.failed == {"node-1": CPU_PREDICTED}


# -- prioritize -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu", "memory", "estimate", "score"),
    [
        # (100 - cpu) * 0.5 + (100 - memory) * 0.5, + 10 when both < 30, * 10 / 110, rounded.
        (0, 0, (0, 0), 10),
        (10, 10, (0, 0), 9),
        (29.9, 29.9, (0, 0), 7),
        (30, 30, (0, 0), 6),
        (29, 31, (0, 0), 6),
        (50, 50, (0, 0), 5),
        (80, 20, (0, 0), 5),
        (90, 90, (0, 0), 1),
        (100, 100, (0, 0), 0),
        # Usage above allocatable (capacity is larger) is clamped, not negative.
        (104, 120, (0, 0), 0),
        # The estimate of pods bound since the sample counts like measured usage.
        (10, 10, (40, 40), 5),
    ],
)
def test_the_score_of_a_node(
    cpu: float, memory: float, estimate: tuple[float, float], score: int
) -> None:
    n = a_node(annotation=usage(cpu, memory, estimate=estimate))
    (got,) = extender.prioritize(pending(), [n], CFG, NOW).scores
    assert (got.score, got.reason) == (score, extender.SCORED)


@pytest.mark.parametrize(
    ("cpu_weight", "memory_weight", "score"),
    [
        # A node at CPU 20, memory 90: free 80 and 10; scaled * 10 / 110 and rounded.
        (0.5, 0.5, 4),  # 45 -> 4.09
        (1.0, 0.0, 7),  # 80 -> 7.27
        (0.0, 1.0, 1),  # 10 -> 0.91
        (3.0, 1.0, 6),  # (240 + 10) / 4 = 62.5 -> 5.68
    ],
)
def test_the_weights_choose_what_free_capacity_means(
    cpu_weight: float, memory_weight: float, score: int
) -> None:
    cfg = replace(CFG, cpu_score_weight=cpu_weight, memory_score_weight=memory_weight)
    n = a_node(annotation=usage(20, 90))
    (got,) = extender.prioritize(pending(), [n], cfg, NOW).scores
    assert got.score == score


def test_without_a_bonus_the_range_is_still_0_to_10() -> None:
    cfg = replace(CFG, load_balance_bonus=0.0)
    nodes = [a_node("idle", usage(0, 0)), a_node("full", usage(100, 100))]
    assert [s.score for s in extender.prioritize(pending(), nodes, cfg, NOW).scores] == [10, 0]


def test_scores_come_back_in_the_order_the_nodes_were_sent() -> None:
    nodes = [a_node("c", usage(90, 90)), a_node("a", usage(0, 0)), a_node("b", usage(50, 50))]
    scores = extender.prioritize(pending(), nodes, CFG, NOW).scores
    assert [(s.node, s.score) for s in scores] == [("c", 1), ("a", 10), ("b", 5)]


def test_a_node_without_trusted_usage_scores_the_mean_of_the_others() -> None:
    nodes = [
        a_node("idle", usage(0, 0)),  # 10
        a_node("busy", usage(90, 90)),  # 1
        a_node("new"),
        a_node("lagging", usage(0, 0, age=timedelta(minutes=10))),
        a_node("broken", "not json"),
    ]
    scores = {s.node: s for s in extender.prioritize(pending(), nodes, CFG, NOW).scores}
    # (10 + 1) / 2 = 5.5, rounded half up.
    assert {name: s.score for name, s in scores.items()} == {
        "idle": 10,
        "busy": 1,
        "new": 6,
        "lagging": 6,
        "broken": 6,
    }
    assert scores["new"].reason == extender.NO_USAGE
    assert scores["lagging"].reason == extender.STALE_USAGE
    assert scores["broken"].reason == extender.UNREADABLE_USAGE


def test_when_no_node_has_usage_every_node_scores_the_same() -> None:
    scores = extender.prioritize(pending(), [a_node("a"), a_node("b")], CFG, NOW).scores
    assert {s.score for s in scores} == {5}


def test_nodes_sent_by_name_only_all_pass_and_score_the_same() -> None:
    result = extender.pass_unknown(["a", "b"])
    assert result.passed == ("a", "b") and result.failed == {}
    assert [s.score for s in extender.unknown_nodes(["a", "b"]).scores] == [5, 5]


def daemon_pod(controller: bool = True) -> Pod:
    """A pending pod of the DaemonSet fluent-bit, pinned to node-0 as its controller pins it."""
    p = cast(dict[str, Any], pending())
    p["metadata"]["name"] = "fluent-bit-7xk2p"
    p["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": "fluent-bit",
            "uid": "5b0f3c52-8a1e-4f7e-9d63-2b1c0e4f7a19",
            "controller": controller,
            "blockOwnerDeletion": True,
        }
    ]
    p["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["node-0"]}
                        ]
                    }
                ]
            }
        }
    }
    return cast(Pod, p)


def test_a_daemonsets_pod_passes_a_hot_node_and_one_in_maintenance() -> None:
    nodes = [
        a_node("node-0", usage(97, 97)),
        a_node("node-1", usage(20), labels={MAINTENANCE_LABEL: "true"}),
    ]
    result = extender.filter_nodes(daemon_pod(), nodes, CFG, NOW)
    assert result.failed == {}
    assert {v.reason for v in result.verdicts} == {extender.DAEMON_POD}


def test_only_a_controlling_daemonset_exempts_a_pod() -> None:
    result = extender.filter_nodes(
        daemon_pod(controller=False), [a_node("node-0", usage(97))], CFG, NOW
    )
    assert result.failed == {"node-0": CPU_OVER}
