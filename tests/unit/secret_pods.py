"""Pods as they really reach detect-failures: with literal env values (a password set inline),
env from Secrets, init and ephemeral containers (after ``kubectl debug``), and the
managedFields the API server keeps on every object. The logging tests check that none of the
literal values and none of the managedFields end up in a log line.
"""

from __future__ import annotations

import copy
from typing import Any, Final, cast

from shared.api.kubetypes import Pod
from tests.unit import pods

PASSWORD: Final = "hunter2-s3cr3t-db-pa55"
TOKEN: Final = "ghp_9f8e7d6c5b4a3210fedcba9876543210abcd"
DEBUG_TOKEN: Final = "debug-session-token-77f1"
SECRETS: Final = (PASSWORD, TOKEN, DEBUG_TOKEN)

# What `kubectl apply` of a Deployment leaves on one of its pods (trimmed fieldsV1).
MANAGED_FIELDS: Final = [
    {
        "manager": "kube-controller-manager",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-03-14T09:21:51Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}},
            "f:spec": {"f:containers": {'k:{"name":"app"}': {".": {}, "f:env": {}}}},
        },
    },
    {
        "manager": "kubelet",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-03-14T09:26:50Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}}},
        "subresource": "status",
    },
]


def with_secrets(pod: Pod) -> Pod:
    """``pod`` with env values in every kind of container, and managedFields."""
    out: dict[str, Any] = copy.deepcopy(dict(pod))
    out["metadata"]["managedFields"] = copy.deepcopy(MANAGED_FIELDS)
    spec = out["spec"]
    spec["containers"][0]["env"] = [
        {"name": "DB_HOST", "value": "postgres.shop.svc"},
        {"name": "DB_PASSWORD", "value": PASSWORD},
        {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "shop-api", "key": "token"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    spec["initContainers"] = [
        {
            "name": "migrate",
            "image": pods.IMAGE,
            "command": ["/app/migrate"],
            "env": [{"name": "GITHUB_TOKEN", "value": TOKEN}],
        }
    ]
    spec["ephemeralContainers"] = [
        {
            "name": "debugger-x7k2p",
            "image": "busybox:1.36",
            "targetContainerName": "app",
            "env": [{"name": "SESSION", "value": DEBUG_TOKEN}],
        }
    ]
    # A toleration's "value" is not a secret and must survive.
    spec["tolerations"].append(
        {"key": "dedicated", "operator": "Equal", "value": "shop", "effect": "NoSchedule"}
    )
    return cast(Pod, out)
