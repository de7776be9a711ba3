"""The webhook's patch: stamps and a node affinity merged into the pod's own, never clobbering."""

from __future__ import annotations

import copy
import json
from typing import Any, cast

import jsonpatch
import pytest

from shared.admission.decide import Mutation, OwnerFacts, mutate, node_exclusion_requirements
from shared.api.kubetypes import Pod
from shared.workloads.state import MAX_EXCLUDED_NODES

from . import pods
from .apivalidation import api_server_errors

STAMP = "kn-rescheduler.io/scheduling-retries"
OPTED_IN = "kn-rescheduler.io/opted-in"
OPT_OUT = "kn-rescheduler.io/ignore"
ADD_OPTED_IN = {
    "op": "add",
    "path": "/metadata/labels/kn-rescheduler.io~1opted-in",
    "value": "true",
}
EXCLUDE_AB = OwnerFacts(policy="3", excluded_nodes=("node-a", "node-b"))
NOT_A = {"key": "metadata.name", "operator": "NotIn", "values": ["node-a"]}
NOT_B = {"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]}
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eu-west-1a"]}
GPU = {"key": "nvidia.com/gpu.present", "operator": "Exists"}


def checked_mutate(pod: Pod, owner: OwnerFacts) -> Mutation:
    """mutate(), plus the guarantees every patch must give the API server."""
    original = copy.deepcopy(pod)
    mutation = mutate(pod, owner)
    assert pod == original, "mutate must not change its input"
    assert api_server_errors(mutation.pod) == [], "the API server would refuse the patched pod"
    patched = jsonpatch.apply_patch(pod, list(mutation.patch))
    assert patched == mutation.pod, "the patch must turn the pod into exactly the changed copy"
    for field in ("annotations", "labels"):
        if (pod.get("metadata") or {}).get(field) is not None:
            assert all(op["path"] != f"/metadata/{field}" for op in mutation.patch), (
                f"an existing {field} map must be patched key by key, never replaced"
            )
    created = mutation.pod.get("metadata") or {}
    if OPT_OUT not in ((pod.get("metadata") or {}).get("labels") or {}):
        # The ApiServerSource selects on the label: it must say exactly what the stamp says.
        assert (OPTED_IN in (created.get("labels") or {})) == (
            STAMP in (created.get("annotations") or {})
        ), "the opted-in label goes and comes with the policy stamp"
    assert json.loads(mutation.patch_json()) == list(mutation.patch)
    return mutation


def terms_of(pod: Pod) -> list[dict[str, Any]]:
    affinity = cast(dict[str, Any], pod["spec"]).get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return cast(list[dict[str, Any]], required.get("nodeSelectorTerms") or [])


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def test_existing_annotations_are_kept_and_ours_added_key_by_key() -> None:
    pod = pods.new_pod(
        annotations={
            "prometheus.io/scrape": "true",
            "kubectl.kubernetes.io/restartedAt": "2026-03-14T08:00:00Z",
        }
    )
    mutation = checked_mutate(pod, EXCLUDE_AB)
    annotations = mutation.pod["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "kubectl.kubernetes.io/restartedAt": "2026-03-14T08:00:00Z",
        "kn-rescheduler.io/scheduling-retries": "3",
        "kn-rescheduler.io/excluded-nodes": '["node-a","node-b"]',
    }
    paths = {op["path"] for op in mutation.patch if op["op"] == "add"}
    # Keys with "/" are escaped as "~1" in a JSON Pointer.
    assert "/metadata/annotations/kn-rescheduler.io~1excluded-nodes" in paths
    assert "/metadata/annotations/kn-rescheduler.io~1scheduling-retries" in paths


def test_a_pod_without_annotations_gets_the_whole_map() -> None:
    pod = pods.new_pod()
    assert "annotations" not in pod["metadata"]
    mutation = checked_mutate(pod, EXCLUDE_AB)
    assert {
        "op": "add",
        "path": "/metadata/annotations",
        "value": {
            "kn-rescheduler.io/scheduling-retries": "3",
            "kn-rescheduler.io/excluded-nodes": '["node-a","node-b"]',
        },
    } in mutation.patch


def test_a_pod_without_affinity_gets_one_requirement_per_excluded_node() -> None:
    mutation = checked_mutate(pods.new_pod(), EXCLUDE_AB)
    assert terms_of(mutation.pod) == [{"matchFields": [NOT_A, NOT_B]}]
    # Kubernetes rejects a node field selector In/NotIn with more than one value.
    for term in terms_of(mutation.pod):
        for requirement in term["matchFields"]:
            assert len(requirement["values"]) == 1


def test_every_term_of_an_existing_required_affinity_is_extended() -> None:
    pod = pods.new_pod(affinity=required({"matchExpressions": [ZONE]}, {"matchExpressions": [GPU]}))
    mutation = checked_mutate(pod, EXCLUDE_AB)
    # Terms are ORed: a term left without the exclusions would let the pod back onto them.
    assert terms_of(mutation.pod) == [
        {"matchExpressions": [ZONE], "matchFields": [NOT_A, NOT_B]},
        {"matchExpressions": [GPU], "matchFields": [NOT_A, NOT_B]},
    ]


def test_an_empty_term_is_left_alone() -> None:
    pod = pods.new_pod(affinity=required({"matchExpressions": [ZONE]}, {}))
    mutation = checked_mutate(pod, EXCLUDE_AB)
    # An empty term matches no node; extending it would make it match almost every node.
    assert terms_of(mutation.pod) == [
        {"matchExpressions": [ZONE], "matchFields": [NOT_A, NOT_B]},
        {},
    ]


def test_only_empty_terms_means_no_affinity_change() -> None:
    pod = pods.new_pod(affinity=required({}, {"matchExpressions": []}))
    mutation = checked_mutate(pod, EXCLUDE_AB)
    assert mutation.pod["spec"]["affinity"] == pod["spec"]["affinity"]
    assert any("empty" in reason for reason in mutation.reasons)


def test_existing_match_fields_are_merged_not_replaced() -> None:
    not_z = {"key": "metadata.name", "operator": "NotIn", "values": ["node-z"]}
    pod = pods.new_pod(affinity=required({"matchFields": [not_z, NOT_A]}))
    mutation = checked_mutate(pod, EXCLUDE_AB)
    assert terms_of(mutation.pod) == [{"matchFields": [not_z, NOT_A, NOT_B]}]


def test_preferred_affinity_and_pod_affinities_are_untouched() -> None:
    preferred = [{"weight": 50, "preference": {"matchExpressions": [ZONE]}}]
    pod_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": {"app": "cache"}},
                "topologyKey": "kubernetes.io/hostname",
            }
        ]
    }
    anti = {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"app": "web"}},
                    "topologyKey": "kubernetes.io/hostname",
                },
            }
        ]
    }
    pod = pods.new_pod(
        affinity={
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred},
            "podAffinity": pod_affinity,
            "podAntiAffinity": anti,
        }
    )
    mutation = checked_mutate(pod, EXCLUDE_AB)
    affinity = mutation.pod["spec"]["affinity"]
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert affinity["podAffinity"] == pod_affinity
    assert affinity["podAntiAffinity"] == anti
    assert terms_of(mutation.pod) == [{"matchFields": [NOT_A, NOT_B]}]


def test_mutating_the_mutated_pod_again_changes_nothing() -> None:
    for owner in (EXCLUDE_AB, OwnerFacts("3", ("node-a",), kse_compat=True), OwnerFacts("2")):
        pod = pods.new_pod(affinity=required({"matchExpressions": [ZONE]}))
        once = checked_mutate(pod, owner)
        twice = checked_mutate(once.pod, owner)
        assert twice.patch == ()
        assert not twice.changed


def test_no_exclusions_means_no_affinity_change_but_the_policy_is_stamped() -> None:
    pod = pods.new_pod(affinity=required({"matchExpressions": [ZONE]}))
    mutation = checked_mutate(pod, OwnerFacts(policy="3"))
    assert mutation.pod["spec"] == pod["spec"]
    assert mutation.patch == (
        {"op": "add", "path": "/metadata/annotations", "value": {STAMP: "3"}},
        ADD_OPTED_IN,
    )


def test_the_stamp_is_ours_and_the_users_own_key_is_left_alone() -> None:
    # A pod template carrying the user's key (e.g. copied from the Deployment's metadata).
    pod = pods.new_pod(annotations={"scheduling-retries": "9"})
    mutation = checked_mutate(pod, OwnerFacts(policy="3"))
    assert mutation.patch == (
        ADD_OPTED_IN,
        {
            "op": "add",
            "path": "/metadata/annotations/kn-rescheduler.io~1scheduling-retries",
            "value": "3",
        },
    )


def test_the_owners_policy_replaces_a_different_stamp_from_the_template() -> None:
    pod = pods.new_pod(annotations={STAMP: "9"})
    mutation = checked_mutate(pod, OwnerFacts(policy="3"))
    assert mutation.patch == (
        ADD_OPTED_IN,
        {
            "op": "replace",
            "path": "/metadata/annotations/kn-rescheduler.io~1scheduling-retries",
            "value": "3",
        },
    )


def test_an_owner_without_policy_or_exclusions_changes_nothing() -> None:
    pod = pods.new_pod()
    mutation = checked_mutate(pod, OwnerFacts(policy=None))
    assert mutation.patch == ()
    assert mutation.reasons == ("not opted in",)
    # Every pod create in the cluster comes here: no copy, no diff.
    assert mutation.pod is pod


def test_a_stale_exclusions_stamp_is_removed() -> None:
    pod = pods.new_pod(
        annotations={"kn-rescheduler.io/excluded-nodes": '["node-old"]', "team": "shop"}
    )
    mutation = checked_mutate(pod, OwnerFacts(policy="3"))
    assert mutation.pod["metadata"]["annotations"] == {"team": "shop", STAMP: "3"}
    assert {"op": "remove", "path": "/metadata/annotations/kn-rescheduler.io~1excluded-nodes"} in (
        mutation.patch
    )


def test_the_kse_compatibility_stamp_is_written_only_when_enabled() -> None:
    off = checked_mutate(pods.new_pod(), EXCLUDE_AB)
    assert "kse.com/scheduled-hosts" not in off.pod["metadata"]["annotations"]
    on = checked_mutate(pods.new_pod(), OwnerFacts("3", ("node-a", "node-b"), kse_compat=True))
    assert on.pod["metadata"]["annotations"]["kse.com/scheduled-hosts"] == '["node-a","node-b"]'


def test_duplicate_and_empty_node_names_are_dropped() -> None:
    mutation = checked_mutate(pods.new_pod(), OwnerFacts("3", ("node-a", "", "node-a", "node-b")))
    assert terms_of(mutation.pod) == [{"matchFields": [NOT_A, NOT_B]}]
    assert mutation.pod["metadata"]["annotations"]["kn-rescheduler.io/excluded-nodes"] == (
        '["node-a","node-b"]'
    )


def test_a_pod_with_the_opt_out_label_is_left_alone() -> None:
    pod = pods.new_pod(labels={"app": "web", "kn-rescheduler.io/ignore": "true"})
    mutation = checked_mutate(pod, EXCLUDE_AB)
    assert mutation.patch == ()


def test_a_pod_created_on_a_node_gets_no_affinity() -> None:
    # The scheduler never sees it, and the kubelet would reject it for the affinity.
    pod = pods.new_pod(node="node-a")
    mutation = checked_mutate(pod, EXCLUDE_AB)
    assert "affinity" not in mutation.pod["spec"]
    assert "kn-rescheduler.io/excluded-nodes" in mutation.pod["metadata"]["annotations"]


def test_a_statefulset_pod_with_its_name_is_patched_the_same_way() -> None:
    pod = pods.new_pod(owner=("StatefulSet", "db"), name="db-0")
    mutation = checked_mutate(pod, OwnerFacts("2", ("node-c",)))
    assert terms_of(mutation.pod) == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-c"]}]}
    ]


@pytest.mark.parametrize("nodes", [(), ("node-a",), ("node-a", "node-b", "node-c")])
def test_exclusion_requirements_hold_one_node_each(nodes: tuple[str, ...]) -> None:
    requirements = node_exclusion_requirements(nodes)
    assert [r["values"] for r in requirements] == [[n] for n in nodes]


def test_the_api_server_mirror_catches_what_the_api_server_refuses() -> None:
    two_values = {"key": "metadata.name", "operator": "NotIn", "values": ["node-a", "node-b"]}
    bad_name = {"key": "metadata.name", "operator": "NotIn", "values": ["Bad_Name!"]}
    assert (
        len(api_server_errors(pods.new_pod(affinity=required({"matchFields": [two_values]})))) == 1
    )
    assert len(api_server_errors(pods.new_pod(affinity=required({"matchFields": [bad_name]})))) == 1
    assert len(api_server_errors(pods.new_pod(affinity=required()))) == 1
    assert api_server_errors(pods.new_pod(affinity=required({"matchFields": [NOT_A, NOT_B]}))) == []


def test_invalid_node_names_are_skipped_and_the_valid_ones_kept() -> None:
    mutation = checked_mutate(pods.new_pod(), OwnerFacts("3", ("Bad_Name!", "node-1")))
    assert terms_of(mutation.pod) == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]}
    ]
    assert mutation.pod["metadata"]["annotations"]["kn-rescheduler.io/excluded-nodes"] == (
        '["node-1"]'
    )
    assert "skipped 1 invalid node name(s): 'Bad_Name!'" in mutation.reasons


HOSTILE_NAMES = (
    "Bad_Name!",
    "NODE-1",
    "node 1",
    "-node",
    "node-",
    "a" * 254,
    "node\n1",
    "n\u00f6de",
    "../node",
    '"],"values":["x',
    "",
)


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=[repr(n[:12]) for n in HOSTILE_NAMES])
def test_whatever_the_owner_says_the_patched_pod_is_valid(name: str) -> None:
    for affinity in (None, required({"matchExpressions": [ZONE]}, {"matchFields": [NOT_A]})):
        pod = pods.new_pod(affinity=affinity)
        mutation = checked_mutate(pod, OwnerFacts("3", (name, "node-b"), kse_compat=True))
        fields = [r for term in terms_of(mutation.pod) for r in term.get("matchFields", [])]
        assert {r["values"][0] for r in fields} <= {"node-a", "node-b"}
        assert NOT_B in terms_of(mutation.pod)[0]["matchFields"]


def test_at_most_the_most_recent_excluded_nodes_are_patched_in() -> None:
    nodes = tuple(f"node-{i:03d}" for i in range(100))
    mutation = checked_mutate(pods.new_pod(), OwnerFacts("3", nodes))
    values = [r["values"][0] for r in terms_of(mutation.pod)[0]["matchFields"]]
    assert values == list(nodes[-MAX_EXCLUDED_NODES:])


# A policy that does not allow moves excludes nothing.

NO_MOVES = {
    "0 turns rescheduling off": "0",
    "a value that is not a number": "three",
    "a value above the maximum": "101",
    "a negative value": "-1",
}


@pytest.mark.parametrize("policy", NO_MOVES.values(), ids=NO_MOVES.keys())
def test_a_policy_that_allows_no_moves_is_stamped_but_excludes_no_node(policy: str) -> None:
    pod = pods.new_pod(
        annotations={
            "kn-rescheduler.io/excluded-nodes": '["node-old"]',
            "kse.com/scheduled-hosts": '["node-old"]',
        }
    )
    mutation = checked_mutate(pod, OwnerFacts(policy, ("node-a", "node-b"), kse_compat=True))
    assert mutation.pod["metadata"]["annotations"] == {STAMP: policy}
    assert "affinity" not in mutation.pod["spec"]
    assert any("excluded node(s) ignored" in reason for reason in mutation.reasons)


def test_the_configured_maximum_decides_whether_a_policy_allows_moves() -> None:
    mutation = checked_mutate(pods.new_pod(), OwnerFacts("50", ("node-a",), max_retries=10))
    assert "affinity" not in mutation.pod["spec"]
    assert checked_mutate(pods.new_pod(), OwnerFacts("10", ("node-a",), max_retries=10)).changed


def test_a_huge_policy_value_is_cut_and_stays_invalid() -> None:
    mutation = checked_mutate(pods.new_pod(), OwnerFacts("9" * 100_000, ("node-a",)))
    assert mutation.pod["metadata"]["annotations"] == {STAMP: "9" * 64}
    assert "affinity" not in mutation.pod["spec"]


def test_stamps_that_would_overflow_the_annotations_leave_the_pod_unchanged() -> None:
    pod = pods.new_pod(annotations={"big": "x" * (256 * 1024 - 100)})
    mutation = checked_mutate(pod, OwnerFacts("3", tuple(f"node-{i:03d}" for i in range(32))))
    assert mutation.patch == ()
    assert "annotations past" in mutation.reasons[0]
    assert OPTED_IN not in mutation.pod["metadata"]["labels"]


# Pods whose owner has no policy never look opted in.


def test_our_stale_stamps_are_removed_when_the_owner_has_no_policy() -> None:
    # e.g. `kubectl get pod -o yaml` of an opted-in pod, applied again as a bare pod.
    pod = pods.new_pod(
        owner=None,
        name="copy",
        annotations={
            STAMP: "3",
            "kn-rescheduler.io/excluded-nodes": '["node-a"]',
            "kn-rescheduler.io/stuck-after": "20m",
            "team": "shop",
        },
    )
    mutation = checked_mutate(pod, OwnerFacts(policy=None))
    assert mutation.pod["metadata"]["annotations"] == {
        "kn-rescheduler.io/stuck-after": "20m",
        "team": "shop",
    }


# stuck-after travels from the owner to the pod, for the sweep.


def test_the_owners_stuck_after_is_copied_verbatim() -> None:
    mutation = checked_mutate(pods.new_pod(), OwnerFacts("3", stuck_after="45m"))
    assert mutation.pod["metadata"]["annotations"] == {
        STAMP: "3",
        "kn-rescheduler.io/stuck-after": "45m",
    }
    # Verbatim, even when the sweep will not be able to read it (it warns then).
    odd = checked_mutate(pods.new_pod(), OwnerFacts("3", stuck_after="half an hour"))
    assert odd.pod["metadata"]["annotations"]["kn-rescheduler.io/stuck-after"] == "half an hour"


def test_a_stale_stuck_after_is_replaced_or_removed() -> None:
    pod = pods.new_pod(annotations={"kn-rescheduler.io/stuck-after": "5m"})
    replaced = checked_mutate(pod, OwnerFacts("3", stuck_after="1h"))
    assert replaced.pod["metadata"]["annotations"]["kn-rescheduler.io/stuck-after"] == "1h"
    removed = checked_mutate(pod, OwnerFacts("3"))
    assert "kn-rescheduler.io/stuck-after" not in removed.pod["metadata"]["annotations"]
    assert "removed stale kn-rescheduler.io/stuck-after" in removed.reasons


def test_an_overlong_stuck_after_is_not_copied() -> None:
    mutation = checked_mutate(pods.new_pod(), OwnerFacts("3", stuck_after="1" * 65 + "s"))
    assert mutation.pod["metadata"]["annotations"] == {STAMP: "3"}


# The opted-in label: the ApiServerSource selects on it, so it follows the policy stamp.

LABELS = {"app": "web", "pod-template-hash": "7d9c8b6f4"}
LABEL_CASES = {
    # case: (the owner, labels the pod is submitted with, labels it is created with)
    "an opted-in pod gets it next to its own labels": (
        OwnerFacts("3", ("node-a",)),
        LABELS,
        {**LABELS, OPTED_IN: "true"},
    ),
    "a policy of 0 is stamped, so labelled too": (
        OwnerFacts("0", ("node-a",)),
        LABELS,
        {**LABELS, OPTED_IN: "true"},
    ),
    "an unreadable policy too (detect-failures warns about it)": (
        OwnerFacts("three"),
        LABELS,
        {**LABELS, OPTED_IN: "true"},
    ),
    "another value copied from a template is set right": (
        OwnerFacts("3"),
        {**LABELS, OPTED_IN: "false"},
        {**LABELS, OPTED_IN: "true"},
    ),
    "a copy from a template goes when the owner has no policy": (
        OwnerFacts(None),
        {**LABELS, OPTED_IN: "true"},
        LABELS,
    ),
    "no policy, no label: nothing to do": (OwnerFacts(None), LABELS, LABELS),
}


@pytest.mark.parametrize("case", LABEL_CASES.values(), ids=LABEL_CASES.keys())
def test_the_opted_in_label_follows_the_policy_stamp(
    case: tuple[OwnerFacts, dict[str, str], dict[str, str]],
) -> None:
    owner, submitted, created = case
    mutation = checked_mutate(pods.new_pod(labels=submitted), owner)
    assert mutation.pod["metadata"]["labels"] == created


def test_the_label_is_added_key_by_key_or_as_a_new_map() -> None:
    labelled = checked_mutate(pods.new_pod(labels={"app": "web"}), OwnerFacts("3"))
    assert ADD_OPTED_IN in labelled.patch
    unlabelled = pods.new_pod()
    del unlabelled["metadata"]["labels"]
    mutation = checked_mutate(unlabelled, OwnerFacts("3"))
    assert {"op": "add", "path": "/metadata/labels", "value": {OPTED_IN: "true"}} in mutation.patch


def test_a_stale_label_goes_with_the_stale_stamps_of_a_copied_pod() -> None:
    # `kubectl get pod -o yaml` of an opted-in pod, created again as a bare pod without policy.
    pod = pods.new_pod(
        owner=None,
        name="copy",
        labels={"app": "web", OPTED_IN: "true"},
        annotations={STAMP: "3", "kn-rescheduler.io/excluded-nodes": '["node-a"]'},
    )
    mutation = checked_mutate(pod, OwnerFacts(policy=None))
    assert mutation.pod["metadata"]["labels"] == {"app": "web"}
    assert {"op": "remove", "path": "/metadata/labels/kn-rescheduler.io~1opted-in"} in (
        mutation.patch
    )
    assert "removed stale kn-rescheduler.io/opted-in" in mutation.reasons


def test_an_opted_out_pod_gets_no_label_and_keeps_what_it_has() -> None:
    for labels in ({"app": "web", OPT_OUT: ""}, {"app": "web", OPT_OUT: "true", OPTED_IN: "true"}):
        pod = pods.new_pod(labels=labels)
        assert checked_mutate(pod, EXCLUDE_AB).patch == ()
