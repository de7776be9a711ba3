"""Measurements 1-3: time to recovery, moves per recovery, API cost; per system, side by side.

One cluster of ``nodes`` kwok nodes, ``faulty`` of them crash-looping every pod bound to them.
For each system in turn (vanilla, the descheduler at each interval, kn-rescheduler) a fresh
namespace gets ``deployments`` Deployments of ``replicas`` replicas with
``scheduling-retries: "3"``, placed by one of two scenarios:

- ``prefer-faulty`` (the committed one): each Deployment prefers one faulty node (preferred
  node affinity, weight 100), so every pod starts on a faulty node and crash-loops there, and a
  replacement the scheduler places freely goes back to it (the pod's favourite node is the
  broken one: locality, a cached image);
- ``spread``: no node preference at all, the scheduler's default spreading and scoring only;
  only the pods that happen to land on a faulty node fail, and a replacement lands wherever the
  scheduler scores best, so a peer that merely evicts may recover some replicas by chance.

The tracker (``bench.tracker``) records when each replica first failed, when it crossed the
restart threshold (3 restarts, CrashLoopBackOff), each removal, and when a replacement was Ready
on a healthy node. A system gets ``recovery_bound`` seconds from the creation of the workloads.
Times are reported from the first failure (what a user sees) and from the threshold (what the
system adds once a restart-count rule may act); how long the kubelet's restarts take between
the two depends on its back-off: the fake kubelet's compressed clock (a restart every 3 s,
threshold about 7 s after the first failure) or, with ``--kubelet-backoff real``, a real
kubelet's (10 s, 20 s, ...: about 30-45 s; ``localcluster.kubelet.Timing.real``). Each result
names its scenario and back-off, so runs of either can be put side by side
(``python -m dev.bench.report --compare``).

On a cluster of real nodes only (``--real-nodes N``: a kubelet and a containerd each,
``localcluster.realnode``) the faulty nodes get the ``app-crash`` fault instead of the fake
kubelet's ``crashloop``: the Deployments run busybox with ``realnode.NODE_DEPENDENT_APP``, which
exits 1 at start on a faulty node only, so the crash loop, its back-off, the grace period of a
removed pod and the replacement's start are a real kubelet's. The results then say
``"nodes": "real"`` and ``"kubelet_backoff": "real"``. A cluster mixing kwok and real nodes is
refused: a pod placed on a kwok node would "recover" under the fake kubelet whatever it runs.

API requests are counted per client (``bench.common``): the system's own requests (its user's
flow schema) and all requests to the API server, from the system's start to the end of its run.

With the pipeline still running, ``healthy_updates`` annotation patches of healthy, opted-in
pods measure what a healthy pod event costs in API requests beyond the driver's own.
"""

from __future__ import annotations

import gzip
import json
import random
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Final

from dev.bench import descheduler
from dev.bench.common import (
    CORPUS_FILE,
    JSON,
    KN_USER,
    Scales,
    create_namespace,
    delete_namespace,
    delta,
    identity_kubeconfig,
    is_ready,
    list_all,
    ratio,
    scrape,
    summary,
    wait_until,
)
from dev.bench.tracker import Tracker
from dev.localcluster.cluster import Cluster
from dev.localcluster.nodeimages import BUSYBOX_IMAGE
from dev.localcluster.procs import Proc
from dev.localcluster.realnode import NODE_DEPENDENT_APP
from dev.stack.stack import Stack
from shared.api.keys import APISERVER_ADD, APISERVER_UPDATE, POLICY_ANNOTATION

IMAGE = "registry.example.com/shop/web:1.4.2"
# The placement scenarios (see the module docstring); the first is the committed one.
SCENARIOS: Final = ("prefer-faulty", "spread")
# The fault each kind of node (``node_kind``) is broken with: every pod bound to it crash-loops.
FAULTS: Final = {"kwok": "crashloop", "real": "app-crash"}
# A real node's pods end in a real grace period; NODE_DEPENDENT_APP exits at once on SIGTERM.
REAL_GRACE_PERIOD_S: Final = 2


def node_kind(cluster: Cluster) -> str:
    """What every node of ``cluster`` is: "kwok" or "real". A mix is refused (ValueError): a pod
    of the real nodes' app placed on a kwok node would run under the fake kubelet (and recover
    there whatever the fault), and the kwok image cannot be pulled by a real node."""
    if cluster.real_nodes and cluster.kwok_nodes:
        raise ValueError(
            f"recovery needs nodes of one kind; this cluster has kwok nodes {cluster.kwok_nodes} "
            f"and real nodes {cluster.real_nodes}"
        )
    return "real" if cluster.real_nodes else "kwok"


def preferred_node(scenario: str, index: int, faulty: list[str]) -> str | None:
    """The node the ``index``-th Deployment prefers in ``scenario`` (None: no preference)."""
    if scenario == "prefer-faulty":
        return faulty[index % len(faulty)]
    if scenario == "spread":
        return None
    raise ValueError(f"unknown scenario {scenario!r}; known: {SCENARIOS}")


def deployment(
    name: str, replicas: int, prefer: str | None, avoid: list[str], *, real: bool = False
) -> JSON:
    """The workload under test; ``real``: the pods real nodes run (busybox running
    NODE_DEPENDENT_APP, a short grace period) instead of the kwok image."""
    affinity: JSON = {}
    if prefer:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {
                "weight": 100,
                "preference": {
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": [prefer]}]
                },
            }
        ]
    if avoid:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in avoid
                    ]
                }
            ]
        }
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "annotations": {POLICY_ANNOTATION: "3"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "affinity": {"nodeAffinity": affinity} if affinity else {},
                    "containers": [container(real)],
                    "terminationGracePeriodSeconds": REAL_GRACE_PERIOD_S if real else 0,
                },
            },
        },
    }


def container(real: bool) -> JSON:
    if not real:
        return {"name": "app", "image": IMAGE}
    return {
        "name": "app",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": list(NODE_DEPENDENT_APP),
    }


def _identity_stack(
    cluster: Cluster, workdir: Path, settings: Mapping[str, str] | None = None
) -> Stack:
    kubeconfig = identity_kubeconfig(cluster, KN_USER, workdir / "identity")
    return Stack(
        kubeconfig,
        cluster.api_client(),
        workdir,
        workdir / "logs",
        sweep_every=None,
        settings=settings,
    )


class System:
    """One system under test: started before the workloads, stopped after the run."""

    def __init__(self, name: str, user: str | None) -> None:
        self.name = name
        self.user = user

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def idle(self) -> None:
        pass

    def stats(self) -> JSON:
        return {}


class Vanilla(System):
    def __init__(self) -> None:
        super().__init__("vanilla", None)


class Descheduler(System):
    def __init__(self, cluster: Cluster, interval: str, workdir: Path, binary: Path) -> None:
        super().__init__(f"descheduler-{interval}", "bench-descheduler")
        self.cluster, self.interval, self.workdir, self.binary = cluster, interval, workdir, binary
        self.proc: Proc | None = None

    def start(self) -> None:
        self.proc = descheduler.start(self.cluster, self.interval, self.workdir, self.binary)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(grace=5.0)
            if not self.proc.alive() and self.proc.returncode not in (0, -15, None):
                raise RuntimeError(f"descheduler failed:\n{self.proc.log_tail()}")
            self.proc = None


class KnRescheduler(System):
    def __init__(
        self, cluster: Cluster, workdir: Path, settings: Mapping[str, str] | None = None
    ) -> None:
        super().__init__("kn-rescheduler", KN_USER)
        self.cluster, self.workdir, self.settings = cluster, workdir, settings
        self.stack: Stack | None = None

    def start(self) -> None:
        self.stack = _identity_stack(self.cluster, self.workdir, self.settings).start()

    def stop(self) -> None:
        if self.stack is not None:
            self.stack.stop()
            self.stack = None

    def idle(self) -> None:
        if self.stack is not None:
            self.stack.wait_idle(30)

    def stats(self) -> JSON:
        """The Broker's counters for this run: events its archive Trigger received (every
        event the ingress accepted) and dead letters."""
        if self.stack is None or self.stack.broker is None:
            return {}
        return dict(self.stack.broker.stats())


def run_system(
    cluster: Cluster,
    system: System,
    scales: Scales,
    faulty: list[str],
    namespace: str,
    *,
    scenario: str = SCENARIOS[0],
    keep_running: bool = False,
) -> JSON:
    rest = cluster.rest
    real = node_kind(cluster) == "real"
    create_namespace(rest, namespace)
    tracker = Tracker(rest, namespace, set(faulty)).start()
    before = scrape(cluster)
    t_start = time.monotonic()
    system.start()
    expected = scales.deployments * scales.replicas
    try:
        t0 = time.monotonic()
        for i in range(scales.deployments):
            prefer = preferred_node(scenario, i, faulty)
            body = deployment(f"web-{i}", scales.replicas, prefer, [], real=real)
            rest.post(f"/apis/apps/v1/namespaces/{namespace}/deployments", body)
        deadline = t0 + scales.recovery_bound
        settled = False
        while time.monotonic() < deadline:
            if time.monotonic() - t0 > 5 and tracker.settled(expected):
                settled = True
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - t0
        system.idle()
        after = scrape(cluster)
        extra = system.stats()
        window = time.monotonic() - t_start
    finally:
        if not keep_running:
            system.stop()
        tracker.stop()
    result = tracker.result(t0, scales.recovery_bound)
    requests = delta(before, after)
    own = requests.get(f"fs:{system.user}", 0.0) if system.user else 0.0
    moves = result["moves_total"]
    recovered = result["recovered"]
    out: JSON = {
        "system": system.name,
        "replicas": expected,
        "settled": settled,
        "elapsed_s": round(elapsed, 2),
        "affected": result["affected"],
        "recovered": recovered,
        "recovered_share": ratio(recovered, result["affected"]),
        "recovered_within_5min_share": ratio(result["within_5min"], result["affected"]),
        "recovery_from_failure": summary(result["recovery_from_failure_s"]),
        "recovery_from_threshold": summary(result["recovery_from_threshold_s"]),
        # Only the replicas moved once (the first replacement landed on a healthy node).
        "recovery_from_threshold_one_move": summary(result["recovery_from_threshold_one_move_s"]),
        "moves_histogram": {
            str(k): result["moves_per_recovered"].count(k)
            for k in sorted(set(result["moves_per_recovered"]))
        },
        "recovery_from_failure_raw_s": [round(v, 3) for v in result["recovery_from_failure_s"]],
        "first_failure_after_create": summary(result["first_failure_after_create_s"]),
        # The kubelet's restarts from the first failure to the threshold (its back-off).
        "threshold_from_failure": summary(result["threshold_from_failure_s"]),
        "moves_total": moves,
        "wasted_moves": result["wasted_moves"],
        "moves_per_recovery": ratio(result["moves_of_recovered"], recovered),
        "api": {
            "window_s": round(window, 2),
            "system_requests": own,
            "all_requests": requests["total"],
            "all_requests_per_s": round(requests["total"] / window, 2) if window else None,
            "system_requests_per_move": ratio(own, moves),
            "all_requests_per_move": ratio(requests["total"], moves),
            "by_flow_schema": {k[3:]: v for k, v in requests.items() if k.startswith("fs:")},
        },
    }
    if extra:
        out["broker"] = extra
    return out


def healthy_updates(
    cluster: Cluster, stack: Stack, scales: Scales, faulty: list[str], namespace: str
) -> JSON:
    """Annotation patches of healthy opted-in pods, with the pipeline running."""
    rest = cluster.rest
    create_namespace(rest, namespace)
    rest.post(
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        deployment("steady", scales.healthy_pods, None, faulty, real=node_kind(cluster) == "real"),
    )

    def all_ready() -> list[JSON] | None:
        pods = list_all(rest, f"/api/v1/namespaces/{namespace}/pods")
        ok = [p for p in pods if is_ready(p) and not p["metadata"].get("deletionTimestamp")]
        return ok if len(ok) == scales.healthy_pods == len(pods) else None

    pods: list[JSON] = wait_until(all_ready, 120, 0.5, "the steady pods Ready")
    stack.wait_idle(30)
    time.sleep(2)
    stack.wait_idle(30)
    archived_before = len(stack.archived())
    before = scrape(cluster)
    t0 = time.monotonic()
    for i in range(scales.healthy_updates):
        pod = pods[i % len(pods)]["metadata"]["name"]
        rest.patch(
            f"/api/v1/namespaces/{namespace}/pods/{pod}",
            {"metadata": {"annotations": {"bench.kn-rescheduler.io/tick": str(i)}}},
        )
    driving = time.monotonic() - t0
    time.sleep(2)
    stack.wait_idle(60)
    after = scrape(cluster)
    requests = delta(before, after)
    new_events = stack.archived()[archived_before:]
    delivered = [
        e
        for e in new_events
        if e.get("type") == APISERVER_UPDATE and f"/namespaces/{namespace}/" in e.get("subject", "")
    ]
    replies = [e for e in new_events if str(e.get("type", "")).startswith("io.kn-rescheduler.")]
    n = scales.healthy_updates
    own = requests.get(f"fs:{KN_USER}", 0.0)
    beyond_driver = requests["total"] - n
    return {
        "updates": n,
        "driving_s": round(driving, 2),
        "update_events_routed": len(delivered),
        "replies_routed": len(replies),
        "pipeline_requests": own,
        "pipeline_requests_per_1000_updates": round(own * 1000 / n, 3),
        "all_requests_beyond_driver": beyond_driver,
        "all_requests_beyond_driver_per_1000_updates": round(beyond_driver * 1000 / n, 1),
        "by_flow_schema": {k[3:]: v for k, v in requests.items() if k.startswith("fs:")},
    }


def save_corpus(stack: Stack, path: Path = CORPUS_FILE, limit: int = 400) -> int:
    """Real ApiServerSource pod events from the archive, kept as a small gzip corpus.

    Failing pods are kept in their natural share of the archive (capped at a quarter)."""
    events = [e for e in stack.archived() if e.get("type") in (APISERVER_ADD, APISERVER_UPDATE)]
    if not events:
        return 0
    random.Random(6).shuffle(events)
    chosen = events[:limit]
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for e in chosen:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
    return len(chosen)


def system_names(scales: Scales) -> list[str]:
    """The systems a recovery run measures, in the order they run (``--systems`` takes these)."""
    return [
        "vanilla",
        *(f"descheduler-{interval}" for interval in scales.descheduler_intervals),
        "kn-rescheduler",
    ]


def measure(
    cluster: Cluster,
    scales: Scales,
    workdir: Path,
    *,
    save_events: bool,
    log: Callable[[str], None],
    only: Collection[str] | None = None,
    scenario: str = SCENARIOS[0],
    settings: Mapping[str, str] | None = None,
) -> JSON:
    """Every system of ``system_names`` in turn, or only those named in ``only``, on
    ``scenario``, with the back-off of ``cluster``'s fake kubelet, or on its real nodes (a
    cluster of real nodes only: ``node_kind``) with a real kubelet's.

    A subset runs on the same scenario as a full run, in the same order; its figures are
    comparable with the full run's, but the systems left out did not share its cluster's
    moment (load, warm caches)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {SCENARIOS}")
    nodes = node_kind(cluster)
    if scales.faulty >= len(cluster.nodes):
        raise ValueError(
            f"{scales.faulty} faulty nodes of {len(cluster.nodes)} leave no healthy node"
        )
    wanted = set(system_names(scales) if only is None else only)
    unknown = wanted - set(system_names(scales))
    if unknown:
        raise ValueError(f"unknown systems {sorted(unknown)}; known: {system_names(scales)}")
    faulty = cluster.nodes[: scales.faulty]
    for node in faulty:
        cluster.set_fault(node, FAULTS[nodes])
    # Built (or found) only when a descheduler runs: a first build takes minutes.
    intervals = [i for i in scales.descheduler_intervals if f"descheduler-{i}" in wanted]
    binary = descheduler.binary() if intervals else None
    systems: list[System] = [Vanilla()]
    if binary is not None:
        systems += [
            Descheduler(cluster, interval, workdir / f"descheduler-{interval}", binary)
            for interval in intervals
        ]
    kn = KnRescheduler(cluster, workdir / "kn-rescheduler", settings)
    systems.append(kn)
    runs: dict[str, Any] = {}
    healthy: JSON = {}
    corpus = 0
    for system in systems:
        if system.name not in wanted:
            continue
        # The same namespace as in a full run, whichever systems run.
        namespace = f"bench-recovery-{system_names(scales).index(system.name)}"
        log(
            f"recovery: {system.name} ({scales.deployments}x{scales.replicas} replicas, "
            f"{scenario}, {kubelet_backoff(cluster)} back-off, {nodes} nodes)"
        )
        if system is kn:
            # The pipeline stays up after its run for the healthy-update measurement.
            try:
                runs[system.name] = run_system(
                    cluster, system, scales, faulty, namespace, scenario=scenario, keep_running=True
                )
                assert kn.stack is not None
                log("api cost: healthy pod updates with the pipeline running")
                healthy = healthy_updates(cluster, kn.stack, scales, faulty, "bench-healthy")
                if save_events:
                    corpus = save_corpus(kn.stack)
            finally:
                kn.stop()
            delete_namespace(cluster.rest, "bench-healthy")
        else:
            runs[system.name] = run_system(
                cluster, system, scales, faulty, namespace, scenario=scenario
            )
        r = runs[system.name]
        log(
            f"  {system.name}: recovered {r['recovered']}/{r['affected']}, "
            f"p50 {r['recovery_from_failure']['p50']} s, moves {r['moves_total']}"
        )
        delete_namespace(cluster.rest, namespace)
    for node in faulty:
        cluster.set_fault(node, None)
    out: JSON = {
        "scenario": scenario,
        "kubelet_backoff": kubelet_backoff(cluster),
        "nodes": nodes,
        "node_count": len(cluster.nodes),
        "descheduler_version": descheduler.version(),
        "descheduler_policy": descheduler.policy(),
        "faulty_nodes": faulty,
        "systems": runs,
        "healthy_updates": healthy,
        "corpus_events_saved": corpus,
    }
    if only is not None:
        out["only_systems"] = [n for n in system_names(scales) if n in wanted]
    return out


def kubelet_backoff(cluster: Cluster) -> str:
    """The kubelet's restart clock, as the results name it: "compressed" or "real" (the fake
    kubelet's real-like clock, or real nodes' own kubelets)."""
    if node_kind(cluster) == "real":
        return "real"
    return "real" if cluster.timing.backoff == "kubelet" else "compressed"


def plot_cdf(result: JSON, path: Path) -> None:
    import matplotlib  # noqa: PLC0415 - only the runner plots; importing it costs a second

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=90)
    bound = 0.0
    peer_styles = iter(["--", ":", "-.", (0, (5, 1, 1, 1))])
    for name, run in result["systems"].items():
        affected = max(run["affected"], 1)
        values = sorted(run["recovery_from_failure_raw_s"])
        bound = max(bound, run["elapsed_s"])
        xs = [0.0]
        ys = [0.0]
        for i, v in enumerate(values, 1):
            xs += [v, v]
            ys += [ys[-1], i / affected]
        xs.append(max(run["elapsed_s"], values[-1] if values else 0.0))
        ys.append(ys[-1])
        ax.plot(
            xs,
            ys,
            linestyle="-" if name == "kn-rescheduler" else next(peer_styles),
            linewidth=2.2 if name == "kn-rescheduler" else 1.6,
            label=f"{name} ({run['recovered']}/{run['affected']} in {run['elapsed_s']:.0f} s)",
        )
    ax.set_xlabel("seconds from a replica's first failure to a Ready replacement on a healthy node")
    ax.set_ylabel("share of replicas recovered")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(0, max(bound, 10.0))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    variant = ""
    if "scenario" in result:
        variant = f": {result['scenario']}, {result['kubelet_backoff']} kubelet back-off"
        if result.get("nodes") == "real":
            variant += ", real nodes"
    ax.set_title(f"Time to recovery (CDF){variant}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
