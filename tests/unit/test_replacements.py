"""Which replacements of a pod the kubelet failed are recreated so the new exclusion applies."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import NamedTuple

import pytest

from shared.api.kubetypes import Pod
from shared.pods.update_annotations.replacements import (
    is_terminal_failure,
    label_selector,
    redirects,
)

from . import pods
from .pods import NOW

FAILED = pods.evicted(node="node-b", started=NOW - timedelta(minutes=5))


def replacement(
    name: str = "web-7d9c8b6f4-r8t2w",
    *,
    node: str | None = "node-b",
    age: timedelta = timedelta(seconds=3),
    excluded: list[str] | None = None,
    owner: tuple[str, str] = ("ReplicaSet", "web-7d9c8b6f4"),
    phase: str = "Running",
) -> Pod:
    # pods.pod makes creationTimestamp 2 s before `started`.
    started = NOW - age + timedelta(seconds=2)
    if node is None:
        return pods.pod(
            name, node=None, phase="Pending", started=started, excluded=excluded, owner=owner
        )
    return pods.pod(name, node=node, phase=phase, started=started, excluded=excluded, owner=owner)


class Case(NamedTuple):
    candidate: Pod
    redirected: bool


CASES = {
    "a replacement bound to the node that failed its predecessor": Case(replacement(), True),
    "a replacement not yet bound": Case(replacement(node=None), True),
    "a replacement already placed on another node": Case(replacement(node="node-c"), False),
    "a replacement the webhook already kept off the node": Case(
        replacement(excluded=["node-b"]), False
    ),
    "a sibling older than the failed pod": Case(replacement(age=timedelta(minutes=20)), False),
    "a replacement created longer ago than the window": Case(
        replacement(age=timedelta(minutes=2)), False
    ),
    "a pod of another ReplicaSet": Case(replacement(owner=("ReplicaSet", "web-55d8f9")), False),
    "a sibling that failed too": Case(replacement(phase="Failed"), False),
    "the failed pod itself": Case(FAILED, False),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_only_a_replacement_admitted_without_the_exclusion_and_headed_for_the_node_is_redirected(
    case: Case,
) -> None:
    found = redirects(FAILED, "node-b", [case.candidate], NOW)
    assert bool(found) is case.redirected
    if found:
        assert found[0].uid == case.candidate["metadata"]["uid"]
        assert "node-b" in found[0].why


def test_a_bare_pod_has_no_replacement_to_redirect() -> None:
    bare = pods.evicted(owner=None)
    assert redirects(bare, "node-b", [replacement(owner=("ReplicaSet", "x"))], NOW) == ()


def test_a_statefulset_namesake_is_redirected() -> None:
    failed = pods.evicted(
        name="db-1", owner=("StatefulSet", "db"), started=NOW - timedelta(minutes=5)
    )
    namesake = replacement("db-1", owner=("StatefulSet", "db"), node=None)
    namesake["metadata"]["uid"] = "0f0f0f0f-1111-2222-3333-444455556666"
    assert [r.name for r in redirects(failed, "node-b", [namesake], NOW)] == ["db-1"]


def test_only_a_pod_the_kubelet_failed_is_a_terminal_failure() -> None:
    assert is_terminal_failure(FAILED)
    assert not is_terminal_failure(pods.pod(containers=[pods.crash_looping(restarts=5)]))


def test_siblings_are_selected_by_all_of_the_failed_pods_labels() -> None:
    assert label_selector(FAILED) == "app=web,pod-template-hash=7d9c8b6f4"
    assert label_selector({"metadata": {}}) is None


def test_the_zone_the_api_server_copied_at_binding_is_not_selected_on() -> None:
    # On 1.35+ the PodTopologyLabels admission copies the Node's zone and region onto the pod
    # at binding: its replacement, not bound yet or bound in another zone, has other values.
    bound = copy.deepcopy(FAILED)
    bound["metadata"]["labels"] |= {
        "topology.kubernetes.io/zone": "europe-west1-c",
        "topology.kubernetes.io/region": "europe-west1",
    }
    assert label_selector(bound) == "app=web,pod-template-hash=7d9c8b6f4"
    assert label_selector({"metadata": {"labels": {"topology.kubernetes.io/zone": "a"}}}) is None
