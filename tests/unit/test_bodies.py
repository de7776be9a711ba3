"""Request bodies are built before anything is sent; these tables pin their shape."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from shared.admission import OwnerFacts, mutate
from shared.bodies import (
    ORIGIN_ANNOTATION,
    event_body,
    replacement_name,
    replacement_pod,
    state_patch,
)
from shared.classify import classify
from shared.config import Config
from shared.constants import EXCLUDED_NODES_ANNOTATION, STATE_ANNOTATION
from shared.failing import FailingPod
from shared.owners import Ref
from tests.unit import pods

ZONE_A = {"key": "zone", "operator": "In", "values": ["a"]}
NOW = datetime(2026, 3, 14, 9, 26, 53, tzinfo=UTC)


def snapshot_of(pod: dict) -> dict:
    return {"metadata": pod["metadata"], "spec": pod["spec"]}


def test_the_state_patch_is_a_compare_and_swap_on_resource_version() -> None:
    assert state_patch("42", '{"v":1}') == {
        "metadata": {"resourceVersion": "42", "annotations": {STATE_ANNOTATION: '{"v":1}'}}
    }


def test_an_event_names_the_workload_and_is_capped_at_one_kibibyte() -> None:
    ref = Ref("ReplicaSet", "shop", "web-7d9c8b6f4", "uid-1")
    body = event_body(ref, "Rescheduled", "x" * 5000, NOW, warning=True, instance="pod-a")
    assert body["involvedObject"] == {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "web-7d9c8b6f4",
        "namespace": "shop",
        "uid": "uid-1",
    }
    assert body["type"] == "Warning"
    assert len(body["message"]) == 1024
    assert body["firstTimestamp"] == "2026-03-14T09:26:53Z"
    assert body["metadata"] == {"generateName": "web-7d9c8b6f4.", "namespace": "shop"}


def test_a_replacement_is_unbound_carries_the_state_and_keeps_labels() -> None:
    bare = pods.pod("solo", owner=None, labels={"app": "solo"})
    body = replacement_pod(snapshot_of(bare), '{"moves":1}')
    assert "nodeName" not in body["spec"]
    assert body["metadata"]["annotations"][STATE_ANNOTATION] == '{"moves":1}'
    assert body["metadata"]["annotations"][ORIGIN_ANNOTATION] == "solo"
    assert body["metadata"]["labels"] == {"app": "solo"}
    assert "uid" not in body["metadata"] and "resourceVersion" not in body["metadata"]
    assert "status" not in body


def test_replacement_names_are_stable_per_pod_and_named_after_the_first_one() -> None:
    first = pods.pod("solo", owner=None)
    name = replacement_name(snapshot_of(first))
    assert name == replacement_name(snapshot_of(first))  # a redelivery finds it again
    assert name.startswith("solo-") and len(name) == len("solo-") + 5
    second = replacement_pod(snapshot_of(first), "{}")
    second["metadata"]["uid"] = "another-uid"
    assert replacement_name(second).startswith("solo-")
    assert replacement_name(second) != name


@pytest.mark.parametrize(
    ("own_affinity", "expected_terms"),
    [
        # No affinity of its own: ours was the only term, so none is left.
        (None, None),
        # The user's terms survive, without our requirements.
        (
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            }
                        ]
                    }
                }
            },
            [{"matchExpressions": [ZONE_A]}],
        ),
    ],
)
def test_a_replacement_loses_the_exclusions_of_its_predecessor(
    own_affinity: dict | None, expected_terms: list | None
) -> None:
    """The webhook stamps the current exclusions on the way in; stale ones must not stay."""
    bare = pods.pod("solo", owner=None, node=None, affinity=own_affinity)
    stamped = mutate(bare, OwnerFacts(policy="3", excluded_nodes=("node-a", "node-b"))).pod
    assert json.loads(stamped["metadata"]["annotations"][EXCLUDED_NODES_ANNOTATION])
    body = replacement_pod(snapshot_of(stamped), "{}")
    assert EXCLUDED_NODES_ANNOTATION not in body["metadata"]["annotations"]
    terms = (
        body["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms")
    )
    assert terms == expected_terms


def test_a_failing_pod_event_round_trips() -> None:
    pod = pods.pod(containers=[pods.crash_looping(restarts=5)], excluded=["node-a"])
    failure = classify(pod, Config())
    assert failure is not None
    failing = FailingPod.from_pod(pod, failure)
    again = FailingPod.from_data(json.loads(json.dumps(failing.to_data())))
    assert again == failing


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {"namespace": "shop"},
        {"namespace": "shop", "name": "w", "uid": "u", "reason": "X", "kind": "bogus"},
        {
            "namespace": "shop",
            "name": "w",
            "uid": "u",
            "reason": "X",
            "kind": "node-fixable",
            "excludedNodes": "node-a",
        },
    ],
)
def test_malformed_failing_pod_data_is_refused_with_a_reason(data: object) -> None:
    with pytest.raises(ValueError, match=r"."):
        FailingPod.from_data(data)
