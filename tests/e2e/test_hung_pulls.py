"""A pull that hangs on one node is found by what its siblings' kubelets wrote, on the real
control plane: their ``Pulled`` Events, not their containers' start times.

The fake kubelet writes what kubelet v1.36 writes for a pull (dev/localcluster/kubelet.py,
``_record_pulls``): "Successfully pulled ... Image size" the first time a node pulls an image,
nothing a node that has it already reads, and on a node whose registry mirror never answers
(fault ``pullhang``) one ``Pulling`` Event and a pod in ContainerCreating for ever. Each test
gives its pods an image of its own, so which node has it is the test's doing alone.

The webhook stamps the pods with their workload's policy, as in a cluster. The sweep runs
in-process against the API server with ``pending_stuck_after`` shortened to a
few seconds (``pull_stuck_after`` keeps its hour); update-annotations then judges the report
again from the Events it reads itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from shared.api.keys import EVENT_POD_FAILING
from shared.api.times import parse_kube_time
from shared.platform import events
from shared.platform.config import Config
from shared.platform.kube import Kube
from shared.pods.sweep_failures.handler import Sweeper
from shared.pods.update_annotations.handler import Rescheduler
from tests import builders
from tests.e2e.conftest import LOCAL, let_time_pass, wait_for

pytestmark = pytest.mark.e2e

STUCK_AFTER = timedelta(seconds=3)
CFG: Config = replace(LOCAL, pending_stuck_after=STUCK_AFTER)


def two_node_template(image: str, hung: str, other: str) -> dict[str, Any]:
    """Pods of app ``web`` on ``hung`` first, then on ``other``, never two on one node."""
    app = {"app": "web"}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/hostname",
                                "operator": "In",
                                "values": [hung, other],
                            }
                        ]
                    }
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [hung]}
                        ]
                    },
                }
            ],
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": app}, "topologyKey": "kubernetes.io/hostname"}
            ]
        },
    }
    return builders.template(app, affinity=affinity, containers=[builders.container(image=image)])


def sandbox_up(pod: dict[str, Any]) -> Any:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodReadyToStartContainers" and condition["status"] == "True":
            return parse_kube_time(condition.get("lastTransitionTime"))
    return None


class Sent:
    """The sweep's sink: the events it posts, kept."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, url: str, *, data: bytes, headers: dict[str, str], timeout: float) -> Any:
        self.events.append({"headers": headers, "data": json.loads(data)})
        return type("Answer", (), {"status_code": 202})()


def web_pods(api: Kube, namespace: str) -> list[dict[str, Any]]:
    return list(api.list_all("Pod", namespace, label_selector="app=web"))


def hung_beside_a_sibling(api: Kube, namespace: str, hung: str, other: str, image: str) -> Any:
    """A ReplicaSet of one pod on ``hung`` (its pull hanging), then scaled to a second on
    ``other`` that starts there: the hung pod, as the API server has it."""
    api.create(
        "ReplicaSet",
        namespace,
        builders.replicaset("web", retries="3", template=two_node_template(image, hung, other)),
    )
    stuck = wait_for(
        "the pod on the hung node to have its sandbox up",
        lambda: next((p for p in web_pods(api, namespace) if sandbox_up(p)), None),
    )
    assert stuck["spec"]["nodeName"] == hung
    # Kubernetes writes times to the second: the sibling starts in a later second than the
    # hung pod's sandbox came up, or its download could not be told to be after it.
    since = sandbox_up(stuck)
    let_time_pass(since.timestamp() + 1.1 - time.time(), "timestamps have whole seconds")
    api.merge_patch("ReplicaSet", namespace, "web", {"spec": {"replicas": 2}})
    wait_for(
        "the second pod to run on the other node",
        lambda: any(
            p["spec"].get("nodeName") == other and p["status"].get("phase") == "Running"
            for p in web_pods(api, namespace)
        ),
    )
    # Past the threshold a download beside it allows: the longest of pending_stuck_after (3 s
    # here), three times the sibling's pull (0.5 s) and the image's size at 10 MiB/s (the fake
    # kubelet's 48 MB: 4.6 s).
    let_time_pass(since.timestamp() + 6 - time.time(), "past the hung-pull threshold")
    return stuck


def sweep(api: Kube, namespace: str) -> list[dict[str, Any]]:
    sent = Sent()
    Sweeper(api, CFG, "http://sink.invalid", post=sent).sweep()
    return [e["data"] for e in sent.events if e["data"]["namespace"] == namespace]


def test_a_pull_hung_beside_a_siblings_download_elsewhere_is_moved_without_its_hour(
    cluster: Any, namespace: str, api: Kube, faults: Any, webhook: Any
) -> None:
    hung, other = cluster.nodes[0], cluster.nodes[1]
    faults("pullhang", hung)
    stuck = hung_beside_a_sibling(api, namespace, hung, other, f"registry.local/{namespace}:1")

    reports = sweep(api, namespace)

    assert [(r["name"], r["reason"], r["node"]) for r in reports] == [
        (stuck["metadata"]["name"], "StuckPending", hung)
    ]
    assert other in reports[0]["why"] and "pulled" in reports[0]["why"]
    # update-annotations reads the Pulled Events itself and moves the pod, and its reply says
    # what the move rested on and what it read.
    reply = Rescheduler(api, CFG).handle(
        events.Event("sweep-1", "/sweep", EVENT_POD_FAILING, {}, reports[0])
    )
    assert reply is not None
    evidence = reply.data["evidence"]
    assert evidence["rule"] == "thresholds" and "pulled" in evidence["why"]
    assert [r["what"] for r in evidence["read"]][:3] == [
        f"pod {namespace}/{stuck['metadata']['name']}",
        "its owners and their policy",
        "its Warning Events, its controller's pods and their image pulls",
    ]
    gone = api.list_all("Pod", namespace)
    assert stuck["metadata"]["uid"] not in {p["metadata"]["uid"] for p in gone}


def test_a_pull_beside_siblings_that_found_the_image_on_their_node_keeps_its_hour(
    cluster: Any, namespace: str, api: Kube, faults: Any, webhook: Any
) -> None:
    hung, other = cluster.nodes[0], cluster.nodes[1]
    image = f"registry.local/{namespace}:1"
    # The lookalike: a big image still downloading on a healthy node, while the node of its
    # sibling had it already (another pod pulled it there before).
    api.create(
        "Pod",
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "warm"},
            "spec": builders.template(nodeName=other, containers=[builders.container(image=image)])[
                "spec"
            ],
        },
    )
    wait_for(
        "the warming pod to run",
        lambda: api.get("Pod", namespace, "warm")["status"].get("phase") == "Running",
    )
    faults("pullhang", hung)
    stuck = hung_beside_a_sibling(api, namespace, hung, other, image)

    assert sweep(api, namespace) == []
    # A forged report of the same is judged again, on the same Events, and moves nothing.
    Rescheduler(api, CFG).handle(
        events.Event(
            "forged-1",
            "/forger",
            EVENT_POD_FAILING,
            {},
            {
                "namespace": namespace,
                "name": stuck["metadata"]["name"],
                "uid": stuck["metadata"]["uid"],
                "node": hung,
                "ownerReferences": stuck["metadata"]["ownerReferences"],
                "kind": "node-fixable",
                "reason": "StuckPending",
                "message": "pending",
            },
        )
    )
    live = api.get("Pod", namespace, stuck["metadata"]["name"])
    assert live["metadata"]["uid"] == stuck["metadata"]["uid"]
    assert not live["metadata"].get("deletionTimestamp")
