"""Replacements that were created before their predecessor's failure was recorded.

Most failures leave the failing pod in place (a crash loop, a pull error): nothing replaces it
until update-annotations has written the state and deleted it, so the webhook stamps the new
exclusion on the replacement. A pod the kubelet itself failed (phase ``Failed``: Evicted,
OutOf*, Shutdown, NodeAffinity, ...) is different, and the local control plane shows how
(tests/e2e/test_terminal_pods.py):

- the ReplicaSet controller counts a Failed pod as gone and creates the replacement at once,
  milliseconds after the kubelet's status write and long before our pipeline records the node,
  so the webhook admits it with the old exclusions and the scheduler may put it right back on
  the node that just failed it;
- the StatefulSet controller deletes a Failed pod itself and recreates it under the same name:
  by the time update-annotations reads it, the failed pod is gone;
- the Job controller waits for its pod-failure back-off (10 s, then doubling) before it creates
  the next pod: the state is written first, and the exclusion reaches it without help.

So after recording a terminal failure, update-annotations looks for the replacement that was
admitted without the new exclusion and *redirects* it (deletes it, uid precondition; its owner
recreates it through the webhook, which now stamps the exclusion). Only a replacement that is
clearly one: same controller, created after the failed pod, within `REDIRECT_WINDOW` of now,
not carrying the exclusion, and either not yet bound or bound to the very node that failed its
predecessor. A replacement already placed on another node, or older than the window, is left
alone: nothing says its placement is wrong. A redirect is not a move: it is not charged, it
only finishes placing the pod the move was recorded for.

This module decides (pure); update-annotations lists the candidates and deletes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from shared.api.kubetypes import Pod
from shared.api.times import format_duration, parse_kube_time
from shared.workloads.classify import controller_of, excluded_nodes_of
from shared.workloads.siblings import PER_NODE_PREFIXES

# How long after its creation a replacement may still be redirected: detection and recording
# take seconds; a pod older than this was placed for reasons we did not see.
REDIRECT_WINDOW: Final = timedelta(seconds=60)
# Terminal phases: a pod in them is not a replacement that could run anywhere.
_TERMINAL: Final = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class Redirect:
    """A replacement to delete so that its owner recreates it with the new exclusion."""

    name: str
    uid: str
    why: str


def is_terminal_failure(pod: Mapping[str, Any]) -> bool:
    """The kubelet failed the whole pod: its controller replaces it without waiting for us."""
    return (pod.get("status") or {}).get("phase") == "Failed"


def label_selector(pod: Mapping[str, Any]) -> str | None:
    """A selector for the failed pod's siblings: all of its labels (its controller's template
    labels, pod-template-hash or controller-uid included) but the ones that say where it runs
    (``siblings.PER_NODE_PREFIXES``: copied from its Node at binding, which a replacement not
    yet bound, or bound in another zone, does not carry). None when none is left."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    kept = sorted((k, v) for k, v in labels.items() if not k.startswith(PER_NODE_PREFIXES))
    if not kept:
        return None
    return ",".join(f"{key}={value}" for key, value in kept)


def redirects(
    failed: Mapping[str, Any],
    node: str,
    candidates: Iterable[Mapping[str, Any]],
    now: datetime,
    *,
    window: timedelta = REDIRECT_WINDOW,
) -> tuple[Redirect, ...]:
    """The replacements of ``failed`` (which failed on ``node``) admitted without ``node``
    excluded, that must be recreated for the exclusion to apply.

    ``candidates`` are the pods that might be its replacement: its siblings (same labels) for
    a ReplicaSet or a Job, the pod now holding its name for a StatefulSet.
    """
    meta = failed.get("metadata") or {}
    failed_uid = meta.get("uid")
    owner = controller_of(failed)  # type: ignore[arg-type]
    owner_uid = owner.get("uid") if owner else None
    if not owner_uid or not node:
        # A bare pod is replaced by us, after the state is written: nothing raced it.
        return ()
    born_after = parse_kube_time(meta.get("creationTimestamp"))
    found = []
    for candidate in candidates:
        cmeta = candidate.get("metadata") or {}
        uid, name = cmeta.get("uid"), cmeta.get("name", "")
        if not uid or uid == failed_uid or cmeta.get("deletionTimestamp"):
            continue
        cowner = controller_of(candidate)  # type: ignore[arg-type]
        if cowner is None or cowner.get("uid") != owner_uid:
            continue
        if (candidate.get("status") or {}).get("phase") in _TERMINAL:
            continue
        created = parse_kube_time(cmeta.get("creationTimestamp"))
        if created is None or (born_after is not None and created < born_after):
            continue
        age = now - created
        if age > window:
            continue
        pod: Pod = candidate  # type: ignore[assignment]
        if node in excluded_nodes_of(pod):
            continue
        bound = (candidate.get("spec") or {}).get("nodeName")
        if bound and bound != node:
            continue
        where = f"bound to {node}, the node that failed it" if bound else "not yet bound"
        found.append(
            Redirect(
                name=name,
                uid=uid,
                why=(
                    f"pod {name} replaced {meta.get('name', '')} {format_duration(age)} ago, "
                    f"before the failure on {node} was recorded: admitted without {node} "
                    f"excluded and {where}; deleted so its owner recreates it avoiding {node}"
                ),
            )
        )
    return tuple(found)
