"""The rescheduling core on the real control plane: one story per owner kind.

Each test makes a node faulty the way a kubelet reports it, lets the real scheduler put an
opted-in pod there, delivers the failure through detect-failures and update-annotations, and
then checks what Kubernetes did: the state written on the right object, the pod removed, the
replacement created through the real API server (and our webhook) carrying the affinity, and
the real scheduler placing it on a node that is not excluded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.api.keys import (
    OPTED_IN_LABEL,
    POLICY_ANNOTATION,
    POLICY_STAMP_ANNOTATION,
    STATE_ANNOTATION,
)
from shared.platform.kube import Kube, NotFound
from tests.e2e.conftest import Loop, excluded_stamp, pod_template, state_of, wait_for

pytestmark = pytest.mark.e2e

RETRIES = {POLICY_ANNOTATION: "3"}


# -- helpers ------------------------------------------------------------------------------------


def pods(api: Kube, namespace: str) -> list[dict[str, Any]]:
    return list(api.list_all("Pod", namespace))


def failing_pod(api: Kube, loop: Loop, namespace: str) -> dict[str, Any] | None:
    for pod in pods(api, namespace):
        if loop.failing_event(pod) is not None:
            return pod
    return None


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def gone(api: Kube, namespace: str, name: str, uid: str) -> bool:
    try:
        return api.get("Pod", namespace, name)["metadata"]["uid"] != uid
    except NotFound:
        return True


def required_exclusions(pod: dict[str, Any]) -> set[str]:
    """Nodes excluded by ``metadata.name NotIn`` in every required nodeSelectorTerm."""
    terms = (
        pod["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    per_term = [
        {
            v
            for req in term.get("matchFields", [])
            if req["key"] == "metadata.name" and req["operator"] == "NotIn"
            for v in req["values"]
        }
        for term in terms
    ]
    return set.intersection(*per_term) if per_term else set()


def events_for(api: Kube, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in api.list_all("Event", namespace)
        if e["involvedObject"]["name"] == name and e["reason"] == reason
    ]


def only(api: Kube, kind: str, namespace: str) -> dict[str, Any]:
    items = list(api.list_all(kind, namespace))
    assert len(items) == 1, f"expected one {kind}, found {[i['metadata']['name'] for i in items]}"
    return items[0]


def move_once(api: Kube, loop: Loop, namespace: str, bad: str) -> dict[str, Any]:
    """Wait for a pod failing on ``bad``, deliver its failure; return that pod."""
    pod = wait_for("a pod failing on the faulty node", lambda: failing_pod(api, loop, namespace))
    assert pod["spec"]["nodeName"] == bad
    event = loop.failing_event(pod)
    assert event is not None
    reply = loop.deliver(event)
    assert reply is not None and reply.type == "io.kn-rescheduler.pod.rescheduled"
    meta = pod["metadata"]
    wait_for(
        "the failing pod to be removed", lambda: gone(api, namespace, meta["name"], meta["uid"])
    )
    return pod


def settled_replacement(
    api: Kube, namespace: str, old_uid: str, bad: str, name: str | None = None
) -> dict[str, Any]:
    """The replacement pod, once the real scheduler placed it and it is Ready."""

    def replacement() -> dict[str, Any] | None:
        for pod in pods(api, namespace):
            if pod["metadata"]["uid"] == old_uid or pod["metadata"].get("deletionTimestamp"):
                continue
            if name and pod["metadata"]["name"] != name:
                continue
            if ready(pod):
                return pod
        return None

    new = wait_for("a Ready replacement", replacement)
    assert new["spec"]["nodeName"] != bad
    assert excluded_stamp(new) == [bad]
    assert required_exclusions(new) == {bad}
    assert new["metadata"]["annotations"][POLICY_STAMP_ANNOTATION] == "3"
    return new


# -- one story per owner kind -----------------------------------------------------------------


def test_a_deployment_pod_crash_looping_on_a_bad_node_is_moved_to_a_good_one(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[0]
    faults("crashloop", bad)
    api.create(
        "Deployment",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "annotations": RETRIES},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": pod_template({"app": "web"}, bad),
            },
        },
    )
    old = move_once(api, loop, namespace, bad)

    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]
    state = state_of(api, "ReplicaSet", namespace, rs)
    assert (state.moves, state.excluded_nodes) == (1, (bad,))
    assert old["metadata"]["uid"] in state.handled
    # The state lives on the ReplicaSet, never on the Deployment: a rollout starts afresh.
    deployment = api.get("Deployment", namespace, "web")
    assert STATE_ANNOTATION not in deployment["metadata"].get("annotations", {})
    settled_replacement(api, namespace, old["metadata"]["uid"], bad)
    assert len(events_for(api, namespace, rs, "Rescheduled")) == 1


def test_a_bare_replicaset_keeps_its_own_state(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[1]
    faults("oom", bad)
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
    old = move_once(api, loop, namespace, bad)
    state = state_of(api, "ReplicaSet", namespace, "cache")
    assert (state.moves, state.excluded_nodes) == (1, (bad,))
    settled_replacement(api, namespace, old["metadata"]["uid"], bad)


def test_statefulset_pods_keep_separate_exclusions_per_pod_name(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[2]
    faults("crashloop", bad)
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
    old = move_once(api, loop, namespace, bad)
    assert old["metadata"]["name"] == "db-0"
    state = state_of(api, "StatefulSet", namespace, "db")
    assert state.entry("db-0").excluded_nodes == (bad,)
    assert state.entry("db-0").moves == 1
    assert state.excluded_nodes == ()  # nothing shared with other pod names
    # The StatefulSet controller recreates db-0 under the same name; the webhook finds its
    # exclusions by that name.
    settled_replacement(api, namespace, old["metadata"]["uid"], bad, name="db-0")


def job_manifest(name: str, bad: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, **meta},
        "spec": {
            "backoffLimit": 6,
            "template": pod_template({"app": name}, bad, restartPolicy="OnFailure"),
        },
    }


def test_a_job_pod_is_moved_without_the_job_being_recreated(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[3]
    faults("crashloop", bad)
    job = api.create("Job", namespace, job_manifest("report", bad, annotations=RETRIES))
    old = move_once(api, loop, namespace, bad)
    state = state_of(api, "Job", namespace, "report")
    assert (state.moves, state.excluded_nodes) == (1, (bad,))
    assert api.get("Job", namespace, "report")["metadata"]["uid"] == job["metadata"]["uid"]
    settled_replacement(api, namespace, old["metadata"]["uid"], bad)


def test_a_cronjob_policy_reaches_the_pods_of_its_jobs(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[0]
    faults("imagepull", bad)
    cron = api.create(
        "CronJob",
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "nightly", "annotations": RETRIES},
            "spec": {
                "schedule": "0 3 * * *",
                "jobTemplate": {"spec": job_manifest("nightly", bad)["spec"]},
            },
        },
    )
    # What `kubectl create job --from=cronjob/nightly` does: a Job controlled by the CronJob.
    # The CronJob's annotations are not copied onto it, so the policy is found one hop up.
    owner = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "name": "nightly",
        "uid": cron["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    api.create("Job", namespace, job_manifest("nightly-manual", bad, ownerReferences=[owner]))
    old = move_once(api, loop, namespace, bad)
    state = state_of(api, "Job", namespace, "nightly-manual")
    assert (state.moves, state.excluded_nodes) == (1, (bad,))
    settled_replacement(api, namespace, old["metadata"]["uid"], bad)


def test_a_bare_pod_is_recreated_off_the_faulty_node_with_its_state(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[1]
    faults("crashloop", bad)
    template = pod_template({"app": "solo"}, bad)
    api.create(
        "Pod",
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "solo", "annotations": RETRIES, **template["metadata"]},
            "spec": template["spec"],
        },
    )
    old = move_once(api, loop, namespace, bad)
    new = settled_replacement(api, namespace, old["metadata"]["uid"], bad)
    assert new["metadata"]["name"].startswith("solo-")
    # The user's labels, and ours that lets the event source see it.
    assert new["metadata"]["labels"] == {"app": "solo", OPTED_IN_LABEL: "true"}
    state = state_of(api, "Pod", namespace, new["metadata"]["name"])
    assert (state.moves, state.excluded_nodes) == (1, (bad,))


def test_a_daemonset_pod_is_never_moved(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[2]
    faults("crashloop", bad)
    api.create(
        "DaemonSet",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent", "annotations": RETRIES},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": pod_template({"app": "agent"}, bad),
            },
        },
    )

    def crash_looping_on_bad() -> dict[str, Any] | None:
        for pod in pods(api, namespace):
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if pod["spec"].get("nodeName") == bad and any(
                s.get("restartCount", 0) >= 3 for s in statuses
            ):
                return pod
        return None

    pod = wait_for("the agent pod crash-looping on the bad node", crash_looping_on_bad)
    # The webhook did not stamp it and detect-failures refuses it; update-annotations refuses
    # it as well when handed a failing event for it anyway (as a sweep with
    # forward_unstamped, or a hand-made replay, would).
    assert POLICY_STAMP_ANNOTATION not in pod["metadata"].get("annotations", {})
    assert loop.failing_event(pod) is None
    disguised = {**pod["metadata"], "ownerReferences": [], "annotations": RETRIES}
    forced = loop.failing_event({**pod, "metadata": disguised})
    assert forced is not None
    forced.data["ownerReferences"] = pod["metadata"]["ownerReferences"]
    assert loop.deliver(forced) is None
    assert (
        api.get("Pod", namespace, pod["metadata"]["name"])["metadata"]["uid"]
        == pod["metadata"]["uid"]
    )
    ds = api.get("DaemonSet", namespace, "agent")
    assert STATE_ANNOTATION not in ds["metadata"].get("annotations", {})
