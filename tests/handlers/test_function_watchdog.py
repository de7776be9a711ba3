"""A killed function comes back on the same URL, as the kubelet restarts a container; a stopped
one stays stopped and leaves no process behind.

detect-failures needs no API server, so its real gunicorn process serves here without a
cluster (the kubeconfig it is given is never read).
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from dev.localcluster.procs import pid_alive
from dev.stack.functions import FunctionServer, Watchdog, environment


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "metrics", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def wait_until(check: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_killed_function_is_started_again_on_the_same_url(tmp_path: Path) -> None:
    server = FunctionServer(
        "detect-failures", tmp_path, env=environment(tmp_path / "unused-kubeconfig")
    ).start()
    watchdog = Watchdog({"detect-failures": server}).start()
    try:
        assert server.proc is not None and server.ready_since is not None
        url, first, up = server.url, server.proc.pid, server.ready_since
        os.killpg(first, signal.SIGKILL)
        assert wait_until(lambda: server.proc is not None and server.proc.pid != first)
        assert wait_until(lambda: answers(url))
        assert server.url == url and server.restarts == 1
        assert not pid_alive(first)
        # Serving again, since a later moment (what the chaos suite waits for between kills).
        assert wait_until(lambda: (server.ready_since or 0) > up)
    finally:
        watchdog.stop(then=server.stop)
    assert server.proc is None


def test_a_function_stopped_on_purpose_is_not_started_again(tmp_path: Path) -> None:
    server = FunctionServer(
        "detect-failures", tmp_path, env=environment(tmp_path / "unused-kubeconfig")
    ).start()
    watchdog = Watchdog({"detect-failures": server}).start()
    assert server.proc is not None
    pid = server.proc.pid
    watchdog.stop(then=server.stop)
    time.sleep(0.3)
    assert server.proc is None and server.restarts == 0 and server.ready_since is None
    assert not pid_alive(pid)
    assert not answers(server.url)
