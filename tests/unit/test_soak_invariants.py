"""The soak's invariants on records built by hand: each fires on the harm it names and stays
quiet on a clean record.

Pods come from the shared builders (tests/unit/pods.py, shaped as kubelet v1.36 writes them),
with the annotation the local kubelet stamps on every pod it admits (the fault it gave it,
dev/localcluster/kubelet.py). Nodes come from tests/unit/nodes.py, with ``managedFields`` shaped as
the API server writes them for an Update (a merge patch) by a field manager. Events are named as
the product names them (shared/pods/update_annotations/bodies.py ``event_name``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from dev.bench.soak import invariants
from dev.bench.soak.invariants import Forged, NodeSeen, OperatorWrite, PodFacts, Record
from dev.localcluster.keys import (
    SIM_FAULT_LABEL,
)
from shared.api.keys import (
    COMPONENT,
    NODE_HEALTH_ANNOTATION,
    PRESSURE_LABEL_KEY,
    PRESSURE_LABEL_VALUE,
    REASON_REBALANCED,
    REASON_RESCHEDULED,
    REBALANCE_KEY,
    SUSPECT_LABEL,
)
from shared.pods.update_annotations.bodies import event_name
from shared.workloads.owners import Ref
from tests import builders
from tests.unit import nodes, pods

JSON = dict[str, Any]
NS = "shop"
BAD, GOOD = "node-bad", "node-good"


def admitted(pod: Any, fault: str) -> JSON:
    out = copy.deepcopy(dict(pod))
    out["metadata"].setdefault("annotations", {})[SIM_FAULT_LABEL] = fault
    return out


def healthy(name: str = "web-7d9c8b6f4-aaaaa", **kw: Any) -> JSON:
    return admitted(pods.pod(name, NS, node=GOOD, **kw), "none")


def failing(name: str = "web-7d9c8b6f4-bbbbb", node: str = BAD, **kw: Any) -> JSON:
    return admitted(
        pods.pod(name, NS, node=node, containers=[pods.crash_looping()], **kw), "crashloop"
    )


def deleted(pod: JSON) -> JSON:
    out = copy.deepcopy(pod)
    out["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return out


def facts(pod: JSON, *, at: float = 0.0, gone: bool = True, **kw: Any) -> PodFacts:
    return PodFacts(
        before_deletion=pod,
        last=deleted(pod) if gone else pod,
        first_seen=at,
        bound_at=at if pod["spec"].get("nodeName") else None,
        deleting_at=at + 1 if gone else None,
        gone=gone,
        **kw,
    )


def rescheduled_event(pod: JSON) -> JSON:
    owner = pod["metadata"]["ownerReferences"][0]
    ref = Ref(owner["kind"], NS, owner["name"], owner["uid"])
    return builders.event(
        REASON_RESCHEDULED,
        name=event_name(ref, REASON_RESCHEDULED, pod["metadata"]["uid"]),
        namespace=NS,
        kind=ref.kind,
        about=ref.name,
        uid=ref.uid,
    )


def rebalanced_event(pod: JSON) -> JSON:
    meta = pod["metadata"]
    return builders.event(
        REASON_REBALANCED,
        name=f"{meta['name']}.1",
        namespace=NS,
        kind="Pod",
        about=meta["name"],
        uid=meta["uid"],
    )


def record(**kw: Any) -> Record:
    base: dict[str, Any] = {
        "pods": {},
        "nodes": (),
        "operator": (),
        "owners": {},
        "objects": (),
        "faulty_nodes": frozenset({BAD}),
        "recovery_namespaces": frozenset(),
        "ended_at": 100.0,
        "pending_grace": 30.0,
        "evict_window": 60.0,
        "suspect_window": 600.0,
    }
    return Record(**{**base, **kw})


def uid(pod: JSON) -> str:
    return str(pod["metadata"]["uid"])


# -- healthy-pods-untouched ---------------------------------------------------------------------


def test_a_failing_pod_we_moved_is_no_harm() -> None:
    pod = failing()
    found, checked = invariants.healthy_pods_untouched(
        record(pods={uid(pod): facts(pod)}, objects=[rescheduled_event(pod)])
    )
    assert (found, checked) == ([], 1)


def test_a_healthy_pod_we_moved_is_harm() -> None:
    pod = healthy()
    found, _ = invariants.healthy_pods_untouched(
        record(pods={uid(pod): facts(pod)}, objects=[rescheduled_event(pod)])
    )
    assert [v.invariant for v in found] == ["healthy-pods-untouched"]
    assert found[0].evidence["node"] == GOOD


def test_a_healthy_pod_someone_else_removed_is_not_ours_to_answer_for() -> None:
    pod = healthy()
    found, checked = invariants.healthy_pods_untouched(record(pods={uid(pod): facts(pod)}))
    assert (found, checked) == ([], 0)


def test_a_rebalanced_pod_is_harm_unless_its_workload_opted_in() -> None:
    pod = healthy()
    rs = {
        "kind": "ReplicaSet",
        "metadata": {
            "name": "web-7d9c8b6f4",
            "namespace": NS,
            "uid": pod["metadata"]["ownerReferences"][0]["uid"],
            "annotations": {},
        },
    }
    opted = copy.deepcopy(rs)
    opted["metadata"]["annotations"][REBALANCE_KEY] = "true"
    for holder, harm in ((rs, True), (opted, False)):
        found, _ = invariants.healthy_pods_untouched(
            record(pods={uid(pod): facts(pod)}, objects=[rebalanced_event(pod), holder])
        )
        assert bool(found) is harm


# -- foreign-labels-untouched -------------------------------------------------------------------


def managed(node: JSON, manager: str, *labels: str) -> JSON:
    out = copy.deepcopy(node)
    out["metadata"]["managedFields"] = [
        {
            "manager": manager,
            "operation": "Update",
            "apiVersion": "v1",
            "time": "2026-01-01T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in labels}}},
        }
    ]
    return out


def seen(node: JSON, at: float = 0.0) -> NodeSeen:
    return NodeSeen(at, node)


OPERATOR = OperatorWrite(
    "node-1",
    rv=100,
    labels={"status": "active", "topology.kubernetes.io/zone": "zone-a"},
    taints=({"key": "dedicated", "value": "batch", "effect": "PreferNoSchedule"},),
)
KEPT = nodes.node(
    "node-1",
    labels={"status": "active", "topology.kubernetes.io/zone": "zone-a"},
    taints=[{"key": "dedicated", "value": "batch", "effect": "PreferNoSchedule"}],
    resource_version="120",
)


def test_operator_labels_kept_are_no_harm() -> None:
    found, checked = invariants.foreign_labels_untouched(
        record(nodes=[seen(KEPT)], operator=[OPERATOR])
    )
    assert (found, checked) == ([], 1)


@pytest.mark.parametrize(
    "change",
    [
        lambda n: n["metadata"]["labels"].update({"status": PRESSURE_LABEL_VALUE}),
        lambda n: n["metadata"]["labels"].pop("topology.kubernetes.io/zone"),
        lambda n: n["spec"].pop("taints"),
        lambda n: n["spec"].update({"unschedulable": True}),
    ],
    ids=["status overwritten", "zone removed", "taint removed", "cordoned"],
)
def test_an_operator_label_taint_or_cordon_changed_is_harm(change: Callable[[JSON], None]) -> None:
    node = copy.deepcopy(KEPT)
    change(node)
    write = replace(OPERATOR, unschedulable=False)
    found, _ = invariants.foreign_labels_untouched(record(nodes=[seen(node)], operator=[write]))
    assert [v.invariant for v in found] == ["foreign-labels-untouched"]


def test_a_version_older_than_the_operators_write_is_not_judged_by_it() -> None:
    older = nodes.node("node-1", resource_version="90")
    found, checked = invariants.foreign_labels_untouched(
        record(nodes=[seen(older)], operator=[OPERATOR])
    )
    assert (found, checked) == ([], 0)


def test_our_pressure_label_is_ours_only_where_the_operator_set_no_status() -> None:
    mine = managed(
        nodes.node("node-2", labels={PRESSURE_LABEL_KEY: PRESSURE_LABEL_VALUE}),
        COMPONENT,
        PRESSURE_LABEL_KEY,
        SUSPECT_LABEL,
    )
    assert invariants.foreign_labels_untouched(record(nodes=[seen(mine)]))[0] == []
    theirs = managed(KEPT, COMPONENT, PRESSURE_LABEL_KEY)
    found, _ = invariants.foreign_labels_untouched(
        record(nodes=[seen(theirs)], operator=[OPERATOR])
    )
    assert [v.subject for v in found] == ["Node node-1"]
    assert "owns the foreign label status" in found[0].message


def test_a_foreign_label_written_by_our_manager_is_harm() -> None:
    node = managed(nodes.node("node-2", labels={"pool": "general"}), COMPONENT, "pool")
    found, _ = invariants.foreign_labels_untouched(record(nodes=[seen(node)]))
    assert [v.invariant for v in found] == ["foreign-labels-untouched"]


# -- system-critical-scheduled ------------------------------------------------------------------


def critical(name: str = "coredns-5d78c9869d-x2x9z", **kw: Any) -> JSON:
    pod = copy.deepcopy(dict(pods.pod(name, "kube-system", **kw)))
    pod["spec"]["priorityClassName"] = "system-cluster-critical"
    pod["spec"]["priority"] = 2_000_000_000
    return pod


def test_a_system_critical_pod_scheduled_in_time_is_no_harm() -> None:
    pod = critical()
    f = PodFacts(before_deletion=pod, last=pod, first_seen=10.0, bound_at=15.0)
    assert invariants.system_critical_scheduled(record(pods={uid(pod): f})) == ([], 1)


def test_a_system_critical_pod_pending_past_the_grace_is_harm() -> None:
    pod = critical(node=None, phase="Pending")
    pod["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/6 nodes are available: 1 node CPU usage over 80 percent.",
        }
    ]
    f = PodFacts(before_deletion=pod, last=pod, first_seen=10.0)
    found, _ = invariants.system_critical_scheduled(record(pods={uid(pod): f}, ended_at=100.0))
    assert [v.invariant for v in found] == ["system-critical-scheduled"]
    assert "CPU usage over 80 percent" in found[0].evidence["message"]
    # An ordinary pod waiting as long is not this invariant's business.
    plain = dict(pods.pod("web-1", NS, node=None, phase="Pending"))
    g = PodFacts(before_deletion=plain, last=plain, first_seen=10.0)
    assert invariants.system_critical_scheduled(record(pods={uid(plain): g})) == ([], 0)


# -- evicted-once-per-reason --------------------------------------------------------------------


def member(name: str, at: float) -> tuple[str, PodFacts, JSON]:
    pod = admitted(pods.pod(name, NS, owner=("StatefulSet", "cache"), node=GOOD), "none")
    pod["metadata"]["uid"] = pods.uid(f"{name}@{at}")
    return uid(pod), facts(pod, at=at), rebalanced_event(pod)


def test_a_statefulset_pod_rebalanced_twice_within_the_window_is_a_loop() -> None:
    a, b = member("cache-0", 10.0), member("cache-0", 40.0)
    found, checked = invariants.evicted_once_per_reason(
        record(pods={a[0]: a[1], b[0]: b[1]}, objects=[a[2], b[2]])
    )
    assert checked == 2
    assert [v.subject for v in found] == [f"StatefulSet {NS}/cache pod cache-0"]


def test_removals_further_apart_than_the_window_or_of_other_pods_are_no_loop() -> None:
    a, b, c = member("cache-0", 10.0), member("cache-0", 200.0), member("cache-1", 20.0)
    found, checked = invariants.evicted_once_per_reason(
        record(pods={x[0]: x[1] for x in (a, b, c)}, objects=[a[2], b[2], c[2]])
    )
    assert (found, checked) == ([], 3)


# -- suspect-needs-two-workloads ----------------------------------------------------------------


def job_pod(job: str, at: float) -> tuple[str, PodFacts, JSON]:
    """A pod of a CronJob's run ``job`` failing on BAD, and the Job that owns it."""
    pod = failing(f"{job}-x2x9z", owner=("Job", job))
    job_obj = {
        "kind": "Job",
        "metadata": {
            "name": job,
            "namespace": NS,
            "uid": pod["metadata"]["ownerReferences"][0]["uid"],
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "CronJob",
                    "name": "report",
                    "uid": "cj-uid",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
    }
    return uid(pod), replace(facts(pod, at=at, gone=False), failing_at=at), job_obj


def suspect_at(at: float) -> list[NodeSeen]:
    return [
        seen(nodes.node(BAD, resource_version="1"), 0.0),
        seen(nodes.node(BAD, labels={SUSPECT_LABEL: "true"}, resource_version="2"), at),
    ]


def test_a_node_suspect_for_one_cronjobs_runs_is_harm() -> None:
    a, b = job_pod("report-29000001", 10.0), job_pod("report-29000002", 70.0)
    found, checked = invariants.suspect_needs_two_workloads(
        record(
            pods={a[0]: a[1], b[0]: b[1]},
            owners={a[2]["metadata"]["uid"]: a[2], b[2]["metadata"]["uid"]: b[2]},
            nodes=suspect_at(80.0),
        )
    )
    assert checked == 1
    assert [v.invariant for v in found] == ["suspect-needs-two-workloads"]
    assert found[0].evidence["workloads"] == [f"CronJob {NS}/report"]


def test_a_node_suspect_for_two_workloads_is_no_harm() -> None:
    a = job_pod("report-29000001", 10.0)
    web = failing()
    f = replace(facts(web, at=20.0, gone=False), failing_at=20.0)
    found, checked = invariants.suspect_needs_two_workloads(
        record(
            pods={a[0]: a[1], uid(web): f},
            owners={a[2]["metadata"]["uid"]: a[2]},
            nodes=suspect_at(80.0),
        )
    )
    assert (found, checked) == ([], 1)


def test_failures_after_the_node_turned_suspect_do_not_excuse_it() -> None:
    a = job_pod("report-29000001", 10.0)
    web = failing()
    late = replace(facts(web, at=90.0, gone=False), failing_at=90.0)
    found, _ = invariants.suspect_needs_two_workloads(
        record(
            pods={a[0]: a[1], uid(web): late},
            owners={a[2]["metadata"]["uid"]: a[2]},
            nodes=suspect_at(80.0),
        )
    )
    assert len(found) == 1


# -- node-fixable-recovered ---------------------------------------------------------------------


def test_a_replica_left_on_a_faulty_node_is_not_recovered() -> None:
    deployment = {
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS, "uid": "dep-uid"},
        "spec": {"replicas": 1},
    }
    rs = {
        "kind": "ReplicaSet",
        "metadata": {
            "name": "web-7d9c8b6f4",
            "namespace": NS,
            "uid": pods.uid("ReplicaSet/web-7d9c8b6f4"),
            "ownerReferences": [
                {"kind": "Deployment", "name": "web", "uid": "dep-uid", "controller": True}
            ],
        },
        "spec": {"replicas": 1},
    }
    good, bad = healthy(), failing()
    for pod, harm in ((good, False), (bad, True)):
        found, checked = invariants.node_fixable_recovered(
            record(
                objects=[deployment, rs, {**pod, "kind": "Pod"}],
                pods={uid(pod): facts(pod, gone=False)},
                recovery_namespaces=frozenset({NS}),
            )
        )
        assert checked == 1
        assert bool(found) is harm


def test_check_names_every_invariant_and_counts_what_it_looked_at() -> None:
    pod = healthy()
    verdict = invariants.check(
        record(pods={uid(pod): facts(pod)}, objects=[rescheduled_event(pod)])
    )
    assert set(verdict.checked) == set(invariants.INVARIANTS)
    assert verdict.to_json()["violations_by_invariant"]["healthy-pods-untouched"] == 1


# -- budget-kept-when-broken-everywhere ---------------------------------------------------------

BROKEN = f"Deployment {NS}/web"


def web_replica_set() -> JSON:
    """The ReplicaSet the builders' pods belong to, owned by the Deployment ``web``."""
    return {
        "kind": "ReplicaSet",
        "metadata": {
            "name": "web-7d9c8b6f4",
            "namespace": NS,
            "uid": pods.uid("ReplicaSet/web-7d9c8b6f4"),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "web",
                    "uid": "deploy-uid",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
    }


def said_about_the_replica_set(reason: str, count: int = 1) -> JSON:
    rs = web_replica_set()["metadata"]
    return builders.event(
        reason,
        name=f"web-7d9c8b6f4.{reason.lower()}",
        namespace=NS,
        kind="ReplicaSet",
        about=rs["name"],
        uid=rs["uid"],
        count=count,
    )


def broken_everywhere(moved: int, *events: JSON) -> Record:
    """A Deployment of 2 replicas with a budget of 6 moves, ``moved`` of its pods moved by us."""
    ps = [failing(f"web-7d9c8b6f4-{i:05d}", node=f"node-{i}") for i in range(max(moved, 2))]
    moves = [rescheduled_event(p) for p in ps[:moved]]
    rs = web_replica_set()
    return record(
        pods={uid(p): facts(p, gone=i < moved) for i, p in enumerate(ps)},
        owners={rs["metadata"]["uid"]: rs},
        objects=[*moves, *events],
        broken={BROKEN: 6},
    )


def test_a_workload_broken_everywhere_that_stopped_with_its_budget_kept_is_no_harm() -> None:
    found, checked = invariants.budget_kept_when_broken_everywhere(
        broken_everywhere(2, said_about_the_replica_set("MovesStopped"))
    )
    assert (found, checked) == ([], 1)


@pytest.mark.parametrize(
    ("moved", "events", "what"),
    [
        (6, (), "moved 6 time(s) of 6"),
        (3, (said_about_the_replica_set("RetriesExhausted"),), "until RetriesExhausted"),
        (2, (said_about_the_replica_set("MovesStopped", count=4),), "said more than once"),
    ],
    ids=["whole-budget", "exhausted", "stop-said-again-and-again"],
)
def test_a_workload_broken_everywhere_that_spent_its_budget_or_kept_saying_so_is_harm(
    moved: int, events: tuple[JSON, ...], what: str
) -> None:
    found, checked = invariants.budget_kept_when_broken_everywhere(
        broken_everywhere(moved, *events)
    )
    assert checked == 1
    assert [v.subject for v in found] == [BROKEN]
    assert what in found[0].message


def test_a_workload_not_known_to_be_broken_is_not_judged_by_it() -> None:
    found, checked = invariants.budget_kept_when_broken_everywhere(
        replace(broken_everywhere(6), broken={})
    )
    assert (found, checked) == ([], 0)


# -- the lookalikes and the forger --------------------------------------------------------------
#
# Times are on the harness's clock: seconds since the epoch, around the builders' NOW.

T = pods.NOW.timestamp()
LOOKALIKES = {
    "Job shop/nightly-import": "terminal",
    "Deployment shop/broken": "everywhere",
    "Deployment shop/analytics": "slow-pull",
    "Deployment shop/edge": "multus",
}


def of(name: str, rs_hash: str = "7d9c8b6f4") -> dict[str, Any]:
    """The ReplicaSet ``<name>-<hash>`` of the Deployment ``name`` (what the owner watch keeps)."""
    rs = f"{name}-{rs_hash}"
    return {
        "kind": "ReplicaSet",
        "metadata": {
            "name": rs,
            "namespace": NS,
            "uid": pods.uid(f"ReplicaSet/{rs}"),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": name,
                    "uid": f"{name}-deploy-uid",
                    "controller": True,
                }
            ],
        },
    }


def owners(*names: str) -> dict[str, JSON]:
    return {o["metadata"]["uid"]: o for o in (of(n) for n in names)}


def replica(deployment: str, suffix: str, node: str, containers: Any, **kw: Any) -> JSON:
    rs = f"{deployment}-7d9c8b6f4"
    fault = "none" if node == GOOD else "crashloop"
    return admitted(
        pods.pod(
            f"{rs}-{suffix}",
            NS,
            owner=("ReplicaSet", rs),
            node=node,
            containers=containers,
            labels={"app": deployment, "pod-template-hash": "7d9c8b6f4"},
            **kw,
        ),
        fault,
    )


def moved(pod: JSON, at: float = T, **kw: Any) -> PodFacts:
    """A pod we removed at ``at``, last seen (and read by the move) as ``pod``."""
    return replace(
        facts(pod, at=at - 60.0),
        deleting_at=at,
        failing_at=at - 30.0,
        recent=((at - 1.0, pod),),
        **kw,
    )


def reply(pod: JSON, message: str = "moved", **data: Any) -> JSON:
    return {
        "type": "io.kn-rescheduler.pod.rescheduled",
        "id": f"rescheduled-{uid(pod)}",
        "data": {"uid": uid(pod), "name": pod["metadata"]["name"], "message": message, **data},
    }


EARLY = (
    "moved pod x off node node-bad after CrashLoopBackOff (move 1 of 4); before the thresholds: "
)


# -- suspect-needs-two-workloads, with lookalikes ---------------------------------------------


def suspected(node: str, *failing: JSON) -> Record:
    """``node`` turned suspect at 80 s; ``failing`` pods failed there from 20 s."""
    return record(
        pods={uid(p): replace(facts(p, at=20.0, gone=False), failing_at=20.0) for p in failing},
        owners=owners("web", "broken"),
        nodes=[
            seen(nodes.node(node, resource_version="1"), 0.0),
            seen(nodes.node(node, labels={SUSPECT_LABEL: "true"}, resource_version="2"), 80.0),
        ],
        lookalikes=LOOKALIKES,
    )


def test_a_healthy_node_suspect_for_one_workload_and_a_lookalike_is_harm() -> None:
    web = replica("web", "aaaaa", GOOD, [pods.crash_looping()])
    broken = replica("broken", "bbbbb", GOOD, [pods.crash_looping()])
    found, checked = invariants.suspect_needs_two_workloads(suspected(GOOD, web, broken))
    assert checked == 1
    assert [v.evidence["workloads"] for v in found] == [[f"Deployment {NS}/web"]]
    assert found[0].evidence["lookalikes"] == {f"Deployment {NS}/broken": "everywhere"}
    # Without the lookalike rule the same record is no harm: two workloads failed there.
    plain = replace(suspected(GOOD, web, broken), lookalikes={})
    assert invariants.suspect_needs_two_workloads(plain) == ([], 1)


def test_on_a_node_with_a_fault_a_lookalike_fails_for_the_node_too() -> None:
    web = replica("web", "aaaaa", BAD, [pods.crash_looping()])
    broken = replica("broken", "bbbbb", BAD, [pods.crash_looping()])
    assert invariants.suspect_needs_two_workloads(suspected(BAD, web, broken)) == ([], 1)


# -- bad-nodes-at-once-recovered ----------------------------------------------------------------


def spread(node: str) -> Record:
    deployment = {
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS, "uid": "web-deploy-uid"},
        "spec": {"replicas": 1},
    }
    rs = {**of("web"), "spec": {"replicas": 1}}
    pod = replica(
        "web", "ccccc", node, [pods.running()] if node == GOOD else [pods.crash_looping()]
    )
    return record(
        objects=[deployment, rs, {**pod, "kind": "Pod"}],
        owners={rs["metadata"]["uid"]: rs},
        pods={uid(pod): facts(pod, gone=False)},
        must_recover=frozenset({f"Deployment {NS}/web"}),
    )


def test_a_deployment_preferring_the_bad_nodes_must_end_ready_on_a_healthy_node() -> None:
    assert invariants.bad_nodes_at_once_recovered(spread(GOOD)) == ([], 1)
    found, checked = invariants.bad_nodes_at_once_recovered(spread(BAD))
    assert checked == 1
    assert [v.invariant for v in found] == ["bad-nodes-at-once-recovered"]
    assert "0 of 1 replicas" in found[0].message


def test_a_deployment_to_recover_that_is_gone_is_harm() -> None:
    empty = replace(spread(GOOD), objects=())
    found, _ = invariants.bad_nodes_at_once_recovered(empty)
    assert [v.message for v in found] == ["the Deployment is gone"]


# -- lookalikes-left-alone ------------------------------------------------------------------------


def slow_pull() -> JSON:
    return replica(
        "analytics",
        "ddddd",
        GOOD,
        [pods.waiting("ContainerCreating")],
        phase="Pending",
    )


def test_a_slow_pull_left_alone_is_no_harm_and_moved_is_harm() -> None:
    pod = slow_pull()
    alone = record(
        pods={uid(pod): facts(pod, gone=False)},
        owners=owners("analytics"),
        lookalikes=LOOKALIKES,
    )
    assert invariants.lookalikes_left_alone(alone) == ([], 1)
    found, _ = invariants.lookalikes_left_alone(
        replace(alone, pods={uid(pod): moved(pod)}, objects=[rescheduled_event(pod)])
    )
    assert [v.invariant for v in found] == ["lookalikes-left-alone"]
    assert "slow-pull" in found[0].message
    charged = replace(alone, state_written={of("analytics")["metadata"]["uid"]: T})
    assert [v.subject for v in invariants.lookalikes_left_alone(charged)[0]] == [
        f"Deployment {NS}/analytics"
    ]


def test_a_workload_broken_everywhere_is_not_this_invariants_to_judge() -> None:
    pod = replica("broken", "eeeee", BAD, [pods.crash_looping()])
    found, checked = invariants.lookalikes_left_alone(
        record(
            pods={uid(pod): moved(pod)},
            owners=owners("broken"),
            objects=[rescheduled_event(pod)],
            lookalikes=LOOKALIKES,
        )
    )
    assert (found, checked) == ([], 0)


# -- no-mark-from-a-lookalike ---------------------------------------------------------------------


def marked(node: str, value: float, at: float) -> list[NodeSeen]:
    return [
        seen(nodes.node(node, resource_version="1"), at - 5),
        seen(
            nodes.node(
                node, labels={"kn-rescheduler.io/moved-off": str(int(value))}, resource_version="2"
            ),
            at,
        ),
    ]


def marked_by(deployment: str) -> Record:
    pod = replica(deployment, "fffff", GOOD, [pods.crash_looping()])
    return record(
        pods={uid(pod): moved(pod, at=T + 1.0)},
        owners=owners(deployment),
        objects=[rescheduled_event(pod)],
        nodes=marked(GOOD, T, T + 0.5),
        lookalikes=LOOKALIKES,
    )


def test_a_moved_off_mark_written_by_a_move_of_a_workload_a_node_can_fail_is_no_harm() -> None:
    assert invariants.no_mark_from_a_lookalike(marked_by("web")) == ([], 1)


def test_a_moved_off_mark_written_by_a_lookalikes_move_is_harm() -> None:
    found, checked = invariants.no_mark_from_a_lookalike(marked_by("broken"))
    assert checked == 1
    assert [v.subject for v in found] == [f"Node {GOOD}"]
    assert f"Deployment {NS}/broken" in found[0].message


def test_a_lookalikes_move_off_a_node_with_a_fault_explains_its_mark() -> None:
    pod = replica("broken", "fffff", BAD, [pods.crash_looping()])
    off_bad = record(
        pods={uid(pod): moved(pod, at=T + 1.0)},
        owners=owners("broken"),
        objects=[rescheduled_event(pod)],
        nodes=marked(BAD, T, T + 0.5),
        lookalikes=LOOKALIKES,
    )
    assert invariants.no_mark_from_a_lookalike(off_bad) == ([], 1)


def test_a_moved_off_mark_with_no_move_of_ours_is_harm() -> None:
    found, _ = invariants.no_mark_from_a_lookalike(
        record(nodes=marked(GOOD, T, T + 0.5), lookalikes=LOOKALIKES)
    )
    assert "with no move of ours" in found[0].message


# -- moved-on-evidence ----------------------------------------------------------------------------


def on_bad(name: str, suffix: str, restarts: int) -> JSON:
    return replica(name, suffix, BAD, [pods.crash_looping(restarts=restarts)])


def judged(*entries: tuple[JSON, PodFacts], replies: Any = (), **kw: Any) -> Record:
    objects = [rescheduled_event(p) for p, f in entries if f.deleting_at is not None]
    return record(
        pods={uid(p): f for p, f in entries},
        owners=owners("web", "db", "broken"),
        objects=objects,
        replies=list(replies),
        ended_at=T + 100.0,
        **kw,
    )


def test_a_move_at_the_full_threshold_needs_no_evidence() -> None:
    pod = on_bad("web", "ggggg", restarts=4)  # back-off 1m20s: 4 failures in a row
    assert invariants.moved_on_evidence(judged((pod, moved(pod)))) == ([], 1)


def test_a_move_before_the_threshold_with_no_evidence_said_is_harm() -> None:
    pod = on_bad("web", "hhhhh", restarts=1)  # back-off 10s: one failure in a row
    found, checked = invariants.moved_on_evidence(judged((pod, moved(pod)), replies=[reply(pod)]))
    assert checked == 1
    assert [v.invariant for v in found] == ["moved-on-evidence"]
    assert found[0].evidence["rule"] == "thresholds"


def test_a_move_on_a_suspect_node_needs_the_node_suspect_then() -> None:
    pod = on_bad("web", "iiiii", restarts=1)
    said = reply(pod, EARLY + f"node {BAD} is suspect: moved at first failure")
    suspect = invariants.moved_on_evidence(
        judged((pod, moved(pod)), replies=[said], nodes=suspect_at(T - 10))
    )
    assert suspect == ([], 1)
    not_yet = invariants.moved_on_evidence(
        judged((pod, moved(pod)), replies=[said], nodes=suspect_at(T + 10))
    )
    assert [v.evidence["rule"] for v in not_yet[0]] == ["suspect-node"]
    # The watches lag: the suspect version (revision 2) was seen after the deletion (revision
    # 5) by the harness's clock, but etcd's revisions say it came first.
    late_seen = invariants.moved_on_evidence(
        judged((pod, moved(pod, deleting_rv=5)), replies=[said], nodes=suspect_at(T + 10))
    )
    assert late_seen == ([], 1)
    written_after = invariants.moved_on_evidence(
        judged((pod, moved(pod, deleting_rv=1)), replies=[said], nodes=suspect_at(T - 10))
    )
    assert [v.evidence["rule"] for v in written_after[0]] == ["suspect-node"]


def test_another_workload_failing_beside_it_is_evidence_a_pod_left_terminal_is_not() -> None:
    pod = on_bad("web", "jjjjj", restarts=1)
    said = reply(pod, EARLY + f"corroborated: 1 other workload(s) fail on node {BAD} now (x)")
    beside = on_bad("db", "kkkkk", restarts=1)
    failing_beside = replace(facts(beside, at=T - 30, gone=False), failing_at=T - 20)
    assert invariants.moved_on_evidence(
        judged((pod, moved(pod)), (beside, failing_beside), replies=[said])
    ) == ([], 1)
    left = admitted(
        pods.pod(
            "nightly-import-evic0",
            NS,
            owner=("Job", "nightly-import"),
            node=BAD,
            phase="Failed",
            reason="Evicted",
            containers=[pods.terminated("Error", 137)],
        ),
        "terminal",
    )
    history = replace(facts(left, at=T - 30, gone=False), failing_at=T - 20)
    found, _ = invariants.moved_on_evidence(
        judged((pod, moved(pod)), (left, history), replies=[said])
    )
    assert [v.evidence["rule"] for v in found] == ["other-workloads"]


def test_on_a_healthy_node_a_lookalike_failing_beside_it_is_no_evidence() -> None:
    pod = replica("web", "sssss", GOOD, [pods.crash_looping(restarts=1)])
    said = reply(pod, EARLY + f"corroborated: 1 other workload(s) fail on node {GOOD} now (x)")
    broken = replica("broken", "ttttt", GOOD, [pods.crash_looping(restarts=1)])
    beside = replace(facts(broken, at=T - 30, gone=False), failing_at=T - 20)
    found, _ = invariants.moved_on_evidence(
        judged((pod, moved(pod)), (broken, beside), replies=[said], lookalikes=LOOKALIKES)
    )
    assert [v.evidence["rule"] for v in found] == ["other-workloads"]
    assert "only lookalike(s)" in found[0].message
    # The same witness on a node with a fault: the node fails it too.
    assert invariants.moved_on_evidence(
        judged(
            (pod, moved(pod)),
            (broken, beside),
            replies=[said],
            lookalikes=LOOKALIKES,
            faulty_nodes=frozenset({GOOD}),
        )
    ) == ([], 1)


def test_a_twin_of_a_workload_broken_everywhere_proves_nothing() -> None:
    pod = replica("broken", "uuuuu", GOOD, [pods.crash_looping(restarts=1)])
    said = reply(pod, "", evidence={"rule": "ready-elsewhere"})
    twin = replica("broken", "vvvvv", BAD, [pods.running()])
    ready = replace(facts(twin, at=T - 60, gone=False), ready_changes=((T - 60, True),))
    found, _ = invariants.moved_on_evidence(
        judged((pod, moved(pod)), (twin, ready), replies=[said], lookalikes=LOOKALIKES)
    )
    assert "fails on every node" in found[0].message


def test_the_health_record_naming_another_workload_is_evidence() -> None:
    pod = on_bad("web", "lllll", restarts=1)
    said = reply(pod, EARLY + f"corroborated: 1 other workload(s) failed on node {BAD} within")
    record_ = json.dumps(
        {
            "version": 1,
            "failures": [
                {
                    "at": pods.ts(pods.NOW - timedelta(minutes=2)),
                    "workload": f"Deployment {NS}/db",
                    "pod": "db-uid",
                    "reason": "CrashLoopBackOff",
                }
            ],
        }
    )
    node = nodes.node(BAD, annotations={NODE_HEALTH_ANNOTATION: record_}, resource_version="3")
    assert invariants.moved_on_evidence(
        judged((pod, moved(pod)), replies=[said], nodes=[seen(node, T - 5)])
    ) == ([], 1)


def test_a_twin_ready_elsewhere_is_evidence_only_while_it_is_ready() -> None:
    pod = on_bad("web", "mmmmm", restarts=1)
    said = reply(
        pod, "", evidence={"rule": "ready-elsewhere", "why": "twin", "judgedAt": "2026-03-14"}
    )
    twin = replica("web", "nnnnn", GOOD, [pods.running()])
    ready = replace(facts(twin, at=T - 60, gone=False), ready_changes=((T - 60, True),))
    assert invariants.moved_on_evidence(
        judged((pod, moved(pod)), (twin, ready), replies=[said])
    ) == ([], 1)
    crashed = replace(ready, ready_changes=((T - 60, True), (T - 5, False)))
    found, _ = invariants.moved_on_evidence(
        judged((pod, moved(pod)), (twin, crashed), replies=[said])
    )
    assert [v.evidence["rule"] for v in found] == ["ready-elsewhere"]


def test_what_the_move_read_a_moment_before_the_last_status_counts() -> None:
    # Moved in CrashLoopBackOff at the threshold; the kubelet restarted it (Running, Ready)
    # between the read and the removal.
    failing = on_bad("web", "ooooo", restarts=4)
    restarted = replica(
        "web",
        "ooooo",
        BAD,
        [pods.running(restarts=4, started=pods.NOW, last=pods.last_terminated("Error", 1))],
    )
    f = replace(moved(restarted), recent=((T - 2.0, failing), (T - 0.5, restarted)))
    assert invariants.moved_on_evidence(judged((restarted, f))) == ([], 1)


def test_a_pod_its_controller_removed_first_is_moved_on_the_kubelets_own_event() -> None:
    pod = replica("web", "wwwww", BAD, [pods.running()])
    said = reply(pod, "", evidence={"rule": "kubelet-event"})
    assert [
        v.evidence["rule"]
        for v in invariants.moved_on_evidence(judged((pod, moved(pod)), replies=[said]))[0]
    ] == ["kubelet-event"]
    kubelet = {
        **builders.event(
            "OutOfcpu",
            name="web.1",
            namespace=NS,
            kind="Pod",
            about=pod["metadata"]["name"],
            uid=uid(pod),
        ),
        "type": "Warning",
        "source": {"component": "kubelet", "host": BAD},
    }
    with_event = judged((pod, moved(pod)), replies=[said])
    assert invariants.moved_on_evidence(
        replace(with_event, objects=[*with_event.objects, kubelet])
    ) == ([], 1)


@pytest.mark.parametrize(
    ("message", "evidence", "rule"),
    [
        ("moved pod x off node n after OOMKilled (move 1 of 3)", None, "thresholds"),
        (EARLY + "node n is suspect: moved at first failure", None, "suspect-node"),
        (
            EARLY + "corroborated: 2 other workload(s) fail on node n now (a, b)",
            None,
            "other-workloads",
        ),
        (
            EARLY + "corroborated: 1 pod(s) of its ReplicaSet are Ready elsewhere (p)",
            None,
            "ready-elsewhere",
        ),
        (EARLY + "node n is suspect", {"rule": "other-workloads"}, "other-workloads"),
    ],
)
def test_the_rule_of_a_move_is_its_replys_evidence_else_its_message(
    message: str, evidence: JSON | None, rule: str
) -> None:
    data: JSON = {"message": message}
    if evidence is not None:
        data["evidence"] = evidence
    assert invariants.said_rule({"data": data}) == rule
    assert invariants.said_rule(None) is None


# -- forged-claims-change-nothing -----------------------------------------------------------------


def forged(*named: JSON) -> Forged:
    return Forged(
        pods={uid(p): f"{NS}/{p['metadata']['name']}" for p in named},
        nodes=frozenset({GOOD}),
        made_up_uids=frozenset({"ghost-uid"}),
        made_up_workloads=frozenset({f"{NS}/ghost", f"{NS}/ghost-5d8f7c9b4"}),
        ids=frozenset({"forged-1"}),
    )


def health(node: str, *entries: JSON) -> NodeSeen:
    raw = json.dumps({"version": 1, "failures": list(entries)})
    return seen(
        nodes.node(node, annotations={NODE_HEALTH_ANNOTATION: raw}, resource_version="7"), T
    )


def entry(workload: str, pod: str) -> JSON:
    return {"at": pods.ts(pods.NOW), "workload": workload, "pod": pod, "reason": "Evicted"}


def test_forged_claims_about_healthy_pods_that_changed_nothing_are_no_harm() -> None:
    target = healthy("api-7d9c8b6f4-ppppp")
    clean = record(
        pods={uid(target): facts(target, gone=False)},
        nodes=[health(GOOD, entry(f"Deployment {NS}/web", "web-uid"))],
        forged=forged(target),
    )
    found, checked = invariants.forged_claims_change_nothing(clean)
    assert found == [] and checked == 2


@pytest.mark.parametrize(
    "harm",
    ["removed", "charged", "made-up workload counted", "named pod counted", "our event"],
)
def test_a_forged_claim_that_changed_something_is_harm(harm: str) -> None:
    target = healthy("api-7d9c8b6f4-qqqqq")
    holder = target["metadata"]["ownerReferences"][0]["uid"]
    base = record(pods={uid(target): facts(target, gone=False)}, forged=forged(target))
    changed = {
        "removed": replace(
            base, pods={uid(target): facts(target)}, objects=[rescheduled_event(target)]
        ),
        "charged": replace(base, state_written={holder: T}),
        "made-up workload counted": replace(
            base, nodes=[health(GOOD, entry(f"ReplicaSet {NS}/ghost-5d8f7c9b4", "x"))]
        ),
        "named pod counted": replace(
            base, nodes=[health(GOOD, entry(f"Deployment {NS}/api", uid(target)))]
        ),
        "our event": replace(
            base,
            objects=[
                {
                    **builders.event(
                        "MovesStopped",
                        name="ghost.1",
                        namespace=NS,
                        kind="ReplicaSet",
                        about="ghost-5d8f7c9b4",
                        uid="made-up",
                        message=f"moves of {NS}/ghost-5d8f7c9b4 stopped",
                    ),
                    "source": {"component": COMPONENT},
                }
            ],
        ),
    }[harm]
    found, _ = invariants.forged_claims_change_nothing(changed)
    assert [v.invariant for v in found] == ["forged-claims-change-nothing"], found


def test_a_named_pod_the_operator_drained_away_is_not_the_forgers_doing() -> None:
    target = healthy("api-7d9c8b6f4-rrrrr")
    drained = record(
        pods={uid(target): facts(target)},
        operator=[OperatorWrite(GOOD, rv=5, unschedulable=True)],
        forged=forged(target),
    )
    assert invariants.forged_claims_change_nothing(drained)[0] == []
