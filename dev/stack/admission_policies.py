"""The admission policies on the local control plane: what `admission="policies"` installs.

The same objects knative/components/admission-policies holds, rendered from the local stack's
own settings (its functions run with settings of their own: dev/stack/functions.py), created
through the API as a user's `kubectl apply` would. Nothing else is registered: no webhook, no
certificate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from shared.admission.policies import PART_OF, render
from shared.platform.config import Config

_SELECTOR = ",".join(f"{k}={v}" for k, v in PART_OF.items())


def rendered(environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """The policies and bindings for functions run with ``environ``."""
    return render(Config.from_env(environ))


def install(api_client: k8s.ApiClient, objects: list[dict[str, Any]]) -> None:
    """Create (or replace) each policy and binding."""
    api = k8s.AdmissionregistrationV1Api(api_client)
    for obj in objects:
        name = obj["metadata"]["name"]
        policy = obj["kind"] == "MutatingAdmissionPolicy"
        try:
            if policy:
                api.delete_mutating_admission_policy(name)
            else:
                api.delete_mutating_admission_policy_binding(name)
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
        if policy:
            api.create_mutating_admission_policy(obj)  # type: ignore[arg-type]
        else:
            api.create_mutating_admission_policy_binding(obj)  # type: ignore[arg-type]


def uninstall(api_client: k8s.ApiClient) -> None:
    """Remove every policy and binding of ours (by the part-of label)."""
    api = k8s.AdmissionregistrationV1Api(api_client)
    api.delete_collection_mutating_admission_policy_binding(label_selector=_SELECTOR)
    api.delete_collection_mutating_admission_policy(label_selector=_SELECTOR)
