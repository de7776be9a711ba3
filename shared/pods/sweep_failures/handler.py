"""The periodic sweep: find failing pods that no pod event announced.

ApiServerSource sends nothing for pods that were already failing when it started, and loses
changes while it re-establishes a watch; a send that fails after its own retries is only
logged. A PingSource therefore calls sweep-failures every few minutes; it lists pods a page at
a time, classifies them with the same code as detect-failures, also catches pods stuck Pending
on a node, and sends one ``io.kn-rescheduler.pod.failing`` event per failing pod to the Broker
(``K_SINK``).

Where the pages come from (measured on the local v1.36 API server, pinned by
tests/e2e/test_sweep_reads.py): a list without resourceVersion is served from the API server's
watch cache, not etcd. The first page is a consistent read (the API server asks etcd for its
current revision, one small request, and waits until its cache has caught up), the following
pages come from the cache's snapshot at that revision through the continue token. API servers
without the ConsistentListFromCache and ListFromCacheSnapshot features (before about v1.31 and
v1.34) read every such page from etcd; asking for resourceVersion=0 would avoid that at the
price of a possibly stale list, which a sweep that runs every few minutes could afford but
does not need on a current API server.

Sending an event that update-annotations already handled is harmless: it is idempotent.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import requests
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent

from shared.api.keys import EVENT_POD_FAILING, EVENT_SOURCE_PREFIX
from shared.api.kubetypes import Pod
from shared.platform import kube, metrics
from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.workloads.classify import (
    Started,
    classify,
    controller_of,
    pulling_since,
    started_containers,
    stuck_pending,
    unschedulable_due_to_exclusions,
    worth_forwarding,
)
from shared.workloads.evidence import read_image_pulls
from shared.workloads.podevents import ImagePull, PodEvent, warning_events
from shared.workloads.podshape import MalformedPod, judged

log = logging.getLogger(__name__)

Post = Callable[..., Any]


@dataclass(frozen=True)
class SweepResult:
    listed: int
    failing: int
    sent: int
    send_errors: int


def find_failures(
    pods: list[Pod] | Any,
    cfg: Config,
    now: datetime,
    events: Mapping[str, Sequence[PodEvent]] | None = None,
    pulls: Callable[[], Mapping[str, Sequence[ImagePull]]] = dict,
) -> list[FailingPod]:
    """Pure: the failing, opted-in pods among ``pods``; ``events`` are the kubelet's Warning
    Events about pods, by pod uid (podevents.warning_events); ``pulls`` reads the kubelets'
    image downloads by pod uid (podevents.image_pulls), called only when a pod still pulling
    has a sibling that started elsewhere."""
    events = events or {}
    found = []
    # One pass over the pages (memory stays flat): what every pod's containers started where,
    # and the few pods still starting, judged again at the end against their siblings.
    started: dict[str, list[Started]] = {}
    starting: list[Pod] = []
    # node -> (pod uid, when it began waiting for its images), every pod's: a pull queued
    # behind another's on its node is not judged early.
    waiting: dict[str, list[tuple[str, datetime]]] = {}
    for pod in pods:
        try:
            with judged(pod):
                for s in started_containers(pod):
                    started.setdefault(s.controller, []).append(s)
                since = pulling_since(pod)
                if since is not None:
                    waiting.setdefault(str(pod["spec"]["nodeName"]), []).append(
                        (str(pod.get("metadata", {}).get("uid", "")), since)
                    )
                # As in detect-failures: our own exclusions are always cleared, whatever the
                # policy.
                failure = unschedulable_due_to_exclusions(pod, cfg)
                if failure is None:
                    if not worth_forwarding(pod, cfg):
                        continue
                    uid = pod.get("metadata", {}).get("uid", "")
                    failure = classify(pod, cfg, now) or stuck_pending(
                        pod, cfg, now, events.get(uid, ())
                    )
                    if failure is None and _may_be_pulling(pod):
                        starting.append(pod)
                if failure is not None:
                    found.append(FailingPod.from_pod(pod, failure))
        except MalformedPod as exc:
            # Never from a real API server; a list that carried one is not worth a crash.
            log.warning("skipping an object that is not a pod: %s", exc)
            continue
    downloads: Mapping[str, Sequence[ImagePull]] | None = None
    for pod in starting:  # each already read once above without a fault
        ref = controller_of(pod) or {}
        siblings = started.get(str(ref.get("uid", "")), [])
        if not siblings:
            continue
        if downloads is None:
            downloads = pulls()
        uid = pod.get("metadata", {}).get("uid", "")
        ahead = [t for other, t in waiting.get(str(pod["spec"]["nodeName"]), []) if other != uid]
        failure = stuck_pending(pod, cfg, now, events.get(uid, ()), siblings, downloads, ahead)
        if failure is not None:
            found.append(FailingPod.from_pod(pod, failure))
    return found


def _may_be_pulling(pod: Pod) -> bool:
    """Pending on a node with its sandbox up: an image pull may be under way."""
    if pod.get("status", {}).get("phase") != "Pending" or not pod.get("spec", {}).get("nodeName"):
        return False
    conditions = pod.get("status", {}).get("conditions") or []
    return any(
        c.get("type") == "PodReadyToStartContainers" and c.get("status") == "True"
        for c in conditions
    )


def _direct_post(url: str, *, data: bytes, headers: dict[str, str], timeout: float) -> Any:
    """A POST straight to the sink, carrying its token to it alone: no proxy or .netrc from
    the environment (settings reach the pod through a shared ConfigMap, and a proxy would
    receive the Authorization header), no redirect followed."""
    with requests.Session() as session:
        session.trust_env = False
        return session.post(url, data=data, headers=headers, timeout=timeout, allow_redirects=False)


class Sweeper:
    def __init__(
        self,
        api: kube.Kube,
        cfg: Config,
        sink: str,
        *,
        post: Post | None = None,
        token: Callable[[], str | None] = lambda: None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        page_size: int = 500,
    ) -> None:
        self.api = api
        self.cfg = cfg
        self.sink = sink
        self.post = post if post is not None else _direct_post
        # Its own identity toward the sink (shared.platform.senders.sink_token), if mounted.
        self.token = token
        self.clock = clock
        self.page_size = page_size

    def sweep(self) -> SweepResult:
        listed = 0

        def counted() -> Any:
            nonlocal listed
            for pod in self.api.list_all("Pod", limit=self.page_size):
                listed += 1
                if not self.cfg.is_excluded_namespace(pod.get("metadata", {}).get("namespace")):
                    yield pod

        failing = find_failures(
            counted(), self.cfg, self.clock(), self._warning_events(), self._image_pulls
        )
        sent = errors = 0
        for item in failing:
            if self._send(item):
                sent += 1
            else:
                errors += 1
        result = SweepResult(listed, len(failing), sent, errors)
        log.info("sweep done", extra={"sweep": result.__dict__})
        return result

    def _warning_events(self) -> dict[str, tuple[PodEvent, ...]]:
        """The kubelet's Warning Events about pods, one paged list per sweep: what a pod stuck
        in ContainerCreating cannot say in its status (podevents.py). Without them (the list
        failed) the sweep judges by the status alone, as before."""
        try:
            return warning_events(
                self.api.list_all(
                    "Event",
                    limit=self.page_size,
                    field_selector="involvedObject.kind=Pod,type=Warning",
                )
            )
        except kube.KubeError as exc:
            log.warning("could not list pod events; judging by pod status alone: %s", exc)
            return {}

    def _image_pulls(self) -> dict[str, tuple[ImagePull, ...]]:
        """The kubelets' image downloads, by pod uid: the evidence that a pull still running
        beside a sibling's quick one is hung. Without them (the list failed) such a pull keeps
        its full threshold."""
        try:
            return read_image_pulls(self.api, None)
        except kube.KubeError as exc:
            log.warning("could not list image pulls; pulls keep their full threshold: %s", exc)
            return {}

    def _send(self, item: FailingPod) -> bool:
        metrics.FAILURES.labels(reason=item.failure.reason).inc()
        attributes = {
            "id": str(uuid.uuid4()),
            "type": EVENT_POD_FAILING,
            "source": EVENT_SOURCE_PREFIX + "sweep-failures",
            "subject": item.subject,
            "datacontenttype": "application/json",
        }
        headers, body = to_binary(CloudEvent(attributes, item.to_data()))
        if (token := self.token()) is not None:
            headers = {**headers, "Authorization": f"Bearer {token}"}
        try:
            response = self.post(self.sink, data=body, headers=headers, timeout=10)
        except requests.RequestException as exc:
            log.warning("could not send failing event for %s: %s", item.subject, exc)
            return False
        if not 200 <= response.status_code < 300:
            log.warning("sink answered %s for %s", response.status_code, item.subject)
            return False
        return True
