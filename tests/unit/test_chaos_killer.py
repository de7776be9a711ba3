"""The chaos suite's killer: SIGKILL for a process that has served long enough, once.

The process is a real one (``sleep``), in a stand-in for the stack's function table: the
killer only reads a server's process, since when it serves, and how often it was restarted.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dev.bench.chaos.faults import TARGET, Killer
from dev.localcluster.procs import Proc


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Any]:
    proc = Proc("sleeper", ["sleep", "60"], tmp_path / "sleeper.log")
    yield SimpleNamespace(proc=proc, ready_since=time.monotonic(), restarts=0)
    proc.stop(grace=1.0)


def killer(server: Any, **kw: Any) -> Killer:
    k = Killer(
        SimpleNamespace(servers={TARGET: server}),  # type: ignore[arg-type]
        random.Random(1),
        kill_on_write=kw.pop("kill_on_write", 1.0),
        min_uptime=kw.pop("min_uptime", 0.0),
    )
    k.enabled = True
    return k


def test_a_process_that_served_long_enough_is_killed(server: Any) -> None:
    k = killer(server)
    assert k.kill("random") is True
    assert server.proc.wait(5.0) and server.proc.returncode == -9
    assert [(kill.trigger, kill.pid) for kill in k.kills] == [("random", server.proc.pid)]


def test_a_process_is_never_killed_twice(server: Any) -> None:
    real = server.proc
    # Killed, and not reaped yet: it still looks alive for a moment.
    server.proc = SimpleNamespace(pid=real.pid, alive=lambda: True)
    k = killer(server)
    k.on_state_write("ReplicaSet shop/web-7d9c8b6f4")
    k.on_state_write("Pod shop/solo")
    assert len(k.kills) == 1 and k.kills[0].trigger == "state-write"
    server.proc = real


def test_a_process_that_just_came_back_is_left_alone(server: Any) -> None:
    k = killer(server, min_uptime=30.0)
    assert k.kill("random") is False
    assert server.proc.alive() and k.kills == []


def test_nothing_is_killed_while_the_faults_are_off(server: Any) -> None:
    k = killer(server)
    k.enabled = False
    k.on_state_write("ReplicaSet shop/web-7d9c8b6f4")
    assert server.proc.alive() and k.kills == []
