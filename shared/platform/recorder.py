"""Kubernetes Events, said once per (object, reason, key) and counted when said again.

Every function that tells people something on an object (a workload, a pod, a Node) goes
through here, so they all name, count and cap Events the same way: one Event per object,
reason and key, whose ``count`` and ``lastTimestamp`` say how often and how lately, like the
kubelet's event correlator. A redelivered CloudEvent therefore never piles up a new Event.

Events about cluster-scoped objects (Nodes) live in the ``default`` namespace with an
``involvedObject`` without a namespace, as the kubelet records its node Events: that is where
``kubectl describe node`` looks for them (it searches every namespace by the object's kind,
name, uid and empty namespace).
"""

from __future__ import annotations

import hashlib
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from shared.api.keys import COMPONENT
from shared.api.times import format_time
from shared.platform import kube

log = logging.getLogger(__name__)

# Kubernetes object names are DNS subdomains: 253 characters at most.
_MAX_NAME: Final = 253
# Where Events about cluster-scoped objects go (the kubelet's choice for node Events).
CLUSTER_EVENTS_NAMESPACE: Final = "default"
# Optimistic-concurrency attempts to count an Event again before giving up (it is for people).
REPEAT_ATTEMPTS: Final = 3

API_VERSIONS: Final = {
    "Pod": "v1",
    "Node": "v1",
    "ReplicaSet": "apps/v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
}


@dataclass(frozen=True)
class Involved:
    """The object an Event is about; ``namespace`` is empty for a cluster-scoped one."""

    kind: str
    namespace: str
    name: str
    uid: str = ""
    api_version: str = ""

    @property
    def event_namespace(self) -> str:
        return self.namespace or CLUSTER_EVENTS_NAMESPACE


def event_name(involved: Involved, reason: str, key: str) -> str:
    """The one name an Event about (object, reason, key) has: ``<object>.<hash>``.

    Deterministic, so the same Event recorded again finds the first (409 AlreadyExists) and
    counts on it instead of piling up a new Event per delivery. The object's uid is in the
    hash: a namesake (a StatefulSet deleted and created again) starts its own Events.
    """
    who = f"{involved.kind}/{involved.namespace}/{involved.name}/{involved.uid}"
    digest = hashlib.sha256(f"{who}\n{reason}\n{key}".encode()).hexdigest()[:16]
    # A DNS subdomain: every dot-separated label must start and end alphanumeric.
    prefix = involved.name[: _MAX_NAME - len(digest) - 1].rstrip(".-")
    return f"{prefix}.{digest}" if prefix else digest


def event_body(
    involved: Involved,
    reason: str,
    message: str,
    now: datetime,
    *,
    warning: bool = False,
    instance: str | None = None,
    key: str | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about ``involved``, as ``kubectl describe`` shows it.

    Named by ``event_name`` from ``key`` (the message unless given).
    """
    stamp = format_time(now)
    name = event_name(involved, reason, message if key is None else key)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": involved.event_namespace},
        "involvedObject": {
            "apiVersion": involved.api_version or API_VERSIONS.get(involved.kind, "v1"),
            "kind": involved.kind,
            "name": involved.name,
            "namespace": involved.namespace,
            "uid": involved.uid,
        },
        "reason": reason,
        # The API server caps Event messages at 1 KiB.
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": (instance or socket.gethostname())[:128],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def event_repeat(resource_version: str, count: int, message: str, now: datetime) -> dict[str, Any]:
    """A merge patch that counts one more occurrence on an existing Event: compare-and-swap on
    the resourceVersion read, so two instances counting at once do not lose one."""
    return {
        "metadata": {"resourceVersion": resource_version},
        "count": count,
        "message": message[:1024],
        "lastTimestamp": format_time(now),
    }


class Recorder:
    """Records Events through ``api``; best effort (an Event is for people)."""

    def __init__(self, api: kube.Kube, clock: Callable[[], datetime]) -> None:
        self.api = api
        self.clock = clock

    def record(
        self,
        involved: Involved,
        reason: str,
        message: str,
        *,
        warning: bool = False,
        key: str | None = None,
        repeat: bool = True,
    ) -> bool:
        """Record an Event, once per (object, reason, key): the message unless ``key`` says
        otherwise. Seen again, a ``repeat`` Event counts one more occurrence; one that is not
        is already said and left alone. True when this call created it.

        Failing to write one (RBAC included: counting needs get and patch on events) is logged
        and must not undo or block what the Event reports.
        """
        now = self.clock()
        body = event_body(involved, reason, message, now, warning=warning, key=key)
        name = body["metadata"]["name"]
        namespace = involved.event_namespace
        what = f"{involved.kind} {involved.namespace + '/' if involved.namespace else ''}"
        what += involved.name
        try:
            self.api.create("Event", namespace, body)
            return True
        except kube.AlreadyExists:
            if not repeat:
                return False
        except kube.KubeError as exc:
            log.warning("could not record Event %s on %s: %s", reason, what, exc)
            return False
        for _ in range(REPEAT_ATTEMPTS):
            try:
                seen = self.api.get("Event", namespace, name)
                count = seen.get("count")
                patch = event_repeat(
                    str((seen.get("metadata") or {}).get("resourceVersion", "")),
                    (count if isinstance(count, int) and count > 0 else 1) + 1,
                    message,
                    now,
                )
                self.api.merge_patch("Event", namespace, name, patch)
                return False
            except kube.Conflict:
                continue  # counted by someone else meanwhile: read again
            except kube.KubeError as exc:
                log.warning("could not count Event %s again on %s: %s", reason, what, exc)
                return False
        log.info("gave up counting Event %s on %s: too busy", reason, what)
        return False
