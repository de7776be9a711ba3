"""Which creates the API server sends to mutate-admission (the registration's matchConditions,
CEL the API server evaluates: dev/stack/webhook.py POD_MATCH and JOB_MATCH), and that every
create it leaves out is one the webhook would have answered unchanged.

On the real local control plane: a webhook of our own, registered for this test's namespace
only, counts what it answers (its admissions metric). Each object is created as a user or a
controller creates it: a DaemonSet's pod by the DaemonSet controller, a Job from a CronJob as
``kubectl create job --from=cronjob/...`` makes it, a pod whose controller is an operator's own
kind. For those the API server does not send, the same AdmissionReview posted to the function
by hand is answered with no patch.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.stack import webhook as webhook_setup
from dev.stack.functions import FunctionServer
from shared.api.keys import IGNORE_DISRUPTIONS_ANNOTATION
from shared.platform.kube import Kube
from tests import builders
from tests.e2e.conftest import mutate_admission_over_tls, register_for_one_namespace, wait_for
from tests.e2e.test_webhook_hardening import admissions
from tests.handlers.conftest import ClientFactory

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]


@pytest.fixture
def counted(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[FunctionServer]:
    """mutate-admission registered with the matchConditions as shipped, for ``namespace``
    only, so that its admissions metric counts this test's creates and nothing else."""
    server, ca = mutate_admission_over_tls(cluster, tmp_path, tmp_path / "tls")
    with server:
        name = webhook_setup.NAME + "-match"
        register_for_one_namespace(cluster.api_client(), server.url, ca, name, namespace)
        try:
            webhook_setup.wait_until_called(cluster.api_client(), namespace=namespace)
            yield server
        finally:
            webhook_setup.unregister(cluster.api_client(), name)


def calls(server: FunctionServer, create: Callable[[], Any]) -> int:
    """How many AdmissionReviews the webhook answered for what ``create`` made (it returns
    once everything it makes exists: the API server calls webhooks before it persists)."""
    before = admissions(server)
    create()
    return round(admissions(server) - before)


def unchanged(function_client: ClientFactory, cluster: Any, namespace: str, obj: JSON) -> bool:
    """Whether mutate-admission answers the create of ``obj`` as it was stored with no patch."""
    kind = obj.get("kind") or "Pod"  # a LIST's items carry no kind
    group = "batch" if kind == "Job" else ""
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": group, "version": "v1", "kind": kind},
            "operation": "CREATE",
            "namespace": namespace,
            "object": obj,
        },
    }
    client = function_client("mutate-admission", KUBECONFIG=str(cluster.kubeconfig))
    answer = client.post("/", json=review).get_json()["response"]
    assert answer["allowed"] is True, answer
    return "patch" not in answer or json.loads(base64.b64decode(answer["patch"])) == []


def owner(api_version: str, kind: str, name: str, obj: JSON, controller: bool = True) -> JSON:
    """An ownerReference to ``obj`` (its uid), as a controller writes one."""
    uid = obj["metadata"]["uid"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": controller,
    }


def pods_of(api: Kube, namespace: str, app: str) -> list[JSON]:
    return [
        p
        for p in api.list_all("Pod", namespace)
        if (p["metadata"].get("labels") or {}).get("app") == app
    ]


def test_the_api_server_sends_pods_of_followed_controllers_and_bare_pods_only(
    cluster: Any,
    namespace: str,
    api: Kube,
    counted: FunctionServer,
    function_client: ClientFactory,
) -> None:
    node = cluster.nodes[0]

    def created(kind: str, body: JSON, app: str) -> Callable[[], Any]:
        def make() -> None:
            api.create(kind, namespace, body)
            wait_for(f"a pod of {app}", lambda: pods_of(api, namespace, app))

        return make

    # Sent: a Deployment's pod (its ReplicaSet's) and a StatefulSet's, opted in or not (the
    # policy is on the owner), and a pod nothing controls (its own annotations may opt it in).
    assert calls(counted, created("Deployment", builders.deployment("web"), "web")) == 1
    assert calls(counted, created("StatefulSet", builders.statefulset("db"), "db")) == 1
    bare = builders.bare_pod("alone", template=builders.template({"app": "alone"}))
    assert calls(counted, created("Pod", bare, "alone")) == 1
    # A pod another object owns without controlling it is a bare pod too.
    config = cluster.rest.post(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
    )
    owned = builders.bare_pod("owned", template=builders.template({"app": "owned"}))
    owned["metadata"]["ownerReferences"] = [owner("v1", "ConfigMap", "c", config, False)]
    assert calls(counted, created("Pod", owned, "owned")) == 1

    # Not sent: a DaemonSet's pod, made by the DaemonSet controller on the one node it selects.
    daemon = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": builders.template(
                {"app": "agent"}, nodeSelector={"kubernetes.io/hostname": node}
            ),
        },
    }
    assert calls(counted, created("DaemonSet", daemon, "agent")) == 0
    (agent,) = pods_of(api, namespace, "agent")
    assert unchanged(function_client, cluster, namespace, agent)

    # Not sent: a pod whose controller is an operator's own kind.
    foreign = builders.bare_pod("widget-0", template=builders.template({"app": "widget"}))
    widget_uid = {"metadata": {"uid": str(uuid.uuid4())}}
    foreign["metadata"]["ownerReferences"] = [owner("example.com/v1", "Widget", "w", widget_uid)]
    widget: list[JSON] = []
    assert calls(counted, lambda: widget.append(api.create("Pod", namespace, foreign))) == 0
    # (The garbage collector may delete it soon: its owner does not exist. What was created
    # is what the webhook would have been sent.)
    assert unchanged(function_client, cluster, namespace, widget[0])


def test_the_api_server_sends_a_job_only_when_it_asks_for_ignore_disruptions_or_a_cronjob_made_it(
    cluster: Any,
    namespace: str,
    api: Kube,
    counted: FunctionServer,
    function_client: ClientFactory,
) -> None:
    def job(name: str, annotations: dict[str, str] | None = None) -> JSON:
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {
                "backoffLimit": 0,
                "template": builders.template({"app": name}, restartPolicy="Never"),
            },
        }

    def made(body: JSON, app: str) -> Callable[[], Any]:
        def make() -> None:
            api.create("Job", namespace, body)
            wait_for(f"the pod of {app}", lambda: pods_of(api, namespace, app))

        return make

    # A plain Job: only its pod is sent (a Job's pod is one mutate-admission follows).
    assert calls(counted, made(job("plain"), "plain")) == 1
    assert unchanged(function_client, cluster, namespace, api.get("Job", namespace, "plain"))
    # A Job asking for ignore-disruptions: the Job and its pod.
    asked = job("asked", {IGNORE_DISRUPTIONS_ANNOTATION: "true", "scheduling-retries": "2"})
    assert calls(counted, made(asked, "asked")) == 2

    # A Job made from a CronJob (kubectl create job --from=cronjob/nightly): the CronJob's
    # annotations may ask for it, so the Job is sent, and its pod.
    cron = api.create(
        "CronJob",
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "nightly"},
            "spec": {
                "schedule": "0 3 * * *",
                "suspend": True,
                "jobTemplate": {"spec": job("x")["spec"]},
            },
        },
    )
    from_cron = job("nightly-manual")
    from_cron["metadata"]["ownerReferences"] = [owner("batch/v1", "CronJob", "nightly", cron)]
    assert calls(counted, made(from_cron, "nightly-manual")) == 2
