"""At most one full run per interval for the functions a PingSource drives.

sweep-failures lists every pod of the cluster on a tick; assess-nodes' review, label-nodes,
annotate-usage and rebalance-nodes every node (and Prometheus, and pods). Their PingSources
tick every 30 s, but a tick is only a CloudEvent: anything that reaches the function's Service
can post one as often as it likes, and each would start a full run. A tick that comes while a
run is going on, or sooner than ``min_tick_interval`` after the last run ended, is answered 202
and logged: there is nothing to do that the last run did not just do, and nothing a retry would
change. The bound is per process (a function scaled to several pods may run once per pod),
which is what protects the API server from one caller; NetworkPolicies keep callers out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class TickVerdict:
    """Whether a tick starts a run, and why not when it does not."""

    run: bool
    why: str = ""


def due(running: bool, last_ended: float | None, now: float, every: timedelta) -> TickVerdict:
    """The decision, pure: ``last_ended`` and ``now`` on one monotonic clock, in seconds."""
    if running:
        return TickVerdict(False, "a run is going on")
    if last_ended is None or every <= timedelta(0):
        return TickVerdict(True)
    since = now - last_ended
    if since >= every.total_seconds():
        return TickVerdict(True)
    return TickVerdict(
        False,
        f"the last run ended {since:.1f}s ago; at most one per {every.total_seconds():g}s "
        "(KN_RESCHEDULER_MIN_TICK_INTERVAL)",
    )


class TickGate:
    """Runs the work of a tick when ``due`` says so (thread-safe)."""

    def __init__(self, every: timedelta, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self._clock = clock
        self._running = False
        self._last_ended: float | None = None
        self._lock = threading.Lock()

    def run(self, work: Callable[[], T]) -> T | None:
        """``work()``'s result, or None (and a log line) for a tick that starts no run."""
        with self._lock:
            verdict = due(self._running, self._last_ended, self._clock(), self.every)
            if verdict.run:
                self._running = True
        if not verdict.run:
            log.info("tick not run: %s", verdict.why)
            return None
        try:
            return work()
        finally:
            with self._lock:
                self._running = False
                self._last_ended = self._clock()
