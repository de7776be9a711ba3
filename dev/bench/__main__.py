"""``python -m dev.bench [--quick] [--only NAME ...] [--systems SYSTEM ...] [--scenario NAME]
[--kubelet-backoff compressed|real] [--real-nodes N] [--out DIR]``: run the benchmarks.

Measurements, in the order they run (``--only`` takes these names):

- ``recovery``: time to recovery, moves per recovery and API cost, per system (vanilla, the
  descheduler, kn-rescheduler), plus API cost of healthy pod updates;
- ``detect``: detect-failures throughput, in-process (one core) and over HTTP;
- ``webhook``: mutate-admission latency in-process and over TLS; pod-creation latency with and
  without the webhook registered;
- ``cold-start``: process start to first answered event, per function;
- ``load``: load-aware placement and rebalancing: a burst of pods with heterogeneous simulated
  usage, per system (the stock scheduler, the descheduler's LowNodeUtilization on Prometheus,
  score-nodes as an extender and the load labels, each without and with rebalance-nodes): max
  node CPU usage, its spread, nodes over 80 %, evictions, time until every node is under 80 %;
- ``scale``: many nodes and pods, 2% of the nodes turning faulty at once.

Only when named with ``--only``:

- ``admission``: the same 1,000 pod creates with no admission of ours, the webhook and the
  MutatingAdmissionPolicies, side by side (``bench.admission``).
- ``source-selector``: events and CPU per 1,000 pod changes with 10 % of the pods opted in,
  the ApiServerSource without and with its label selector, side by side.
- ``extender``: score-nodes' latency per scheduler call (filter, prioritize) with 20, 100, 240
  and 1,000 nodes, p50 and p99, over HTTP to the function as it ships, side by side: node
  names looked up in its node cache (a local control plane holding 1,000 Nodes) and whole Node
  objects in the request.
- ``throughput``: scheduling throughput (pods/s) of the cluster's scheduler, the second
  scheduler calling score-nodes with node names (the shipped configuration) and with whole
  Node objects, and the same without the extender (``bench.throughput``).
- ``broker``: event latency through Knative's Broker data plane (ingress hop, adapter to
  subscriber) p50/p99, and what one failing subscriber does to the next event, with the
  channel's ``async-handler`` false and true (``bench.broker``).
- ``images``: the functions' image sizes (OCI archive, unpacked) and the cold start of a
  function in its container (podman, as its Service runs it) beside the bare process
  (``bench.images``; builds the image it needs, needs the tools of hack/install-packages.sh).

``--systems`` (with ``--only recovery``) measures recovery for only these systems (vanilla,
descheduler-2m, descheduler-10s, kn-rescheduler), on the same scenario: re-measuring
kn-rescheduler alone takes 3-5 minutes, the whole recovery run about 18, since vanilla and the
descheduler never recover and each wait out the 300 s bound.

``--scenario spread`` (with ``--only recovery``) places the recovery workloads with no node
preference (``bench.recovery``: the committed scenario, ``prefer-faulty``, points every
Deployment at a faulty node). ``--kubelet-backoff real`` (with ``--only``) gives every cluster of
the run a real kubelet's crash-loop back-off (10 s, 20 s, 40 s ... up to 5 min) instead of the
fake kubelet's restart every 3 s: the restart threshold then comes 30-45 s after the first
failure instead of about 7 s. Both are recorded in the results and name the results file.

``--real-nodes N`` (with ``--only recovery`` alone; needs root and the tools of
hack/install-packages.sh) measures recovery on a cluster of N real nodes (a kubelet and a
containerd each, ``localcluster.realnode``) and no kwok node: a third of them (at least one) get
the ``app-crash`` fault, and the Deployments (two per faulty node, two replicas each: what two
cores hold beside the control plane, ``real_node_scales``) run busybox with
``realnode.NODE_DEPENDENT_APP``, a real crash loop on a faulty node only. The back-off is then a
real kubelet's (the results say ``"nodes": "real"``, ``"kubelet_backoff": "real"``), the
recovery window at least ``REAL_BACKOFF_MIN_BOUND``, and the results file is named
``-<N>-real-nodes``. No kwok node: a pod placed on one would "recover" under the fake kubelet.

The first five share one cluster of ``Scales.nodes`` nodes; ``scale`` and ``source-selector``
start their own. The results go to ``DIR/<date>.json`` (``DIR/<date>-<names>.json`` with
``--only``, ``DIR/<date>-<names>-<systems>.json`` with ``--systems``; ``dev/bench/results`` unless
quick: a quick run writes to a temporary directory unless ``--out`` is given), the plots beside
it. A partial run (``--only``) never overwrites a file: a second one the same day is
``...-2.json``, and so on; a non-default scenario, back-off or real nodes add ``-spread``,
``-real-backoff`` or ``-<N>-real-nodes`` to the name. A full run rewrites
``dev/bench/RESULTS.md`` (keeping the source-selector section); a source-selector run that is
not quick rewrites that section; no other partial run touches it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dev.bench import (
    admission,
    broker,
    coldstart,
    detect,
    extender,
    images,
    loadaware,
    recovery,
    report,
    scale,
    selector,
    throughput,
    webhook,
)
from dev.bench.common import (
    FULL,
    JSON,
    QUICK,
    RESULTS_DIR,
    ROOT,
    Scales,
    code_version,
    machine,
    scales_dict,
    write_json,
)
from dev.localcluster import realnode
from dev.localcluster.cluster import Cluster
from dev.localcluster.kubelet import Timing

NAMES = ("recovery", "detect", "webhook", "cold-start", "load", "scale")
# Run only when named with --only.
EXTRA_NAMES = ("admission", "source-selector", "extender", "throughput", "broker", "images")
# The fake kubelet's restart clocks (--kubelet-backoff); the first is the default.
BACKOFFS = ("compressed", "real")
# The shortest recovery window with a real kubelet's back-off (seconds).
REAL_BACKOFF_MIN_BOUND = 150.0
# --real-nodes: at least one faulty node and one healthy one.
REAL_NODES_MIN = 2


def real_node_scales(scales: Scales, real_nodes: int) -> Scales:
    """``scales`` for a recovery run on ``real_nodes`` real nodes (``--real-nodes``).

    A third of the nodes are faulty (at least one, never all), two Deployments of two replicas
    per faulty node (4 busybox pods on 3 nodes: a real node costs about 140 MiB and a share of
    two cores, the control plane and the pipeline run beside them), 4 steady pods for the
    healthy-update cost; the window is at least REAL_BACKOFF_MIN_BOUND (a real kubelet reaches
    the restart threshold 30-45 s after the first failure)."""
    if real_nodes < REAL_NODES_MIN:
        raise ValueError(f"{real_nodes} real nodes: at least {REAL_NODES_MIN} needed")
    faulty = min(max(1, real_nodes // 3), real_nodes - 1)
    return dataclasses.replace(
        scales,
        nodes=real_nodes,
        faulty=faulty,
        deployments=2 * faulty,
        replicas=2,
        healthy_pods=4,
        recovery_bound=max(scales.recovery_bound, REAL_BACKOFF_MIN_BOUND),
    )


def variant_of(scenario: str, backoff: str, real_nodes: int) -> list[str]:
    """What a partial run measured beside the committed scenario and clock on kwok nodes, as
    its results file names it (real nodes imply a real kubelet's back-off: not named twice)."""
    return [
        *([scenario] if scenario != recovery.SCENARIOS[0] else []),
        *([f"{backoff}-backoff"] if backoff != BACKOFFS[0] and not real_nodes else []),
        *([f"{real_nodes}-real-nodes"] if real_nodes else []),
    ]


def timing(backoff: str) -> Timing:
    """The fake kubelet's timing for ``--kubelet-backoff``."""
    if backoff not in BACKOFFS:
        raise ValueError(f"unknown back-off {backoff!r}; known: {BACKOFFS}")
    return Timing.real() if backoff == "real" else Timing()


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Run:
    """One benchmark run: its scales, work directory and the shared cluster (started lazily)."""

    def __init__(
        self,
        scales: Scales,
        workdir: Path,
        out: Path,
        quick: bool,
        timing: Timing | None = None,
        real_nodes: int = 0,
    ) -> None:
        self.scales = scales
        self.workdir = workdir
        self.out = out
        self.quick = quick
        self.timing = timing or Timing()
        # --real-nodes: the shared cluster's nodes are that many real ones and no kwok node
        # (only recovery runs on it; it needs no Prometheus).
        self.real_nodes = real_nodes
        self._cluster: Cluster | None = None

    def cluster(self) -> Cluster:
        if self._cluster is None:
            if self.real_nodes:
                _log(f"starting a cluster of {self.real_nodes} real nodes")
                self._cluster = Cluster(
                    self.workdir / "cluster",
                    nodes=0,
                    real_nodes=self.real_nodes,
                    timing=self.timing,
                    prometheus=False,
                    quiet=True,
                    keep_workdir=True,
                ).start()
                return self._cluster
            _log(f"starting a {self.scales.nodes}-node cluster")
            self._cluster = Cluster(
                self.workdir / "cluster",
                nodes=self.scales.nodes,
                timing=self.timing,
                quiet=True,
                keep_workdir=True,
            ).start()
        return self._cluster

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.stop()
            self._cluster = None


def results_name(
    out: Path,
    day: str,
    names: list[str],
    only: list[str] | None,
    systems: list[str] | None,
    quick: bool,
    variant: list[str] | None = None,
) -> str:
    """The results file's name in ``out``, without ``.json``.

    A full run is the day's (a second one replaces it, as it replaces RESULTS.md). A partial run
    must not overwrite the full run of the same day, nor an earlier partial run: it names what
    it measured (and ``variant``: its non-default scenario or back-off) and takes the first
    number not yet used."""
    base = day
    if only:
        base += "-" + "-".join(names)
    if variant:
        base += "-" + "-".join(variant)
    if systems:
        base += "-" + "-".join(systems)
    suffix = "-quick" if quick else ""
    if not only:
        return base + suffix
    name, n = base + suffix, 1
    while (out / f"{name}.json").exists():
        n += 1
        name = f"{base}-{n}{suffix}"
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dev.bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI)")
    parser.add_argument(
        "--only", action="append", choices=NAMES + EXTRA_NAMES, help="run only this (repeatable)"
    )
    parser.add_argument(
        "--systems",
        action="append",
        metavar="SYSTEM",
        help="with --only recovery: only these systems (repeatable or comma-separated; "
        "default all)",
    )
    parser.add_argument(
        "--scenario",
        choices=recovery.SCENARIOS,
        default=recovery.SCENARIOS[0],
        help="with --only recovery: where the workloads prefer to run (default: each prefers "
        "a faulty node; spread: no preference)",
    )
    parser.add_argument(
        "--kubelet-backoff",
        choices=BACKOFFS,
        default=BACKOFFS[0],
        help="with --only: the fake kubelet restarts crash-looping containers every 3 s "
        "(compressed, the default) or after a real kubelet's back-off, 10 s doubling to 5 min",
    )
    parser.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        metavar="N",
        help="with --only recovery alone: measure on N real nodes (kubelet + containerd, no "
        "kwok node; a third of them crash the app), with a real kubelet's back-off; needs root",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --only scale or --only recovery: a setting of the functions, as a line of "
        "knative/config.env (e.g. KN_RESCHEDULER_FAILING_AFFINITY_WEIGHT=0; repeatable)",
    )
    parser.add_argument(
        "--scale-size",
        metavar="NODES,PODS,FAULTY",
        help="with --only scale: another size than the full run's 240 nodes, 4,800 pods and "
        "2 %% of the nodes faulty (e.g. 60,1200,5)",
    )
    parser.add_argument("--out", type=Path, help="where results and plots go")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    settings: dict[str, str] = {}
    for given in args.set:
        key, sep, value = given.partition("=")
        if not sep or not key.startswith("KN_RESCHEDULER_"):
            parser.error(f"--set {given!r}: expected KN_RESCHEDULER_<SETTING>=<value>")
        settings[key] = value
    if settings and set(args.only or ()) not in ({"scale"}, {"recovery"}):
        parser.error(
            "--set needs --only scale or --only recovery (a full run measures the shipped settings)"
        )
    scales = QUICK if args.quick else FULL
    if args.scale_size:
        if set(args.only or ()) != {"scale"}:
            parser.error("--scale-size needs --only scale")
        try:
            nodes, pods, faulty = (int(x) for x in args.scale_size.split(","))
        except ValueError:
            parser.error(f"--scale-size {args.scale_size!r}: expected NODES,PODS,FAULTY")
        if not 0 < faulty < nodes <= pods:
            parser.error(f"--scale-size {args.scale_size!r}: needs 0 < FAULTY < NODES <= PODS")
        # The rollout runs at about 18 pods a second on two cores (240 nodes, 2026-11-28):
        # 10,000 pods need more than the default budget before the fault is even injected.
        scales = dataclasses.replace(
            scales,
            scale_nodes=nodes,
            scale_pods=pods,
            scale_faulty_share=faulty / nodes,
            scale_budget=max(scales.scale_budget, 300.0 + pods * 0.12),
        )
    names = [n for n in NAMES + EXTRA_NAMES if (n in args.only if args.only else n in NAMES)]
    systems: list[str] | None = None
    if args.systems:
        if not args.only or "recovery" not in args.only:
            parser.error("--systems needs --only recovery (a full run measures every system)")
        given = {s for value in args.systems for s in value.split(",") if s}
        known = recovery.system_names(scales)
        if given - set(known):
            parser.error(f"--systems: unknown {sorted(given - set(known))}; known: {known}")
        systems = [s for s in known if s in given]
    # A full run rewrites RESULTS.md, whose figures are the committed scenario's.
    if args.scenario != recovery.SCENARIOS[0] and (not args.only or "recovery" not in args.only):
        parser.error("--scenario needs --only recovery (a full run measures the committed one)")
    if args.kubelet_backoff != BACKOFFS[0] and not args.only:
        parser.error("--kubelet-backoff needs --only (a full run measures the committed clock)")
    if args.real_nodes:
        if set(args.only or ()) != {"recovery"}:
            parser.error("--real-nodes needs --only recovery alone (the rest runs on kwok nodes)")
        if args.real_nodes < REAL_NODES_MIN:
            parser.error(
                f"--real-nodes {args.real_nodes}: at least {REAL_NODES_MIN} (a faulty node and a "
                "healthy one)"
            )
        missing = realnode.missing_tools()
        if missing:
            parser.error(
                f"--real-nodes needs {', '.join(missing)} (hack/install-packages.sh, as root)"
            )
        if os.geteuid() != 0:
            parser.error("--real-nodes needs root (a kubelet and a containerd per node)")
        scales = real_node_scales(scales, args.real_nodes)
    # Real nodes' kubelets back off as kubelets do, whatever the fake kubelet's clock.
    backoff = "real" if args.real_nodes else args.kubelet_backoff
    if backoff == "real":
        # The restart threshold alone comes 30-45 s after the first failure, and a wasted move
        # costs as much again: the quick window (45 s) would end before the first move.
        scales = dataclasses.replace(
            scales, recovery_bound=max(scales.recovery_bound, REAL_BACKOFF_MIN_BOUND)
        )
    variant = variant_of(args.scenario, backoff, args.real_nodes)
    if args.scale_size:
        variant.append(f"{scales.scale_nodes}-nodes")
    variant += [
        f"{key.removeprefix('KN_RESCHEDULER_').lower().replace('_', '-')}-{value}"
        for key, value in sorted(settings.items())
    ]
    out: Path = args.out or (
        Path(tempfile.mkdtemp(prefix="kn-rescheduler-bench-quick-")) if args.quick else RESULTS_DIR
    )
    workdir = Path(tempfile.mkdtemp(prefix="kn-rescheduler-bench-"))
    started = time.monotonic()
    stamp = datetime.datetime.now(datetime.UTC)
    results: JSON = {
        "date": stamp.isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": machine(),
        "code": code_version(),
        "scales": scales_dict(scales),
        "kubelet_backoff": backoff,
        "settings": settings,
        "nodes": "real" if args.real_nodes else "kwok",
        "measurements": {},
        "errors": {},
    }
    run = Run(scales, workdir, out, args.quick, timing(backoff), real_nodes=args.real_nodes)
    steps: dict[str, Callable[[], Any]] = {
        # A subset of systems, another scenario or another clock keeps the full run's event
        # corpus (dev/bench/corpus): detect's input.
        "recovery": lambda: recovery.measure(
            run.cluster(),
            scales,
            workdir / "recovery",
            save_events=not args.quick and systems is None and not variant,
            log=_log,
            only=systems,
            scenario=args.scenario,
            settings=settings,
        ),
        "detect": lambda: detect.measure(scales, workdir / "detect", log=_log),
        "webhook": lambda: webhook.measure(run.cluster(), scales, workdir / "webhook", log=_log),
        "cold-start": lambda: coldstart.measure(run.cluster(), scales, workdir / "cold", log=_log),
        "load": lambda: loadaware.measure(
            run.cluster(), workdir / "load", quick=args.quick, log=_log
        ),
        "scale": lambda: scale.measure(
            scales,
            workdir / "scale",
            log=_log,
            before=run.close,
            timing=run.timing,
            settings=settings,
        ),
        "admission": lambda: admission.measure(
            run.cluster(), workdir / "admission", quick=args.quick, log=_log
        ),
        "source-selector": lambda: selector.measure(scales, workdir / "selector", log=_log),
        "extender": lambda: extender.measure(workdir / "extender", quick=args.quick, log=_log),
        "broker": lambda: broker.measure(workdir / "broker", quick=args.quick, log=_log),
        "images": lambda: images.measure(workdir / "images", quick=args.quick, log=_log),
        "throughput": lambda: throughput.measure(
            workdir / "throughput", quick=args.quick, log=_log
        ),
    }
    try:
        for name in names:
            t = time.monotonic()
            _log(f"== {name}")
            try:
                results["measurements"][name] = steps[name]()
            except Exception as exc:
                traceback.print_exc()
                results["errors"][name] = f"{type(exc).__name__}: {exc}"
            results.setdefault("durations_s", {})[name] = round(time.monotonic() - t, 1)
    finally:
        run.close()
    results["runtime_s"] = round(time.monotonic() - started, 1)
    name = results_name(
        out, stamp.strftime("%Y-%m-%d"), names, args.only, systems, args.quick, variant
    )
    path = out / f"{name}.json"
    write_json(path, results)
    if "recovery" in results["measurements"]:
        recovery.plot_cdf(results["measurements"]["recovery"], out / f"{name}-recovery-cdf.png")
    results_md = ROOT / "dev" / "bench" / "RESULTS.md"
    if not args.quick and not args.only:
        report.write(results, path, results_md)
    if not args.quick and "admission" in results["measurements"]:
        admission.write_section(results, path, results_md)
    if not args.quick and "source-selector" in results["measurements"]:
        selector.write_section(results, path, results_md)
    _log(f"results: {path} ({results['runtime_s']} s)")
    if args.keep:
        _log(f"work directory kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
