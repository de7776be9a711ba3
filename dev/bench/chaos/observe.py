"""Watching the storm from outside: every pod seen (and how it ended), and every state write.

The harness's own list-and-watch loops, independent of the product's code and of the
ApiServerSource: they survive API server and etcd restarts (a broken watch resumes from its
resourceVersion; one too old lists again, and a pod missing from the new list went away
during the gap). Started before the storm, so that every pod of the chaos namespaces is seen.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from dev.localcluster.rest import ApiError, Rest
from shared.api.keys import STATE_ANNOTATION

JSON = dict[str, Any]
log = logging.getLogger(__name__)
# The phases after which no container of a pod runs again (v1.PodSucceeded, v1.PodFailed).
TERMINAL_PHASES = frozenset({"Failed", "Succeeded"})


class Watch:
    """List, then watch ``path`` for ever (until ``stop``), calling ``on_list(items)`` after
    every (re)list and ``on_event(type, obj)`` for every change."""

    def __init__(
        self,
        rest: Rest,
        path: str,
        on_event: Callable[[str, JSON], None],
        on_list: Callable[[list[JSON]], None],
        stop: threading.Event,
    ) -> None:
        self.rest, self.path = rest, path
        self.on_event, self.on_list = on_event, on_list
        self.stop = stop
        self.relists = 0
        self.thread = threading.Thread(target=self._loop, name=f"chaos-watch{path}", daemon=True)

    def start(self) -> Watch:
        self.thread.start()
        return self

    def _list(self) -> str:
        query = {"limit": "500"}
        items: list[JSON] = []
        while True:
            page = self.rest.get(self.path, query)
            items.extend(page.get("items", []))
            cont = page.get("metadata", {}).get("continue")
            if not cont:
                self.on_list(items)
                self.relists += 1
                return str(page.get("metadata", {}).get("resourceVersion", ""))
            query = {**query, "continue": cont}

    def _loop(self) -> None:
        rv = ""
        while not self.stop.is_set():
            try:
                if not rv:
                    rv = self._list()
                for event in self.rest.watch(self.path, {"resourceVersion": rv}, 20):
                    if self.stop.is_set():
                        return
                    kind, obj = str(event.get("type")), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            rv = ""
                        break
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.on_event(kind, obj)
            except ApiError as e:
                if e.status == 410:
                    rv = ""
                time.sleep(0.3)
            except Exception:
                log.exception("watch of %s failed", self.path)
                time.sleep(0.3)


def state_counts(obj: JSON) -> tuple[int, int] | None:
    """(moves, handled uids) of an object's state annotation; None without a readable one."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(STATE_ANNOTATION)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        return int(data.get("moves", 0)), len(data.get("handled") or ())
    except (ValueError, TypeError, AttributeError):
        return None


def ended_undeleted(pod: JSON) -> bool:
    """The pod is terminal (Failed or Succeeded) and nobody has asked to delete it: its kubelet
    ended it of its own accord (an eviction, a rejection at admission, a node shutdown).

    A pod's last-seen phase alone cannot say that: a kubelet writes every pod it stops for a
    deletion terminal too (Failed, or Succeeded when all its containers exited 0) before it
    removes it, so the DELETED event of a pod anyone deleted shows it Failed, with its
    ``deletionTimestamp``. Only a terminal status seen without one is the kubelet's own verdict.
    """
    phase = (pod.get("status") or {}).get("phase")
    return phase in TERMINAL_PHASES and not (pod.get("metadata") or {}).get("deletionTimestamp")


class Ledger:
    """Every pod of ``namespaces`` seen during the run, as last seen, which went away, and which
    were seen ended before anyone deleted them (:func:`ended_undeleted`); and a callback for
    every state write (a holder's count of handled pods growing)."""

    def __init__(
        self, namespaces: Iterable[str], on_state_write: Callable[[str], None] | None = None
    ) -> None:
        self.namespaces = frozenset(namespaces)
        self.on_state_write = on_state_write
        self._lock = threading.Lock()
        self.seen: dict[str, JSON] = {}
        self.gone: set[str] = set()
        self.ended_undeleted: set[str] = set()
        self._alive: set[str] = set()
        self._states: dict[str, tuple[int, int]] = {}
        self.state_writes = 0

    def _ours(self, obj: JSON) -> bool:
        return (obj.get("metadata") or {}).get("namespace") in self.namespaces

    # -- pods ---------------------------------------------------------------------------------

    def pod_event(self, kind: str, pod: JSON) -> None:
        if not self._ours(pod):
            return
        uid = pod["metadata"]["uid"]
        with self._lock:
            self.seen[uid] = pod
            if ended_undeleted(pod):
                self.ended_undeleted.add(uid)
            if kind == "DELETED":
                self.gone.add(uid)
                self._alive.discard(uid)
            elif uid not in self.gone:
                self._alive.add(uid)
        if pod.get("metadata", {}).get("ownerReferences") is None:
            self.holder_event(kind, {**pod, "kind": "Pod"})  # a bare pod holds its own state

    def pod_list(self, pods: list[JSON]) -> None:
        ours = [p for p in pods if self._ours(p)]
        present = {p["metadata"]["uid"] for p in ours}
        with self._lock:
            for uid in self._alive - present:
                # Went away while the watch was down.
                self.gone.add(uid)
            self._alive = present - self.gone
            for p in ours:
                self.seen[p["metadata"]["uid"]] = p
                if ended_undeleted(p):
                    self.ended_undeleted.add(p["metadata"]["uid"])

    # -- holders ------------------------------------------------------------------------------

    def holder_event(self, kind: str, obj: JSON) -> None:
        if kind == "DELETED" or not self._ours(obj):
            return
        counts = state_counts(obj)
        if counts is None:
            return
        uid = obj["metadata"]["uid"]
        meta = obj["metadata"]
        with self._lock:
            before = self._states.get(uid, (0, 0))
            self._states[uid] = counts
            grew = counts[1] > before[1] or counts[0] > before[0]
            if grew:
                self.state_writes += 1
        if grew and self.on_state_write is not None:
            self.on_state_write(f"{obj.get('kind', '')} {meta.get('namespace')}/{meta.get('name')}")

    def holder_list(self, kind: str) -> Callable[[list[JSON]], None]:
        def on_list(items: list[JSON]) -> None:
            # A relist only learns the states (no kill: nothing was seen being written).
            for obj in items:
                counts = state_counts(obj)
                if counts is not None and self._ours(obj):
                    with self._lock:
                        self._states[obj["metadata"]["uid"]] = counts

        return on_list

    def snapshot(self) -> tuple[dict[str, JSON], frozenset[str], frozenset[str]]:
        """Every pod seen (by uid, as last seen), the uids that went away, and the uids seen
        ended before anyone deleted them."""
        with self._lock:
            return dict(self.seen), frozenset(self.gone), frozenset(self.ended_undeleted)


def start_watches(rest: Rest, ledger: Ledger, stop: threading.Event) -> list[Watch]:
    """The pod ledger and the holders' state writes, cluster-wide (filtered to the chaos
    namespaces)."""
    watches = [Watch(rest, "/api/v1/pods", ledger.pod_event, ledger.pod_list, stop)]
    for kind, path in (
        ("ReplicaSet", "/apis/apps/v1/replicasets"),
        ("StatefulSet", "/apis/apps/v1/statefulsets"),
        ("Job", "/apis/batch/v1/jobs"),
    ):

        def on_event(event: str, obj: JSON, kind: str = kind) -> None:
            ledger.holder_event(event, {**obj, "kind": kind})

        watches.append(Watch(rest, path, on_event, ledger.holder_list(kind), stop))
    return [w.start() for w in watches]
