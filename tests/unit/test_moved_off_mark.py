"""The moved-off mark (shared.api.movedoff): update-annotations labels a node the moment it moves
a pod off it for a failure counted against the node, so that replacements placed in the same
burst keep off it before assess-nodes has heard (dev/bench/RESULTS.md, "A burst").

The label's value is read by the scheduler's node affinity (the webhook's Lt term), so the
table below pins the exact wire form; the plan and handler cases pin when a move marks its node
and that a mark never stops a move.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.api import movedoff
from shared.api.keys import MOVED_OFF_LABEL, OPT_OUT_LABEL
from shared.api.state import WorkloadState
from shared.platform import kube
from shared.platform.config import Config
from shared.pods.update_annotations import decide
from shared.pods.update_annotations.decide import Delete, Evict, MarkNode, WriteState
from shared.workloads.owners import REPLICASET
from tests.unit import nodes, pods
from tests.unit.test_move_plan import (
    CFG,
    CRASHING,
    NOW,
    Scripted,
    another_workload_failed_on,
    deliver,
    early_report,
    kinds,
    node,
    plan_of,
    resolution,
    rs_move,
    with_state,
)
from tests.unit.test_owners import replicaset

WINDOW = timedelta(minutes=2)
# 2026-03-14T09:26:53Z in Unix seconds, as `date -d ... +%s` prints it.
NOW_SECONDS = "1773480413"


def labels(value: str | None) -> dict[str, str]:
    return {} if value is None else {MOVED_OFF_LABEL: value}


# -- the label's value ---------------------------------------------------------------------------


def test_the_mark_is_the_moves_time_in_whole_unix_seconds() -> None:
    assert movedoff.mark_value(NOW) == NOW_SECONDS
    assert movedoff.mark_value(NOW + timedelta(milliseconds=999)) == NOW_SECONDS
    assert movedoff.marked_at(labels(NOW_SECONDS)) == NOW


@pytest.mark.parametrize(
    "value",
    [
        None,  # not marked
        "",  # an empty label value
        "-5",  # node affinity's Lt would compare it, but no move of ours wrote it
        "1773480413.5",
        "yesterday",
        "\uff11\uff12\uff13",  # full-width: str.isdigit says yes, Go's ParseInt says no
        "9" * 40,  # past any datetime
    ],
)
def test_a_value_that_is_not_a_time_of_ours_is_no_mark(value: str | None) -> None:
    assert movedoff.marked_at(labels(value)) is None
    assert not movedoff.fresh(labels(value), NOW, WINDOW)


@pytest.mark.parametrize(
    ("age", "fresh"),
    [
        (timedelta(0), True),
        (timedelta(seconds=119), True),
        (timedelta(seconds=120), False),  # the window is open at its old end, as Lt is
        (timedelta(hours=3), False),
    ],
)
@pytest.mark.parametrize("fraction", [timedelta(0), timedelta(milliseconds=500)])
def test_a_mark_steers_for_its_window_and_is_then_expired(
    age: timedelta, fresh: bool, fraction: timedelta
) -> None:
    marked = labels(movedoff.mark_value(NOW - age))
    now = NOW + fraction  # the reader's clock is not on a whole second
    assert movedoff.fresh(marked, now, WINDOW) is fresh
    assert movedoff.expired(marked, now, WINDOW) is not movedoff.fresh(marked, now, WINDOW)
    # The webhook's Lt operand agrees to the second: a node marked at or after it does not score.
    scores = int(marked[MOVED_OFF_LABEL]) < int(movedoff.steers_before(now, WINDOW))
    assert scores is not movedoff.fresh(marked, now, WINDOW)


def test_no_label_is_neither_fresh_nor_expired_and_junk_of_our_key_is_expired() -> None:
    assert not movedoff.expired({}, NOW, WINDOW)
    assert movedoff.expired(labels("yesterday"), NOW, WINDOW)


# -- the write -----------------------------------------------------------------------------------


def test_an_unmarked_node_gets_a_compare_and_swap_of_the_one_label() -> None:
    patch = movedoff.mark_patch(nodes.node("node-b"), NOW, WINDOW)
    assert patch == {
        "metadata": {"resourceVersion": "48211", "labels": {MOVED_OFF_LABEL: NOW_SECONDS}}
    }


@pytest.mark.parametrize(
    ("age", "written"),
    [
        (timedelta(seconds=5), False),  # a burst off one node writes it once
        (timedelta(seconds=59), False),
        (timedelta(seconds=61), True),  # past half the window: kept steering
        (timedelta(hours=1), True),
    ],
)
def test_a_node_marked_lately_is_not_written_again(age: timedelta, written: bool) -> None:
    marked = nodes.node("node-b", labels=labels(movedoff.mark_value(NOW - age)))
    assert (movedoff.mark_patch(marked, NOW, WINDOW) is not None) is written


def test_a_node_its_operator_opted_out_is_never_marked() -> None:
    opted = nodes.node("node-b", labels={OPT_OUT_LABEL: ""})
    assert movedoff.mark_patch(opted, NOW, WINDOW) is None


# -- when a move marks its node ------------------------------------------------------------------


def test_a_move_marks_its_node_after_the_record_and_before_the_pod_is_removed() -> None:
    made = rs_move()
    order = kinds(made)
    assert order.index(WriteState) < order.index(MarkNode) < order.index(Delete)
    mark = next(r for r in made.requests if isinstance(r, MarkNode))
    assert mark.node == "node-b"


def test_an_eviction_too_is_preceded_by_the_mark() -> None:
    made = plan_of(CRASHING, resolution(REPLICASET, replicaset()), cfg=Config(use_eviction=True))
    order = kinds(made)
    assert order.index(MarkNode) < order.index(Evict)


def test_with_the_mark_off_a_move_writes_no_node() -> None:
    made = plan_of(CRASHING, resolution(REPLICASET, replicaset()), cfg=Config(moved_off_mark=False))
    assert MarkNode not in kinds(made)
    assert Delete in kinds(made)


def test_a_move_off_a_suspect_node_by_the_fast_path_does_not_mark_it() -> None:
    # The suspect fast path is not counted against the node (assess-nodes does not count it
    # either): the node is already marked, and the move says nothing new about it.
    early = decide.early_on_node(early_report(), CFG, node(suspect=True))
    assert early is not None and early.acted_on and not early.counts_against_node
    live = pods.pod(containers=[pods.crash_looping(restarts=1)])
    made = plan_of(live, resolution(REPLICASET, replicaset()), early=early)
    assert made.decided is not None and made.decided.delete_pod
    assert MarkNode not in kinds(made)


def test_a_pod_kept_off_every_node_by_its_exclusions_marks_none() -> None:
    # Never scheduled: no node to blame (FailureKind.EXCLUSIONS_UNSCHEDULABLE), and the move
    # that clears its exclusions writes no node.
    stuck = pods.unschedulable(excluded=["node-a", "node-b"])
    made = plan_of(stuck, resolution(REPLICASET, replicaset()))
    assert made.decided is not None and made.decided.delete_pod
    assert MarkNode not in kinds(made)


def moved_before_from(node_name: str) -> dict[str, Any]:
    """The ReplicaSet as read after a move of ours off ``node_name`` moments ago: its state
    records the failure there (``failedOn``)."""
    rs = replicaset()
    state = WorkloadState(
        moves=1,
        excluded_nodes=(node_name,),
        holder_uid=rs["metadata"]["uid"],
        failed_on={node_name: "CrashLoopBackOff"},
    )
    return with_state(rs, state)


def test_a_move_whose_workload_failed_elsewhere_and_runs_nowhere_does_not_mark_its_node() -> None:
    # Two replicas of an application broken everywhere crash at start on node-a and node-b;
    # node-a's was moved first. This pod was admitted before that move (no stamp) and its twin
    # is gone: only the workload's own record says it failed elsewhere. Its move says nothing
    # against node-b (the soak's no-mark-from-a-lookalike found this one).
    made = plan_of(CRASHING, resolution(REPLICASET, moved_before_from("node-a")))
    assert made.decided is not None and made.decided.delete_pod
    assert MarkNode not in kinds(made)


def test_the_same_move_marks_its_node_when_a_twin_runs_fine_elsewhere() -> None:
    healthy = pods.pod(
        "web-7d9c8b6f4-ok001",
        node="node-c",
        containers=[pods.running(started=NOW - timedelta(minutes=5))],
        started=NOW - timedelta(minutes=5),
    )
    made = plan_of(
        CRASHING, resolution(REPLICASET, moved_before_from("node-a")), siblings=[healthy]
    )
    assert made.decided is not None and made.decided.delete_pod
    mark = next(r for r in made.requests if isinstance(r, MarkNode))
    # Its twin running fine elsewhere is evidence enough: no need to look for other workloads.
    assert mark.unless_alone is None


def test_a_move_at_the_thresholds_with_nothing_else_read_marks_only_if_others_fail_there() -> None:
    mark = next(r for r in rs_move().requests if isinstance(r, MarkNode))
    assert mark.unless_alone is CRASHING or mark.unless_alone == CRASHING


# -- the handler: a mark never stops a move ------------------------------------------------------


class Nodes(Scripted):
    """Scripted, with a Node and its patches recorded by kind."""

    def __init__(
        self,
        the_node: dict[str, Any] | None,
        refusals: dict[str, kube.KubeError] | None = None,
        conflicts: int = 0,
        on_node: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        objects: dict[str, Any] = {"Pod": CRASHING, "ReplicaSet": replicaset()}
        if the_node is not None:
            objects["Node"] = the_node
        super().__init__(objects, refusals or {}, listed={"Pod": list(on_node)})
        self.conflicts = conflicts
        self.node_patches: list[dict[str, Any]] = []

    def merge_patch(
        self, kind: str, namespace: str | None, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        if kind != "Node":
            return super().merge_patch(kind, namespace, name, body)
        self._call("patch Node")
        if self.conflicts:
            self.conflicts -= 1
            raise kube.Conflict("the object has been modified", 409, "Conflict")
        self.node_patches.append(copy.deepcopy(body))
        return {}


def test_the_handler_marks_the_node_then_deletes_the_pod() -> None:
    api = Nodes(another_workload_failed_on("node-b"))
    reply = deliver(api)
    assert reply is not None
    assert api.node_patches == [
        {"metadata": {"resourceVersion": "48211", "labels": {MOVED_OFF_LABEL: NOW_SECONDS}}}
    ]
    assert api.calls.index("patch Node") < api.calls.index("delete Pod")


def test_a_lost_race_on_the_node_is_read_again() -> None:
    api = Nodes(another_workload_failed_on("node-b"), conflicts=1)
    deliver(api)
    assert api.calls.count("get Node") == 2
    assert len(api.node_patches) == 1
    assert "delete Pod" in api.calls


@pytest.mark.parametrize(
    ("the_node", "refusals"),
    [
        (None, {}),  # the node is gone
        (
            nodes.node("node-b"),
            {"get Node": kube.Forbidden("nodes is forbidden", 403, "Forbidden")},
        ),
        (
            nodes.node("node-b"),
            {"patch Node": kube.Forbidden("nodes is forbidden", 403, "Forbidden")},
        ),
        (nodes.node("node-b"), {"get Node": kube.Transient("timeout", 504, "Timeout")}),
    ],
)
def test_a_node_that_cannot_be_marked_never_stops_the_move(
    the_node: dict[str, Any] | None, refusals: dict[str, kube.KubeError]
) -> None:
    api = Nodes(the_node, refusals)
    reply = deliver(api)
    assert reply is not None
    assert "delete Pod" in api.calls
    assert api.node_patches == []


def test_a_node_that_keeps_changing_is_given_up_and_the_pod_still_moved() -> None:
    api = Nodes(another_workload_failed_on("node-b"), conflicts=10)
    deliver(api)
    assert api.calls.count("patch Node") == 3
    assert "delete Pod" in api.calls


def test_a_move_alone_on_its_node_leaves_it_unmarked_and_still_moves() -> None:
    # A move at the thresholds, its workload running nowhere else, the node's record naming
    # nobody else and nothing else failing there: one workload's failure may follow the
    # workload (a rollout whose image crashes 20 s after start), and marks no node.
    api = Nodes(nodes.node("node-b"))
    assert deliver(api) is not None
    assert api.node_patches == []
    assert "list Pod" in api.calls and "delete Pod" in api.calls


def test_another_workloads_pod_failing_there_now_lets_the_move_mark_its_node() -> None:
    neighbour = pods.pod(
        "api-5f6b9c7d8-qq1zz",
        owner=("ReplicaSet", "api-5f6b9c7d8"),
        containers=[pods.crash_looping(restarts=2)],
    )
    api = Nodes(nodes.node("node-b"), on_node=[neighbour])
    deliver(api)
    assert [p["metadata"]["labels"] for p in api.node_patches] == [{MOVED_OFF_LABEL: NOW_SECONDS}]


def test_a_node_marked_lately_is_read_and_not_written() -> None:
    marked = nodes.node("node-b", labels=labels(movedoff.mark_value(NOW - timedelta(seconds=3))))
    api = Nodes(marked)
    deliver(api)
    assert "get Node" in api.calls and "patch Node" not in api.calls


def test_the_mark_is_utc_whatever_the_functions_zone() -> None:
    # datetime.timestamp() of an aware time does not depend on TZ; a naive one would.
    assert movedoff.mark_value(datetime(2026, 3, 14, 9, 26, 53, tzinfo=UTC)) == NOW_SECONDS
