"""The data of an ``io.kn-rescheduler.pod.failing`` event.

detect-failures (from a pod event) and sweep-failures (from a list) produce it;
update-annotations consumes it. It carries what a person debugging a move wants to see in one
place (which pod, on which node, why) and, for a bare pod, the pod itself: nothing else
remembers a bare pod's spec once it is replaced.

Field names are camelCase like the Kubernetes objects they describe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from shared.api.keys import POLICY_STAMP_ANNOTATION
from shared.api.kubetypes import Pod
from shared.platform import logs
from shared.workloads.classify import Failure, controller_of, excluded_nodes_of


@dataclass(frozen=True)
class FailingPod:
    namespace: str
    name: str
    uid: str
    failure: Failure
    owner_references: tuple[Mapping[str, Any], ...] = ()
    start_time: str | None = None
    excluded_nodes: tuple[str, ...] = ()
    policy: str | None = None
    # Only for pods without a controller: the object to recreate.
    pod: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def subject(self) -> str:
        return f"namespaces/{self.namespace}/pods/{self.name}"

    @classmethod
    def from_pod(cls, pod: Pod, failure: Failure) -> FailingPod:
        meta = pod.get("metadata", {})
        bare = controller_of(pod) is None
        snapshot = None
        if bare:
            # For people and replay only (update-annotations recreates from the live pod):
            # literal env values stay out of events that the Broker and dead-letter sink keep.
            snapshot = {
                "metadata": {
                    k: v
                    for k, v in meta.items()
                    if k in ("name", "namespace", "labels", "annotations", "uid")
                },
                "spec": logs.redact({"spec": pod.get("spec", {})})["spec"],
            }
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            failure=failure,
            owner_references=tuple(dict(r) for r in meta.get("ownerReferences") or []),
            start_time=pod.get("status", {}).get("startTime"),
            excluded_nodes=excluded_nodes_of(pod),
            policy=(meta.get("annotations") or {}).get(POLICY_STAMP_ANNOTATION),
            pod=snapshot,
        )

    def as_failed_pod(self) -> Pod:
        """The pod as far as this event knows it, for a pod that is gone: name, uid, owners,
        node, and the kubelet's verdict (phase Failed with the failure's reason)."""
        f = self.failure
        return cast(
            Pod,
            {
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "uid": self.uid,
                    "ownerReferences": [dict(r) for r in self.owner_references],
                },
                "spec": {"nodeName": f.node} if f.node else {},
                "status": {"phase": "Failed", "reason": f.reason, "message": f.message},
            },
        )

    def to_data(self) -> dict[str, Any]:
        f = self.failure
        data: dict[str, Any] = {
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "node": f.node,
            "ownerReferences": [dict(r) for r in self.owner_references],
            "kind": str(f.kind),
            "reason": f.reason,
            "message": f.message,
            "container": f.container,
            "initContainer": f.init_container,
            "restartCount": f.restart_count,
            "ranForSeconds": f.ran_for_seconds,
            "why": f.why,
            "startTime": self.start_time,
            "excludedNodes": list(self.excluded_nodes),
            "policy": self.policy,
        }
        if self.pod is not None:
            data["pod"] = dict(self.pod)
        return data

    @classmethod
    def from_data(cls, data: object) -> FailingPod:
        """Read ``to_data`` output; ValueError names what is missing or malformed."""
        if not isinstance(data, dict):
            raise ValueError("failing-pod data must be a JSON object")
        for key in ("namespace", "name", "uid", "reason", "kind"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise ValueError(f"failing-pod data needs a non-empty string {key!r}")
        failure = Failure.from_dict(
            {
                "kind": data["kind"],
                "reason": data["reason"],
                "message": data.get("message") or "",
                "node": data.get("node"),
                "container": data.get("container"),
                "init_container": bool(data.get("initContainer", False)),
                "restart_count": data.get("restartCount") or 0,
                "ran_for_seconds": data.get("ranForSeconds"),
                "why": data.get("why") or "",
            }
        )
        owners = data.get("ownerReferences") or []
        excluded = data.get("excludedNodes") or []
        pod = data.get("pod")
        if not isinstance(owners, list) or not all(isinstance(o, dict) for o in owners):
            raise ValueError("ownerReferences must be a list of objects")
        if not isinstance(excluded, list) or not all(isinstance(n, str) for n in excluded):
            raise ValueError("excludedNodes must be a list of node names")
        if pod is not None and not isinstance(pod, dict):
            raise ValueError("pod must be an object")
        if pod is not None:
            # A bare pod's snapshot: what its replacement is made from. Shaped as the API
            # server writes a pod, or refused, never half read.
            meta = pod.get("metadata", {})
            if not isinstance(meta, dict):
                raise ValueError("pod.metadata must be an object")
            for key in ("labels", "annotations"):
                found = meta.get(key)
                if found is not None and not (
                    isinstance(found, dict)
                    and all(isinstance(k, str) and isinstance(v, str) for k, v in found.items())
                ):
                    raise ValueError(f"pod.metadata.{key} must map strings to strings")
            if not isinstance(pod.get("spec", {}), dict):
                raise ValueError("pod.spec must be an object")
        return cls(
            namespace=data["namespace"],
            name=data["name"],
            uid=data["uid"],
            failure=failure,
            owner_references=tuple(owners),
            start_time=data.get("startTime") if isinstance(data.get("startTime"), str) else None,
            excluded_nodes=tuple(excluded),
            policy=data.get("policy") if isinstance(data.get("policy"), str) else None,
            pod=cast(Mapping[str, Any] | None, pod),
        )
