"""Least privilege, checked by the real API server's authorizer.

The ServiceAccounts, ClusterRoles and bindings of knative/ are created for real, and one
namespace opts its bare pods in with knative/bare-pod-replacement (a RoleBinding); then every
row below asks, with a SubjectAccessReview, whether that function's ServiceAccount may do one
thing. The allowed rows are exactly the calls the code makes (shared/platform/kube.py through
shared/pods/update_annotations/handler.py, shared/workloads/owners.py, shared/admission/handler.py,
shared/pods/sweep_failures/handler.py); the denied rows are the near misses and the dangerous ones.
Creating or changing a pod runs any image under any ServiceAccount of its namespace, so
update-annotations may do it only where a namespace opted in: never cluster-wide, never in
kube-system.

The second scheduler of knative/components/load-aware-scheduler is checked the same way, with
its account and bindings created for real: it may bind pods and hold its own lease, with the
built-in roles the Kubernetes docs give a second scheduler, and nothing beyond them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from dev.stack.functions import FUNCTIONS
from shared.api.keys import LOAD_AWARE_SCHEDULER_NAME
from shared.pods.update_annotations import handler as reschedule
from tests.e2e.conftest import wait_for
from tests.e2e.knative_manifests import (
    KNATIVE_DIR,
    NAMESPACE,
    Obj,
    apply,
    find,
    install_rbac,
    kubectl,
    of_kind,
    render,
    render_opt_in,
)

pytestmark = pytest.mark.e2e

# A namespace of some user's workload (a SubjectAccessReview needs no real object).
APP = "shop"
# A namespace whose bare pods opted in to being moved (it gets the RoleBinding, for real).
OPTED_IN = "bare-pods-shop"
SYSTEM = "kube-system"
# The ClusterRole and account update-annotations names when it cannot replace a bare pod.
BARE_POD_ROLE = reschedule.BARE_POD_CLUSTER_ROLE


@dataclass(frozen=True)
class Can:
    """``who`` may (or may not) ``verb`` the ``resource`` in ``namespace`` ("" = cluster);
    ``name``: one object of it, by name."""

    who: str
    verb: str
    resource: str
    group: str = ""
    subresource: str = ""
    namespace: str = APP
    name: str = ""

    def __str__(self) -> str:
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        group = f".{self.group}" if self.group else ""
        named = f" {self.name}" if self.name else ""
        where = f" in {self.namespace}" if self.namespace else " cluster-wide"
        return f"{self.who} {self.verb} {what}{group}{named}{where}"


def pods(who: str, verb: str, **kw: Any) -> Can:
    return Can(who, verb, "pods", **kw)


def apps(who: str, verb: str, resource: str) -> Can:
    return Can(who, verb, resource, group="apps")


def batch(who: str, verb: str, resource: str) -> Can:
    return Can(who, verb, resource, group="batch")


UPDATE = "update-annotations"
WEBHOOK = "mutate-admission"
SWEEP = "sweep-failures"
DETECT = "detect-failures"
SOURCE = "pod-events-source"
ASSESS = "assess-nodes"
LABEL = "label-nodes"
ANNOTATE = "annotate-usage"
SCORE = "score-nodes"
# The second scheduler of knative/components/load-aware-scheduler (its account, its lease).
SCHEDULER = "load-aware-scheduler"
SCHEDULER_LEASE = LOAD_AWARE_SCHEDULER_NAME


def nodes(who: str, verb: str) -> Can:
    return Can(who, verb, "nodes", namespace="")


ALLOWED = [
    # update-annotations, anywhere: the live pod and its removal (a delete or an eviction).
    pods(UPDATE, "get"),
    pods(UPDATE, "delete"),
    pods(UPDATE, "create", subresource="eviction"),
    # The early replacement of a pod the kubelet failed is found among its siblings.
    pods(UPDATE, "list"),
    # ... and a corroborated early move lists the pods on the failing pod's node, in every
    # namespace (field selector spec.nodeName): another workload failing there now.
    pods(UPDATE, "list", namespace=""),
    # ... an Event per decision, and a repeated Warning counted on one Event.
    Can(UPDATE, "create", "events"),
    Can(UPDATE, "get", "events"),
    Can(UPDATE, "patch", "events"),
    # ... and a verdict resting on the kubelet's Events is read again before it acts.
    Can(UPDATE, "list", "events"),
    # ... and where the namespace opted in: a bare pod's replacement, a bare pod's state.
    pods(UPDATE, "create", namespace=OPTED_IN),
    pods(UPDATE, "patch", namespace=OPTED_IN),
    pods(UPDATE, "get", namespace=OPTED_IN),
    pods(UPDATE, "delete", namespace=OPTED_IN),
    # ... the objects holding the state, and one hop up for the policy.
    apps(UPDATE, "get", "replicasets"),
    apps(UPDATE, "patch", "replicasets"),
    apps(UPDATE, "get", "statefulsets"),
    apps(UPDATE, "patch", "statefulsets"),
    batch(UPDATE, "get", "jobs"),
    batch(UPDATE, "patch", "jobs"),
    batch(UPDATE, "get", "cronjobs"),
    # ... and a Deployment's own policy, and our state removed from it (rollout undo).
    apps(UPDATE, "get", "deployments"),
    apps(UPDATE, "patch", "deployments"),
    # ... and, for the fast path, whether the failing pod's node is suspect; the moved-off
    # mark on the node a pod is moved off (state-writes-only limits it to that label).
    nodes(UPDATE, "get"),
    nodes(UPDATE, "patch"),
    # score-nodes: the node cache (a LIST at start, then a WATCH), read only.
    nodes(SCORE, "list"),
    nodes(SCORE, "watch"),
    # assess-nodes: the failing node's record, label and taint (one patch), the list the cap
    # counts, and the Events on Nodes (which live in "default").
    nodes(ASSESS, "get"),
    nodes(ASSESS, "list"),
    nodes(ASSESS, "patch"),
    Can(ASSESS, "create", "events", namespace="default"),
    Can(ASSESS, "get", "events", namespace="default"),
    Can(ASSESS, "patch", "events", namespace="default"),
    # ... and, before a failure report counts, what confirms it: the reported pod (and a
    # bare pod's replacement), its Warning Events and its controller's pods, and the holder
    # of its state up the owner chain, read only.
    pods(ASSESS, "get"),
    pods(ASSESS, "list"),
    Can(ASSESS, "list", "events"),
    apps(ASSESS, "get", "replicasets"),
    apps(ASSESS, "get", "statefulsets"),
    batch(ASSESS, "get", "jobs"),
    batch(ASSESS, "get", "cronjobs"),
    # annotate-usage: the Nodes it annotates and labels (one patch), the pods bound to them
    # (the estimate), and the Metrics API source.
    nodes(ANNOTATE, "get"),
    nodes(ANNOTATE, "list"),
    nodes(ANNOTATE, "patch"),
    pods(ANNOTATE, "list", namespace=""),
    pods(ANNOTATE, "list"),
    Can(ANNOTATE, "get", "nodes", group="metrics.k8s.io", namespace=""),
    Can(ANNOTATE, "list", "nodes", group="metrics.k8s.io", namespace=""),
    # The PredictedUsageOverLimit Warning on a pod, in the pod's namespace: said once, so
    # never read back or counted again (no get, no patch).
    Can(ANNOTATE, "create", "events", namespace="default"),
    # The second scheduler: what a scheduler does (bind pods, their status, Events, reading
    # what it schedules against) and its own lease.
    pods(SCHEDULER, "create", subresource="binding"),
    pods(SCHEDULER, "patch", subresource="status"),
    pods(SCHEDULER, "watch", namespace=""),
    Can(SCHEDULER, "watch", "nodes", namespace=""),
    Can(SCHEDULER, "create", "events", group="events.k8s.io"),
    Can(SCHEDULER, "list", "persistentvolumes", namespace=""),
    Can(SCHEDULER, "update", "persistentvolumeclaims"),
    Can(SCHEDULER, "create", "leases", group="coordination.k8s.io", namespace=NAMESPACE),
    *(
        Can(
            SCHEDULER,
            verb,
            "leases",
            group="coordination.k8s.io",
            namespace=NAMESPACE,
            name=SCHEDULER_LEASE,
        )
        for verb in ("get", "update")
    ),
    Can(
        SCHEDULER, "get", "configmaps", namespace=SYSTEM, name="extension-apiserver-authentication"
    ),
    # mutate-admission: the namespace's pressure opt-in label.
    Can(WEBHOOK, "get", "namespaces", namespace=""),
    # mutate-admission, for a replacement: a LIST of the nodes where workloads fail now.
    nodes(WEBHOOK, "list"),
    # mutate-admission: reads the owner chain, nothing else.
    apps(WEBHOOK, "get", "replicasets"),
    apps(WEBHOOK, "get", "statefulsets"),
    batch(WEBHOOK, "get", "jobs"),
    batch(WEBHOOK, "get", "cronjobs"),
    # sweep-failures: paged lists of every pod, and of the Warning Events about pods.
    pods(SWEEP, "list", namespace=""),
    pods(SWEEP, "list"),
    Can(SWEEP, "list", "events", namespace=""),
    # The ApiServerSource adapter: the three verbs Knative's controller checks.
    pods(SOURCE, "get"),
    pods(SOURCE, "list", namespace=""),
    pods(SOURCE, "watch", namespace=""),
]

DENIED = [
    # detect-failures needs nothing at all.
    pods(DETECT, "get"),
    pods(DETECT, "list", namespace=""),
    pods(DETECT, "watch", namespace=""),
    apps(DETECT, "get", "replicasets"),
    Can(DETECT, "create", "events"),
    Can(DETECT, "get", "secrets"),
    Can(DETECT, "get", "configmaps", namespace=NAMESPACE),
    # update-annotations: no pod creation or change unless the namespace opted in; never
    # cluster-wide, never in kube-system (a pod there can run as any of its ServiceAccounts).
    pods(UPDATE, "create"),
    pods(UPDATE, "patch"),
    pods(UPDATE, "create", namespace=SYSTEM),
    pods(UPDATE, "patch", namespace=SYSTEM),
    pods(UPDATE, "create", namespace=""),
    pods(UPDATE, "patch", namespace=""),
    pods(UPDATE, "update", namespace=OPTED_IN),
    pods(UPDATE, "create", subresource="exec", namespace=OPTED_IN),
    pods(UPDATE, "patch", subresource="status", namespace=OPTED_IN),
    pods(UPDATE, "patch", subresource="ephemeralcontainers", namespace=OPTED_IN),
    # The opt-in binds update-annotations only.
    *(pods(who, "create", namespace=OPTED_IN) for who in (WEBHOOK, SWEEP, DETECT, SOURCE)),
    # update-annotations: no watches, no other writes, no secrets.
    pods(UPDATE, "watch"),
    pods(UPDATE, "update"),
    pods(UPDATE, "patch", subresource="status"),
    pods(UPDATE, "create", subresource="exec"),
    apps(WEBHOOK, "get", "deployments"),
    apps(UPDATE, "delete", "deployments"),
    apps(UPDATE, "delete", "replicasets"),
    apps(UPDATE, "create", "replicasets"),
    apps(UPDATE, "patch", "daemonsets"),
    batch(UPDATE, "patch", "cronjobs"),
    batch(UPDATE, "delete", "jobs"),
    Can(UPDATE, "get", "secrets"),
    Can(UPDATE, "list", "secrets", namespace=""),
    Can(UPDATE, "delete", "events"),
    Can(UPDATE, "update", "events"),
    Can(UPDATE, "update", "nodes", namespace=""),
    Can(UPDATE, "patch", "nodes", namespace="", subresource="status"),
    Can(UPDATE, "delete", "nodes", namespace=""),
    Can(UPDATE, "create", "serviceaccounts", subresource="token"),
    # mutate-admission: read only, and only what resolving an owner reads.
    pods(WEBHOOK, "get"),
    pods(WEBHOOK, "list", namespace=""),
    apps(WEBHOOK, "list", "replicasets"),
    apps(WEBHOOK, "patch", "replicasets"),
    apps(WEBHOOK, "get", "daemonsets"),
    batch(WEBHOOK, "patch", "jobs"),
    Can(WEBHOOK, "create", "events"),
    Can(WEBHOOK, "get", "secrets"),
    Can(WEBHOOK, "get", "secrets", namespace=NAMESPACE),
    # sweep-failures: lists pods and events, nothing more (not even a get).
    pods(SWEEP, "get"),
    pods(SWEEP, "watch", namespace=""),
    pods(SWEEP, "delete"),
    apps(SWEEP, "list", "replicasets"),
    Can(SWEEP, "list", "secrets", namespace=""),
    Can(SWEEP, "create", "events"),
    Can(SWEEP, "get", "events"),
    Can(SWEEP, "watch", "events", namespace=""),
    # assess-nodes: marks nodes, never removes, cordons, drains or evicts.
    nodes(ASSESS, "delete"),
    nodes(ASSESS, "update"),
    nodes(ASSESS, "create"),
    Can(ASSESS, "patch", "nodes", subresource="status", namespace=""),
    pods(ASSESS, "watch", namespace=""),
    pods(ASSESS, "delete"),
    pods(ASSESS, "patch"),
    pods(ASSESS, "create", subresource="eviction"),
    Can(ASSESS, "get", "secrets", namespace=""),
    # ... and what confirms a report is read, never written; no Deployment is read.
    apps(ASSESS, "patch", "replicasets"),
    apps(ASSESS, "get", "deployments"),
    batch(ASSESS, "patch", "jobs"),
    Can(ASSESS, "watch", "events", namespace=""),
    # The other functions never write a Node.
    *(nodes(who, "patch") for who in (DETECT, WEBHOOK, SWEEP, SOURCE)),
    nodes(WEBHOOK, "get"),
    nodes(WEBHOOK, "watch"),
    Can(WEBHOOK, "patch", "namespaces", namespace=""),
    # annotate-usage: reads pods, writes Nodes' metadata; never moves, cordons or drains.
    pods(ANNOTATE, "get"),
    pods(ANNOTATE, "watch", namespace=""),
    pods(ANNOTATE, "delete"),
    pods(ANNOTATE, "create", subresource="eviction"),
    pods(ANNOTATE, "patch"),
    apps(ANNOTATE, "patch", "deployments"),
    apps(ANNOTATE, "get", "replicasets"),
    nodes(ANNOTATE, "delete"),
    nodes(ANNOTATE, "update"),
    nodes(ANNOTATE, "watch"),
    Can(ANNOTATE, "patch", "nodes", subresource="status", namespace=""),
    Can(ANNOTATE, "list", "pods", group="metrics.k8s.io", namespace=""),
    Can(ANNOTATE, "get", "events", namespace="default"),
    Can(ANNOTATE, "patch", "events", namespace="default"),
    Can(ANNOTATE, "get", "secrets", namespace=NAMESPACE),
    Can(ANNOTATE, "get", "configmaps", namespace=NAMESPACE),
    # score-nodes: its node cache lists and watches Nodes; it reads nothing else, not even
    # one Node alone, and writes nothing.
    nodes(SCORE, "get"),
    nodes(SCORE, "patch"),
    nodes(SCORE, "update"),
    Can(SCORE, "patch", "nodes", subresource="status", namespace=""),
    pods(SCORE, "get"),
    pods(SCORE, "list", namespace=""),
    pods(SCORE, "create", subresource="binding"),
    Can(SCORE, "list", "nodes", group="metrics.k8s.io", namespace=""),
    Can(SCORE, "create", "events"),
    Can(SCORE, "get", "configmaps", namespace=NAMESPACE),
    Can(SCORE, "get", "secrets", namespace=NAMESPACE),
    # The second scheduler: no other lease than its own and the stock scheduler's (which
    # system:kube-scheduler names), no Secrets, no workloads, no Node writes, no other
    # ConfigMap of kube-system, no pods created.
    Can(
        SCHEDULER,
        "update",
        "leases",
        group="coordination.k8s.io",
        namespace=NAMESPACE,
        name="kn-rescheduler-other",
    ),
    Can(
        SCHEDULER,
        "delete",
        "leases",
        group="coordination.k8s.io",
        namespace=NAMESPACE,
        name=SCHEDULER_LEASE,
    ),
    Can(SCHEDULER, "get", "configmaps", namespace=SYSTEM, name="kube-proxy"),
    Can(SCHEDULER, "list", "secrets", namespace=""),
    Can(SCHEDULER, "get", "secrets", namespace=NAMESPACE),
    pods(SCHEDULER, "create"),
    pods(SCHEDULER, "create", subresource="eviction"),
    nodes(SCHEDULER, "patch"),
    nodes(SCHEDULER, "delete"),
    apps(SCHEDULER, "patch", "deployments"),
    apps(SCHEDULER, "patch", "replicasets"),
    # The source's adapter watches pods and does nothing else.
    pods(SOURCE, "delete"),
    Can(SOURCE, "list", "secrets", namespace=""),
    apps(SOURCE, "list", "replicasets"),
    # Nobody may escalate.
    *(
        Can(who, verb, resource, group="rbac.authorization.k8s.io", namespace="")
        for who in (*FUNCTIONS, SOURCE, SCHEDULER)
        for verb, resource in (
            ("create", "clusterrolebindings"),
            ("bind", "clusterroles"),
            ("escalate", "clusterroles"),
        )
    ),
    *(Can(who, "impersonate", "users", namespace="") for who in (*FUNCTIONS, SOURCE, SCHEDULER)),
]


@pytest.fixture(scope="module")
def manifests() -> list[Obj]:
    return render()


@pytest.fixture(scope="module")
def opt_in(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return render_opt_in(OPTED_IN, tmp_path_factory.mktemp("opt-in"))


@pytest.fixture(scope="module")
def scheduler_rbac(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    """The second scheduler's account and bindings (knative/components/load-aware-scheduler)."""
    workdir = tmp_path_factory.mktemp("load-aware-scheduler")
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(KNATIVE_DIR, workdir)],
        "components": [os.path.relpath(KNATIVE_DIR / "components" / SCHEDULER, workdir)],
    }
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    done = subprocess.run(
        [str(kubectl()), "kustomize", str(workdir)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    rendered = [d for d in yaml.safe_load_all(done.stdout) if d]
    return [
        o
        for o in of_kind(rendered, "ServiceAccount", "Role", "RoleBinding", "ClusterRoleBinding")
        if o["metadata"]["labels"].get("app.kubernetes.io/name") == SCHEDULER
    ]


@pytest.fixture(scope="module")
def authorization(
    cluster: Any, manifests: list[Obj], opt_in: list[Obj], scheduler_rbac: list[Obj]
) -> k8s.AuthorizationV1Api:
    install_rbac(cluster.kubeconfig, manifests)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPTED_IN}}
    done = apply(
        cluster.kubeconfig,
        [namespace, *opt_in, *scheduler_rbac],
        "--server-side",
        "--force-conflicts",
    )
    assert done.returncode == 0, done.stderr
    api = k8s.AuthorizationV1Api(cluster.api_client())
    # The RBAC authorizer reads Roles and bindings from informers: a review sent the moment
    # after the apply may not see them yet. Wait until what is granted shows; a grant that never
    # shows fails its own test below, by name.
    with contextlib.suppress(AssertionError):
        wait_for(
            "every grant to reach the authorizer",
            lambda: all(allowed(api, case) for case in ALLOWED),
            timeout=30,
            every=0.5,
        )
    return api


def allowed(api: k8s.AuthorizationV1Api, case: Can) -> bool:
    review = k8s.V1SubjectAccessReview(
        spec=k8s.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{NAMESPACE}:{case.who}",
            # The groups a ServiceAccount token carries, so that bindings to them count too.
            groups=[
                "system:serviceaccounts",
                f"system:serviceaccounts:{NAMESPACE}",
                "system:authenticated",
            ],
            resource_attributes=k8s.V1ResourceAttributes(
                namespace=case.namespace or None,
                verb=case.verb,
                group=case.group,
                resource=case.resource,
                subresource=case.subresource or None,
                name=case.name or None,
            ),
        )
    )
    return bool(api.create_subject_access_review(review).status.allowed)


@pytest.mark.parametrize("case", ALLOWED, ids=str)
def test_each_function_may_do_what_its_code_does(
    authorization: k8s.AuthorizationV1Api, case: Can
) -> None:
    assert allowed(authorization, case), f"{case} is refused"


@pytest.mark.parametrize("case", DENIED, ids=str)
def test_each_function_is_refused_what_it_does_not_need(
    authorization: k8s.AuthorizationV1Api, case: Can
) -> None:
    assert not allowed(authorization, case), f"{case} is allowed"


def test_every_function_runs_as_its_own_service_account(manifests: list[Obj]) -> None:
    service_accounts = {o["metadata"]["name"] for o in of_kind(manifests, "ServiceAccount")}
    for function in FUNCTIONS:
        ksvc = find(manifests, "Service", function, "serving.knative.dev/v1")
        assert ksvc["spec"]["template"]["spec"]["serviceAccountName"] == function
        assert function in service_accounts
    used = [
        o["spec"]["template"]["spec"].get("serviceAccountName")
        for o in manifests
        if o["apiVersion"] == "serving.knative.dev/v1"
    ]
    assert len(set(filter(None, used))) == len(list(filter(None, used))), "a shared account"


def test_the_roles_name_every_verb_and_resource_without_wildcards(manifests: list[Obj]) -> None:
    for role in of_kind(manifests, "ClusterRole", "Role"):
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule, role["metadata"]["name"]
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], f"{role['metadata']['name']}: {key} {rule[key]}"
                assert not any("*" in item for item in rule[key])


def test_each_binding_gives_one_role_to_one_account(manifests: list[Obj]) -> None:
    roles = {o["metadata"]["name"] for o in of_kind(manifests, "ClusterRole")}
    bound = set()
    for binding in of_kind(manifests, "ClusterRoleBinding"):
        assert binding["roleRef"]["name"] in roles
        (subject,) = binding["subjects"]
        assert subject["kind"] == "ServiceAccount"
        assert subject["namespace"] == NAMESPACE
        bound.add(subject["name"])
    # detect-failures is bound to nothing (score-nodes only to its node cache's list, watch).
    assert bound == {
        SCORE,
        "update-annotations",
        "mutate-admission",
        "sweep-failures",
        ASSESS,
        LABEL,
        ANNOTATE,
        "rebalance-nodes",
        SOURCE,
    }


def test_the_second_scheduler_gets_the_roles_the_kubernetes_docs_give_one_and_its_lease(
    scheduler_rbac: list[Obj],
) -> None:
    # "Configure Multiple Schedulers": system:kube-scheduler, system:volume-scheduler, and
    # extension-apiserver-authentication-reader in kube-system; a Role of ours for the lease.
    bound = sorted(
        (b["kind"], b["metadata"].get("namespace", ""), b["roleRef"]["kind"], b["roleRef"]["name"])
        for b in of_kind(scheduler_rbac, "ClusterRoleBinding", "RoleBinding")
    )
    assert bound == [
        ("ClusterRoleBinding", "", "ClusterRole", "system:kube-scheduler"),
        ("ClusterRoleBinding", "", "ClusterRole", "system:volume-scheduler"),
        ("RoleBinding", NAMESPACE, "Role", "kn-rescheduler-load-aware-scheduler-lease"),
        ("RoleBinding", SYSTEM, "Role", "extension-apiserver-authentication-reader"),
    ]
    for binding in of_kind(scheduler_rbac, "ClusterRoleBinding", "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": SCHEDULER, "namespace": NAMESPACE}
        ]
    (lease,) = of_kind(scheduler_rbac, "Role")
    assert lease["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [SCHEDULER_LEASE],
            "verbs": ["get", "update"],
        }
    ]


def test_pod_creation_is_granted_only_by_the_per_namespace_opt_in(
    manifests: list[Obj], opt_in: list[Obj]
) -> None:
    # No ClusterRoleBinding of the install gives a role that creates or changes pods.
    roles = {o["metadata"]["name"]: o for o in of_kind(manifests, "ClusterRole")}
    for binding in of_kind(manifests, "ClusterRoleBinding"):
        for rule in roles[binding["roleRef"]["name"]]["rules"]:
            if "pods" in rule["resources"] and "" in rule["apiGroups"]:
                assert not {"create", "patch", "update"} & set(rule["verbs"]), binding
    # The role that does is in the base, bound by nothing there...
    assert roles[BARE_POD_ROLE]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "patch"]}
    ]
    assert not of_kind(manifests, "RoleBinding")
    # ...and the opt-in is one RoleBinding in the namespace that opted in, to one account.
    (binding,) = opt_in
    assert binding["kind"] == "RoleBinding"
    assert binding["metadata"]["namespace"] == OPTED_IN
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": BARE_POD_ROLE,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": UPDATE, "namespace": NAMESPACE}
    ]
    assert reschedule.SERVICE_ACCOUNT == UPDATE
