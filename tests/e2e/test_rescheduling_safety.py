"""What keeps the rescheduler safe, on the real control plane: concurrency, duplicates,
bounded budgets, recovering from its own exclusions, and a webhook that never blocks."""

from __future__ import annotations

import concurrent.futures
import random
from collections.abc import Callable
from typing import Any

import pytest

from shared.api.keys import POLICY_ANNOTATION
from shared.platform.config import Config
from shared.platform.kube import Kube
from tests import builders
from tests.e2e.conftest import (
    Loop,
    Webhook,
    break_every_node_differently,
    pod_template,
    state_of,
    wait_for,
)
from tests.e2e.test_rescheduling import events_for, failing_pod, gone, only, pods

pytestmark = pytest.mark.e2e


def required_on(*nodes: str) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    for node in nodes
                ]
            }
        }
    }


def test_twenty_failures_handled_by_eight_threads_at_once_lose_no_update(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[:2]
    faults("imagepull", *bad)
    template = pod_template({"app": "crowd"}, bad[0], affinity=required_on(*bad))
    api.create(
        "Deployment",
        namespace,
        builders.deployment("crowd", retries="5", template=template, replicas=20),
    )

    def twenty_failing() -> list[Any] | None:
        found = [e for e in (loop.failing_event(p) for p in pods(api, namespace)) if e]
        return found if len(found) == 20 else None

    failures = wait_for("20 pods failing on the two bad nodes", twenty_failing, timeout=90)
    random.shuffle(failures)
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        replies = list(pool.map(loop.deliver, failures))

    assert all(r is not None and r.type.endswith("rescheduled") for r in replies)
    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]
    state = state_of(api, "ReplicaSet", namespace, rs)
    assert state.moves == 20
    assert sorted(state.excluded_nodes) == sorted(bad)
    assert sorted(state.handled) == sorted(e.data["uid"] for e in failures)
    assert len(events_for(api, namespace, rs, "Rescheduled")) == 20


def test_duplicate_and_reordered_events_end_as_one_clean_delivery(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[3]
    faults("crashloop", bad)
    api.create(
        "Deployment",
        namespace,
        builders.deployment("web", retries="3", template=pod_template({"app": "web"}, bad)),
    )
    first = wait_for("a failing pod", lambda: failing_pod(api, loop, namespace))
    uid = first["metadata"]["uid"]

    def restarted_again() -> dict[str, Any] | None:
        pod = api.get("Pod", namespace, first["metadata"]["name"])
        restarts = pod["status"]["containerStatuses"][0]["restartCount"]
        return pod if restarts > first["status"]["containerStatuses"][0]["restartCount"] else None

    later = wait_for("the pod to crash once more", restarted_again)
    early_event, late_event = loop.failing_event(first), loop.failing_event(later)
    assert early_event is not None and late_event is not None
    # The later event first, then the earlier one, then both again (at-least-once, unordered).
    for event in (late_event, early_event, late_event, early_event):
        loop.deliver(event)

    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]
    state = state_of(api, "ReplicaSet", namespace, rs)
    assert (state.moves, state.excluded_nodes, state.handled) == (1, (bad,), (uid,))
    assert len(events_for(api, namespace, rs, "Rescheduled")) == 1
    assert len([r for r in loop.replies if r.type.endswith("rescheduled")]) == 1
    wait_for("the pod to be removed", lambda: gone(api, namespace, first["metadata"]["name"], uid))


def pump_until(
    loop: Loop, namespace: str, what: str, done: Callable[[], Any], kinds: tuple[str, ...] = ()
) -> Any:
    def step() -> Any:
        loop.pump(namespace, kinds=kinds)
        return done()

    return wait_for(what, step, timeout=120, every=0.5)


def test_when_every_node_is_excluded_the_exclusions_are_cleared_and_the_count_kept(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    break_every_node_differently(faults, cluster.nodes)
    api.create(
        "Deployment",
        namespace,
        builders.deployment("web", retries="10", template=pod_template({"app": "web"}, "node-0")),
    )
    rs = wait_for("the ReplicaSet", lambda: list(api.list_all("ReplicaSet", namespace)))
    rs_name = rs[0]["metadata"]["name"]

    def unschedulable_pod() -> dict[str, Any] | None:
        for pod in pods(api, namespace):
            for c in pod.get("status", {}).get("conditions") or []:
                if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
                    return pod
        return None

    # Only node failures are delivered until the unschedulable pod shows up; delivered at
    # once, its own failure event would clear the exclusions before we could look.
    stuck = pump_until(
        loop,
        namespace,
        "a pod unschedulable by our exclusions",
        unschedulable_pod,
        kinds=("node-fixable",),
    )
    before = state_of(api, "ReplicaSet", namespace, rs_name)
    assert sorted(before.excluded_nodes) == sorted(cluster.nodes)
    assert before.moves == len(cluster.nodes)

    event = loop.failing_event(stuck)
    assert event is not None and event.data["kind"] == "exclusions-unschedulable"
    loop.deliver(event)
    after = state_of(api, "ReplicaSet", namespace, rs_name)
    assert after.excluded_nodes == ()
    assert after.moves == before.moves  # clearing is not a move
    assert len(events_for(api, namespace, rs_name, "ExclusionsCleared")) == 1

    def scheduled_replacement() -> dict[str, Any] | None:
        for pod in pods(api, namespace):
            if pod["metadata"]["uid"] != stuck["metadata"]["uid"] and pod["spec"].get("nodeName"):
                return pod
        return None

    replacement = wait_for("the next pod to be scheduled", scheduled_replacement)
    assert "kn-rescheduler.io/excluded-nodes" not in replacement["metadata"]["annotations"]


def test_an_exhausted_budget_stops_moving_and_says_so_once(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    faults("imagepull", *cluster.nodes)
    api.create(
        "Deployment",
        namespace,
        builders.deployment("web", retries="1", template=pod_template({"app": "web"}, "node-0")),
    )
    rs = wait_for("the ReplicaSet", lambda: list(api.list_all("ReplicaSet", namespace)))
    rs_name = rs[0]["metadata"]["name"]
    pump_until(
        loop,
        namespace,
        "the budget to run out",
        lambda: events_for(api, namespace, rs_name, "RetriesExhausted"),
    )
    survivor = failing_pod(api, loop, namespace)
    assert survivor is not None
    for _ in range(3):
        loop.pump(namespace)
    state = state_of(api, "ReplicaSet", namespace, rs_name)
    assert state.moves == 1
    assert len(events_for(api, namespace, rs_name, "RetriesExhausted")) == 1
    assert len(events_for(api, namespace, rs_name, "Rescheduled")) == 1
    still = api.get("Pod", namespace, survivor["metadata"]["name"])
    assert still["metadata"]["uid"] == survivor["metadata"]["uid"]
    assert any(r.type.endswith("exhausted") for r in loop.replies)


def test_an_invalid_policy_warns_on_the_workload_and_moves_nothing(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[0]
    faults("imagepull", bad)
    api.create(
        "Deployment",
        namespace,
        builders.deployment("web", retries="1e9", template=pod_template({"app": "web"}, bad)),
    )
    pod = wait_for("a failing pod", lambda: failing_pod(api, loop, namespace))
    event = loop.failing_event(pod)
    assert event is not None
    # Every delivery (redeliveries, the sweep) says it again, on the same Event.
    assert loop.deliver(event) is None
    assert loop.deliver(event) is None
    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]
    warnings = events_for(api, namespace, rs, "InvalidPolicy")
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    assert warnings[0]["count"] == 2
    assert "1e9" in warnings[0]["message"]
    assert (
        api.get("Pod", namespace, pod["metadata"]["name"])["metadata"]["uid"]
        == pod["metadata"]["uid"]
    )


def test_pods_are_still_created_while_the_webhook_is_down(
    namespace: str, api: Kube, webhook: Webhook
) -> None:
    webhook.server.stop()
    try:
        created = api.create(
            "Pod",
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "while-down", "annotations": {POLICY_ANNOTATION: "2"}},
                "spec": {"containers": [{"name": "app", "image": "registry.example.com/a:1"}]},
            },
        )
        assert created["metadata"]["uid"]
    finally:
        webhook.server.start()


def test_with_eviction_a_pod_disruption_budget_delays_the_move_and_charges_it_once(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[1]
    faults("crashloop", bad)
    api.create(
        "Deployment",
        namespace,
        builders.deployment("web", retries="3", template=pod_template({"app": "web"}, bad)),
    )
    api.request(
        "POST",
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
        body={
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "web"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        },
        write=True,
    )
    evicting = Loop(api, Config(use_eviction=True))
    pod = wait_for("a failing pod", lambda: failing_pod(api, evicting, namespace))
    event = evicting.failing_event(pod)
    assert event is not None

    # The budget forbids the eviction (the dry run answers 429): "not now", nothing charged,
    # no reply, and the pod says why.
    assert evicting.deliver(event) is None
    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]
    assert state_of(api, "ReplicaSet", namespace, rs).moves == 0
    assert api.get("Pod", namespace, pod["metadata"]["name"])["metadata"]["uid"]
    assert len(events_for(api, namespace, pod["metadata"]["name"], "MoveDeferred")) == 1
    assert not events_for(api, namespace, rs, "Rescheduled")

    # Once the budget allows it, the event sent again moves the pod and charges it once.
    api.request(
        "DELETE", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/web", write=True
    )
    reply = evicting.deliver(event)
    assert reply is not None and reply.type.endswith("rescheduled")
    meta = pod["metadata"]
    wait_for("the pod to be evicted", lambda: gone(api, namespace, meta["name"], meta["uid"]))
    state = state_of(api, "ReplicaSet", namespace, rs)
    assert (state.moves, state.excluded_nodes) == (1, (bad,))
    assert len(events_for(api, namespace, rs, "Rescheduled")) == 1
