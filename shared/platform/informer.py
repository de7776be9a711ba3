"""A watch-fed cache of one kind of cluster-scoped object: list once, then follow the changes.

For a function that must answer from what the cluster holds without an API call on its request
path (score-nodes, asked by kube-scheduler for every pod it places, with node names only when
the extender is ``nodeCacheCapable``). client-go calls this a reflector feeding a store; this is
the same loop, small enough to read:

1. LIST (paged, one consistent snapshot) and replace the cache with it;
2. WATCH from the list's resourceVersion with bookmarks, applying each change; when the API
   server ends the watch (``timeout_seconds``), watch again from the last version seen;
3. on 410 Gone (the version is older than the API server keeps) list again; on any other
   failure wait (doubling, with jitter, up to ``max_backoff``) and list again.

The cache keeps what it had while the loop recovers, and says how much it can be trusted:
``ready(now)`` is false until the first list completes and again once the loop has been
failing for longer than ``max_outage``, so a caller falls back to "no opinion" rather than to
a picture of the cluster from minutes ago. Objects go through ``transform`` on the way in
(parse once what the caller reads, keep nothing else: memory stays small at thousands of
objects and a read costs a lookup; an object it cannot use is dropped as ``None``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeVar

from shared.platform.kube import JSON, Gone, KubeError, WatchEvent

log = logging.getLogger(__name__)

T = TypeVar("T")


def name_of(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    return str(metadata.get("name") or "") if isinstance(metadata, dict) else ""


def version_of(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    return str(metadata.get("resourceVersion") or "") if isinstance(metadata, dict) else ""


@dataclass(frozen=True)
class Status:
    """What the cache can say about itself: listed at all, since when the loop has been
    failing (monotonic seconds, None while it works), and the last version applied."""

    synced: bool
    failing_since: float | None
    resource_version: str
    objects: int


class Cache(Generic[T]):
    """Objects by name, as ``transform`` makes them, replaced by a list and changed by watch
    events. Thread-safe: one writer (the loop) and any number of readers, each read of one
    name or of the whole map seeing a consistent state."""

    def __init__(self, transform: Callable[[JSON], T | None], *, max_outage: float) -> None:
        self._transform = transform
        self._max_outage = max_outage
        self._lock = threading.Lock()
        self._objects: dict[str, T] = {}
        self._synced = False
        self._failing_since: float | None = None
        self._version = ""

    # -- the loop's side --------------------------------------------------------------------

    def keep(self, obj: JSON) -> tuple[str, T | None]:
        """The object's name and what the cache keeps of it (None: nothing)."""
        name = name_of(obj)
        return name, self._transform(obj) if name else None

    def replace(self, items: Iterable[JSON], resource_version: str) -> None:
        self.replace_kept([self.keep(item) for item in items], resource_version)

    def replace_kept(self, kept: Iterable[tuple[str, T | None]], resource_version: str) -> None:
        """Replace everything with a list already passed through ``keep``."""
        fresh = {name: value for name, value in kept if name and value is not None}
        with self._lock:
            self._objects = fresh
            self._version = resource_version
            self._synced = True
            self._failing_since = None

    def apply(self, event: WatchEvent) -> None:
        """One watch event: ADDED and MODIFIED store the object, DELETED removes it, BOOKMARK
        only moves the version on. An event older than the one applied cannot come within one
        watch (the API server sends them in order), so none is compared."""
        version = event.resource_version
        name = name_of(event.object)
        with self._lock:
            if event.type in ("ADDED", "MODIFIED") and name:
                kept = self._transform(event.object)
                if kept is None:
                    self._objects.pop(name, None)
                else:
                    self._objects[name] = kept
            elif event.type == "DELETED" and name:
                self._objects.pop(name, None)
            if version:
                self._version = version
            self._failing_since = None

    def failed(self, now: float) -> None:
        with self._lock:
            if self._failing_since is None:
                self._failing_since = now

    # -- the readers' side ------------------------------------------------------------------

    def get(self, name: str) -> T | None:
        return self._objects.get(name)

    def snapshot(self) -> dict[str, T]:
        with self._lock:
            return dict(self._objects)

    def ready(self, now: float) -> bool:
        """Listed, and not failing for longer than ``max_outage``."""
        with self._lock:
            if not self._synced:
                return False
            return self._failing_since is None or now - self._failing_since <= self._max_outage

    def status(self) -> Status:
        with self._lock:
            return Status(self._synced, self._failing_since, self._version, len(self._objects))


class Source(Protocol):
    """The two calls the loop makes (shared.platform.kube.Kube has them)."""

    def list_snapshot(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        limit: int = 500,
        keep: Callable[[JSON], Any] | None = None,
    ) -> tuple[list[Any], str]: ...

    def watch(
        self,
        kind: str,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        namespace: str | None = None,
    ) -> Iterable[WatchEvent]: ...


MIN_BACKOFF: Final = 0.5
MAX_BACKOFF: Final = 30.0
WATCH_SECONDS: Final = 300


def backoff(failures: int, *, base: float = MIN_BACKOFF, cap: float = MAX_BACKOFF) -> float:
    """Seconds to wait after ``failures`` failures in a row: doubling from ``base`` up to
    ``cap``, between half and the whole of it (jitter, so that many replicas do not come back
    at the same moment, as client-go's reflector backs off)."""
    full = min(cap, base * 2.0 ** max(0, failures - 1))
    return full * (0.5 + random.random() / 2)


def run(
    connect: Callable[[], Source],
    kind: str,
    cache: Cache[Any],
    stop: threading.Event,
    *,
    watch_seconds: int = WATCH_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """List and watch ``kind`` into ``cache`` until ``stop`` is set. ``connect`` builds the
    API connection (retried like any failure: credentials that are not there yet).

    The back-off resets only once a watch has worked (delivered an event or lasted until the
    API server ended it), not after a list: a watch refused at once (RBAC granting list but
    not watch, a proxy cutting long requests) would otherwise make a LIST of every object
    twice a second, forever."""
    failures = 0
    source: Source | None = None
    while not stop.is_set():
        watched = False
        try:
            if source is None:
                source = connect()
            # Kept page by page: a thousand Nodes' JSON is never held at once.
            items, version = source.list_snapshot(kind, keep=cache.keep)
            cache.replace_kept(items, version)
            log.info("listed %d %s objects at version %s", len(items), kind, version)
            while not stop.is_set():
                for event in source.watch(
                    kind, resource_version=version, timeout_seconds=watch_seconds
                ):
                    cache.apply(event)
                    version = event.resource_version or version
                    watched, failures = True, 0
                    if stop.is_set():
                        return
                # The API server ended the watch: it worked.
                watched, failures = True, 0
        except Gone as err:
            # The watch fell behind what the API server keeps: list again. Not a failure after
            # a watch that worked; straight after a list it is one (backed off like any other).
            if watched:
                log.info("%s watch expired, listing again: %s", kind, err)
                continue
            failures += 1
            stop.wait(backoff(failures))
        # Anything at all: the loop must outlive every failure (a bad kubeconfig included).
        except Exception as err:
            failures += 1
            cache.failed(clock())
            delay = backoff(failures)
            log.warning(
                "%s list/watch failed (%d in a row), retrying in %.1fs: %s",
                kind,
                failures,
                delay,
                err,
                extra={"error": type(err).__name__},
            )
            if not isinstance(err, KubeError):
                source = None
            stop.wait(delay)


def start(
    connect: Callable[[], Source],
    kind: str,
    cache: Cache[Any],
    *,
    name: str | None = None,
) -> tuple[threading.Thread, threading.Event]:
    """The loop in a daemon thread; set the returned event to stop it."""
    stop = threading.Event()
    thread = threading.Thread(
        target=run, args=(connect, kind, cache, stop), name=name or f"{kind}-informer", daemon=True
    )
    thread.start()
    return thread, stop
