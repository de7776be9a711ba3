"""The fake kubelet's crash-loop back-off is kubelet v1.36's: when a crashed container starts
again, and what its CrashLoopBackOff status says at each restart (and that detect-failures'
classifier reads it as it reads a real kubelet's)."""

from __future__ import annotations

import copy
import itertools
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import pytest

from dev.localcluster.kubelet import Timing
from dev.localcluster.podstatus import (
    KUBELET_BACK_OFF,
    BackOffPolicy,
    Exit,
    PodRun,
    back_off_after,
    on_exit,
    pod_status,
    restart_delay,
)
from shared.api.kubetypes import Pod
from shared.platform.config import Config
from shared.workloads.classify import classify

from . import pods
from .pods import NOW

JSON = dict[str, Any]
NOW_S = NOW.timestamp()
MINUTE = 60.0


@dataclass(frozen=True)
class ExitCase:
    back_off: float  # the container's entry before this exit (0: none yet)
    ran_for: float  # seconds it ran since its last restart
    expected: Exit


EXITS = {
    "the first exit restarts at once and starts the back-off at 10 s": ExitCase(
        0.0, 0.0, Exit(0.0, 10.0, "first exit: restarted at once")
    ),
    "the second exit waits 10 s, and the next one will wait 20 s": ExitCase(
        10.0, 0.0, Exit(10.0, 20.0, "in back-off 10s from its exit")
    ),
    "a back-off of 160 s doubles only up to the 5-minute cap": ExitCase(
        160.0, 2.0, Exit(160.0, 300.0, "in back-off 2m40s from its exit")
    ),
    "at the cap it stays at 5 minutes": ExitCase(
        300.0, 0.0, Exit(300.0, 300.0, "in back-off 5m0s from its exit")
    ),
    "a run of exactly 10 minutes does not reset it (the kubelet's > 600 s)": ExitCase(
        80.0, 600.0, Exit(80.0, 160.0, "in back-off 1m20s from its exit")
    ),
    "a run of over 10 minutes resets it: restarted at once, then 10 s again": ExitCase(
        80.0,
        601.0,
        Exit(
            0.0,
            10.0,
            "ran 10m1s since its last restart (over 10m0s): back-off reset, restarted at once",
        ),
    ),
}


@pytest.mark.parametrize("case", EXITS.values(), ids=EXITS.keys())
def test_what_the_kubelet_does_about_an_exit(case: ExitCase) -> None:
    assert on_exit(case.back_off, case.ran_for) == case.expected


def crash_loop(exits: int, uniform: float) -> list[tuple[float, int, float]]:
    """A container that crashes the moment it starts, as the fake kubelet drives it:
    (seconds since the first exit, restartCount, back-off its message names) at each exit."""
    t, back_off, out = 0.0, 0.0, []
    for restarts in range(exits):
        exit_ = on_exit(back_off, 0.0)
        out.append((t, restarts, back_off))
        t += restart_delay(exit_.wait, lambda: uniform)
        back_off = exit_.after
    return out


def test_a_crash_loop_restarts_at_once_then_after_10_20_40_80_160_300_300_seconds() -> None:
    loop = crash_loop(9, uniform=0.0)
    gaps = [round(b[0] - a[0], 3) for a, b in itertools.pairwise(loop)]
    assert gaps == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]
    # After restart r its next exit reports the entry of r restarts in a row.
    assert [(r, b) for _, r, b in loop[1:]] == [(r, back_off_after(r)) for r in range(1, 9)]
    # The default restart threshold (3) comes 30 s after the first failure, not 7 s.
    assert loop[3][:2] == (30.0, 3)


def test_the_pod_workers_jitter_delays_a_restart_by_up_to_half_the_back_off() -> None:
    assert restart_delay(10.0, lambda: 0.0) == 10.0
    assert restart_delay(10.0, lambda: 0.5) == 12.5
    assert restart_delay(20.0, lambda: 0.999) == pytest.approx(29.99)
    assert restart_delay(0.0, lambda: 0.999) == 0.0  # restarted at the next sync


@pytest.mark.parametrize("wait", [10.0, 20.0, 40.0, 80.0, 160.0, 300.0])
def test_a_back_off_over_a_minute_is_waited_out_in_resync_steps(wait: float) -> None:
    """syncFrequency (1 m) caps each requeue before its jitter: a 5-minute back-off restarts
    at most 30 s late, not 2.5 minutes late."""
    rng = random.Random(9)
    delays = [restart_delay(wait, rng.random) for _ in range(500)]
    late = min(wait, KUBELET_BACK_OFF.resync) * KUBELET_BACK_OFF.jitter
    assert all(wait <= d <= wait + late for d in delays)
    assert max(delays) - min(delays) > 1.0  # it does vary


def test_another_policy_is_honoured() -> None:
    """A kubelet with maxContainerRestartPeriod 60 s (KubeletCrashLoopBackOffMax)."""
    policy = BackOffPolicy(cap=60.0)
    assert [back_off_after(r, policy) for r in range(1, 6)] == [10.0, 20.0, 40.0, 60.0, 60.0]
    assert on_exit(40.0, 0.0, policy).after == 60.0


def test_the_default_clock_stays_compressed_and_real_is_the_kubelets() -> None:
    assert Timing().backoff == "compressed" and Timing().restart_interval == 3.0
    real = Timing.real()
    assert real.backoff == "kubelet" and real.back_off_policy == KUBELET_BACK_OFF
    with pytest.raises(ValueError, match="unknown back-off"):
        Timing(backoff="fast")  # type: ignore[arg-type]


# -- what the pod says at each step ---------------------------------------------------------


def in_back_off(restarts: int, back_off: float, age: float = 5 * MINUTE) -> Pod:
    """A Deployment's pod started ``age`` seconds ago, as the fake kubelet writes it after its
    ``restarts``-th restart crashed, with the container's back-off entry ``back_off``."""
    pod = cast(JSON, copy.deepcopy(pods.pod(node="node-1", containers=[pods.running()])))
    meta = pod["metadata"]
    run = PodRun(
        uid=meta["uid"],
        namespace=meta["namespace"],
        name=meta["name"],
        node="node-1",
        mode="crashloop",
        host_ip="10.0.0.11",
        pod_ip="10.244.1.2",
        start_time=NOW_S - age,
        step="backoff",
        restarts=restarts,
        back_off=back_off,
        run_started=NOW_S - 20,
        run_finished=NOW_S - 20,
    )
    status = pod_status(pod, run, NOW_S - 20)
    status.pop("$setElementOrder/conditions")
    pod["status"] = {**status, "qosClass": "Burstable"}
    return cast(Pod, pod)


def test_the_waiting_message_names_the_back_off_as_the_kubelet_prints_it() -> None:
    pod = in_back_off(2, 20.0)
    status = pod["status"]["containerStatuses"][0]
    meta = pod["metadata"]
    assert status["restartCount"] == 2
    assert status["state"]["waiting"] == {
        "reason": "CrashLoopBackOff",
        "message": f"back-off 20s restarting failed container=app "
        f"pod={meta['name']}_{meta['namespace']}({meta['uid']})",
    }
    assert status["lastState"]["terminated"]["reason"] == "Error"
    capped = in_back_off(9, 300.0)["status"]["containerStatuses"][0]["state"]["waiting"]
    assert capped["message"].startswith("back-off 5m0s restarting failed container=app ")


@pytest.mark.parametrize(
    ("restarts", "back_off", "age", "moved", "why"),
    [
        (2, 20.0, 5 * MINUTE, False, None),
        (3, 40.0, 5 * MINUTE, True, "CrashLoopBackOff after 3 restarts (threshold 3)"),
        # A pod of 3 hours whose back-off a 10-minute run reset: 7 restarts, 1 in a row.
        (7, 10.0, 180 * MINUTE, False, None),
        (
            9,
            40.0,
            180 * MINUTE,
            True,
            "9 restarts in its lifetime, at least 3 in a row (kubelet back-off 40s)",
        ),
    ],
)
def test_detect_failures_counts_the_restarts_in_a_row_from_the_message(
    restarts: int, back_off: float, age: float, moved: bool, why: str | None
) -> None:
    pod = in_back_off(restarts, back_off, age)
    failure = classify(pod, Config(), NOW + timedelta(seconds=1))
    assert (failure is not None) == moved
    if failure is not None:
        assert why is not None and why in failure.why
        assert failure.restart_count == restarts
