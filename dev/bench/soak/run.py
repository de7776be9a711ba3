"""One soak: a production-like local cluster, every function, some faulty nodes, a while.

cluster (default scheduler calling score-nodes as its extender, Prometheus with two scrape
jobs of the same endpoints) -> watches
-> production fixture (operator labels and taints, kube-system add-ons, local PVs), and what a
   cluster that ran for days has: pods left terminal (Evicted, Terminated, OutOfcpu) on several
   nodes, an image pre-puller
-> Stack (detect-failures, update-annotations, webhook, sweep, assess-nodes, label-nodes,
   annotate-usage, score-nodes) and rebalance-nodes on a timer
-> workloads: Deployments preferring three crash-looping nodes in different orders, a healthy
   one, a CronJob every minute on a node only it fails on, a StatefulSet on local PVs on the
   node that turns hot, and the lookalikes of a node's failure (an application broken
   everywhere, a rollout whose image crashes 20 s after start, a big image pulling for minutes
   beside siblings that had it, a namespace without its network attachment, a container its
   own restart rules restart in place)
-> the timeline (a node hot, the rollout, an add-on restarted, a node added, one cordoned and
   drained, the added one removed; a forger posting claims to every function and the Broker)
-> settle -> the record -> invariants -> figures
"""

from __future__ import annotations

import contextlib
import itertools
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
from dev.bench.soak.forger import Forger, run_bursts
from dev.bench.soak.invariants import OperatorWrite, Record
from dev.bench.soak.observe import Recorder, start_watches
from dev.localcluster.cluster import Cluster
from dev.localcluster.keys import (
    SIM_FAULT_LABEL,
)
from dev.localcluster.kubelet import LOCAL_FUNCTION_SETTINGS
from dev.localcluster.podstatus import (
    MULTUS_NETWORKS_ANNOTATION,
    SIM_EXIT_CODE_ANNOTATION,
    SIM_PULL_TAKES_ANNOTATION,
    SIM_RUNS_FOR_ANNOTATION,
)
from dev.localcluster.production import (
    BATCH_TOLERATION,
    POOL_LABEL,
    Layout,
    Production,
    cronjob,
    image_prepuller,
    left_terminal_pod,
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
    EVENT_POD_RESCHEDULED,
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
# The lookalikes of a node's failure, each in its namespace.
ROLLOUT: Final = "soak-rollout"  # a new image that crashes 20 s after start, on every node
LEGACY: Final = (
    "soak-legacy"  # never opted in; a Job's pods left terminal days ago on several nodes
)
NIGHTLY: Final = "nightly-import"
BIG: Final = "soak-bigimage"  # a big image pulling for minutes beside siblings that had it
NET: Final = "soak-net"  # its Multus network attachment does not exist
TRAIN: Final = "soak-train"  # a training Job whose container restarts in place on exit 42
TARGET: Final = "soak-target"  # healthy; the forger names its pods
IMAGE: Final = "registry.example.com/shop/web:1.4.2"
CHECKOUT_V1: Final = "registry.example.com/shop/checkout:1.8.0"
CHECKOUT_V2: Final = "registry.example.com/shop/checkout:1.9.0"
BIG_IMAGE: Final = "registry.example.com/analytics/notebook:2026.11"
TRAIN_IMAGE: Final = "registry.example.com/ml/trainer:0.7.1"
ROLLOUT_RUNS_FOR: Final = 20  # seconds the new image runs before it crashes
TRAIN_RUNS_FOR: Final = 10
RETRIABLE_EXIT: Final = 42
SCHEDULER_CONFIG: Final = ROOT / "knative" / "scheduler" / "kube-scheduler-config.yaml"
# Nodes: 0 system pool (hot later; two local PVs); 1-3 crash-loop every pod; 4-5 the batch pool
# (tainted NoSchedule: only the CronJob goes there, and 4 fails its containers' creation, so it
# sees one workload's failures); 6 opted out; 7 general (drained mid-run); 8 general; node-9
# joins and leaves.
BAD: Final = ("node-1", "node-2", "node-3")
FAULTS: Final = {**dict.fromkeys(BAD, "crashloop"), "node-4": "createcontainer"}
LAYOUT: Final = Layout(
    system=("node-0",),
    batch=("node-4", "node-5"),
    inventory=("node-0", "node-5"),
    opted_out=("node-6",),
    volumes=("node-0", "node-0"),
)
HOT: Final = "node-0"
DRAINED: Final = "node-7"
JOINS: Final = "node-9"
# Healthy nodes nobody drains: the big image's three (two of them have it already: the
# pre-puller), the forger's targets, and the nodes its claims name.
SLOW_PULL_NODE: Final = "node-8"
CACHED_NODES: Final = ("node-0", "node-6")
STEADY_NODES: Final = ("node-0", "node-6", "node-8")
# Pods left terminal from days ago: (status.reason, node).
TERMINAL_PODS: Final = (
    ("Evicted", "node-0"),
    ("Evicted", "node-8"),
    ("Terminated", "node-6"),
    ("Terminated", "node-1"),
    ("OutOfcpu", "node-8"),
    ("OutOfcpu", "node-2"),
)


@dataclass(frozen=True)
class Scales:
    nodes: int
    # Seconds from the workloads' creation: the timeline, then the end of the run.
    hot_at: float
    rollout_at: float
    restart_addon_at: float
    join_at: float
    drain_at: float
    leave_at: float
    forge_at: tuple[float, ...]
    run_s: float
    settle_s: float
    every: float  # label-nodes, annotate-usage, rebalance-nodes, sweep, assess-nodes
    pending_grace: float
    # Deployments preferring the bad nodes, each in another order.
    deployments: int
    # How long the big image's pull takes on the node that lacks it, and the functions'
    # pending_stuck_after (shorter than the pull: a pull is not a hang).
    pull_s: float
    pending_stuck_after: str


QUICK: Final = Scales(
    nodes=9,
    hot_at=10,
    rollout_at=15,
    restart_addon_at=45,
    join_at=30,
    drain_at=60,
    leave_at=90,
    forge_at=(40.0, 100.0),
    run_s=150,
    settle_s=50,
    every=3.0,
    pending_grace=30.0,
    deployments=3,
    pull_s=150.0,
    pending_stuck_after="60s",
)
FULL: Final = Scales(
    nodes=9,
    hot_at=30,
    rollout_at=60,
    restart_addon_at=120,
    join_at=90,
    drain_at=240,
    leave_at=360,
    forge_at=(150.0, 300.0, 450.0, 540.0),
    run_s=600,
    settle_s=180,
    every=5.0,
    pending_grace=60.0,
    deployments=6,
    pull_s=360.0,
    pending_stuck_after="2m",
)


def settings(scales: Scales) -> dict[str, str]:
    """The functions' settings: the local cluster's, pending_stuck_after shortened (so that a
    sandbox that never comes up, or a pull, outlasts it within the run)."""
    return {
        **LOCAL_FUNCTION_SETTINGS,
        "KN_RESCHEDULER_PENDING_STUCK_AFTER": scales.pending_stuck_after,
    }


def _preferred(nodes: tuple[str, ...]) -> JSON:
    """Preferred node affinity for ``nodes``, the first the most (weights 100, 60, 30 ...)."""
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": max(100 - 40 * i, 10),
                    "preference": {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node]}
                        ]
                    },
                }
                for i, node in enumerate(nodes)
            ]
        }
    }


def _affinity(node: str) -> JSON:
    return _preferred((node,))


def _required(nodes: tuple[str, ...], operator: str = "In") -> JSON:
    """Required node affinity for (``In``) or against (``NotIn``) ``nodes``, by their hostname
    label (a ``metadata.name`` field selector takes one value only)."""
    term = {"key": "kubernetes.io/hostname", "operator": operator, "values": list(nodes)}
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [term]}]
        }
    }


def _pod_spec(node: str, cpu: str = "200m", **extra: Any) -> JSON:
    return {
        "affinity": _affinity(node),
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "app", "image": IMAGE, "resources": {"requests": {"cpu": cpu}}}],
        **extra,
    }


def bad_node_orders(scales: Scales) -> list[tuple[str, ...]]:
    """The orders in which the Deployments prefer the bad nodes: every rotation first, then the
    other permutations (six in all for three nodes)."""
    rotations = [BAD[i:] + BAD[:i] for i in range(len(BAD))]
    others = [p for p in itertools.permutations(BAD) if p not in rotations]
    return (rotations + others)[: scales.deployments]


def spread_deployments(scales: Scales) -> list[str]:
    return [f"Deployment {APPS}/web-{i}" for i in range(len(bad_node_orders(scales)))]


def workloads(scales: Scales) -> list[tuple[str, JSON]]:
    out: list[tuple[str, JSON]] = []
    for i, order in enumerate(bad_node_orders(scales)):
        web = _deployment(f"web-{i}", 2, order[0], {POLICY_ANNOTATION: "4"})
        web["spec"]["template"]["spec"]["affinity"] = _preferred(order)
        out.append((f"/apis/apps/v1/namespaces/{APPS}/deployments", web))
    # Opted in, healthy where it runs until the operator drains node-7: nothing of ours may
    # move it while it is healthy (it is not opted in to rebalancing).
    out.append(
        (
            f"/apis/apps/v1/namespaces/{APPS}/deployments",
            _deployment("steady", 2, DRAINED, {POLICY_ANNOTATION: "4"}),
        )
    )
    out.append(
        (
            f"/apis/batch/v1/namespaces/{BATCH}/cronjobs",
            cronjob(
                "report",
                {POLICY_ANNOTATION: "3"},
                _pod_spec(
                    "node-4",
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
    out.extend(lookalike_workloads(scales))
    return out


def lookalike_workloads(scales: Scales) -> list[tuple[str, JSON]]:
    """The workloads that look like a node's failure and are not one (and the forger's
    healthy targets): all opted in, none may be moved but by the rules that fit them."""
    out: list[tuple[str, JSON]] = []
    # Kept off the bad nodes: every move of it is of the image that fails everywhere.
    checkout = _deployment("checkout", 2, "node-8", {POLICY_ANNOTATION: "3"})
    checkout["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": _required(BAD, operator="NotIn")
    }
    checkout["spec"]["template"]["spec"]["containers"][0]["image"] = CHECKOUT_V1
    out.append((f"/apis/apps/v1/namespaces/{ROLLOUT}/deployments", checkout))
    # Three replicas, one per node; two of the nodes have the image (the pre-puller), the third
    # pulls it for pull_s seconds.
    big = _deployment("analytics", 3, SLOW_PULL_NODE, {POLICY_ANNOTATION: "3"})
    template = big["spec"]["template"]
    template["metadata"]["annotations"] = {SIM_PULL_TAKES_ANNOTATION: str(scales.pull_s)}
    template["spec"]["containers"][0]["image"] = BIG_IMAGE
    template["spec"]["affinity"] = {
        "nodeAffinity": _required((SLOW_PULL_NODE, *CACHED_NODES)),
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "analytics"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        },
    }
    out.append((f"/apis/apps/v1/namespaces/{BIG}/deployments", big))
    edge = _deployment("edge", 2, "node-8", {POLICY_ANNOTATION: "3"})
    edge["spec"]["template"]["spec"].pop("affinity")
    edge["spec"]["template"]["metadata"]["annotations"] = {
        MULTUS_NETWORKS_ANNOTATION: "macvlan-conf"
    }
    out.append((f"/apis/apps/v1/namespaces/{NET}/deployments", edge))
    out.append((f"/apis/batch/v1/namespaces/{TRAIN}/jobs", trainer_job()))
    api = _deployment("api", 2, "node-8", {POLICY_ANNOTATION: "3"})
    api["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": _required(STEADY_NODES)}
    out.append((f"/apis/apps/v1/namespaces/{TARGET}/deployments", api))
    return out


def trainer_job() -> JSON:
    """A training Job whose container exits 42 every TRAIN_RUNS_FOR seconds, a code its own
    restartPolicyRules ask the kubelet to restart in place (ContainerRestartRules), under pod
    restartPolicy Never."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "trainer", "annotations": {POLICY_ANNOTATION: "3"}},
        "spec": {
            "backoffLimit": 6,
            "template": {
                "metadata": {
                    "labels": {"app": "trainer", SIM_FAULT_LABEL: "crashloop"},
                    "annotations": {
                        SIM_RUNS_FOR_ANNOTATION: str(TRAIN_RUNS_FOR),
                        SIM_EXIT_CODE_ANNOTATION: str(RETRIABLE_EXIT),
                    },
                },
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "train",
                            "image": TRAIN_IMAGE,
                            "resources": {"requests": {"cpu": "200m"}},
                            "restartPolicy": "Never",
                            "restartPolicyRules": [
                                {
                                    "action": "Restart",
                                    "exitCodes": {"operator": "In", "values": [RETRIABLE_EXIT]},
                                }
                            ],
                        }
                    ],
                },
            },
        },
    }


def lookalikes() -> dict[str, str]:
    """The lookalike workloads and what each looks like (invariants.LOOKALIKE_KINDS)."""
    return {
        f"Job {LEGACY}/{NIGHTLY}": "terminal",
        f"Deployment {BROKEN}/broken": "everywhere",
        f"Deployment {ROLLOUT}/checkout": "everywhere",
        f"Deployment {BIG}/analytics": "slow-pull",
        f"Deployment {NET}/edge": "multus",
        f"Job {TRAIN}/trainer": "restart-rules",
    }


def roll_out_crashing_image(cluster: Cluster) -> None:
    """The new checkout image: it runs ROLLOUT_RUNS_FOR seconds, then exits 1, on any node."""
    cluster.rest.patch(
        f"/apis/apps/v1/namespaces/{ROLLOUT}/deployments/checkout",
        {
            "spec": {
                "template": {
                    "metadata": {
                        "labels": {SIM_FAULT_LABEL: "crashloop"},
                        "annotations": {SIM_RUNS_FOR_ANNOTATION: str(ROLLOUT_RUNS_FOR)},
                    },
                    "spec": {"containers": [{"name": "app", "image": CHECKOUT_V2}]},
                }
            }
        },
        "application/strategic-merge-patch+json",
    )


def days_old_neighbours(cluster: Cluster, log: Log) -> None:
    """What a cluster that ran for days has before the soak starts: a Deployment that never
    opted in, a nightly Job that never opted in, finished, with pods of its left terminal on
    several nodes (evicted, stopped by a node shutdown, rejected for CPU; a finished Job's
    controller leaves them), and a pre-puller that put the big image on two nodes."""
    legacy = _deployment("legacy", 2, "node-8", {})
    legacy["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": _required(("node-0", "node-8"))
    }
    cluster.rest.post(f"/apis/apps/v1/namespaces/{LEGACY}/deployments", legacy)
    cluster.rest.post(f"/apis/batch/v1/namespaces/{LEGACY}/jobs", nightly_job())
    cluster.rest.post(
        f"/apis/apps/v1/namespaces/{BIG}/daemonsets",
        image_prepuller("prepull", BIG_IMAGE, CACHED_NODES),
    )
    path = f"/apis/batch/v1/namespaces/{LEGACY}/jobs/{NIGHTLY}"

    def complete() -> JSON | None:
        job: JSON = cluster.rest.get(path)
        done = any(
            c.get("type") == "Complete" and c.get("status") == "True"
            for c in (job.get("status") or {}).get("conditions") or []
        )
        return job if done else None

    job = _wait_for(f"the Job {NIGHTLY} to complete", complete)
    labels = {
        "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
        "batch.kubernetes.io/job-name": NIGHTLY,
        "controller-uid": job["metadata"]["uid"],
        "job-name": NIGHTLY,
    }
    owner = {**job, "kind": "Job", "apiVersion": "batch/v1"}
    for i, (kind, node) in enumerate(TERMINAL_PODS):
        name = f"{NIGHTLY}-{kind.lower()[:4]}{i}"
        cluster.rest.post(
            f"/api/v1/namespaces/{LEGACY}/pods",
            left_terminal_pod(name, node, kind, owner, labels, IMAGE),
        )

    def prepulled() -> bool:
        pods = cluster.rest.get(
            f"/api/v1/namespaces/{BIG}/pods", {"labelSelector": "app=prepull"}
        ).get("items", [])
        running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return len(running) == len(CACHED_NODES)

    _wait_for("the pre-puller on its nodes", lambda: prepulled() or None)
    log(
        f"days-old neighbours: {len(TERMINAL_PODS)} terminal pods of {LEGACY}/{NIGHTLY}, "
        f"{BIG_IMAGE} pre-pulled on {', '.join(CACHED_NODES)}"
    )


def nightly_job() -> JSON:
    """A Job that never opted in and completes at once on a healthy node."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": NIGHTLY},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "affinity": {"nodeAffinity": _required(("node-0", "node-8"))},
                    "containers": [
                        {"name": "app", "image": IMAGE, "resources": {"requests": {"cpu": "100m"}}}
                    ],
                }
            }
        },
    }


def _wait_for(what: str, probe: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.3)
    raise RuntimeError(f"timed out waiting for {what}")


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
    forger: Forger | None = None
    env = settings(scales)
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
        for ns in (APPS, BATCH, DATA, BROKEN, ROLLOUT, LEGACY, BIG, NET, TRAIN, TARGET):
            create_namespace(cluster.rest, ns)
        days_old_neighbours(cluster, log)
        log("starting every function (Knative's Broker, ApiServerSource, webhook, timers)")
        stack = Stack(
            cluster.kubeconfig,
            cluster.api_client(),
            workdir / "stack",
            cluster.log_dir,
            settings=env,
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
            env=environment(
                cluster.kubeconfig, KN_RESCHEDULER_REBALANCE_ANY_PLACEMENT="true", **env
            ),
        ).start()
        threading.Thread(
            target=_ping_loop, args=(rebalance, scales.every, stop), daemon=True
        ).start()
        forger = Forger(
            cluster.rest,
            {
                **{name: server.url for name, server in stack.servers.items()},
                "rebalance-nodes": rebalance.url,
                "broker": stack.broker_url,
            },
            targets=((TARGET, "app=api"), (LEGACY, "app=legacy")),
            nodes=STEADY_NODES,
            made_up_namespace=TARGET,
        )
        for path, body in workloads(scales):
            cluster.rest.post(path, body)
        t0 = time.monotonic()
        wall0 = time.time()
        threading.Thread(
            target=run_bursts,
            args=(forger, scales.forge_at, t0, stop, time.monotonic, log),
            daemon=True,
        ).start()
        plan: list[tuple[float, str, Callable[[], object]]] = sorted(
            [
                (
                    scales.hot_at,
                    f"{HOT} runs hot (CPU 95 %)",
                    lambda: cluster.set_node_usage(HOT, cpu=0.95),
                ),
                (
                    scales.rollout_at,
                    f"{ROLLOUT}/checkout rolled out to {CHECKOUT_V2}, which crashes "
                    f"{ROLLOUT_RUNS_FOR} s after start",
                    lambda: roll_out_crashing_image(cluster),
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
        record = _record(cluster, recorder, prod, scales, stack, forger)
        while time.monotonic() < end:
            if not (
                invariants.node_fixable_recovered(record)[0]
                or invariants.bad_nodes_at_once_recovered(record)[0]
            ):
                break
            time.sleep(3.0)
            record = _record(cluster, recorder, prod, scales, stack, forger)
        stack.wait_idle(30)
        record = _record(cluster, recorder, prod, scales, stack, forger)
        verdict = invariants.check(record)
        return _figures(record, verdict, stack, forger, wall0, time.monotonic() - started)
    finally:
        stop.set()
        if rebalance is not None:
            rebalance.stop()
        if stack is not None:
            stack.stop()
        cluster.stop()


def _record(
    cluster: Cluster,
    recorder: Recorder,
    prod: Production,
    scales: Scales,
    stack: Stack,
    forger: Forger,
) -> Record:
    objects = collect(cluster)
    pods, nodes, owners = recorder.snapshot()
    claims = forger.claims()
    replies = [
        e
        for e in stack.archived()
        if e.get("type") == EVENT_POD_RESCHEDULED and e.get("id") not in claims.ids
    ]
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
        broken={
            f"Deployment {BROKEN}/broken": BROKEN_RETRIES * BROKEN_REPLICAS,
            f"Deployment {ROLLOUT}/checkout": 3 * 2,
        },
        lookalikes=lookalikes(),
        must_recover=frozenset(spread_deployments(scales)),
        forged=claims,
        settings=settings(scales),
        replies=replies,
        state_written=recorder.holders_with_state(),
    )


def _lookalike_figures(record: Record) -> JSON:
    """Per lookalike workload: its pods, how many we removed, the longest a pod of it stayed
    Pending once bound (not started: the slow pull, the missing network attachment), the
    MovesStopped Events about it."""
    idx = invariants._Index(record)
    out: JSON = {}
    for workload, kind in sorted(record.lookalikes.items()):
        mine = {
            uid: f
            for uid, f in record.pods.items()
            if invariants.workload_of(f.last, record.owners) == workload
        }
        holders = {str((invariants._controller(f.last) or {}).get("uid")) for f in mine.values()}
        pending = [
            (f.started_at or f.deleting_at or record.ended_at) - f.bound_at
            for f in mine.values()
            if f.bound_at is not None
        ]
        out[workload] = {
            "looks_like": kind,
            "pods": len(mine),
            "removed_by_us": sum(
                1 for uid, f in mine.items() if idx.removal_reason(uid, f.last) is not None
            ),
            "longest_pending_s": round(max(pending), 1) if pending else None,
            "moves_stopped": sum(
                1
                for e in idx.events
                if e.get("reason") == "MovesStopped"
                and (e.get("involvedObject") or {}).get("uid") in holders
            ),
        }
    return out


def _moves_by_rule(record: Record) -> dict[str, int]:
    """Our moves by the rule their reply names (thresholds, or an early rule)."""
    return dict(Counter(str(invariants.said_rule(r)) for r in record.replies))


def _figures(
    record: Record,
    verdict: Verdict,
    stack: Stack,
    forger: Forger,
    wall0: float,
    runtime: float,
) -> JSON:
    claims = forger.claims()
    archived = stack.archived()
    # The pipeline's own events; the forger's posts to the Broker are archived too.
    forged_archived = [e for e in archived if e.get("id") in claims.ids]
    types = Counter(str(e.get("type")) for e in archived if e.get("id") not in claims.ids)
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
            "cloudevents_archived": len(archived) - len(forged_archived),
            "forged_archived": len(forged_archived),
            "pod_events": types.get(APISERVER_ADD, 0) + types.get(APISERVER_UPDATE, 0),
            "failing": types.get(EVENT_POD_FAILING, 0),
            "rescheduled_replies": len(record.replies),
        },
        "moves": invariants.moves(record),
        "moves_by_rule": _moves_by_rule(record),
        "lookalikes": _lookalike_figures(record),
        "forger": {
            "posts": forger.posted,
            "events_ids": len(claims.ids),
            "real_pods_named": len(claims.pods),
            "made_up_pods": len(claims.made_up_uids),
            "nodes_named": sorted(claims.nodes),
            "answers": dict(sorted(forger.answers.items())),
        },
        "function_restarts": stack.restarts(),
        "invariants": verdict.to_json(),
        "invariant_checks": sum(verdict.checked.values()),
        "violations": len(verdict.violations),
        "runtime_s": round(runtime, 1),
        "timeline_started": wall0,
    }
