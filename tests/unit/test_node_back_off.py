"""Crash loops counted the same on every node, whatever the node's crash-loop back-off.

Since v1.35 a kubelet's back-off is its node's own (pkg/kubelet/kubelet.go, newCrashLoopBackOff):
KubeletCrashLoopBackOffMax (beta, on by default) caps it anywhere from 1 s to 300 s
(crashLoopBackOff.maxContainerRestartPeriod) and lowers the initial back-off to the cap when
that is smaller; ReduceDefaultCrashLoopBackOffDecay (alpha) starts it at 1 s, capped at 60 s. The
kubelet still writes what it waits in the container's message ("back-off 1s restarting failed
container=..."), and its flowcontrol.Backoff forgets a container's entry after twice the cap
without a failure (10 s on a node that caps at 5 s). So:

- "back-off B" proves at least as many failures in a row as the default back-off (10 s
  doubling) takes to reach B, never more: a node's cap, or the reduced decay, reaches it sooner;
- a young pod's restarts are all in a row, and credited no faster than the default back-off
  allows since the pod started: 3 crashes in 3 s on a node that backs off 1 s are not yet the 3
  in a row that take 30 s on every other node.

Objects are shaped as kubelet v1.36 writes them (tests/unit/pods.py); only the back-off in the
message and the times differ between nodes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from shared.api.kubetypes import Pod
from shared.api.times import parse_duration
from shared.platform.config import Config
from shared.workloads.classify import classify, failures_behind, failures_paced

from . import pods
from .pods import NOW, crash_looping, terminated

CFG = Config()
SECOND = timedelta(seconds=1)


@pytest.mark.parametrize(
    ("back_off", "at_least"),
    [
        # A node capped at 1 s, 5 s or 10 s (or the reduced decay's first steps): nothing
        # beyond the failure the message is about.
        ("1s", 1),
        ("5s", 1),
        ("10s", 1),
        # The default steps, as before.
        ("20s", 2),
        ("40s", 3),
        ("1m20s", 4),
        ("2m40s", 5),
        ("5m0s", 6),
        # A node's own cap: reached no sooner than the default doubling reaches it.
        ("30s", 3),
        ("1m0s", 4),
        ("2m0s", 5),
    ],
)
def test_a_back_off_proves_the_failures_the_default_doubling_takes_to_reach_it(
    back_off: str, at_least: int
) -> None:
    assert failures_behind(parse_duration(back_off)) == at_least


@pytest.mark.parametrize(
    ("elapsed", "pace", "most"),
    [
        (timedelta(0), 10 * SECOND, 1),
        (9 * SECOND, 10 * SECOND, 1),
        (10 * SECOND, 10 * SECOND, 2),
        (29 * SECOND, 10 * SECOND, 2),
        (30 * SECOND, 10 * SECOND, 3),
        (70 * SECOND, 10 * SECOND, 4),
        # The local cluster's compressed clock (pace 1 s): the fake kubelet's third restart
        # comes about 7 s after the pod started (0.5 s, then every 3 s).
        (3 * SECOND, SECOND, 3),
        (7 * SECOND, SECOND, 4),
    ],
)
def test_restarts_are_credited_no_faster_than_the_default_back_off(
    elapsed: timedelta, pace: timedelta, most: int
) -> None:
    assert failures_paced(elapsed, pace) == most


def backing_off(back_off: str, *, restarts: int, age: timedelta, **kw: Any) -> Pod:
    """A pod started ``age`` ago, waiting in CrashLoopBackOff after ``restarts`` restarts, on a
    node whose kubelet now backs off ``back_off``."""
    status = crash_looping(restarts=restarts, **kw)
    waiting = status["state"]["waiting"]
    waiting["message"] = waiting["message"].replace(waiting["message"].split(" ")[1], back_off, 1)
    status["lastState"]["terminated"]["finishedAt"] = pods.ts(NOW - SECOND)
    status["lastState"]["terminated"]["startedAt"] = pods.ts(NOW - 2 * SECOND)
    return pods.pod(containers=[status], started=NOW - age)


def test_three_crashes_in_three_seconds_on_a_node_backing_off_one_second_are_no_loop_yet() -> None:
    fast = backing_off("1s", restarts=3, age=3 * SECOND)
    assert classify(fast, CFG, NOW) is None


def test_the_same_crashes_count_once_they_lasted_as_long_as_on_a_default_node() -> None:
    fast = backing_off("1s", restarts=25, age=31 * SECOND)
    failure = classify(fast, CFG, NOW)
    assert failure is not None and failure.reason == "CrashLoopBackOff"
    assert "25 restarts in 31s since the pod started, 3 in a row" in failure.why


def test_on_a_default_node_the_third_restart_counts_as_before() -> None:
    default = backing_off("40s", restarts=3, age=45 * SECOND)
    failure = classify(default, CFG, NOW)
    assert failure is not None and "after 3 restarts (threshold 3)" in failure.why


def test_an_old_pods_lifetime_restarts_never_stand_for_a_back_off_the_table_does_not_know() -> None:
    # A node capped at 5 s forgets the back-off after 10 s without a failure: "back-off 5s" on a
    # pod of two days with 40 lifetime restarts may be its first failure in days.
    capped = backing_off("5s", restarts=40, age=timedelta(days=2))
    assert classify(capped, CFG, NOW) is None
    # A 30 s cap: at least the 3 failures the default doubling takes to reach 30 s.
    capped_30 = backing_off("30s", restarts=40, age=timedelta(days=2))
    failure = classify(capped_30, CFG, NOW)
    assert failure is not None and "at least 3 in a row (kubelet back-off 30s)" in failure.why


def test_the_reduced_decays_first_steps_prove_one_failure_only() -> None:
    for back_off in ("1s", "2s", "4s", "8s"):
        assert classify(backing_off(back_off, restarts=30, age=timedelta(days=2)), CFG, NOW) is None


def test_between_two_restarts_a_young_pod_is_credited_at_the_default_pace() -> None:
    # state.terminated with no back-off message yet (the kubelet writes CrashLoopBackOff at the
    # end of the back-off): restartCount alone, for a pod too young to have reset it.
    def between(age: timedelta) -> Pod:
        return pods.pod(
            containers=[terminated("Error", 1, restarts=3, finished=NOW - SECOND)],
            started=NOW - age,
        )

    assert classify(between(4 * SECOND), CFG, NOW) is None
    failure = classify(between(31 * SECOND), CFG, NOW)
    assert failure is not None and failure.reason == "CrashLoopBackOff"


def test_an_oom_kill_at_its_own_limit_in_an_old_pod_is_the_first_of_a_series() -> None:
    # state.terminated OOMKilled, before the kubelet writes CrashLoopBackOff and its back-off
    # (recorded: tests/fixtures/real-kubelet/oom-killed.json): the pod's 7 restarts are from
    # days ago, and nothing says how many of them are in a row.
    old = pods.pod(
        containers=[terminated("OOMKilled", 137, restarts=7, finished=NOW - SECOND)],
        started=NOW - timedelta(days=3),
    )
    assert classify(old, CFG, NOW) is None
    # The same kill in a pod a minute old: its restarts are all in a row.
    young = pods.pod(
        containers=[terminated("OOMKilled", 137, restarts=7, finished=NOW - SECOND)],
        started=NOW - timedelta(minutes=3),
    )
    failure = classify(young, CFG, NOW)
    assert failure is not None and "5 in a row" in failure.why
