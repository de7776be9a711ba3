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

Faults (the chaos suite, :mod:`pipeline.faults`): a Forward given a :class:`FaultPolicy`
(:meth:`Forward.set_faults`) relays the connections it accepts from then on one HTTP/1.1
request at a time (Content-Length or chunked framing; the data plane's Go clients speak HTTP/1.1
to a plain ``http://`` URL, never h2c), and asks the policy about each request: answer ``202``
itself and drop it, reset the client's connection before the request goes on or after the
server answered (a TCP RST: what a dying pod or a broken node gives the sender), hold it back,
and send it once more later on a fresh connection. Connections accepted before stay raw:
``set_faults`` closes those that are idle (an HTTP client opens a new one for its next request,
as when a server closes a kept-alive connection) and those that are busy once their answer is
through. Without a policy nothing changes: bytes are relayed as they come.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import enum
import itertools
import logging
import os
import selectors
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

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


# -- HTTP/1.1 framing, for a Forward with faults -------------------------------------------------

MAX_HEAD: Final = 64 * 1024
ACCEPTED: Final = b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"


class FramingError(RuntimeError):
    """Bytes that are not an HTTP/1.1 message (or the peer closed in the middle of one)."""


@dataclass(frozen=True)
class Message:
    """One HTTP/1.1 request or answer as it went over the wire: ``raw`` is the exact bytes
    (head and body, chunked framing included), ``body`` the payload without that framing."""

    start_line: str
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes
    raw: bytes

    @property
    def status(self) -> int:
        """An answer's status code (0 for a request)."""
        parts = self.start_line.split(" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0

    @property
    def closes(self) -> bool:
        """Whether the connection ends after this message (``Connection: close``)."""
        return "close" in self.headers.get("connection", "").lower()


class _Reader:
    """Reads whole messages off a socket; ``stop`` ends a wait for bytes that never come."""

    def __init__(self, sock: socket.socket, stop: threading.Event) -> None:
        self.sock = sock
        self.stop = stop
        self.buf = b""
        self.eof = False
        sock.settimeout(0.5)

    def _fill(self) -> bool:
        while not self.stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                self.eof = True
                return False
            self.buf += data
            return True
        return False

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise FramingError("connection closed inside a message")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD or not self._fill():
                raise FramingError("connection closed inside a chunked body")
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line + b"\r\n"

    def read(
        self, *, answer_to: str = "", first_byte: Callable[[], None] | None = None
    ) -> Message | None:
        """The next message; None when the peer closed cleanly between messages. A request
        unless ``answer_to`` names the request method it answers."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise FramingError("message head too long")
            had = bool(self.buf)
            if not self._fill():
                if had:
                    raise FramingError("connection closed inside a message head")
                return None
            if first_byte is not None and not had:
                first_byte()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        raw = head + b"\r\n\r\n"
        status = Message(lines[0], headers, b"", raw).status
        if answer_to and (answer_to == "HEAD" or status in (204, 304) or 100 <= status < 200):
            return Message(lines[0], headers, b"", raw)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = b""
            while True:
                size_line = self._line()
                raw += size_line
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers, up to the empty line.
                    while True:
                        trailer = self._line()
                        raw += trailer
                        if trailer == b"\r\n":
                            break
                    break
                chunk = self._take(size + 2)
                raw += chunk
                body += chunk[:-2]
        elif "content-length" in headers:
            body = self._take(int(headers["content-length"]))
            raw += body
        elif answer_to:
            # An answer with neither: its body runs until the server closes.
            while self._fill():
                pass
            body, self.buf = self.buf, b""
            raw += body
            headers["connection"] = "close"
        else:
            body = b""
        return Message(lines[0], headers, body, raw)


class Action(enum.Enum):
    PASS = "pass"
    # Answer 202 Accepted to the sender and relay nothing.
    ACCEPT_AND_DROP = "accept-and-drop"
    # Reset the sender's connection before the request goes on.
    RESET_BEFORE = "reset-before"
    # Relay the request and the server's whole answer's arrival, then reset the sender's
    # connection instead of relaying that answer.
    RESET_AFTER = "reset-after"


@dataclass(frozen=True)
class Decision:
    action: Action = Action.PASS
    # Seconds the request is held back before anything else is done with it.
    hold: float = 0.0


PASS: Final = Decision()


class FaultPolicy(Protocol):
    """What a Forward asks about each request once faults are set (pipeline.faults)."""

    def decide(self, forward: str, request: Message) -> Decision: ...

    def answered(self, forward: str, request: Message, answer: Message) -> float | None:
        """After an answer was relayed: seconds after which to send the same request once more
        on a new connection (its answer discarded), or None."""
        ...


def _status(data: bytes) -> int | None:
    """The status of an HTTP/1.x answer from its first bytes, None if they are not one."""
    parts = data[:16].split(b" ", 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/1.") and parts[1][:3].isdigit():
        return int(parts[1][:3])
    return None


def _reset(sock: socket.socket) -> None:
    """Close with an RST rather than a FIN: the peer reads ECONNRESET, as from a dead pod."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class Forward:
    """Accept on 127.0.0.1:``listen_port`` in one namespace, connect to ``host``:``port`` in
    another; ``None`` for a namespace is the process's own. ``host`` is 127.0.0.1 but for an
    API server that listens elsewhere on the machine (a real-node cluster's, on its nodes'
    network)."""

    def __init__(
        self,
        name: str,
        *,
        listen_in: Path | None,
        listen_port: int,
        connect_in: Path | None,
        port: int,
        listener: socket.socket | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.name = name
        self.host = host
        # A socket already bound to listen_port (a port reserved up front), used as it is.
        self._bound = listener
        self.listen_in = listen_in
        self.listen_port = listen_port
        self.connect_in = connect_in
        self.port = port
        self.faults: FaultPolicy | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._keys = itertools.count()
        self._outstanding: set[int] = set()
        # When an answer last said the request failed (>= 400, or no answer): a Knative
        # dispatcher may retry it after a backoff, with nothing on the wire meanwhile.
        self._last_failure: float | None = None
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        # Raw connections, and those of them to close once nothing is awaited on them.
        self._raw: set[int] = set()
        self._retire: set[int] = set()

    def start(self) -> Forward:
        listener = self._bound
        if listener is None:
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

    def set_faults(self, policy: FaultPolicy | None) -> None:
        """Consult ``policy`` about every request from now on (None: no more faults; the
        connections already framed stay framed and pass everything)."""
        with self._lock:
            self.faults = policy
            if policy is not None:
                self._retire.update(self._raw)

    def busy(self) -> int:
        """Connections on which a request went out and no answer came back yet (with faults:
        also requests held back, and repeats not yet sent or answered)."""
        with self._lock:
            return len(self._outstanding)

    def last_failure(self) -> float | None:
        """``time.monotonic()`` of the last failed answer (or lost one), None if none yet."""
        with self._lock:
            return self._last_failure

    def _failed(self, status: int | None) -> None:
        if status is None or status >= 400:
            with self._lock:
                self._last_failure = time.monotonic()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            # Small requests and answers go out at once: without it Nagle's algorithm and
            # delayed ACKs add ~40 ms to many a delivery through the forward.
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            relay = self._relay if self.faults is None else self._relay_http
            threading.Thread(target=relay, args=(client,), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        try:
            with entered(self.connect_in):
                upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream.connect((self.host, self.port))
        except OSError as exc:
            # As a Service with no ready endpoint: the connection is refused/reset.
            log.debug("%s: cannot reach %s:%d: %s", self.name, self.host, self.port, exc)
            return None
        return upstream

    def _relay(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None:
            client.close()
            return
        key = next(self._keys)
        with self._lock:
            self._conns.update((client, upstream))
            self._raw.add(key)
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, upstream)
        sel.register(upstream, selectors.EVENT_READ, client)
        open_ends = 2
        try:
            while open_ends and not self._stop.is_set():
                ready = sel.select(timeout=0.5)
                if not ready:
                    with self._lock:
                        if key in self._retire and key not in self._outstanding:
                            # Faults were switched on: this kept-alive connection ends, so
                            # the client's next request comes on a framed one.
                            break
                for sk, _ in ready:
                    src = sk.fileobj
                    dst = sk.data
                    assert isinstance(src, socket.socket) and isinstance(dst, socket.socket)
                    try:
                        data = src.recv(65536)
                    except OSError:
                        data = b""
                    with self._lock:
                        awaited = key in self._outstanding
                        if data and src is client:
                            self._outstanding.add(key)
                        elif data or src is upstream:
                            # Bytes of an answer, or the server closed: nothing is awaited.
                            self._outstanding.discard(key)
                    if awaited and src is upstream:
                        # The first bytes of an answer carry its status line; none: lost.
                        self._failed(_status(data) if data else None)
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
                self._raw.discard(key)
                self._retire.discard(key)
                self._conns.discard(client)
                self._conns.discard(upstream)
            client.close()
            upstream.close()

    # -- with faults ------------------------------------------------------------------------

    def _awaiting(self, key: int, waiting: bool) -> None:
        with self._lock:
            if waiting:
                self._outstanding.add(key)
            else:
                self._outstanding.discard(key)

    def _relay_http(self, client: socket.socket) -> None:
        """One request at a time, each put to the fault policy (see the module docstring)."""
        key = next(self._keys)
        with self._lock:
            self._conns.add(client)
        reader = _Reader(client, self._stop)
        upstream: socket.socket | None = None
        answers: _Reader | None = None
        try:
            while not self._stop.is_set():
                request = reader.read(first_byte=lambda: self._awaiting(key, True))
                if request is None:
                    break
                self._awaiting(key, True)
                policy = self.faults
                decision = policy.decide(self.name, request) if policy is not None else PASS
                if decision.hold > 0 and self._stop.wait(decision.hold):
                    break
                if decision.action is Action.ACCEPT_AND_DROP:
                    client.sendall(ACCEPTED)
                    self._awaiting(key, False)
                    if request.closes:
                        break
                    continue
                if decision.action is Action.RESET_BEFORE:
                    self._failed(None)
                    _reset(client)
                    break
                if upstream is None:
                    upstream = self._connect()
                    if upstream is None:
                        break
                    with self._lock:
                        self._conns.add(upstream)
                    answers = _Reader(upstream, self._stop)
                assert answers is not None
                upstream.sendall(request.raw)
                method = request.start_line.split(" ", 1)[0]
                answer = answers.read(answer_to=method)
                # Interim answers (100 Continue) go through as they are; the final one follows.
                while answer is not None and 100 <= answer.status < 200:
                    client.sendall(answer.raw)
                    answer = answers.read(answer_to=method)
                if answer is None:
                    self._failed(None)
                    break
                self._failed(answer.status)
                if decision.action is Action.RESET_AFTER:
                    _reset(client)
                    break
                client.sendall(answer.raw)
                self._awaiting(key, False)
                if policy is not None:
                    again = policy.answered(self.name, request, answer)
                    if again is not None:
                        self._repeat(request, again)
                if answer.closes or request.closes:
                    break
        except (OSError, FramingError) as exc:
            log.debug("%s: connection ends: %s", self.name, exc)
        finally:
            with self._lock:
                self._outstanding.discard(key)
                self._conns.discard(client)
                if upstream is not None:
                    self._conns.discard(upstream)
            client.close()
            if upstream is not None:
                upstream.close()

    def _repeat(self, request: Message, after: float) -> None:
        """Send ``request`` again ``after`` s from now on a new connection; the answer is read
        and dropped. Counted as outstanding from now until it is answered."""
        key = next(self._keys)
        self._awaiting(key, True)

        def send() -> None:
            upstream: socket.socket | None = None
            try:
                if self._stop.wait(after):
                    return
                upstream = self._connect()
                if upstream is None:
                    return
                upstream.sendall(request.raw)
                method = request.start_line.split(" ", 1)[0]
                answers = _Reader(upstream, self._stop)
                answer = answers.read(answer_to=method)
                while answer is not None and 100 <= answer.status < 200:
                    answer = answers.read(answer_to=method)
            except (OSError, FramingError) as exc:
                log.debug("%s: repeated request failed: %s", self.name, exc)
            finally:
                if upstream is not None:
                    upstream.close()
                self._awaiting(key, False)

        threading.Thread(target=send, name=f"fwd-{self.name}-again", daemon=True).start()
