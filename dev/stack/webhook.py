"""Serving mutate-admission over TLS and registering it with the API server.

The API server calls webhooks over HTTPS only. Locally the webhook runs on 127.0.0.1 with a
serving certificate from a CA made at start-up; the registration names it by URL and carries
that CA in caBundle, so it is the real API server that calls it on every pod CREATE.

``make_client_tls`` makes what client-certificate authentication of the API server needs: a CA
of its own for webhook clients (the webhook's TLS_CLIENT_CA_FILE) and a client certificate
from it (what the API server's AdmissionConfiguration kubeconfig presents).
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kubernetes import client as k8s

from dev.localcluster.pki import issue, make_ca
from shared.api.keys import (
    DEFAULT_NAMESPACE,
    IGNORE_DISRUPTIONS_ANNOTATION,
    OPT_OUT_LABEL,
    OPTED_IN_LABEL,
    OPTED_IN_VALUE,
)

NAME: Final = "kn-rescheduler-mutate-admission"
# The identity the API server presents to the webhook (a name, no groups: the webhook checks
# the signature only).
CLIENT_NAME: Final = "kube-apiserver-webhook-client"


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.crt, tls.crt, tls.key) for a server on 127.0.0.1."""
    ca = make_ca("kn-rescheduler-webhook-ca")
    ca_crt, _ = ca.write(directory, "webhook-ca")
    crt, key = issue(
        ca, "127.0.0.1", ip_addresses=("127.0.0.1",), dns_names=("localhost",), server=True
    ).write(directory, "webhook")
    return ca_crt, crt, key


@dataclass(frozen=True)
class ClientTLS:
    """A CA for the webhook's clients, and a client certificate it signed."""

    ca: Path
    crt: Path
    key: Path


def make_client_tls(directory: Path, common_name: str = CLIENT_NAME) -> ClientTLS:
    """A CA used for nothing but webhook clients (so no other certificate of the cluster is
    accepted) and a client certificate from it."""
    ca = make_ca("kn-rescheduler-webhook-client-ca")
    ca_crt, _ = ca.write(directory, "webhook-client-ca")
    crt, key = issue(ca, common_name, client=True).write(directory, "webhook-client")
    return ClientTLS(ca_crt, crt, key)


# Which creates the API server sends at all (matchConditions, CEL evaluated in the API server;
# GA since Kubernetes 1.30). The policy is on a pod's owner, so no selector can tell an opted-in
# pod; these leave out only what mutate-admission never changes, whatever the owner says:
#
# - a pod whose controller is of a kind it does not follow (a DaemonSet's, a static pod's
#   mirror owned by its Node, an operator's own kind): shared.workloads.owners.resolve finds no
#   holder for it, and the webhook answers it unchanged. A pod with no controller is sent: its
#   own annotations, or its namespace's labels, may opt it in.
# - a Job that neither asks for ignore-disruptions itself nor was made by a CronJob, whose
#   annotations could ask for it (shared.admission.handler decide_job: "not asked").
#
# tests/e2e/test_webhook_match.py creates each kind on the real API server and checks which
# reach the webhook, and that the webhook would have changed nothing on the others.
POD_MATCH: Final = (
    "!has(object.metadata.ownerReferences)"
    " || !object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller)"
    " || object.metadata.ownerReferences.exists(r, has(r.controller) && r.controller"
    " && ((r.apiVersion == 'apps/v1' && (r.kind == 'ReplicaSet' || r.kind == 'StatefulSet'))"
    " || (r.apiVersion == 'batch/v1' && r.kind == 'Job')))"
)
JOB_MATCH: Final = (
    f"(has(object.metadata.annotations) && '{IGNORE_DISRUPTIONS_ANNOTATION}' in"
    " object.metadata.annotations)"
    " || (has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(r,"
    " has(r.controller) && r.controller && r.apiVersion == 'batch/v1' && r.kind == 'CronJob'))"
)


def configuration(
    url: str, ca_crt: Path, *, name: str = NAME, timeout_seconds: int = 5
) -> dict[str, Any]:
    """The MutatingWebhookConfiguration, as knative/ ships it but reached by URL."""
    pods = _webhook("pods.kn-rescheduler.io", url, ca_crt, timeout_seconds, "", "pods")
    pods["matchConditions"] = [{"name": "owner-kind-followed", "expression": POD_MATCH}]
    # The same function, for Jobs being created (a Job asking for free moves gets its pod
    # failure policy; see shared/workloads/jobs.py). A separate webhook, so each rule stays
    # obvious.
    jobs = _webhook("jobs.kn-rescheduler.io", url, ca_crt, timeout_seconds, "batch", "jobs")
    jobs["matchConditions"] = [{"name": "ignore-disruptions-asked", "expression": JOB_MATCH}]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [pods, jobs],
    }


def _webhook(
    name: str, url: str, ca_crt: Path, timeout_seconds: int, group: str, resource: str
) -> dict[str, Any]:
    return {
        "name": name,
        "clientConfig": {
            "url": url,
            "caBundle": base64.b64encode(ca_crt.read_bytes()).decode(),
        },
        "rules": [
            {
                "apiGroups": [group],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": [resource],
                "scope": "Namespaced",
            }
        ],
        # Never block pod creation: a webhook that is down or slow is skipped.
        "failurePolicy": "Ignore",
        "timeoutSeconds": timeout_seconds,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "reinvocationPolicy": "Never",
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", DEFAULT_NAMESPACE],
                }
            ]
        },
        "objectSelector": {
            "matchExpressions": [{"key": OPT_OUT_LABEL, "operator": "DoesNotExist"}]
        },
    }


def register(api_client: k8s.ApiClient, body: dict[str, Any]) -> None:
    """Create (or replace) the registration named in ``body``."""
    api = k8s.AdmissionregistrationV1Api(api_client)
    try:
        api.delete_mutating_webhook_configuration(body["metadata"]["name"])
    except k8s.ApiException as exc:
        if exc.status != 404:
            raise
    api.create_mutating_webhook_configuration(body)  # type: ignore[arg-type]


# A namespace every cluster has and the registration's namespaceSelector does not leave out: a
# dry-run create there writes nothing.
PROBE_NAMESPACE: Final = "kube-public"


def called_by_the_api_server(api_client: k8s.ApiClient, namespace: str = PROBE_NAMESPACE) -> bool:
    """Whether a pod created now goes through the webhook: a dry-run create of an opted-in pod
    comes back with the opt-in label the webhook sets. Nothing is written."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "webhook-probe-", "annotations": {"scheduling-retries": "1"}},
        "spec": {"containers": [{"name": "probe", "image": "registry.k8s.io/pause:3.10"}]},
    }
    api = k8s.CoreV1Api(api_client)
    try:
        made = api.create_namespaced_pod(namespace, pod, dry_run="All")  # type: ignore[arg-type]
    except k8s.ApiException as exc:
        if exc.status == 404:
            return False  # a control plane just started: its system namespaces come soon
        raise
    labels = (made.metadata.labels if made.metadata else None) or {}
    return labels.get(OPTED_IN_LABEL) == OPTED_IN_VALUE


def wait_until_called(
    api_client: k8s.ApiClient, timeout: float = 30.0, namespace: str = PROBE_NAMESPACE
) -> None:
    """Wait until the API server calls the webhook just registered.

    The API server's admission plugin reads registrations from an informer, so a pod created
    the moment after the registration may be admitted without the call, and failurePolicy
    Ignore hides that: whatever a test or the demo creates next would miss the webhook."""
    deadline = time.monotonic() + timeout
    while not called_by_the_api_server(api_client, namespace):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the API server did not call the webhook within {timeout:.0f}s of its "
                f"registration (a dry-run pod in {namespace} came back without the opt-in label)"
            )
        time.sleep(0.1)


def unregister(api_client: k8s.ApiClient, name: str = NAME) -> None:
    try:
        k8s.AdmissionregistrationV1Api(api_client).delete_mutating_webhook_configuration(name)
    except k8s.ApiException as exc:
        if exc.status != 404:
            raise
