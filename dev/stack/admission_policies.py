"""The admission policies on the local control plane: what `admission="policies"` installs.

The same objects knative/components/admission-policies holds, rendered from the local stack's
own settings (its functions run with settings of their own: dev/stack/functions.py), created
or updated through the API as a user's `kubectl apply` would. Nothing else is registered: no
webhook, no certificate.

Never deleted, only disabled: Kubernetes 1.36 stops the API server's informer for a built-in
param kind once no binding names it, and a binding created later reads that informer's last
state for the life of the process (kubernetes/kubernetes#130887; docs/install-choices.md,
"Admission: webhook or policies"). So ``disable`` points the bindings at no namespace, and
``install`` updates them in place; ``wait_until_params`` checks that a ReplicaSet created now
is a param of the pod policies.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any, Final

from kubernetes import client as k8s

from shared.admission.policies import PART_OF, render
from shared.api.keys import (
    ADMISSION_PARAM_LABEL,
    ADMISSION_PARAM_VALUE,
    OPTED_IN_LABEL,
    OPTED_IN_VALUE,
    POLICY_ANNOTATION,
)
from shared.platform.config import Config

_SELECTOR: Final = ",".join(f"{k}={v}" for k, v in PART_OF.items())
# A namespace selector no namespace matches: a binding that selects nothing.
_NOWHERE: Final = {"matchLabels": {"kn-rescheduler.io/admission-disabled": "never-set"}}
PROBE_NAMESPACE: Final = "kube-public"


def rendered(environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """The policies and bindings for functions run with ``environ``."""
    return render(Config.from_env(environ))


def install(api_client: k8s.ApiClient, objects: list[dict[str, Any]]) -> None:
    """Create each policy and binding, or update the one there (in place: see above)."""
    api = k8s.AdmissionregistrationV1Api(api_client)
    for obj in objects:
        name = obj["metadata"]["name"]
        policy = obj["kind"] == "MutatingAdmissionPolicy"
        try:
            current = (
                api.read_mutating_admission_policy(name)
                if policy
                else api.read_mutating_admission_policy_binding(name)
            )
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
            current = None
        if current is None:
            if policy:
                api.create_mutating_admission_policy(obj)  # type: ignore[arg-type]
            else:
                api.create_mutating_admission_policy_binding(obj)  # type: ignore[arg-type]
            continue
        assert current.metadata is not None
        body = {**obj, "metadata": {**obj["metadata"]}}
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        if policy:
            api.replace_mutating_admission_policy(name, body)  # type: ignore[arg-type]
        else:
            api.replace_mutating_admission_policy_binding(name, body)  # type: ignore[arg-type]


def disable(api_client: k8s.ApiClient) -> None:
    """Make every binding of ours select no namespace (the policies stay, and the API server
    keeps its param informers running)."""
    api = k8s.AdmissionregistrationV1Api(api_client)
    for binding in api.list_mutating_admission_policy_binding(label_selector=_SELECTOR).items:
        assert binding.metadata is not None and binding.metadata.name
        api.patch_mutating_admission_policy_binding(
            binding.metadata.name, {"spec": {"matchResources": {"namespaceSelector": _NOWHERE}}}
        )


def wait_until_params(api_client: k8s.ApiClient, timeout: float = 30.0) -> None:
    """Wait until a pod of a ReplicaSet created now gets the policy stamp from its params.

    Creates one ReplicaSet in kube-public (one pod no scheduler places: a ReplicaSet at 0 is no
    param) and deletes it again, its pod with it; a dry run of a
    pod it owns must come back with the opt-in label. It fails with what to do when it does
    not: the API server's param informer has stopped (see the module docstring)."""
    apps, core = k8s.AppsV1Api(api_client), k8s.CoreV1Api(api_client)
    name = "kn-rescheduler-probe-" + uuid.uuid4().hex[:8]
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "annotations": {POLICY_ANNOTATION: "1"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"probe": name}},
            "template": {
                "metadata": {"labels": {"probe": name}},
                "spec": {
                    "schedulerName": "nobody",
                    "containers": [{"name": "p", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }
    rs = apps.create_namespaced_replica_set(PROBE_NAMESPACE, body)  # type: ignore[arg-type]
    assert rs.metadata is not None
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "probe-",
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": name,
                    "uid": rs.metadata.uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "p", "image": "registry.k8s.io/pause:3.10"}]},
    }
    deadline = time.monotonic() + timeout
    try:
        touches = 0
        while True:
            # The API server reads new policies from an informer too: a ReplicaSet created
            # before the param-label policy was in force is labelled at its next update.
            current = apps.read_namespaced_replica_set(name, PROBE_NAMESPACE)
            labels = (current.metadata.labels if current.metadata else None) or {}
            if labels.get(ADMISSION_PARAM_LABEL) != ADMISSION_PARAM_VALUE:
                touches += 1
                apps.patch_namespaced_replica_set(
                    name, PROBE_NAMESPACE, {"metadata": {"annotations": {"probe": str(touches)}}}
                )
            else:
                made = core.create_namespaced_pod(PROBE_NAMESPACE, pod, dry_run="All")  # type: ignore[arg-type]
                stamped = (made.metadata.labels if made.metadata else None) or {}
                if stamped.get(OPTED_IN_LABEL) == OPTED_IN_VALUE:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"a pod of ReplicaSet {PROBE_NAMESPACE}/{name} (scheduling-retries: 1, "
                    f"labelled: {labels.get(ADMISSION_PARAM_LABEL) == ADMISSION_PARAM_VALUE}) "
                    f"was admitted without the opt-in label for {timeout:.0f}s: the API server "
                    "does not see new params. If kn-rescheduler's admission policies were "
                    "deleted since kube-apiserver started, restart it "
                    "(kubernetes/kubernetes#130887)"
                )
            time.sleep(0.2)
    finally:
        apps.delete_namespaced_replica_set(name, PROBE_NAMESPACE)
