"""The evidence beside a pod, read again by whoever acts on a report about it.

A report (``io.kn-rescheduler.pod.failing``) is a claim: any pod of the cluster can post one
to a function's Service. What a function writes must rest on what it reads itself, so a
verdict the pod's status alone does not repeat is judged again from the same evidence the
sweep judged it on, read in this request:

- the kubelet's Warning Events about the pod, by its uid (``shared.workloads.podevents``): a
  sandbox the node failed to create, a volume source that does not exist, and for a pod its
  controller already removed (a StatefulSet's failed pod) the only witness left of why and where
  it failed: the kubelet records its rejections (``rejectPod`` in pkg/kubelet/kubelet.go:
  ``OutOfcpu``, ``NodeAffinity``, ``UnexpectedAdmissionError`` ...) and its evictions
  (``Evicted``, pkg/kubelet/eviction) as Events on the pod, with the node as ``source.host``;
- the started containers of the pod's siblings (``classify.started_containers``) and the
  kubelets' downloads of their images (their ``Pulled`` Events), the evidence that shortens a
  pull's threshold, and the pods on its node still waiting for theirs (a pull queued behind
  theirs is not judged early).

Reading is here, deciding is pure: ``failing_now`` is ``classify`` and ``stuck_pending`` over
what was read, with the full thresholds, the same code the sweep runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from shared.api.kubetypes import Pod
from shared.platform import kube
from shared.platform.config import Config
from shared.workloads.classify import (
    STUCK_PENDING,
    Failure,
    Started,
    classify,
    controller_of,
    pulling_since,
    started_containers,
    stuck_pending,
)
from shared.workloads.podevents import (
    FAILED_CREATE_POD_SANDBOX,
    PULLED,
    ImagePull,
    PodEvent,
    image_pulls,
    warning_events,
)
from shared.workloads.siblings import sibling_selector

# The sweep's own verdicts: a pod's status shows only ``ContainerCreating`` for them, and the
# evidence that makes them a failure is beside the pod.
SWEEP_VERDICTS: Final = frozenset({STUCK_PENDING, FAILED_CREATE_POD_SANDBOX})


@dataclass(frozen=True)
class PodEvidence:
    """What was read beside one pod. ``unread`` says what could not be read (a verdict that
    needs it is then not reached: the pod waits)."""

    events: tuple[PodEvent, ...] = ()
    started: tuple[Started, ...] = ()
    # The siblings' downloads, by pod uid.
    pulls: Mapping[str, tuple[ImagePull, ...]] = field(default_factory=dict)
    # When the other pods on the pod's node that still wait for their images began to: a pull
    # queued behind theirs is not judged early.
    pulling_on_node: tuple[datetime, ...] = ()
    unread: str = ""


def read_warning_events(api: kube.Kube, namespace: str, uid: str) -> tuple[PodEvent, ...]:
    """The Warning Events about the pod of ``uid``, one LIST in its namespace (by field
    selector: the API server filters). KubeError as it comes."""
    items = api.list_all(
        "Event",
        namespace,
        field_selector=f"involvedObject.uid={uid},type=Warning",
    )
    return warning_events(items).get(uid, ())


def read_evidence(api: kube.Kube, pod: Pod, *, siblings: bool) -> PodEvidence:
    """The pod's Warning Events and, with ``siblings``, its controller's started containers.
    What the API refuses (403: RBAC) is said in ``unread``; kube.Transient (5xx, timeouts) is
    raised, for the delivery to be retried rather than the pod taken for one not failing."""
    meta = pod.get("metadata", {})
    namespace, uid = str(meta.get("namespace", "")), str(meta.get("uid", ""))
    try:
        found = read_warning_events(api, namespace, uid)
    except kube.Transient:
        raise
    except kube.KubeError as exc:
        return PodEvidence(unread=f"its Events could not be listed ({exc})")
    started: list[Started] = []
    selector = sibling_selector(pod) if siblings and controller_of(pod) else None
    if selector is None:
        return PodEvidence(found)
    try:
        for other in api.list_all("Pod", namespace, label_selector=selector):
            started.extend(started_containers(other))  # type: ignore[arg-type]
    except kube.Transient:
        raise
    except kube.KubeError as exc:
        return PodEvidence(found, unread=f"the pods of its controller could not be listed ({exc})")
    if not started:
        return PodEvidence(found)
    try:
        pulls = read_image_pulls(api, namespace)
        queued = pulling_on_node(api, pod)
    except kube.Transient:
        raise
    except kube.KubeError as exc:
        return PodEvidence(
            found,
            tuple(started),
            unread=f"its siblings' image pulls or its node's pods could not be read ({exc})",
        )
    return PodEvidence(found, tuple(started), pulls, queued)


def pulling_on_node(api: kube.Kube, pod: Pod) -> tuple[datetime, ...]:
    """When the other pods bound to ``pod``'s node that still wait for their images began to
    (one LIST by field selector, every namespace). KubeError as it comes."""
    node = pod.get("spec", {}).get("nodeName")
    uid = pod.get("metadata", {}).get("uid")
    if not node:
        return ()
    found = []
    for other in api.list_all("Pod", None, field_selector=f"spec.nodeName={node}"):
        since = pulling_since(other)  # type: ignore[arg-type]
        if since is not None and other.get("metadata", {}).get("uid") != uid:
            found.append(since)
    return tuple(found)


def read_image_pulls(api: kube.Kube, namespace: str | None) -> dict[str, tuple[ImagePull, ...]]:
    """The kubelets' downloads for pods in ``namespace`` (all with None), by pod uid: their
    Pulled Events, one LIST filtered by the API server. KubeError as it comes."""
    items = api.list_all(
        "Event", namespace, field_selector=f"involvedObject.kind=Pod,reason={PULLED}"
    )
    return image_pulls(items)


def failing_now(pod: Pod, cfg: Config, now: datetime, evidence: PodEvidence) -> Failure | None:
    """The pod's failure by the full rules, judged on the pod as read and the evidence read
    beside it: the verdicts of the detector and of the sweep, never the report's."""
    return classify(pod, cfg, now) or stuck_pending(
        pod,
        cfg,
        now,
        evidence.events,
        evidence.started,
        evidence.pulls,
        evidence.pulling_on_node,
    )


def kubelet_recorded(
    events: tuple[PodEvent, ...], reason: str, node: str, *, namespace: str, name: str
) -> PodEvent | None:
    """The kubelet's Warning Event of ``reason`` on ``node`` about the pod ``namespace/name``:
    the witness of a failure whose pod is gone (its controller removed it). The Event must
    name the pod itself, not only its uid: a report may borrow another pod's uid and Event."""
    for event in events:
        if (event.reason, event.node, event.namespace, event.pod) == (
            reason,
            node,
            namespace,
            name,
        ):
            return event
    return None
