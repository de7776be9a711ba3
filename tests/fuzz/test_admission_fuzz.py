"""The webhook's patch for any pod and any owner facts. The API server applies our JSON Patch
after we answered, and `failurePolicy: Ignore` does not cover a patch that fails to apply or a
patched pod it refuses: so the patch must apply, keep the user's annotations, and never write a
node name (or an annotation size) the API server would refuse, whatever the owner's state
says."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
from hypothesis import given
from hypothesis import strategies as st

from shared.admission.decide import OwnerFacts, mutate
from shared.api.keys import (
    EXCLUDED_NODES_ANNOTATION,
    KSE_SCHEDULED_HOSTS_ANNOTATION,
    OPT_OUT_LABEL,
    POLICY_ANNOTATION,
    POLICY_STAMP_ANNOTATION,
    STUCK_AFTER_ANNOTATION,
)
from shared.api.kubetypes import Pod
from shared.api.state import is_valid_node_name
from shared.workloads.policy import parse_retries
from tests.fuzz import strategies as s
from tests.unit import pods
from tests.unit.apivalidation import api_server_errors

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eu-west-1a"]}
GPU = {"key": "nvidia.com/gpu.present", "operator": "Exists"}
field_requirements = st.builds(
    lambda operator, node: {"key": "metadata.name", "operator": operator, "values": [node]},
    st.sampled_from(["In", "NotIn"]),
    s.valid_node_names,
)
terms = st.fixed_dictionaries(
    {},
    optional={
        "matchExpressions": st.lists(st.sampled_from([ZONE, GPU]), max_size=2),
        "matchFields": st.lists(field_requirements, max_size=3),
    },
)
affinities: st.SearchStrategy[dict[str, Any] | None] = st.one_of(
    st.none(),
    st.just({}),
    st.just({"nodeAffinity": {}}),
    st.lists(terms, min_size=1, max_size=3).map(
        lambda ts: {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ts}
            }
        }
    ),
    st.just(
        {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "preference": {"matchExpressions": [ZONE]}}
                ]
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {}}
                ]
            },
        }
    ),
)
annotation_keys = st.one_of(
    st.sampled_from(
        [
            POLICY_ANNOTATION,
            POLICY_STAMP_ANNOTATION,
            EXCLUDED_NODES_ANNOTATION,
            KSE_SCHEDULED_HOSTS_ANNOTATION,
            STUCK_AFTER_ANNOTATION,
            "kn-rescheduler.io/state",
            "kubectl.kubernetes.io/last-applied-configuration",
            "a/b~c",
        ]
    ),
    s.texts,
)
annotation_values = st.one_of(
    s.texts,
    st.lists(s.node_names, max_size=3).map(json.dumps),
    # Right around the API's 256 KiB for all of a pod's annotations.
    st.integers(255 * 1024, 256 * 1024).map(lambda n: "x" * n),
)
new_pods = st.builds(
    pods.new_pod,
    annotations=st.none() | st.dictionaries(annotation_keys, annotation_values, max_size=4),
    affinity=affinities,
    owner=st.sampled_from(
        [("ReplicaSet", "web-7d9c8b6f4"), ("StatefulSet", "db"), ("Job", "nightly-1"), None]
    ),
    name=st.none() | st.just("db-0"),
    labels=st.none() | st.dictionaries(st.sampled_from(["app", OPT_OUT_LABEL]), s.texts),
    node=st.none() | s.valid_node_names,
)
owner_facts = st.builds(
    OwnerFacts,
    policy=st.none()
    | st.integers(0, 120).map(str)
    | s.texts
    | st.integers(60, 100_000).map(lambda n: "1" * n),
    excluded_nodes=st.lists(s.node_names | s.valid_node_names, max_size=40).map(tuple),
    kse_compat=st.booleans(),
    stuck_after=st.none() | st.sampled_from(["5m", "1h30m"]) | s.texts,
    max_retries=st.integers(1, 200),
)


def annotations_of(pod: Pod) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("annotations") or {})


def stamps_of(pod: Pod) -> list[str]:
    """The raw values of the pod's excluded-nodes stamps (JSON lists of node names)."""
    annotations = annotations_of(pod)
    keys = (EXCLUDED_NODES_ANNOTATION, KSE_SCHEDULED_HOSTS_ANNOTATION)
    return [annotations[key] for key in keys if key in annotations]


def field_values_of(pod: Pod) -> list[str]:
    """The values of every node field requirement of the pod's required node affinity."""
    spec: dict[str, Any] = pod.get("spec") or {}  # type: ignore[assignment]
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED) or {}
    return [
        value
        for term in required.get("nodeSelectorTerms") or []
        for requirement in term.get("matchFields") or []
        for value in requirement.get("values") or []
    ]


def written_node_names(before: Pod, after: Pod) -> list[str]:
    """The node names our patch wrote (a stamp the user brought is the user's business)."""
    written = [
        name for raw in stamps_of(after) if raw not in stamps_of(before) for name in json.loads(raw)
    ]
    kept = field_values_of(before)
    for value in field_values_of(after):
        if value in kept:
            kept.remove(value)
        else:
            written.append(value)
    return written


@given(pod=new_pods, facts=owner_facts)
def test_the_patch_applies_keeps_the_users_annotations_and_stays_valid(
    pod: Pod, facts: OwnerFacts
) -> None:
    original = copy.deepcopy(pod)
    mutation = mutate(pod, facts)
    assert pod == original, "mutate must not change its input"

    patched = jsonpatch.apply_patch(pod, list(mutation.patch))
    assert patched == mutation.pod
    assert json.loads(mutation.patch_json()) == list(mutation.patch)
    if "annotations" in pod["metadata"]:
        assert all(op["path"] != "/metadata/annotations" for op in mutation.patch)

    before, after = annotations_of(pod), annotations_of(patched)
    for key, value in before.items():
        if key not in s.OUR_POD_ANNOTATIONS:
            assert after.get(key) == value, f"the user's annotation {key!r} was changed"

    assert all(is_valid_node_name(name) for name in written_node_names(pod, patched))
    if not api_server_errors(pod):
        assert api_server_errors(patched) == []


@given(pod=new_pods, facts=owner_facts)
def test_only_a_policy_that_allows_moves_excludes_nodes(pod: Pod, facts: OwnerFacts) -> None:
    patched = jsonpatch.apply_patch(pod, list(mutate(pod, facts).patch))
    retries = parse_retries(facts.policy, facts.max_retries)
    if OPT_OUT_LABEL in (pod["metadata"].get("labels") or {}):
        assert patched == pod
    elif not (isinstance(retries, int) and retries > 0):
        assert patched["spec"] == pod["spec"]
        assert EXCLUDED_NODES_ANNOTATION not in annotations_of(patched)


@given(pod=new_pods, facts=owner_facts)
def test_a_pod_admitted_once_needs_no_second_patch(pod: Pod, facts: OwnerFacts) -> None:
    # A pod re-created from an admitted one (kubectl get -o yaml | kubectl create), or a
    # webhook called twice: our stamps and requirements are never added twice.
    first = mutate(pod, facts).pod
    assert mutate(first, facts).patch == ()
