"""Removing a pod whose move is decided, on the real control plane: what the API server
refuses, and what is (and is not) recorded then.

- A bare pod after `kubectl debug` carries ephemeral containers a create refuses: its
  replacement must not.
- With the Eviction API, a PodDisruptionBudget may say "not now": nothing is charged before
  the budget allows the move, and a refusal that comes after the charge (a race) is finished
  by a later delivery without charging again.
- Bare-pod replacement is opt-in per namespace (RBAC): without it, nothing is charged.
- Events are counted on one object, and a missing right to count them costs nothing else.

Deliveries go through functions-framework's test client where the HTTP answer is the point
(the Broker retries 5xx and forgets 2xx), else through the in-process Loop.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shared.api.keys import (
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    STATE_ANNOTATION,
)
from shared.platform import kube
from shared.platform.config import Config
from shared.platform.kube import Kube
from tests import builders
from tests.e2e.conftest import Loop, pod_template, state_of, wait_for
from tests.e2e.knative_manifests import kubeconfig_for, service_account_token
from tests.e2e.test_rescheduling import events_for, failing_pod, gone, only, pods
from tests.handlers.conftest import ClientFactory, cloudevent, reply_of

pytestmark = pytest.mark.e2e

RETRIES = "3"
PDB_PATH = "/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"


# -- helpers ------------------------------------------------------------------------------------


def pdb(api: Kube, namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return api.request(
        "POST",
        PDB_PATH.format(namespace=namespace),
        body={
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, **spec},
        },
        write=True,
    )


def pdb_observed(api: Kube, namespace: str, name: str) -> bool:
    """The disruption controller has computed the budget's latest generation (until then
    every eviction is refused as "still being processed")."""
    got = api.request("GET", PDB_PATH.format(namespace=namespace) + f"/{name}")
    return bool(got.get("status", {}).get("observedGeneration") == got["metadata"]["generation"])


def delete_pdb(api: Kube, namespace: str, name: str) -> None:
    api.request("DELETE", PDB_PATH.format(namespace=namespace) + f"/{name}", write=True)


def pod_events(api: Kube, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        e for e in events_for(api, namespace, name, reason) if e["involvedObject"]["kind"] == "Pod"
    ]


def charged(api: Kube, kind: str, namespace: str, name: str) -> int:
    return state_of(api, kind, namespace, name).moves


def still_there(api: Kube, pod: dict[str, Any]) -> bool:
    meta = pod["metadata"]
    live = api.get("Pod", meta["namespace"], meta["name"])
    return live["metadata"]["uid"] == meta["uid"] and not live["metadata"].get("deletionTimestamp")


def post(client: Any, event: Any) -> Any:
    headers, body = cloudevent(EVENT_POD_FAILING, event.data, subject=event.subject)
    return client.post("/", headers=headers, data=body)


def account(
    cluster: Any, api: Kube, namespace: str, name: str, rules: list[dict[str, Any]], path: Path
) -> Path:
    """A ServiceAccount with exactly ``rules`` in ``namespace``; a kubeconfig that is it."""
    api.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        body={"metadata": {"name": name}},
        write=True,
    )
    grant(api, namespace, name, name, rules)
    token = service_account_token(cluster.api_client(), name, namespace)
    return kubeconfig_for(cluster.server, cluster.ca_file, token, path)


def grant(api: Kube, namespace: str, account_name: str, role: str, rules: list[dict]) -> None:
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    api.request(
        "POST", f"{rbac}/roles", body={"metadata": {"name": role}, "rules": rules}, write=True
    )
    api.request(
        "POST",
        f"{rbac}/rolebindings",
        body={
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account_name, "namespace": namespace}],
        },
        write=True,
    )
    # The RBAC authorizer reads Roles and bindings from informers: a request sent the moment
    # after may still be refused. Return once every verb granted shows.
    wanted = [
        (verb, resource, group)
        for rule in rules
        for verb in rule["verbs"]
        for resource in rule["resources"]
        for group in rule.get("apiGroups") or [""]
    ]
    wait_for(
        f"the grant of {role} to reach the authorizer",
        lambda: [w for w in wanted if not allowed(api, namespace, account_name, *w)] == [],
    )


def allowed(
    api: Kube, namespace: str, account_name: str, verb: str, resource: str, group: str = ""
) -> bool:
    review = api.request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        body={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{namespace}:{account_name}",
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": verb,
                    "resource": resource,
                    "group": group,
                },
            },
        },
        write=True,
    )
    return bool(review.get("status", {}).get("allowed"))


# -- ephemeral containers -----------------------------------------------------------------------


def test_a_bare_pod_debugged_with_an_ephemeral_container_is_replaced_once_without_it(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[1]
    faults("crashloop", bad)
    api.create(
        "Pod",
        namespace,
        builders.bare_pod("solo", retries=RETRIES, template=pod_template({"app": "solo"}, bad)),
    )
    wait_for(
        "solo bound to the faulty node",
        lambda: api.get("Pod", namespace, "solo")["spec"].get("nodeName") == bad,
    )
    # What `kubectl debug -it solo --image=busybox:1.36 --target=app` sends: a strategic
    # merge patch on the pods/ephemeralcontainers subresource.
    api.request(
        "PATCH",
        kube.path_for("Pod", namespace, "solo", "ephemeralcontainers"),
        body={
            "spec": {
                "ephemeralContainers": [
                    {
                        "name": "debugger-8xk2p",
                        "image": "busybox:1.36",
                        "stdin": True,
                        "tty": True,
                        "terminationMessagePolicy": "File",
                        "targetContainerName": "app",
                    }
                ]
            }
        },
        content_type="application/strategic-merge-patch+json",
        write=True,
    )
    debugged = wait_for("solo failing", lambda: failing_pod(api, loop, namespace))
    assert debugged["spec"]["ephemeralContainers"][0]["name"] == "debugger-8xk2p"
    event = loop.failing_event(debugged)
    assert event is not None

    reply = loop.deliver(event)
    assert reply is not None and reply.type == EVENT_POD_RESCHEDULED
    # Delivered again (at least once): nothing more happens.
    assert loop.deliver(event) is None

    meta = debugged["metadata"]
    assert gone(api, namespace, meta["name"], meta["uid"])
    replacements = [p for p in pods(api, namespace) if p["metadata"]["uid"] != meta["uid"]]
    assert len(replacements) == 1
    new = replacements[0]
    assert new["metadata"]["name"].startswith("solo-")
    assert "ephemeralContainers" not in new["spec"]
    assert new["spec"]["containers"] == [c for c in debugged["spec"]["containers"]]
    state = state_of(api, "Pod", namespace, new["metadata"]["name"])
    assert (state.moves, state.excluded_nodes, state.handled) == (1, (bad,), (meta["uid"],))
    moved = events_for(api, namespace, "solo", "Rescheduled")
    assert len(moved) == 1 and moved[0]["count"] == 1


# -- PodDisruptionBudgets -------------------------------------------------------------------


def test_a_pod_disruption_budget_defers_a_move_without_charging_it(
    cluster: Any,
    namespace: str,
    api: Kube,
    loop: Loop,
    faults: Callable[..., None],
    function_client: ClientFactory,
) -> None:
    bad = cluster.nodes[2]
    faults("crashloop", bad)
    api.create(
        "Deployment",
        namespace,
        builders.deployment(retries=RETRIES, template=pod_template({"app": "web"}, bad)),
    )
    # No disruption at all: even the crash-looping (unready) pod is protected, since the
    # default unhealthyPodEvictionPolicy (IfHealthyBudget) only lets unready pods go while
    # the application has all the healthy pods it needs.
    pdb(api, namespace, "web", maxUnavailable=0)
    wait_for("the budget observed", lambda: pdb_observed(api, namespace, "web"))
    pod = wait_for("a failing pod", lambda: failing_pod(api, loop, namespace))
    event = loop.failing_event(pod)
    assert event is not None
    client = function_client(
        "update-annotations",
        KUBECONFIG=str(cluster.kubeconfig),
        KN_RESCHEDULER_USE_EVICTION="true",
    )
    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]

    # "Not now": 202 (the Broker forgets it), no reply, nothing charged, the pod stays.
    response = post(client, event)
    assert (response.status_code, response.data) == (202, b"")
    assert charged(api, "ReplicaSet", namespace, rs) == 0
    assert STATE_ANNOTATION not in api.get("ReplicaSet", namespace, rs)["metadata"].get(
        "annotations", {}
    )
    assert still_there(api, pod)
    deferred = pod_events(api, namespace, pod["metadata"]["name"], "MoveDeferred")
    assert len(deferred) == 1 and deferred[0]["type"] == "Warning"
    assert "disruption budget web" in deferred[0]["message"]
    assert "not counted" in deferred[0]["message"]
    assert not events_for(api, namespace, rs, "Rescheduled")

    # The sweep sends the still-failing pod again: the same Event, counted. The eviction is
    # asked once, as a dry run, not retried in a loop of 429s.
    with kube.recording() as calls:
        assert Loop(api, Config(use_eviction=True)).deliver(event) is None
    evictions = [c for c in calls if c.path.endswith("/eviction")]
    assert [(c.status, c.dry_run) for c in evictions] == [(429, True)]
    assert not [c for c in calls if c.method == "PATCH" and "/replicasets/" in c.path]
    deferred = pod_events(api, namespace, pod["metadata"]["name"], "MoveDeferred")
    assert len(deferred) == 1 and deferred[0]["count"] == 2
    assert charged(api, "ReplicaSet", namespace, rs) == 0

    # What the message advises: let failing pods go.
    api.request(
        "PATCH",
        PDB_PATH.format(namespace=namespace) + "/web",
        body={"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}},
        content_type="application/merge-patch+json",
        write=True,
    )
    wait_for("the relaxed budget observed", lambda: pdb_observed(api, namespace, "web"))
    response = post(client, event)
    assert response.status_code == 200
    attrs, data = reply_of(response)
    assert attrs["type"] == EVENT_POD_RESCHEDULED
    assert (data["moves"], data["excludedNodes"]) == (1, [bad])
    meta = pod["metadata"]
    wait_for("the pod evicted", lambda: gone(api, namespace, meta["name"], meta["uid"]))
    assert charged(api, "ReplicaSet", namespace, rs) == 1
    assert len(events_for(api, namespace, rs, "Rescheduled")) == 1
    # Redelivered once more: the pod is gone, nothing is charged or said again.
    assert post(client, event).status_code == 202
    assert charged(api, "ReplicaSet", namespace, rs) == 1
    assert len(events_for(api, namespace, rs, "Rescheduled")) == 1


class BudgetAfterStateWrite(Kube):
    """The real API server, with a PodDisruptionBudget created the moment the move is
    recorded: the race between the dry-run eviction and the real one, made to happen."""

    def __init__(self, api: Kube, namespace: str, name: str) -> None:
        super().__init__(api._api)
        self.namespace, self.name = namespace, name

    def merge_patch(self, kind: str, namespace: str | None, name: str, body: Any) -> Any:
        written = super().merge_patch(kind, namespace, name, body)
        if kind == "ReplicaSet":
            pdb(self, self.namespace, self.name, maxUnavailable=0)
        return written


def test_an_eviction_refused_after_the_move_was_charged_finishes_later_without_a_second_charge(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[3]
    faults("crashloop", bad)
    api.create(
        "Deployment",
        namespace,
        builders.deployment(retries=RETRIES, template=pod_template({"app": "web"}, bad)),
    )
    pod = wait_for("a failing pod", lambda: failing_pod(api, loop, namespace))
    event = loop.failing_event(pod)
    assert event is not None
    racing = Loop(BudgetAfterStateWrite(api, namespace, "web"), Config(use_eviction=True))
    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]

    assert racing.deliver(event) is None  # answered 202: no reply
    state = state_of(api, "ReplicaSet", namespace, rs)
    assert (state.moves, state.handled) == (1, (pod["metadata"]["uid"],))
    assert still_there(api, pod)
    deferred = pod_events(api, namespace, pod["metadata"]["name"], "MoveDeferred")
    assert len(deferred) == 1
    assert "counted once and will not be counted again" in deferred[0]["message"]
    assert not events_for(api, namespace, rs, "Rescheduled")

    # Once the budget is gone, the next delivery (the sweep's) evicts, and counts nothing.
    delete_pdb(api, namespace, "web")
    evicting = Loop(api, Config(use_eviction=True))
    reply = evicting.deliver(event)
    assert reply is not None and reply.type == EVENT_POD_RESCHEDULED
    assert (reply.data["action"], reply.data["moves"]) == ("move", 1)
    assert "recorded earlier, removed now" in reply.data["message"]
    meta = pod["metadata"]
    wait_for("the pod evicted", lambda: gone(api, namespace, meta["name"], meta["uid"]))
    assert state_of(api, "ReplicaSet", namespace, rs).moves == 1
    moved = events_for(api, namespace, rs, "Rescheduled")
    assert len(moved) == 1
    assert "(move 1 of 3)" in moved[0]["message"]


# -- RBAC -----------------------------------------------------------------------------------

# What update-annotations does to a bare pod, minus creating its replacement.
WITHOUT_CREATE = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "patch"]},
]


def test_a_bare_pod_whose_namespace_did_not_opt_in_to_replacement_is_not_charged(
    cluster: Any,
    namespace: str,
    api: Kube,
    loop: Loop,
    faults: Callable[..., None],
    function_client: ClientFactory,
    tmp_path: Path,
) -> None:
    bad = cluster.nodes[0]
    faults("crashloop", bad)
    api.create(
        "Pod",
        namespace,
        builders.bare_pod("solo", retries=RETRIES, template=pod_template({"app": "solo"}, bad)),
    )
    pod = wait_for("solo failing", lambda: failing_pod(api, loop, namespace))
    event = loop.failing_event(pod)
    assert event is not None
    kubeconfig = account(cluster, api, namespace, "mover", WITHOUT_CREATE, tmp_path / "kc")
    client = function_client("update-annotations", KUBECONFIG=str(kubeconfig))

    for count in (1, 2):
        response = post(client, event)
        assert (response.status_code, response.data) == (202, b"")
        assert charged(api, "Pod", namespace, "solo") == 0
        assert still_there(api, pod)
        said = pod_events(api, namespace, "solo", "ReplacementNotAllowed")
        assert len(said) == 1 and said[0]["count"] == count
        assert said[0]["type"] == "Warning"
        assert f"RoleBinding in {namespace}" in said[0]["message"]
    assert [p["metadata"]["name"] for p in pods(api, namespace)] == ["solo"]

    # The namespace opts in: the next delivery moves it.
    grant(
        api,
        namespace,
        "mover",
        "replace-bare-pods",
        [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}],
    )
    response = post(client, event)
    assert response.status_code == 200
    meta = pod["metadata"]
    assert gone(api, namespace, meta["name"], meta["uid"])
    new = [p for p in pods(api, namespace) if p["metadata"]["uid"] != meta["uid"]]
    assert len(new) == 1
    assert charged(api, "Pod", namespace, new[0]["metadata"]["name"]) == 1


def test_an_event_is_counted_on_one_object_and_counting_needs_no_more_than_creating(
    cluster: Any,
    namespace: str,
    api: Kube,
    loop: Loop,
    faults: Callable[..., None],
    function_client: ClientFactory,
    tmp_path: Path,
) -> None:
    bad = cluster.nodes[1]
    faults("imagepull", bad)
    api.create(
        "ReplicaSet",
        namespace,
        builders.replicaset(retries="lots", template=pod_template({"app": "web"}, bad)),
    )
    pod = wait_for("a failing pod", lambda: failing_pod(api, loop, namespace))
    event = loop.failing_event(pod)
    assert event is not None
    admin = function_client("update-annotations", KUBECONFIG=str(cluster.kubeconfig))
    for _ in range(3):
        assert post(admin, event).status_code == 202
    warned = events_for(api, namespace, "web", "InvalidPolicy")
    assert len(warned) == 1 and warned[0]["count"] == 3
    assert warned[0]["firstTimestamp"] <= warned[0]["lastTimestamp"]

    # An install whose RBAC still lacks get/patch on events: counting fails, quietly.
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    kubeconfig = account(cluster, api, namespace, "old-install", rules, tmp_path / "kc")
    old = function_client("update-annotations", KUBECONFIG=str(kubeconfig))
    assert post(old, event).status_code == 202
    warned = events_for(api, namespace, "web", "InvalidPolicy")
    assert len(warned) == 1 and warned[0]["count"] == 3
    assert still_there(api, pod)
