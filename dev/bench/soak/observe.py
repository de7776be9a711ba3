"""The soak's own record of what happened, gathered from outside the product.

List-and-watch loops (the chaos suite's :class:`bench.chaos.observe.Watch`) over every pod,
Node, ReplicaSet and Job of the cluster, started before anything else, turned into the facts the
invariants read (:class:`bench.soak.invariants.Record`): each pod as last seen before its
deletion (and its few versions before that), when it was bound, first failing, deleted and
gone, and when it turned Ready or not; every version of every Node in the order the watch
delivered them; every owner a pod had, and which of them carried our state annotation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dev.bench.chaos.invariants import is_ready
from dev.bench.chaos.observe import Watch
from dev.bench.soak.invariants import NodeSeen, PodFacts, is_failing
from dev.localcluster.rest import Rest
from shared.api.keys import STATE_ANNOTATION

JSON = dict[str, Any]
# Versions of a pod kept before its deletion: what a move may have read just before it.
RECENT = 6


class Recorder:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.pods: dict[str, PodFacts] = {}
        self.nodes: list[NodeSeen] = []
        self.owners: dict[str, JSON] = {}
        # Holders (ReplicaSets, Jobs) first seen carrying our state annotation, and when.
        self.state_written: dict[str, float] = {}
        self._node_rv: dict[str, int] = {}

    # -- pods -----------------------------------------------------------------------------------

    def pod_event(self, kind: str, pod: JSON) -> None:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        now = self.clock()
        with self._lock:
            facts = self.pods.get(uid) or PodFacts(before_deletion=None, last=pod, first_seen=now)
            deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
            ready = is_ready(pod)
            changes = facts.ready_changes
            if not changes or changes[-1][1] != ready:
                changes = (*changes, (now, ready))
            facts = replace(
                facts,
                last=pod,
                recent=facts.recent if deleting else (*facts.recent, (now, pod))[-RECENT:],
                ready_changes=changes,
                before_deletion=facts.before_deletion if deleting else pod,
                bound_at=facts.bound_at
                if facts.bound_at is not None or not (pod.get("spec") or {}).get("nodeName")
                else now,
                failing_at=facts.failing_at
                if facts.failing_at is not None or not is_failing(pod)
                else now,
                deleting_at=facts.deleting_at
                if facts.deleting_at is not None or not deleting
                else now,
                started_at=facts.started_at
                if facts.started_at is not None
                or (pod.get("status") or {}).get("phase", "Pending") == "Pending"
                else now,
                deleting_rv=facts.deleting_rv
                if facts.deleting_rv is not None or not (deleting or kind == "DELETED")
                else _rv(pod),
                gone=facts.gone or kind == "DELETED",
            )
            self.pods[uid] = facts

    def pod_list(self, pods: list[JSON]) -> None:
        present = {str(p["metadata"]["uid"]) for p in pods}
        with self._lock:
            # Gone while the watch was down.
            for uid, facts in self.pods.items():
                if uid not in present and not facts.gone:
                    self.pods[uid] = replace(
                        facts,
                        gone=True,
                        deleting_at=facts.deleting_at if facts.deleting_at else self.clock(),
                    )
        for p in pods:
            self.pod_event("LISTED", p)

    # -- nodes ----------------------------------------------------------------------------------

    def node_event(self, kind: str, node: JSON) -> None:
        if kind == "DELETED":
            return
        name = str(node["metadata"]["name"])
        rv = int(node["metadata"].get("resourceVersion") or 0)
        with self._lock:
            # A relist repeats versions already seen.
            if self._node_rv.get(name, -1) >= rv:
                return
            self._node_rv[name] = rv
            self.nodes.append(NodeSeen(self.clock(), node))

    def node_list(self, nodes: list[JSON]) -> None:
        for n in nodes:
            self.node_event("LISTED", n)

    # -- owners ---------------------------------------------------------------------------------

    def owner_event(self, kind: str, obj: JSON) -> None:
        uid = str(obj["metadata"]["uid"])
        with self._lock:
            self.owners[uid] = obj
            if STATE_ANNOTATION in (obj["metadata"].get("annotations") or {}):
                self.state_written.setdefault(uid, self.clock())

    def owner_list(self, objs: list[JSON]) -> None:
        for o in objs:
            self.owner_event("LISTED", o)

    def snapshot(self) -> tuple[dict[str, PodFacts], list[NodeSeen], dict[str, JSON]]:
        with self._lock:
            return dict(self.pods), list(self.nodes), dict(self.owners)

    def holders_with_state(self) -> dict[str, float]:
        with self._lock:
            return dict(self.state_written)


def _rv(obj: JSON) -> int | None:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:
        return None


def start_watches(rest: Rest, recorder: Recorder, stop: threading.Event) -> list[Watch]:
    watches = [
        Watch(rest, "/api/v1/pods", recorder.pod_event, recorder.pod_list, stop),
        Watch(rest, "/api/v1/nodes", recorder.node_event, recorder.node_list, stop),
    ]
    for path, kind in (("/apis/apps/v1/replicasets", "ReplicaSet"), ("/apis/batch/v1/jobs", "Job")):

        def on_event(event: str, obj: JSON, kind: str = kind) -> None:
            recorder.owner_event(event, {**obj, "kind": kind})

        def on_list(objs: list[JSON], kind: str = kind) -> None:
            recorder.owner_list([{**o, "kind": kind} for o in objs])

        watches.append(Watch(rest, path, on_event, on_list, stop))
    return [w.start() for w in watches]
