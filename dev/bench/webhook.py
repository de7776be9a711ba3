"""Measurement 5: mutate-admission latency, and what it adds to pod creation.

The pods under review belong to a real ReplicaSet (of a Deployment with
``scheduling-retries: "3"``) whose state annotation excludes one node, so every review does
the owner lookups against the local API server and answers with a patch (policy stamp,
excluded nodes, required node affinity):

- in-process: ``shared.admission.handler.Admitter.review`` with a real
``shared.platform.kube.Kube``; - over TLS: mutate-admission served by its image's command with TLS,
one client on loopback; - through the API server: pods POSTed at a steady rate, in alternating
blocks with and without
  the webhook registered; the client-side latency of each create. The pods are bound to a node
  name that does not exist, so neither the scheduler nor the fake kubelet works on them, and
  their labels do not match the ReplicaSet's selector, so it never counts them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import requests

from dev.bench.common import (
    JSON,
    Scales,
    create_namespace,
    delete_namespace,
    ratio,
    summary,
    wait_until,
)
from dev.localcluster.cluster import Cluster
from dev.localcluster.rest import Rest
from dev.stack import webhook as webhook_setup
from dev.stack.functions import FunctionServer, environment
from dev.stack.webhook import make_tls
from shared.admission.handler import Admitter
from shared.api.keys import EXCLUDED_NODES_ANNOTATION, POLICY_ANNOTATION, STATE_ANNOTATION
from shared.api.state import WorkloadState, dump_state
from shared.platform.config import Config
from shared.platform.kube import Kube

NAMESPACE = "bench-webhook"
REGISTRATION = webhook_setup.NAME + "-bench"


def _owner(rest: Rest, excluded: str) -> JSON:
    """The ReplicaSet the reviewed pods belong to, with a state that excludes one node."""
    labels = {"app": "hooked"}
    rest.post(
        f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "hooked", "annotations": {POLICY_ANNOTATION: "3"}},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "app", "image": "registry.example.com/a:1"}]},
                },
            },
        },
    )

    def rs() -> JSON | None:
        items = rest.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets").get("items", [])
        return items[0] if items else None

    found: JSON = wait_until(rs, 60, 0.2, "the hooked ReplicaSet")
    state = dump_state(WorkloadState(moves=1, excluded_nodes=(excluded,)))
    return rest.patch(
        f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets/{found['metadata']['name']}",
        {"metadata": {"annotations": {STATE_ANNOTATION: state}}},
    )


def _pod(rs: JSON, name: str | None = None) -> JSON:
    meta: JSON = {
        "namespace": NAMESPACE,
        "labels": {"app": "hooked-bench"},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": rs["metadata"]["name"],
                "uid": rs["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = rs["metadata"]["name"] + "-"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "containers": [{"name": "app", "image": "registry.example.com/a:1"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def _review(pod: JSON) -> JSON:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": NAMESPACE,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "dryRun": False,
        },
    }


def in_process(cluster: Cluster, rs: JSON, n: int) -> JSON:
    admitter = Admitter(lambda: Kube(cluster.api_client()), Config())
    latencies = []
    patched = 0
    for i in range(n + 20):
        body = _review(_pod(rs))
        t = time.perf_counter()
        answer = admitter.review(body)
        elapsed = time.perf_counter() - t
        if i >= 20:  # the first calls make the client's connection pool
            latencies.append(elapsed)
            patched += "patch" in answer["response"]
    return {"reviews": n, "patched": patched, "latency_ms": summary(latencies, 1000.0)}


def over_tls(server: FunctionServer, rs: JSON, n: int) -> JSON:
    assert server.ca_file is not None
    session = requests.Session()
    session.trust_env = False
    session.verify = str(server.ca_file)
    latencies = []
    patched = 0
    for i in range(n + 20):
        body = json.dumps(_review(_pod(rs)))
        t = time.perf_counter()
        resp = session.post(
            server.url, data=body, headers={"Content-Type": "application/json"}, timeout=10
        )
        answer = resp.json()
        elapsed = time.perf_counter() - t
        if i >= 20:
            latencies.append(elapsed)
            patched += "patch" in answer["response"]
    return {"reviews": n, "patched": patched, "latency_ms": summary(latencies, 1000.0)}


def _stamped(rest: Rest, rs: JSON) -> bool:
    """Whether the API server calls the webhook now (a dry-run create shows its patch)."""
    created = rest.request(
        "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=_pod(rs), params={"dryRun": "All"}
    )
    return EXCLUDED_NODES_ANNOTATION in (created["metadata"].get("annotations") or {})


def creations(cluster: Cluster, server: FunctionServer, rs: JSON, scales: Scales) -> JSON:
    rest = cluster.rest
    api = cluster.api_client()
    assert server.ca_file is not None
    body = webhook_setup.configuration(server.url, server.ca_file, name=REGISTRATION)
    per_block = max(scales.creations // 4, 1)
    latencies: dict[str, list[float]] = {"without": [], "with": []}
    stamped = {"without": 0, "with": 0}
    interval = 1.0 / scales.creation_rate
    try:
        for block in range(4):
            mode = "with" if block % 2 else "without"
            if mode == "with":
                webhook_setup.register(api, body)
                wait_until(lambda: _stamped(rest, rs), 30, 0.2, "the webhook registered")
            else:
                webhook_setup.unregister(api, REGISTRATION)
                wait_until(lambda: not _stamped(rest, rs), 30, 0.2, "the webhook unregistered")
            pod = _pod(rs)
            pod["spec"]["nodeName"] = "bench-nowhere"
            next_at = time.monotonic()
            for _ in range(per_block):
                next_at += interval
                t = time.perf_counter()
                created = rest.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
                latencies[mode].append(time.perf_counter() - t)
                annotations = created["metadata"].get("annotations") or {}
                stamped[mode] += EXCLUDED_NODES_ANNOTATION in annotations
                time.sleep(max(next_at - time.monotonic(), 0.0))
    finally:
        webhook_setup.unregister(api, REGISTRATION)
    without = summary(latencies["without"], 1000.0)
    with_hook = summary(latencies["with"], 1000.0)
    return {
        "rate_per_s": scales.creation_rate,
        "pods_per_mode": len(latencies["with"]),
        "without_webhook_ms": without,
        "with_webhook_ms": with_hook,
        "stamped": stamped,
        "p50_ratio": ratio(with_hook["p50"], without["p50"]),
        "p99_ratio": ratio(with_hook["p99"], without["p99"]),
    }


def measure(cluster: Cluster, scales: Scales, workdir: Path, *, log: Callable[[str], None]) -> JSON:
    rest = cluster.rest
    create_namespace(rest, NAMESPACE)
    try:
        rs = _owner(rest, cluster.nodes[0])
        log(f"webhook: {scales.webhook_reviews} reviews in-process")
        inproc = in_process(cluster, rs, scales.webhook_reviews)
        lat = inproc["latency_ms"]
        log(f"  in-process p50 {lat['p50']} ms p99 {lat['p99']} ms")
        ca, crt, key = make_tls(workdir / "tls")
        server = FunctionServer(
            "mutate-admission",
            workdir,
            env=environment(cluster.kubeconfig),
            tls=(crt, key),
            ca_file=ca,
        ).start()
        try:
            log(f"webhook: {scales.tls_reviews} reviews over TLS")
            tls = over_tls(server, rs, scales.tls_reviews)
            log(f"  TLS p50 {tls['latency_ms']['p50']} ms p99 {tls['latency_ms']['p99']} ms")
            log(f"webhook: {scales.creations} pod creations at {scales.creation_rate}/s")
            created = creations(cluster, server, rs, scales)
            log(f"  creation p50 ratio {created['p50_ratio']}, p99 ratio {created['p99_ratio']}")
        finally:
            server.stop()
    finally:
        delete_namespace(rest, NAMESPACE)
    return {"in_process": inproc, "tls": tls, "pod_creation": created}
