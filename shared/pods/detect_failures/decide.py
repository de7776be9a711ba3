"""Is this pod event a failure another node could fix? The logic of detect-failures.

It runs on every pod add and update in the cluster, so it is pure and needs no Kubernetes API
access at all (the function's ServiceAccount has no rights): the webhook stamped the policy on
each pod at creation, so the pod event alone says whether the pod is opted in and failing.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Final

from shared.api.keys import APISERVER_ADD, APISERVER_UPDATE, EVENT_POD_FAILING
from shared.api.kubetypes import Pod
from shared.platform import events, metrics
from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.workloads.classify import (
    Failure,
    FailureKind,
    classify,
    unschedulable_due_to_exclusions,
    worth_forwarding,
)
from shared.workloads.fastpath import early_config, killed_at_its_own_limit
from shared.workloads.podshape import MalformedPod, judged

_WATCHED: Final = frozenset({APISERVER_ADD, APISERVER_UPDATE})


def detect(event: events.Event, cfg: Config, now: datetime | None = None) -> events.Reply | None:
    """The reply for one ApiServerSource pod event: a failing-pod event, or None.

    ``now`` is the clock for the rules that need a failure to have lasted (None: the current
    time, what the function uses).
    """
    if event.type not in _WATCHED:
        return None
    if event.attributes.get("kind", "Pod") != "Pod":
        return None
    pod = event.data
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise events.BadEvent("event data is not a Kubernetes object")
    meta = pod["metadata"]
    if not all(
        isinstance(meta.get(key), str) and meta[key] for key in ("name", "namespace", "uid")
    ):
        # Every stored pod has all three; update-annotations needs the uid for its delete
        # precondition, so a pod without one is refused here, one hop earlier.
        raise events.BadEvent("pod without metadata.name, metadata.namespace or metadata.uid")
    typed: Pod = pod  # type: ignore[assignment]
    try:
        with judged(typed):
            # A pod our own exclusions keep from being scheduled is always forwarded, whatever
            # its policy: with "0" nobody else would ever clear them.
            failure = unschedulable_due_to_exclusions(typed, cfg)
            if failure is None:
                if not worth_forwarding(typed, cfg):
                    return None
                failure = classify(typed, cfg, now)
                if failure is None and (cfg.suspect_fast_path or cfg.corroborated_fast_path):
                    failure = _early(typed, cfg, now)
            if failure is None:
                return None
            failing = FailingPod.from_pod(typed, failure)
    except MalformedPod as exc:
        raise events.BadEvent(f"not a pod the API server sends: {exc}") from exc
    if failure.kind is not FailureKind.EARLY:
        metrics.FAILURES.labels(reason=failure.reason).inc()
    return events.Reply(type=EVENT_POD_FAILING, subject=failing.subject, data=failing.to_data())


def _early(pod: Pod, cfg: Config, now: datetime | None) -> Failure | None:
    """The pod's first node-fixable failure, reported early for the fast path: acted on only
    with evidence beside the pod (update-annotations reads it: shared/workloads/fastpath.py)."""
    found = classify(pod, early_config(cfg), now)
    if found is None or killed_at_its_own_limit(pod, found):
        return None
    return replace(found, kind=FailureKind.EARLY, why=f"first failure: {found.why}")
