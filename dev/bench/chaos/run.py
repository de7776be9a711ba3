"""One chaos run: a local cluster, the whole pipeline, a failure storm, faults, then the verdict.

cluster (faulty nodes) -> install RBAC, opt the bare pods' namespace in -> ledger watches
-> Stack (as update-annotations, sweep on) -> faults on in Knative's data plane (the Broker's
forwards: dev/pipeline/faults.py) -> the storm
-> for chaos_s: kills (on state writes, at random), API server / etcd restarts, revive
-> faults off -> wait until every replica is healthy (settle_s at most) -> data plane idle
-> snapshot from the API server -> invariants -> figures
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dev.bench.chaos import faults, invariants, scenario
from dev.bench.chaos.observe import Ledger, start_watches
from dev.localcluster.cluster import Cluster
from dev.localcluster.kubelet import LOCAL_FUNCTION_SETTINGS
from dev.localcluster.rest import ApiError
from dev.pipeline import faults as data_plane
from dev.stack.stack import TRIGGERED_FUNCTIONS, Stack
from shared.api.keys import (
    APISERVER_ADD,
    APISERVER_UPDATE,
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    REASON_RESCHEDULED,
)

JSON = dict[str, Any]
Log = Callable[[str], None]

# Where the kinds a snapshot reads live.
_COLLECTIONS = {
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "ReplicaSet": "/apis/apps/v1/namespaces/{ns}/replicasets",
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "Event": "/api/v1/namespaces/{ns}/events",
}
# A message update-annotations gives a move an earlier delivery recorded and a later one
# finished (shared.pods.update_annotations.decide.moved): the trace of a kill between state write
# and delete.
FINISHED_LATER = "recorded earlier, removed now"


def collect(
    cluster: Cluster, namespaces: list[str], faulty: list[str], ledger: Ledger, stack: Stack
) -> invariants.Snapshot:
    objects: list[JSON] = []
    for ns in namespaces:
        for kind, path in _COLLECTIONS.items():
            query = {"limit": "500"}
            while True:
                page = cluster.rest.get(path.format(ns=ns), query)
                objects.extend({**o, "kind": kind} for o in page.get("items", []))
                cont = page.get("metadata", {}).get("continue")
                if not cont:
                    break
                query = {**query, "continue": cont}
    seen, gone, ended_undeleted = ledger.snapshot()
    dead: list[JSON] = []
    if stack.dead_letters.exists():
        dead = [json.loads(line) for line in stack.dead_letters.read_text().splitlines() if line]
    return invariants.Snapshot(frozenset(faulty), objects, seen, gone, dead, ended_undeleted)


def _retrying(what: Callable[[], invariants.Snapshot], attempts: int = 20) -> invariants.Snapshot:
    """A snapshot, retried while the API server comes back (a restart may just have ended)."""
    for i in range(attempts):
        try:
            return what()
        except ApiError:
            if i == attempts - 1:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


def _create(cluster: Cluster, w: scenario.Workload, attempts: int = 30) -> None:
    """Create a workload, waiting for an API server that is coming back from a restart."""
    for i in range(attempts):
        try:
            cluster.rest.post(w.path, w.body)
            return
        except ApiError as e:
            if e.status == 409:
                return  # created by an earlier attempt whose answer was lost
            if i == attempts - 1 or (e.status and e.status < 500 and e.status != 429):
                raise
            time.sleep(1.0)


def run(scales: scenario.Scales, seed: int, workdir: Path, log: Log) -> JSON:
    rng = random.Random(seed)
    started = time.monotonic()
    log(f"starting a {scales.nodes}-node cluster")
    # No Prometheus: the storm reads no node metrics.
    cluster = Cluster(
        workdir / "cluster", nodes=scales.nodes, quiet=True, keep_workdir=True, prometheus=False
    )
    cluster.start()
    stop = threading.Event()
    stack: Stack | None = None
    try:
        faulty = cluster.nodes[: len(scales.fault_modes)]
        for node, mode in zip(faulty, scales.fault_modes, strict=True):
            cluster.set_fault(node, mode)
        kubeconfig = scenario.install_identity(cluster, workdir / "identity")
        namespaces = scenario.create_namespaces(cluster, workdir)
        ledger = Ledger(namespaces)
        watches = start_watches(cluster.rest, ledger, stop)
        deadline = time.monotonic() + 30
        while not all(w.relists for w in watches) and time.monotonic() < deadline:
            time.sleep(0.1)
        log("starting the pipeline (functions, Knative's Broker, ApiServerSource, webhook, sweep)")
        stack = Stack(
            kubeconfig,
            cluster.api_client(),
            workdir / "stack",
            cluster.log_dir,
            settings=LOCAL_FUNCTION_SETTINGS,
            sweep_every=scales.sweep_every,
            # The synchronous channel, not the shipped async-handler: with it, retries of one
            # event overlap the SIGKILLs that other events trigger, and a kill can take an
            # event's last attempt; the dead-letter invariant cannot yet tell that from an
            # injected fault (docs/reliability.md, "Synchronous channel").
            async_handler=False,
        ).start()
        broker = stack.broker
        assert broker is not None
        functions = {name: stack.servers[name].url for name in TRIGGERED_FUNCTIONS}
        wire = data_plane.Faults(scales.data_plane_faults(seed))
        killer = faults.Killer(
            stack, random.Random(rng.random()), scales.kill_on_write, scales.min_uptime
        )
        ledger.on_state_write = killer.on_state_write
        plan = faults.schedule(rng, scales.chaos_s, scales.apiserver_restarts, scales.etcd_restarts)
        workloads = scenario.storm(scales, faulty)

        waves = [workloads[i :: scales.waves] for i in range(scales.waves)]
        every = scales.chaos_s * 0.6 / scales.waves
        log(
            f"storm: {scales.pods} failing pods in {len(workloads)} workloads, in "
            f"{scales.waves} waves {every:.0f}s apart; faults on"
        )
        data_plane.attach(broker, wire, functions)
        t0 = time.monotonic()
        killer.t0, killer.enabled = t0, True
        created = 0
        restarts: list[JSON] = []
        revived: list[JSON] = []
        next_kill = t0 + rng.expovariate(1.0 / scales.random_kill_every)
        target_log = cluster.log_dir / f"{faults.TARGET}.log"
        deadline, extra = t0 + scales.chaos_s, 0
        while True:
            now = time.monotonic()
            if now >= deadline:
                landed = faults.kills_in_window(target_log, killer.kills)["kills_in_window"]
                if landed >= scales.min_kills_in_window or extra >= scales.max_extra_waves:
                    break
                extra += 1
                more = scenario.storm(scales, faulty, generation=extra)[:: scales.waves]
                log(
                    f"  {now - t0:5.1f}s {landed} kills between a state write and its delete "
                    f"so far: one more wave ({len(more)} workloads)"
                )
                for w in more:
                    _create(cluster, w)
                workloads += more
                deadline = now + scales.chaos_s / 2
            if created < len(waves) and now - t0 >= created * every:
                for w in waves[created]:
                    _create(cluster, w)
                created += 1
            if plan and now - t0 >= plan[0][0]:
                _, name = plan.pop(0)
                down = cluster.restart(name, kill=True)
                restarts.append(
                    {"at": round(now - t0, 2), "process": name, "down_s": round(down, 2)}
                )
                log(f"  {now - t0:5.1f}s restarted {name} (SIGKILL), back after {down:.1f}s")
            if now >= next_kill:
                killer.kill("random")
                next_kill = now + rng.expovariate(1.0 / scales.random_kill_every)
            for name in cluster.revive():
                revived.append({"at": round(time.monotonic() - t0, 2), "process": name})
                log(f"  {name} had exited: started again")
            time.sleep(0.2)
        killer.enabled = False
        # Faults off; the forwards keep counting deliveries and Knative's retries.
        wire.stop()
        faults_end = time.monotonic()
        log(
            f"faults off after {faults_end - t0:.0f}s ({len(killer.kills)} kills, "
            f"{len(restarts)} control-plane restarts); waiting for every replica to be healthy"
        )

        healthy_after: float | None = None
        said = time.monotonic()
        while time.monotonic() < faults_end + scales.settle_s:
            for name in cluster.revive():
                revived.append({"at": round(time.monotonic() - t0, 2), "process": name})
            snap = _retrying(lambda: collect(cluster, namespaces, faulty, ledger, stack))
            unhealthy = invariants.replicas_healthy(snap)[0]
            if not unhealthy:
                healthy_after = time.monotonic() - faults_end
                break
            if time.monotonic() - said > 10:
                said = time.monotonic()
                log(f"  not yet: {'; '.join(f'{v.subject}: {v.message}' for v in unhealthy)}")
            time.sleep(2.0)
        log(
            "every replica healthy "
            + (f"{healthy_after:.0f}s after the faults" if healthy_after is not None else "NOT")
        )
        stack.wait_idle(60)
        time.sleep(3.0)  # late replies and sweeps
        stack.wait_idle(60)
        snap = _retrying(lambda: collect(cluster, namespaces, faulty, ledger, stack))
        verdict = invariants.check(snap)
        landed = faults.kills_in_window(cluster.log_dir / f"{faults.TARGET}.log", killer.kills)
        result = _figures(
            workloads, seed, snap, verdict, stack, wire, killer, landed, restarts, revived
        )
        result["storm"]["extra_waves"] = extra
        result["recovery"] = {
            "fault_window_s": round(faults_end - t0, 1),
            "healthy_after_faults_s": round(healthy_after, 1)
            if healthy_after is not None
            else None,
            "runtime_s": round(time.monotonic() - started, 1),
        }
        result["faulty_nodes"] = dict(zip(faulty, scales.fault_modes, strict=True))
        return result
    finally:
        stop.set()
        if stack is not None:
            stack.stop()
        cluster.stop()


def _figures(
    workloads: list[scenario.Workload],
    seed: int,
    snap: invariants.Snapshot,
    verdict: invariants.Verdict,
    stack: Stack,
    wire: data_plane.Faults,
    killer: faults.Killer,
    landed: JSON,
    restarts: list[JSON],
    revived: list[JSON],
) -> JSON:
    archived = stack.archived()
    types = Counter(str(e.get("type")) for e in archived)
    broker = stack.broker.stats() if stack.broker else {}
    chaos = wire.stats()
    events = [o for o in snap.objects if o.get("kind") == "Event"]
    rescheduled = [e for e in events if e.get("reason") == REASON_RESCHEDULED]
    moves = invariants.moves_recorded(snap)
    triggers = Counter(k.trigger for k in killer.kills)
    return {
        "seed": seed,
        "storm": {
            "pods": sum(w.pods for w in workloads),
            "workloads": dict(Counter(w.kind for w in workloads if w.kind != "Pod")),
            "bare_pods": sum(1 for w in workloads if w.kind == "Pod"),
            "pods_seen": len(snap.seen),
            "pods_removed": len(snap.gone),
        },
        "faults": {
            "update_annotations_kills": len(killer.kills),
            "kills_on_state_write": triggers.get("state-write", 0),
            "kills_at_random": triggers.get("random", 0),
            "kills_between_state_write_and_delete": landed["kills_in_window"],
            "moves_cut_by_a_kill": landed["moves_cut"],
            "function_restarts": stack.restarts(),
            "apiserver_restarts": sum(1 for r in restarts if r["process"] == "kube-apiserver"),
            "etcd_restarts": sum(1 for r in restarts if r["process"] == "etcd"),
            "control_plane_restarts": restarts,
            "revived_after_a_restart": revived,
            "data_plane": chaos,
        },
        "events": {
            "routed": broker.get("accepted", 0),
            "pod_events": types.get(APISERVER_ADD, 0) + types.get(APISERVER_UPDATE, 0),
            "failing": types.get(EVENT_POD_FAILING, 0),
            "failing_from_the_sweep": sum(
                1
                for e in archived
                if e.get("type") == EVENT_POD_FAILING
                and str(e.get("source", "")).endswith("sweep-failures")
            ),
            "rescheduled_replies": types.get(EVENT_POD_RESCHEDULED, 0),
            "deliveries": chaos.get("deliveries", 0),
            "retries": chaos.get("retries", 0),
            "dead_lettered": broker.get("dead_lettered", 0),
            "by_type": dict(types),
        },
        "moves": {
            "recorded": moves,
            "rescheduled_events": len(rescheduled),
            "finished_by_a_later_delivery": sum(
                1 for e in rescheduled if FINISHED_LATER in str(e.get("message", ""))
            ),
        },
        "kills": [k.__dict__ for k in killer.kills],
        "kills_in_window": landed["detail"],
        "invariants": verdict.to_json(),
        "violations": len(verdict.violations),
    }
