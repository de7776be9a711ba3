"""One soak: a production-like local cluster, every function, some faulty nodes, a while.

cluster (default scheduler calling score-nodes as its extender, Prometheus with two scrape
jobs of the same endpoints) -> watches
-> production fixture (operator labels and taints, kube-system add-ons, local PVs)
-> Stack (detect-failures, update-annotations, webhook, sweep, assess-nodes, label-nodes,
   annotate-usage, score-nodes) and rebalance-nodes on a timer
-> workloads: node-fixable ones preferring faulty nodes, a healthy one, a CronJob every minute
   on a node only it fails on, a StatefulSet on local PVs on the node that turns hot
-> the timeline (a node hot, an add-on restarted, a node added, one cordoned and drained, the
   added one removed) -> settle -> the record -> invariants -> figures
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import requests

from dev.bench.chaos.invariants import Verdict
from dev.bench.common import create_namespace
from dev.bench.soak import invariants
from dev.bench.soak.invariants import OperatorWrite, Record
from dev.bench.soak.observe import Recorder, start_watches
from dev.localcluster.cluster import Cluster
from dev.localcluster.keys import (
    SIM_FAULT_LABEL,
)
from dev.localcluster.kubelet import LOCAL_FUNCTION_SETTINGS
from dev.localcluster.production import (
    BATCH_TOLERATION,
    POOL_LABEL,
    Layout,
    Production,
    cronjob,
    local_volume_statefulset,
    second_scrape_job,
)
from dev.localcluster.rest import ApiError
from dev.stack.functions import ROOT, FunctionServer, environment, free_port
from dev.stack.stack import PING_TYPE, Stack
from dev.stack.up import load_aware_scheduler_config
from shared.api.keys import (
    APISERVER_ADD,
    APISERVER_UPDATE,
    EVENT_POD_FAILING,
    POLICY_ANNOTATION,
    REBALANCE_KEY,
)

JSON = dict[str, Any]
Log = Callable[[str], None]

APPS: Final = "soak-apps"
BATCH: Final = "soak-batch"
DATA: Final = "soak-data"
# A Deployment whose application crash-loops on every node (the fault label on its own pod
# template): no move can help it, so it must keep most of its budget (part 3 of the issue).
BROKEN: Final = "soak-broken"
BROKEN_REPLICAS: Final = 2
BROKEN_RETRIES: Final = 3
IMAGE: Final = "registry.example.com/shop/web:1.4.2"
SCHEDULER_CONFIG: Final = ROOT / "knative" / "scheduler" / "kube-scheduler-config.yaml"
# Nodes: 0 system pool (hot later; two local PVs), 1-3 faulty, 3-4 the batch pool (tainted
# NoSchedule: only the CronJob goes there, so node-3 sees one workload's failures), 5 opted
# out, 6 general (drained mid-run); node-7 joins and leaves.
FAULTS: Final = {"node-1": "crashloop", "node-2": "imagepull", "node-3": "createcontainer"}
LAYOUT: Final = Layout(
    system=("node-0",),
    batch=("node-3", "node-4"),
    inventory=("node-0", "node-4"),
    opted_out=("node-5",),
    volumes=("node-0", "node-0"),
)
HOT: Final = "node-0"
DRAINED: Final = "node-6"
JOINS: Final = "node-7"


@dataclass(frozen=True)
class Scales:
    nodes: int
    # Seconds from the workloads' creation: the timeline, then the end of the run.
    hot_at: float
    restart_addon_at: float
    join_at: float
    drain_at: float
    leave_at: float
    run_s: float
    settle_s: float
    every: float  # label-nodes, annotate-usage, rebalance-nodes, sweep, assess-nodes
    pending_grace: float
    deployments: int


QUICK: Final = Scales(
    nodes=7,
    hot_at=10,
    restart_addon_at=45,
    join_at=30,
    drain_at=60,
    leave_at=90,
    run_s=140,
    settle_s=60,
    every=3.0,
    pending_grace=30.0,
    deployments=2,
)
FULL: Final = Scales(
    nodes=7,
    hot_at=30,
    restart_addon_at=120,
    join_at=90,
    drain_at=240,
    leave_at=360,
    run_s=600,
    settle_s=180,
    every=5.0,
    pending_grace=60.0,
    deployments=4,
)


def _affinity(node: str) -> JSON:
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node]}
                        ]
                    },
                }
            ]
        }
    }


def _pod_spec(node: str, cpu: str = "200m", **extra: Any) -> JSON:
    return {
        "affinity": _affinity(node),
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "app", "image": IMAGE, "resources": {"requests": {"cpu": cpu}}}],
        **extra,
    }


def workloads(scales: Scales) -> list[tuple[str, JSON]]:
    faulty = ["node-1", "node-2"]
    out: list[tuple[str, JSON]] = []
    for i in range(scales.deployments):
        node = faulty[i % len(faulty)]
        out.append(
            (
                f"/apis/apps/v1/namespaces/{APPS}/deployments",
                _deployment(f"web-{i}", 2, node, {POLICY_ANNOTATION: "4"}),
            )
        )
    # Opted in, healthy where it runs until the operator drains node-6: nothing of ours may
    # move it while it is healthy (it is not opted in to rebalancing).
    out.append(
        (
            f"/apis/apps/v1/namespaces/{APPS}/deployments",
            _deployment("steady", 2, "node-6", {POLICY_ANNOTATION: "4"}),
        )
    )
    out.append(
        (
            f"/apis/batch/v1/namespaces/{BATCH}/cronjobs",
            cronjob(
                "report",
                {POLICY_ANNOTATION: "3"},
                _pod_spec(
                    "node-3",
                    cpu="100m",
                    tolerations=[BATCH_TOLERATION],
                    nodeSelector={POOL_LABEL: "batch"},
                ),
            ),
        )
    )
    broken = _deployment(
        "broken", BROKEN_REPLICAS, "node-6", {POLICY_ANNOTATION: str(BROKEN_RETRIES)}
    )
    broken["spec"]["template"]["metadata"]["labels"][SIM_FAULT_LABEL] = "crashloop"
    broken["spec"]["template"]["spec"].pop("affinity")
    out.append((f"/apis/apps/v1/namespaces/{BROKEN}/deployments", broken))
    out.append(
        (
            f"/apis/apps/v1/namespaces/{DATA}/statefulsets",
            local_volume_statefulset("cache", 2, {REBALANCE_KEY: "true"}),
        )
    )
    return out


def _deployment(name: str, replicas: int, node: str, annotations: JSON) -> JSON:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": _pod_spec(node)},
        },
    }


_COLLECTIONS: Final = {
    "Deployment": "/apis/apps/v1/deployments",
    "ReplicaSet": "/apis/apps/v1/replicasets",
    "StatefulSet": "/apis/apps/v1/statefulsets",
    "Job": "/apis/batch/v1/jobs",
    "Pod": "/api/v1/pods",
    "Event": "/api/v1/events",
    "Namespace": "/api/v1/namespaces",
}


def collect(cluster: Cluster) -> list[JSON]:
    objects: list[JSON] = []
    for kind, path in _COLLECTIONS.items():
        query = {"limit": "500"}
        while True:
            page = cluster.rest.get(path, query)
            objects.extend({**o, "kind": kind} for o in page.get("items", []))
            cont = page.get("metadata", {}).get("continue")
            if not cont:
                break
            query = {**query, "continue": cont}
    return objects


def _ping_loop(server: FunctionServer, every: float, stop: threading.Event) -> None:
    headers = {
        "ce-specversion": "1.0",
        "ce-source": "/apis/v1/namespaces/kn-rescheduler/pingsources/rebalance-nodes",
        "ce-type": PING_TYPE,
        "content-type": "application/json",
    }
    n = 0
    while not stop.wait(every):
        n += 1
        with contextlib.suppress(requests.RequestException):
            requests.post(
                server.url, json={}, headers={**headers, "ce-id": f"soak-{n}"}, timeout=30
            )


def run(scales: Scales, workdir: Path, log: Log) -> JSON:
    started = time.monotonic()
    port = free_port()
    cluster = Cluster(
        workdir / "cluster",
        nodes=scales.nodes,
        quiet=True,
        keep_workdir=True,
        scheduler_config=load_aware_scheduler_config(f"http://127.0.0.1:{port}", SCHEDULER_CONFIG),
    )
    log(f"starting a {scales.nodes}-node cluster (the default scheduler calls score-nodes)")
    cluster.start()
    stop = threading.Event()
    stack: Stack | None = None
    rebalance: FunctionServer | None = None
    try:
        recorder = Recorder()
        watches = start_watches(cluster.rest, recorder, stop)
        deadline = time.monotonic() + 30
        while not all(w.relists for w in watches) and time.monotonic() < deadline:
            time.sleep(0.1)
        for node, mode in FAULTS.items():
            cluster.set_fault(node, mode)
        prod = Production(cluster, LAYOUT).apply()
        second_scrape_job(cluster)
        for ns in (APPS, BATCH, DATA, BROKEN):
            create_namespace(cluster.rest, ns)
        log("starting every function (Knative's Broker, ApiServerSource, webhook, timers)")
        stack = Stack(
            cluster.kubeconfig,
            cluster.api_client(),
            workdir / "stack",
            cluster.log_dir,
            settings=LOCAL_FUNCTION_SETTINGS,
            sweep_every=scales.every * 3,
            assess_every=scales.every * 3,
            prometheus_url=cluster.prometheus_url,
            label_every=scales.every,
            usage_every=scales.every,
            score_nodes_port=port,
        ).start()
        rebalance = FunctionServer(
            "rebalance-nodes",
            cluster.log_dir,
            # What docs/rebalance.md says to set when the default scheduler calls score-nodes.
            env=environment(cluster.kubeconfig, KN_RESCHEDULER_REBALANCE_ANY_PLACEMENT="true"),
        ).start()
        threading.Thread(
            target=_ping_loop, args=(rebalance, scales.every, stop), daemon=True
        ).start()
        for path, body in workloads(scales):
            cluster.rest.post(path, body)
        t0 = time.monotonic()
        wall0 = time.time()
        plan: list[tuple[float, str, Callable[[], object]]] = sorted(
            [
                (
                    scales.hot_at,
                    f"{HOT} runs hot (CPU 95 %)",
                    lambda: cluster.set_node_usage(HOT, cpu=0.95),
                ),
                (
                    scales.restart_addon_at,
                    "kube-system/metrics-agent restarted",
                    lambda: prod.restart_addon("metrics-agent"),
                ),
                (scales.join_at, f"{JOINS} joins", lambda: prod.add_node(JOINS)),
                (scales.drain_at, f"{DRAINED} cordoned and drained", lambda: prod.drain(DRAINED)),
                (scales.leave_at, f"{JOINS} drained and removed", lambda: prod.remove_node(JOINS)),
            ],
            key=lambda s: s[0],
        )
        log(f"workloads created; the timeline runs for {scales.run_s:.0f} s")
        while time.monotonic() - t0 < scales.run_s:
            while plan and time.monotonic() - t0 >= plan[0][0]:
                _, what, act = plan.pop(0)
                try:
                    act()
                    log(f"  {time.monotonic() - t0:5.1f}s {what}")
                except (ApiError, RuntimeError) as exc:
                    log(f"  {time.monotonic() - t0:5.1f}s {what} FAILED: {exc}")
            cluster.revive()
            time.sleep(0.5)
        log("waiting for the node-fixable workloads to recover")
        end = time.monotonic() + scales.settle_s
        record = _record(cluster, recorder, prod, scales)
        while time.monotonic() < end:
            if not invariants.node_fixable_recovered(record)[0]:
                break
            time.sleep(3.0)
            record = _record(cluster, recorder, prod, scales)
        stack.wait_idle(30)
        record = _record(cluster, recorder, prod, scales)
        verdict = invariants.check(record)
        return _figures(record, verdict, stack, wall0, time.monotonic() - started)
    finally:
        stop.set()
        if rebalance is not None:
            rebalance.stop()
        if stack is not None:
            stack.stop()
        cluster.stop()


def _record(cluster: Cluster, recorder: Recorder, prod: Production, scales: Scales) -> Record:
    objects = collect(cluster)
    pods, nodes, owners = recorder.snapshot()
    return Record(
        pods=pods,
        nodes=nodes,
        operator=[
            OperatorWrite(
                w["node"],
                w["rv"],
                w["labels"],
                tuple(w["taints"]) if w["taints"] is not None else None,
                w["unschedulable"],
            )
            for w in prod.writes
        ],
        owners=owners,
        objects=objects,
        faulty_nodes=frozenset(FAULTS),
        recovery_namespaces=frozenset({APPS}),
        ended_at=time.time(),
        pending_grace=scales.pending_grace,
        broken={f"Deployment {BROKEN}/broken": BROKEN_RETRIES * BROKEN_REPLICAS},
    )


def _figures(record: Record, verdict: Verdict, stack: Stack, wall0: float, runtime: float) -> JSON:
    archived = stack.archived()
    types = Counter(str(e.get("type")) for e in archived)
    events = [o for o in record.objects if o.get("kind") == "Event"]
    ours = [
        e
        for e in events
        if (e.get("source") or {}).get("component") == "kn-rescheduler"
        or e.get("reportingComponent") == "kn-rescheduler"
    ]
    return {
        "pods": {
            "seen": len(record.pods),
            "removed": sum(1 for f in record.pods.values() if f.gone),
            "system_critical": sum(
                1 for f in record.pods.values() if invariants.is_system_critical(f.last)
            ),
        },
        "nodes": {
            "versions_seen": len(record.nodes),
            "operator_writes": len(record.operator),
            "faulty": dict(FAULTS),
        },
        "events": {
            "kubernetes_events": len(events),
            "ours": len(ours),
            "by_reason_ours": dict(Counter(str(e.get("reason")) for e in ours)),
            "cloudevents_archived": len(archived),
            "pod_events": types.get(APISERVER_ADD, 0) + types.get(APISERVER_UPDATE, 0),
            "failing": types.get(EVENT_POD_FAILING, 0),
        },
        "moves": invariants.moves(record),
        "function_restarts": stack.restarts(),
        "invariants": verdict.to_json(),
        "invariant_checks": sum(verdict.checked.values()),
        "violations": len(verdict.violations),
        "runtime_s": round(runtime, 1),
        "timeline_started": wall0,
    }
