"""score-nodes per-call latency, as kube-scheduler calls it, with 20 to 1,000 nodes in a call,
in both of the scheduler's ways of calling an extender, side by side in one run.

The function is served as it ships (gunicorn with functions/gunicorn.conf.py, one process, its
default settings and log level) by stack.functions.FunctionServer; the client posts over one
kept-alive HTTP connection, as Go's http.Client does.

- ``names`` (``nodeCacheCapable: true``, what the shipped configurations say): ExtenderArgs
  with the pod and ``NodeNames`` only. score-nodes looks them up in its node cache, which lists
  and watches Nodes from a real API server: a local control plane (one kwok node) to which the
  bench adds 1,000 Node objects, each shaped as below, before the function starts. The first
  N of them are named in a request of N nodes. The answers are checked to come from the cached
  usage (some nodes fail the filter, the scores vary), not from a cold cache passing all.
- ``objects`` (``nodeCacheCapable: false``): ExtenderArgs in the exact shape the real
  kube-scheduler sends then (Go field names, whole Node objects; see
  tests/handlers/extender_args.json, captured from it), node cache off. A filter answer carries
  the passing Node objects back (the scheduler rebuilds its list from them), so its size grows
  with the request's.

Nodes are shaped as the API server returns a kubelet-registered node (labels, annotations with
the usage record, managedFields, conditions, addresses, nodeInfo and the 30 images a kubelet
lists), whose usage spreads from 5 % to 95 % so that the filter fails some.

Latency is the client's: from sending the request to having parsed the answer, so it includes
JSON encoding on both sides and the loopback; the first calls (connection, caches) are not
counted.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import requests
from prometheus_client.parser import text_string_to_metric_families

from dev.bench.common import JSON, summary
from dev.localcluster import addresses
from dev.localcluster.cluster import Cluster
from dev.stack.functions import FunctionServer, environment
from shared.api.keys import USAGE_ANNOTATION
from shared.api.usage import Estimate, Reading, UsageRecord

# 420: what kube-scheduler sends from a 1,000-node cluster by default (percentageOfNodesToScore
# unset: 50 - 1000/125 = 42 percent of the nodes, the feasible ones it found first).
SIZES: Final = (20, 100, 240, 420, 1000)
QUICK_SIZES: Final = (20, 240)
CALLS: Final = 300
QUICK_CALLS: Final = 15
# Whole Node objects at 1,000 nodes are a 9 MB request taking the better part of a second:
# fewer calls there keep the run short; p99 of 60 is the second-highest call.
OBJECT_CALLS_AT_SCALE: Final = 60
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


def names_args(names: list[str]) -> bytes:
    """ExtenderArgs as kube-scheduler marshals it with nodeCacheCapable true: names only."""
    body = {"Pod": copy.deepcopy(_POD), "Nodes": None, "NodeNames": names}
    return json.dumps(body, separators=(",", ":")).encode()


def cluster_node(index: int, record: str) -> JSON:
    """``node_object(index)`` as a client creates it: its own name (beside the cluster's
    kwok node), without what the API server sets."""
    node = node_object(index, record)
    node["metadata"]["name"] = f"bench-node-{index}"
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields"):
        node["metadata"].pop(key)
    node["metadata"]["labels"]["kubernetes.io/hostname"] = node["metadata"]["name"]
    node["status"]["addresses"][1]["address"] = node["metadata"]["name"]
    return node


def _point(
    session: requests.Session,
    url: str,
    body: bytes,
    calls: int,
    nodes: int,
    log: Callable[[str], None],
    mode: str,
) -> JSON:
    point: JSON = {"request_bytes": len(body)}
    for verb in VERBS:
        before = _buckets(session, url, verb)
        latencies, size, answer = _calls(session, url + verb, body, calls)
        counted = _buckets(session, url, verb)
        # The function's own time per call (knr_extender_seconds: parse, decide, encode), from
        # the histogram's buckets: each quantile is the upper bound of the bucket holding it.
        # The warm-up calls are counted there too.
        server = {le: counted[le] - before.get(le, 0) for le in counted}
        result: JSON = {
            "latency_ms": summary(latencies, 1000.0),
            "server_ms_at_most": {
                "p50": _bucket_quantile(server, 0.5),
                "p99": _bucket_quantile(server, 0.99),
            },
            "response_bytes": size,
        }
        if verb == "filter":
            result["passed"] = len(answer["NodeNames"])
            result["failed"] = len(answer["FailedAndUnresolvableNodes"])
            if result["passed"] + result["failed"] != nodes or not result["failed"]:
                raise RuntimeError(f"{mode}, {nodes} nodes: the filter did not judge on usage")
        else:
            result["scored"] = len(answer)
            if len({entry["Score"] for entry in answer}) < 2:
                raise RuntimeError(f"{mode}, {nodes} nodes: every node scored the same")
        point[verb] = result
        lat, own = result["latency_ms"], result["server_ms_at_most"]
        log(
            f"extender ({mode}): {nodes} nodes, {verb}: p50 {lat['p50']} ms, p99 {lat['p99']} "
            f"ms (in the function: p50 <= {own['p50']} ms, p99 <= {own['p99']} ms)"
        )
    return point


def _buckets(session: requests.Session, url: str, verb: str) -> dict[float, int]:
    """knr_extender_seconds' cumulative bucket counts for ``verb``, by upper bound (s)."""
    page = session.get(url + "metrics", timeout=30)
    page.raise_for_status()
    counts: dict[float, int] = {}
    for family in text_string_to_metric_families(page.text):
        for sample in family.samples:
            if sample.name == "knr_extender_seconds_bucket" and sample.labels["verb"] == verb:
                counts[float(sample.labels["le"])] = int(sample.value)
    return counts


def _bucket_quantile(cumulative: dict[float, int], q: float) -> float | None:
    """The upper bound, in ms, of the bucket holding quantile ``q`` of cumulative counts."""
    total = cumulative.get(math.inf, 0)
    if not total:
        return None
    for le in sorted(cumulative):
        if cumulative[le] >= q * total:
            return None if le == math.inf else round(le * 1000, 2)
    return None


def _wait_for_cache(session: requests.Session, server: FunctionServer, total: int) -> float:
    started = time.monotonic()
    while True:
        cache = session.get(server.url + "debug/node-cache", timeout=30).json()
        if cache["ready"] and len(cache["nodes"]) >= total:
            return round(time.monotonic() - started, 2)
        if time.monotonic() - started > 120:
            raise TimeoutError("score-nodes' node cache did not list the bench's Nodes")
        time.sleep(0.2)


def _settle(
    session: requests.Session, server: FunctionServer, total: int, log: Callable[[str], None]
) -> float:
    """Waits until the node lifecycle controller has marked every bench Node (no kubelet
    posts for them): its writes then stop, and the cache holds every Node as it stays."""
    started = time.monotonic()
    while True:
        cache = session.get(server.url + "debug/node-cache", timeout=30).json()
        marked = sum(
            1
            for name, node in cache["nodes"].items()
            if name.startswith("bench-node-") and not node["takesPods"]
        )
        if marked >= total:
            waited = round(time.monotonic() - started, 1)
            log(f"extender: the {total} Nodes marked NotReady after {waited} s more")
            return waited
        if time.monotonic() - started > 300:
            raise TimeoutError(f"{marked} of {total} bench Nodes marked NotReady in 300 s")
        time.sleep(2)


def _each_node(total: int, call: Callable[[int], object]) -> None:
    """``call(i)`` for each bench Node, four API requests at a time."""
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(call, range(total)))


def _refresh(
    cluster: Cluster, session: requests.Session, server: FunctionServer, total: int
) -> float:
    started = time.monotonic()
    now = datetime.now(UTC)
    _each_node(
        total,
        lambda i: cluster.rest.patch(
            f"/api/v1/nodes/bench-node-{i}",
            {"metadata": {"annotations": {USAGE_ANNOTATION: usage_record(i, now)}}},
        ),
    )
    sampled = now.replace(microsecond=0)
    while True:
        cache = session.get(server.url + "debug/node-cache", timeout=30).json()
        fresh = sum(
            1
            for name, node in cache["nodes"].items()
            if name.startswith("bench-node-")
            and node["sampledAt"]
            and datetime.fromisoformat(node["sampledAt"]) >= sampled
        )
        if fresh >= total:
            return round(time.monotonic() - started, 1)
        if time.monotonic() - started > 120:
            raise TimeoutError(f"{fresh} of {total} fresh usage records reached the cache")
        time.sleep(0.5)


def _floor(
    session: requests.Session, server: FunctionServer, calls: int, log: Callable[[str], None]
) -> JSON:
    """The round trip with no work: GET /healthz on the same connection, as often."""
    latencies: list[float] = []
    for i in range(calls + WARMUP):
        started = time.perf_counter()
        session.get(server.url + "healthz", timeout=30).raise_for_status()
        if i >= WARMUP:
            latencies.append(time.perf_counter() - started)
    result = summary(latencies, 1000.0)
    log(f"extender: GET /healthz p50 {result['p50']} ms, p99 {result['p99']} ms")
    return {"latency_ms": result}


def _both(
    workdir: Path,
    sizes: tuple[int, ...],
    calls: int,
    log: Callable[[str], None],
    *,
    settle: bool = True,
) -> JSON:
    """Both modes against one cluster holding ``max(sizes)`` bench Nodes: the same machine
    load for both (the control plane and both servers run throughout)."""
    total = max(sizes)
    # kwok keeps only its own node: the bench's Nodes get no heartbeats, so once the node
    # lifecycle controller has marked them (NotReady: they then only leave the neutral score's
    # mean) the control plane is idle and the two cores measure the extender, not the API
    # server serving a thousand kubelets' status updates.
    cluster = Cluster(
        workdir / "cluster",
        nodes=1,
        quiet=True,
        prometheus=False,
        keep_workdir=True,
        kwok_manages_all=False,
    )
    servers: list[FunctionServer] = []
    session = requests.Session()
    session.trust_env = False
    out: JSON = {"names": {}, "objects": {}}
    try:
        cluster.start()
        started = time.monotonic()
        now = datetime.now(UTC)
        _each_node(
            total,
            lambda i: cluster.rest.post("/api/v1/nodes", cluster_node(i, usage_record(i, now))),
        )
        log(f"extender: {total} Nodes created in {time.monotonic() - started:.1f} s")
        env = environment(cluster.kubeconfig, KN_RESCHEDULER_LOG_LEVEL="WARNING")
        with_cache = FunctionServer("score-nodes", workdir / "names", env=env).start()
        servers.append(with_cache)
        without = FunctionServer(
            "score-nodes",
            workdir / "objects",
            env={**env, "KN_RESCHEDULER_EXTENDER_NODE_CACHE": "false"},
        ).start()
        servers.append(without)
        out["names"]["cache_listed_s"] = _wait_for_cache(session, with_cache, total)
        if settle:
            out["names"]["settled_s"] = _settle(session, with_cache, total, log)
            # Fresh records now (those written at creation may have aged past
            # usage_stale_after while the Nodes settled), in the cache before the first call.
            out["names"]["refreshed_s"] = _refresh(cluster, session, with_cache, total)
        out["floor"] = _floor(session, with_cache, calls, log)
        out["names"]["rss_mb"] = _rss_mb(with_cache)
        out["objects"]["rss_mb"] = _rss_mb(without)
        names = [f"bench-node-{i}" for i in range(total)]
        # Names first, every size (seconds in all, well within usage_stale_after of the
        # records written above), then whole objects.
        for nodes in sizes:
            out["names"][str(nodes)] = _point(
                session, with_cache.url, names_args(names[:nodes]), calls, nodes, log, "names"
            )
        for nodes in sizes:
            # Fresh usage for each size: records older than usage_stale_after are not used.
            body = extender_args(nodes, datetime.now(UTC))
            n = min(calls, OBJECT_CALLS_AT_SCALE) if nodes > 240 else calls
            point = _point(session, without.url, body, n, nodes, log, "objects")
            out["objects"][str(nodes)] = {**point, "calls": n}
        # The cache's own memory after the calls, beside the process without one.
        out["names"]["rss_mb_after"] = _rss_mb(with_cache)
        out["objects"]["rss_mb_after"] = _rss_mb(without)
    finally:
        session.close()
        for server in servers:
            server.stop()
        cluster.stop()
    return out


def _rss_mb(server: FunctionServer) -> float | None:
    """The function's resident memory: every process of its group (gunicorn's arbiter and
    its worker), from /proc."""
    if server.proc is None:
        return None
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != server.proc.pid:
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return round(total / 1024, 1)


def measure(workdir: Path, *, quick: bool, log: Callable[[str], None]) -> JSON:
    calls = QUICK_CALLS if quick else CALLS
    sizes = QUICK_SIZES if quick else SIZES
    workdir.mkdir(parents=True, exist_ok=True)
    out: JSON = {"calls_per_point": calls, "warmup_calls": WARMUP, "images_per_node": IMAGES}
    # The quick run does not wait for the Nodes to settle (minutes): its figures are noisier.
    out.update(_both(workdir, sizes, calls, log, settle=not quick))
    return out
