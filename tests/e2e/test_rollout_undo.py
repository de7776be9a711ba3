"""`kubectl rollout undo` and the budget, on the real control plane with the real kubectl.

What Kubernetes does (kubectl's polymorphichelpers/rollback.go, the Deployment controller's
deployment/util): `rollout undo` replaces the Deployment's annotations with the annotations of
the ReplicaSet it rolls back to (our state included); the Deployment controller then copies
the Deployment's annotations onto its newest ReplicaSet on every sync, over whatever that
ReplicaSet holds, and onto every ReplicaSet it creates. Without care, every state write on the
rolled-back ReplicaSet is undone a moment later (the count never grows: moves without end), and
the next rollout's ReplicaSet is born with the old one's exclusions. See
shared/pods/update_annotations/rollouts.py.

Every node is faulty in these stories, so a pod moved anywhere fails again: only the budget
stops the moves.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config as k8s_config

from shared.api.keys import POLICY_ANNOTATION, STATE_ANNOTATION
from shared.api.state import load_state
from shared.platform.kube import Kube
from shared.pods.update_annotations.handler import last_trace
from tests.e2e.conftest import Loop, excluded_stamp, pod_template, state_of, wait_for
from tests.e2e.knative_manifests import kubeconfig_for, service_account_token
from tests.e2e.test_rescheduling import events_for, failing_pod, pods, ready, required_exclusions

pytestmark = pytest.mark.e2e

REVISION = "deployment.kubernetes.io/revision"
BUDGET = 2  # scheduling-retries "2" x 1 replica


def web(first_node: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "annotations": {POLICY_ANNOTATION: str(BUDGET)}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": pod_template({"app": "web"}, first_node),
        },
    }


def roll_out(api: Kube, namespace: str, change: str) -> None:
    """A new revision: any change to the pod template makes a new ReplicaSet."""
    template = {"metadata": {"annotations": {"example.com/change": change}}}
    api.merge_patch("Deployment", namespace, "web", {"spec": {"template": template}})


def replicaset_at(api: Kube, namespace: str, revision: int) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for rs in api.list_all("ReplicaSet", namespace):
            if (rs["metadata"].get("annotations") or {}).get(REVISION) == str(revision):
                return rs
        return None

    return wait_for(f"the ReplicaSet of revision {revision}", found)


def kubectl(cluster: Any, namespace: str, *args: str) -> str:
    done = subprocess.run(
        [
            str(cluster.bins_dir / "kubectl"),
            *("--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def annotations(api: Kube, kind: str, namespace: str, name: str) -> dict[str, str]:
    return dict(api.get(kind, namespace, name)["metadata"].get("annotations") or {})


def moves_of(loop: Loop, replicaset: str) -> int:
    """Pods update-annotations removed for this ReplicaSet (one reply per removal)."""
    return sum(
        1
        for reply in loop.replies
        if reply.type.endswith("rescheduled") and reply.data["workload"]["name"] == replicaset
    )


def move_one(api: Kube, loop: Loop, namespace: str) -> None:
    pod = wait_for("a failing pod", lambda: failing_pod(api, loop, namespace))
    event = loop.failing_event(pod)
    assert event is not None
    reply = loop.deliver(event)
    assert reply is not None and reply.type.endswith("rescheduled"), reply


def undo_after_one_move(cluster: Any, namespace: str, api: Kube, loop: Loop) -> dict[str, Any]:
    """Revision 1 moves a pod once, revision 2 is rolled out, and `kubectl rollout undo`
    goes back to revision 1; returns revision 1's ReplicaSet as it is after the undo."""
    api.create("Deployment", namespace, web(cluster.nodes[0]))
    first = replicaset_at(api, namespace, 1)["metadata"]["name"]
    move_one(api, loop, namespace)
    assert state_of(api, "ReplicaSet", namespace, first).moves == 1

    roll_out(api, namespace, "2")
    replicaset_at(api, namespace, 2)
    assert "rolled back" in kubectl(cluster, namespace, "rollout", "undo", "deployment/web")
    # The controller makes the rolled-back ReplicaSet the newest one again (revision 3).
    back = replicaset_at(api, namespace, 3)
    assert back["metadata"]["name"] == first
    # kubectl copied the ReplicaSet's annotations, our state included, onto the Deployment.
    copied = annotations(api, "Deployment", namespace, "web").get(STATE_ANNOTATION)
    assert copied is not None and load_state(copied).moves == 1
    return back


def pump_until_exhausted(
    api: Kube, loop: Loop, namespace: str, replicaset: str, give_up_after: int
) -> None:
    """Deliver every failure until the ReplicaSet's RetriesExhausted Event, or until far more
    pods were removed than any budget allows (so a broken budget fails fast)."""

    def step() -> Any:
        loop.pump(namespace)
        if moves_of(loop, replicaset) > give_up_after:
            return "gave up"
        return events_for(api, namespace, replicaset, "RetriesExhausted")

    wait_for("the budget to run out", step, timeout=120, every=0.5)


def test_after_rollout_undo_the_budget_still_bounds_the_moves(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    faults("imagepull", *cluster.nodes)
    back = undo_after_one_move(cluster, namespace, api, loop)
    name = back["metadata"]["name"]

    pump_until_exhausted(api, loop, namespace, name, give_up_after=3 * BUDGET)
    moved = moves_of(loop, name)
    assert moved <= BUDGET, f"{moved} pods removed against a budget of {BUDGET}"
    state = state_of(api, "ReplicaSet", namespace, name)
    assert (state.moves, state.exhausted_recorded) == (BUDGET, True)
    assert len(events_for(api, namespace, name, "RetriesExhausted")) == 1
    # The copy kubectl made is gone from the Deployment, so the controller no longer
    # overwrites the ReplicaSet's state with it.
    assert STATE_ANNOTATION not in annotations(api, "Deployment", namespace, "web")

    # A later rollout (the nodes fixed meanwhile) starts afresh: no state, no exclusions.
    faults(None, *cluster.nodes)
    roll_out(api, namespace, "4")
    fresh = replicaset_at(api, namespace, 4)["metadata"]["name"]
    assert STATE_ANNOTATION not in annotations(api, "ReplicaSet", namespace, fresh)

    def ready_pod_of_fresh() -> dict[str, Any] | None:
        for pod in pods(api, namespace):
            owners = pod["metadata"].get("ownerReferences") or []
            if any(o["name"] == fresh for o in owners) and ready(pod):
                return pod
        return None

    pod = wait_for("a Ready pod of the new revision", ready_pod_of_fresh)
    assert excluded_stamp(pod) == []
    assert required_exclusions(pod) == set()


def test_a_rollout_right_after_an_undo_ignores_the_state_it_was_born_with(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    faults("imagepull", *cluster.nodes)
    back = undo_after_one_move(cluster, namespace, api, loop)
    old_exclusions = load_state(back["metadata"]["annotations"][STATE_ANNOTATION]).excluded_nodes
    assert len(old_exclusions) == 1

    # Before any failure is handled, a new rollout: the controller gives its ReplicaSet every
    # annotation of the Deployment, the copy of the old ReplicaSet's state included.
    roll_out(api, namespace, "4")
    rs = replicaset_at(api, namespace, 4)
    name = rs["metadata"]["name"]
    born_with = load_state(rs["metadata"]["annotations"][STATE_ANNOTATION])
    assert born_with.excluded_nodes == old_exclusions

    def a_pod_of_the_new_revision() -> dict[str, Any] | None:
        for pod in pods(api, namespace):
            owners = pod["metadata"].get("ownerReferences") or []
            if any(o["name"] == name for o in owners) and pod["spec"].get("nodeName"):
                return pod
        return None

    # The webhook does not take another ReplicaSet's exclusions for this one's.
    pod = wait_for("a scheduled pod of the new revision", a_pod_of_the_new_revision)
    assert excluded_stamp(pod) == []
    assert required_exclusions(pod) == set()

    # Its first failure is its first move, and the copy leaves the Deployment.
    pump_until_exhausted(api, loop, namespace, name, give_up_after=3 * BUDGET)
    assert moves_of(loop, name) == BUDGET
    state = state_of(api, "ReplicaSet", namespace, name)
    assert (state.moves, state.exhausted_recorded) == (BUDGET, True)
    assert state.holder_uid == rs["metadata"]["uid"]
    assert STATE_ANNOTATION not in annotations(api, "Deployment", namespace, "web")


def test_removing_the_policy_from_the_deployment_stops_the_moves_at_the_next_failure(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    faults("imagepull", *cluster.nodes)
    api.create("Deployment", namespace, web(cluster.nodes[0]))
    name = replicaset_at(api, namespace, 1)["metadata"]["name"]
    move_one(api, loop, namespace)

    # The policy goes, and another annotation comes, so that we can see the controller sync.
    changed = {POLICY_ANNOTATION: None, "example.com/owner": "team-b"}
    api.merge_patch("Deployment", namespace, "web", {"metadata": {"annotations": changed}})
    wait_for(
        "the Deployment controller to copy the Deployment's annotations",
        lambda: "example.com/owner" in annotations(api, "ReplicaSet", namespace, name),
    )
    # It never deletes a key: the ReplicaSet keeps the policy, and the webhook stamps it.
    assert annotations(api, "ReplicaSet", namespace, name)[POLICY_ANNOTATION] == str(BUDGET)

    pod = wait_for("the next failing pod", lambda: failing_pod(api, loop, namespace))
    event = loop.failing_event(pod)
    assert event is not None
    assert loop.deliver(event) is None
    still = api.get("Pod", namespace, pod["metadata"]["name"])
    assert still["metadata"]["uid"] == pod["metadata"]["uid"]
    assert state_of(api, "ReplicaSet", namespace, name).moves == 1
    trace = last_trace()
    assert trace is not None
    assert any("no longer has scheduling-retries" in step for step in trace.steps), trace.steps


def test_an_install_whose_rbac_predates_reading_deployments_still_moves_pods_and_says_why(
    cluster: Any, namespace: str, loop: Loop, faults: Callable[..., None], tmp_path: Path
) -> None:
    # update-annotations as a ServiceAccount granted what it needed before this change (no
    # deployments): the real API server answers 403 on the Deployment, and the move goes on.
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "patch"]},
        {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get", "patch"]},
    ]
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    cluster.rest.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "ua"}}
    )
    cluster.rest.post(f"{rbac}/roles", {"metadata": {"name": "ua"}, "rules": rules})
    binding = {
        "metadata": {"name": "ua"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ua"},
        "subjects": [{"kind": "ServiceAccount", "name": "ua", "namespace": namespace}],
    }
    cluster.rest.post(f"{rbac}/rolebindings", binding)
    token = service_account_token(cluster.api_client(), "ua", namespace)
    kubeconfig = kubeconfig_for(cluster.server, cluster.ca_file, token, tmp_path / "kubeconfig")
    restricted = Loop(Kube(k8s_config.new_client_from_config(str(kubeconfig))), loop.cfg)

    faults("imagepull", *cluster.nodes)
    admin = loop.api
    admin.create("Deployment", namespace, web(cluster.nodes[0]))
    pod = wait_for("a failing pod", lambda: failing_pod(admin, loop, namespace))
    event = restricted.failing_event(pod)
    assert event is not None
    reply = restricted.deliver(event)
    assert reply is not None and reply.type.endswith("rescheduled")
    trace = last_trace()
    assert trace is not None
    said = " ".join(trace.steps)
    assert "may not read Deployment" in said and "get and patch on deployments" in said
