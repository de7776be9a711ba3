"""Forged reports, posted straight to update-annotations, change nothing on the real control plane.

Any pod of a cluster can POST a CloudEvent to a function's cluster-local Service. What a report
claims is therefore never what a write rests on: update-annotations reads the pod, and for the
verdicts the pod's status does not repeat (a pod stuck starting, a sandbox its node fails to
create, a StatefulSet's pod its controller already removed) it reads the kubelet's Events too.
Each report below is what a forger can send; each used to delete a pod, spend a budget or
exclude a node the sender chose. The function is served as it runs (functions-framework's test
client) against the real API server; the pods are the real controllers'.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dev.tools.lookalikes import report as forged
from shared.api.keys import EVENT_POD_FAILING, MOVED_OFF_LABEL, POLICY_ANNOTATION, STATE_ANNOTATION
from shared.platform.kube import Kube
from tests import builders
from tests.e2e.conftest import pod_template, wait_for
from tests.handlers.conftest import ClientFactory, cloudevent

pytestmark = pytest.mark.e2e


def post(client: Any, data: dict[str, Any]) -> int:
    headers, body = cloudevent(EVENT_POD_FAILING, data, source="/forger")
    status: int = client.post("/", headers=headers, data=body).status_code
    return status


@pytest.fixture
def unstarted_node(api: Kube) -> Iterator[str]:
    """A Node no kubelet runs: a pod bound to it stays Pending with no status, as on a node
    whose kubelet has not started it yet."""
    name = f"unstarted-{uuid.uuid4().hex[:6]}"
    api.create("Node", None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    try:
        yield name
    finally:
        api.delete("Node", None, name)


def the_only_pod(api: Kube, namespace: str) -> dict[str, Any] | None:
    found = list(api.list_all("Pod", namespace))
    return found[0] if len(found) == 1 else None


def test_a_forged_stuck_report_about_a_pod_seconds_old_deletes_nothing_and_marks_nothing(
    cluster: Any, namespace: str, api: Kube, unstarted_node: str, function_client: ClientFactory
) -> None:
    template = pod_template({"app": "web"}, unstarted_node, nodeName=unstarted_node)
    api.create(
        "ReplicaSet",
        namespace,
        builders.replicaset("web", retries="3", template=template),
    )
    pod = wait_for("the ReplicaSet's pod", lambda: the_only_pod(api, namespace))
    assert pod["spec"]["nodeName"] == unstarted_node and pod["status"].get("phase") == "Pending"
    client = function_client("update-annotations", KUBECONFIG=str(cluster.kubeconfig))

    for reason in ("StuckPending", "FailedCreatePodSandBox"):
        assert post(client, forged(pod, reason, unstarted_node)) == 202

    live = api.get("Pod", namespace, pod["metadata"]["name"])
    assert live["metadata"]["uid"] == pod["metadata"]["uid"]
    assert not live["metadata"].get("deletionTimestamp")
    rs = api.get("ReplicaSet", namespace, "web")
    assert STATE_ANNOTATION not in (rs["metadata"].get("annotations") or {})
    node = api.get("Node", None, unstarted_node)
    assert MOVED_OFF_LABEL not in (node["metadata"].get("labels") or {})


def test_forged_reports_of_a_removed_statefulset_pod_spend_no_budget_and_exclude_nothing(
    cluster: Any, namespace: str, api: Kube, function_client: ClientFactory
) -> None:
    sts = api.create(
        "StatefulSet",
        namespace,
        builders.statefulset(
            "db",
            annotations={POLICY_ANNOTATION: "3"},
            template=pod_template({"app": "db"}, cluster.nodes[0]),
        ),
    )
    pod = wait_for("db-0", lambda: the_only_pod(api, namespace))
    client = function_client("update-annotations", KUBECONFIG=str(cluster.kubeconfig))

    # Three reports of db-0 "evicted" on nodes the sender chose, under uids nobody had: as if
    # the StatefulSet had replaced a failed pod each time.
    owner = [
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": "db",
            "uid": sts["metadata"]["uid"],
            "controller": True,
        }
    ]
    for node in cluster.nodes[1:4]:
        claim = forged(pod, "Evicted", node, uid=str(uuid.uuid4()), ownerReferences=owner)
        assert post(client, claim) == 202

    after = api.get("StatefulSet", namespace, "db")
    assert STATE_ANNOTATION not in (after["metadata"].get("annotations") or {})
    live = api.get("Pod", namespace, "db-0")
    assert live["metadata"]["uid"] == pod["metadata"]["uid"]
    for node in cluster.nodes[1:4]:
        labels = api.get("Node", None, node)["metadata"].get("labels") or {}
        assert MOVED_OFF_LABEL not in labels
