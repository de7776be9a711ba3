"""Whose failure is it? The lookalikes of "the application is broken everywhere" that must not
excuse a bad node, and of "the node is bad" that must not blame a healthy one.

assess-nodes does not count a failure that may follow its workload: failing elsewhere too,
with no pod of it proven healthy on another node (``everywhere.follows_its_workload``). Each
case below was reproduced by a review with a fresh context against the first version of that
rule, driven through assess-nodes' handler on an API server in memory that answers LISTs by
label and field selector as the API server does; objects are shaped as the kubelet and the
controllers write them (tests/unit/pods.py, tests/builders.py).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from shared.api.keys import (
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    NODE_HEALTH_ANNOTATION,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
    SUSPECT_VALUE,
)
from shared.api.state import PodEntry, WorkloadState, dump_state
from shared.nodes.assess_nodes.handler import Assessor
from shared.platform import kube
from shared.platform.config import Config
from shared.platform.events import Event
from shared.pods.failing import FailingPod
from shared.workloads.classify import classify, crash_looping_for_at_least
from shared.workloads.everywhere import (
    follows_its_workload,
    judge,
    moves_follow_the_workload,
    witnesses_of,
)
from shared.workloads.fastpath import workloads_failing_on
from shared.workloads.owners import BARE
from shared.workloads.state import Action
from tests import builders
from tests.unit import nodes, pods
from tests.unit import test_jobs as jobs_builder
from tests.unit.pods import NOW, ts
from tests.unit.test_move_plan import failed_on_three_nodes, plan_of, resolution

CFG = Config()
SUSPECT = {SUSPECT_LABEL: SUSPECT_VALUE}
WORKLOADS = [("web", "7d9c8b6f4"), ("api", "5f6b9c7d8"), ("cart", "6c7d8e9f1")]


class Cluster(kube.Kube):
    """Objects by (kind, namespace, name); LISTs filtered by ``k=v,...`` label selectors and
    the ``spec.nodeName=`` field selector; merge patches applied to labels and annotations."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        for obj in objects:
            self.add(obj)

    def add(self, obj: dict[str, Any]) -> None:
        namespace = obj["metadata"].get("namespace") if obj["kind"] != "Node" else None
        self.objects[(obj["kind"], namespace, obj["metadata"]["name"])] = copy.deepcopy(obj)

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        try:
            return copy.deepcopy(self.objects[(kind, namespace if kind != "Node" else None, name)])
        except KeyError:
            raise kube.NotFound(f"{kind} {name} not found", 404, "NotFound") from None

    def list_all(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        limit: int = 500,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        wanted = dict(t.split("=", 1) for t in label_selector.split(",")) if label_selector else {}
        found = []
        for (k, ns, _), obj in self.objects.items():
            if k != kind or (namespace is not None and ns != namespace):
                continue
            labels = obj["metadata"].get("labels") or {}
            if any(labels.get(key) != value for key, value in wanted.items()):
                continue
            if field_selector:
                key, value = field_selector.split("=", 1)
                assert key == "spec.nodeName"
                if (obj.get("spec") or {}).get("nodeName") != value:
                    continue
            found.append(copy.deepcopy(obj))
        return iter(found)

    def merge_patch(
        self, kind: str, namespace: str | None, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        obj = self.objects[(kind, namespace if kind != "Node" else None, name)]
        for key in ("labels", "annotations"):
            merged = {**(obj["metadata"].get(key) or {}), **(body["metadata"].get(key) or {})}
            obj["metadata"][key] = {k: v for k, v in merged.items() if v is not None}
        if "spec" in body:
            obj.setdefault("spec", {}).update(body["spec"])
        return copy.deepcopy(obj)

    def create(self, kind: str, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        return body


def replicaset(name: str, state: WorkloadState | None = None) -> dict[str, Any]:
    """A Deployment's ReplicaSet as its controller writes it, with our state when given."""
    app, _, template_hash = name.rpartition("-")
    annotations = {"deployment.kubernetes.io/revision": "1"}
    if state is not None:
        annotations[STATE_ANNOTATION] = dump_state(state)
    labels = {"app": app, "pod-template-hash": template_hash}
    return builders.replicaset(
        name,
        namespace="shop",
        uid=pods.uid(f"ReplicaSet/{name}"),
        resource_version="812",
        replicas=1,
        retries="3",
        annotations=annotations,
        labels=labels,
        selector=labels,
        owner=builders.owner_reference("Deployment", app),
    )


def crash_looping_pod(
    app: str, template_hash: str, node: str, *, excluded: list[str] | None = None, **kw: Any
) -> dict[str, Any]:
    name = f"{app}-{template_hash}-{(app + 'zzzzz')[:5]}"
    return pods.pod(
        name,
        owner=("ReplicaSet", f"{app}-{template_hash}"),
        node=node,
        labels={"app": app, "pod-template-hash": template_hash},
        excluded=excluded,
        containers=[pods.crash_looping(restarts=4, pod_name=name)],
        **kw,
    )


def failed_on(app: str, template_hash: str, *where: str, age: timedelta) -> WorkloadState:
    """The state update-annotations wrote when it moved the workload's pod off ``where``."""
    return WorkloadState(
        moves=len(where),
        excluded_nodes=where,
        handled=tuple(f"uid-old-{app}-{n}" for n in where),
        updated_at=NOW - age,
        holder_uid=pods.uid(f"ReplicaSet/{app}-{template_hash}"),
        failed_on={n: "CrashLoopBackOff" for n in where},
    )


def deliver(api: Cluster, event_type: str, data: dict[str, Any]) -> None:
    event = Event("1", "/x", event_type, {"time": (NOW - timedelta(seconds=2)).isoformat()}, data)
    Assessor(api, CFG, clock=lambda: NOW).handle(event)


def report(pod: dict[str, Any]) -> dict[str, Any]:
    failure = classify(pod, CFG, NOW)  # type: ignore[arg-type]
    assert failure is not None
    return FailingPod.from_pod(pod, failure).to_data()  # type: ignore[arg-type]


def record_of(api: Cluster, node: str) -> dict[str, Any]:
    raw = (api.objects[("Node", None, node)]["metadata"].get("annotations") or {}).get(
        NODE_HEALTH_ANNOTATION
    )
    return json.loads(raw) if raw else {}


def cluster(*extra: dict[str, Any], suspect: str | None = None) -> Cluster:
    names = [f"node-{c}" for c in "abcdefgh"]
    return Cluster(*[nodes.node(n, labels=SUSPECT if n == suspect else {}) for n in names], *extra)


# -- several bad nodes: failing on a bad node first does not excuse the next one ---------------


def test_a_second_bad_node_that_replacements_from_a_suspect_node_land_on_is_blamed() -> None:
    # node-a is suspect; three workloads were moved off it 3 minutes ago and their
    # replacements (stamped node-a) crash-loop on node-b: node-b is the next bad node.
    api = cluster(suspect="node-a")
    for app, template_hash in WORKLOADS:
        pod = crash_looping_pod(app, template_hash, "node-b", excluded=["node-a"])
        api.add(pod)
        state = failed_on(app, template_hash, "node-a", age=timedelta(minutes=3))
        api.add(replicaset(f"{app}-{template_hash}", state))
        deliver(api, EVENT_POD_FAILING, report(pod))
    assert len(record_of(api, "node-b")["failures"]) == 3
    assert api.objects[("Node", None, "node-b")]["metadata"]["labels"].get(SUSPECT_LABEL)


def test_the_same_failures_after_a_healthy_node_follow_the_workload() -> None:
    # The control: node-a is a node nothing speaks against; failing there and on node-b with
    # nothing running anywhere is an application broken everywhere.
    api = cluster()
    for app, template_hash in WORKLOADS:
        pod = crash_looping_pod(app, template_hash, "node-b", excluded=["node-a"])
        api.add(pod)
        state = failed_on(app, template_hash, "node-a", age=timedelta(minutes=3))
        api.add(replicaset(f"{app}-{template_hash}", state))
        deliver(api, EVENT_POD_FAILING, report(pod))
    assert record_of(api, "node-b") == {}


def test_moves_off_the_second_bad_node_count_too() -> None:
    api = cluster(suspect="node-a")
    for app, template_hash in WORKLOADS:
        pod = crash_looping_pod(app, template_hash, "node-b", excluded=["node-a"])
        state = failed_on(app, template_hash, "node-a", "node-b", age=timedelta(seconds=5))
        state = WorkloadState(
            moves=2,
            excluded_nodes=("node-a", "node-b"),
            handled=(*state.handled, pod["metadata"]["uid"]),
            updated_at=state.updated_at,
            holder_uid=state.holder_uid,
            failed_on=state.failed_on,
        )
        api.add(replicaset(f"{app}-{template_hash}", state))
        deliver(
            api,
            EVENT_POD_RESCHEDULED,
            {
                "namespace": "shop",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
                "node": "node-b",
                "reason": "CrashLoopBackOff",
                "kind": "node-fixable",
                "action": "move",
                "workload": {"kind": "ReplicaSet", "name": f"{app}-{template_hash}"},
                "topWorkload": {"kind": "Deployment", "name": app},
                "moves": 2,
                "budget": 3,
                "excludedNodes": ["node-a", "node-b"],
                "exclusionsCleared": False,
                "message": "moved",
            },
        )
    # Two counted make node-b suspect; a move off a node already suspect says nothing new.
    assert len(record_of(api, "node-b")["failures"]) == 2
    assert api.objects[("Node", None, "node-b")]["metadata"]["labels"].get(SUSPECT_LABEL)


# -- records and stamps age out -----------------------------------------------------------------


def test_a_record_from_last_week_does_not_excuse_a_node_failing_today() -> None:
    # Pods admitted a week ago during another incident (stamped node-a), fine on node-c since;
    # node-c broke minutes ago. A week-old failedOn is past reset-after: the node is blamed.
    api = cluster()
    for app, template_hash in WORKLOADS:
        pod = crash_looping_pod(
            app, template_hash, "node-c", excluded=["node-a"], started=NOW - timedelta(days=7)
        )
        api.add(pod)
        api.add(
            replicaset(
                f"{app}-{template_hash}",
                failed_on(app, template_hash, "node-a", age=timedelta(days=7)),
            )
        )
        deliver(api, EVENT_POD_FAILING, report(pod))
    assert len(record_of(api, "node-c")["failures"]) == 3


# -- what proves a workload runs, and what says it fails elsewhere ------------------------------

FAILING = crash_looping_pod("web", "7d9c8b6f4", "node-b")


def test_a_pod_left_failed_days_ago_on_another_node_is_history_not_a_failure_elsewhere() -> None:
    rejected = pods.pod(
        "web-7d9c8b6f4-r3j9c",
        node="node-c",
        phase="Failed",
        reason="OutOfcpu",
        containers=[pods.waiting("ContainerCreating")],
        started=NOW - timedelta(days=4),
    )
    assert follows_its_workload(FAILING, [FAILING, rejected], CFG, NOW) is None


def long_running_twin(ready: bool) -> dict[str, Any]:
    """Running for 3 days since its one restart (a liveness kill 4 days ago); its readiness
    probe failed a moment ago (a dependency blip): Ready flipped 2 minutes ago."""
    started = NOW - timedelta(days=3)
    last = pods.last_terminated("Error", 137, finished=started, ran_for=timedelta(days=1))
    container = pods.running(started=started, restarts=1, ready=ready, last=last)
    created = NOW - timedelta(days=4, hours=1)

    def condition(kind: str, ok: bool, at: Any) -> dict[str, Any]:
        status = "True" if ok else "False"
        return {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": ts(at)}

    return pods.pod(
        "web-7d9c8b6f4-ok001",
        node="node-c",
        containers=[container],
        started=created,
        conditions=[
            condition("PodReadyToStartContainers", True, created),
            condition("Initialized", True, created),
            condition("Ready", ready, NOW - timedelta(minutes=2)),
            condition("ContainersReady", ready, NOW - timedelta(minutes=2)),
            condition("PodScheduled", True, created),
        ],
    )


def test_a_twin_running_for_days_is_no_failure_elsewhere_after_a_readiness_blip() -> None:
    for ready in (True, False):
        twin = long_running_twin(ready)
        assert follows_its_workload(FAILING, [FAILING, twin], CFG, NOW) is None
        assert moves_follow_the_workload(["node-b"], "node-b", [twin], CFG, NOW) is None


def test_a_pod_of_another_controller_sharing_the_hash_proves_nothing() -> None:
    # A hand-made copy of the ReplicaSet (kubectl get rs -o yaml, renamed) keeps its
    # pod-template-hash label; the Deployment's healthy pod is not the copy's.
    copy_failing = pods.pod(
        "web-debug-k2x7q",
        owner=("ReplicaSet", "web-debug"),
        node="node-b",
        excluded=["node-a"],
        containers=[pods.crash_looping(restarts=4)],
    )
    deployments = pods.pod(
        "web-7d9c8b6f4-ok001",
        node="node-c",
        containers=[pods.running(started=NOW - timedelta(hours=1))],
        started=NOW - timedelta(hours=1),
    )
    assert follows_its_workload(copy_failing, [copy_failing, deployments], CFG, NOW) is not None
    holder = pods.uid("ReplicaSet/web-debug")
    assert (
        moves_follow_the_workload(
            ["node-a", "node-b"], "node-b", [deployments], CFG, NOW, holder_uid=holder
        )
        is not None
    )


def indexed(pod: dict[str, Any], index: int, name: str) -> dict[str, Any]:
    """``pod`` as the Job controller writes an Indexed Job's pod: its completion index as a
    label and an annotation."""
    shaped = jobs_builder.job_pod(pod, name=name)
    shaped["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = str(index)
    shaped["metadata"].setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = (
        str(index)
    )
    return shaped


def index_0_done() -> dict[str, Any]:
    """Index 0 of an Indexed Job, completed on node-c ten minutes ago."""
    return indexed(
        pods.pod(
            owner=("Job", "report"),
            node="node-c",
            phase="Succeeded",
            containers=[pods.terminated("Completed", 0, finished=NOW - timedelta(minutes=10))],
            started=NOW - timedelta(minutes=14),
        ),
        0,
        "report-0-h7x2p",
    )


def index_1_failing(*kept_off: str) -> dict[str, Any]:
    """Index 1, reading a corrupt input shard: crash-looping on node-b, kept off ``kept_off``."""
    return indexed(
        pods.pod(
            owner=("Job", "report"),
            node="node-b",
            excluded=list(kept_off),
            containers=[pods.crash_looping(restarts=4, pod_name="report-1-q9v4n")],
        ),
        1,
        "report-1-q9v4n",
    )


def test_another_completion_index_that_finished_proves_nothing_for_this_one() -> None:
    # Index 1 reads a corrupt input shard and crashes on every node; index 0 completed.
    done_0 = index_0_done()
    failing_1 = index_1_failing("node-a")
    assert follows_its_workload(failing_1, [done_0, failing_1], CFG, NOW) is not None


def statefulset(name: str, moved_uid: str) -> dict[str, Any]:
    """A StatefulSet whose ordinal 2 (a new revision crashing at start everywhere) was moved
    off node-a, node-b and now node-c: its budget and exclusions are the pod's own entry."""
    obj = builders.statefulset(
        name, namespace="shop", uid=pods.uid(f"StatefulSet/{name}"), retries="3", replicas=3
    )
    state = WorkloadState(
        moves=3,
        handled=("uid-1", "uid-2", moved_uid),
        per_pod={
            f"{name}-2": PodEntry(
                moves=3,
                excluded_nodes=("node-a", "node-b", "node-c"),
                updated_at=NOW - timedelta(seconds=3),
            )
        },
        updated_at=NOW - timedelta(seconds=3),
        holder_uid=pods.uid(f"StatefulSet/{name}"),
    )
    obj["metadata"]["annotations"][STATE_ANNOTATION] = dump_state(state)
    return obj


def test_a_statefulset_pods_moves_that_follow_its_ordinal_are_not_counted() -> None:
    api = cluster()
    for name in ("kafka", "zookeeper"):
        api.add(statefulset(name, f"uid-{name}-2-c"))
        deliver(
            api,
            EVENT_POD_RESCHEDULED,
            {
                "namespace": "shop",
                "name": f"{name}-2",
                "uid": f"uid-{name}-2-c",
                "node": "node-c",
                "reason": "CrashLoopBackOff",
                "kind": "node-fixable",
                "action": "move",
                "workload": {"kind": "StatefulSet", "name": name},
                "topWorkload": {"kind": "StatefulSet", "name": name},
                "moves": 3,
                "budget": 3,
                "excludedNodes": ["node-a", "node-b", "node-c"],
                "exclusionsCleared": False,
                "message": "moved",
            },
        )
    assert record_of(api, "node-c") == {}


# -- a neighbour failing since before the window is no news about the node ----------------------


def test_how_long_a_crash_loop_at_the_kubelets_maximum_back_off_has_lasted_at_least() -> None:
    def lasted(restarts: int) -> timedelta | None:
        return crash_looping_for_at_least(pods.crash_looping(restarts=restarts))

    # The default doubling reaches 5m0s at the sixth failure (10+20+40+80+160 s), then 300 s
    # each; below the maximum a node with a lower cap could have restarted it faster.
    assert lasted(4) is None  # back-off 1m20s
    assert lasted(6) == timedelta(seconds=310)
    assert lasted(7) == timedelta(seconds=610)
    assert lasted(812) == timedelta(seconds=310 + 300 * 806)


def legacy(node: str, suffix: str) -> dict[str, Any]:
    """A Deployment nobody opted in, crash-looping on every node for days: restart 812, the
    kubelet at its maximum back-off."""
    name = f"legacy-84c6d9f5b7-{suffix}"
    return pods.pod(
        name,
        "tools",
        owner=("ReplicaSet", "legacy-84c6d9f5b7"),
        labels={"app": "legacy", "pod-template-hash": "84c6d9f5b7"},
        node=node,
        stamp=None,
        containers=[pods.crash_looping(restarts=812, pod_name=name, namespace="tools")],
        started=NOW - timedelta(days=3),
    )


def test_a_neighbour_crash_looping_for_days_corroborates_nothing_on_its_node() -> None:
    assert workloads_failing_on("node-b", "shop/web", [legacy("node-b", "bbbbb")], CFG, NOW) == ()
    # A neighbour whose node broke minutes ago (back-off 40s) is news.
    fresh = crash_looping_pod("api", "5f6b9c7d8", "node-b")
    fresh["status"]["containerStatuses"] = [pods.crash_looping(restarts=3)]
    assert workloads_failing_on("node-b", "shop/web", [fresh], CFG, NOW) == ("shop/api",)


def test_a_neighbour_crash_looping_for_days_does_not_keep_a_broken_application_moving() -> None:
    # A workload of one pod that failed the same way on three nodes, nothing running: the stop
    # rests on nodes where others run fine, and a legacy pod broken everywhere for days beside
    # it does not make node-a a bad node.
    live = failed_on_three_nodes()
    made = plan_of(
        live,
        resolution(BARE, live, "5"),  # type: ignore[arg-type]
        node_pods={"node-a": [legacy("node-a", "aaaaa")], "node-c": []},
    )
    assert made.decided is not None and made.decided.action is Action.STOPPED, made.decided


def test_another_completion_index_that_finished_does_not_keep_a_poison_index_moving() -> None:
    done_0 = index_0_done()
    failing_1 = index_1_failing("node-a", "node-c")
    witnesses = witnesses_of(failing_1, [done_0, failing_1], CFG, NOW)
    verdict = judge(
        {"node-a": "CrashLoopBackOff", "node-c": "CrashLoopBackOff"},
        None,
        "node-b",
        "CrashLoopBackOff",
        witnesses,
        kept_off=["node-a", "node-c"],
        implicated={},
    )
    assert verdict.stop, verdict.why
