"""Node objects shaped like what the API server returns for a kubelet-registered node.

Only the fields the node functions read are varied; the rest is there so that the objects look
like the real thing (a kubelet writes addresses, capacity, allocatable, conditions).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

# A node as `kubectl get node node-1 -o json` shows it on a v1.36 cluster (trimmed).
_BASE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "node-1",
        "uid": "6f1c1f5e-3b1a-4c0e-9d7e-2f1d3c4b5a61",
        "resourceVersion": "48211",
        "creationTimestamp": "2026-11-23T08:00:00Z",
        "labels": {
            "beta.kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": "node-1",
            "kubernetes.io/os": "linux",
        },
        "annotations": {
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        },
    },
    "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
    "status": {
        "addresses": [
            {"type": "InternalIP", "address": "10.0.0.11"},
            {"type": "Hostname", "address": "node-1"},
        ],
        "allocatable": {"cpu": "4", "memory": "16283444Ki", "pods": "110"},
        "capacity": {"cpu": "4", "memory": "16385844Ki", "pods": "110"},
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": "2026-11-23T09:59:40Z",
                "lastTransitionTime": "2026-11-23T08:00:10Z",
            }
        ],
    },
}


def node(
    name: str = "node-1",
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] | None = None,
    unschedulable: bool = False,
    resource_version: str = "48211",
    conditions: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    out = copy.deepcopy(_BASE)
    meta = out["metadata"]
    meta["name"] = name
    meta["uid"] = f"uid-{name}"
    meta["resourceVersion"] = resource_version
    meta["labels"]["kubernetes.io/hostname"] = name
    meta["labels"].update(labels or {})
    meta["annotations"].update(annotations or {})
    if taints is not None:
        out["spec"]["taints"] = [dict(t) for t in taints]
    if unschedulable:
        out["spec"]["unschedulable"] = True
        # What `kubectl cordon` leads to: the node lifecycle controller adds this taint.
        out["spec"].setdefault("taints", []).append(
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
        )
    out["status"]["addresses"][1]["address"] = name
    # Conditions of other writers (node-problem-detector) after the kubelet's, by type.
    out["status"]["conditions"] += [dict(c) for c in conditions]
    return out


def npd_condition(
    kind: str,
    *,
    problem: bool,
    reason: str,
    message: str,
    since: str = "2026-11-23T09:58:00Z",
) -> dict[str, Any]:
    """A condition as node-problem-detector writes it (pkg/util/convert.go, a strategic merge
    patch of nodes/status by type): True with the rule's reason and the matched log lines as the
    message while the problem lasts; False with the monitor's default reason otherwise."""
    return {
        "type": kind,
        "status": "True" if problem else "False",
        "lastHeartbeatTime": "2026-11-23T09:59:50Z",
        "lastTransitionTime": since,
        "reason": reason,
        "message": message,
    }
