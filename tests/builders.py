"""The Kubernetes objects the tests build, each written once: what a test sends the API server,
and, given what the server fills in, what it returns.

A plain module beside the test directories, not a conftest: unit, handler and end-to-end tests
all build the same Deployments and pod templates, and a conftest is pytest's plugin for one
directory, with that directory's needs (tests/e2e/conftest.py imports the whole local stack to
start the webhook), which a unit test importing a builder from it would load too. This module
imports only the keys and the realistic pods it shares an image and uids with, and needs no
pytest.

The realistic pods and nodes, with what a kubelet writes into their status, stay where they are
(tests/unit/pods.py, tests/unit/nodes.py); these are the objects around them. Every builder
returns a new dict. Keyword arguments are what tests vary; a field a caller leaves out is left
out of the object, as it is from one the API server has not filled in yet.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from shared.api.keys import POLICY_ANNOTATION
from tests.unit.pods import IMAGE, uid

__all__ = [
    "IMAGE",
    "bare_pod",
    "container",
    "deployment",
    "event",
    "owner_reference",
    "replicaset",
    "statefulset",
    "template",
]

JSON = dict[str, Any]


def container(
    name: str = "app", *, image: str = IMAGE, requests: Mapping[str, str] | None = None
) -> JSON:
    """One container of a pod template."""
    out: JSON = {"name": name, "image": image}
    if requests is not None:
        out["resources"] = {"requests": dict(requests)}
    return out


def template(
    labels: Mapping[str, str] | None = None,
    *,
    affinity: Mapping[str, Any] | None = None,
    containers: Sequence[Mapping[str, Any]] | None = None,
    grace_period: int | None = 0,
    **spec: Any,
) -> JSON:
    """A pod template: one container `app` unless told otherwise, and no grace period (kwok pods
    end instantly; a real grace period only slows the tests down). ``spec`` adds fields."""
    pod_spec: JSON = {}
    if affinity is not None:
        pod_spec["affinity"] = dict(affinity)
    pod_spec["containers"] = [
        dict(c) for c in (containers if containers is not None else [container()])
    ]
    if grace_period is not None:
        pod_spec["terminationGracePeriodSeconds"] = grace_period
    pod_spec.update(spec)
    return {"metadata": {"labels": dict(labels)} if labels is not None else {}, "spec": pod_spec}


# The builders below take a parameter named `template`, which hides this function inside them.
_template = template


def owner_reference(
    kind: str,
    name: str,
    *,
    api_version: str = "apps/v1",
    owner_uid: str | None = None,
    block_owner_deletion: bool | None = True,
) -> JSON:
    """The controller reference a controller puts on what it creates; its uid derived from the
    owner the way tests/unit/pods.py derives every uid, unless given."""
    ref: JSON = {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": owner_uid if owner_uid is not None else uid(f"{kind}/{name}"),
        "controller": True,
    }
    if block_owner_deletion is not None:
        ref["blockOwnerDeletion"] = block_owner_deletion
    return ref


def _opted_in(retries: str | None, annotations: Mapping[str, str] | None) -> JSON | None:
    """The annotations, with the opt-in `scheduling-retries: "N"` first when ``retries`` is
    given (a string: tests also send what is not a number)."""
    if retries is None:
        return dict(annotations) if annotations is not None else None
    return {POLICY_ANNOTATION: retries, **(annotations or {})}


def _metadata(
    name: str,
    *,
    namespace: str | None,
    uid: str | None,
    resource_version: str | None,
    generation: int | None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner: Mapping[str, Any] | None = None,
) -> JSON:
    """Metadata with what the caller gave; namespace, uid, resourceVersion and generation are
    what the API server fills in (and refuses some of on create)."""
    meta: JSON = {"name": name}
    for key, value in (
        ("namespace", namespace),
        ("uid", uid),
        ("resourceVersion", resource_version),
        ("generation", generation),
    ):
        if value is not None:
            meta[key] = value
    if labels is not None:
        meta["labels"] = dict(labels)
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return meta


def deployment(
    name: str = "web",
    *,
    replicas: int = 1,
    retries: str | None = None,
    annotations: Mapping[str, str] | None = None,
    selector: Mapping[str, str] | None = None,
    template: Mapping[str, Any] | None = None,
    namespace: str | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
    generation: int | None = None,
) -> JSON:
    """A Deployment selecting ``app: name`` (or ``selector``); its template by default
    `template({"app": name})`."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(
            name,
            namespace=namespace,
            uid=uid,
            resource_version=resource_version,
            generation=generation,
            annotations=_opted_in(retries, annotations),
        ),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(selector if selector is not None else labels)},
            "template": dict(template) if template is not None else _template(labels),
        },
    }


def replicaset(
    name: str = "web",
    *,
    replicas: int = 1,
    retries: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    selector: Mapping[str, str] | None = None,
    template: Mapping[str, Any] | None = None,
    owner: Mapping[str, Any] | None = None,
    namespace: str | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
    generation: int | None = None,
    status: Mapping[str, Any] | None = None,
) -> JSON:
    """A ReplicaSet selecting ``app: name`` (or ``selector``), controlled by ``owner`` when
    given (see `owner_reference`); its template by default `template({"app": name})`."""
    app = {"app": name}
    out: JSON = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": _metadata(
            name,
            namespace=namespace,
            uid=uid,
            resource_version=resource_version,
            generation=generation,
            labels=labels,
            annotations=_opted_in(retries, annotations),
            owner=owner,
        ),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(selector if selector is not None else app)},
            "template": dict(template) if template is not None else _template(app),
        },
    }
    if status is not None:
        out["status"] = dict(status)
    return out


def statefulset(
    name: str = "db",
    *,
    replicas: int = 1,
    retries: str | None = None,
    annotations: Mapping[str, str] | None = None,
    template: Mapping[str, Any] | None = None,
    namespace: str | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
    generation: int | None = None,
    status: Mapping[str, Any] | None = None,
    **spec: Any,
) -> JSON:
    """A StatefulSet selecting ``app: name``, its headless Service named after it; its template
    by default `template({"app": name})`. ``spec`` adds fields (what the API server defaults,
    ``ordinals``)."""
    app = {"app": name}
    out: JSON = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(
            name,
            namespace=namespace,
            uid=uid,
            resource_version=resource_version,
            generation=generation,
            annotations=_opted_in(retries, annotations),
        ),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": app},
            "serviceName": name,
            "template": dict(template) if template is not None else _template(app),
            **spec,
        },
    }
    if status is not None:
        out["status"] = dict(status)
    return out


def bare_pod(
    name: str,
    *,
    retries: str | None = None,
    annotations: Mapping[str, str] | None = None,
    template: Mapping[str, Any] | None = None,
) -> JSON:
    """A pod nothing owns, made from a pod template as a controller would make one (the
    template's labels, its spec); by default `template()`, which has no labels."""
    made = template if template is not None else _template()
    meta: JSON = {"name": name}
    opted_in = _opted_in(retries, annotations)
    if opted_in is not None:
        meta["annotations"] = opted_in
    meta.update(made.get("metadata") or {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": dict(made["spec"])}


def event(
    reason: str,
    *,
    name: str,
    namespace: str,
    kind: str,
    about: str,
    uid: str,
    message: str | None = None,
    count: int | None = None,
) -> JSON:
    """An Event about the object ``kind`` ``about`` (of ``uid``), with the fields the suites
    that read Events look at: its name, the object it is about, the reason, and the message and
    count when given."""
    out: JSON = {
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": {"kind": kind, "name": about, "namespace": namespace, "uid": uid},
        "reason": reason,
    }
    if message is not None:
        out["message"] = message
    if count is not None:
        out["count"] = count
    return out


def jwt(**claims: object) -> str:
    """A JWT shaped as the API server issues a ServiceAccount token; its signature is not one
    (only the API server could judge it; the functions read the claims to refuse early)."""

    def part(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"
