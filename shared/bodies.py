"""Request bodies, built by pure code before anything is sent.

Handlers decide (``plan``), build the bodies here, then hand them to ``shared.kube``. Keeping
the bodies pure makes them table-testable and lets the replay tool show exactly what would be
sent.
"""

from __future__ import annotations

import copy
import hashlib
import json
import socket
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from shared.admission import NODE_NAME_FIELD
from shared.constants import (
    COMPONENT,
    EXCLUDED_NODES_ANNOTATION,
    KSE_SCHEDULED_HOSTS_ANNOTATION,
    PREFIX,
    STATE_ANNOTATION,
)
from shared.owners import Ref
from shared.policy import format_kube_time

# On a bare pod's replacement: the name of the first pod of the line, so that replacements
# are named after it and not after each other ("web-1a2b3-4c5d6").
ORIGIN_ANNOTATION: Final = PREFIX + "origin"
# Kubernetes object names are DNS subdomains: 253 characters at most.
_MAX_NAME: Final = 253


def state_patch(resource_version: str, state_json: str) -> dict[str, Any]:
    """A merge patch writing the state; the resourceVersion makes it a compare-and-swap
    (the API server answers 409 when the object changed since it was read)."""
    return {
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": {STATE_ANNOTATION: state_json},
        }
    }


def event_body(
    involved: Ref,
    reason: str,
    message: str,
    now: datetime,
    *,
    warning: bool = False,
    instance: str | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about a workload, as ``kubectl describe`` shows it."""
    stamp = format_kube_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved.name}.", "namespace": involved.namespace},
        "involvedObject": {
            "apiVersion": involved.api_version or _API_VERSIONS.get(involved.kind, "v1"),
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


_API_VERSIONS: Final = {
    "Pod": "v1",
    "ReplicaSet": "apps/v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "Job": "batch/v1",
    "CronJob": "batch/v1",
}


def replacement_name(snapshot: Mapping[str, Any]) -> str:
    """A name for the replacement of a bare pod, derived from the pod it replaces.

    Deterministic (a redelivered event finds the replacement it already created: 409
    AlreadyExists means done) and different for every pod replaced.
    """
    meta = snapshot.get("metadata") or {}
    origin = (meta.get("annotations") or {}).get(ORIGIN_ANNOTATION) or meta.get("name", "pod")
    digest = hashlib.sha256(str(meta.get("uid", "")).encode()).hexdigest()[:5]
    return f"{origin[: _MAX_NAME - 6]}-{digest}"


def replacement_pod(snapshot: Mapping[str, Any], state_json: str) -> dict[str, Any]:
    """A bare pod to create in place of a failing one: the same spec, unbound, carrying the
    state. The webhook stamps the exclusions (read from that state) on its way in, so our
    previous stamp and the affinity terms it produced are taken off here first."""
    meta = snapshot.get("metadata") or {}
    spec = copy.deepcopy(dict(snapshot.get("spec") or {}))
    annotations = dict(meta.get("annotations") or {})
    stamped = _stamped_nodes(annotations.get(EXCLUDED_NODES_ANNOTATION))
    for key in (EXCLUDED_NODES_ANNOTATION, KSE_SCHEDULED_HOSTS_ANNOTATION):
        annotations.pop(key, None)
    annotations[STATE_ANNOTATION] = state_json
    annotations.setdefault(ORIGIN_ANNOTATION, str(meta.get("name", "")))
    # Bound by the scheduler last time; unbound now so the scheduler chooses again.
    spec.pop("nodeName", None)
    _drop_exclusions(spec, stamped)
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": replacement_name(snapshot),
            "namespace": meta.get("namespace", ""),
            "annotations": annotations,
        },
        "spec": spec,
    }
    if meta.get("labels"):
        body["metadata"]["labels"] = dict(meta["labels"])
    return body


def _stamped_nodes(raw: str | None) -> set[str]:
    try:
        nodes = json.loads(raw) if raw else []
    except ValueError:
        return set()
    return {n for n in nodes if isinstance(n, str)} if isinstance(nodes, list) else set()


def _drop_exclusions(spec: dict[str, Any], nodes: set[str]) -> None:
    """Remove the ``metadata.name NotIn [node]`` requirements the webhook added."""
    if not nodes:
        return
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return

    def ours(req: Mapping[str, Any]) -> bool:
        values = req.get("values") or []
        return (
            req.get("key") == NODE_NAME_FIELD
            and req.get("operator") == "NotIn"
            and len(values) == 1
            and values[0] in nodes
        )

    kept_terms = []
    for term in terms:
        fields = term.get("matchFields") or []
        remaining = [req for req in fields if not ours(req)]
        if len(remaining) == len(fields):
            kept_terms.append(term)
            continue
        new_term = {k: v for k, v in term.items() if k != "matchFields"}
        if remaining:
            new_term["matchFields"] = remaining
        # A term that only held our requirements was ours; an empty one would match nothing.
        if new_term.get("matchExpressions") or new_term.get("matchFields"):
            kept_terms.append(new_term)
    if kept_terms:
        required["nodeSelectorTerms"] = kept_terms
        return
    node_affinity.pop("requiredDuringSchedulingIgnoredDuringExecution", None)
    if not node_affinity:
        affinity.pop("nodeAffinity", None)
    if not affinity:
        spec.pop("affinity", None)
