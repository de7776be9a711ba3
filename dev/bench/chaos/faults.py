"""The faults the harness injects from outside, and the evidence of where the kills landed.

update-annotations is killed with SIGKILL (its whole process group, as the kubelet kills a
container's processes) at random moments and right after the harness sees a state write. No
hook in the product tells the harness when a move is half done: the trigger is the holder's
state annotation changing on the API server (a watch), which is exactly the moment the state
is written and the pod not yet removed. Whether a kill landed in that window is read afterwards
from the function's own log: a move whose ``plan: move`` line (logged once the state write
succeeded) has no line saying the pod was deleted, and no ``event handled`` line, before the
process's log ends, was interrupted between the state write and the removal.

The Stack's watchdog starts the function again (as the kubelet would); the control plane's
restarts are ``Cluster.restart`` (SIGKILL, then the same command line again) and
``Cluster.revive`` for what gave up meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dev.stack.stack import Stack

JSON = dict[str, Any]
TARGET = "update-annotations"


@dataclass(frozen=True)
class Kill:
    at: float  # seconds since the storm started
    trigger: str  # "state-write" or "random"
    what: str  # the holder whose state was written, for state-write kills
    pid: int
    incarnation: int  # 0 for the first process, n after n restarts


@dataclass
class Killer:
    """SIGKILLs update-annotations, never a process that has served for less than
    ``min_uptime`` seconds: a function killed again before it could work a little would just
    be down, and every delivery would run out of retries (locally nothing buffers requests for
    a restarting function, where Knative's activator would)."""

    stack: Stack
    rng: random.Random
    kill_on_write: float
    min_uptime: float
    t0: float = field(default_factory=time.monotonic)
    enabled: bool = False
    kills: list[Kill] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_state_write(self, what: str) -> None:
        with self._lock:
            if not self.enabled or self.rng.random() >= self.kill_on_write:
                return
        self.kill("state-write", what)

    def kill(self, trigger: str, what: str = "") -> bool:
        with self._lock:
            now = time.monotonic()
            server = self.stack.servers.get(TARGET)
            proc = server.proc if server is not None else None
            if (
                not self.enabled
                or server is None
                or proc is None
                or not proc.alive()
                or server.ready_since is None
                or now - server.ready_since < self.min_uptime
                # Killed already, not reaped yet: the same process is not killed twice.
                or any(k.pid == proc.pid for k in self.kills)
            ):
                return False
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            self.kills.append(
                Kill(round(now - self.t0, 3), trigger, what, proc.pid, server.restarts)
            )
            return True


def schedule(
    rng: random.Random, window: float, apiserver: int, etcd: int
) -> list[tuple[float, str]]:
    """When to restart what: spread over the first 80 % of the fault window, at least 12 s
    apart (each restart must be over, and the pipeline catching up, before the next)."""
    names = ["kube-apiserver"] * apiserver + ["etcd"] * etcd
    rng.shuffle(names)
    if not names:
        return []
    slot = window * 0.8 / len(names)
    plan = []
    for i, name in enumerate(names):
        start = 5.0 + i * slot
        plan.append((round(start + rng.uniform(0, max(slot - 12.0, 0.0)), 2), name))
    return plan


# -- evidence: where the kills landed ---------------------------------------------------------

_DONE_PREFIXES = ("deleted pod ", "evicted pod ")
_DONE_SUFFIXES = (" already gone", " was already replaced")


def incarnations(log_text: str) -> list[list[JSON]]:
    """The JSON lines of each process of a function, split at the harness's "starting" lines."""
    runs: list[list[JSON]] = []
    for line in log_text.splitlines():
        if line.startswith("# ") and " starting: " in line:
            runs.append([])
            continue
        if not runs or not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError):
            runs[-1].append(json.loads(line))
    return runs


def interrupted_moves(lines: Iterable[JSON]) -> list[JSON]:
    """Moves whose state was written but whose removal the process never finished: the
    ``plan: move`` (or ``clear-and-move``) lines with no later removal, nor the end of the
    handling of that event, in the same process."""
    pending: dict[str, JSON] = {}
    for line in lines:
        msg = str(line.get("msg", ""))
        ce = str(line.get("ce_id", ""))
        if msg.startswith(("plan: move ", "plan: clear-and-move ")):
            pending[ce] = line
        elif ce in pending and (
            msg.startswith(_DONE_PREFIXES) or msg.endswith(_DONE_SUFFIXES) or msg == "event handled"
        ):
            del pending[ce]
    return list(pending.values())


def kills_in_window(log_path: Path, kills: list[Kill]) -> JSON:
    """Which kills landed between a state write and the removal it was for."""
    try:
        runs = incarnations(log_path.read_text(errors="replace"))
    except OSError:
        runs = []
    landed: list[JSON] = []
    cut_total = 0
    for kill in kills:
        if kill.incarnation >= len(runs):
            continue
        cut = interrupted_moves(runs[kill.incarnation])
        cut_total += len(cut)
        if cut:
            landed.append(
                {
                    "at": kill.at,
                    "trigger": kill.trigger,
                    "pid": kill.pid,
                    "moves_cut": [
                        {"subject": c.get("ce_subject"), "time": c.get("time"), "msg": c.get("msg")}
                        for c in cut
                    ],
                }
            )
    return {
        "kills": len(kills),
        "kills_in_window": len(landed),
        "moves_cut": cut_total,
        "detail": landed,
    }
