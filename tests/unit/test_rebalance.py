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

from shared.api.keys import (
    HOT_STREAK_ANNOTATION,
    LOAD_AWARE_SCHEDULER_NAME,
    LOAD_LABEL,
    MAINTENANCE_LABEL,
    NODE_OPT_OUT_LABEL,
    OPT_OUT_LABEL,
    USAGE_ANNOTATION,
)
from shared.api.kubetypes import Node, Pod
from shared.api.rebalance import Streak, read_streak
from shared.api.usage import Estimate, Reading, UsageRecord
from shared.nodes.rebalance_nodes.decide import (
    CPU_ABOVE_MEAN,
    CPU_OVER_THRESHOLD,
    MAINTENANCE,
    MEMORY_OVER_THRESHOLD,
    Claim,
    Plan,
    Workload,
    assess,
    placement_refusal,
    plan,
)
from shared.platform.config import Config, ConfigError
from shared.workloads.jobs import JobFacts
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
        # Counted up to the sample before this one (annotate-usage samples every 30 s).
        annotations[HOT_STREAK_ANNOTATION] = Streak(
            streak, NOW - timedelta(seconds=30 * streak), sampled - timedelta(seconds=30)
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
    # No count; the sample acted on is remembered, so that it never counts again.
    assert streaks["node-a"] == Streak(0, None, NOW)
    assert streaks["node-b"] == Streak(1, NOW, NOW)
    assert "node-c" not in streaks  # nothing to write: no streak before, none now
    # What the handler reads back next time.
    written = a_node("node-b", 88.0)
    written["metadata"]["annotations"][HOT_STREAK_ANNOTATION] = Streak(1, NOW, NOW).to_json()
    assert read_streak(written) == Streak(1, NOW, NOW)


def test_an_unreadable_streak_counts_as_none() -> None:
    assert Streak.from_json("{not json") == Streak()
    assert Streak.from_json('{"v":2,"hot":-2}') == Streak()
    # Version 1 counted evaluations, not samples: its count is not carried over.
    assert Streak.from_json('{"v":1,"hot":2,"since":"2026-11-23T09:59:00Z"}') == Streak()


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
    # Measured (dev/bench/RESULTS.md, section 9): on a stock placement the scheduler puts the
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


# -- do no harm: a sample counts once ------------------------------------------------------------


def carried(nodes: Sequence[Node], result: Plan) -> list[Node]:
    """The Nodes as the next evaluation reads them: with the streaks the handler wrote."""
    out = []
    for item in nodes:
        name = item["metadata"]["name"]
        changes = result.streaks([e.node for e in result.evictions])
        copy = cast(Node, {**item, "metadata": {**item["metadata"]}})
        annotations = dict(copy["metadata"].get("annotations") or {})
        if name in changes:
            streak = changes[name]
            if streak is None:
                annotations.pop(HOT_STREAK_ANNOTATION, None)
            else:
                annotations[HOT_STREAK_ANNOTATION] = streak.to_json()
        copy["metadata"]["annotations"] = annotations
        out.append(copy)
    return out


def resampled(nodes: Sequence[Node], name: str, cpu: float, at: datetime) -> list[Node]:
    """The Nodes after annotate-usage wrote a new record on ``name``, sampled ``at``."""
    out = []
    for item in nodes:
        copy = cast(Node, {**item, "metadata": {**item["metadata"]}})
        if item["metadata"]["name"] == name:
            annotations = dict(copy["metadata"].get("annotations") or {})
            annotations[USAGE_ANNOTATION] = usage(cpu, at=at)
            copy["metadata"]["annotations"] = annotations
        out.append(copy)
    return out


def test_one_hot_sample_read_again_and_again_never_makes_a_streak() -> None:
    """The issue's spike: one record stays fresh for usage_stale_after (3 min), and a Ping
    every 30 s reads it six times. It is one measurement: the streak counts it once."""
    spike = NOW - timedelta(seconds=10)
    nodes = [a_node("node-a", 95.0, sampled=spike), a_node("node-b", 20.0), a_node("node-c", 20.0)]
    pods = [a_pod("web-7d9c8b6f4-aaaaa", "node-a", cpu="800m")]
    for tick in range(6):
        now = spike + timedelta(seconds=30 * tick)
        result = plan(nodes, pods, index(rs()), CFG, now)
        assert (result.nodes[0].hot, result.nodes[0].streak.hot) == (True, 1)
        assert result.evictions == ()
        nodes = carried(nodes, result)


def test_the_streak_advances_on_each_new_sample_and_acts_on_the_third() -> None:
    start = NOW - timedelta(minutes=2)
    nodes = [a_node("node-a", 95.0, sampled=start), a_node("node-b", 20.0), a_node("node-c", 20.0)]
    pods = [a_pod("web-7d9c8b6f4-aaaaa", "node-a", cpu="800m")]
    seen = []
    for tick in range(6):
        now = start + timedelta(seconds=30 * tick)
        if tick % 2 == 0:
            # annotate-usage writes a new record every other evaluation (its tolerance).
            nodes = resampled(nodes, "node-a", 95.0, now)
        result = plan(nodes, pods, index(rs()), CFG, now)
        seen.append((result.nodes[0].streak.hot, len(result.evictions)))
        nodes = carried(nodes, result)
    # Samples at ticks 0, 2 and 4: the third acts, and acting starts the count again.
    assert seen == [(1, 0), (1, 0), (2, 0), (2, 0), (3, 1), (0, 0)]


def test_the_sample_acted_on_is_never_counted_again() -> None:
    """The record lags the evictions: the numbers that justified them count for nothing
    after, only a sample taken since."""
    nodes = [a_node("node-a", 95.0, **HOT), a_node("node-b", 20.0), a_node("node-c", 20.0)]
    pods = [a_pod("web-7d9c8b6f4-aaaaa", "node-a", cpu="800m")]
    acted = plan(nodes, pods, index(rs()), CFG, NOW)
    assert len(acted.evictions) == 1
    again = plan(carried(nodes, acted), pods, index(rs()), CFG, NOW + timedelta(seconds=30))
    assert (again.nodes[0].streak.hot, again.nodes[0].acting) == (0, False)
    later = plan(
        resampled(carried(nodes, acted), "node-a", 95.0, NOW + timedelta(seconds=60)),
        pods,
        index(rs()),
        CFG,
        NOW + timedelta(seconds=60),
    )
    assert later.nodes[0].streak.hot == 1


# -- do no harm: cordoned and NotReady nodes ------------------------------------------------------


def not_ready(item: Node) -> Node:
    """The node as the node lifecycle controller leaves it once its kubelet stopped posting
    status (pkg/controller/nodelifecycle): Ready Unknown, and the unreachable taints."""
    item["status"]["conditions"] = [
        {
            "type": "Ready",
            "status": "Unknown",
            "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
            "lastHeartbeatTime": "2026-11-23T09:55:40Z",
            "lastTransitionTime": "2026-11-23T09:56:20Z",
        }
    ]
    item["spec"]["taints"] = [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
        {
            "key": "node.kubernetes.io/unreachable",
            "effect": "NoExecute",
            "timeAdded": "2026-11-23T09:56:25Z",
        },
    ]
    return item


def test_cordoned_and_not_ready_nodes_are_left_out_of_the_mean() -> None:
    """A node upgrade: two drained nodes read near zero. Counted, they would lower the mean
    to 33 % and make the healthy nodes at 60 and 55 % "hot" exactly when capacity is short."""
    nodes = [
        a_node("node-a", 60.0, **HOT),
        a_node("node-b", 55.0, **HOT),
        a_node("node-c", 50.0),
        a_node("node-d", 0.0, unschedulable=True),
        not_ready(a_node("node-e", 0.0)),
    ]
    pods = [a_pod("web-7d9c8b6f4-aaaaa", "node-a", cpu="800m")]
    result = plan(nodes, pods, index(rs()), CFG, NOW)
    assert result.bounds.mean_cpu == 55.0
    assert not any(s.hot for s in result.nodes)
    assert result.evictions == ()


def test_a_not_ready_node_is_not_acted_on_its_pods_are_the_node_lifecycle_controllers() -> None:
    nodes = [
        not_ready(a_node("node-a", 95.0, labels={MAINTENANCE_LABEL: "true"}, **HOT)),
        a_node("node-b", 20.0),
        a_node("node-c", 20.0),
    ]
    pods = [a_pod("web-7d9c8b6f4-aaaaa", "node-a", cpu="800m")]
    result = plan(nodes, pods, index(rs()), CFG, NOW)
    assert (result.nodes[0].acting, result.nodes[0].streak.hot) == (False, 0)
    assert "NotReady" in result.nodes[0].why
    assert result.evictions == ()


def test_no_eviction_when_only_cordoned_or_not_ready_nodes_would_take_the_pod() -> None:
    # The pod tolerates every taint: the scheduler's filters would let it onto both.
    anywhere = {"tolerations": [{"operator": "Exists"}]}
    nodes = [
        a_node("node-a", 90.0, **HOT),
        a_node("node-b", 10.0, unschedulable=True),
        not_ready(a_node("node-c", 10.0)),
    ]
    pods = [a_pod("web-7d9c8b6f4-aaaaa", "node-a", spec=anywhere)]
    result = plan(nodes, pods, index(rs()), CFG, NOW)
    assert result.evictions == ()
    said = why_skipped(result, "web-7d9c8b6f4-aaaaa")
    assert "node-b: cordoned" in said
    assert "node-c: NotReady" in said


# -- do no harm: volumes that tie a pod to its node ------------------------------------------------

# Shaped as the API server returns them once the PV controller bound the claim of a
# StatefulSet's volumeClaimTemplate "data" (pkg/controller/volume/persistentvolume: the
# bind-completed and bound-by-controller annotations, the claimRef, phase Bound); the local PV
# as https://kubernetes.io/docs/concepts/storage/volumes/#local shows it.
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def sts(workload: str = "db", *, desired: int = 3) -> Workload:
    return Workload(
        kind="StatefulSet",
        namespace=NAMESPACE,
        name=workload,
        uid=uid(f"StatefulSet/{workload}"),
        opted_in=True,
        opt_in="kn-rescheduler.io/rebalance='true' on the StatefulSet",
        desired=desired,
        ready=desired,
    )


def sts_pod(name: str, on: str, *, claim: str | None = None, **options: Any) -> Pod:
    made = a_pod(name, on, kind="StatefulSet", workload="db", labels={"app": "db"}, **options)
    if claim is not None:
        made["spec"]["volumes"].insert(
            0, {"name": "data", "persistentVolumeClaim": {"claimName": claim}}
        )
        made["spec"]["containers"][0]["volumeMounts"] = [
            {"name": "data", "mountPath": "/var/lib/db"}
        ]
    return made


def persistent_volume(
    name: str,
    claim: str,
    *,
    local_on: str | None = None,
    affinity: list[dict[str, Any]] | None = None,
    labels: Mapping[str, str] | None = None,
    source: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "capacity": {"storage": "100Gi"},
        "volumeMode": "Filesystem",
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "local-storage",
        "claimRef": {
            "kind": "PersistentVolumeClaim",
            "namespace": NAMESPACE,
            "name": claim,
            "uid": uid(f"PersistentVolumeClaim/{claim}"),
            "apiVersion": "v1",
            "resourceVersion": "51234",
        },
    }
    if local_on is not None:
        spec["local"] = {"path": "/mnt/disks/ssd1"}
        affinity = [{"key": HOSTNAME, "operator": "In", "values": [local_on]}]
    spec.update(source or {})
    if affinity is not None:
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": affinity}]}}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "uid": uid(f"PersistentVolume/{name}"),
            "resourceVersion": "51240",
            "labels": dict(labels or {}),
            "annotations": {"pv.kubernetes.io/bound-by-controller": "yes"},
            "finalizers": ["kubernetes.io/pv-protection"],
        },
        "spec": spec,
        "status": {"phase": "Bound", "lastPhaseTransitionTime": "2026-11-23T08:10:02Z"},
    }


def claim_of(
    name: str, volume: dict[str, Any] | None, *, on: str = "node-a", unread: str = ""
) -> Claim:
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid(f"PersistentVolumeClaim/{name}"),
            "labels": {"app": "db"},
            "annotations": {
                "pv.kubernetes.io/bind-completed": "yes",
                "pv.kubernetes.io/bound-by-controller": "yes",
                "volume.kubernetes.io/selected-node": on,
            },
            "finalizers": ["kubernetes.io/pvc-protection"],
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "10Gi"}},
            "storageClassName": "local-storage",
            "volumeMode": "Filesystem",
            "volumeName": volume["metadata"]["name"] if volume else "",
        },
        "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"]}
        if volume
        else {"phase": "Pending"},
    }
    if volume:
        pvc["status"]["capacity"] = {"storage": "100Gi"}
    return Claim(NAMESPACE, name, pvc=pvc, pv=volume, unread=unread)


def claims(*found: Claim) -> dict[str, Claim]:
    return {c.key: c for c in found}


def test_a_pod_on_a_local_volume_stays_since_no_other_node_has_its_disk() -> None:
    """The issue's reproduction: evicted, the pod can only come back to its disk's node, and
    was evicted again four times in six minutes."""
    nodes = [a_node("node-a", 95.0, **HOT), a_node("node-b", 10.0), a_node("node-c", 10.0)]
    pods = [sts_pod("db-0", "node-a", claim="data-db-0")]
    local = persistent_volume("local-pv-node-a", "data-db-0", local_on="node-a")
    result = plan(nodes, pods, index(sts()), CFG, NOW, claims=claims(claim_of("data-db-0", local)))
    assert result.evictions == ()
    said = why_skipped(result, "db-0")
    assert "node-b: volume local-pv-node-a: node affinity" in said
    assert "node-c: volume local-pv-node-a: node affinity" in said


def test_a_pod_on_a_zonal_disk_moves_only_within_its_zone() -> None:
    # A CSI disk's PV names its zone in its node affinity (the external-provisioner copies the
    # driver's accessible topology there).
    zonal = persistent_volume(
        "pvc-3f1c2a",
        "data-db-0",
        affinity=[{"key": ZONE, "operator": "In", "values": ["europe-west1-c"]}],
        source={"csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "disk-1"}},
    )
    nodes = [
        a_node("node-a", 95.0, labels={ZONE: "europe-west1-c"}, **HOT),
        a_node("node-b", 10.0, labels={ZONE: "europe-west1-b"}),  # the coolest, other zone
        a_node("node-c", 30.0, labels={ZONE: "europe-west1-c"}),
    ]
    pods = [sts_pod("db-0", "node-a", claim="data-db-0", cpu="800m")]
    result = plan(nodes, pods, index(sts()), CFG, NOW, claims=claims(claim_of("data-db-0", zonal)))
    assert evicted(result) == [("db-0", "node-c")]


BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"


@pytest.mark.parametrize(
    ("pv_labels", "target_labels", "fits"),
    [
        ({ZONE: "europe-west1-c"}, {ZONE: "europe-west1-c"}, True),
        ({ZONE: "europe-west1-c"}, {ZONE: "europe-west1-b"}, False),
        # A regional disk: the zones joined by "__" (k8s.io/cloud-provider LabelZonesToSet).
        ({ZONE: "europe-west1-b__europe-west1-c"}, {ZONE: "europe-west1-b"}, True),
        # An old PV's beta label against the node's GA label (VolumeZone's translateToGALabel).
        ({BETA_ZONE: "europe-west1-c"}, {ZONE: "europe-west1-c"}, True),
        ({BETA_ZONE: "europe-west1-c"}, {ZONE: "europe-west1-b"}, False),
        # A node with no zone or region label at all takes it: a single-zone cluster.
        ({ZONE: "europe-west1-c"}, {}, True),
    ],
    ids=[
        "same zone",
        "other zone",
        "regional",
        "beta PV label",
        "beta PV label, other",
        "no zones",
    ],
)
def test_a_volume_labelled_with_its_zone_as_the_volume_zone_filter_reads_it(
    pv_labels: dict[str, str], target_labels: dict[str, str], fits: bool
) -> None:
    labelled = persistent_volume("pv-legacy", "data-db-0", labels=pv_labels)
    nodes = [a_node("node-a", 95.0, **HOT), a_node("node-b", 10.0, labels=target_labels)]
    pods = [sts_pod("db-0", "node-a", claim="data-db-0", cpu="800m")]
    found = claims(claim_of("data-db-0", labelled))
    result = plan(nodes, pods, index(sts()), CFG, NOW, claims=found)
    assert bool(result.evictions) is fits
    if not fits:
        assert "node-b: volume pv-legacy: zone" in why_skipped(result, "db-0")


def test_a_volume_any_node_reaches_does_not_hold_the_pod() -> None:
    shared = persistent_volume(
        "pv-nfs", "data-db-0", source={"nfs": {"server": "10.0.0.5", "path": "/exports/db"}}
    )
    nodes = [a_node("node-a", 95.0, **HOT), a_node("node-b", 10.0)]
    pods = [sts_pod("db-0", "node-a", claim="data-db-0", cpu="800m")]
    found = claims(claim_of("data-db-0", shared))
    assert evicted(plan(nodes, pods, index(sts()), CFG, NOW, claims=found)) == [("db-0", "node-b")]


@pytest.mark.parametrize(
    ("found", "why"),
    [
        ({}, "claim data-db-0 was not read"),
        (claims(claim_of("data-db-0", None, unread="forbidden")), "forbidden"),
        (claims(claim_of("data-db-0", None)), "claim data-db-0 is not bound"),
        (
            claims(
                claim_of(
                    "data-db-0",
                    persistent_volume(
                        "pv-host", "data-db-0", source={"hostPath": {"path": "/srv/db"}}
                    ),
                )
            ),
            "hostPath",
        ),
    ],
    ids=["not read", "unreadable", "not bound", "hostPath volume without affinity"],
)
def test_a_pod_whose_volumes_cannot_be_judged_stays(found: dict[str, Claim], why: str) -> None:
    nodes = [a_node("node-a", 95.0, labels={MAINTENANCE_LABEL: "true"}), a_node("node-b", 10.0)]
    pods = [sts_pod("db-0", "node-a", claim="data-db-0")]
    result = plan(nodes, pods, index(sts()), CFG, NOW, claims=found)
    assert result.evictions == ()
    assert why in why_skipped(result, "db-0")


def test_a_pod_with_a_host_path_volume_stays_its_data_is_on_this_node() -> None:
    nodes = [a_node("node-a", 95.0, labels={MAINTENANCE_LABEL: "true"}), a_node("node-b", 10.0)]
    pod = a_pod("web-7d9c8b6f4-aaaaa", "node-a")
    pod["spec"]["volumes"].append(
        {"name": "cache", "hostPath": {"path": "/var/cache/web", "type": "DirectoryOrCreate"}}
    )
    result = plan(nodes, [pod], index(rs()), CFG, NOW)
    assert result.evictions == ()
    assert "hostPath volume cache" in why_skipped(result, "web-7d9c8b6f4-aaaaa")
