"""Pods the kubelet fails outright (phase Failed): their controllers replace them before our
pipeline can record the node (issue 11, item 16), on the real control plane.

A crash-looping pod waits for us; an evicted one does not. The ReplicaSet controller creates
the replacement the moment the kubelet writes phase Failed, and the StatefulSet controller
deletes the failed pod and recreates it under its name. Each test first measures what the real
controllers did (the replacement exists, admitted without the new exclusion, headed for the
node that failed its predecessor), then delivers the failure and checks that the exclusion
reaches the pod that finally runs: the early replacement is redirected, and the move is counted
once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from shared.api.keys import POLICY_ANNOTATION
from shared.api.times import parse_kube_time
from shared.platform.kube import Kube, NotFound
from tests.e2e.conftest import (
    Loop,
    excluded_stamp,
    holds,
    pod_template,
    state_of,
    wait_for,
)
from tests.e2e.test_rescheduling import events_for, only, pods, ready

pytestmark = pytest.mark.e2e

RETRIES = {POLICY_ANNOTATION: "3"}


def failed_on(api: Kube, namespace: str, node: str) -> dict[str, Any] | None:
    for pod in pods(api, namespace):
        if pod["spec"].get("nodeName") == node and pod["status"].get("phase") == "Failed":
            return pod
    return None


def first_failed_seen(cluster: Any, namespace: str, node: str, since: str) -> dict[str, Any]:
    """The first pod status write that put a pod on ``node`` in phase Failed, from a watch
    started at resourceVersion ``since``: a StatefulSet deletes its failed pods at once, so
    only a watch (what ApiServerSource runs) sees that status at all."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for change in cluster.rest.watch(path, {"resourceVersion": since}, timeout_seconds=20):
            pod = change.get("object") or {}
            if change.get("type") == "BOOKMARK":
                since = pod["metadata"]["resourceVersion"]
                continue
            since = pod.get("metadata", {}).get("resourceVersion", since)
            status = pod.get("status") or {}
            if pod.get("spec", {}).get("nodeName") == node and status.get("phase") == "Failed":
                return pod
    raise AssertionError(f"no pod on {node} was seen Failed within 60s")


def failed_at(pod: dict[str, Any]) -> float:
    """When the kubelet failed the pod: its DisruptionTarget condition's transition."""
    for condition in pod["status"].get("conditions") or []:
        if condition["type"] == "DisruptionTarget":
            moment = parse_kube_time(condition["lastTransitionTime"])
            assert moment is not None
            return moment.timestamp()
    raise AssertionError("an evicted pod carries a DisruptionTarget condition")


def created_at(pod: dict[str, Any]) -> float:
    moment = parse_kube_time(pod["metadata"]["creationTimestamp"])
    assert moment is not None
    return moment.timestamp()


def running_elsewhere(api: Kube, namespace: str, bad: str) -> dict[str, Any] | None:
    live = [p for p in pods(api, namespace) if not p["metadata"].get("deletionTimestamp")]
    for pod in live:
        if pod["spec"].get("nodeName") not in (None, bad) and ready(pod):
            return pod
    return None


def test_an_evicted_replicaset_pods_early_replacement_is_redirected_off_the_node(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[1]
    faults("evict", bad)
    api.create(
        "ReplicaSet",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "cache", "annotations": RETRIES},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "cache"}},
                "template": pod_template({"app": "cache"}, bad),
            },
        },
    )
    failed = wait_for("a pod evicted on the faulty node", lambda: failed_on(api, namespace, bad))
    event = loop.failing_event(failed)
    assert event is not None and event.data["reason"] == "Evicted"

    # What the real ReplicaSet controller did before anyone could record the node: a
    # replacement, admitted by our webhook without the exclusion, preferring the same node.
    # (The controller's watch may lag the kubelet's write by a moment on a busy machine.)
    def early_replacement() -> list[dict[str, Any]]:
        uid = failed["metadata"]["uid"]
        return [p for p in pods(api, namespace) if p["metadata"]["uid"] != uid]

    early = wait_for("the ReplicaSet's replacement", early_replacement, timeout=10)
    assert len(early) == 1
    replacement = early[0]
    # Measured here: created within the same second as the kubelet's Failed status write
    # (timestamps have second precision), and already bound to the bad node it prefers.
    assert created_at(replacement) - failed_at(failed) < 2.0
    assert bad not in excluded_stamp(replacement)
    assert replacement["spec"].get("nodeName") in (None, bad)

    reply = loop.deliver(event)
    assert reply is not None and reply.type == "io.kn-rescheduler.pod.rescheduled"
    state = state_of(api, "ReplicaSet", namespace, "cache")
    assert (state.moves, state.excluded_nodes) == (1, (bad,))

    final = wait_for("a Ready pod on a good node", lambda: running_elsewhere(api, namespace, bad))
    assert bad in excluded_stamp(final)
    # The early replacement was headed for the bad node: redirected, not counted.
    redirected = events_for(api, namespace, "cache", "ReplacementRedirected")
    assert len(redirected) == 1
    assert replacement["metadata"]["name"] in redirected[0]["message"]
    # One failure, one move, however many pods it took to place the replacement.
    # Longer than the fake kubelet takes to evict a pod left on the bad node.
    holds("one move", lambda: state_of(api, "ReplicaSet", namespace, "cache").moves == 1, 3)
    assert failed_on(api, namespace, bad) is None or loop.pump(namespace) == 0


def test_an_evicted_statefulset_pod_is_recorded_although_its_controller_deleted_it(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[2]
    faults("evict", bad)
    since = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods")["metadata"]["resourceVersion"]
    api.create(
        "StatefulSet",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "db", "annotations": RETRIES},
            "spec": {
                "replicas": 1,
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": pod_template({"app": "db"}, bad),
            },
        },
    )
    failed = first_failed_seen(cluster, namespace, bad, since)
    event = loop.failing_event(failed)
    assert event is not None

    def namesake() -> dict[str, Any] | None:
        try:
            pod = api.get("Pod", namespace, "db-0")
        except NotFound:  # not recreated yet
            return None
        return pod if pod["metadata"]["uid"] != failed["metadata"]["uid"] else None

    # The real StatefulSet controller deleted the failed pod and recreated it under its name,
    # admitted without the exclusion.
    successor = wait_for("db-0 recreated by its StatefulSet", namesake)
    assert bad not in excluded_stamp(successor)
    # update-annotations records the failure only on the kubelet's own Evicted Event, which a
    # kubelet writes after the pod's Failed status: wait for it as the pipeline's delay would.
    uid = failed["metadata"]["uid"]
    wait_for(
        "the kubelet's Evicted Event for the failed pod",
        lambda: [
            e
            for e in api.list_all("Event", namespace, field_selector=f"involvedObject.uid={uid}")
            if e.get("reason") == "Evicted"
        ],
    )

    reply = loop.deliver(event)
    assert reply is not None and reply.type == "io.kn-rescheduler.pod.rescheduled"
    state = state_of(api, "StatefulSet", namespace, "db")
    assert state.entry("db-0").moves == 1
    assert state.entry("db-0").excluded_nodes == (bad,)
    assert len(events_for(api, namespace, "db", "Rescheduled")) == 1

    final = wait_for("db-0 Ready on a good node", lambda: running_elsewhere(api, namespace, bad))
    assert final["metadata"]["name"] == "db-0"
    assert bad in excluded_stamp(final)
    # The same event again changes nothing (the failed uid is recorded).
    assert loop.deliver(event) is None
    assert state_of(api, "StatefulSet", namespace, "db").entry("db-0").moves == 1
    only(api, "StatefulSet", namespace)
