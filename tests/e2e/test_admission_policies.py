"""No webhook on Kubernetes 1.36: MutatingAdmissionPolicies do admission, on the real API server.

The stack here runs with ``admission="policies"``: no mutate-admission process, no
MutatingWebhookConfiguration, no certificate; the policies of
knative/components/admission-policies (rendered from the stack's settings) are the only
admission of ours. Two kinds of test:

- The pipeline's own stories (imported from test_pipeline.py and test_job_moves.py, run here
  against this module's stack): a Deployment, a StatefulSet, a Job and a bare pod moved off a
  faulty node, and each replacement kept off it. Every replacement starts out preferring the
  faulty node (``pod_template``), so only the required node affinity the policies add keeps it
  off.
- A table of pods the API server admits with a dry run: what the policies make of each is what
  the webhook's own decision (``shared.admission.decide.mutate``) makes of it, label, stamps and
  affinities, merged into the pod's own.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from dev.stack.functions import environment
from dev.stack.stack import Stack
from shared.admission.decide import OwnerFacts, SoftAvoid, mutate
from shared.admission.policies import PART_OF
from shared.api import avoidnodes
from shared.api.keys import (
    ADMISSION_PARAM_LABEL,
    AVOID_PRESSURE_KEY,
    FAILING_WORKLOADS_LABEL,
    IGNORE_DISRUPTIONS_ANNOTATION,
    MOVED_OFF_LABEL,
    POLICY_ANNOTATION,
    STUCK_AFTER_ANNOTATION,
)
from shared.platform.config import Config
from shared.platform.kube import Kube
from tests.e2e.conftest import wait_for
from tests.e2e.test_job_moves import (
    test_a_job_with_backoff_limit_0_that_ignores_disruptions_completes_after_a_free_move as test_a_job_that_ignores_disruptions_gets_its_rule_from_the_policy,  # noqa: E501
)
from tests.e2e.test_pipeline import (
    test_a_bare_pod_is_recreated_off_the_faulty_node,
    test_a_deployment_with_one_faulty_node_moves_and_settles_on_healthy_nodes,
    test_a_job_pod_moves_without_the_job_being_recreated,
    test_daemonsets_and_workloads_without_the_policy_are_left_alone,
    test_statefulset_pods_keep_separate_exclusions,
)

pytestmark = pytest.mark.e2e

# Imported stories, run against this module's `stack`.
__all__ = [
    "test_a_bare_pod_is_recreated_off_the_faulty_node",
    "test_a_deployment_with_one_faulty_node_moves_and_settles_on_healthy_nodes",
    "test_a_job_pod_moves_without_the_job_being_recreated",
    "test_a_job_that_ignores_disruptions_gets_its_rule_from_the_policy",
    "test_daemonsets_and_workloads_without_the_policy_are_left_alone",
    "test_statefulset_pods_keep_separate_exclusions",
]


@pytest.fixture(scope="module")
def stack(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The pipeline with the admission policies and no webhook, for this module only."""
    workdir = tmp_path_factory.mktemp("stack-policies")
    with Stack(
        cluster.kubeconfig,
        cluster.api_client(),
        workdir,
        cluster.log_dir,
        sweep_every=None,
        admission="policies",
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def no_webhook_is_registered(stack: Stack, cluster: Any) -> None:
    hooks = k8s.AdmissionregistrationV1Api(
        cluster.api_client()
    ).list_mutating_webhook_configuration()
    assert [h.metadata.name for h in hooks.items] == []
    assert "mutate-admission" not in stack.servers


def test_the_policies_and_bindings_are_installed_and_the_webhook_is_not(cluster: Any) -> None:
    api = k8s.AdmissionregistrationV1Api(cluster.api_client())
    selector = ",".join(f"{k}={v}" for k, v in PART_OF.items())
    policies = {
        p.metadata.name for p in api.list_mutating_admission_policy(label_selector=selector).items
    }
    bindings = {
        b.metadata.name
        for b in api.list_mutating_admission_policy_binding(label_selector=selector).items
    }
    assert (
        policies
        == bindings
        == {
            "kn-rescheduler-admission-params",
            "kn-rescheduler-pods-namespace-avoid-pressure",
            "kn-rescheduler-pods-namespace-load-aware",
            "kn-rescheduler-pods-replicaset",
            "kn-rescheduler-pods-statefulset",
            "kn-rescheduler-pods-job",
            "kn-rescheduler-pods-without-controller",
            "kn-rescheduler-jobs",
        }
    )


# -- the same pod through the policies and through the webhook's decision -----------------------

ZONE_A = {"key": "zone", "operator": "In", "values": ["a"]}
LINUX = {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
NOT_NODE_X = {"key": "metadata.name", "operator": "NotIn", "values": ["node-x"]}
PRESSURE = Config().pressure_label.partition("=")


def _pod(name: str, owner: dict[str, Any] | None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}], **spec},
    }


def _replicaset(
    api: Kube, namespace: str, name: str, annotations: dict[str, str], replicas: int = 1
) -> dict[str, Any]:
    """A ReplicaSet of one pod that no scheduler places (one scaled to 0 is no param: it makes
    no pods); the pods under test are dry runs of other names."""
    made = api.create(
        "ReplicaSet",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "schedulerName": "nobody",
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                    },
                },
            },
        },
    )
    return made


def _statefulset(
    api: Kube, namespace: str, name: str, annotations: dict[str, str]
) -> dict[str, Any]:
    """A StatefulSet with no pods: at 0 it is still a param (it is scaled through its scale
    subresource, which the param-label policy never sees); the pods under test are dry runs."""
    made = api.create(
        "StatefulSet",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {
                "replicas": 0,
                "serviceName": name,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
                },
            },
        },
    )
    return made


def _owner(rs: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": rs["metadata"]["name"],
        "uid": rs["metadata"]["uid"],
        "controller": True,
    }


def _with_flat(api: Kube, namespace: str, rs: dict[str, Any], flat: str) -> dict[str, Any]:
    return api.merge_patch(
        "ReplicaSet",
        namespace,
        rs["metadata"]["name"],
        {"metadata": {"annotations": {avoidnodes.ANNOTATION: flat}}},
    )


def _admitted(cluster: Any, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    made = k8s.CoreV1Api(cluster.api_client()).create_namespaced_pod(
        namespace, copy.deepcopy(pod), dry_run="All"
    )
    return cluster.api_client().sanitize_for_serialization(made)  # type: ignore[no-any-return]


def _ours(pod: dict[str, Any]) -> dict[str, Any]:
    """What admission of ours may change: labels, annotations, node affinity."""
    meta = pod.get("metadata") or {}
    affinity = (pod.get("spec") or {}).get("affinity") or {}
    return {
        "labels": {k: v for k, v in (meta.get("labels") or {}).items()},
        "annotations": {
            k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("kn-")
        },
        "nodeAffinity": affinity.get("nodeAffinity"),
        "podAntiAffinity": affinity.get("podAntiAffinity"),
    }


def _failing_term(weight: int) -> dict[str, Any]:
    """The one term the policies write differently from the webhook (no Node LIST, no clock):
    every pod placed after a move gets it, with no `Lt` on the mark's time."""
    return {
        "weight": weight,
        "preference": {
            "matchExpressions": [
                {"key": FAILING_WORKLOADS_LABEL, "operator": "DoesNotExist"},
                {"key": MOVED_OFF_LABEL, "operator": "DoesNotExist"},
            ]
        },
    }


CASES = [
    # (id, owner annotations, flat list of the owner's own uid, pod spec)
    ("no affinity of its own", {POLICY_ANNOTATION: "3"}, "*=node-a,node-b", {}),
    # One preferred term to add and none of the pod's own: the case that panicked the API
    # server while the terms were one list value (docs/install-choices.md).
    ("opted in, no move yet", {POLICY_ANNOTATION: "3"}, None, {}),
    (
        "opted in, no move yet, a preferred term of its own",
        {POLICY_ANNOTATION: "3"},
        None,
        {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 5, "preference": {"matchExpressions": [ZONE_A]}}
                    ]
                }
            }
        },
    ),
    (
        "its own required and preferred terms",
        {POLICY_ANNOTATION: "3", STUCK_AFTER_ANNOTATION: "5m"},
        "*=node-a",
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [LINUX]},
                            {"matchFields": [NOT_NODE_X]},
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 5, "preference": {"matchExpressions": [ZONE_A]}}
                    ],
                },
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 1,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": {"app": "x"}},
                            },
                        }
                    ]
                },
            }
        },
    ),
    (
        "already avoiding pressure with a weight of its own",
        {POLICY_ANNOTATION: "2"},
        "*=node-a",
        {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 7,
                            "preference": {
                                "matchExpressions": [
                                    {
                                        "key": PRESSURE[0],
                                        "operator": "NotIn",
                                        "values": [PRESSURE[2]],
                                    }
                                ]
                            },
                        }
                    ]
                }
            }
        },
    ),
    ("bound at creation", {POLICY_ANNOTATION: "3"}, "*=node-a", {"nodeName": "node-a"}),
    ("a policy of 0 excludes nothing", {POLICY_ANNOTATION: "0"}, "*=node-a", {}),
    ("an unreadable policy excludes nothing", {POLICY_ANNOTATION: "three"}, "*=node-a", {}),
    ("more than the most retries", {POLICY_ANNOTATION: "101"}, "*=node-a", {}),
    ("no policy at all", {}, "*=node-a", {}),
    ("asks to avoid pressure without a policy", {AVOID_PRESSURE_KEY: "true"}, None, {}),
]


@pytest.mark.parametrize(
    ("annotations", "flat", "spec"),
    [pytest.param(a, f, s, id=i) for i, a, f, s in CASES],
)
def test_a_pod_admitted_by_the_policies_is_what_the_webhook_would_make_of_it(
    cluster: Any,
    namespace: str,
    api: Kube,
    stack: Stack,
    annotations: dict[str, str],
    flat: str | None,
    spec: dict[str, Any],
) -> None:
    cfg = Config.from_env(stack_environment(stack))
    rs = _replicaset(api, namespace, "web", annotations)
    if flat is not None:
        rs = _with_flat(api, namespace, rs, f"{rs['metadata']['uid']};{flat}")
    pod = _pod("web-abcde", _owner(rs), **copy.deepcopy(spec))
    admitted = _admitted(cluster, namespace, pod)

    policy = annotations.get(POLICY_ANNOTATION)
    listed = avoidnodes.parse(f"x;{flat}") if flat else None
    moves = policy is not None and policy.isdigit() and 1 <= int(policy) <= cfg.max_retries
    avoid: list[SoftAvoid] = []
    if moves or annotations.get(AVOID_PRESSURE_KEY) == "true":
        key, _, value = cfg.pressure_label.partition("=")
        avoid.append(SoftAvoid(key, value, cfg.pressure_affinity_weight, "pressure"))
    facts = OwnerFacts(
        policy=policy,
        excluded_nodes=listed.for_pod(None, per_pod=False) if listed else (),
        stuck_after=annotations.get(STUCK_AFTER_ANNOTATION),
        max_retries=cfg.max_retries,
        avoid=tuple(avoid),
    )
    expected = _ours(mutate(_pod("web-abcde", _owner(rs), **copy.deepcopy(spec)), facts).pod)
    got = _ours(admitted)
    if moves and facts.excluded_nodes and not spec.get("nodeName") and cfg.failing_affinity_weight:
        preferred = got["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        term = _failing_term(cfg.failing_affinity_weight)
        assert term in preferred
        preferred.remove(term)
    assert got == expected


def stack_environment(stack: Stack) -> dict[str, str]:
    return environment(stack.kubeconfig, **stack.settings)


def test_a_copy_of_another_objects_list_excludes_nothing(
    cluster: Any, namespace: str, api: Kube, stack: Stack
) -> None:
    # The Deployment controller copies a Deployment's annotations onto its newest ReplicaSet,
    # and `kubectl rollout undo` copies a ReplicaSet's back: a list with another uid is not this
    # object's.
    rs = _with_flat(
        api,
        namespace,
        _replicaset(api, namespace, "web", {POLICY_ANNOTATION: "3"}),
        "another-uid;*=node-a",
    )
    admitted = _admitted(cluster, namespace, _pod("web-abcde", _owner(rs)))
    assert admitted["metadata"]["labels"]["kn-rescheduler.io/opted-in"] == "true"
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in (
        ((admitted["spec"].get("affinity") or {}).get("nodeAffinity")) or {}
    )


@pytest.mark.parametrize(
    "flat",
    [
        "*=node-a,Node_B",  # one name the API server would refuse
        "*=node-a;*=node-b",  # the scope twice
        "*=" + ",".join(f"node-{i}" for i in range(33)),  # past the most exclusions kept
        "*",  # no '='
        "*=node-a,node-a",  # a name twice
        "*=node-a;",  # a trailing separator
        "*=node-a,,node-b",  # an empty name
    ],
)
def test_a_malformed_list_excludes_nothing_and_the_pod_is_still_admitted(
    cluster: Any, namespace: str, api: Kube, stack: Stack, flat: str
) -> None:
    rs = _replicaset(api, namespace, "web", {POLICY_ANNOTATION: "3"})
    rs = _with_flat(api, namespace, rs, f"{rs['metadata']['uid']};{flat}")
    admitted = _admitted(cluster, namespace, _pod("web-abcde", _owner(rs)))
    assert admitted["metadata"]["labels"]["kn-rescheduler.io/opted-in"] == "true"
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in (
        ((admitted["spec"].get("affinity") or {}).get("nodeAffinity")) or {}
    )


def test_stamps_copied_from_elsewhere_are_removed_from_a_pod_whose_owner_has_no_policy(
    cluster: Any, namespace: str, api: Kube, stack: Stack
) -> None:
    # The owner is a param (it asks for a preference) without a policy: our label and stamps on
    # its pod come from a copied manifest, and go; the user's keys stay.
    rs = _replicaset(api, namespace, "web", {AVOID_PRESSURE_KEY: "true"})
    pod = _pod("web-abcde", _owner(rs))
    pod["metadata"]["labels"] = {"kn-rescheduler.io/opted-in": "true", "app": "web"}
    pod["metadata"]["annotations"] = {
        "kn-rescheduler.io/scheduling-retries": "3",
        "kn-rescheduler.io/excluded-nodes": '["node-a"]',
        "team": "payments",
    }
    admitted = _admitted(cluster, namespace, pod)
    assert admitted["metadata"]["labels"] == {"app": "web"}
    assert admitted["metadata"]["annotations"] == {"team": "payments"}


def test_a_workload_is_a_param_exactly_while_it_has_an_annotation_of_ours(
    cluster: Any, namespace: str, api: Kube, stack: Stack
) -> None:
    rs = _replicaset(api, namespace, "web", {POLICY_ANNOTATION: "3"})
    assert rs["metadata"]["labels"].get(ADMISSION_PARAM_LABEL) == "true"
    gone = api.merge_patch(
        "ReplicaSet", namespace, "web", {"metadata": {"annotations": {POLICY_ANNOTATION: None}}}
    )
    assert ADMISSION_PARAM_LABEL not in (gone["metadata"].get("labels") or {})
    # Not a param: its pods get nothing, as the webhook gives a pod whose owner has no policy.
    admitted = _admitted(cluster, namespace, _pod("web-abcde", _owner(gone)))
    assert "kn-rescheduler.io/opted-in" not in (admitted["metadata"].get("labels") or {})
    plain = _replicaset(api, namespace, "plain", {"team": "payments"})
    assert ADMISSION_PARAM_LABEL not in (plain["metadata"].get("labels") or {})
    # Scaled to 0 it makes no pods, so it is no param; scaled up again (a rollback) it is one
    # before its controller creates a pod.
    again = api.merge_patch(
        "ReplicaSet", namespace, "web", {"metadata": {"annotations": {POLICY_ANNOTATION: "3"}}}
    )
    assert again["metadata"]["labels"][ADMISSION_PARAM_LABEL] == "true"
    idle = api.merge_patch("ReplicaSet", namespace, "web", {"spec": {"replicas": 0}})
    assert ADMISSION_PARAM_LABEL not in (idle["metadata"].get("labels") or {})
    back = api.merge_patch("ReplicaSet", namespace, "web", {"spec": {"replicas": 2}})
    assert back["metadata"]["labels"][ADMISSION_PARAM_LABEL] == "true"
    # Created at 0 (a rollout's new ReplicaSet, a Deployment created at 0), it is one from its
    # create: the update scaling it up is followed at once by its pods' creates, before the API
    # server's informer of params would see a label put on by that update.
    new = _replicaset(api, namespace, "rollout", {POLICY_ANNOTATION: "3"}, replicas=0)
    assert new["metadata"]["labels"][ADMISSION_PARAM_LABEL] == "true"
    # A StatefulSet stays one at 0: kubectl scale, an HPA or KEDA scale it through its scale
    # subresource, which the policy never sees.
    sts = _statefulset(api, namespace, "idle", {POLICY_ANNOTATION: "3"})
    assert sts["metadata"]["labels"][ADMISSION_PARAM_LABEL] == "true"


def test_a_namespace_that_asks_gets_the_preference_for_pods_of_any_followed_owner(
    cluster: Any, namespace: str, api: Kube, stack: Stack
) -> None:
    api.merge_patch(
        "Namespace", None, namespace, {"metadata": {"labels": {AVOID_PRESSURE_KEY: "true"}}}
    )
    cfg = Config.from_env(stack_environment(stack))
    key, _, value = cfg.pressure_label.partition("=")
    want = {
        "weight": cfg.pressure_affinity_weight,
        "preference": {"matchExpressions": [{"key": key, "operator": "NotIn", "values": [value]}]},
    }
    plain = _replicaset(api, namespace, "plain", {})

    def preferred(pod: dict[str, Any]) -> list[Any]:
        affinity = pod["spec"].get("affinity") or {}
        return list(
            (affinity.get("nodeAffinity") or {}).get(
                "preferredDuringSchedulingIgnoredDuringExecution"
            )
            or []
        )

    def admitted() -> list[Any] | None:
        got = preferred(_admitted(cluster, namespace, _pod("plain-abcde", _owner(plain))))
        return got or None

    # The namespace's label reaches the API server's namespace informer a moment later.
    assert wait_for("the namespace's preference", admitted, timeout=10) == [want]
    assert preferred(_admitted(cluster, namespace, _pod("solo", None))) == [want]
    # An opted-in pod gets it once, from whichever policy comes first.
    opted = _replicaset(api, namespace, "web", {POLICY_ANNOTATION: "3"})
    assert (
        preferred(_admitted(cluster, namespace, _pod("web-abcde", _owner(opted)))).count(want) == 1
    )


def test_a_statefulset_pod_gets_only_its_own_exclusions(
    cluster: Any, namespace: str, api: Kube, stack: Stack
) -> None:
    sts = _statefulset(api, namespace, "db", {POLICY_ANNOTATION: "3"})
    uid = sts["metadata"]["uid"]
    api.merge_patch(
        "StatefulSet",
        namespace,
        "db",
        {"metadata": {"annotations": {avoidnodes.ANNOTATION: f"{uid};db-0=node-a;db-1=node-b"}}},
    )
    owner = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "db",
        "uid": uid,
        "controller": True,
    }
    for name, node in (("db-0", "node-a"), ("db-1", "node-b")):
        admitted = _admitted(cluster, namespace, _pod(name, owner))
        terms = admitted["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms == [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [node]}]}
        ]
    # db-2 has no entry: no required affinity (the preferences of a pod that may move, only).
    admitted = _admitted(cluster, namespace, _pod("db-2", owner))
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution"
        not in (admitted["spec"]["affinity"]["nodeAffinity"])
    )


def test_a_job_that_asks_without_a_policy_that_moves_gets_no_rule(
    cluster: Any, namespace: str, stack: Stack
) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "report",
            "annotations": {POLICY_ANNOTATION: "0", IGNORE_DISRUPTIONS_ANNOTATION: "true"},
        },
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                }
            }
        },
    }
    made = k8s.BatchV1Api(cluster.api_client()).create_namespaced_job(namespace, job, dry_run="All")
    assert made.spec.pod_failure_policy is None
    job["metadata"]["annotations"][POLICY_ANNOTATION] = "2"
    made = k8s.BatchV1Api(cluster.api_client()).create_namespaced_job(namespace, job, dry_run="All")
    assert made.spec.pod_failure_policy is not None
    assert made.spec.pod_failure_policy.rules[0].action == "Ignore"
