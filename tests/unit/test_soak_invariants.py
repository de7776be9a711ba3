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
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from dev.bench.soak import invariants
from dev.bench.soak.invariants import NodeSeen, OperatorWrite, PodFacts, Record
from dev.localcluster.keys import (
    SIM_FAULT_LABEL,
)
from shared.api.keys import (
    COMPONENT,
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
