"""The flat exclusions the admission policies read (`kn-rescheduler.io/avoid-nodes`).

The policies split this value in CEL (shared.admission.policies); these tables pin the form
both sides agree on. The e2e test tests/e2e/test_admission_policies.py has the API server read it.
"""

from __future__ import annotations

import pytest

from shared.api.avoidnodes import AvoidNodes, parse, render
from shared.api.state import PodEntry, WorkloadState


def test_a_workloads_list_is_one_scope_for_all_its_pods_after_its_holders_uid() -> None:
    state = WorkloadState(moves=2, excluded_nodes=("node-a", "node-b"))
    assert render(state, per_pod=False, holder_uid="uid-1") == "uid-1;*=node-a,node-b"


def test_a_statefulsets_lists_are_one_scope_per_pod_name() -> None:
    state = WorkloadState(
        moves=3,
        per_pod={
            "db-1": PodEntry(moves=1, excluded_nodes=("node-c",)),
            "db-0": PodEntry(moves=2, excluded_nodes=("node-a", "node-b")),
            "db-2": PodEntry(moves=0),
        },
    )
    flat = render(state, per_pod=True, holder_uid="uid-2")
    assert flat == "uid-2;db-0=node-a,node-b;db-1=node-c"
    parsed = parse(flat)
    assert parsed is not None
    assert parsed.for_pod("db-0", per_pod=True) == ("node-a", "node-b")
    assert parsed.for_pod("db-2", per_pod=True) == ()


@pytest.mark.parametrize(
    ("state", "per_pod"),
    [
        (WorkloadState(), False),
        (WorkloadState(moves=1), False),
        (WorkloadState(moves=1, per_pod={"db-0": PodEntry(moves=1)}), True),
        # A StatefulSet's shared list is never used: exclusions_for reads the pod's entry.
        (WorkloadState(moves=1, excluded_nodes=("node-a",)), True),
    ],
)
def test_nothing_to_avoid_removes_the_annotation(state: WorkloadState, per_pod: bool) -> None:
    assert render(state, per_pod=per_pod, holder_uid="uid-1") is None


def test_a_name_the_api_server_would_refuse_is_left_out() -> None:
    # The policy drops a whole list with one invalid name in it, so none is written.
    state = WorkloadState(moves=2, excluded_nodes=("Node_A", "node-b"))
    assert render(state, per_pod=False, holder_uid="uid-1") == "uid-1;*=node-b"


def test_an_unknown_holder_uid_is_written_as_a_dash() -> None:
    state = WorkloadState(moves=1, excluded_nodes=("node-a",))
    assert render(state, per_pod=False, holder_uid="") == "-;*=node-a"


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        "uid-1",  # no scope
        "uid-1;*",  # no '='
        "uid-1;*=node-a;*=node-b",  # a scope twice
        "uid-1;*=Node_A",  # an invalid name
        "uid-1;*=",  # an empty name
        "uid-1;=node-a",  # no scope name
    ],
)
def test_what_render_never_writes_does_not_parse(raw: str | None) -> None:
    assert parse(raw) is None


def test_a_parsed_list_says_its_holder() -> None:
    assert parse("uid-9;*=node-a") == AvoidNodes("uid-9", {"*": ("node-a",)})
