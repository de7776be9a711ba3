"""The backfill of the flat exclusions (dev/tools/avoid_nodes.py), decided from each object."""

from __future__ import annotations

from typing import Any

from dev.tools.avoid_nodes import Backfill, backfill
from shared.api import avoidnodes
from shared.api.keys import STATE_ANNOTATION
from shared.api.state import PodEntry, WorkloadState, dump_state


def holder(uid: str = "uid-1", **annotations: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "resourceVersion": "7", "annotations": annotations}}


def test_a_state_without_its_list_gets_it_with_a_compare_and_swap() -> None:
    state = WorkloadState(moves=1, excluded_nodes=("node-a",), holder_uid="uid-1")
    plan = backfill("ReplicaSet", holder(**{STATE_ANNOTATION: dump_state(state)}))
    assert isinstance(plan, Backfill)
    assert plan.patch == {
        "metadata": {
            "annotations": {avoidnodes.ANNOTATION: "uid-1;*=node-a"},
            "resourceVersion": "7",
        }
    }


def test_a_statefulsets_list_is_per_pod() -> None:
    state = WorkloadState(moves=1, per_pod={"db-0": PodEntry(1, ("node-a",))}, holder_uid="uid-1")
    plan = backfill("StatefulSet", holder(**{STATE_ANNOTATION: dump_state(state)}))
    assert isinstance(plan, Backfill)
    assert plan.patch["metadata"]["annotations"][avoidnodes.ANNOTATION] == "uid-1;db-0=node-a"


def test_a_current_list_needs_nothing() -> None:
    state = WorkloadState(moves=1, excluded_nodes=("node-a",), holder_uid="uid-1")
    current = {STATE_ANNOTATION: dump_state(state), avoidnodes.ANNOTATION: "uid-1;*=node-a"}
    assert backfill("ReplicaSet", holder(**current)) is None
    assert backfill("ReplicaSet", holder()) is None


def test_a_copy_of_another_objects_state_gets_no_list() -> None:
    # The webhook ignores a copied state too (kubectl rollout undo, the Deployment controller).
    state = WorkloadState(moves=1, excluded_nodes=("node-a",), holder_uid="uid-other")
    assert backfill("ReplicaSet", holder(**{STATE_ANNOTATION: dump_state(state)})) is None


def test_a_list_whose_state_is_gone_is_removed() -> None:
    plan = backfill("Job", holder(**{avoidnodes.ANNOTATION: "uid-1;*=node-a"}))
    assert isinstance(plan, Backfill)
    assert plan.patch["metadata"]["annotations"] == {avoidnodes.ANNOTATION: None}


def test_an_unreadable_state_is_left_alone_and_said() -> None:
    said = backfill("ReplicaSet", holder(**{STATE_ANNOTATION: "{not json"}))
    assert isinstance(said, str) and said.startswith("unreadable state")


def test_an_opted_in_workload_without_the_param_label_gets_it() -> None:
    # The policies label a workload at its next create or update; one nobody updates would
    # otherwise never be a param, and its pods would get nothing.
    plan = backfill("ReplicaSet", holder(**{"scheduling-retries": "3"}))
    assert isinstance(plan, Backfill)
    assert plan.patch["metadata"]["labels"] == {"kn-rescheduler.io/admission-param": "true"}
    assert "annotations" not in plan.patch["metadata"]


def test_a_labelled_workload_needs_nothing() -> None:
    labelled = holder(**{"scheduling-retries": "3"})
    labelled["metadata"]["labels"] = {"kn-rescheduler.io/admission-param": "true"}
    assert backfill("ReplicaSet", labelled) is None


def test_a_replicaset_at_0_is_no_param_and_a_false_preference_asks_nothing() -> None:
    idle = holder(**{"scheduling-retries": "3"})
    idle["spec"] = {"replicas": 0}
    assert backfill("ReplicaSet", idle) is None
    assert backfill("StatefulSet", idle) is not None  # scaled through /scale: always a param
    assert backfill("ReplicaSet", holder(**{"kn-rescheduler.io/avoid-pressure": "false"})) is None
