"""Which pods rebalance-nodes evicts: hot nodes and their streaks, maintenance, the choice of
victims, where they fit, the limits and the available share, and what is never touched.

Nodes are shaped as the API server returns them (tests/unit/nodes.py: 4 CPUs and 16283444Ki
allocatable, so 400m is 10 % of a node's CPU) and carry a usage record as annotate-usage writes
it; pods are a Deployment's pods as a kubelet reports them (tests/unit/pods.py), with the
requests each row needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from shared.constants import (
    HOT_STREAK_ANNOTATION,
    LOAD_AWARE_SCHEDULER_NAME,
    LOAD_LABEL,
    MAINTENANCE_LABEL,
    NODE_OPT_OUT_LABEL,
    OPT_OUT_LABEL,
    USAGE_ANNOTATION,
)
from shared.loadaware.rebalance import (
    CPU_ABOVE_MEAN,
    CPU_OVER_THRESHOLD,
    MAINTENANCE,
    MEMORY_OVER_THRESHOLD,
    Plan,
    Streak,
    Workload,
    assess,
    placement_refusal,
    plan,
    read_streak,
)
from shared.loadaware.usage import Estimate, Reading, UsageRecord
from shared.platform.config import Config, ConfigError
from shared.platform.kubetypes import Node, Pod
from shared.rescheduling.jobs import JobFacts
from tests.unit.nodes import node
from tests.unit.pods import pod as base_pod
from tests.unit.pods import uid

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
CFG = Config()
# The mean rule off (a gap of 100 points): rows about the threshold alone.
THRESHOLD_ONLY = replace(CFG, rebalance_gap=100.0)
NAMESPACE = "shop"
GiB = 1024**3
NODE_MEMORY = 16283444 * 1024


def usage(cpu: float, memory: float = 30.0, *, at: datetime = NOW, estimate: float = 0.0) -> str:
    return UsageRecord(
        sampled_at=at,
        source="prometheus",
        cpu=Reading(now=cpu, avg5m=cpu, max1h=cpu),
        memory=Reading(now=memory, avg5m=memory, max1h=memory),
        estimate=Estimate(cpu=estimate, memory=0.0, pods=1 if estimate else 0),
    ).to_json()


def a_node(
    name: str,
    cpu: float | None,
    memory: float = 30.0,
    *,
    streak: int | None = None,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] | None = None,
    unschedulable: bool = False,
    sampled: datetime = NOW,
    estimate: float = 0.0,
) -> Node:
    annotations = {}
    if cpu is not None:
        annotations[USAGE_ANNOTATION] = usage(cpu, memory, at=sampled, estimate=estimate)
    if streak is not None:
        annotations[HOT_STREAK_ANNOTATION] = Streak(
            streak, NOW - timedelta(seconds=30 * streak)
        ).to_json()
    return cast(
        Node,
        node(
            name,
            labels=labels,
            annotations=annotations,
            taints=taints,
            unschedulable=unschedulable,
        ),
    )


def a_pod(
    name: str,
    on: str,
    *,
    cpu: str = "400m",
    memory: str = "256Mi",
    workload: str = "web",
    kind: str = "ReplicaSet",
    namespace: str = NAMESPACE,
    spec: Mapping[str, Any] | None = None,
    **options: Any,
) -> Pod:
    owner: tuple[str, str] | None = (
        kind,
        f"{workload}-7d9c8b6f4" if kind == "ReplicaSet" else workload,
    )
    if "owner" in options:
        owner = options.pop("owner")
    labels = options.pop("labels", {"app": workload})
    made = base_pod(name, namespace, owner=owner, node=on, stamp=None, labels=labels, **options)
    made["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu, "memory": memory}
    # Placed by the load-aware scheduler unless a test says otherwise: the pods rebalancing is
    # for (a replacement placed by requests alone is a rule of its own, below).
    made["spec"]["schedulerName"] = LOAD_AWARE_SCHEDULER_NAME
    made["spec"].update(cast(Any, spec or {}))
    return made


def rs(
    workload: str = "web",
    *,
    opted_in: bool = True,
    desired: int = 4,
    ready: int | None = None,
    namespace: str = NAMESPACE,
) -> Workload:
    name = f"{workload}-7d9c8b6f4"
    return Workload(
        kind="ReplicaSet",
        namespace=namespace,
        name=name,
        uid=uid(f"ReplicaSet/{name}"),
        opted_in=opted_in,
        opt_in="kn-rescheduler.io/rebalance='true' on the ReplicaSet" if opted_in else "none",
        desired=desired,
        ready=desired if ready is None else ready,
    )


def index(*workloads: Workload) -> dict[str, Workload]:
    return {w.key: w for w in workloads}


def evicted(result: Plan) -> list[tuple[str, str]]:
    """(pod, the node it fits on), in the plan's order."""
    return [(e.pod, e.target) for e in result.evictions]


def why_skipped(result: Plan, subject: str) -> str:
    return "; ".join(s.why for s in result.skipped if s.subject.endswith(subject))


HOT = dict(streak=2)  # the third hot evaluation: acted on with the default of 3


# -- hot, streaks, the mean --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu", "memory", "others", "hot", "reason"),
    [
        (85.0, 30.0, 40.0, True, CPU_OVER_THRESHOLD),
        (30.0, 85.0, 40.0, True, MEMORY_OVER_THRESHOLD),
        (79.0, 30.0, 70.0, False, ""),  # under 80 %, and within 20 points of the mean
        (75.0, 30.0, 30.0, True, CPU_ABOVE_MEAN),  # mean (75+30+30)/3 = 45; 75 > 65
        (60.0, 30.0, 30.0, False, ""),  # mean 40; 60 is exactly the bound, not over it
    ],
)
def test_a_node_is_hot_over_a_threshold_or_more_than_the_gap_above_the_mean(
    cpu: float, memory: float, others: float, hot: bool, reason: str
) -> None:
    nodes = [a_node("node-a", cpu, memory), a_node("node-b", others), a_node("node-c", others)]
    states, _ = assess(nodes, CFG, NOW)
    assert (states[0].hot, states[0].reason) == (hot, reason)


@pytest.mark.parametrize(
    ("streak", "hot_now", "after", "acting"),
    [
        (None, True, 1, False),
        (1, True, 2, False),
        (2, True, 3, True),  # the third hot evaluation in a row acts
        (5, True, 6, True),
        (2, False, 0, False),  # one cool evaluation starts the count again
    ],
)
def test_a_node_is_acted_on_only_after_consecutive_hot_evaluations(
    streak: int | None, hot_now: bool, after: int, acting: bool
) -> None:
    nodes = [a_node("node-a", 90.0 if hot_now else 50.0, streak=streak), a_node("node-b", 40.0)]
    states, _ = assess(nodes, CFG, NOW)
    assert (states[0].streak.hot, states[0].acting) == (after, acting)


@pytest.mark.parametrize(
    "node_a",
    [
        a_node("node-a", 95.0, streak=2, sampled=NOW - timedelta(minutes=4)),  # stale (3 min)
        a_node("node-a", None, streak=2),  # no record
    ],
    ids=["stale record", "no record"],
)
def test_a_stale_or_missing_record_breaks_the_streak_and_makes_the_node_no_target(
    node_a: Node,
) -> None:
    nodes = [node_a, a_node("node-b", 90.0, **HOT)]
    pods = [a_pod("web-7d9c8b6f4-aaaaa", "node-b", cpu="800m")]
    result = plan(nodes, pods, index(rs()), CFG, NOW)
    assert (result.nodes[0].hot, result.nodes[0].streak.hot) == (False, 0)
    assert result.streaks()["node-a"] is None  # the annotation goes
    # node-b is hot but the only other node has no fresh usage: nowhere to go.
    assert result.evictions == ()
    assert "node-a: usage record" in why_skipped(result, "web-7d9c8b6f4-aaaaa") or (
        "node-a: no usage record" in why_skipped(result, "web-7d9c8b6f4-aaaaa")
    )


def test_the_mean_leaves_out_nodes_in_maintenance_and_opted_out_nodes() -> None:
    nodes = [
        a_node("node-a", 70.0),
        a_node("node-b", 40.0),
        a_node("node-c", 0.0, labels={MAINTENANCE_LABEL: "true"}),
        a_node("node-d", 0.0, labels={NODE_OPT_OUT_LABEL: "true"}),
    ]
    _, bounds = assess(nodes, CFG, NOW)
    assert bounds.mean_cpu == 55.0
    assert bounds.cpu == 75.0


def test_acting_on_a_node_starts_its_streak_afresh_and_the_rest_keep_counting() -> None:
    nodes = [
        a_node("node-a", 90.0, **HOT),
        a_node("node-b", 88.0, streak=0),
        a_node("node-c", 20.0),
        a_node("node-d", 20.0),
    ]
    pods = [a_pod("web-7d9c8b6f4-aaaaa", "node-a", cpu="800m")]
    result = plan(nodes, pods, index(rs()), CFG, NOW)
    assert evicted(result) == [("web-7d9c8b6f4-aaaaa", "node-c")]
    streaks = result.streaks()
    assert streaks["node-a"] is None
    assert streaks["node-b"] == Streak(1, NOW)
    assert "node-c" not in streaks  # nothing to write: no streak before, none now
    # What the handler reads back next time.
    written = a_node("node-b", 88.0)
    written["metadata"]["annotations"][HOT_STREAK_ANNOTATION] = Streak(1, NOW).to_json()
    assert read_streak(written) == Streak(1, NOW)


def test_an_unreadable_streak_counts_as_none() -> None:
    assert Streak.from_json("{not json") == Streak()
    assert Streak.from_json('{"v":1,"hot":-2}') == Streak()


# -- victims ---------------------------------------------------------------------------------


def test_the_smallest_pod_that_brings_the_node_under_the_threshold_is_chosen_alone() -> None:
    # node-a at 90 % CPU, 10 points over: 400m is exactly 10 %, 800m 20 %, 200m 5 %.
    nodes = [a_node("node-a", 90.0, **HOT), a_node("node-b", 30.0), a_node("node-c", 30.0)]
    pods = [
        a_pod("web-7d9c8b6f4-small", "node-a", cpu="200m"),
        a_pod("web-7d9c8b6f4-large", "node-a", cpu="800m", workload="api"),
        a_pod("web-7d9c8b6f4-right", "node-a", cpu="400m", workload="db"),
    ]
    result = plan(nodes, pods, index(rs(), rs("api"), rs("db")), THRESHOLD_ONLY, NOW)
    assert [e.pod for e in result.evictions] == ["web-7d9c8b6f4-right"]
    eviction = result.evictions[0]
    assert (eviction.reason, eviction.cpu, eviction.memory) == (CPU_OVER_THRESHOLD, 90.0, 30.0)
    assert "CPU 90.0 % over the threshold of 80 %" in eviction.why
    assert "requests 10.0 % CPU" in eviction.why


def test_when_no_pod_suffices_alone_the_largest_go_first_until_the_node_is_under() -> None:
    # 95 %: 15 points over; no pod covers that alone.
    nodes = [a_node("node-a", 95.0, **HOT), a_node("node-b", 10.0), a_node("node-c", 10.0)]
    pods = [
        a_pod("web-7d9c8b6f4-a", "node-a", cpu="400m"),
        a_pod("api-7d9c8b6f4-b", "node-a", cpu="400m", workload="api"),
        a_pod("db-7d9c8b6f4-c", "node-a", cpu="200m", workload="db"),
    ]
    result = plan(nodes, pods, index(rs(), rs("api"), rs("db")), THRESHOLD_ONLY, NOW)
    # The two 400m tie (by name, api first); after it (10 %), 5 points remain: the smallest
    # pod covering them is the 200m.
    assert [e.pod for e in result.evictions] == ["api-7d9c8b6f4-b", "db-7d9c8b6f4-c"]


def test_a_pod_whose_requests_do_not_touch_the_hot_resource_stays() -> None:
    nodes = [a_node("node-a", 30.0, 90.0, **HOT), a_node("node-b", 30.0)]
    pods = [a_pod("web-7d9c8b6f4-cpu-only", "node-a", cpu="800m", memory="0")]
    result = plan(nodes, pods, index(rs()), CFG, NOW)
    assert result.evictions == ()
    assert "would not lower what is over the bound" in why_skipped(result, "cpu-only")


@pytest.mark.parametrize(
    ("victim", "workloads", "why"),
    [
        (a_pod("web-7d9c8b6f4-x", "node-a"), index(rs(opted_in=False)), "did not opt in"),
        (a_pod("agent-x", "node-a", kind="DaemonSet", workload="agent"), {}, "DaemonSet"),
        (a_pod("bare", "node-a", owner=None), {}, "bare pod"),
        (
            a_pod(
                "kube-proxy-node-a",
                "node-a",
                owner=None,
                annotations={"kubernetes.io/config.mirror": "3c1f0c9e2d"},
            ),
            {},
            "static (mirror)",
        ),
        (
            a_pod("web-7d9c8b6f4-x", "node-a", namespace="kube-system"),
            index(rs(namespace="kube-system")),
            "kube-system is excluded",
        ),
        (
            a_pod("web-7d9c8b6f4-x", "node-a", labels={OPT_OUT_LABEL: "true", "app": "web"}),
            index(rs()),
            OPT_OUT_LABEL,
        ),
        (a_pod("web-7d9c8b6f4-x", "node-a", deleting=True), index(rs()), "being deleted"),
        (a_pod("web-7d9c8b6f4-x", "node-a", phase="Pending"), index(rs()), "not running"),
        (a_pod("web-7d9c8b6f4-x", "node-a"), {}, "could not be read"),
    ],
    ids=[
        "not opted in",
        "DaemonSet",
        "bare pod",
        "mirror pod",
        "excluded namespace",
        "opt-out label",
        "terminating",
        "not running",
        "controller gone",
    ],
)
def test_pods_that_are_never_evicted(victim: Pod, workloads: dict[str, Workload], why: str) -> None:
    nodes = [a_node("node-a", 95.0, labels={MAINTENANCE_LABEL: "true"}), a_node("node-b", 10.0)]
    result = plan(nodes, [victim], workloads, CFG, NOW)
    assert result.evictions == ()
    assert why in why_skipped(result, victim["metadata"]["name"])


def test_a_job_pod_is_evicted_only_when_the_job_ignores_disruptions() -> None:
    nodes = [a_node("node-a", 50.0, labels={MAINTENANCE_LABEL: "true"}), a_node("node-b", 10.0)]
    job_pod = a_pod("report-x7k2p", "node-a", kind="Job", workload="report")
    job_pod["spec"]["restartPolicy"] = "Never"

    def job(rules: list[dict[str, Any]] | None) -> Workload:
        body: dict[str, Any] = {
            "metadata": {"name": "report", "namespace": NAMESPACE},
            "spec": {"template": {"spec": {"restartPolicy": "Never"}}, "backoffLimit": 6},
        }
        if rules is not None:
            body["spec"]["podFailurePolicy"] = {"rules": rules}
        return Workload(
            "Job",
            NAMESPACE,
            "report",
            uid("Job/report"),
            True,
            "annotation",
            2,
            2,
            JobFacts.from_job(body),
        )

    # As the API server stores the rule: it defaults the condition's status to "True".
    ignoring = [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    ]
    counted = plan(nodes, [job_pod], index(job(None)), CFG, NOW)
    assert counted.evictions == ()
    assert "would count the eviction as a failure" in why_skipped(counted, "report-x7k2p")
    ignored = plan(nodes, [job_pod], index(job(ignoring)), CFG, NOW)
    assert evicted(ignored) == [("report-x7k2p", "node-b")]


# -- maintenance ---------------------------------------------------------------------------------


def test_a_node_in_maintenance_is_drained_gradually_without_a_streak_or_a_record() -> None:
    nodes = [
        a_node("node-a", None, labels={MAINTENANCE_LABEL: "true"}),
        a_node("node-b", 20.0),
        a_node("node-c", 30.0),
    ]
    pods = [a_pod(f"{w}-7d9c8b6f4-p", "node-a", workload=w) for w in ("a", "b", "c", "d")]
    result = plan(nodes, pods, index(*(rs(w) for w in "abcd")), CFG, NOW)
    # Two per node per evaluation (the default), each to the coolest node that fits.
    assert len(result.evictions) == 2
    assert {e.reason for e in result.evictions} == {MAINTENANCE}
    assert {e.target for e in result.evictions} <= {"node-b", "node-c"}
    assert "maintenance" in result.evictions[0].why
    assert why_skipped(result, "node-a") == "the limit per node is reached"


def test_a_node_in_maintenance_is_never_a_target() -> None:
    nodes = [
        a_node("node-a", 90.0, **HOT),
        a_node("node-b", 10.0, labels={MAINTENANCE_LABEL: "true"}),
    ]
    result = plan(nodes, [a_pod("web-7d9c8b6f4-a", "node-a")], index(rs()), CFG, NOW)
    assert result.evictions == ()


# -- fit -------------------------------------------------------------------------------------


ZONE_B = {"topology.kubernetes.io/zone": "b", "disk": "ssd", "gen": "5"}


@pytest.mark.parametrize(
    ("spec", "target_labels", "taints", "unschedulable", "refusal"),
    [
        ({}, {}, None, False, None),
        ({"nodeSelector": {"disk": "ssd"}}, ZONE_B, None, False, None),
        ({"nodeSelector": {"disk": "hdd"}}, ZONE_B, None, False, "nodeSelector disk=hdd"),
        ({}, {}, [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}], False, "taint gpu"),
        ({}, {}, [{"key": "gpu", "effect": "PreferNoSchedule"}], False, None),
        (
            {"tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes"}]},
            {},
            [{"key": "gpu", "value": "yes", "effect": "NoExecute"}],
            False,
            None,
        ),
        (
            {"tolerations": [{"key": "gpu", "operator": "Equal", "value": "no"}]},
            {},
            [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}],
            False,
            "taint gpu",
        ),
        (
            {"tolerations": [{"operator": "Exists"}]},
            {},
            [{"key": "x", "effect": "NoSchedule"}],
            False,
            None,
        ),
        ({}, {}, None, True, "cordoned"),
        (
            {
                "tolerations": [
                    {
                        "key": "node.kubernetes.io/unschedulable",
                        "operator": "Exists",
                        "effect": "NoSchedule",
                    }
                ]
            },
            {},
            None,
            True,
            None,
        ),
    ],
    ids=[
        "nothing asked",
        "nodeSelector matches",
        "nodeSelector differs",
        "NoSchedule taint",
        "PreferNoSchedule is no filter",
        "tolerated NoExecute",
        "toleration of another value",
        "tolerate everything",
        "cordoned",
        "tolerates the cordon",
    ],
)
def test_selectors_taints_and_the_cordon_as_the_scheduler_filters_them(
    spec: dict[str, Any],
    target_labels: dict[str, str],
    taints: list[dict[str, Any]] | None,
    unschedulable: bool,
    refusal: str | None,
) -> None:
    target = a_node(
        "node-b", 10.0, labels=target_labels, taints=taints, unschedulable=unschedulable
    )
    victim = a_pod("web-7d9c8b6f4-a", "node-a", spec=spec)
    said = placement_refusal(victim, target)
    assert (said is None) == (refusal is None)
    if refusal:
        assert said is not None and said.startswith(refusal)


def _required(*expressions: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> Any:
    term: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields:
        term["matchFields"] = fields
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
    }


@pytest.mark.parametrize(
    ("expression", "fits"),
    [
        ({"key": "disk", "operator": "In", "values": ["ssd", "nvme"]}, True),
        ({"key": "disk", "operator": "In", "values": ["hdd"]}, False),
        ({"key": "disk", "operator": "NotIn", "values": ["hdd"]}, True),
        ({"key": "gpu", "operator": "NotIn", "values": ["yes"]}, True),  # no label: not in
        ({"key": "disk", "operator": "Exists"}, True),
        ({"key": "gpu", "operator": "Exists"}, False),
        ({"key": "gpu", "operator": "DoesNotExist"}, True),
        ({"key": "disk", "operator": "DoesNotExist"}, False),
        ({"key": "gen", "operator": "Gt", "values": ["4"]}, True),
        ({"key": "gen", "operator": "Gt", "values": ["5"]}, False),
        ({"key": "gen", "operator": "Lt", "values": ["6"]}, True),
        ({"key": "disk", "operator": "Lt", "values": ["6"]}, False),  # not an integer
    ],
)
def test_required_node_affinity_operators(expression: dict[str, Any], fits: bool) -> None:
    target = a_node("node-b", 10.0, labels=ZONE_B)
    victim = a_pod("web-7d9c8b6f4-a", "node-a", spec=_required(expression))
    assert (placement_refusal(victim, target) is None) == fits


def test_required_affinity_terms_are_ored_and_match_fields_name_the_node() -> None:
    target = a_node("node-b", 10.0, labels=ZONE_B)
    spec = _required({"key": "disk", "operator": "In", "values": ["hdd"]})
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    terms["nodeSelectorTerms"].append(
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}
    )
    assert placement_refusal(a_pod("web-7d9c8b6f4-a", "node-a", spec=spec), target) is None
    terms["nodeSelectorTerms"][1]["matchFields"][0]["values"] = ["node-c"]
    refused = placement_refusal(a_pod("web-7d9c8b6f4-a", "node-a", spec=spec), target)
    assert refused == "required node affinity"


def test_a_pod_that_fits_nowhere_is_never_evicted() -> None:
    nodes = [
        a_node("node-a", 90.0, **HOT),
        a_node("node-b", 10.0, unschedulable=True),
        a_node("node-c", 75.0, estimate=4.0),  # 75 + 4 estimated + 10 = 89 > 80
    ]
    result = plan(nodes, [a_pod("web-7d9c8b6f4-a", "node-a")], index(rs()), CFG, NOW)
    assert result.evictions == ()
    said = why_skipped(result, "web-7d9c8b6f4-a")
    assert "node-b: cordoned" in said
    assert "node-c: would be hot (89.0 % CPU" in said


def test_a_target_full_by_requests_takes_nothing_even_when_its_usage_is_low() -> None:
    nodes = [a_node("node-a", 90.0, **HOT), a_node("node-b", 5.0)]
    filler = a_pod("batch-7d9c8b6f4-f", "node-b", cpu="3800m", workload="batch")
    result = plan(nodes, [a_pod("web-7d9c8b6f4-a", "node-a"), filler], index(rs()), CFG, NOW)
    assert result.evictions == ()
    assert "node-b: requests over allocatable" in why_skipped(result, "web-7d9c8b6f4-a")


def test_what_is_planned_for_a_target_counts_for_the_next_pod() -> None:
    # node-b at 65 %: room for one 10 % pod under 80, not two (65 + 10 + 10 = 85).
    nodes = [
        a_node("node-a", 100.0, **HOT),
        a_node("node-b", 65.0),
        a_node("node-c", 70.0),
    ]
    pods = [
        a_pod("web-7d9c8b6f4-a", "node-a"),
        a_pod("api-7d9c8b6f4-b", "node-a", workload="api"),
        a_pod("db-7d9c8b6f4-c", "node-a", workload="db"),
    ]
    result = plan(nodes, pods, index(rs(), rs("api"), rs("db")), CFG, NOW)
    assert sorted(e.target for e in result.evictions) == ["node-b", "node-c"]


# -- limits and the available share -------------------------------------------------------------


def _many(n: int, on: str, workload: str = "web") -> list[Pod]:
    return [a_pod(f"{workload}-7d9c8b6f4-{i}", on, workload=workload) for i in range(n)]


@pytest.mark.parametrize(
    ("settings", "expected", "why"),
    [
        (dict(rebalance_max_per_run=1), 1, "the limit per evaluation is reached"),
        (dict(rebalance_max_per_node=1), 1, "the limit per node is reached"),
        (dict(rebalance_max_per_namespace=2, rebalance_max_per_node=5), 2, "per namespace (2)"),
        (dict(rebalance_max_per_workload=1, rebalance_max_per_node=5), 3, "per workload (1)"),
    ],
)
def test_the_limits(settings: dict[str, int], expected: int, why: str) -> None:
    cfg = replace(CFG, **{"rebalance_max_per_run": 10, **settings})
    nodes = [
        a_node("node-a", 50.0, labels={MAINTENANCE_LABEL: "true"}),
        a_node("node-b", 10.0),
        a_node("node-c", 10.0),
    ]
    pods = _many(2, "node-a") + _many(2, "node-a", "api") + _many(2, "node-a", "db")
    workloads = index(rs(desired=10), rs("api", desired=10), rs("db", desired=10))
    if "namespace" in why:
        cfg = replace(cfg, rebalance_max_per_workload=5)
    result = plan(nodes, pods, workloads, cfg, NOW)
    assert len(result.evictions) == expected
    assert any(why in s.why for s in result.skipped)


@pytest.mark.parametrize(
    ("desired", "ready", "share", "evicts"),
    [
        (4, 4, 0.5, 2),  # keeps 2 of 4
        (4, 3, 0.5, 1),  # one already not ready: only one more may go
        (3, 3, 0.5, 1),  # ceil(1.5) = 2 stay
        (1, 1, 0.5, 0),  # a single replica stays
        (1, 1, 0.0, 1),  # unless the share is 0
        (4, 4, 1.0, 0),
    ],
)
def test_never_below_the_available_share_of_desired_replicas(
    desired: int, ready: int, share: float, evicts: int
) -> None:
    cfg = replace(
        CFG, rebalance_min_available=share, rebalance_max_per_workload=4, rebalance_max_per_node=4
    )
    nodes = [
        a_node("node-a", None, labels={MAINTENANCE_LABEL: "true"}),
        a_node("node-b", 10.0),
        a_node("node-c", 10.0),
    ]
    pods = _many(min(desired, 4), "node-a")
    result = plan(nodes, pods, index(rs(desired=desired, ready=ready)), cfg, NOW)
    assert len(result.evictions) == evicts
    if evicts < len(pods):
        assert any("replicas ready, fewer than" in s.why for s in result.skipped)


# -- convergence -------------------------------------------------------------------------------


def test_once_every_node_is_under_its_bound_nothing_is_evicted() -> None:
    """After a rebalancing the hot node reads under the bound and its streak starts afresh; the
    next evaluations evict nothing, however many there are (no ping-pong)."""
    pods = [a_pod("web-7d9c8b6f4-a", "node-a"), a_pod("api-7d9c8b6f4-b", "node-c", workload="api")]
    workloads = index(rs(), rs("api"))
    nodes = [a_node("node-a", 70.0), a_node("node-b", 60.0), a_node("node-c", 55.0)]
    for _ in range(5):
        result = plan(nodes, pods, workloads, CFG, NOW)
        assert result.evictions == ()
        assert not any(s.hot for s in result.nodes)


# -- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "raw", "field", "value"),
    [
        ("KN_RESCHEDULER_REBALANCE_HOT_SAMPLES", "5", "rebalance_hot_samples", 5),
        ("KN_RESCHEDULER_REBALANCE_GAP", "15%", "rebalance_gap", 15.0),
        ("KN_RESCHEDULER_REBALANCE_MAX_PER_RUN", "10", "rebalance_max_per_run", 10),
        ("KN_RESCHEDULER_REBALANCE_MIN_AVAILABLE", "75%", "rebalance_min_available", 0.75),
        ("KN_RESCHEDULER_REBALANCE_MIN_AVAILABLE", "0", "rebalance_min_available", 0.0),
    ],
)
def test_the_rebalancing_settings_are_read_from_the_environment(
    variable: str, raw: str, field: str, value: object
) -> None:
    assert getattr(Config.from_env({variable: raw}), field) == value


@pytest.mark.parametrize(
    ("variable", "raw", "said"),
    [
        ("KN_RESCHEDULER_REBALANCE_HOT_SAMPLES", "0", "positive whole number"),
        ("KN_RESCHEDULER_REBALANCE_MAX_PER_NODE", "two", "positive whole number"),
        ("KN_RESCHEDULER_REBALANCE_MIN_AVAILABLE", "150%", "share from 0 to 1"),
        ("KN_RESCHEDULER_REBALANCE_MIN_AVAILABLE", "-0.1", "share from 0 to 1"),
        ("KN_RESCHEDULER_REBALANCE_GAP", "0", "gap above 0 points"),
    ],
)
def test_an_unusable_rebalancing_setting_stops_the_function_naming_it(
    variable: str, raw: str, said: str
) -> None:
    with pytest.raises(ConfigError, match=said) as caught:
        Config.from_env({variable: raw})
    assert caught.value.variable == variable


# -- where the replacement will go ----------------------------------------------------------------

BY_REQUESTS = {"schedulerName": "default-scheduler"}
LOAD_AFFINITY = {
    "schedulerName": "default-scheduler",
    "affinity": {
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
    },
}


@pytest.mark.parametrize(
    ("spec", "cordoned", "cfg", "moved"),
    [
        (BY_REQUESTS, False, THRESHOLD_ONLY, False),
        (BY_REQUESTS, True, THRESHOLD_ONLY, True),
        (BY_REQUESTS, False, replace(THRESHOLD_ONLY, rebalance_any_placement=True), True),
        (LOAD_AFFINITY, False, THRESHOLD_ONLY, True),
        ({}, False, THRESHOLD_ONLY, True),  # the load-aware scheduler's pod
    ],
    ids=["stock-placement", "cordoned", "any-placement", "label-mode", "load-aware-scheduler"],
)
def test_a_pod_is_evicted_only_when_its_replacement_will_not_be_placed_by_requests_alone(
    spec: dict[str, Any], cordoned: bool, cfg: Config, moved: bool
) -> None:
    # Measured (bench/RESULTS.md, section 9): on a stock placement the scheduler puts the
    # replacement back by requests, onto the nodes whose pods use more than they request.
    nodes = [
        a_node("node-a", 90.0, unschedulable=cordoned, **HOT),
        a_node("node-b", 30.0),
        a_node("node-c", 30.0),
    ]
    pods = [a_pod("web-7d9c8b6f4-q8w2k", "node-a", cpu="800m", spec=spec)]
    result = plan(nodes, pods, index(rs()), cfg, NOW)
    assert bool(result.evictions) is moved
    if not moved:
        assert "placed by requests alone" in why_skipped(result, "web-7d9c8b6f4-q8w2k")
