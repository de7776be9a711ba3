"""knative/rebalance-nodes.yaml: the Service, its 30-second Ping through the Broker, and its
least privilege, checked by the real API server.

Knative's own CRDs and the core API must accept every object (server-side dry run); a
SubjectAccessReview per row shows the ServiceAccount may do exactly what the code does and
nothing near it; and the function itself, signed in with that ServiceAccount's token, drains a
node in maintenance (list Nodes and pods, read the controller and the namespace, evict, record
the Events, write a hot streak): what RBAC refuses there would fail the evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from dev.localcluster import Cluster
from dev.stack.functions import ROOT
from shared.api.keys import (
    EVENT_POD_REBALANCED,
    HOT_STREAK_ANNOTATION,
    MAINTENANCE_LABEL,
    PING_EVENT_TYPE,
    REBALANCE_KEY,
)
from shared.platform.kube import Kube
from tests.e2e.knative_manifests import (
    NAMESPACE,
    Obj,
    apply,
    find,
    install_rbac,
    kubeconfig_for,
    service_account_token,
)
from tests.e2e.test_manifests import knative_crds  # noqa: F401 - the shared fixture
from tests.e2e.test_rebalance_nodes import (
    cordon,
    create_deployment,
    rebalanced_events,
    running,
    settle,
    streaks_cleared,  # noqa: F401 - the fixture
    write_usage,
)
from tests.handlers.conftest import ON_DEMAND_TICKS, ClientFactory, cloudevent, reply_of

pytestmark = pytest.mark.e2e

FUNCTION = "rebalance-nodes"
MANIFEST = ROOT / "knative" / "rebalance-nodes.yaml"
NAMESPACE_OBJ: Obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


@pytest.fixture(scope="module")
def objs() -> list[Obj]:
    return [o for o in yaml.safe_load_all(MANIFEST.read_text()) if o]


def test_one_pod_always_up_reading_the_shared_settings(objs: list[Obj]) -> None:
    ksvc = find(objs, "Service", FUNCTION, "serving.knative.dev/v1")
    template = ksvc["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    # One evaluator (the limits per run and a dry run's streaks assume it), never at zero.
    assert annotations["autoscaling.knative.dev/min-scale"] == "1"
    assert annotations["autoscaling.knative.dev/max-scale"] == "1"
    assert template["spec"]["serviceAccountName"] == FUNCTION
    (container,) = template["spec"]["containers"]
    assert container["image"] == f"kn-rescheduler/{FUNCTION}"
    assert container["envFrom"] == [{"configMapRef": {"name": "kn-rescheduler-config"}}]


def test_a_ping_every_30_seconds_reaches_it_through_the_broker_so_its_reply_is_routed(
    objs: list[Obj],
) -> None:
    ping = find(objs, "PingSource", FUNCTION)
    assert ping["spec"]["schedule"] == "*/30 * * * * *"
    assert ping["spec"]["sink"]["ref"] == {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Broker",
        "name": "default",
    }
    trigger = find(objs, "Trigger", FUNCTION)
    # PingSourceSource in knative.dev/eventing: /apis/v1/namespaces/<namespace>/pingsources/<name>.
    assert trigger["spec"]["filter"]["attributes"] == {
        "type": PING_EVENT_TYPE,
        "source": f"/apis/v1/namespaces/{NAMESPACE}/pingsources/{FUNCTION}",
    }
    assert trigger["spec"]["subscriber"]["ref"]["name"] == FUNCTION


@pytest.mark.usefixtures("knative_crds")
def test_knatives_crds_and_the_core_api_accept_its_objects(
    cluster: Cluster, objs: list[Obj]
) -> None:
    assert apply(cluster.kubeconfig, [NAMESPACE_OBJ]).returncode == 0
    done = apply(cluster.kubeconfig, objs, "--dry-run=server", "--validate=strict")
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


# Exactly the calls shared/nodes/rebalance_nodes/handler.py makes through shared/platform/kube.py
# and shared/platform/recorder.py.
ALLOWED = [
    Can("list", "nodes"),
    Can("patch", "nodes"),
    Can("list", "pods"),
    Can("create", "pods", subresource="eviction", namespace="shop"),
    Can("get", "replicasets", namespace="shop", group="apps"),
    Can("get", "statefulsets", namespace="shop", group="apps"),
    Can("get", "jobs", namespace="shop", group="batch"),
    Can("get", "namespaces"),
    Can("get", "persistentvolumeclaims", namespace="shop"),
    Can("get", "persistentvolumes"),
    Can("create", "events", namespace="shop"),
]
DENIED = [
    # Pods leave only through the Eviction API (PodDisruptionBudgets), never a plain delete.
    Can("delete", "pods", namespace="shop"),
    Can("deletecollection", "pods", namespace="shop"),
    Can("create", "pods", namespace="shop"),
    Can("patch", "pods", namespace="shop"),
    # Nodes: no cordon, no drain, no whole-object write.
    Can("update", "nodes"),
    Can("delete", "nodes"),
    Can("patch", "nodes", subresource="status"),
    Can("get", "nodes"),
    # Workloads are read, never changed (no scaling them down to "rebalance").
    Can("patch", "replicasets", namespace="shop", group="apps"),
    Can("update", "deployments", namespace="shop", group="apps", subresource="scale"),
    Can("list", "replicasets", namespace="shop", group="apps"),
    Can("patch", "namespaces"),
    Can("list", "namespaces"),
    # Volumes are read one by one, never listed nor changed.
    Can("list", "persistentvolumeclaims", namespace="shop"),
    Can("list", "persistentvolumes"),
    Can("patch", "persistentvolumes"),
    Can("delete", "persistentvolumeclaims", namespace="shop"),
    # An Event is said once: no counting it again.
    Can("patch", "events", namespace="shop"),
    Can("get", "secrets", namespace=NAMESPACE),
    Can("create", "clusterrolebindings", group="rbac.authorization.k8s.io"),
    Can("impersonate", "users"),
]


@pytest.fixture(scope="module")
def authorization(cluster: Cluster, objs: list[Obj]) -> k8s.AuthorizationV1Api:
    install_rbac(cluster.kubeconfig, [NAMESPACE_OBJ, *objs])
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
def test_it_may_do_what_its_code_does(authorization: k8s.AuthorizationV1Api, case: Can) -> None:
    assert allowed(authorization, case), f"{case} is refused"


@pytest.mark.parametrize("case", DENIED, ids=str)
def test_it_is_refused_what_it_does_not_need(
    authorization: k8s.AuthorizationV1Api, case: Can
) -> None:
    assert not allowed(authorization, case), f"{case} is allowed"


@pytest.mark.usefixtures("streaks_cleared")
def test_signed_in_as_its_service_account_it_drains_a_node_in_maintenance(
    cluster: Cluster,
    authorization: k8s.AuthorizationV1Api,
    function_client: ClientFactory,
    namespace: str,
    tmp_path: Path,
) -> None:
    admin = Kube(cluster.api_client())
    draining, hot, *others = cluster.nodes
    create_deployment(admin, namespace, "web", draining, 2, {REBALANCE_KEY: "true"})
    before = settle(admin, namespace, "web", 2, draining)
    cordon(cluster, draining, **{MAINTENANCE_LABEL: "true"})
    # Another node hot (but not for long enough): its streak is written with the account too.
    write_usage(cluster, hot, 95.0)
    for node in others:
        write_usage(cluster, node, 20.0)
    token = service_account_token(cluster.api_client(), FUNCTION)
    kubeconfig = kubeconfig_for(cluster.server, cluster.ca_file, token, tmp_path / "kubeconfig")
    client = function_client(FUNCTION, KUBECONFIG=str(kubeconfig), **ON_DEMAND_TICKS)

    headers, body = cloudevent(PING_EVENT_TYPE, {"reason": "rebalance"}, source="/pingsource")
    response = client.post("/", headers=headers, data=body)

    assert response.status_code == 200, response.get_data(as_text=True)
    attributes, data = reply_of(response)
    assert attributes["type"] == EVENT_POD_REBALANCED
    assert [(e["node"], e["reason"], e["result"]) for e in data["evictions"]] == [
        (draining, "maintenance", "evicted")
    ]
    assert len(set(running(admin, namespace, "web")) & set(before)) <= 1
    kinds = {e["involvedObject"]["kind"] for e in rebalanced_events(admin, namespace)}
    assert kinds == {"Pod", "ReplicaSet"}
    node = cluster.rest.get(f"/api/v1/nodes/{hot}")
    assert '"hot":1' in node["metadata"]["annotations"][HOT_STREAK_ANNOTATION]
