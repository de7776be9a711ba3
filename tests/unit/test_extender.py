"""The extender's decisions: filter (thresholds, maintenance, predicted usage), prioritize
(weighted free capacity, the low-load bonus, the 0..10 range), and nodes whose usage cannot be
trusted (neither failed nor penalised).

Nodes are shaped as a kubelet registers them (tests/unit/nodes.py: 4 CPUs, 16283444Ki
allocatable) with the usage annotation annotate-usage writes; the pod is one the scheduler is
placing (pending, not bound yet), shaped as the API server returns it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from shared.api.keys import (
    LOAD_AWARE_SCHEDULER_NAME,
    MAINTENANCE_LABEL,
    OPT_OUT_LABEL,
    USAGE_ANNOTATION,
)
from shared.api.kubetypes import Node, Pod
from shared.api.usage import Estimate, Reading, UsageRecord
from shared.nodes import usage as exempt
from shared.nodes.score_nodes import decide as extender
from shared.platform.config import Config
from tests.unit.nodes import node
from tests.unit.pods import mirror, pod

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
    # Beside a cool node: when every node is hot, the hot ones pass (tested below).
    verdict, _ = extender.filter_nodes(p, [n, a_node("cool", usage(10, 10))], CFG, NOW).verdicts
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
    result = extender.filter_nodes(
        cast(Pod, p), [a_node(annotation=usage(20)), a_node("cool", usage(5))], CFG, NOW
    )
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


@pytest.mark.parametrize("why", [extender.COLD_CACHE, extender.CACHE_OFF])
def test_nodes_sent_by_name_only_without_a_cache_all_pass_and_score_the_same(
    why: extender.Unknown,
) -> None:
    result = extender.pass_unknown(["a", "b"], why)
    assert result.passed == ("a", "b") and result.failed == {}
    assert {v.reason for v in result.verdicts} == {why.reason}
    scores = extender.unknown_nodes(["a", "b"], why).scores
    assert [(s.score, s.reason) for s in scores] == [(5, why.reason), (5, why.reason)]


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
    assert {v.reason for v in result.verdicts} == {exempt.DAEMON_POD}


def test_only_a_controlling_daemonset_exempts_a_pod() -> None:
    result = extender.filter_nodes(
        daemon_pod(controller=False),
        [a_node("node-0", usage(97)), a_node("cool", usage(5))],
        CFG,
        NOW,
    )
    assert result.failed == {"node-0": CPU_OVER}


# -- pods that must run, and every node hot (issue "Do no harm on a production cluster") ----------


def every_node_hot() -> list[Node]:
    """Four nodes over the 80 % CPU threshold, one of them also in maintenance."""
    return [
        a_node("node-0", usage(97, 60)),
        a_node("node-1", usage(85, 40)),
        a_node("node-2", usage(91, 90)),
        a_node("node-3", usage(20), labels={MAINTENANCE_LABEL: "true"}),
    ]


def critical(p: Pod, *, priority_class: str | None, priority: int) -> Pod:
    """``p`` as the Priority admission plugin leaves it: spec.priority resolved from the class
    (system-cluster-critical and system-node-critical are 2000000000 and 2000001000)."""
    out = cast(dict[str, Any], p)
    if priority_class is not None:
        out["spec"]["priorityClassName"] = priority_class
    out["spec"]["priority"] = priority
    return cast(Pod, out)


def in_namespace(p: Pod, namespace: str) -> Pod:
    cast(dict[str, Any], p)["metadata"]["namespace"] = namespace
    return p


def opted_out(p: Pod) -> Pod:
    """``p`` with the opt-out label, which opts out whatever its value."""
    cast(dict[str, Any], p)["metadata"]["labels"][OPT_OUT_LABEL] = ""
    return p


def for_the_load_aware_scheduler(p: Pod) -> Pod:
    """A copy of ``p`` that names the load-aware scheduler."""
    out = cast(dict[str, Any], copy.deepcopy(p))
    out["spec"]["schedulerName"] = LOAD_AWARE_SCHEDULER_NAME
    return cast(Pod, out)


@pytest.mark.parametrize(
    ("p", "reason"),
    [
        pytest.param(
            critical(pending(), priority_class="system-cluster-critical", priority=2000000000),
            exempt.CRITICAL_POD,
            id="system-cluster-critical",
        ),
        pytest.param(
            critical(pending(), priority_class="system-node-critical", priority=2000001000),
            exempt.CRITICAL_POD,
            id="system-node-critical",
        ),
        pytest.param(
            critical(pending(), priority_class=None, priority=2000000000),
            exempt.CRITICAL_POD,
            id="a priority of 2000000000 without the class name",
        ),
        pytest.param(
            in_namespace(pending(), "kube-system"), exempt.EXCLUDED_NAMESPACE, id="kube-system"
        ),
        pytest.param(
            in_namespace(pending(), "kn-rescheduler"),
            exempt.EXCLUDED_NAMESPACE,
            id="the project's own namespace",
        ),
        pytest.param(mirror(), exempt.STATIC_POD, id="a static pod's mirror"),
        pytest.param(
            opted_out(pending()),
            exempt.OPTED_OUT_POD,
            id="opted out",
        ),
    ],
)
def test_a_pod_that_must_run_passes_every_node_hot_or_in_maintenance_in_either_mode(
    p: Pod, reason: str
) -> None:
    for pod_ in (p, for_the_load_aware_scheduler(p)):
        result = extender.filter_nodes(pod_, every_node_hot(), CFG, NOW)
        assert result.failed == {}
        assert {v.reason for v in result.verdicts} == {reason}


def test_a_priority_just_under_system_critical_is_an_ordinary_pod() -> None:
    p = for_the_load_aware_scheduler(critical(pending(), priority_class=None, priority=1999999999))
    assert set(extender.filter_nodes(p, every_node_hot(), CFG, NOW).failed) == {
        "node-0",
        "node-1",
        "node-2",
        "node-3",
    }


def test_the_excluded_namespaces_come_from_the_configuration() -> None:
    cfg = replace(CFG, excluded_namespaces=frozenset({"batch"}))
    assert (
        extender.filter_nodes(in_namespace(pending(), "batch"), every_node_hot(), cfg, NOW).failed
        == {}
    )
    # kube-system is excluded only because the default list says so.
    assert extender.filter_nodes(
        in_namespace(pending(), "kube-system"), every_node_hot(), cfg, NOW
    ).passed == ("node-0", "node-1", "node-2")


def test_when_every_node_is_hot_a_default_scheduler_pod_gets_the_hot_nodes_ranked_by_score() -> (
    None
):
    """The default scheduler with the extender: every pod of the cluster is filtered. Failing
    every node would keep the pod Pending with nothing to end it (a 200 is no error to skip,
    the failures are unresolvable, the Cluster Autoscaler does not run extenders), so the hot
    nodes pass and the score sends the pod to the coolest; maintenance still keeps it off."""
    nodes = every_node_hot()
    p = pending()
    assert p["spec"]["schedulerName"] == "default-scheduler"
    result = extender.filter_nodes(p, nodes, CFG, NOW)
    assert result.passed == ("node-0", "node-1", "node-2")
    assert result.failed == {"node-3": "node in maintenance"}
    assert {v.reason for v in result.verdicts if v.passed} == {extender.EVERY_NODE_HOT}
    scores = {s.node: s.score for s in extender.prioritize(p, nodes, CFG, NOW).scores}
    # (100 - cpu) / 2 + (100 - memory) / 2, * 10 / 110: 85/40 -> 3, 97/60 -> 2, 91/90 -> 1.
    assert {n: scores[n] for n in result.passed} == {"node-0": 2, "node-1": 3, "node-2": 1}
    assert max(result.passed, key=scores.__getitem__) == "node-1"


def test_the_predicted_usage_counts_as_hot_too() -> None:
    nodes = [a_node("node-0", usage(79)), a_node("node-1", usage(75))]
    result = extender.filter_nodes(pending(cpu="1"), nodes, CFG, NOW)  # +25 % of 4 CPUs
    assert result.passed == ("node-0", "node-1")
    assert {v.reason for v in result.verdicts} == {extender.EVERY_NODE_HOT}


def test_one_node_under_the_limits_keeps_the_filter_as_it_was() -> None:
    nodes = [*every_node_hot(), a_node("node-4", usage(50))]
    result = extender.filter_nodes(pending(), nodes, CFG, NOW)
    assert result.passed == ("node-4",)
    assert set(result.failed) == {"node-0", "node-1", "node-2", "node-3"}


def test_every_node_in_maintenance_keeps_an_ordinary_pod_off_them() -> None:
    nodes = [a_node(f"node-{i}", usage(10), labels={MAINTENANCE_LABEL: "true"}) for i in range(2)]
    assert extender.filter_nodes(pending(), nodes, CFG, NOW).passed == ()


def test_a_pod_of_the_load_aware_scheduler_waits_while_every_node_is_hot() -> None:
    """The seed's semantics for a pod that asked for load-aware placement."""
    result = extender.filter_nodes(
        for_the_load_aware_scheduler(pending()), every_node_hot(), CFG, NOW
    )
    assert result.passed == ()
    assert result.failed == {
        "node-0": CPU_OVER,
        "node-1": CPU_OVER,
        "node-2": CPU_OVER,
        "node-3": "node in maintenance",
    }


# -- cordoned and NotReady nodes (the neutral score) ----------------------------------------------


def not_ready(n: Node) -> Node:
    """``n`` as the node lifecycle controller leaves it when the kubelet stops posting status
    (pkg/controller/nodelifecycle: Ready Unknown, "Kubelet stopped posting node status.")."""
    ready = next(c for c in n["status"]["conditions"] if c["type"] == "Ready")
    ready.update(
        status="Unknown", reason="NodeStatusUnknown", message="Kubelet stopped posting node status."
    )
    return n


def cordoned(name: str, annotation: str) -> Node:
    n = node(name, annotations={USAGE_ANNOTATION: annotation}, unschedulable=True)
    return cast(Node, n)


def test_a_cordoned_or_not_ready_node_does_not_move_the_score_of_nodes_without_usage() -> None:
    """A drained node is nearly idle: counted, it would lift the mean every unmeasured node
    gets, and pull pods onto nodes nobody measured exactly while capacity is short."""
    nodes = [
        a_node("busy", usage(90, 90)),  # 1
        a_node("half", usage(50, 50)),  # 5
        cordoned("drained", usage(0, 0)),  # 10
        not_ready(a_node("gone", usage(0, 0))),  # 10
        a_node("new"),
    ]
    scores = {s.node: s.score for s in extender.prioritize(pending(), nodes, CFG, NOW).scores}
    # (1 + 5) / 2 = 3; with the drained and the NotReady node it would be (1+5+10+10)/4 = 6.5.
    assert scores["new"] == 3
    # They keep their own score: a pod that tolerates them is still ranked by their load.
    assert (scores["drained"], scores["gone"]) == (10, 10)
