"""The kubelet's Events about a pod: evidence its status does not carry.

Some failures leave nothing in a pod's status but ``ContainerCreating``: a node that cannot
create the pod's sandbox (a broken CNI plugin, a broken runtime) and a volume whose source does
not exist (a missing ConfigMap or Secret). Recorded from kubelet v1.36.3
(tests/fixtures/real-kubelet/sandbox-cni-broken.json, sandbox-runtime-broken.json,
missing-configmap-volume.json): the pod's status is the same in all three, and only its Events
tell them apart, ``FailedCreatePodSandBox`` (the node's) from ``FailedMount`` (the pod's own,
on every node).

The kubelet writes them through its legacy event recorder as core/v1 Events:
``involvedObject`` names the pod (with its uid), ``source.host`` the node, and repeats of
the same reason and message are folded into ``count`` between ``firstTimestamp`` and
``lastTimestamp`` (client-go's tools/record EventCorrelator). Events outlive their pod (an
hour, by default), so they are keyed by the pod's uid, never its name, which a StatefulSet
reuses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from shared.api.times import parse_duration, parse_kube_time

# The kubelet's reasons (pkg/kubelet/events/event.go).
FAILED_CREATE_POD_SANDBOX: Final = "FailedCreatePodSandBox"
FAILED_MOUNT: Final = "FailedMount"
PULLED: Final = "Pulled"
# MountVolume.SetUp failed for volume "cfg" : configmap "app-config" not found; the same for a
# Secret (pkg/volume/configmap, pkg/volume/secret): the object is missing, on every node. A
# ConfigMap or Secret marked optional never fails this way.
_MISSING_SOURCE: Final = re.compile(r'\b(configmap|secret) "[^"]+" not found')


@dataclass(frozen=True)
class PodEvent:
    """One Warning Event about a pod, as the kubelet wrote it."""

    reason: str
    message: str
    node: str
    count: int
    first: datetime | None
    last: datetime | None
    # The pod the Event is about, as its involvedObject names it.
    pod: str = ""
    namespace: str = ""


def warning_events(items: Iterable[Mapping[str, Any]]) -> dict[str, tuple[PodEvent, ...]]:
    """Warning Events about pods, by the pod's uid, in the order listed."""
    found: dict[str, list[PodEvent]] = {}
    for item in items:
        involved = item.get("involvedObject") or {}
        uid = involved.get("uid")
        if involved.get("kind") != "Pod" or not uid or item.get("type") != "Warning":
            continue
        first = parse_kube_time(item.get("firstTimestamp")) or parse_kube_time(
            item.get("eventTime")
        )
        last = parse_kube_time(item.get("lastTimestamp")) or first
        count = item.get("count")
        event = PodEvent(
            reason=str(item.get("reason") or ""),
            message=str(item.get("message") or ""),
            node=str((item.get("source") or {}).get("host") or item.get("reportingInstance") or ""),
            count=count if isinstance(count, int) and count > 0 else 1,
            first=first,
            last=last,
            pod=str(involved.get("name") or ""),
            namespace=str(involved.get("namespace") or ""),
        )
        found.setdefault(str(uid), []).append(event)
    return {uid: tuple(events) for uid, events in found.items()}


def missing_volume_source(events: Iterable[PodEvent], since: datetime) -> str | None:
    """The kubelet's message when a volume's ConfigMap or Secret does not exist, written again
    since ``since``, else None. The kubelet retries a failed mount at most 2m2s apart
    (pkg/util/goroutinemap/exponentialbackoff) and each failure renews the Event's
    lastTimestamp: an older one is from before the object was created, and says nothing
    about why the pod is still waiting now."""
    for event in events:
        recent = event.last is not None and event.last >= since
        if event.reason == FAILED_MOUNT and recent and _MISSING_SOURCE.search(event.message):
            return event.message
    return None


# Sandbox failures that follow the pod, on every node: a Multus network attachment the pod
# names that does not exist in its namespace (GitOps applying the pod before its
# NetworkAttachmentDefinition). Multus writes the lister's error into the CNI failure
# (getKubernetesDelegate: 'cannot find a network-attachment-definition (x) in namespace (y):
# network-attachment-definitions.k8s.cni.cncf.io "x" not found').
_POD_OWN_SANDBOX: Final = (
    re.compile(r"cannot find a network-attachment-definition"),
    re.compile(r'network-attachment-definitions?\.k8s\.cni\.cncf\.io "[^"]+" not found'),
    # The pod's network annotation names an attachment of another namespace while Multus
    # isolates namespaces (GetPodNetwork), or is not valid JSON (parsePodNetworkAnnotation).
    re.compile(r"namespace isolation violation"),
    re.compile(r"parsePodNetworkAnnotation"),
)
# Sandbox failures that may follow the pod or its node, no telling which from the message: a
# RuntimeClass handler the runtime does not know (containerd: 'failed to get sandbox runtime:
# no runtime for "x" is configured': missing on this node, or on every node), and pod IP
# addresses running out (host-local IPAM: 'no IP addresses available in range set', a per-node
# range; a cloud CNI's subnet runs out for every node). They wait for the full threshold
# (``pending_stuck_after``), never the 30 s of a node's own sandbox failure.
_DOUBTFUL_SANDBOX: Final = (
    re.compile(r'no runtime for "[^"]*" is configured'),
    re.compile(r"no IP addresses available", re.IGNORECASE),
    re.compile(r"failed to (allocate|assign) (for range|an IP)", re.IGNORECASE),
    # Cilium's IPAM ('unable to allocate IP via local cilium agent: [POST /ipam][502]
    # postIpamFailure "all CIDR ranges are exhausted"', or "range is full", or in CRD mode
    # "no IPs currently available on the node"): a node's pool, or every node's at once.
    re.compile(r"unable to allocate IP via local cilium agent", re.IGNORECASE),
    re.compile(r"all CIDR ranges are exhausted", re.IGNORECASE),
    re.compile(r"range is full", re.IGNORECASE),
    re.compile(r"no IPs currently available", re.IGNORECASE),
)


def sandbox_follows_pod(message: str) -> bool:
    """Whether a sandbox failure's message says the pod's own configuration is why."""
    return any(p.search(message) for p in _POD_OWN_SANDBOX)


def sandbox_doubtful(message: str) -> bool:
    """Whether a sandbox failure's message may as well be the pod's as the node's."""
    return any(p.search(message) for p in _DOUBTFUL_SANDBOX)


@dataclass(frozen=True)
class SandboxFailures:
    """The kubelet's failures to create a pod's sandbox on one node."""

    attempts: int
    first: datetime
    message: str


def sandbox_failures(events: Iterable[PodEvent], node: str) -> SandboxFailures | None:
    """``FailedCreatePodSandBox`` on ``node``: how many, since when, the latest message."""
    mine = [
        e for e in events if e.reason == FAILED_CREATE_POD_SANDBOX and e.node == node and e.first
    ]
    if not mine:
        return None
    firsts = [e.first for e in mine if e.first is not None]
    latest = max(mine, key=lambda e: e.last or e.first or firsts[0])
    return SandboxFailures(
        attempts=sum(e.count for e in mine), first=min(firsts), message=latest.message
    )


# The kubelet's Normal Event when its runtime pulled an image (pkg/kubelet/images/
# image_manager.go, EnsureImageExists): 'Successfully pulled image "x" in 1.234s (1.5s including
# waiting). Image size: N bytes.' since v1.29; without the size before, and without "including
# waiting" before v1.26. The first duration is the pull itself, the second counts the time the
# request waited for the node's other pulls (image pulls are serialized by default). An image the
# node already had, under imagePullPolicy IfNotPresent, gets 'Container image "x" already present
# on machine' under the same reason: no pull at all, not an ImagePull here. Under policy Always
# every start pulls, and a node that has the layers only resolves the manifest: "Successfully
# pulled" in milliseconds for gigabytes (recorded: tests/fixtures/real-kubelet/crashloop.json,
# five pulls of 39-572 ms for one crash-looping container). ``downloaded`` tells them apart.
_PULLED: Final = re.compile(
    r'^Successfully pulled image "(?P<image>[^"]+)" in (?P<pull>[0-9.a-z\u00b5\u03bc]+)'
    r"(?: \((?P<total>[0-9.a-z\u00b5\u03bc]+) including waiting\))?"
    r"(?:\. Image size: (?P<size>[0-9]+) bytes\.)?"
)
# Faster than this, a "pull" of a whole image fetched little or nothing: its layers were on the
# node already. A 10 GbE link's line rate is about 1.2 GB/s; unpacking the layers is slower.
_DOWNLOAD_RATE_MAX: Final = 1 << 30  # bytes per second
# The container an Event is about, as the kubelet's reference names it (pkg/kubelet/container
# /ref.go GenerateContainerRef): "spec.containers{app}", "spec.initContainers{init}".
_FIELD_PATH: Final = re.compile(
    r"^spec\.(?:initContainers|containers|ephemeralContainers)\{(.+)\}$"
)


@dataclass(frozen=True)
class ImagePull:
    """One download of an image by a kubelet for a pod's container, from its ``Pulled`` Event.

    ``began`` is when the kubelet asked for it (the Event's time less the time it took with
    its wait), ``took`` the pull itself, ``size`` the image's size in bytes (None before
    kubelet v1.29)."""

    container: str
    image: str
    node: str
    began: datetime
    took: timedelta
    size: int | None = None

    @property
    def downloaded(self) -> bool:
        """Whether the pull fetched the image rather than found its layers on the node: only
        a size and a time that no network reaches (_DOWNLOAD_RATE_MAX) say which, so a pull
        with no size is not taken for a download."""
        if self.size is None:
            return False
        return self.size <= _DOWNLOAD_RATE_MAX * self.took.total_seconds()


def image_pulls(items: Iterable[Mapping[str, Any]]) -> dict[str, tuple[ImagePull, ...]]:
    """The images kubelets pulled for pods, by the pod's uid: each Pulled Event whose message
    says a pull happened. Images already present, Events of other kinds and messages that do
    not parse are left out (no evidence, never a guess)."""
    found: dict[str, list[ImagePull]] = {}
    for item in items:
        involved = item.get("involvedObject") or {}
        uid = involved.get("uid")
        if involved.get("kind") != "Pod" or not uid or item.get("reason") != PULLED:
            continue
        container = _FIELD_PATH.match(str(involved.get("fieldPath") or ""))
        pulled = _PULLED.match(str(item.get("message") or ""))
        at = parse_kube_time(item.get("lastTimestamp")) or parse_kube_time(item.get("eventTime"))
        node = str((item.get("source") or {}).get("host") or item.get("reportingInstance") or "")
        if container is None or pulled is None or at is None or not node:
            continue
        try:
            took = parse_duration(pulled.group("pull"))
            total = parse_duration(pulled.group("total") or pulled.group("pull"))
        except ValueError:
            continue
        size = int(pulled.group("size")) if pulled.group("size") else None
        pull = ImagePull(container.group(1), pulled.group("image"), node, at - total, took, size)
        found.setdefault(str(uid), []).append(pull)
    return {uid: tuple(pulls) for uid, pulls in found.items()}
