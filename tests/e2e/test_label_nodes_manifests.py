"""knative/label-nodes.yaml, rendered as ``kubectl apply -k knative/`` renders it: the Service,
its 30-second PingSource, its rules and its least privilege, checked by the real API server.

The rules ConfigMap must say what the built-in rules say (an operator edits the file; the
built-ins are what a missing file means); the settings must start the function; Knative's own
CRDs and the core API must accept every object (server-side dry run); and a
SubjectAccessReview per row shows the ServiceAccount may do exactly what the code does on
Nodes (list, patch) and nothing near it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from shared.nodes.label_nodes.rules import DEFAULT_RULES, parse_rules
from shared.platform.config import Config
from tests.e2e.knative_manifests import (
    NAMESPACE,
    Obj,
    apply,
    container,
    environment,
    find,
    install_rbac,
    knative_service,
    of_kind,
    pod_spec,
    render,
)
from tests.e2e.test_manifests import knative_crds  # noqa: F401 - the shared fixture

pytestmark = pytest.mark.e2e

FUNCTION = "label-nodes"


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return render()


def ours(objs: list[Obj]) -> list[Obj]:
    return [
        o
        for o in objs
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == FUNCTION
    ]


def test_label_nodes_is_one_pod_always_up_with_its_rules_mounted(base: list[Obj]) -> None:
    ksvc = knative_service(base, FUNCTION)
    annotations = ksvc["spec"]["template"]["metadata"]["annotations"]
    # One evaluator (the cap and the records assume it), never scaled to zero (/status).
    assert annotations["autoscaling.knative.dev/min-scale"] == "1"
    assert annotations["autoscaling.knative.dev/max-scale"] == "1"
    env = environment(base, ksvc)
    config = Config.from_env(env)
    assert config.prometheus_url.startswith("http://")
    # The rules file is the ConfigMap's key, where the volume mounts it.
    (mount,) = container(ksvc)["volumeMounts"]
    (volume,) = pod_spec(ksvc)["volumes"]
    assert mount["name"] == volume["name"] and mount["readOnly"] is True
    rules_map = find(base, "ConfigMap", volume["configMap"]["name"])
    path = PurePosixPath(config.pressure_rules_file)
    assert str(path.parent) == mount["mountPath"]
    assert path.name in rules_map["data"]


def test_the_shipped_rules_are_the_built_in_rules(base: list[Obj]) -> None:
    rules_map = find(base, "ConfigMap", "label-nodes-rules")
    (text,) = rules_map["data"].values()
    assert parse_rules(yaml.safe_load(text), "label-nodes-rules") == DEFAULT_RULES


def test_a_ping_every_30_seconds_goes_to_label_nodes(base: list[Obj]) -> None:
    source = find(base, "PingSource", FUNCTION)
    # Six fields: seconds first (Knative parses schedules with cron.SecondOptional).
    assert source["spec"]["schedule"] == "*/30 * * * * *"
    assert source["spec"]["sink"]["ref"] == {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "name": FUNCTION,
    }


def test_its_objects_are_all_in_the_base_and_labelled_for_selection(base: list[Obj]) -> None:
    kinds = sorted(o["kind"] for o in ours(base))
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "PingSource",
        "Service",
        "ServiceAccount",
    ]
    binding = find(base, "ClusterRoleBinding", "kn-rescheduler-label-nodes")
    assert binding["roleRef"]["name"] == "kn-rescheduler-label-nodes"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FUNCTION, "namespace": NAMESPACE}
    ]


def _dry_run(cluster: Any, objs: list[Obj]) -> subprocess.CompletedProcess[str]:
    return apply(cluster.kubeconfig, objs, "--dry-run=server", "--validate=strict")


@pytest.mark.usefixtures("knative_crds")
def test_knatives_crds_and_the_core_api_accept_its_objects(cluster: Any, base: list[Obj]) -> None:
    namespace = find(base, "Namespace", NAMESPACE)
    assert apply(cluster.kubeconfig, [namespace]).returncode == 0
    objs = ours(base)
    done = _dry_run(cluster, objs)
    assert done.returncode == 0, f"the API server refused:\n{done.stderr}"
    lines = done.stdout.splitlines()
    assert len(lines) == len(objs) and all(line.endswith("(server dry run)") for line in lines)


@dataclass(frozen=True)
class Can:
    verb: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    group: str = ""

    def __str__(self) -> str:
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        return f"{FUNCTION} {self.verb} {what}" + (
            f" in {self.namespace}" if self.namespace else ""
        )


# Exactly the calls shared/nodes/label_nodes/handler.py makes through shared/platform/kube.py.
ALLOWED = [Can("list", "nodes"), Can("patch", "nodes")]
DENIED = [
    # The near misses on Nodes: no delete (no drain), no status (no cordon), no watch, no
    # update (a whole-object write could undo another writer's change), not even a get.
    Can("delete", "nodes"),
    Can("deletecollection", "nodes"),
    Can("update", "nodes"),
    Can("watch", "nodes"),
    Can("get", "nodes"),
    Can("patch", "nodes", subresource="status"),
    Can("create", "nodes"),
    # Nothing else at all.
    Can("create", "events", namespace="default"),
    Can("list", "pods"),
    Can("delete", "pods", namespace="shop"),
    Can("create", "pods", subresource="eviction", namespace="shop"),
    Can("get", "secrets", namespace=NAMESPACE),
    Can("get", "configmaps", namespace=NAMESPACE),
    Can("create", "clusterrolebindings", group="rbac.authorization.k8s.io"),
    Can("escalate", "clusterroles", group="rbac.authorization.k8s.io"),
    Can("impersonate", "users"),
]


@pytest.fixture(scope="module")
def authorization(cluster: Any, base: list[Obj]) -> k8s.AuthorizationV1Api:
    install_rbac(cluster.kubeconfig, base)
    return k8s.AuthorizationV1Api(cluster.api_client())


def allowed(api: k8s.AuthorizationV1Api, case: Can) -> bool:
    review = k8s.V1SubjectAccessReview(
        spec=k8s.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{NAMESPACE}:{FUNCTION}",
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
            ),
        )
    )
    return bool(api.create_subject_access_review(review).status.allowed)


@pytest.mark.parametrize("case", ALLOWED, ids=str)
def test_label_nodes_may_do_what_its_code_does(
    authorization: k8s.AuthorizationV1Api, case: Can
) -> None:
    assert allowed(authorization, case), f"{case} is refused"


@pytest.mark.parametrize("case", DENIED, ids=str)
def test_label_nodes_is_refused_what_it_does_not_need(
    authorization: k8s.AuthorizationV1Api, case: Can
) -> None:
    assert not allowed(authorization, case), f"{case} is allowed"


def test_its_role_is_the_only_one_bound_to_its_account(base: list[Obj]) -> None:
    bound = [
        b
        for b in of_kind(base, "ClusterRoleBinding", "RoleBinding")
        if any(s.get("name") == FUNCTION for s in b.get("subjects") or [])
    ]
    assert [b["roleRef"]["name"] for b in bound] == ["kn-rescheduler-label-nodes"]
