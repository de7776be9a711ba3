"""What mutate-admission puts on new pods, with the real API server calling it and validating
the patched pod: invalid node names never reach a pod, a policy of 0 injects no exclusions,
and a workload's stuck-after travels to its pods.

The API server validates the pod after our patch, and failurePolicy Ignore does not cover a
pod it refuses: so "the pod was created" is the point of the first two tests, not a detail.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.api.keys import (
    EXCLUDED_NODES_ANNOTATION,
    POLICY_ANNOTATION,
    POLICY_STAMP_ANNOTATION,
    STATE_ANNOTATION,
    STUCK_AFTER_ANNOTATION,
)
from shared.platform.kube import Kube
from tests import builders
from tests.e2e.conftest import Webhook, pod_template, wait_for
from tests.e2e.test_rescheduling import required_exclusions

pytestmark = pytest.mark.e2e

# As the previous release wrote it (version 1), after a hand edit slipped in a bad name.
HAND_EDITED_STATE = '{"excludedNodes":["Bad_Name!","node-1"],"handled":[],"moves":1,"version":1}'


def the_pod(api: Kube, namespace: str) -> dict[str, Any]:
    return wait_for(
        "the workload's pod to be created",
        lambda: next(iter(api.list_all("Pod", namespace)), None),
        timeout=30,
    )


def test_a_replicaset_state_with_an_invalid_node_name_still_gets_its_pods(
    cluster: Any, namespace: str, api: Kube, webhook: Webhook
) -> None:
    node = cluster.nodes[0]
    hand_edited = {STATE_ANNOTATION: HAND_EDITED_STATE}
    web = builders.replicaset(
        retries="3", annotations=hand_edited, template=pod_template({"app": "web"}, node)
    )
    api.create("ReplicaSet", namespace, web)
    pod = the_pod(api, namespace)
    assert required_exclusions(pod) == {"node-1"}
    assert pod["metadata"]["annotations"][EXCLUDED_NODES_ANNOTATION] == '["node-1"]'


def test_a_tenants_bare_pod_with_an_invalid_node_name_in_its_state_is_created(
    cluster: Any, namespace: str, api: Kube, webhook: Webhook
) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "solo",
            "annotations": {POLICY_ANNOTATION: "2", STATE_ANNOTATION: HAND_EDITED_STATE},
        },
        "spec": pod_template({}, cluster.nodes[0])["spec"],
    }
    created = api.create("Pod", namespace, body)
    assert required_exclusions(created) == {"node-1"}
    assert created["metadata"]["annotations"][POLICY_STAMP_ANNOTATION] == "2"


def test_a_policy_of_zero_keeps_recorded_exclusions_off_new_pods(
    cluster: Any, namespace: str, api: Kube, webhook: Webhook
) -> None:
    state = '{"excludedNodes":["node-1"],"handled":[],"moves":1,"version":1}'
    template = pod_template({"app": "web"}, cluster.nodes[0])
    web = builders.replicaset(retries="0", annotations={STATE_ANNOTATION: state}, template=template)
    api.create("ReplicaSet", namespace, web)
    pod = the_pod(api, namespace)
    annotations = pod["metadata"]["annotations"]
    assert annotations[POLICY_STAMP_ANNOTATION] == "0"
    assert EXCLUDED_NODES_ANNOTATION not in annotations
    assert required_exclusions(pod) == set()


def test_a_deployments_stuck_after_reaches_its_pods_next_to_our_policy_stamp(
    cluster: Any, namespace: str, api: Kube, webhook: Webhook
) -> None:
    # The Deployment controller copies the Deployment's annotations onto its ReplicaSet; the
    # webhook copies stuck-after from there onto each pod, for the sweep.
    api.create(
        "Deployment",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web",
                "annotations": {POLICY_ANNOTATION: "3", STUCK_AFTER_ANNOTATION: "45m"},
            },
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": pod_template({"app": "web"}, cluster.nodes[0]),
            },
        },
    )
    pod = the_pod(api, namespace)
    annotations = pod["metadata"]["annotations"]
    assert annotations[STUCK_AFTER_ANNOTATION] == "45m"
    assert annotations[POLICY_STAMP_ANNOTATION] == "3"
    # The user's own key stays on the user's objects: an orphaned pod must not read as opted in.
    assert POLICY_ANNOTATION not in annotations
