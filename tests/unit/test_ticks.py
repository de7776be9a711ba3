"""shared.platform.ticks: when a tick starts a run (the clock passed in)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from shared.platform.ticks import TickGate, due

TEN = timedelta(seconds=10)


@pytest.mark.parametrize(
    ("running", "last_ended", "now", "every", "runs"),
    [
        (False, None, 100.0, TEN, True),  # the first tick of a process
        (False, 95.0, 100.0, TEN, False),  # 5 s after the last run ended
        (False, 90.0, 100.0, TEN, True),  # exactly the interval
        (True, None, 100.0, TEN, False),  # a run is going on
        (True, 10.0, 100.0, TEN, False),  # going on, however long ago the last ended
        (False, 99.9, 100.0, timedelta(0), True),  # the bound turned off
    ],
)
def test_a_tick_runs_only_when_none_is_going_on_and_the_last_ended_long_enough_ago(
    running: bool, last_ended: float | None, now: float, every: timedelta, runs: bool
) -> None:
    verdict = due(running, last_ended, now, every)
    assert verdict.run is runs
    assert bool(verdict.why) is not runs


def test_the_interval_counts_from_the_end_of_a_long_run() -> None:
    clock = iter([0.0, 30.0, 35.0, 41.0, 42.0]).__next__
    gate = TickGate(TEN, clock=clock)
    # Starts at 0, ends at 30 (a slow sweep); a tick at 35 is too soon, one at 41 runs.
    assert gate.run(lambda: "swept") == "swept"
    assert gate.run(lambda: "again") is None
    assert gate.run(lambda: "again") == "again"


def test_a_run_that_raises_still_ends() -> None:
    gate = TickGate(timedelta(0))

    def broken() -> None:
        raise RuntimeError("API unreachable")

    with pytest.raises(RuntimeError):
        gate.run(broken)
    assert gate.run(lambda: "next") == "next"
