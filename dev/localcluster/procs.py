"""Child processes that cannot outlive the harness.

Every process is started with ``PR_SET_PDEATHSIG=SIGKILL`` (the kernel kills it when the thread
that started it goes away, even on SIGKILL of the Python parent) in its own process group (so a
Ctrl-C reaches only Python, which then stops the children in order), with stdout and stderr
appended to one log file. :meth:`Proc.stop` sends SIGTERM, waits, then SIGKILLs.

A :class:`Component` describes a process to run next to the cluster (a function under
development, a Broker): later work hands a list of them to the cluster or the supervisor.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

_PR_SET_PDEATHSIG: Final = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died before prctl took effect: then nobody would kill us.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


@dataclass
class Component:
    """A process to run beside the control plane.

    ``ready`` is polled (with the cluster's kubeconfig in ``KUBECONFIG``) until it returns True;
    None means "started is ready".
    """

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    ready: Callable[[], bool] | None = None
    ready_timeout: float = 60.0


class Proc:
    """One running child process and its log."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        # What it was started with beyond our own environment, for respawn().
        self.env = dict(env or {})
        self.cwd = cwd
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        with log_path.open("ab") as log:
            log.write(f"# {time.strftime('%H:%M:%S')} starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=cwd,
                close_fds=True,
                process_group=0,
                # preexec_fn with threads running is safe here: it only makes two syscalls.
                preexec_fn=_die_with_parent(os.getpid()),  # noqa: PLW1509
            )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def respawn(self) -> Proc:
        """The same command started again (same environment, directory and log file, which
        gets a new "starting" line), as a supervisor restarts a process that exited. Like any
        Proc, the new one dies with the thread that calls this."""
        return Proc(self.name, self.argv, self.log_path, env=self.env, cwd=self.cwd)

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def terminate(self) -> None:
        """Sends SIGTERM (to the process group, so helpers it spawned go too)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)

    def wait(self, timeout: float) -> bool:
        try:
            self.popen.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns once the process is reaped."""
        self.terminate()
        if not self.wait(grace):
            self.kill()
            self.wait(10.0)


def stop_all(procs: Sequence[Proc], grace: float = 10.0) -> None:
    """Stops ``procs`` in the given order: SIGTERM each, wait, SIGKILL whatever remains."""
    for p in procs:
        p.terminate()
        deadline = time.monotonic() + grace
        if not p.wait(deadline - time.monotonic()):
            p.kill()
            p.wait(10.0)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The state letter follows the parenthesised command name.
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def names_path(args: list[str], directory: str) -> bool:
    """True if an argument is ``directory`` or a path inside it (``/a/b`` does not name
    ``/a/b2/x``)."""
    d = directory.rstrip("/")
    return any(a == d or a.endswith("=" + d) or d + "/" in a for a in args)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (all held open until all are chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
