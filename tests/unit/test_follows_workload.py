"""A failure that may follow its workload is no evidence against its node.

Two worlds look alike from one workload's side: several bad nodes that fail every workload, and
an application broken everywhere that fails on every node it meets. Both show the workload
failing on several nodes. What tells them apart is the workload's other pods: in the first
world some of them run fine on other nodes; in the second none does. So a failure counts
against its node when its workload failed nowhere else, or when a pod of it is proven healthy
elsewhere (``everywhere.follows_its_workload``; for a move's reply, whose pod is gone,
``moves_follow_the_workload``).
"""

from __future__ import annotations

from datetime import timedelta

from shared.api.kubetypes import Pod
from shared.platform.config import Config
from shared.workloads.everywhere import follows_its_workload, moves_follow_the_workload

from . import pods
from .pods import NOW, crash_looping, running

CFG = Config()


def failing(node: str = "node-b", excluded: list[str] | None = None) -> Pod:
    return pods.pod(
        "web-7d9c8b6f4-x2x9z", node=node, containers=[crash_looping(restarts=4)], excluded=excluded
    )


def twin(
    name: str, node: str, *, up: timedelta = timedelta(minutes=5), crashing: bool = False
) -> Pod:
    containers = [crash_looping(restarts=4)] if crashing else [running(started=NOW - up)]
    return pods.pod(name, node=node, containers=containers, started=NOW - up)


def test_a_workloads_first_failure_anywhere_counts_against_its_node() -> None:
    assert follows_its_workload(failing(), [], CFG, NOW) is None
    assert (
        follows_its_workload(failing(), [twin("web-7d9c8b6f4-ok001", "node-c")], CFG, NOW) is None
    )


def test_a_pod_kept_off_nodes_it_failed_on_before_with_nothing_healthy_elsewhere_follows_it() -> (
    None
):
    why = follows_its_workload(failing(excluded=["node-a"]), [], CFG, NOW)
    assert why is not None and "node-a" in why


def test_a_sibling_failing_on_another_node_now_with_nothing_healthy_elsewhere_follows_it() -> None:
    other = twin("web-7d9c8b6f4-bad01", "node-c", crashing=True)
    why = follows_its_workload(failing(), [other], CFG, NOW)
    assert why is not None and "node-c" in why


def test_a_pod_of_it_proven_healthy_on_another_node_makes_the_failure_the_nodes() -> None:
    # Several bad nodes: the workload failed on node-a before, and another replica runs fine on
    # node-d; node-b is to blame.
    healthy = twin("web-7d9c8b6f4-ok001", "node-d", up=timedelta(minutes=5))
    assert follows_its_workload(failing(excluded=["node-a"]), [healthy], CFG, NOW) is None


def test_a_twin_ready_for_less_than_twice_the_failing_runs_proves_nothing() -> None:
    # An image that crashes 20 s after start: a twin Ready for 15 s has not outlived it yet.
    crashing_late = pods.pod(
        "web-7d9c8b6f4-x2x9z",
        node="node-b",
        excluded=["node-a"],
        containers=[
            crash_looping(restarts=2)
            | {
                "lastState": {
                    "terminated": pods.last_terminated(
                        finished=NOW - timedelta(seconds=5), ran_for=timedelta(seconds=20)
                    )
                }
            }
        ],
    )
    fresh = twin("web-7d9c8b6f4-new01", "node-d", up=timedelta(seconds=16))
    assert follows_its_workload(crashing_late, [fresh], CFG, NOW) is not None


def test_a_moves_reply_follows_its_workload_when_its_state_names_other_nodes_and_none_runs() -> (
    None
):
    assert moves_follow_the_workload(["node-b"], "node-b", [], CFG, NOW) is None
    why = moves_follow_the_workload(["node-a", "node-b"], "node-b", [], CFG, NOW)
    assert why is not None and "node-a" in why
    healthy = twin("web-7d9c8b6f4-ok001", "node-d", up=timedelta(minutes=2))
    assert moves_follow_the_workload(["node-a", "node-b"], "node-b", [healthy], CFG, NOW) is None
    # Ready for 30 s only: not yet longer than an image that crashes a while after start runs.
    young = twin("web-7d9c8b6f4-new01", "node-d", up=timedelta(seconds=30))
    assert moves_follow_the_workload(["node-a", "node-b"], "node-b", [young], CFG, NOW) is not None


def test_a_twin_moved_moments_ago_follows_through_its_workloads_record() -> None:
    # Two replicas crash at start on node-a and node-b; node-a's is moved first. Its
    # replacement carries the stamp, the pod on node-b (admitted before) does not, and the
    # moved twin is gone from the LIST: only the workload's state, where update-annotations
    # recorded node-a, says that the workload failed elsewhere. (The soak's broken-everywhere
    # application made a healthy node suspect so, with a rollout crashing there.)
    why = follows_its_workload(failing(), [], CFG, NOW, failed_before=["node-a"])
    assert why is not None and "node-a" in why


def test_a_record_naming_only_its_own_node_is_no_failure_elsewhere() -> None:
    assert follows_its_workload(failing(), [], CFG, NOW, failed_before=["node-b"]) is None


def test_a_record_naming_another_node_with_a_pod_proven_healthy_elsewhere_is_the_nodes() -> None:
    healthy = twin("web-7d9c8b6f4-ok001", "node-c")
    assert follows_its_workload(failing(), [healthy], CFG, NOW, failed_before=["node-a"]) is None


def between_two_crashes(name: str, node: str) -> Pod:
    """A crash-looping twin the moment the kubelet restarted it: Running, not Ready, its last
    run ended in an error 2 s ago (no CrashLoopBackOff in its status right now)."""
    last = pods.last_terminated(finished=NOW - timedelta(seconds=2), ran_for=timedelta(seconds=1))
    container = running(started=NOW - timedelta(seconds=1), restarts=3, ready=False, last=last)
    return pods.pod(name, node=node, containers=[container])


def test_a_twin_between_two_crashes_on_another_node_is_a_failure_elsewhere() -> None:
    # Two replicas crash at start on node-a and node-b; read when node-a's is Running again for
    # a second, the rules see no failure there, yet nothing there runs: the soak's broken
    # application marked a healthy node so.
    twin_a = between_two_crashes("web-7d9c8b6f4-bad01", "node-a")
    why = follows_its_workload(failing(), [twin_a], CFG, NOW)
    assert why is not None and "node-a" in why
    # For a move's reply, the holder's pods say the same.
    why = moves_follow_the_workload(["node-b"], "node-b", [twin_a], CFG, NOW)
    assert why is not None and "node-a" in why


def test_a_twin_that_ran_fine_for_long_after_a_restart_is_no_failure_elsewhere() -> None:
    last = pods.last_terminated(finished=NOW - timedelta(hours=2), ran_for=timedelta(days=1))
    container = running(started=NOW - timedelta(hours=2), restarts=1, last=last)
    fine = pods.pod(
        "web-7d9c8b6f4-ok001",
        node="node-a",
        containers=[container],
        started=NOW - timedelta(hours=2),
    )
    assert follows_its_workload(failing(), [fine], CFG, NOW) is None
    assert moves_follow_the_workload(["node-b"], "node-b", [fine], CFG, NOW) is None
