"""Each function as its own process, started exactly as its container starts it.

The command is the image's command (gunicorn with functions/gunicorn.conf.py and
functions-framework's app factory), so what the tests exercise is what ships. A server whose
process died (killed, crashed) can be started again on the same port (``restart``), as the
kubelet restarts a container: its URL, the one the Broker delivers to, stays valid. A TLS server can
also require client certificates (``client_tls``: its CA goes to TLS_CLIENT_CA_FILE, and the
readiness check presents the client certificate, as the API server would).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import ssl
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from dev.localcluster.kubelet import LOCAL_FUNCTION_SETTINGS
from dev.localcluster.procs import Proc
from dev.stack.webhook import ClientTLS

log = logging.getLogger(__name__)

ROOT: Final = Path(__file__).resolve().parents[2]
FUNCTIONS: Final = (
    "detect-failures",
    "update-annotations",
    "mutate-admission",
    "sweep-failures",
    "assess-nodes",
    "label-nodes",
    "annotate-usage",
    "score-nodes",
    "rebalance-nodes",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(function: str) -> list[str]:
    """The container's command line for ``function`` (see the Dockerfile)."""
    app = f'functions_framework:create_app(target="handle", source="functions/{function}/main.py")'
    return [sys.executable, "-m", "gunicorn", "-c", "functions/gunicorn.conf.py", app]


class FunctionServer:
    """One function served by gunicorn on 127.0.0.1, stopped with its process group."""

    def __init__(
        self,
        function: str,
        log_dir: Path,
        *,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        tls: tuple[Path, Path] | None = None,
        ca_file: Path | None = None,
        client_tls: ClientTLS | None = None,
    ) -> None:
        if function not in FUNCTIONS:
            raise ValueError(f"unknown function {function!r}")
        self.function = function
        self.port = port or free_port()
        self.tls = tls
        self.ca_file = ca_file
        self.client_tls = client_tls
        self.log_path = log_dir / f"{function}.log"
        self.env = {
            "PYTHONPATH": str(ROOT),
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            **(env or {}),
        }
        if tls:
            self.env["TLS_CERT_FILE"], self.env["TLS_KEY_FILE"] = str(tls[0]), str(tls[1])
        if client_tls:
            if not tls:
                raise ValueError("client certificates need a TLS server")
            self.env["TLS_CLIENT_CA_FILE"] = str(client_tls.ca)
        self.proc: Proc | None = None
        # How often the process was started again after it died.
        self.restarts = 0
        # time.monotonic() when the current process first answered; None while it does not.
        self.ready_since: float | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}/"

    def start(self, timeout: float = 30.0) -> FunctionServer:
        self.proc = Proc(
            self.function, command(self.function), self.log_path, env=self.env, cwd=ROOT
        )
        deadline = time.monotonic() + timeout
        context = self.ssl_context()
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise RuntimeError(
                    f"{self.function} exited with {self.proc.returncode}:\n{self.proc.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "metrics", timeout=1, context=context):
                    self.ready_since = time.monotonic()
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"{self.function} not answering on {self.url} after {timeout:.0f}s")

    def ssl_context(self, *, with_client_cert: bool = True) -> ssl.SSLContext | None:
        """A client context that trusts this server (and presents the client certificate
        when the server requires one and ``with_client_cert``)."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.client_tls and with_client_cert:
            context.load_cert_chain(str(self.client_tls.crt), str(self.client_tls.key))
        return context

    def metrics_text(self, timeout: float = 10.0) -> str:
        """What the function serves on GET /metrics (its Prometheus exposition)."""
        with urllib.request.urlopen(
            self.url + "metrics", timeout=timeout, context=self.ssl_context()
        ) as response:
            return str(response.read().decode())

    def exited(self) -> bool:
        """True when the process was started, not stopped by us, and is gone (killed, crashed)."""
        return self.proc is not None and not self.proc.alive()

    def restart(self, timeout: float = 30.0) -> FunctionServer:
        """Start the function again on the same port after its process died."""
        self.ready_since = None
        if self.proc is not None:
            # Whatever is left of its process group (workers of a killed master) goes too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10.0)
            self.proc = None
        self.restarts += 1
        return self.start(timeout)

    def stop(self) -> None:
        self.ready_since = None
        if self.proc is not None:
            self.proc.stop(grace=5.0)
            self.proc = None

    def __enter__(self) -> FunctionServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Watchdog:
    """Starts again every server of ``servers`` whose process died, as the kubelet restarts a
    container: polled every ``every`` seconds, a failed restart tried again on the next round.

    A restarted process dies with the thread that started it (PR_SET_PDEATHSIG), here the
    watchdog's own: ``stop()`` the servers first (``stop(then=...)`` does it in that order),
    then the watchdog.
    """

    def __init__(self, servers: Mapping[str, FunctionServer], every: float = 0.1) -> None:
        self.servers = servers
        self.every = every
        # Held during a restart, so that stopping never races one.
        self._lock = threading.Lock()
        self._stopping = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watchdog:
        self._thread = threading.Thread(target=self._loop, name="function-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self, then: Callable[[], None] | None = None) -> None:
        """No restart after this returns; ``then`` runs before the thread ends (stop the
        servers there: the processes it restarted die with it)."""
        with self._lock:
            self._stopping = True
        self._wake.set()
        try:
            if then is not None:
                then()
        finally:
            if self._thread is not None:
                self._thread.join(timeout=35)
                self._thread = None

    def _loop(self) -> None:
        failed: set[str] = set()
        while not self._wake.wait(self.every):
            for name, server in list(self.servers.items()):
                with self._lock:
                    if self._stopping:
                        return
                    if not server.exited() and name not in failed:
                        continue
                    code = server.proc.returncode if server.proc is not None else None
                    log.warning("function %s exited (%s): starting it again", name, code)
                    try:
                        server.restart()
                    except (RuntimeError, TimeoutError, OSError) as exc:
                        log.warning("could not restart %s: %s", name, exc)
                        failed.add(name)
                    else:
                        failed.discard(name)


def environment(kubeconfig: Path, **extra: str) -> dict[str, str]:
    """The environment a function gets locally: the cluster's credentials plus settings."""
    env = {"KUBECONFIG": str(kubeconfig), "KN_RESCHEDULER_LOG_LEVEL": "INFO"}
    # The fake kubelet retries on a compressed clock; the functions' thresholds follow it.
    env.update(LOCAL_FUNCTION_SETTINGS)
    # The tests tick on demand, one tick right after another; production's bound is tested in
    # tests/handlers/test_ticks.py.
    env.setdefault("KN_RESCHEDULER_MIN_TICK_INTERVAL", "0s")
    env.update(extra)
    # The local demo namespace list must not include the test namespaces by accident.
    env.setdefault(
        "KN_RESCHEDULER_NAMESPACE", os.environ.get("KN_RESCHEDULER_NAMESPACE", "kn-rescheduler")
    )
    return env
