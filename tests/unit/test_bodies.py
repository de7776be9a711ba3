"""Request bodies are built before anything is sent; these tables pin their shape."""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime

import pytest

from shared.admission.decide import OwnerFacts, mutate
from shared.api.avoidnodes import ANNOTATION as AVOID_NODES_ANNOTATION
from shared.api.keys import EXCLUDED_NODES_ANNOTATION, STATE_ANNOTATION
from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.pods.update_annotations.bodies import (
    ORIGIN_ANNOTATION,
    event_body,
    event_name,
    event_repeat,
    replacement_name,
    replacement_pod,
    state_patch,
)
from shared.workloads.classify import classify
from shared.workloads.owners import Ref
from tests.unit import pods

ZONE_A = {"key": "zone", "operator": "In", "values": ["a"]}
NOW = datetime(2026, 3, 14, 9, 26, 53, tzinfo=UTC)


def snapshot_of(pod: dict) -> dict:
    return {"metadata": pod["metadata"], "spec": pod["spec"]}


def test_the_state_patch_is_a_compare_and_swap_on_resource_version() -> None:
    assert state_patch("42", '{"v":1}', "uid-1;*=node-a") == {
        "metadata": {
            "resourceVersion": "42",
            "annotations": {STATE_ANNOTATION: '{"v":1}', AVOID_NODES_ANNOTATION: "uid-1;*=node-a"},
        }
    }


def test_the_state_patch_removes_the_flat_exclusions_when_there_are_none() -> None:
    # A merge patch's null deletes the key: a list the state no longer has must not linger
    # for the admission policies.
    patch = state_patch("42", '{"v":1}')
    assert patch["metadata"]["annotations"][AVOID_NODES_ANNOTATION] is None


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
    assert body["metadata"] == {
        "name": event_name(ref, "Rescheduled", "x" * 5000),
        "namespace": "shop",
    }
    assert body["metadata"]["name"].startswith("web-7d9c8b6f4.")


DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
WEB = Ref("ReplicaSet", "shop", "web-7d9c8b6f4", "uid-1")


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        # The same warning delivered again: the same Event, counted.
        ((WEB, "InvalidPolicy", "not a number"), (WEB, "InvalidPolicy", "not a number"), True),
        ((WEB, "InvalidPolicy", "not a number"), (WEB, "InvalidPolicy", "too large"), False),
        ((WEB, "InvalidPolicy", "x"), (WEB, "RetriesExhausted", "x"), False),
        # A namesake (deleted and created again) starts its own Events.
        (
            (WEB, "InvalidPolicy", "x"),
            (Ref("ReplicaSet", "shop", WEB.name, "uid-2"), "InvalidPolicy", "x"),
            False,
        ),
        (
            (WEB, "InvalidPolicy", "x"),
            (Ref("ReplicaSet", "prod", WEB.name, "uid-1"), "InvalidPolicy", "x"),
            False,
        ),
    ],
)
def test_an_event_is_named_after_its_object_reason_and_key(
    first: tuple[Ref, str, str], second: tuple[Ref, str, str], same: bool
) -> None:
    assert (event_name(*first) == event_name(*second)) is same


@pytest.mark.parametrize(
    "name",
    ["web-7d9c8b6f4", "a" * 253, "a" * 236 + "-b.c-" + "d" * 12, "db-0", "x"],
)
def test_an_event_name_is_a_valid_object_name_whatever_the_object_is_called(name: str) -> None:
    event = event_name(Ref("Pod", "shop", name, "u"), "MoveDeferred", "")
    assert len(event) <= 253
    assert DNS_SUBDOMAIN.match(event), event


def test_counting_an_event_again_is_a_compare_and_swap_that_keeps_the_first_timestamp() -> None:
    patch = event_repeat("812", 4, "y" * 2000, NOW)
    assert patch == {
        "metadata": {"resourceVersion": "812"},
        "count": 4,
        "message": "y" * 1024,
        "lastTimestamp": "2026-03-14T09:26:53Z",
    }


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


# What `kubectl debug -it solo --image=busybox:1.36 --target=app` leaves in the pod's spec (a
# strategic merge patch on the pods/ephemeralcontainers subresource, defaults filled in).
DEBUGGER = {
    "name": "debugger-8xk2p",
    "image": "busybox:1.36",
    "imagePullPolicy": "IfNotPresent",
    "resources": {},
    "stdin": True,
    "tty": True,
    "terminationMessagePath": "/dev/termination-log",
    "terminationMessagePolicy": "File",
    "targetContainerName": "app",
}


@pytest.mark.parametrize(
    ("field", "live_value"),
    [
        # ValidatePodCreate: "cannot be set on create" (the subresource is the only way in).
        ("ephemeralContainers", [DEBUGGER]),
        # Bound by the scheduler last time; unbound so that it chooses again.
        ("nodeName", "node-b"),
        # The Priority admission plugin computes both from priorityClassName and refuses a
        # pod whose values differ from what the class says now.
        ("priority", 1000),
        ("preemptionPolicy", "Never"),
        # The RuntimeClass admission plugin sets it and refuses one that does not match.
        ("overhead", {"cpu": "250m", "memory": "120Mi"}),
    ],
)
def test_a_replacement_carries_nothing_the_api_server_refuses_on_create(
    field: str, live_value: object
) -> None:
    bare = pods.pod("solo", owner=None, labels={"app": "solo"})
    bare["spec"][field] = live_value
    body = replacement_pod(snapshot_of(bare), "{}")
    assert field not in body["spec"]


def test_a_replacement_keeps_the_rest_of_the_spec_as_the_pod_had_it() -> None:
    bare = pods.pod("solo", owner=None, labels={"app": "solo"})
    bare["spec"]["ephemeralContainers"] = [DEBUGGER]
    bare["spec"]["runtimeClassName"] = "kata"
    bare["spec"]["priorityClassName"] = "batch-low"
    body = replacement_pod(snapshot_of(bare), "{}")
    dropped = ("ephemeralContainers", "nodeName", "priority", "preemptionPolicy")
    kept = {k: v for k, v in bare["spec"].items() if k not in dropped}
    assert body["spec"] == kept
    assert bare["spec"]["ephemeralContainers"] == [DEBUGGER]  # the snapshot is not touched


APP_IN_SOLO = {"key": "app", "operator": "In", "values": ["solo"]}
TEAM_NOT_IN_SHOP = {"key": "team", "operator": "NotIn", "values": ["shop"]}
TEAM_NOT_IN_OPS = {"key": "team", "operator": "NotIn", "values": ["ops"]}
ZONE_IN_A = {"key": "zone", "operator": "In", "values": ["a"]}


def anti_affinity(term: dict) -> dict:
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def preferred_affinity(term: dict) -> dict:
    return {
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 50, "podAffinityTerm": term}
            ]
        }
    }


def term(selector: dict, **keys: list[str]) -> dict:
    return {"topologyKey": "kubernetes.io/hostname", "labelSelector": selector, **keys}


@pytest.mark.parametrize(
    ("where", "live", "expected_selector"),
    [
        # The server appended `app In [solo]` for matchLabelKeys: [app]; the user's own
        # matchLabels stay.
        (
            "anti",
            term(
                {"matchLabels": {"tier": "web"}, "matchExpressions": [APP_IN_SOLO]},
                matchLabelKeys=["app"],
            ),
            {"matchLabels": {"tier": "web"}},
        ),
        (
            "preferred",
            term({"matchExpressions": [ZONE_IN_A, APP_IN_SOLO]}, matchLabelKeys=["app"]),
            {"matchExpressions": [ZONE_IN_A]},
        ),
        # mismatchLabelKeys: a user may select on that key too; only the appended one goes.
        (
            "anti",
            term(
                {"matchExpressions": [TEAM_NOT_IN_OPS, TEAM_NOT_IN_SHOP]},
                mismatchLabelKeys=["team"],
            ),
            {"matchExpressions": [TEAM_NOT_IN_OPS]},
        ),
        (
            "spread",
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchExpressions": [ZONE_IN_A, APP_IN_SOLO]},
                "matchLabelKeys": ["app"],
            },
            {"matchExpressions": [ZONE_IN_A]},
        ),
        # Without label keys nothing is the server's.
        (
            "anti",
            term({"matchExpressions": [ZONE_IN_A, APP_IN_SOLO]}),
            {"matchExpressions": [ZONE_IN_A, APP_IN_SOLO]},
        ),
    ],
)
def test_a_replacement_gives_back_the_selectors_the_pod_was_created_with(
    where: str, live: dict, expected_selector: dict
) -> None:
    """On create the API server merges matchLabelKeys (mismatchLabelKeys) into the selector;
    sent back merged, it would merge them twice and refuse the key as duplicated."""
    bare = pods.pod("solo", owner=None, labels={"app": "solo", "team": "shop"})
    live = copy.deepcopy(live)
    if where == "spread":
        bare["spec"]["topologySpreadConstraints"] = [live]
    else:
        affinity = anti_affinity(live) if where == "anti" else preferred_affinity(live)
        bare["spec"]["affinity"] = affinity
    body = replacement_pod(snapshot_of(bare), "{}")
    if where == "spread":
        got = body["spec"]["topologySpreadConstraints"][0]
    elif where == "anti":
        got = body["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ][0]
    else:
        got = body["spec"]["affinity"]["podAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ][0]["podAffinityTerm"]
    assert got["labelSelector"] == expected_selector
    assert {k: v for k, v in got.items() if k != "labelSelector"} == {
        k: v for k, v in live.items() if k != "labelSelector"
    }
