"""Watches the pods of one namespace and turns what happens to them into recovery chains.

A *chain* follows one replica slot of a ReplicaSet: its first pod, and every replacement the
ReplicaSet creates after a pod of the chain was removed (deleted or evicted). A chain is
*affected* once its first pod fails on its node; it *recovers* when a pod of the chain is Ready
on a healthy node. Each removal of a pod of the chain is a *move*; a move whose replacement lands
on a faulty node again is *wasted*.

Replacements are matched to chains in order: a pod a ReplicaSet creates while one of its chains
has no live pod belongs to the oldest such chain (a watch delivers one namespace's pod events in
resourceVersion order, so a removal is always seen before the pod that replaces it).

Times are ``time.monotonic()`` on receipt of the watch event that showed the change.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from dev.bench.common import JSON, is_ready
from dev.localcluster.rest import ApiError, Rest

FAILING_WAITING = frozenset(
    {"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "CreateContainerError"}
)


@dataclass
class Chain:
    rs: str
    pods: list[str] = field(default_factory=list)
    start: float | None = None  # first failure of the first pod
    threshold: float | None = None  # first pod past the restart threshold (in CrashLoopBackOff)
    moves: int = 0
    wasted: int = 0
    recovered: float | None = None
    orphaned: bool = False
    # The chain's current pod is Ready on a healthy node.
    healthy_now: bool = False


@dataclass
class PodRecord:
    uid: str
    name: str
    chain: Chain
    node: str = ""
    first_failure: float | None = None
    removed: float | None = None


def _failing(pod: JSON) -> bool:
    status = pod.get("status", {})
    if status.get("phase") == "Failed":
        return True
    for c in status.get("containerStatuses") or []:
        state = c.get("state", {})
        if c.get("restartCount", 0) > 0 or "terminated" in state:
            return True
        if state.get("waiting", {}).get("reason") in FAILING_WAITING:
            return True
    return False


def _past_threshold(pod: JSON, threshold: int) -> bool:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
    looping = any(
        c.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff" for c in statuses
    )
    return restarts >= threshold and looping


class Tracker:
    def __init__(self, rest: Rest, namespace: str, faulty: set[str], threshold: int = 3) -> None:
        self.rest = rest
        self.namespace = namespace
        self.faulty = faulty
        self.threshold = threshold
        self.chains: list[Chain] = []
        self.pods: dict[str, PodRecord] = {}
        self.live: dict[str, JSON] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-tracker", daemon=True)
        self.events = 0

    def start(self) -> Tracker:
        self._rv = str(
            self.rest.get(f"/api/v1/namespaces/{self.namespace}/pods")["metadata"].get(
                "resourceVersion", ""
            )
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=40)

    def _loop(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        while not self._stop.is_set():
            try:
                for event in self.rest.watch(path, {"resourceVersion": self._rv}, 10):
                    kind, obj = event.get("type"), event.get("object", {})
                    if kind == "ERROR":
                        self._rv = str(self.rest.get(path)["metadata"].get("resourceVersion", ""))
                        break
                    self._rv = str(obj.get("metadata", {}).get("resourceVersion", self._rv))
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.observe(str(kind), obj, time.monotonic())
                    if self._stop.is_set():
                        return
            except ApiError:
                time.sleep(0.2)

    # -- the bookkeeping (also used directly by tests of the harness) ---------------------------

    def observe(self, kind: str, pod: JSON, t: float) -> None:
        meta = pod.get("metadata", {})
        uid = meta.get("uid", "")
        owner = next(
            (r.get("name", "") for r in meta.get("ownerReferences") or [] if r.get("controller")),
            "",
        )
        with self._lock:
            self.events += 1
            rec = self.pods.get(uid)
            if rec is None:
                if kind == "DELETED":
                    return
                chain = next((c for c in self.chains if c.rs == owner and c.orphaned), None)
                if chain is None:
                    chain = Chain(rs=owner)
                    self.chains.append(chain)
                chain.orphaned = False
                chain.pods.append(uid)
                rec = PodRecord(uid=uid, name=meta.get("name", ""), chain=chain)
                self.pods[uid] = rec
            chain = rec.chain
            node = pod.get("spec", {}).get("nodeName") or ""
            if node and not rec.node:
                rec.node = node
                if node in self.faulty and chain.moves:
                    # A replacement (the chain's last pod was moved) bound to a faulty node.
                    chain.wasted += 1
            if kind == "DELETED" or meta.get("deletionTimestamp"):
                self.live.pop(uid, None)
                chain.healthy_now = False
                if rec.removed is None:
                    rec.removed = t
                    if chain.recovered is None and chain.pods[-1] == uid:
                        chain.moves += 1
                        chain.orphaned = True
                return
            self.live[uid] = pod
            chain.healthy_now = bool(is_ready(pod) and rec.node and rec.node not in self.faulty)
            if _failing(pod) and rec.first_failure is None:
                rec.first_failure = t
                if chain.start is None:
                    chain.start = t
            if chain.threshold is None and _past_threshold(pod, self.threshold):
                chain.threshold = t
            if (
                chain.start is not None
                and chain.recovered is None
                and is_ready(pod)
                and rec.node
                and rec.node not in self.faulty
            ):
                chain.recovered = t

    # -- questions ------------------------------------------------------------------------------

    def snapshot(self) -> list[Chain]:
        with self._lock:
            return [Chain(**c.__dict__) for c in self.chains]

    def settled(self, expected_replicas: int) -> bool:
        """Every replica is Ready on a healthy node, and every affected chain recovered."""
        with self._lock:
            live_ok = [
                p
                for p in self.live.values()
                if is_ready(p) and (p.get("spec", {}).get("nodeName") or "") not in self.faulty
            ]
            if len(self.live) != expected_replicas or len(live_ok) != expected_replicas:
                return False
            return all(c.recovered is not None or c.start is None for c in self.chains)

    def ready_count(self) -> int:
        """Live pods that are Ready."""
        with self._lock:
            return sum(1 for p in self.live.values() if is_ready(p))

    def all_recovered(self) -> bool:
        """Every chain seen so far recovered, or never failed and has a live pod."""
        with self._lock:
            return all(c.recovered is not None or c.healthy_now for c in self.chains)

    def result(self, t0: float, bound: float) -> dict[str, Any]:
        chains = self.snapshot()
        affected = [c for c in chains if c.start is not None]
        recovered = [c for c in affected if c.recovered is not None]
        assert all(c.start is not None for c in recovered)
        from_failure = [c.recovered - c.start for c in recovered if c.recovered and c.start]
        from_threshold = [
            c.recovered - c.threshold for c in recovered if c.recovered and c.threshold
        ]
        first_failure = [c.start - t0 for c in affected if c.start]
        # What the restart back-off alone costs before a restart-count rule (the descheduler's,
        # kn-rescheduler's crash-loop threshold) may act: from the first failure to 3 restarts.
        threshold_from_failure = [
            c.threshold - c.start
            for c in affected
            if c.threshold is not None and c.start is not None
        ]
        return {
            "affected": len(affected),
            "recovered": len(recovered),
            "within_5min": sum(1 for v in from_failure if v <= 300.0),
            "recovery_from_failure_s": from_failure,
            "recovery_from_threshold_s": from_threshold,
            "first_failure_after_create_s": first_failure,
            "threshold_from_failure_s": threshold_from_failure,
            "moves_total": sum(c.moves for c in affected),
            "moves_of_recovered": sum(c.moves for c in recovered),
            "wasted_moves": sum(c.wasted for c in affected),
            "moves_per_recovered": [c.moves for c in recovered],
            "recovery_from_threshold_one_move_s": [
                c.recovered - c.threshold
                for c in recovered
                if c.recovered and c.threshold and c.moves == 1
            ],
            "bound_s": bound,
        }
