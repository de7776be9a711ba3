"""Where the demo learns what happens: the Broker's archive, or the API server.

``ArchiveFeed`` tails the Broker's archive (``Stack.archive``): every pod event the
ApiServerSource sent, and every event the functions replied with, in the order the Broker
accepted them and with their arrival times. That is the pipeline's own account, so the demo
uses it whenever it runs the pipeline itself (or is pointed at one with ``--archive``).

``ApiFeed`` is for a cluster whose functions run elsewhere: it lists the demo's pods, judges
them with the same ``classify`` detect-failures runs, and reads the Kubernetes Events
update-annotations records on the workloads (``Rescheduled``, ``ExclusionsCleared``,
``RetriesExhausted``).

``NodeFeed`` runs beside either: the marks on the Nodes (assess-nodes' suspect label and
taint, label-nodes' ``status=presure``) and the Events on them are facts of the Node objects,
which only the API server has.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol

from dev.stack.demo_model import Timeline
from shared.api.keys import (
    APISERVER_ADD,
    APISERVER_DELETE,
    APISERVER_UPDATE,
    EVENT_NODE_SUSPECTED,
    EVENT_POD_EXHAUSTED,
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    REASON_EXCLUSIONS_CLEARED,
    REASON_RESCHEDULED,
    REASON_RETRIES_EXHAUSTED,
)
from shared.platform.config import Config
from shared.platform.kube import Kube
from shared.pods.failing import FailingPod
from shared.workloads.classify import classify

JSON = dict[str, Any]


class Feed(Protocol):
    def poll(self) -> int:
        """Hands everything new to the timeline; how many facts that was."""


def _function(source: str) -> str:
    """``/kn-rescheduler/detect-failures`` -> ``detect-failures``."""
    return source.rstrip("/").rsplit("/", 1)[-1] if source else ""


class ArchiveFeed:
    def __init__(self, path: Path, timeline: Timeline, t0: float, *, from_end: bool = False):
        self.path = path
        self.timeline = timeline
        self.t0 = t0
        self._offset = path.stat().st_size if from_end and path.exists() else 0
        self._partial = b""

    def poll(self) -> int:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return 0
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next poll
        handled = 0
        for line in lines:
            if line.strip():
                handled += self._handle(json.loads(line))
        return handled

    def _time(self, event: JSON) -> float:
        arrived = event.get("knativearrivaltime") or event.get("time")
        try:
            return datetime.fromisoformat(str(arrived)).timestamp() - self.t0
        except ValueError:
            return time.time() - self.t0

    def _handle(self, event: JSON) -> int:
        kind, data = event.get("type"), event.get("data")
        if not isinstance(data, dict):
            return 0
        t = self._time(event)
        source = _function(str(event.get("source") or ""))
        if kind in (APISERVER_ADD, APISERVER_UPDATE) and event.get("kind") == "Pod":
            self.timeline.on_pod(t, data)
        elif kind == APISERVER_DELETE and event.get("kind") == "Pod":
            if (data.get("metadata") or {}).get("namespace") == self.timeline.namespace:
                self.timeline.on_pod_gone(t, str(data["metadata"].get("uid", "")))
        elif kind == EVENT_POD_FAILING:
            self.timeline.on_failing(t, data, source=source)
        elif kind == EVENT_POD_RESCHEDULED:
            self.timeline.on_decision(t, data, source=source)
        elif kind == EVENT_POD_EXHAUSTED:
            self.timeline.on_decision(t, data, exhausted=True, source=source)
        elif kind == EVENT_NODE_SUSPECTED:
            self.timeline.on_node_suspected(t, data, source=source)
        else:
            return 0
        return 1


# update-annotations' Event messages (shared.workloads.state.plan), read back into the reply's
# fields.
_MOVED: Final = re.compile(
    r"moved pod (?P<name>\S+) off node (?P<node>\S+) after (?P<reason>\S+) "
    r"\(move (?P<moves>\d+) of (?P<budget>\d+)\); (?P<detail>.*)"
)
_CLEARED: Final = re.compile(
    r"pod (?P<name>\S+) could not be scheduled.*\(moves stay (?P<moves>\d+)/(?P<budget>\d+)\)"
)
_EXHAUSTED: Final = re.compile(
    r"pod (?P<name>\S+) failed on (?P<node>\S+) \((?P<reason>[^)]*)\) after all "
    r"(?P<budget>\d+) moves"
)
_EXCLUDED: Final = re.compile(r"excluded nodes now: (?P<nodes>.*)$")


def decision_from_event(event: JSON) -> tuple[JSON, bool] | None:
    """(reply-shaped data, exhausted?) from one of update-annotations' Kubernetes Events."""
    reason, message = event.get("reason"), str(event.get("message") or "")
    involved = event.get("involvedObject") or {}
    base: JSON = {
        "namespace": involved.get("namespace"),
        "workload": {"kind": involved.get("kind"), "name": involved.get("name")},
    }
    if reason == REASON_RESCHEDULED and (m := _MOVED.match(message)):
        excluded = _EXCLUDED.search(m["detail"])
        nodes = [n.strip() for n in excluded["nodes"].split(",")] if excluded else []
        return {
            **base,
            "name": m["name"],
            "node": m["node"],
            "reason": m["reason"],
            "action": "move",
            "moves": int(m["moves"]),
            "budget": int(m["budget"]),
            "excludedNodes": nodes,
            "exclusionsCleared": excluded is None,
        }, False
    if reason == REASON_EXCLUSIONS_CLEARED and (m := _CLEARED.match(message)):
        return {
            **base,
            "name": m["name"],
            "action": "clear-and-move",
            "moves": int(m["moves"]),
            "budget": int(m["budget"]),
            "excludedNodes": [],
            "exclusionsCleared": True,
        }, False
    if reason == REASON_RETRIES_EXHAUSTED and (m := _EXHAUSTED.match(message)):
        return {
            **base,
            "name": m["name"],
            "node": m["node"],
            "reason": m["reason"],
            "action": "exhausted",
            "budget": int(m["budget"]),
            "moves": int(m["budget"]),
        }, True
    return None


class ApiFeed:
    def __init__(self, kube: Kube, timeline: Timeline, t0: float, cfg: Config | None = None):
        self.kube = kube
        self.timeline = timeline
        self.t0 = t0
        self.cfg = cfg or Config()
        self._present: set[str] = set()
        self._events_seen: set[str] = set()

    def poll(self) -> int:
        t = time.time() - self.t0
        namespace = self.timeline.namespace
        handled = 0
        # Decisions first: update-annotations records its Event before it deletes the pod, so
        # a pod found gone below has its decision (if any) already on the timeline.
        for event in self.kube.list_all("Event", namespace):
            uid = str(event["metadata"].get("uid", ""))
            if uid in self._events_seen:
                continue
            self._events_seen.add(uid)
            decision = decision_from_event(event)
            if decision is not None:
                data, exhausted = decision
                self.timeline.on_decision(
                    t, data, exhausted=exhausted, source="Event from update-annotations"
                )
                handled += 1
        present: set[str] = set()
        for pod in self.kube.list_all("Pod", namespace):
            uid = str(pod["metadata"].get("uid", ""))
            present.add(uid)
            self.timeline.on_pod(t, pod)
            failure = classify(pod, self.cfg)  # type: ignore[arg-type]
            if failure is not None:
                data = FailingPod.from_pod(pod, failure).to_data()  # type: ignore[arg-type]
                self.timeline.on_failing(t, data, source="seen by the demo")
            handled += 1
        for uid in self._present - present:
            self.timeline.on_pod_gone(t, uid)
        self._present = present
        return handled


# assess-nodes records its Node Events here: a Node is cluster-scoped, and an Event about it
# goes to the default namespace, as the kubelet's own Node Events do.
NODE_EVENTS_NAMESPACE: Final = "default"


class NodeFeed:
    """Node snapshots and the Events on Nodes, from the API server. Events that were there
    before the first poll (an earlier run's) are not told."""

    def __init__(self, kube: Kube, timeline: Timeline, t0: float):
        self.kube = kube
        self.timeline = timeline
        self.t0 = t0
        self._events_seen: set[str] | None = None

    def poll(self) -> int:
        t = time.time() - self.t0
        handled = 0
        if self._events_seen is None:
            self._events_seen = {
                str(e["metadata"].get("uid", ""))
                for e in self.kube.list_all("Event", NODE_EVENTS_NAMESPACE)
            }
        for node in self.kube.list_all("Node"):
            self.timeline.on_node(t, node)
            handled += 1
        for event in self.kube.list_all("Event", NODE_EVENTS_NAMESPACE):
            uid = str(event["metadata"].get("uid", ""))
            if uid in self._events_seen:
                continue
            self._events_seen.add(uid)
            self.timeline.on_node_event(t, event)
            handled += 1
        return handled


class Feeds:
    """Several feeds polled in turn, as one."""

    def __init__(self, *feeds: Feed):
        self.feeds = feeds

    def poll(self) -> int:
        return sum(feed.poll() for feed in self.feeds)
