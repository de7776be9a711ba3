"""knative/components/state-writes-only, enforced by the real API server.

RBAC lets update-annotations patch Deployments, ReplicaSets, StatefulSets and Jobs in every
namespace (the state lives there, or a copy of it must be removed), and pods where a namespace
opted in to bare-pod replacement. A patched pod
template would run any image under any ServiceAccount of that namespace. The component's
ValidatingAdmissionPolicy refuses any change from that ServiceAccount other than to the
``kn-rescheduler.io/state`` annotation. Here the ServiceAccount's own token makes the writes:
the state write goes through, everything else is refused by the policy (RBAC allowed it), and
nobody else is affected.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from shared.api import movedoff
from shared.api.keys import MOVED_OFF_LABEL, POLICY_ANNOTATION, STATE_ANNOTATION, SUSPECT_LABEL
from shared.platform import kube
from shared.platform.kube import Kube
from shared.pods.update_annotations import bodies
from tests.e2e.conftest import pod_template, wait_for
from tests.e2e.knative_manifests import (
    Obj,
    apply,
    install_rbac,
    kubeconfig_for,
    of_kind,
    render,
    render_opt_in,
    service_account_token,
)

pytestmark = pytest.mark.e2e

STATE = '{"excludedNodes":["node-3"],"handled":[],"moves":1,"version":1}'
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


@pytest.fixture(scope="module")
def with_policy(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return render("state-writes-only", workdir=tmp_path_factory.mktemp("overlay-vap"))


@pytest.fixture(scope="module")
def installed(cluster: Any, with_policy: list[Obj]) -> list[Obj]:
    install_rbac(cluster.kubeconfig, with_policy)
    done = apply(cluster.kubeconfig, of_kind(with_policy, *POLICY_KINDS), "--server-side")
    assert done.returncode == 0, done.stderr
    return with_policy


@pytest.fixture
def update_annotations_kubeconfig(cluster: Any, installed: list[Obj], tmp_path: Path) -> Path:
    """Credentials of update-annotations' own ServiceAccount (its RBAC, and the policy)."""
    token = service_account_token(cluster.api_client(), "update-annotations")
    return kubeconfig_for(cluster.server, cluster.ca_file, token, tmp_path / "kubeconfig")


@pytest.fixture
def as_update_annotations(update_annotations_kubeconfig: Path) -> Callable[..., Kube]:
    def make(*, dry_run: bool = False) -> Kube:
        client = k8s_config.new_client_from_config(str(update_annotations_kubeconfig))
        return Kube(client, dry_run=dry_run, attempts=1)

    return make


def write_state(admin: Kube, writer: Kube, kind: str, namespace: str, name: str) -> Obj:
    """The state write a move makes: a compare-and-swap on the object as it is now, tried
    again on a conflict (controllers and the kubelet write status meanwhile), as
    update-annotations does."""
    for _ in range(10):
        now = admin.get(kind, namespace, name)["metadata"]["resourceVersion"]
        try:
            return writer.merge_patch(kind, namespace, name, bodies.state_patch(now, STATE))
        except kube.Conflict:
            continue
    raise AssertionError(f"{kind} {namespace}/{name} kept changing")


STATE_POLICY = "kn-rescheduler-state-writes-only"
NODE_POLICY = "kn-rescheduler-node-writes"


def refused_by_policy(write: Callable[[], Any], policy: str = STATE_POLICY) -> str:
    """The policy's message for a write it refuses (RBAC allowed the write)."""
    try:
        write()
    except (kube.Forbidden, kube.Invalid) as exc:
        assert policy in str(exc), exc
        return str(exc)
    raise AssertionError("the write went through")


def test_the_policy_is_accepted_by_the_api_server(installed: list[Obj]) -> None:
    policies = of_kind(installed, "ValidatingAdmissionPolicy")
    bindings = of_kind(installed, "ValidatingAdmissionPolicyBinding")
    assert sorted(p["metadata"]["name"] for p in policies) == [NODE_POLICY, STATE_POLICY]
    assert sorted(b["spec"]["policyName"] for b in bindings) == [NODE_POLICY, STATE_POLICY]
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)


def test_update_annotations_may_write_its_state_and_nothing_else_of_a_workload(
    api: Kube, namespace: str, as_update_annotations: Callable[..., Kube]
) -> None:
    api.create(
        "ReplicaSet",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": "web",
                "labels": {"app": "web"},
                "annotations": {POLICY_ANNOTATION: "3", "team": "shop"},
            },
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "web"}},
                "template": pod_template({"app": "web"}, "node-0"),
            },
        },
    )
    dry = as_update_annotations(dry_run=True)

    def patch(body: Obj) -> Callable[[], Any]:
        return lambda: dry.merge_patch("ReplicaSet", namespace, "web", body)

    evil_template = {
        "spec": {
            "template": {"spec": {"containers": [{"name": "app", "image": "evil.example/x:1"}]}}
        }
    }
    # The policy takes effect once the API server has loaded it.
    wait_for(
        "the policy to refuse a template change",
        lambda: _refuses(patch(evil_template)),
        timeout=30,
    )
    refused_by_policy(patch({"spec": {"replicas": 5}}))
    refused_by_policy(patch({"metadata": {"labels": {"app": "other"}}}))
    refused_by_policy(patch({"metadata": {"annotations": {"team": "someone-else"}}}))
    refused_by_policy(patch({"metadata": {"annotations": {POLICY_ANNOTATION: None}}}))
    refused_by_policy(patch({"metadata": {"annotations": {STATE_ANNOTATION: STATE, "extra": "x"}}}))

    # What a move really writes goes through, for real.
    written = write_state(api, as_update_annotations(), "ReplicaSet", namespace, "web")
    assert written["metadata"]["annotations"][STATE_ANNOTATION] == STATE
    # Nobody else is held to it.
    api.merge_patch("ReplicaSet", namespace, "web", {"spec": {"replicas": 0, "minReadySeconds": 1}})


def test_in_a_namespace_that_opted_in_a_bare_pods_spec_stays_out_of_reach(
    cluster: Any,
    api: Kube,
    namespace: str,
    as_update_annotations: Callable[..., Kube],
    update_annotations_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    opt_in = render_opt_in(namespace, tmp_path / "opt-in")
    assert apply(cluster.kubeconfig, opt_in).returncode == 0
    api.create(
        "Pod",
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "solo", "annotations": {POLICY_ANNOTATION: "2"}},
            "spec": {
                "containers": [{"name": "app", "image": "registry.example.com/shop/web:1.4.2"}],
                "terminationGracePeriodSeconds": 0,
            },
        },
    )
    # A container's image is one of the few pod fields an update may change (a strategic
    # merge patch, which changes it alone; a merge patch would replace the container list).
    pods = k8s.CoreV1Api(k8s_config.new_client_from_config(str(update_annotations_kubeconfig)))
    swap_image = {"spec": {"containers": [{"name": "app", "image": "evil.example/x:1"}]}}
    wait_for(
        "the policy (and the RoleBinding) to be in effect",
        lambda: _refuses(
            lambda: pods.patch_namespaced_pod("solo", namespace, swap_image, dry_run="All")
        ),
        timeout=30,
    )
    written = write_state(api, as_update_annotations(), "Pod", namespace, "solo")
    assert written["metadata"]["annotations"][STATE_ANNOTATION] == STATE


def _refuses(write: Callable[[], Any], policy: str = STATE_POLICY) -> bool:
    try:
        write()
    except (kube.Forbidden, kube.Invalid) as exc:
        return policy in str(exc)
    except k8s.ApiException as exc:
        return policy in (exc.body or "")
    return False


def test_on_a_deployment_only_removing_a_copied_state_goes_through(
    api: Kube, namespace: str, as_update_annotations: Callable[..., Kube]
) -> None:
    # What kubectl rollout undo leaves: the ReplicaSet's annotations, our state included,
    # copied onto the Deployment.
    api.create(
        "Deployment",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web",
                "annotations": {POLICY_ANNOTATION: "3", STATE_ANNOTATION: STATE},
            },
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "web"}},
                "template": pod_template({"app": "web"}, "node-0"),
            },
        },
    )
    dry = as_update_annotations(dry_run=True)
    evil = {
        "spec": {
            "template": {"spec": {"containers": [{"name": "app", "image": "evil.example/x:1"}]}}
        }
    }
    wait_for(
        "the policy to refuse a Deployment's template change",
        lambda: _refuses(lambda: dry.merge_patch("Deployment", namespace, "web", evil)),
        timeout=30,
    )
    refused_by_policy(
        lambda: dry.merge_patch(
            "Deployment", namespace, "web", {"metadata": {"annotations": {POLICY_ANNOTATION: None}}}
        )
    )
    removed = as_update_annotations().merge_patch(
        "Deployment", namespace, "web", {"metadata": {"annotations": {STATE_ANNOTATION: None}}}
    )
    assert STATE_ANNOTATION not in removed["metadata"]["annotations"]


def test_on_a_node_update_annotations_may_write_its_moved_off_mark_and_nothing_else(
    api: Kube, as_update_annotations: Callable[..., Kube]
) -> None:
    name = "node-0"
    dry = as_update_annotations(dry_run=True)

    def patch(body: Obj) -> Callable[[], Any]:
        return lambda: dry.merge_patch("Node", None, name, body)

    taint = {"spec": {"taints": [{"key": "x", "value": "y", "effect": "NoSchedule"}]}}
    wait_for(
        "the policy to refuse a taint",
        lambda: _refuses(patch(taint), NODE_POLICY),
        timeout=30,
    )
    refused_by_policy(patch({"spec": {"unschedulable": True}}), NODE_POLICY)
    refused_by_policy(
        patch({"metadata": {"labels": {"topology.kubernetes.io/zone": "b"}}}), NODE_POLICY
    )
    refused_by_policy(
        patch({"metadata": {"labels": {"kubernetes.io/hostname": None}}}), NODE_POLICY
    )
    refused_by_policy(patch({"metadata": {"annotations": {"team": "x"}}}), NODE_POLICY)
    refused_by_policy(
        patch({"metadata": {"labels": {MOVED_OFF_LABEL: "1", SUSPECT_LABEL: "true"}}}), NODE_POLICY
    )

    # What a move really writes goes through, for real: the mark, compare-and-swap.
    try:
        now = datetime.now(UTC)
        body = movedoff.mark_patch(api.get("Node", None, name), now, timedelta(minutes=2))
        assert body is not None
        marked = as_update_annotations().merge_patch("Node", None, name, body)
        assert marked["metadata"]["labels"][MOVED_OFF_LABEL] == movedoff.mark_value(now)
    finally:
        api.merge_patch("Node", None, name, {"metadata": {"labels": {MOVED_OFF_LABEL: None}}})
