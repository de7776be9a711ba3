"""Request bodies, built by pure code before anything is sent.

Handlers decide (``plan``), build the bodies here, then hand them to ``shared.platform.kube``.
Keeping the bodies pure makes them table-testable and lets the replay tool show exactly what would
be sent.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from shared.api import barepods
from shared.api.avoidnodes import ANNOTATION as AVOID_NODES_ANNOTATION
from shared.api.keys import (
    EXCLUDED_NODES_ANNOTATION,
    KSE_SCHEDULED_HOSTS_ANNOTATION,
    NODE_NAME_FIELD,
    STATE_ANNOTATION,
)
from shared.platform import recorder
from shared.workloads.owners import Ref

# A bare pod's replacement: its origin annotation and its name live in shared.api.barepods
# (pure: assess-nodes derives the name too, to find where a move was recorded).
ORIGIN_ANNOTATION: Final = barepods.ORIGIN_ANNOTATION
replacement_name = barepods.replacement_name


def state_patch(
    resource_version: str, state_json: str, avoid_nodes: str | None = None
) -> dict[str, Any]:
    """A merge patch writing the state and, beside it, its exclusions flat for the admission
    policies (``shared.api.avoidnodes``; None removes them); the resourceVersion makes it a
    compare-and-swap (the API server answers 409 when the object changed since it was read)."""
    return {
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": {STATE_ANNOTATION: state_json, AVOID_NODES_ANNOTATION: avoid_nodes},
        }
    }


def _involved(ref: Ref) -> recorder.Involved:
    return recorder.Involved(ref.kind, ref.namespace, ref.name, ref.uid, ref.api_version)


def event_name(involved: Ref, reason: str, key: str) -> str:
    """The one name an Event about (workload or pod, reason, key) has (see
    ``shared.platform.recorder.event_name``)."""
    return recorder.event_name(_involved(involved), reason, key)


def event_body(
    involved: Ref,
    reason: str,
    message: str,
    now: datetime,
    *,
    warning: bool = False,
    instance: str | None = None,
    key: str | None = None,
) -> dict[str, Any]:
    """A core/v1 Event about a workload (or a pod), as ``kubectl describe`` shows it."""
    return recorder.event_body(
        _involved(involved), reason, message, now, warning=warning, instance=instance, key=key
    )


event_repeat = recorder.event_repeat


# Fields of a live pod's spec a create must not carry:
# - ephemeralContainers: `kubectl debug` adds them through the pods/ephemeralcontainers
#   subresource; ValidatePodCreate refuses any ("cannot be set on create").
# - nodeName: bound by the scheduler last time; unbound now so the scheduler chooses again.
# - priority, preemptionPolicy: the Priority admission plugin computes them from
#   priorityClassName on create and refuses a pod whose values differ (after a default
#   PriorityClass appeared, say), so they are left for it to fill in again.
# - overhead: the RuntimeClass admission plugin sets it from the RuntimeClass and refuses a pod
#   whose overhead does not match the class as it is now.
_NOT_ON_CREATE: Final = (
    "ephemeralContainers",
    "nodeName",
    "priority",
    "preemptionPolicy",
    "overhead",
)


def replacement_pod(
    snapshot: Mapping[str, Any], state_json: str, avoid_nodes: str | None = None
) -> dict[str, Any]:
    """A bare pod to create in place of a failing one: the same spec, unbound, carrying the
    state. The webhook stamps the exclusions (read from that state) on its way in, so our
    previous stamp and the affinity terms it produced are taken off here first, as is all
    the API server itself added to the spec on the first create and would refuse (or add a
    second time) on this one."""
    meta = snapshot.get("metadata") or {}
    spec = copy.deepcopy(dict(snapshot.get("spec") or {}))
    annotations = dict(meta.get("annotations") or {})
    labels = dict(meta.get("labels") or {})
    stamped = _stamped_nodes(annotations.get(EXCLUDED_NODES_ANNOTATION))
    for key in (EXCLUDED_NODES_ANNOTATION, KSE_SCHEDULED_HOSTS_ANNOTATION):
        annotations.pop(key, None)
    annotations[STATE_ANNOTATION] = state_json
    # The admission policies read the exclusions from here (a bare pod is its own holder).
    if avoid_nodes is None:
        annotations.pop(AVOID_NODES_ANNOTATION, None)
    else:
        annotations[AVOID_NODES_ANNOTATION] = avoid_nodes
    annotations.setdefault(ORIGIN_ANNOTATION, str(meta.get("name", "")))
    for field in _NOT_ON_CREATE:
        spec.pop(field, None)
    _drop_exclusions(spec, stamped)
    _drop_merged_label_keys(spec, labels)
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
    if labels:
        body["metadata"]["labels"] = labels
    return body


def _drop_merged_label_keys(spec: dict[str, Any], labels: Mapping[str, str]) -> None:
    """Undo what the API server merged into label selectors on the first create.

    For a pod (anti-)affinity term or a topology spread constraint with ``matchLabelKeys``
    (``mismatchLabelKeys``), the pod strategy appends ``key In [the pod's value]`` (``NotIn``)
    to its labelSelector at create time (mutatePodAffinity, mutateTopologySpreadConstraints in
    pkg/registry/core/pod/strategy.go). Sent again, it would be appended a second time, and
    validation refuses a key that is both in matchLabelKeys and in the selector. Validation
    also guarantees a user's own selector never names a matchLabelKeys key, so every
    requirement on such a key is the server's; for mismatchLabelKeys (which a user may also
    select on) only the last ``NotIn`` with the one value appended is taken off.
    """
    affinity = spec.get("affinity") or {}
    terms: list[dict[str, Any]] = []
    for kind in ("podAffinity", "podAntiAffinity"):
        section = affinity.get(kind) or {}
        terms.extend(section.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
        for weighted in section.get("preferredDuringSchedulingIgnoredDuringExecution") or []:
            if isinstance(weighted.get("podAffinityTerm"), dict):
                terms.append(weighted["podAffinityTerm"])
    terms.extend(spec.get("topologySpreadConstraints") or [])
    for term in terms:
        selector = term.get("labelSelector")
        if not isinstance(selector, dict) or not selector.get("matchExpressions"):
            continue
        match_keys = set(term.get("matchLabelKeys") or [])
        expressions = [e for e in selector["matchExpressions"] if e.get("key") not in match_keys]
        for key in reversed(term.get("mismatchLabelKeys") or []):
            if key not in labels:
                continue
            for i in range(len(expressions) - 1, -1, -1):
                e = expressions[i]
                if e.get("key") == key and e.get("operator") == "NotIn":
                    if len(e.get("values") or []) == 1:
                        del expressions[i]
                    break
        if expressions:
            selector["matchExpressions"] = expressions
        else:
            selector.pop("matchExpressions")


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
