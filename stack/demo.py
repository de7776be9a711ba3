"""``make demo`` / ``python -m stack.demo``: watch kn-rescheduler move pods off bad nodes.

By default it starts everything itself: a local control plane with six kwok nodes, three of
them faulty (a crash-looping runtime, an OOM-killing node, a broken image mirror), and the whole
pipeline (Knative's ApiServerSource adapter, the Broker stand-in with the Triggers of knative/,
detect-failures, update-annotations, the mutate-admission webhook over TLS). It then creates a
Deployment, a StatefulSet and a Job that opt in with ``scheduling-retries: "3"`` and prefer the
faulty nodes, narrates what happens as it happens, and ends with a summary table and a
timeline chart. Exit status 0 means every workload ended healthy on a good node.

``--existing`` runs the same story against the cluster in $KUBECONFIG, where the functions are
already deployed (for instance the one ``make up`` starts). See docs/demo.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, Final, TextIO

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from localcluster import FAULT_MODES, Cluster, Timing
from localcluster.bins import ensure_bins
from pipeline.source import adapter_binary
from shared.constants import PREFIX, SIM_FAULT_LABEL, STATE_ANNOTATION
from shared.platform.config import Config
from shared.platform.kube import Kube, KubeError, NotFound
from shared.rescheduling.policy import OwnerKind, Policy, parse_retries
from shared.rescheduling.state import StateError, load_state
from stack import demo_chart
from stack.demo_feeds import ApiFeed, ArchiveFeed, Feed
from stack.demo_model import (
    APP_LABEL,
    HEALTHY,
    NAMESPACE,
    Lineage,
    Note,
    Timeline,
    Workload,
    is_ready,
    manifest,
    node_of,
    phase,
)
from stack.functions import ROOT
from stack.stack import Stack

JSON = dict[str, Any]

NODES: Final = 6
# node-1's container runtime crashes every container, node-3 OOM-kills them, node-5's image
# mirror is down. The even nodes are fine.
DEFAULT_FAULTS: Final = {"node-1": "crashloop", "node-3": "oom", "node-5": "imagepull"}
# The fake kubelet's defaults (localcluster.Timing), spelled out because the output says them.
TIMING: Final = Timing(
    start=0.5,
    first_restart=0.5,
    restart_interval=3.0,
    pull_backoff=2.0,
    evict_after=2.0,
    job_runtime=2.0,
)
RETRIES: Final = 3
TIMEOUT: Final = 150.0
POLL: Final = 0.2
# The PingSource's period: the sweep is the safety net for events the source missed.
SWEEP_EVERY: Final = 30.0
BOLD: Final = "\033[1m"
# On the namespace the demo makes, so that it never deletes one it did not make.
DEMO_LABEL: Final = PREFIX + "demo"


# -- output -------------------------------------------------------------------------------------

_STYLES: Final = {
    "scheduled": ("", "·"),
    "failing": ("\033[31m", "✗"),
    "moved": ("\033[33m", "↪"),
    "cleared": ("\033[33m", "↺"),
    "exhausted": ("\033[1;31m", "!"),
    "ready": ("\033[32m", "✓"),
    "succeeded": ("\033[32m", "✓"),
    "healthy": ("\033[1;32m", "✔"),
    "info": ("", " "),
    "step": ("\033[1m", "▸"),
    "warn": ("\033[1;31m", "!"),
}
_ASCII: Final = {"·": ".", "✗": "x", "↪": ">", "↺": "~", "✓": "+", "✔": "+", "▸": ">", "→": "->"}


class Console:
    """Plain lines with the time since the demo started; colour only on a terminal."""

    def __init__(self, t0: float, stream: TextIO | None = None, color: bool | None = None):
        self.t0 = t0
        self.stream = stream or sys.stdout
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.color = tty and not os.environ.get("NO_COLOR") if color is None else color
        encoding = (getattr(self.stream, "encoding", None) or "").lower().replace("-", "")
        self.unicode = encoding.startswith("utf")
        self.width = 22

    def _text(self, text: str) -> str:
        if self.unicode:
            return text
        for fancy, plain in _ASCII.items():
            text = text.replace(fancy, plain)
        return text

    def _write(self, line: str) -> None:
        self.stream.write(self._text(line) + "\n")
        self.stream.flush()

    def stamp(self, t: float | None = None) -> str:
        t = time.time() - self.t0 if t is None else t
        return f"[{t:6.1f}s]"

    def say(self, text: str, kind: str = "info", t: float | None = None) -> None:
        color, mark = _STYLES.get(kind, _STYLES["info"])
        line = f"{self.stamp(t)} {mark} {text}"
        self._write(self._paint(line, color))

    def note(self, note: Note) -> None:
        color, mark = _STYLES.get(note.kind, _STYLES["info"])
        by = f"  [{note.source}]" if note.source else ""
        body = f"{note.subject:<{self.width}} {mark} {note.text}"
        line = f"{self.stamp(note.t)} {self._paint(body, color)}"
        self._write(line + (self._paint(by, "\033[2m") if by else ""))

    def plain(self, text: str = "", color: str = "") -> None:
        self._write(self._paint(text, color))

    def _paint(self, text: str, color: str) -> str:
        return f"{color}{text}\033[0m" if self.color and color else text


# -- the story ----------------------------------------------------------------------------------


def plan_workloads(faulty: Sequence[str], healthy: Sequence[str]) -> list[Workload]:
    """Who prefers which faulty node, so that each kind of owner meets a different fault.

    The Deployment prefers the first faulty node and, less, the second: once it is kept off the
    first, the scheduler still picks a bad one, and the exclusions grow. The StatefulSet prefers
    the third: each of its pods fails there in turn, since its exclusions are kept per pod.

    The Job prefers the second and may only run on a node pool of that node and two healthy
    ones. A Job's controller waits 10s, 20s, 40s ... before it replaces a failed pod, and an
    emptied bad node is the emptiest node there is: without the pool the Job would try every
    bad node in turn and the demo would mostly show the Job controller's back-off.
    """
    f = list(faulty)

    def pick(i: int) -> str | None:
        return f[i] if i < len(f) else (f[0] if f else None)

    def prefs(*nodes: str | None) -> tuple[tuple[str, int], ...]:
        out: list[tuple[str, int]] = []
        for node, weight in zip(nodes, (100, 50), strict=False):
            if node and node not in (n for n, _ in out):
                out.append((node, weight))
        return tuple(out)

    job_node = pick(1)
    good = list(healthy[1:3]) if len(healthy) > 2 else list(healthy)
    pool = tuple(sorted({*good, *([job_node] if job_node else [])}))
    return [
        Workload("Deployment", "web", 3, prefs(pick(0), pick(1))),
        Workload("StatefulSet", "db", 2, prefs(pick(2))),
        Workload("Job", "report", 1, prefs(job_node), pool=pool),
    ]


@dataclass
class Health:
    ok: bool
    detail: str


def _live_pods(kube: Kube, w: Workload) -> list[JSON]:
    page = kube.list_page("Pod", NAMESPACE, label_selector=f"{APP_LABEL}={w.name}")
    return [p for p in page.get("items") or [] if not p["metadata"].get("deletionTimestamp")]


def health(kube: Kube, w: Workload, bad: set[str], *, job_must_complete: bool) -> Health:
    """Is ``w`` healthy on good nodes, as the API server sees it now?"""
    pods = _live_pods(kube, w)
    good = sorted(
        (p for p in pods if is_ready(p) and node_of(p) not in bad),
        key=lambda p: str(p["metadata"]["name"]),
    )
    where = ", ".join(sorted(str(node_of(p)) for p in good))
    if w.kind == "Deployment":
        ok = len(good) == w.replicas == len(pods)
        return Health(ok, f"{len(good)}/{w.replicas} Ready on good nodes ({where or 'none yet'})")
    if w.kind == "StatefulSet":
        want = {f"{w.name}-{i}" for i in range(w.replicas)}
        have = {str(p["metadata"]["name"]) for p in good}
        ok = want <= have
        return Health(
            ok, f"{len(have & want)}/{w.replicas} Ready on good nodes ({where or 'none'})"
        )
    job = kube.request("GET", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{w.name}")
    if int((job.get("status") or {}).get("succeeded") or 0) >= 1:
        done = sorted(str(node_of(p)) for p in pods if phase(p) == "Succeeded")
        return Health(True, "complete" + (f": its pod succeeded on {done[0]}" if done else ""))
    if good and not job_must_complete:
        return Health(True, f"running: {where}")
    return Health(False, f"not complete ({where or 'no pod Ready on a good node'})")


@dataclass
class Row:
    workload: str
    replica: str
    pod: str
    nodes: list[str]
    # Whether the pod on each of those nodes failed there.
    failed: list[bool]
    final_node: str | None
    final_node_faulty: bool
    moves: int
    workload_moves: int
    budget: int
    budget_scope: str
    recovered_seconds: float | None
    ended: str


@dataclass
class Outcome:
    ok: bool
    problems: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    elapsed_seconds: float = 0.0
    story_seconds: float | None = None


def _state_moves(kube: Kube, w: Workload, lineage: Lineage) -> tuple[int, int, str]:
    """(moves used, budget, scope) from the state update-annotations wrote."""
    retries = parse_retries(str(RETRIES))
    assert isinstance(retries, int)
    try:
        if w.kind == "Deployment":
            holders = kube.list_page(
                "ReplicaSet", NAMESPACE, label_selector=f"{APP_LABEL}={w.name}"
            )
            states = [
                load_state((h["metadata"].get("annotations") or {}).get(STATE_ANNOTATION))
                for h in holders.get("items") or []
            ]
            budget = Policy(retries, OwnerKind.REPLICA_SET, w.replicas).budget
            return sum(s.moves for s in states), budget, "shared by the ReplicaSet"
        holder = kube.get(w.kind, NAMESPACE, w.name)
        state = load_state((holder["metadata"].get("annotations") or {}).get(STATE_ANNOTATION))
    except (KubeError, StateError):
        return 0, 0, "unknown"
    if w.kind == "StatefulSet":
        budget = Policy(retries, OwnerKind.STATEFUL_SET).budget
        return state.entry(lineage.current.name).moves, budget, "this pod's own"
    return state.moves, Policy(retries, OwnerKind.JOB).budget, "the Job's"


def _tried(lineage: Lineage) -> list[tuple[str, bool]]:
    """(node, failed there) for the pods of the replica that failed, and its last pod. A pod
    that went without failing (not our doing, see Timeline.on_pod_gone) was no try."""
    last = lineage.current
    return [
        (p.node, p.failing is not None)
        for p in lineage.pods
        if p.node and (p.failing is not None or p is last)
    ]


def summarize(kube: Kube, timeline: Timeline, workloads: Sequence[Workload]) -> list[Row]:
    bad = timeline.bad_nodes()
    rows: list[Row] = []
    for w in workloads:
        for lineage in timeline.lineages_of(w):
            last = lineage.current
            used, budget, scope = _state_moves(kube, w, lineage)
            tried = _tried(lineage)
            recovered = lineage.recovered
            if last.succeeded is not None:
                ended = "Succeeded"
            elif last.ready is not None and last.ended is None:
                ended = "Ready"
            else:
                ended = "not recovered"
            rows.append(
                Row(
                    workload=w.ref,
                    replica=lineage.label,
                    pod=last.name,
                    nodes=[node for node, _ in tried],
                    failed=[failed for _, failed in tried],
                    final_node=last.node,
                    final_node_faulty=(last.node in bad) if last.node else True,
                    moves=lineage.moves,
                    workload_moves=used,
                    budget=budget,
                    budget_scope=scope,
                    recovered_seconds=(
                        round(recovered - lineage.start, 1) if recovered is not None else None
                    ),
                    ended=ended,
                )
            )
    return rows


def table(rows: Sequence[Row], arrow: str) -> list[str]:
    header = ["workload", "pod", "nodes tried", "final node", "moves", "budget used", "recovered"]
    body = []
    for r in rows:
        tried = f" {arrow} ".join(
            f"{n}✗" if failed else n for n, failed in zip(r.nodes, r.failed, strict=True)
        )
        recovered = (
            f"{r.recovered_seconds:.1f}s ({r.ended})"
            if r.recovered_seconds is not None
            else r.ended
        )
        body.append(
            [
                r.workload,
                r.pod,
                tried,
                r.final_node or "-",
                str(r.moves),
                f"{r.workload_moves}/{r.budget} {r.budget_scope}",
                recovered,
            ]
        )
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in body
    ]
    return lines


# -- running it ---------------------------------------------------------------------------------


@dataclass
class Options:
    run_dir: Path
    png: Path
    timeout: float
    faults: dict[str, str]
    nodes: int
    color: bool | None


def _ensure_namespace(kube: Kube, console: Console, *, recreate: bool) -> None:
    """The demo's namespace, fresh. One the demo did not make is never touched."""
    path = f"/api/v1/namespaces/{NAMESPACE}"
    try:
        labels = (kube.request("GET", path).get("metadata") or {}).get("labels") or {}
        exists = True
    except NotFound:
        exists = False
    if exists and labels.get(DEMO_LABEL) != "true":
        raise SystemExit(
            f"the namespace {NAMESPACE} exists and was not made by the demo (no {DEMO_LABEL} "
            "label): not touching it"
        )
    if exists and recreate:
        console.say(f"deleting the namespace {NAMESPACE} left by an earlier run")
        kube.request("DELETE", path, write=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                kube.request("GET", path)
            except NotFound:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"namespace {NAMESPACE} is still terminating after 120s")
            time.sleep(0.5)
        exists = False
    if not exists:
        body = {"metadata": {"name": NAMESPACE, "labels": {DEMO_LABEL: "true"}}}
        kube.request("POST", "/api/v1/namespaces", body=body, write=True)
    # The API server refuses pods until the namespace's default ServiceAccount exists.
    deadline = time.monotonic() + 30
    while True:
        try:
            kube.request("GET", f"{path}/serviceaccounts/default")
            return
        except NotFound:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def play(
    kube: Kube,
    feed: Feed,
    timeline: Timeline,
    workloads: Sequence[Workload],
    console: Console,
    *,
    timeout: float,
    job_must_complete: bool,
    recreate_namespace: bool,
) -> Outcome:
    """Creates the workloads and narrates until all are healthy on good nodes, or the deadline."""
    _ensure_namespace(kube, console, recreate=recreate_namespace)
    deadline = time.monotonic() + timeout
    created = time.time() - console.t0
    timeline.started = created
    for w in workloads:
        kube.create(w.kind, NAMESPACE, manifest(w, RETRIES))
    names = [w.ref for w in workloads]
    console.say(f"created {', '.join(names[:-1])} and {names[-1]} in namespace {NAMESPACE}", "step")
    healthy: dict[str, Health] = {}
    announced: set[str] = set()
    while True:
        feed.poll()
        bad = timeline.bad_nodes()
        for w in workloads:
            healthy[w.ref] = health(kube, w, bad, job_must_complete=job_must_complete)
        news = [w.ref for w in workloads if healthy[w.ref].ok and w.ref not in announced]
        if news:
            feed.poll()  # what made it healthy comes first in the story
        for ref in news:
            announced.add(ref)
            console.say(f"{ref} healthy: {healthy[ref].detail}", "healthy")
        if all(h.ok for h in healthy.values()):
            break
        if time.monotonic() > deadline:
            problems = [f"{ref}: {h.detail}" for ref, h in healthy.items() if not h.ok]
            return Outcome(False, [f"not healthy within {timeout:g}s (--timeout):", *problems])
        time.sleep(POLL)
    story = time.time() - console.t0 - created
    # The feed may lag the API by a moment: let it catch up so the chart ends complete.
    settle = time.monotonic() + 5
    while time.monotonic() < settle:
        feed.poll()
        if all(lin.recovered is not None for lin in timeline.lineages.values()):
            break
        time.sleep(POLL)
    return Outcome(True, story_seconds=story)


_FAULT_TEXT: Final = {
    "crashloop": "every container exits 1: CrashLoopBackOff",
    "oom": "every container is OOMKilled (exit 137)",
    "imagepull": "its image mirror is down: ErrImagePull, ImagePullBackOff",
    "evict": "evicts its pods under memory pressure",
    "createcontainer": "its runtime cannot create containers: CreateContainerError",
}


def _describe_setup(
    console: Console,
    faults: Mapping[str, str],
    nodes: Sequence[str],
    workloads: Sequence[Workload],
) -> None:
    cfg = Config()
    console.plain()
    console.plain("nodes:")
    for n in nodes:
        mode = faults.get(n, HEALTHY)
        state = "healthy" if mode == HEALTHY else f"FAULTY {mode}: {_FAULT_TEXT.get(mode, mode)}"
        console.plain(f"  {n}  {state}")
    console.plain(
        f"simulated kubelet: containers start {TIMING.start:g}s after binding; a crashing "
        f"container restarts every {TIMING.restart_interval:g}s (a real kubelet backs off 10s, "
        "20s, 40s ... 5m);"
    )
    console.plain(
        f"  failed image pulls back off after {TIMING.pull_backoff:g}s; healthy Job pods "
        f"finish after {TIMING.job_runtime:g}s"
    )
    console.plain(
        f"detect-failures: a crash loop counts after {cfg.crashloop_restart_threshold} restarts; "
        "OOMKilled, image pull errors and evictions at once"
    )
    console.plain()
    console.plain(
        f'the story: three workloads opt in with scheduling-retries: "{RETRIES}" and prefer '
        "faulty nodes"
    )
    console.plain(
        "(a broken node soon looks empty, and the scheduler favours empty nodes just the same):"
    )
    for w in workloads:
        prefer = ", then ".join(n for n, _ in w.prefer) or "no node"
        what = {
            "Deployment": f"{w.replicas} replicas, prefers {prefer}; its ReplicaSet shares "
            f"{RETRIES} x {w.replicas} moves and one list of excluded nodes",
            "StatefulSet": f"{w.replicas} replicas, prefers {prefer}; each pod has {RETRIES} "
            "moves and its own excluded nodes",
            "Job": (f"may only run on {', '.join(w.pool)} (its node pool), " if w.pool else "")
            + f"prefers {prefer}; {RETRIES} moves",
        }[w.kind]
        console.plain(f"  {w.ref:<15} {what}")
    console.plain()


def _finish(
    kube: Kube,
    timeline: Timeline,
    workloads: Sequence[Workload],
    outcome: Outcome,
    console: Console,
    opts: Options,
) -> int:
    outcome.rows = summarize(kube, timeline, workloads)
    outcome.elapsed_seconds = round(time.time() - console.t0, 1)
    for r in outcome.rows:
        if r.final_node_faulty or r.ended == "not recovered":
            problem = f"{r.workload} {r.pod}: {r.ended} on {r.final_node or 'no node'}"
            if r.final_node_faulty and r.final_node:
                problem += " (a faulty node)"
            outcome.problems.append(problem)
        if r.budget and r.workload_moves > r.budget:
            outcome.problems.append(
                f"{r.workload}: {r.workload_moves} moves, over its budget of {r.budget}"
            )
    outcome.ok = outcome.ok and not outcome.problems
    console.plain()
    console.plain("summary (✗: the pod failed on that node):", BOLD)
    for line in table(outcome.rows, "→"):
        console.plain("  " + line)
    console.plain()
    opts.png.parent.mkdir(parents=True, exist_ok=True)
    healthy_at = (
        timeline.started + outcome.story_seconds
        if timeline.started is not None and outcome.story_seconds is not None
        else None
    )
    demo_chart.render(timeline, workloads, opts.png, healthy_at=healthy_at, retries=RETRIES)
    summary = {
        "ok": outcome.ok,
        "problems": outcome.problems,
        "elapsed_seconds": outcome.elapsed_seconds,
        "story_seconds": None if outcome.story_seconds is None else round(outcome.story_seconds, 1),
        "faults": timeline.faults,
        "bad_nodes": sorted(timeline.bad_nodes()),
        "timing": asdict(TIMING),
        "png": str(opts.png),
        "rows": [asdict(r) for r in outcome.rows],
    }
    (opts.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.say(f"timeline chart: {_shown(opts.png)}")
    if outcome.ok:
        console.say(
            f"every workload recovered on a good node, {outcome.story_seconds:.1f}s after it was "
            "created",
            "healthy",
        )
        return 0
    console.say("NOT every workload recovered:", "warn")
    for p in outcome.problems:
        console.plain(f"    {p}")
    console.plain(f"  logs, the event archive and summary.json: {_shown(opts.run_dir)}")
    return 1


def _shown(path: Path) -> str:
    """``path`` relative to the current directory when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class _QuietCached(io.TextIOBase):
    """stderr that drops the build scripts' "cached" lines but lets a real build's progress
    (minutes on a fresh machine) through."""

    def __init__(self, target: TextIO) -> None:
        self.target = target

    def write(self, text: str) -> int:
        if not text.rstrip().endswith(": cached"):
            self.target.write(text)
        return len(text)

    def flush(self) -> None:
        self.target.flush()


def run_local(opts: Options, console: Console) -> int:
    nodes = [f"node-{i}" for i in range(opts.nodes)]
    unknown = sorted(set(opts.faults) - set(nodes))
    if unknown:
        raise SystemExit(f"--fault names nodes the cluster will not have: {', '.join(unknown)}")
    faults = {n: m for n, m in opts.faults.items() if m != HEALTHY}
    workloads = plan_workloads(
        sorted(faults, key=nodes.index), [n for n in nodes if n not in faults]
    )
    with contextlib.redirect_stderr(_QuietCached(sys.stderr)):
        bins = ensure_bins()
        adapter_binary()
    console.say(
        f"starting a local control plane: etcd, kube-apiserver, kube-controller-manager, "
        f"kube-scheduler, kwok ({opts.nodes} nodes) and the fake kubelet",
        "step",
    )
    cluster = Cluster(
        opts.run_dir / "cluster", nodes=opts.nodes, timing=TIMING, bins_dir=bins, quiet=True
    )
    try:
        with cluster:
            console.say(f"control plane ready in {cluster.startup_seconds or 0:.1f}s")
            for node, mode in faults.items():
                cluster.set_fault(node, mode)
            _describe_setup(console, faults, cluster.nodes, workloads)
            console.say(
                "starting the pipeline: ApiServerSource (Knative's adapter) -> Broker (the "
                "Triggers in knative/) -> detect-failures -> update-annotations, and the "
                "mutate-admission webhook over TLS",
                "step",
            )
            api = cluster.api_client()
            stack = Stack(
                cluster.kubeconfig,
                api,
                opts.run_dir / "stack",
                opts.run_dir / "logs",
                sweep_every=SWEEP_EVERY,
            )
            with stack:
                console.say("pipeline ready; the webhook is registered with the API server")
                kube = Kube(api)
                timeline = Timeline(workloads, faults, console.note)
                feed = ArchiveFeed(stack.archive, timeline, console.t0)
                outcome = play(
                    kube,
                    feed,
                    timeline,
                    workloads,
                    console,
                    timeout=opts.timeout,
                    job_must_complete=True,
                    recreate_namespace=False,
                )
                code = _finish(kube, timeline, workloads, outcome, console, opts)
                console.say("stopping the pipeline and the control plane")
    finally:
        # The logs and the archive stay for a post-mortem; etcd's data is only bulk.
        shutil.rmtree(opts.run_dir / "cluster" / "etcd", ignore_errors=True)
    console.say(f"stopped everything; logs and the event archive: {_shown(opts.run_dir)}")
    return code


def run_existing(opts: Options, console: Console, archive: Path | None) -> int:
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(
        config_file=os.environ.get("KUBECONFIG") or None, client_configuration=configuration
    )
    kube = Kube(k8s.ApiClient(configuration))
    console.say(
        f"using the cluster in $KUBECONFIG ({configuration.host}); starting nothing", "step"
    )
    items = kube.request("GET", "/api/v1/nodes").get("items") or []
    nodes = sorted(str(n["metadata"]["name"]) for n in items)
    labels: dict[str, str | None] = {
        str(n["metadata"]["name"]): (n["metadata"].get("labels") or {}).get(SIM_FAULT_LABEL)
        for n in items
    }
    unknown = sorted(set(opts.faults) - set(nodes))
    if unknown:
        raise SystemExit(f"--fault names nodes the cluster does not have: {', '.join(unknown)}")
    with _labelled(kube, opts.faults, labels, console):
        faults = {n: str(v) for n, v in labels.items() if v and v != HEALTHY}
        faults.update({n: m for n, m in opts.faults.items() if m != HEALTHY})
        for n, m in opts.faults.items():
            if m == HEALTHY:
                faults.pop(n, None)
        if not faults:
            console.say(
                f"no node carries {SIM_FAULT_LABEL}: nothing will fail unless a node really is "
                "bad (--fault NODE=MODE labels one, on a cluster with the fake kubelet)",
                "warn",
            )
        workloads = plan_workloads(
            sorted(faults, key=nodes.index), [n for n in nodes if n not in faults]
        )
        _describe_setup(console, faults, nodes, workloads)
        timeline = Timeline(workloads, faults, console.note)
        # An archive of a running Broker holds earlier runs: follow it from its end.
        feed: Feed = (
            ArchiveFeed(archive, timeline, console.t0, from_end=True)
            if archive
            else ApiFeed(kube, timeline, console.t0)
        )
        outcome = play(
            kube,
            feed,
            timeline,
            workloads,
            console,
            timeout=opts.timeout,
            job_must_complete=False,
            recreate_namespace=True,
        )
        code = _finish(kube, timeline, workloads, outcome, console, opts)
    console.say(f"the workloads stay for a look: kubectl delete namespace {NAMESPACE} removes them")
    return code


@contextlib.contextmanager
def _labelled(
    kube: Kube, faults: Mapping[str, str], before: Mapping[str, str | None], console: Console
) -> Iterator[None]:
    """Labels the nodes named by --fault, and puts their labels back as they were afterwards."""

    def label(node: str, value: str | None) -> None:
        kube.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            body={"metadata": {"labels": {SIM_FAULT_LABEL: value}}},
            content_type="application/merge-patch+json",
            write=True,
        )

    done: list[str] = []
    try:
        for node, mode in faults.items():
            label(node, None if mode == HEALTHY else mode)
            done.append(node)
            console.say(f"labelled {node} {SIM_FAULT_LABEL}={mode}")
        yield
    finally:
        for node in done:
            label(node, before.get(node))
        if done:
            console.say(f"put the {SIM_FAULT_LABEL} label of {', '.join(done)} back as it was")


# -- command line -------------------------------------------------------------------------------


def _fault(value: str) -> tuple[str, str]:
    node, sep, mode = value.partition("=")
    if not sep or not node or mode not in (*FAULT_MODES, HEALTHY):
        raise argparse.ArgumentTypeError(
            f"expected NODE=MODE with MODE one of {', '.join(FAULT_MODES)} or none, got {value!r}"
        )
    return node, mode


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m stack.demo",
        description="Watch kn-rescheduler move pods that fail because of their node.",
    )
    p.add_argument(
        "--existing",
        action="store_true",
        help="use the cluster in $KUBECONFIG, where the functions already run; start nothing",
    )
    p.add_argument(
        "--fault",
        action="append",
        type=_fault,
        default=[],
        metavar="NODE=MODE",
        help="make NODE faulty (repeatable; MODE none heals it). Local: replaces the default "
        f"faults ({' '.join(f'{n}={m}' for n, m in DEFAULT_FAULTS.items())}). With --existing: "
        "labels the node for the run only",
    )
    p.add_argument("--nodes", type=int, default=NODES, help=f"local cluster size ({NODES})")
    p.add_argument(
        "--archive",
        type=Path,
        help="with --existing: follow this Broker archive (make up writes "
        ".local/stack/archive.jsonl) instead of polling the API",
    )
    p.add_argument("--run-dir", type=Path, help="logs, archive, summary (.local/demo/TIME)")
    p.add_argument("--png", type=Path, help="the timeline chart (RUN_DIR/timeline.png)")
    p.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT,
        help=f"seconds the workloads get to recover ({TIMEOUT:g})",
    )
    color = p.add_mutually_exclusive_group()
    color.add_argument("--color", dest="color", action="store_true", default=None)
    color.add_argument("--no-color", dest="color", action="store_false")
    return p.parse_args(argv)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None, stream: TextIO | None = None) -> int:
    args = parse_args(argv)
    if args.archive and not args.existing:
        raise SystemExit("--archive only makes sense with --existing")
    t0 = time.time()
    console = Console(t0, stream, args.color)
    run_dir = args.run_dir or ROOT / ".local" / "demo" / datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    # Locally the default faults tell the story; an existing cluster is left as it is.
    default_faults = {} if args.existing else dict(DEFAULT_FAULTS)
    faults = dict(args.fault) if args.fault else default_faults
    opts = Options(
        run_dir=run_dir,
        png=(args.png or run_dir / "timeline.png").resolve(),
        timeout=args.timeout,
        faults=faults,
        nodes=args.nodes,
        color=args.color,
    )
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    console.plain(
        "kn-rescheduler demo: pods that fail because of their node are moved off it", BOLD
    )
    try:
        if args.existing:
            return run_existing(opts, console, args.archive)
        return run_local(opts, console)
    except KeyboardInterrupt:
        console.say("interrupted: everything the demo started is stopped", "warn")
        return 130


if __name__ == "__main__":
    sys.exit(main())
