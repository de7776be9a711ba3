"""A bare pod's replacement: its name, and the annotation naming the first pod of its line.

A pod without a controller has nobody to recreate it, so update-annotations creates its
replacement and carries the pod's state over to it. The replacement's name is derived from the
pod it replaces, so that a redelivered event finds the replacement it already created (409
AlreadyExists means done), and assess-nodes finds where the move was recorded. Pure: the
writer (update-annotations) and the reader (assess-nodes) both import it from here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from shared.api.keys import PREFIX

# On a bare pod's replacement: the name of the first pod of the line, so that replacements
# are named after it and not after each other ("web-1a2b3-4c5d6").
ORIGIN_ANNOTATION: Final = PREFIX + "origin"
# Kubernetes object names are DNS subdomains: 253 characters at most.
MAX_NAME: Final = 253


def replacement_name(snapshot: Mapping[str, Any]) -> str:
    """A name for the replacement of a bare pod, derived from the pod it replaces.

    Deterministic (a redelivered event finds the replacement it already created: 409
    AlreadyExists means done) and different for every pod replaced.
    """
    meta = snapshot.get("metadata") or {}
    origin = (meta.get("annotations") or {}).get(ORIGIN_ANNOTATION) or meta.get("name", "pod")
    digest = hashlib.sha256(str(meta.get("uid", "")).encode()).hexdigest()[:5]
    return f"{origin[: MAX_NAME - 6]}-{digest}"
