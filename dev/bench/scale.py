"""Measurement 6: many nodes and pods, 2% of the nodes turning faulty at once.

A cluster of ``scale_nodes`` kwok nodes runs the whole pipeline (kn-rescheduler's functions,
Knative's Broker data plane and ApiServerSource adapter, the webhook registered). One
Deployment per node, ``scale_pods / scale_nodes`` replicas each, ``scheduling-retries: "3"``,
preferring its "home" node (preferred node affinity), is rolled out: ``scale_pods`` pods, every
one admitted by the webhook and every status change of every pod classified by
detect-failures.

The load-aware half runs beside it as an install runs it: Prometheus scrapes every node's
exporter every PROMETHEUS_SCRAPE, and annotate-usage, label-nodes and rebalance-nodes are
called every LOAD_AWARE_EVERY (their PingSources' schedule) with the built-in rules and rate
window. Each function has an API identity and a FlowSchema of its own, so the API server's
metrics say how many requests each made and how long they took; each function's own metrics
say how many events it handled and how long each took (a timer-driven function's time per
tick).

Then ``scale_faulty_share`` of the nodes turn faulty at once: their runtime breaks under their
pods (``Cluster.set_fault(..., running=True)``). Every container running there exits and
crash-loops in place, as on a real node; nothing is deleted, so a faulty node keeps its pods
until kn-rescheduler moves them. From then on only kn-rescheduler acts. Measured: the time from
the fault until every affected replica is Ready on a healthy node, the moves it took and how
many of them were *wasted* (the replacement landed on another faulty node), the CPU seconds
of every process (from /proc), and the webhook's calls as the API server timed them (its
admission latency histogram and fail-open counter), during the rollout and during the recovery.
A pod created while the webhook timed out has none of its stamps, so no pod event of it reaches
the functions; the sweep, every SWEEP_EVERY seconds, is what finds it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from dev.bench.common import (
    JSON,
    KN_USER,
    Scales,
    api_requests,
    cpu_of,
    create_namespace,
    delta,
    handling,
    identity_kubeconfig,
    list_all,
    own_cpu_seconds,
    parse_function_metrics,
    peak_rss_mib,
    ratio,
    scrape,
    summary,
    webhook_calls,
)
from dev.bench.recovery import deployment
from dev.bench.tracker import Tracker
from dev.localcluster import cluster as cluster_module
from dev.localcluster.cluster import Cluster
from dev.localcluster.kubelet import Timing
from dev.stack.stack import Stack

NAMESPACE = "bench-scale"

# The rollout adds Deployments while fewer than this many of their pods are not Ready yet. All
# at once, with the controller-manager at 100 QPS, 10,000 pods were created within two minutes
# and everything on the 2 cores competed for them: 830 Ready after 318 s (against 16 pods/s
# when the controller-manager's 20 QPS paced them). A platform team rolls out in waves too.
IN_FLIGHT: Final = 500
# How often the PingSource calls sweep-failures here (an install: every 5 minutes).
SWEEP_EVERY: Final = 60.0
# kube-controller-manager's API client (QPS, burst) for this measurement. Its defaults (20, 30)
# are shared by a ReplicaSet's pod creations and status writes: at 1,000 nodes a replacement
# was created 55 s after its pod was deleted, and a 60-node burst let 16-20 replicas fail
# instead of 54. Clusters of this size raise it: the Kubernetes project's 5,000-node test jobs
# run the controller-manager with --kube-api-qps=100 --kube-api-burst=100 (the burst is
# doubled here, for the harness's own burst of deletions).
CONTROLLER_MANAGER_QPS = (100, 200)
# What installs scrape at (Prometheus' own default is 1 minute): each scrape is a request to the
# harness's node exporter, a thousand of them per interval.
PROMETHEUS_SCRAPE: Final = "15s"
# The PingSources of annotate-usage, label-nodes and rebalance-nodes (knative/*.yaml).
LOAD_AWARE_EVERY: Final = 30.0
# The functions' settings for that: the built-in pressure rules (a 2-minute CPU window) and
# annotate-usage's default 1-minute rate, instead of the local stack's 10 s (a 1 s scrape).
LOAD_AWARE_SETTINGS: Final = {
    "KN_RESCHEDULER_PRESSURE_RULES_FILE": "",
    "KN_RESCHEDULER_USAGE_RATE_WINDOW": "1m",
}
# Every function the Stack starts here, each with its own identity (bench-fn-<name>).
FUNCTIONS: Final = (
    "detect-failures",
    "update-annotations",
    "assess-nodes",
    "sweep-failures",
    "label-nodes",
    "annotate-usage",
    "rebalance-nodes",
    "score-nodes",
    "mutate-admission",
)


def identity(function: str) -> str:
    """The user (and FlowSchema) a function's API requests are made as in this measurement."""
    return f"bench-fn-{function}"


def _control_plane_pids(cluster: Cluster) -> dict[str, int]:
    """etcd, the API server, controller-manager, scheduler, kwok (and Prometheus or
    metrics-server when running): the cluster's own processes, beside the functions."""
    pids = {p.name: p.pid for p in cluster.procs if p.alive()}
    # Prometheus is started (and restarted, in outage tests) apart from the other processes.
    prom = cluster.prometheus.proc if cluster.prometheus is not None else None
    if prom is not None and prom.alive():
        pids["prometheus"] = prom.pid
    return pids


def _peak_rss(harness: int, pids: Mapping[str, int]) -> dict[str, float]:
    return {
        "harness-process": peak_rss_mib(harness, descendants=False),
        **{name: peak_rss_mib(pid) for name, pid in pids.items()},
    }


def _function_metrics(stack: Stack) -> dict[str, dict[str, float]]:
    """Each function's own counters now (a function that does not answer: none)."""
    out: dict[str, dict[str, float]] = {}
    for name, server in stack.servers.items():
        try:
            out[name] = parse_function_metrics(server.metrics_text())
        except OSError:
            out[name] = {}
    return out


def _per_function(
    stack: Stack,
    seconds: float,
    cpu: tuple[Mapping[str, float], Mapping[str, float]],
    api: Mapping[str, float],
    own: tuple[Mapping[str, Mapping[str, float]], Mapping[str, Mapping[str, float]]],
) -> JSON:
    """One phase, function by function: CPU seconds, its API requests as the API server timed
    them, and the events it handled as it timed them."""
    return {
        name: {
            "cpu_s": round(cpu[1].get(name, 0.0) - cpu[0].get(name, 0.0), 2),
            "api": api_requests(api, identity(name)),
            **handling(delta(own[0].get(name, {}), own[1].get(name, {})), seconds),
        }
        for name in sorted(stack.servers)
    }


def _function_pids(stack: Stack) -> dict[str, int]:
    pids = {name: s.proc.pid for name, s in stack.servers.items() if s.proc is not None}
    proc = getattr(stack.source, "_proc", None) if stack.source else None
    if proc is not None:
        pids["apiserversource-adapter"] = int(proc.pid)
    # Knative's Broker data plane: processes of their own, where the former router was a part
    # of the harness process.
    for p in stack.broker.procs if stack.broker else []:
        pids["knative-" + p.name.replace("_", "-")] = int(p.proc.pid)
    return pids


def measure(
    scales: Scales,
    workdir: Path,
    *,
    log: Callable[[str], None],
    before: Callable[[], None],
    timing: Timing | None = None,
    settings: Mapping[str, str] | None = None,
) -> JSON:
    before()  # the shared cluster makes room
    nodes, pods = scales.scale_nodes, scales.scale_pods
    replicas = max(pods // nodes, 1)
    faulty_count = max(round(nodes * scales.scale_faulty_share), 1)
    log(f"scale: starting a {nodes}-node cluster")
    t = time.monotonic()
    # Cluster.start() gives a cluster START_TIMEOUT to be ready, sized for a handful of nodes;
    # registering and initialising a thousand takes longer on two cores.
    default_timeout = cluster_module.START_TIMEOUT
    cluster_module.START_TIMEOUT = max(default_timeout, 120.0 + nodes * 0.6)  # type: ignore[misc]
    try:
        cluster = Cluster(
            workdir / "cluster",
            nodes=nodes,
            timing=timing,
            quiet=True,
            keep_workdir=True,
            prometheus=True,
            prometheus_scrape_interval=PROMETHEUS_SCRAPE,
            controller_manager_qps=CONTROLLER_MANAGER_QPS,
        ).start()
    finally:
        cluster_module.START_TIMEOUT = default_timeout  # type: ignore[misc]
    result: JSON = {
        "nodes": nodes,
        "pods": replicas * nodes,
        "deployments": nodes,
        "replicas_per_deployment": replicas,
        "faulty_nodes": faulty_count,
        "controller_manager_qps": list(CONTROLLER_MANAGER_QPS),
        "cluster_start_s": round(time.monotonic() - t, 1),
    }
    deadline = time.monotonic() + scales.scale_budget
    try:
        kubeconfig = identity_kubeconfig(cluster, KN_USER, workdir / "identity")
        kubeconfigs = {
            f: identity_kubeconfig(cluster, identity(f), workdir / "identity") for f in FUNCTIONS
        }
        stack = Stack(
            kubeconfig,
            cluster.api_client(),
            workdir / "stack",
            workdir / "logs",
            # The sweep runs as an install's does (every 5 minutes there): it finds the pods no
            # event announces, such as a pod the API server admitted without the webhook (it
            # fails open on a timeout) and so without the label the event source selects on.
            sweep_every=SWEEP_EVERY,
            prometheus_url=cluster.prometheus_url,
            label_every=LOAD_AWARE_EVERY,
            usage_every=LOAD_AWARE_EVERY,
            rebalance_every=LOAD_AWARE_EVERY,
            settings={**LOAD_AWARE_SETTINGS, **(settings or {})},
            kubeconfigs=kubeconfigs,
        ).start()
        try:
            result.update(_run(cluster, stack, scales, replicas, faulty_count, deadline, log))
        finally:
            stack.stop()
    finally:
        cluster.stop()
    return result


def _run(
    cluster: Cluster,
    stack: Stack,
    scales: Scales,
    replicas: int,
    faulty_count: int,
    deadline: float,
    log: Callable[[str], None],
) -> JSON:
    rest = cluster.rest
    create_namespace(rest, NAMESPACE)
    # One watch of the namespace from before the first pod: Ready pods during the rollout (the
    # Deployments' readyReplicas lag far behind under load), then the recovery chains.
    faulty: set[str] = set()
    tracker = Tracker(rest, NAMESPACE, faulty).start()
    try:
        return _phases(cluster, stack, scales, replicas, faulty_count, deadline, log, tracker)
    finally:
        tracker.stop()


def _phases(
    cluster: Cluster,
    stack: Stack,
    scales: Scales,
    replicas: int,
    faulty_count: int,
    deadline: float,
    log: Callable[[str], None],
    tracker: Tracker,
) -> JSON:
    rest = cluster.rest
    out: JSON = {}
    pids = _function_pids(stack)
    plane = _control_plane_pids(cluster)
    # The harness process alone (fake kubelet, tracker, the tests' event archive), not the
    # processes it started: those are reported by name.
    harness = os.getpid()
    cpu0, plane0 = cpu_of(pids), cpu_of(plane)
    harness0 = own_cpu_seconds(harness)
    metrics0 = scrape(cluster)
    own0 = _function_metrics(stack)
    t0 = time.monotonic()
    expected = replicas * len(cluster.nodes)
    log(f"scale: rolling out {expected} pods, at most {IN_FLIGHT} not Ready at a time")
    for i, node in enumerate(cluster.nodes):
        while i * replicas - tracker.ready_count() > IN_FLIGHT and time.monotonic() < deadline:
            time.sleep(0.2)
        rest.post(
            f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
            deployment(f"home-{i}", replicas, node, []),
        )
    ready = 0
    last_log = time.monotonic()
    while time.monotonic() < deadline:
        ready = tracker.ready_count()
        if ready >= expected:
            break
        if time.monotonic() - last_log > 60:
            log(f"  {ready}/{expected} Ready after {time.monotonic() - t0:.0f} s")
            last_log = time.monotonic()
        time.sleep(1)
    rollout = time.monotonic() - t0
    stack.wait_idle(max(deadline - time.monotonic(), 1.0))
    cpu1, plane1 = cpu_of(pids), cpu_of(plane)
    harness1 = own_cpu_seconds(harness)
    metrics1 = delta(metrics0, scrape(cluster))
    own1 = _function_metrics(stack)
    drained = time.monotonic() - t0
    out["rollout"] = {
        "ready": ready,
        "expected": expected,
        "complete": ready >= expected,
        "seconds": round(rollout, 1),
        "pipeline_drained_s": round(drained, 1),
        "function_cpu_s": {k: round(cpu1[k] - cpu0.get(k, 0.0), 2) for k in cpu1},
        "control_plane_cpu_s": {k: round(plane1[k] - plane0.get(k, 0.0), 2) for k in plane1},
        "harness_process_cpu_s": round(harness1 - harness0, 2),
        "broker": stack.broker.stats() if stack.broker else {},
        # Every pod create called the webhook: its latency as the API server measured it.
        "webhook": webhook_calls(metrics1),
        "all_requests": metrics1["total"],
        "functions": _per_function(stack, drained, (cpu0, cpu1), metrics1, (own0, own1)),
    }
    out["peak_rss_mib"] = _peak_rss(harness, {**plane, **pids})
    log(f"  rollout: {ready}/{expected} Ready in {rollout:.0f} s")
    if ready < expected:
        out["recovery"] = {"skipped": "the rollout did not finish within the budget"}
        return out

    faulty = tracker.faulty
    faulty.update(cluster.nodes[-faulty_count:])
    requests0 = scrape(cluster)
    own2 = _function_metrics(stack)
    cpu2, plane2 = cpu_of(pids), cpu_of(plane)
    harness2 = own_cpu_seconds(harness)
    t_fault = time.monotonic()
    for node in faulty:
        cluster.set_fault(node, "crashloop", running=True)
    hit = sum(
        len(
            list_all(
                rest,
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                {"fieldSelector": f"spec.nodeName={node}"},
            )
        )
        for node in faulty
    )
    log(f"scale: {faulty_count} nodes faulty, {hit} pods running on them hit")
    done = False
    while time.monotonic() < deadline:
        time.sleep(1)
        if time.monotonic() - t_fault > 10 and tracker.all_recovered():
            done = True
            break
    elapsed = time.monotonic() - t_fault
    stack.wait_idle(30)
    cpu3, plane3 = cpu_of(pids), cpu_of(plane)
    harness3 = own_cpu_seconds(harness)
    requests1 = scrape(cluster)
    own3 = _function_metrics(stack)
    measured = time.monotonic() - t_fault
    chains = tracker.snapshot()
    affected = [c for c in chains if c.start is not None]
    recovered = [c for c in affected if c.recovered is not None]
    last = max((c.recovered for c in recovered if c.recovered), default=None)
    requests = delta(requests0, requests1)
    moves = sum(c.moves for c in affected)
    wasted = sum(c.wasted for c in affected)
    out["recovery"] = {
        # Pods on the faulty nodes when they broke: their containers crash in place.
        "pods_hit_in_place": hit,
        "affected_replicas": len(affected),
        "recovered": len(recovered),
        "all_recovered": done,
        "time_to_all_healthy_s": round(last - t_fault, 2) if done and last else None,
        "waited_s": round(elapsed, 1),
        "recovery_from_failure": summary(
            [c.recovered - c.start for c in recovered if c.recovered and c.start]
        ),
        "recovery_from_threshold": summary(
            [c.recovered - c.threshold for c in recovered if c.recovered and c.threshold]
        ),
        "moves": moves,
        # Moves whose replacement landed on another faulty node (bench.tracker).
        "wasted_moves": wasted,
        "wasted_share": ratio(wasted, moves),
        "moves_per_recovery": ratio(sum(c.moves for c in recovered), len(recovered)),
        "replicas_moved_more_than_once": sum(1 for c in recovered if c.moves > 1),
        "moves_histogram": {
            str(k): sum(1 for c in recovered if c.moves == k)
            for k in sorted({c.moves for c in recovered})
        },
        "function_cpu_s": {k: round(cpu3[k] - cpu2.get(k, 0.0), 2) for k in cpu3},
        "control_plane_cpu_s": {k: round(plane3[k] - plane2.get(k, 0.0), 2) for k in plane3},
        "harness_process_cpu_s": round(harness3 - harness2, 2),
        # kn-rescheduler's functions, each under its own identity, and the Broker's.
        "pipeline_requests": sum(
            v for k, v in requests.items() if k.startswith(("fs:bench-fn-", f"fs:{KN_USER}"))
        ),
        "all_requests": requests["total"],
        "webhook": webhook_calls(requests),
        "functions": _per_function(stack, measured, (cpu2, cpu3), requests, (own2, own3)),
    }
    out["peak_rss_mib"] = _peak_rss(harness, {**plane, **pids})
    log(
        f"  recovered {len(recovered)}/{len(affected)} in "
        f"{out['recovery']['time_to_all_healthy_s']} s; {moves} moves, {wasted} wasted"
    )
    return out
