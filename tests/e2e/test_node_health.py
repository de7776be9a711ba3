"""Node health on the real control plane: blame, the suspect marks, the cap, expiry, the fast
path, and what the real scheduler does with a suspect node.

assess-nodes is driven through functions-framework's test client (the function exactly as it
is served) against the real API server, with the events the pipeline really emits; the last
tests run the whole pipeline (the ApiServerSource adapter, Knative's Broker with the Triggers of
knative/, every function, the webhook the API server calls) with crash-looping nodes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dev.stack.stack import Stack
from shared.api import movedoff
from shared.api.keys import (
    AVOID_PRESSURE_KEY,
    EVENT_NODE_SUSPECTED,
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    FAILING_WORKLOADS_LABEL,
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    NODE_OPT_OUT_LABEL,
    PING_EVENT_TYPE,
    POLICY_ANNOTATION,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
)
from shared.api.state import Stopped, WorkloadState, dump_state
from shared.platform.kube import Kube
from shared.pods.failing import FailingPod
from shared.workloads.classify import Failure, FailureKind, classify
from tests import builders
from tests.e2e.conftest import LOCAL, Webhook, let_time_pass, pod_template, wait_for
from tests.e2e.test_pipeline import workload as workload_body
from tests.handlers.conftest import ON_DEMAND_TICKS, ClientFactory, cloudevent, reply_of

pytestmark = pytest.mark.e2e

# The annotation `kubectl rollout restart` sets on a Deployment's pod template
# (kubectl/pkg/polymorphichelpers/objectrestarter.go).
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"


class Moves:
    """Moves recorded as update-annotations records them, and its replies saying so.

    assess-nodes counts a ``pod.rescheduled`` reply only when the holder it names records the
    move (the pod's uid in ``handled``, the node in ``failedOn``), so each reply here is backed
    by a real ReplicaSet of the test's namespace (no replicas: nobody controls it, so it is
    its own top-level workload) whose state annotation says so, written as ``dump_state``
    writes it, with the ReplicaSet's uid as its holder."""

    def __init__(self, api: Kube, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.states: dict[str, WorkloadState] = {}

    def uid(self, pod: str) -> str:
        """A pod's uid, the same for the same name (a redelivery, another node's report)."""
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.namespace}/{pod}"))

    def record(self, node: str, workload: str, pod: str) -> str:
        """Record the move of ``pod`` of ReplicaSet ``workload`` off ``node``; its uid."""
        uid = self.uid(pod)
        state = self.states.get(workload)
        if state is None:
            body = builders.replicaset(workload, replicas=0, retries="3")
            created = self.api.create("ReplicaSet", self.namespace, body)
            state = WorkloadState(holder_uid=created["metadata"]["uid"])
        new = uid not in state.handled
        state = replace(
            state,
            moves=state.moves + (1 if new else 0),
            excluded_nodes=tuple(dict.fromkeys((*state.excluded_nodes, node))),
            handled=(*state.handled, uid) if new else state.handled,
            failed_on={**state.failed_on, node: "CrashLoopBackOff"},
            updated_at=datetime.now(UTC),
        )
        self.states[workload] = state
        patch = {"metadata": {"annotations": {STATE_ANNOTATION: dump_state(state)}}}
        self.api.merge_patch("ReplicaSet", self.namespace, workload, patch)
        return uid

    def reply(self, node: str, workload: str, pod: str, at: datetime) -> dict[str, Any]:
        """What update-annotations replies after moving ``pod`` of ReplicaSet ``workload`` at
        the restart threshold, the move recorded on the ReplicaSet first."""
        uid = self.record(node, workload, pod)
        return rescheduled(self.namespace, node, workload, pod, uid, at)


def rescheduled(
    namespace: str, node: str, workload: str, pod: str, uid: str, at: datetime
) -> dict[str, Any]:
    """The reply ``io.kn-rescheduler.pod.rescheduled`` as update-annotations shapes it (a
    ReplicaSet nobody controls is its own top-level workload)."""
    return {
        "namespace": namespace,
        "name": pod,
        "uid": uid,
        "node": node,
        "reason": "CrashLoopBackOff",
        "kind": "node-fixable",
        "action": "move",
        "workload": {"kind": "ReplicaSet", "name": workload},
        "topWorkload": {"kind": "ReplicaSet", "name": workload},
        "moves": 1,
        "budget": 6,
        "excludedNodes": [node],
        "exclusionsCleared": False,
        "message": f"moved pod {pod} off node {node}",
        "_at": at,
    }


@pytest.fixture
def moves(api: Kube, namespace: str) -> Moves:
    return Moves(api, namespace)


def post(client: Any, data: dict[str, Any]) -> Any:
    at = data.pop("_at", datetime.now(UTC))
    headers, body = cloudevent(
        EVENT_POD_RESCHEDULED,
        data,
        source="/kn-rescheduler/update-annotations",
        time=at.isoformat().replace("+00:00", "Z"),
    )
    return client.post("/", headers=headers, data=body)


def ping(client: Any) -> Any:
    headers, body = cloudevent(PING_EVENT_TYPE, {"message": "tick"}, source="/pingsources/x")
    return client.post("/", headers=headers, data=body)


def node_of(api: Kube, name: str) -> dict[str, Any]:
    return api.get("Node", None, name)


def suspect(node: dict[str, Any]) -> bool:
    return (node["metadata"].get("labels") or {}).get(SUSPECT_LABEL) == "true"


def our_taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node["spec"].get("taints") or [] if t["key"] == SUSPECT_LABEL]


def record(node: dict[str, Any]) -> dict[str, Any]:
    raw = (node["metadata"].get("annotations") or {}).get(NODE_HEALTH_ANNOTATION)
    return json.loads(raw) if raw else {}


def node_events(api: Kube, node: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in api.list_all("Event", "default")
        if e["involvedObject"].get("kind") == "Node"
        and e["involvedObject"]["name"] == node
        and e["reason"] == reason
    ]


@pytest.fixture
def assess(function_client: ClientFactory, cluster: Any) -> Callable[..., Any]:
    def make(**settings: str) -> Any:
        env = {"KUBECONFIG": str(cluster.kubeconfig), **ON_DEMAND_TICKS}
        env.update({f"KN_RESCHEDULER_{k.upper()}": v for k, v in settings.items()})
        return function_client("assess-nodes", **env)

    return make


def test_two_workloads_failing_on_one_node_make_it_suspect_and_one_does_not(
    cluster: Any, api: Kube, assess: Callable[..., Any], moves: Moves
) -> None:
    client = assess()
    bad, now = cluster.nodes[1], datetime.now(UTC)
    first = post(client, moves.reply(bad, "web-7c9d", "web-7c9d-a", now))
    again = post(client, moves.reply(bad, "web-7c9d", "web-7c9d-b", now))
    assert (first.status_code, again.status_code) == (202, 202)
    node = node_of(api, bad)
    assert not suspect(node) and our_taints(node) == []
    assert {f["workload"] for f in record(node)["failures"]} == {
        f"ReplicaSet {moves.namespace}/web-7c9d"
    }

    answer = post(client, moves.reply(bad, "api-5f6b", "api-5f6b-c", now))
    assert answer.status_code == 200
    attributes, data = reply_of(answer)
    assert attributes["type"] == EVENT_NODE_SUSPECTED
    assert data["node"] == bad
    assert [w["workload"] for w in data["workloads"]] == [
        f"ReplicaSet {moves.namespace}/api-5f6b",
        f"ReplicaSet {moves.namespace}/web-7c9d",
    ]
    node = node_of(api, bad)
    assert suspect(node)
    assert our_taints(node) == [
        {"key": SUSPECT_LABEL, "value": "true", "effect": "PreferNoSchedule"}
    ]
    said = node_events(api, bad, "NodeSuspected")
    assert len(said) == 1 and said[0]["type"] == "Warning"
    assert f"ReplicaSet {moves.namespace}/api-5f6b" in said[0]["message"]
    # kubectl describe node finds it: an involvedObject without a namespace, uid set.
    assert said[0]["involvedObject"]["uid"] == node["metadata"]["uid"]
    assert not said[0]["involvedObject"].get("namespace")


def test_duplicates_and_reordering_give_the_same_record(
    cluster: Any, api: Kube, assess: Callable[..., Any], moves: Moves
) -> None:
    client = assess(suspect_workloads="5")
    one, two = cluster.nodes[2], cluster.nodes[3]
    start = datetime.now(UTC) - timedelta(minutes=3)
    reports = [("web", "web-a", 0), ("api", "api-b", 1), ("web", "web-c", 2)]

    def deliver(node: str, order: list[int], suffix: str) -> None:
        # A workload of its own per node: one failing on two nodes and running nowhere else
        # may be broken everywhere, and is no evidence against either.
        for i in order:
            workload, pod, minute = reports[i]
            at = start + timedelta(minutes=minute)
            reply = moves.reply(node, workload + suffix, pod + suffix, at)
            assert post(client, reply).status_code == 202

    def seen(node: str, suffix: str) -> list[tuple[str, str, str]]:
        return [
            (f["workload"].removesuffix(suffix), f["reason"], f["at"])
            for f in record(node_of(api, node))["failures"]
        ]

    deliver(one, [0, 1, 2], "-a")
    deliver(two, [2, 0, 2, 1, 0], "-b")  # out of order, with duplicates
    assert seen(one, "-a") == seen(two, "-b")
    assert len(seen(one, "-a")) == 3


def test_a_suspicion_expires_when_its_window_passes_without_a_failure(
    cluster: Any, api: Kube, assess: Callable[..., Any], moves: Moves
) -> None:
    client = assess(suspect_window="4s")
    bad, now = cluster.nodes[1], datetime.now(UTC)
    post(client, moves.reply(bad, "web", "web-1", now))
    assert post(client, moves.reply(bad, "api", "api-1", now)).status_code == 200
    assert suspect(node_of(api, bad))
    assert ping(client).status_code == 202
    assert suspect(node_of(api, bad)), "still inside the window"
    let_time_pass(4.5, "the 4 s suspect window passes")
    assert ping(client).status_code == 202
    node = node_of(api, bad)
    assert not suspect(node) and our_taints(node) == []
    assert "suspect" not in record(node)
    assert len(node_events(api, bad, "NodeCleared")) >= 1


def test_at_most_the_configured_share_of_nodes_is_suspect(
    cluster: Any, api: Kube, assess: Callable[..., Any], moves: Moves
) -> None:
    # 3 of 4 nodes faulty; 30 % of 4 schedulable nodes is 1.
    assert len(cluster.nodes) == 4
    client = assess()
    now = datetime.now(UTC)
    faulty = cluster.nodes[1:]
    for node in faulty:
        # Workloads of their own per node: one failing on several nodes and running nowhere
        # else may be broken everywhere, and is no evidence against them.
        for workload in ("web", "api"):
            post(client, moves.reply(node, f"{workload}-{node}", f"{workload}-{node}", now))
    marked = [n for n in faulty if suspect(node_of(api, n))]
    assert marked == [faulty[0]]
    held = faulty[1]
    warned = node_events(api, held, "SuspectCapReached")
    assert warned and "ranks below them and is not marked" in warned[0]["message"]
    # A node with more failing workloads takes the mark from the weakest.
    post(client, moves.reply(held, "db", f"db-{held}", now))
    assert [n for n in faulty if suspect(node_of(api, n))] == [held]


def test_a_node_with_the_opt_out_label_is_never_marked(
    cluster: Any, api: Kube, assess: Callable[..., Any], moves: Moves
) -> None:
    bad = cluster.nodes[2]
    api.merge_patch("Node", None, bad, {"metadata": {"labels": {NODE_OPT_OUT_LABEL: "true"}}})
    try:
        client = assess()
        now = datetime.now(UTC)
        for workload in ("web", "api", "db"):
            assert post(client, moves.reply(bad, workload, f"{workload}-x", now)).status_code == 202
        node = node_of(api, bad)
        assert not suspect(node) and NODE_HEALTH_ANNOTATION not in node["metadata"]["annotations"]
    finally:
        api.merge_patch("Node", None, bad, {"metadata": {"labels": {NODE_OPT_OUT_LABEL: None}}})


def report_condition(api: Kube, node: str, condition: dict[str, Any]) -> None:
    """What node-problem-detector does (problemclient.SetConditions): a strategic merge patch of
    the Node's status with its conditions, merged into the kubelet's by type."""
    api.request(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        body={"status": {"conditions": [condition]}},
        content_type="application/strategic-merge-patch+json",
        write=True,
    )


def test_a_node_reporting_a_kernel_deadlock_is_suspect_until_the_condition_clears(
    cluster: Any, api: Kube, assess: Callable[..., Any]
) -> None:
    client = assess()
    bad = cluster.nodes[3]
    now = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    deadlock = {
        "type": "KernelDeadlock",
        "status": "True",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
        "reason": "DockerHung",
        "message": "kernel: INFO: task docker:20744 blocked for more than 120 seconds.",
    }
    report_condition(api, bad, deadlock)
    try:
        assert ping(client).status_code == 202
        node = node_of(api, bad)
        assert suspect(node) and our_taints(node), "marked on the Ping, no pod failed there"
        assert record(node)["suspect"]["conditions"] == ["KernelDeadlock"]
        told = node_events(api, bad, "NodeSuspected")
        assert (
            told and "reports KernelDeadlock=True (DockerHung: kernel: INFO" in told[0]["message"]
        )
        # The kubelet's own conditions are still there: only ours was added.
        types = {c["type"] for c in node["status"]["conditions"]}
        assert {"Ready", "KernelDeadlock"} <= types
    finally:
        # node-problem-detector's default once the problem is gone.
        report_condition(
            api,
            bad,
            {
                **deadlock,
                "status": "False",
                "reason": "KernelHasNoDeadlock",
                "message": "kernel has no deadlock",
            },
        )
        ping(client)
    node = node_of(api, bad)
    assert not suspect(node) and our_taints(node) == []
    assert "suspect" not in record(node)
    assert node_events(api, bad, "NodeCleared")


# -- distinct workloads are top-level workloads ---------------------------------------------------


def restart_rollout(api: Kube, namespace: str, name: str) -> None:
    """What `kubectl rollout restart` does: a template annotation, so a new ReplicaSet."""
    stamp = datetime.now(UTC).isoformat()
    patch = {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: stamp}}}}}
    api.merge_patch("Deployment", namespace, name, patch)


def replicasets(api: Kube, namespace: str) -> list[dict[str, Any]]:
    return list(api.list_all("ReplicaSet", namespace))


def failing_report(pod: dict[str, Any], node: str) -> dict[str, Any]:
    """detect-failures' report of ``pod`` (as the API server returned it) crash-looping on
    ``node`` at the restart threshold: its real ownerReferences."""
    failure = Failure(FailureKind.NODE_FIXABLE, "CrashLoopBackOff", "back-off 40s", node)
    return FailingPod.from_pod(pod, failure).to_data()  # type: ignore[arg-type]


def post_failing(client: Any, data: dict[str, Any]) -> Any:
    headers, body = cloudevent(EVENT_POD_FAILING, data, source="/kn-rescheduler/detect-failures")
    return client.post("/", headers=headers, data=body)


def opted_in_template(labels: dict[str, str], node: str) -> dict[str, Any]:
    """A pod template bound to ``node`` and opted in by its own ``scheduling-retries`` (no
    webhook stamps it here)."""
    template = pod_template(labels, node, nodeName=node)
    template["metadata"]["annotations"] = {POLICY_ANNOTATION: "3"}
    return template


def failing_on(api: Kube, namespace: str, pod: dict[str, Any], node: str) -> dict[str, Any]:
    """``pod`` as the API returns it once it is failing on ``node`` by the full rules (the
    fake kubelet's crash loop past the restart threshold): what assess-nodes will read."""
    name = pod["metadata"]["name"]

    def failing() -> dict[str, Any] | None:
        live = api.get("Pod", namespace, name)
        failure = classify(live, LOCAL, datetime.now(UTC))  # type: ignore[arg-type]
        found = failure is not None and failure.kind is FailureKind.NODE_FIXABLE
        return live if found and failure is not None and failure.node == node else None

    return dict(wait_for(f"pod {name} failing on {node}", failing, timeout=60))


def test_pods_of_one_deployment_across_a_rollout_restart_are_one_workload(
    cluster: Any, api: Kube, namespace: str, assess: Callable[..., Any], faults: Callable[..., None]
) -> None:
    # The ReplicaSets and pods are the real controllers': <deployment>-<pod-template-hash>,
    # crash-looping for real on the faulty node (a report counts once the API shows it).
    bad = cluster.nodes[1]
    faults("crashloop", bad)
    template = opted_in_template({"app": "web"}, bad)
    api.create("Deployment", namespace, workload_body("Deployment", "web", template, replicas=1))
    first = wait_for("the first rollout's pod", lambda: pods_of(api, namespace), timeout=30)[0]
    restart_rollout(api, namespace, "web")
    wait_for("a second ReplicaSet", lambda: len(replicasets(api, namespace)) == 2, timeout=30)
    second = wait_for(
        "the second rollout's pod",
        lambda: [p for p in pods_of(api, namespace) if owner_of(p) != owner_of(first)],
        timeout=30,
    )[0]
    client = assess()
    for pod in (first, second):
        live = failing_on(api, namespace, pod, bad)
        assert post_failing(client, failing_report(live, bad)).status_code == 202
    node = node_of(api, bad)
    assert len(record(node)["failures"]) == 2, "both pods' failures are on record"
    assert not suspect(node) and our_taints(node) == []

    # Another Deployment failing there is a second workload: the rule still holds.
    other = opted_in_template({"app": "api"}, bad)
    api.create("Deployment", namespace, workload_body("Deployment", "api", other, replicas=1))
    api_pod = wait_for(
        "the api pod",
        lambda: [p for p in pods_of(api, namespace) if p["metadata"]["name"].startswith("api-")],
        timeout=30,
    )[0]
    live = failing_on(api, namespace, api_pod, bad)
    assert post_failing(client, failing_report(live, bad)).status_code == 200
    assert suspect(node_of(api, bad))


# -- a report is a claim: only what the API shows counts ------------------------------------------


def clean(node: dict[str, Any]) -> bool:
    """No health record, no label or taint of ours."""
    labels = node["metadata"].get("labels") or {}
    return (
        NODE_HEALTH_ANNOTATION not in (node["metadata"].get("annotations") or {})
        and SUSPECT_LABEL not in labels
        and FAILING_WORKLOADS_LABEL not in labels
        and our_taints(node) == []
    )


def test_forged_failure_reports_naming_made_up_pods_leave_a_healthy_node_alone(
    cluster: Any, api: Kube, namespace: str, assess: Callable[..., Any]
) -> None:
    # What any pod of the cluster can post to the Service: two pod.failing reports, shaped as
    # detect-failures shapes them, naming made-up pods of two made-up workloads.
    healthy = cluster.nodes[2]
    client = assess()
    for workload in ("web-7d9c8b6f4", "api-5c8f9d7b6"):
        pod = {
            "metadata": {
                "name": f"{workload}-x2x9z",
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "ownerReferences": [builders.owner_reference("ReplicaSet", workload)],
            },
            "spec": {"nodeName": healthy},
        }
        assert post_failing(client, failing_report(pod, healthy)).status_code == 202
    assert clean(node_of(api, healthy))


def test_forged_replies_naming_workloads_without_that_record_leave_a_healthy_node_alone(
    cluster: Any, api: Kube, namespace: str, assess: Callable[..., Any], moves: Moves
) -> None:
    healthy, elsewhere = cluster.nodes[2], cluster.nodes[3]
    client = assess()
    now = datetime.now(UTC)
    # A real ReplicaSet that records a move, of another pod, off another node; and one that
    # records nothing. Replies naming them, a made-up pod moved off the healthy node: no such
    # record on either.
    moves.record(elsewhere, "web-7c9d", "web-7c9d-real")
    api.create("ReplicaSet", namespace, builders.replicaset("api-5f6b", replicas=0, retries="3"))
    for workload in ("web-7c9d", "api-5f6b"):
        forged = rescheduled(
            namespace, healthy, workload, f"{workload}-made-up", str(uuid.uuid4()), now
        )
        assert post(client, forged).status_code == 202
    # The real move's pod, claimed to have failed on the healthy node: not where it failed.
    real = moves.uid("web-7c9d-real")
    assert (
        post(client, rescheduled(namespace, healthy, "web-7c9d", "web-7c9d-real", real, now))
    ).status_code == 202
    assert clean(node_of(api, healthy))


def test_a_report_for_a_workload_that_was_stopped_is_not_counted_again(
    cluster: Any, api: Kube, namespace: str, assess: Callable[..., Any], faults: Callable[..., None]
) -> None:
    # A ReplicaSet whose moves update-annotations stopped (it fails the same way everywhere):
    # the sweep re-sends its crash-looping pod every 5 minutes, which is no new evidence.
    bad = cluster.nodes[1]
    faults("crashloop", bad)
    template = opted_in_template({"app": "web"}, bad)
    created = api.create(
        "ReplicaSet", namespace, builders.replicaset("web", retries="3", template=template)
    )
    stopped = WorkloadState(
        moves=2,
        handled=(str(uuid.uuid4()), str(uuid.uuid4())),
        updated_at=datetime.now(UTC),
        holder_uid=created["metadata"]["uid"],
        failed_on={n: "CrashLoopBackOff" for n in cluster.nodes[2:]},
        stopped=Stopped("CrashLoopBackOff", tuple(cluster.nodes[2:]), datetime.now(UTC)),
    )
    api.merge_patch(
        "ReplicaSet",
        namespace,
        "web",
        {"metadata": {"annotations": {STATE_ANNOTATION: dump_state(stopped)}}},
    )
    pod = wait_for("web's pod", lambda: first_pod(api, namespace, "web-"), timeout=30)
    live = failing_on(api, namespace, pod, bad)
    client = assess()
    assert post_failing(client, failing_report(live, bad)).status_code == 202
    assert clean(node_of(api, bad))
    # The same report once the state no longer says so (the next move clears the stop) and
    # names no other node (failures elsewhere with nothing running would make it follow the
    # workload): it counts, so the stop was what kept it out.
    running = replace(stopped, stopped=None, failed_on={}, updated_at=datetime.now(UTC))
    api.merge_patch(
        "ReplicaSet",
        namespace,
        "web",
        {"metadata": {"annotations": {STATE_ANNOTATION: dump_state(running)}}},
    )
    assert post_failing(client, failing_report(live, bad)).status_code == 202
    assert [f["workload"] for f in record(node_of(api, bad))["failures"]] == [
        f"ReplicaSet {namespace}/web"
    ]


def pods_of(api: Kube, namespace: str) -> list[dict[str, Any]]:
    return [p for p in api.list_all("Pod", namespace) if not p["metadata"].get("deletionTimestamp")]


def owner_of(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["ownerReferences"][0]["name"])


# -- the real scheduler --------------------------------------------------------------------------


def mark(client: Any, moves: Moves, node: str) -> None:
    now = datetime.now(UTC)
    post(client, moves.reply(node, "web", f"web-{uuid.uuid4().hex[:5]}", now))
    assert (
        post(client, moves.reply(node, "api", f"api-{uuid.uuid4().hex[:5]}", now)).status_code
        == 200
    )


def opted_in_pod(name: str, preferred: str) -> dict[str, Any]:
    template = pod_template({"app": name}, preferred)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {POLICY_ANNOTATION: "3"}, **template["metadata"]},
        "spec": template["spec"],
    }


def bound_node(api: Kube, namespace: str, name: str) -> str:
    return str(
        wait_for(
            f"{name} bound",
            lambda: api.get("Pod", namespace, name)["spec"].get("nodeName"),
            timeout=30,
        )
    )


def test_new_pods_avoid_a_suspect_node_and_still_use_it_when_nothing_else_fits(
    cluster: Any,
    api: Kube,
    namespace: str,
    webhook: Webhook,
    assess: Callable[..., Any],
    moves: Moves,
) -> None:
    bad = cluster.nodes[1]
    mark(assess(), moves, bad)
    # The pod prefers the suspect node as strongly as a preference can (weight 100); the
    # PreferNoSchedule taint outweighs it (TaintToleration's score weighs 3, NodeAffinity's 2
    # in the default profile).
    for i in range(3):
        api.create("Pod", namespace, opted_in_pod(f"web-{i}", bad))
    assert {bound_node(api, namespace, f"web-{i}") for i in range(3)}.isdisjoint({bad})

    others = [n for n in cluster.nodes if n != bad]
    for node in others:
        api.merge_patch("Node", None, node, {"spec": {"unschedulable": True}})
    try:
        api.create("Pod", namespace, opted_in_pod("last", bad))
        assert bound_node(api, namespace, "last") == bad
    finally:
        for node in others:
            api.merge_patch("Node", None, node, {"spec": {"unschedulable": None}})


def failing_workloads(node: dict[str, Any]) -> str | None:
    return (node["metadata"].get("labels") or {}).get(FAILING_WORKLOADS_LABEL)


def test_a_node_says_how_many_workloads_fail_there_until_their_failures_age_out(
    cluster: Any, api: Kube, assess: Callable[..., Any], moves: Moves
) -> None:
    client = assess(suspect_window="4s", suspect_workloads="3")
    bad, now = cluster.nodes[1], datetime.now(UTC)
    assert post(client, moves.reply(bad, "web", "web-1", now)).status_code == 202
    assert failing_workloads(node_of(api, bad)) == "1"
    assert post(client, moves.reply(bad, "api", "api-1", now)).status_code == 202
    node = node_of(api, bad)
    # Two workloads, one fewer than the three that make it suspect here: counted, not marked.
    assert failing_workloads(node) == "2"
    assert not suspect(node) and our_taints(node) == []
    let_time_pass(4.5, "the suspect window passes")
    assert ping(client).status_code == 202
    assert failing_workloads(node_of(api, bad)) is None
    assert [n for n in cluster.nodes if failing_workloads(node_of(api, n))] == []


def preferring_weight(node: str, weight: int) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": weight,
                    "preference": {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node]}
                        ]
                    },
                }
            ]
        }
    }


def test_a_replacement_keeps_off_a_node_another_workload_fails_on_before_it_is_suspect(
    cluster: Any,
    api: Kube,
    namespace: str,
    webhook: Webhook,
    assess: Callable[..., Any],
    moves: Moves,
) -> None:
    failing, own = cluster.nodes[1], cluster.nodes[2]
    # One workload failed on `failing`: it says so, and is not suspect (no taint).
    assert (
        post(assess(), moves.reply(failing, "api", "api-1", datetime.now(UTC))).status_code == 202
    )
    assert failing_workloads(node_of(api, failing)) == "1"
    assert our_taints(node_of(api, failing)) == []

    # web's pods prefer `failing` (weight 50); one was moved off `own`, so its next pod is a
    # replacement: kept off `own`, and off `failing` by the webhook's preference (weight 100).
    moved = json.dumps({"excludedNodes": [own], "handled": [], "moves": 1, "version": 1})
    web = builders.template({"app": "web"}, affinity=preferring_weight(failing, 50))
    api.create(
        "ReplicaSet",
        namespace,
        builders.replicaset(
            "web", retries="3", annotations={STATE_ANNOTATION: moved}, template=web
        ),
    )
    replacement = wait_for("web's pod", lambda: first_pod(api, namespace, "web-"), timeout=30)
    terms = replacement["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert {"key": FAILING_WORKLOADS_LABEL, "operator": "DoesNotExist"} in [
        e for t in terms for e in t["preference"].get("matchExpressions") or []
    ]
    placed = bound_node(api, namespace, replacement["metadata"]["name"])
    assert placed not in (failing, own)

    # A first placement gets no such preference: db goes where it prefers, `failing` included.
    db = builders.template({"app": "db"}, affinity=preferring_weight(failing, 50))
    api.create("ReplicaSet", namespace, builders.replicaset("db", retries="3", template=db))
    first = wait_for("db's pod", lambda: first_pod(api, namespace, "db-"), timeout=30)
    assert bound_node(api, namespace, first["metadata"]["name"]) == failing


def moved_off_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    terms = (
        pod["spec"]["affinity"]["nodeAffinity"].get(
            "preferredDuringSchedulingIgnoredDuringExecution"
        )
        or []
    )
    return [
        e
        for t in terms
        for e in t["preference"].get("matchExpressions") or []
        if e["key"] == MOVED_OFF_LABEL
    ]


def test_a_replacement_keeps_off_a_node_a_pod_was_just_moved_off_until_the_mark_expires(
    cluster: Any, api: Kube, namespace: str, webhook: Webhook
) -> None:
    # What update-annotations writes the moment it moves a pod off `marked`, before
    # assess-nodes has heard (no failing-workloads label there yet).
    marked, own = cluster.nodes[1], cluster.nodes[2]
    now = datetime.now(UTC)
    api.merge_patch(
        "Node", None, marked, {"metadata": {"labels": {MOVED_OFF_LABEL: movedoff.mark_value(now)}}}
    )
    moved = json.dumps({"excludedNodes": [own], "handled": [], "moves": 1, "version": 1})
    web = builders.template({"app": "web"}, affinity=preferring_weight(marked, 50))
    api.create(
        "ReplicaSet",
        namespace,
        builders.replicaset(
            "web", retries="3", annotations={STATE_ANNOTATION: moved}, template=web
        ),
    )
    replacement = wait_for("web's pod", lambda: first_pod(api, namespace, "web-"), timeout=30)
    assert [e["operator"] for e in moved_off_terms(replacement)] == ["DoesNotExist", "Lt"]
    assert bound_node(api, namespace, replacement["metadata"]["name"]) not in (marked, own)

    # Once the window has passed, the mark steers nothing: not even the webhook's term.
    old = now - timedelta(hours=1)
    api.merge_patch(
        "Node", None, marked, {"metadata": {"labels": {MOVED_OFF_LABEL: movedoff.mark_value(old)}}}
    )
    db = builders.template({"app": "db"}, affinity=preferring_weight(marked, 50))
    api.create(
        "ReplicaSet",
        namespace,
        builders.replicaset("db", retries="3", annotations={STATE_ANNOTATION: moved}, template=db),
    )
    later = wait_for("db's pod", lambda: first_pod(api, namespace, "db-"), timeout=30)
    assert moved_off_terms(later) == []
    assert bound_node(api, namespace, later["metadata"]["name"]) == marked


def first_pod(api: Kube, namespace: str, prefix: str) -> dict[str, Any] | None:
    return next(
        (p for p in pods_of(api, namespace) if p["metadata"]["name"].startswith(prefix)), None
    )


# -- the whole pipeline --------------------------------------------------------------------------


def pipeline(cluster: Any, tmp_path: Any, **settings: str) -> Stack:
    return Stack(
        cluster.kubeconfig,
        cluster.api_client(),
        tmp_path / "stack",
        cluster.log_dir,
        settings={f"KN_RESCHEDULER_{k.upper()}": v for k, v in settings.items()},
    )


@pytest.fixture
def stack(cluster: Any, tmp_path: Any) -> Iterator[Stack]:
    with pipeline(cluster, tmp_path) as running:
        yield running


def test_the_pipeline_marks_a_node_two_workloads_fail_on_and_moves_at_first_failure_there(
    cluster: Any, api: Kube, namespace: str, stack: Stack, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[1]
    faults("crashloop", bad)
    before = datetime.now(UTC) - timedelta(seconds=1)
    for name in ("web", "api"):
        template = pod_template({"app": name}, bad)
        api.create("Deployment", namespace, workload_body("Deployment", name, template, replicas=1))
    wait_for("the faulty node turns suspect", lambda: suspect(node_of(api, bad)), timeout=90)
    # update-annotations marked it at the first move off it that another workload's failure
    # there backed (one workload's move alone may follow the workload), before assess-nodes
    # had heard: the move's time, in whole seconds. No other node was moved off.
    at = movedoff.marked_at(node_of(api, bad)["metadata"].get("labels"))
    assert at is not None and before <= at <= datetime.now(UTC), at
    assert not [
        n
        for n in cluster.nodes
        if n != bad and MOVED_OFF_LABEL in (node_of(api, n)["metadata"].get("labels") or {})
    ]
    replies = wait_for(
        "the reply io.kn-rescheduler.node.suspected",
        lambda: [e for e in stack.archived() if e["type"] == EVENT_NODE_SUSPECTED],
        timeout=10,
    )
    assert [r["data"]["node"] for r in replies] == [bad]

    # A third workload's pod lands there only when nothing else fits: with the other nodes
    # cordoned, it is bound there, crashes once, and is moved at its first failure.
    others = [n for n in cluster.nodes if n != bad]
    for node in others:
        api.merge_patch("Node", None, node, {"spec": {"unschedulable": True}})
    try:
        template = pod_template({"app": "db"}, bad)
        api.create("Deployment", namespace, workload_body("Deployment", "db", template, replicas=1))
        moved = wait_for("the db pod moved off the suspect node", lambda: first_move(stack), 60)
    finally:
        for node in others:
            api.merge_patch("Node", None, node, {"spec": {"unschedulable": None}})
    assert moved["data"]["node"] == bad
    # Moved on an early report: no report at the restart threshold came from the suspect
    # node. (The replacement, kept off it while the others were cordoned, is reported as
    # unschedulable because of our exclusions: not a failure on a node.)
    reports = [
        e["data"]["kind"]
        for e in stack.archived()
        if e["type"] == "io.kn-rescheduler.pod.failing"
        and e["data"]["ownerReferences"][0]["name"].startswith("db-")
        and e["data"]["node"] == bad
    ]
    assert reports and set(reports) == {"early"}


@pytest.fixture
def patient_stack(cluster: Any, tmp_path: Any) -> Iterator[Stack]:
    """The pipeline with a crash-loop threshold of 6 restarts: on the compressed clock (a
    restart every 3 s) a move at the corroborated threshold (1) comes about 15 s before it."""
    with pipeline(cluster, tmp_path, crashloop_restart_threshold="6") as running:
        yield running


def test_two_workloads_crash_looping_on_one_node_move_before_the_threshold_and_mark_it(
    cluster: Any, api: Kube, namespace: str, patient_stack: Stack, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[1]
    faults("crashloop", bad)
    for name in ("web", "api"):
        template = pod_template({"app": name}, bad)
        api.create("Deployment", namespace, workload_body("Deployment", name, template, replicas=1))

    def corroborated_moves() -> dict[str, str] | None:
        found = {
            e["involvedObject"]["name"].split("-")[0]: e["message"]
            for e in api.list_all("Event", namespace)
            if e["reason"] == "Rescheduled" and e["involvedObject"]["kind"] == "ReplicaSet"
        }
        return found if set(found) == {"web", "api"} else None

    moves = wait_for("both workloads moved", corroborated_moves, timeout=60)
    # Each moved before its threshold, on the other workload failing beside it: the Event
    # says so, and no report at the threshold (6 restarts) came from the node.
    for message in moves.values():
        assert f"off node {bad}" in message, message
        assert "before the thresholds: corroborated" in message, message
        # Either beside it now ("fail on node"), or in the node's record once the other moved
        # first ("failed on node ... within").
        assert "other workload(s) fail" in message, message
    assert not [
        e
        for e in patient_stack.archived()
        if e["type"] == EVENT_POD_FAILING
        and e["data"].get("kind") == "node-fixable"
        and e["data"].get("node") == bad
    ]
    # Counted against the node (the replies say node-fixable): two workloads, suspect. Nothing
    # else could mark it, with no failure at the threshold there.
    # The replies come through the Broker after the Events the wait above saw: wait for them.
    replies = wait_for(
        "both moves' replies archived",
        lambda: [
            e
            for e in patient_stack.archived()
            if e["type"] == EVENT_POD_RESCHEDULED and e["data"]["node"] == bad
        ],
        timeout=10,
    )
    assert {r["data"]["kind"] for r in replies} == {"node-fixable"}
    wait_for("the node turns suspect", lambda: suspect(node_of(api, bad)), timeout=60)


def test_the_pipeline_marks_no_node_for_one_deployment_failing_everywhere_across_a_rollout(
    cluster: Any, api: Kube, namespace: str, stack: Stack, faults: Callable[..., None]
) -> None:
    # The measurement: one Deployment crash-looping on every node, then `kubectl
    # rollout restart`. Each rollout's ReplicaSet fails on the same nodes; one workload.
    faults("crashloop", *cluster.nodes)
    template = pod_template({"app": "web"}, cluster.nodes[0])
    api.create("Deployment", namespace, workload_body("Deployment", "web", template, replicas=2))
    wait_for("the first rollout's failures", lambda: failed_on(stack, namespace), timeout=60)
    restart_rollout(api, namespace, "web")

    def both_rollouts_failed_on_one_node() -> set[str]:
        by_node = failed_on(stack, namespace)
        return {node for node, sets in by_node.items() if len(sets) >= 2}

    shared_nodes = wait_for(
        "pods of both rollouts failing on one node", both_rollouts_failed_on_one_node, timeout=120
    )
    assert stack.wait_idle(30), "assess-nodes has every report"
    for node in shared_nodes:
        assert len(record(node_of(api, node))["failures"]) >= 2
    assert [n for n in cluster.nodes if suspect(node_of(api, n))] == []
    assert not [e for e in stack.archived() if e["type"] == EVENT_NODE_SUSPECTED]


def failed_on(stack: Stack, namespace: str) -> dict[str, set[str]]:
    """The ReplicaSets whose pods detect-failures reported failing, by node (threshold only)."""
    found: dict[str, set[str]] = {}
    for e in stack.archived():
        data = e.get("data") or {}
        if (
            e["type"] == EVENT_POD_FAILING
            and data.get("namespace") == namespace
            and data.get("kind") == "node-fixable"
            and data.get("node")
        ):
            owners = data.get("ownerReferences") or [{}]
            found.setdefault(data["node"], set()).add(str(owners[0].get("name")))
    return found


def first_move(stack: Stack) -> dict[str, Any] | None:
    for e in stack.archived():
        data = e.get("data") or {}
        if e["type"] == EVENT_POD_RESCHEDULED and data["workload"]["name"].startswith("db-"):
            return e
    return None


def test_new_opted_in_pods_go_to_a_node_without_pressure_when_one_has_room(
    cluster: Any, api: Kube, namespace: str, webhook: Webhook
) -> None:
    # label-nodes' mark (docs/pressure.md) on every node but one: the webhook's preference
    # (status NotIn [presure], weight 20) sends new opted-in pods to that one.
    calm, *pressed = cluster.nodes
    for node in pressed:
        api.merge_patch("Node", None, node, {"metadata": {"labels": {"status": "presure"}}})
    for i in range(3):
        pod = opted_in_pod(f"web-{i}", calm)
        pod["spec"].pop("affinity")  # no preference of its own
        api.create("Pod", namespace, pod)
    assert {bound_node(api, namespace, f"web-{i}") for i in range(3)} == {calm}
    created = api.get("Pod", namespace, "web-0")
    terms = created["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert {
        "weight": 20,
        "preference": {
            "matchExpressions": [{"key": "status", "operator": "NotIn", "values": ["presure"]}]
        },
    } in terms


def test_a_namespace_can_opt_all_its_pods_in_to_avoiding_pressure(
    api: Kube, namespace: str, webhook: Webhook
) -> None:
    api.merge_patch(
        "Namespace", None, namespace, {"metadata": {"labels": {AVOID_PRESSURE_KEY: "true"}}}
    )
    pod = opted_in_pod("plain", "node-0")
    pod["metadata"]["annotations"] = {}  # not opted in to rescheduling
    pod["spec"].pop("affinity")
    created = api.create("Pod", namespace, pod)
    (term,) = created["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["preference"]["matchExpressions"][0]["key"] == "status"
    assert "kn-rescheduler.io/opted-in" not in (created["metadata"].get("labels") or {})


def test_an_unreadable_record_on_one_node_does_not_stop_the_others_expiring(
    cluster: Any, api: Kube, assess: Callable[..., Any], moves: Moves
) -> None:
    client = assess(suspect_window="3s")
    bad, broken = cluster.nodes[1], cluster.nodes[2]
    now = datetime.now(UTC)
    post(client, moves.reply(bad, "web", "web-1", now))
    assert post(client, moves.reply(bad, "api", "api-1", now)).status_code == 200
    garbage = {"metadata": {"annotations": {NODE_HEALTH_ANNOTATION: "{not json"}}}
    api.merge_patch("Node", None, broken, garbage)
    let_time_pass(3.5, "the 3 s suspect window passes")
    # The review skips the record it cannot read (logged), leaves it as it is, and still
    # expires the other node's suspicion.
    assert ping(client).status_code == 202
    assert not suspect(node_of(api, bad))
    annotations = node_of(api, broken)["metadata"]["annotations"]
    assert annotations[NODE_HEALTH_ANNOTATION] == "{not json"
    # A failure report for the broken node is answered 500: kept in the dead-letter sink.
    assert post(client, moves.reply(broken, "db", "db-2", now)).status_code == 500
