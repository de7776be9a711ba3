"""A network namespace of the local stack's own, and loopback-to-loopback port forwards into it.

Knative's data plane binaries bind fixed ports on every interface: the in-memory channel
dispatcher 8080 and 8443 (Go constants of ``pkg/reconciler/inmemorychannel/dispatcher``), the
ApiServerSource adapter its health probe on 8080 (a constant of knative.dev/pkg). Run on the
machine's own network, two local stacks (the tests and the bench, say) would fight over them,
and each would listen beyond loopback. So each stack runs those processes in a network
namespace of its own (``ip netns add``: needs root, or CAP_SYS_ADMIN and CAP_NET_ADMIN), whose
only interface is its own loopback: whatever they bind is reachable from nowhere but that
namespace, and every stack has its own 8080.

They still have to reach the API server and the functions, and the stack has to reach the
Broker ingress. No veth, no routing: a :class:`Forward` listens on 127.0.0.1 in one namespace
and connects to 127.0.0.1 in the other. A socket belongs to the namespace its creating thread
was in, and ``setns(2)`` moves just the calling thread (network namespaces, unlike mount and
user namespaces, allow that in a multi-threaded process), so a thread steps into the namespace
to create a socket and steps back. Forwarding ns -> host keeps the port number, so a kubeconfig
or a function URL means the same inside as outside.

A Forward also tells whether a request is outstanding, without parsing HTTP: on a connection
whose last bytes went from the client to the server, the client is waiting for an answer
(HTTP/1.1 clients do not pipeline). :meth:`Forward.busy` counts such connections; the stack's
``wait_idle`` asks every Forward.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import selectors
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

CLONE_NEWNET: Final = 0x40000000
NETNS_DIR: Final = Path("/run/netns")
# `ip netns exec NAME` bind-mounts the files of /etc/netns/NAME over /etc: a hosts file here
# is what the namespace's processes resolve names with.
ETC_NETNS: Final = Path("/etc/netns")
PREFIX: Final = "knr-"
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class NetnsError(RuntimeError):
    pass


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NetnsError(f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(path: Path | None) -> Iterator[None]:
    """Run the block's socket creations in the namespace at ``path`` (None: stay where we are)."""
    if path is None:
        yield
        return
    home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


def available() -> str | None:
    """None when this process can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run as root or with sudo"
    try:
        subprocess.run(["ip", "-V"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return "the ip command (iproute2) is not installed"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete namespaces left by stacks whose process is gone (named ``knr-<pid>-<n>``)."""
    removed = []
    for entry in NETNS_DIR.glob(f"{PREFIX}*") if NETNS_DIR.is_dir() else []:
        parts = entry.name.split("-")
        if len(parts) >= 2 and parts[1].isdigit() and not _alive(int(parts[1])):
            subprocess.run(["ip", "netns", "delete", entry.name], capture_output=True, check=False)
            shutil.rmtree(ETC_NETNS / entry.name, ignore_errors=True)
            removed.append(entry.name)
    return removed


class NetNamespace:
    """One network namespace with its loopback up; ``delete`` removes it (idempotent)."""

    _count = 0
    _lock = threading.Lock()

    def __init__(self) -> None:
        with NetNamespace._lock:
            NetNamespace._count += 1
            n = NetNamespace._count
        self.name = f"{PREFIX}{os.getpid()}-{n}"
        self.path = NETNS_DIR / self.name
        self.created = False

    def create(self, hosts: Sequence[str] = ()) -> NetNamespace:
        """Make the namespace; ``hosts`` are names that resolve to 127.0.0.1 inside it."""
        why = available()
        if why:
            raise NetnsError(why)
        remove_stale()
        self._ip("netns", "add", self.name)
        self.created = True
        self._ip("-n", self.name, "link", "set", "lo", "up")
        etc = ETC_NETNS / self.name
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(
            "127.0.0.1 localhost\n::1 localhost\n"
            + "".join(f"127.0.0.1 {name}\n" for name in hosts)
        )
        return self

    def delete(self) -> None:
        if self.created:
            subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)
            shutil.rmtree(ETC_NETNS / self.name, ignore_errors=True)
            self.created = False

    def argv(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` inside this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def listening(self, port: int) -> bool:
        """Whether something in the namespace accepts connections on 127.0.0.1:port."""
        with entered(self.path):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        with s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    def sockets(self) -> list[str]:
        """Every listening TCP socket of the namespace (``ss -ltn``), for the loopback check."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.name, "ss", "-Hltn"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return [line.split()[3] for line in out.splitlines() if line.strip()]

    @staticmethod
    def _ip(*args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Forward:
    """Accept on 127.0.0.1:``listen_port`` in one namespace, connect to 127.0.0.1:``port`` in
    another; ``None`` for a namespace is the process's own."""

    def __init__(
        self,
        name: str,
        *,
        listen_in: Path | None,
        listen_port: int,
        connect_in: Path | None,
        port: int,
    ) -> None:
        self.name = name
        self.listen_in = listen_in
        self.listen_port = listen_port
        self.connect_in = connect_in
        self.port = port
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._outstanding: set[int] = set()
        self._last_activity = time.monotonic()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()

    def start(self) -> Forward:
        with entered(self.listen_in):
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.listen_port))
        listener.listen(128)
        listener.settimeout(0.2)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, name=f"fwd-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            for conn in list(self._conns):
                with contextlib.suppress(OSError):
                    conn.close()

    def busy(self) -> int:
        """Connections on which a request went out and no answer came back yet."""
        with self._lock:
            return len(self._outstanding)

    def quiet_for(self) -> float:
        with self._lock:
            return time.monotonic() - self._last_activity

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            with entered(self.connect_in):
                upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            upstream.connect(("127.0.0.1", self.port))
        except OSError as exc:
            # As a Service with no ready endpoint: the connection is refused/reset.
            log.debug("%s: cannot reach 127.0.0.1:%d: %s", self.name, self.port, exc)
            client.close()
            return
        key = id(client)
        with self._lock:
            self._conns.update((client, upstream))
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, upstream)
        sel.register(upstream, selectors.EVENT_READ, client)
        open_ends = 2
        try:
            while open_ends and not self._stop.is_set():
                for sk, _ in sel.select(timeout=0.5):
                    src = sk.fileobj
                    dst = sk.data
                    assert isinstance(src, socket.socket) and isinstance(dst, socket.socket)
                    try:
                        data = src.recv(65536)
                    except OSError:
                        data = b""
                    with self._lock:
                        self._last_activity = time.monotonic()
                        if data and src is client:
                            self._outstanding.add(key)
                        elif data or src is upstream:
                            # Bytes of an answer, or the server closed: nothing is awaited.
                            self._outstanding.discard(key)
                    if not data:
                        sel.unregister(src)
                        open_ends -= 1
                        with contextlib.suppress(OSError):
                            dst.shutdown(socket.SHUT_WR)
                        continue
                    try:
                        dst.sendall(data)
                    except OSError:
                        open_ends = 0
                        break
        finally:
            sel.close()
            with self._lock:
                self._outstanding.discard(key)
                self._conns.discard(client)
                self._conns.discard(upstream)
            client.close()
            upstream.close()
