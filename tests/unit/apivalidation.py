"""What the API server checks on a pod our webhook patched, written out for tests.

Mirrors pkg/apis/core/validation (ValidateNodeSelector, ValidateNodeFieldSelectorRequirement,
whose node-name rule is apimachinery's NameIsDNSSubdomain) and apimachinery's
ValidateAnnotations size limit, independently of the product code: a patch the API server would
refuse fails every test that checks it. failurePolicy Ignore does not save such a pod.
"""

from __future__ import annotations

import re
from typing import Any, cast

from shared.api.kubetypes import Pod

# IsDNS1123Subdomain: at most 253 characters of this shape.
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def api_server_errors(pod: Pod) -> list[str]:
    """The field errors the API server would answer a create of this pod with (the parts our
    webhook can affect: the required node affinity and the annotations' total size)."""
    errors: list[str] = []
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items()) > 256 * 1024:
        errors.append("metadata.annotations: Too long: must have at most 262144 bytes")
    affinity = cast(dict[str, Any], pod.get("spec") or {}).get("affinity") or {}
    selector = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if selector is None:
        return errors
    terms = selector.get("nodeSelectorTerms") or []
    if not terms:
        errors.append(
            "nodeSelectorTerms: Required value: must have at least one node selector term"
        )
    for t, term in enumerate(terms):
        for r, req in enumerate(term.get("matchFields") or []):
            where = f"nodeSelectorTerms[{t}].matchFields[{r}]"
            if req.get("operator") not in ("In", "NotIn"):
                errors.append(f"{where}.operator: Invalid value: not a valid selector operator")
            elif len(req.get("values") or []) != 1:
                errors.append(
                    f"{where}.values: Required value: must be only one value when `operator` is "
                    "'In' or 'NotIn' for node field selector"
                )
            if req.get("key") != "metadata.name":
                errors.append(f"{where}.key: Invalid value: not a valid field selector key")
            for v, value in enumerate(req.get("values") or []):
                if len(value) > 253 or not DNS1123_SUBDOMAIN.fullmatch(value):
                    errors.append(f"{where}.values[{v}]: Invalid value: {value!r}")
    return errors
