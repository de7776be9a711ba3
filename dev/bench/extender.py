"""score-nodes per-call latency, as kube-scheduler calls it, with 20, 100 and 240 nodes.

The function is served as it ships (gunicorn with functions/gunicorn.conf.py, one process, its
default settings and log level) by stack.functions.FunctionServer; the client posts over one
kept-alive HTTP connection, as Go's http.Client does. Each request is an ExtenderArgs in the
exact shape the real kube-scheduler sends with ``nodeCacheCapable: false`` (Go field names,
whole Node objects; see tests/handlers/extender_args.json, captured from it): the pod it is
placing, and Node objects as the API server returns them for a kubelet-registered node
(labels, annotations with the usage record, managedFields, conditions, addresses, nodeInfo and
the 30 images a kubelet lists), whose usage spreads from 5 % to 95 % so that the filter fails
some. A filter answer carries the passing Node objects back (the scheduler rebuilds its list
from them), so its size grows with the request's.

Latency is the client's: from sending the request to having parsed the answer, so it includes
JSON encoding on both sides and the loopback; the first calls (connection, caches) are not
counted. No cluster is needed.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import requests

from dev.bench.common import JSON, summary
from dev.localcluster import addresses
from dev.stack.functions import FunctionServer
from shared.api.keys import USAGE_ANNOTATION
from shared.api.usage import Estimate, Reading, UsageRecord

SIZES: Final = (20, 100, 240)
CALLS: Final = 300
QUICK_CALLS: Final = 15
WARMUP: Final = 10
VERBS: Final = ("filter", "prioritize")
# What a kubelet reports in status.images (nodeStatusMaxImages is 50 by default).
IMAGES: Final = 30

_POD: Final[JSON] = {
    "metadata": {
        "name": "web-7d9c8b6f4-q8w2k",
        "generateName": "web-7d9c8b6f4-",
        "namespace": "shop",
        "uid": "c5d4fdd9-4d27-4c22-bcbe-31900e10d1ac",
        "resourceVersion": "278",
        "generation": 1,
        "creationTimestamp": "2026-11-23T17:59:20Z",
        "labels": {"app": "web", "pod-template-hash": "7d9c8b6f4"},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "web-7d9c8b6f4",
                "uid": "0b8f5c0e-6c1e-4c57-9a43-3f4e1a2b9c7d",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    },
    "spec": {
        "volumes": [
            {
                "name": "kube-api-access-cxv56",
                "projected": {
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {
                            "configMap": {
                                "name": "kube-root-ca.crt",
                                "items": [{"key": "ca.crt", "path": "ca.crt"}],
                            }
                        },
                    ],
                    "defaultMode": 420,
                },
            }
        ],
        "containers": [
            {
                "name": "app",
                "image": "registry.example.com/shop/web:1.4.2",
                "resources": {
                    "limits": {"memory": "512Mi"},
                    "requests": {"cpu": "250m", "memory": "256Mi"},
                },
                "volumeMounts": [
                    {
                        "name": "kube-api-access-cxv56",
                        "readOnly": True,
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                    }
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    },
    "status": {"phase": "Pending", "qosClass": "Burstable"},
}


def _condition(kind: str, status: str, reason: str, message: str) -> JSON:
    return {
        "type": kind,
        "status": status,
        "lastHeartbeatTime": "2026-11-23T17:59:13Z",
        "lastTransitionTime": "2026-11-23T08:00:10Z",
        "reason": reason,
        "message": message,
    }


def _fields(keys: list[str]) -> JSON:
    return {".": {}, **{f"f:{key}": {} for key in keys}}


def node_object(index: int, record: str) -> JSON:
    """Node ``index`` as the API server returns it for a kubelet-registered node."""
    name = f"node-{index}"
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "m6i.2xlarge",
        "topology.kubernetes.io/region": "eu-west-1",
        "topology.kubernetes.io/zone": f"eu-west-1{'abc'[index % 3]}",
    }
    annotations = {
        USAGE_ANNOTATION: record,
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
    }
    conditions = [
        _condition(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        _condition(
            "DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"
        ),
        _condition(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
        ),
        _condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    images = [
        {
            "names": [
                f"registry.example.com/team-{i % 7}/service-{i}@sha256:{(index * 97 + i):064x}",
                f"registry.example.com/team-{i % 7}/service-{i}:1.{i}.0",
            ],
            "sizeBytes": 20_000_000 + 1_000_003 * i,
        }
        for i in range(IMAGES)
    ]
    capacity = {
        "cpu": "8",
        "ephemeral-storage": "102350Mi",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": "32873196Ki",
        "pods": "110",
    }
    return {
        "metadata": {
            "name": name,
            "uid": f"6f1c1f5e-3b1a-4c0e-9d7e-{index:012x}",
            "resourceVersion": str(48211 + index),
            "creationTimestamp": "2026-11-23T08:00:00Z",
            "labels": labels,
            "annotations": annotations,
            "managedFields": [
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-23T08:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {
                            "f:annotations": _fields(
                                [k for k in annotations if k != USAGE_ANNOTATION]
                            ),
                            "f:labels": _fields(list(labels)),
                        }
                    },
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-23T17:59:13Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:images": {}}},
                    "subresource": "status",
                },
                {
                    "manager": "annotate-usage",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-23T17:59:19Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{USAGE_ANNOTATION}": {}}}},
                },
            ],
        },
        "spec": {
            "podCIDR": addresses.node_pod_cidr(index),
            "podCIDRs": [addresses.node_pod_cidr(index)],
            "providerID": f"aws:///eu-west-1a/i-{index:017x}",
        },
        "status": {
            "capacity": capacity,
            "allocatable": {**capacity, "cpu": "7800m", "memory": "32158316Ki"},
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": addresses.node_ip(index)},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": f"{index:032x}",
                "systemUUID": f"00000000-0000-4000-9000-{index:012d}",
                "bootID": f"00000000-0000-4000-8000-{index:012d}",
                "kernelVersion": "6.8.0-60-generic",
                "osImage": "Ubuntu 24.04.2 LTS",
                "containerRuntimeVersion": "containerd://2.1.4",
                "kubeletVersion": "v1.36.3",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": images,
        },
    }


def usage_record(index: int, now: datetime) -> str:
    """Usage spread over 5..95 % (CPU) and 10..90 % (memory), some with an estimate."""
    cpu = 5.0 + (index * 37) % 91
    memory = 10.0 + (index * 53) % 81
    guess = Estimate(cpu=2.5, memory=1.0, pods=1) if index % 5 == 0 else Estimate()
    return UsageRecord(
        sampled_at=now.replace(microsecond=0),
        source="prometheus",
        cpu=Reading(now=cpu, avg5m=cpu, max1h=min(cpu + 10, 100.0)),
        memory=Reading(now=memory, avg5m=memory, max1h=min(memory + 5, 100.0)),
        estimate=guess,
    ).to_json()


def extender_args(nodes: int, now: datetime) -> bytes:
    """ExtenderArgs as kube-scheduler marshals it (nodeCacheCapable false)."""
    body = {
        "Pod": copy.deepcopy(_POD),
        "Nodes": {
            "metadata": {},
            "items": [node_object(i, usage_record(i, now)) for i in range(nodes)],
        },
        "NodeNames": None,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def _calls(
    session: requests.Session, url: str, body: bytes, n: int
) -> tuple[list[float], int, Any]:
    latencies: list[float] = []
    size = 0
    answer: Any = None
    for i in range(n + WARMUP):
        t = time.perf_counter()
        response = session.post(
            url, data=body, headers={"Content-Type": "application/json"}, timeout=30
        )
        answer = response.json()
        elapsed = time.perf_counter() - t
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}: {answer}")
        if i >= WARMUP:
            latencies.append(elapsed)
        size = len(response.content)
    return latencies, size, answer


def measure(workdir: Path, *, quick: bool, log: Callable[[str], None]) -> JSON:
    calls = QUICK_CALLS if quick else CALLS
    workdir.mkdir(parents=True, exist_ok=True)
    server = FunctionServer("score-nodes", workdir).start()
    session = requests.Session()
    session.trust_env = False
    out: JSON = {"calls_per_point": calls, "warmup_calls": WARMUP, "images_per_node": IMAGES}
    try:
        for nodes in SIZES:
            # Fresh usage for each size: records older than usage_stale_after are not used.
            body = extender_args(nodes, datetime.now(UTC))
            point: JSON = {"request_bytes": len(body)}
            for verb in VERBS:
                latencies, size, answer = _calls(session, server.url + verb, body, calls)
                result: JSON = {"latency_ms": summary(latencies, 1000.0), "response_bytes": size}
                if verb == "filter":
                    result["passed"] = len(answer["NodeNames"])
                    result["failed"] = len(answer["FailedAndUnresolvableNodes"])
                else:
                    result["scored"] = len(answer)
                point[verb] = result
                lat = result["latency_ms"]
                log(f"extender: {nodes} nodes, {verb}: p50 {lat['p50']} ms, p99 {lat['p99']} ms")
            out[str(nodes)] = point
    finally:
        session.close()
        server.stop()
    return out
