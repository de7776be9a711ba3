"""``make demo`` / ``python -m dev.stack.demo``: watch kn-rescheduler move pods off bad nodes.

By default it starts everything itself: a local control plane with six kwok nodes, three of
them faulty (a crash-looping runtime, an OOM-killing node, a broken image mirror), and the whole
pipeline (Knative's ApiServerSource adapter, the Broker stand-in with the Triggers of knative/,
detect-failures, update-annotations, and admission: the MutatingAdmissionPolicies of
knative/components/admission-policies, or with ``--admission webhook`` the mutate-admission
webhook over TLS). It then creates a
Deployment, a StatefulSet and a Job that opt in with ``scheduling-retries: "3"`` and prefer the
faulty nodes, narrates what happens as it happens (a node where two workloads failed turns
suspect: assess-nodes labels and taints it), and ends with a summary table and a timeline chart.

A second act shows node pressure: one healthy node's simulated CPU climbs, the real Prometheus
the local cluster runs reads it, label-nodes labels the node ``status=presure``, new pods of an
opted-in Deployment go elsewhere, the load falls and the label goes. Exit status 0 means every
workload ended healthy on a good node and the second act went as told.

``--existing`` runs the same story against the cluster in $KUBECONFIG, where the functions are
already deployed (for instance the one ``make up`` starts). See docs/demo.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, Final, TextIO

import requests
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from dev.localcluster import FAULT_MODES, Cluster, Timing, realnode
from dev.localcluster.bins import ensure_bins
from dev.localcluster.cluster import ClusterError
from dev.localcluster.keys import (
    SIM_FAULT_LABEL,
)
from dev.pipeline.source import adapter_binary
from dev.stack import demo_chart, installed
from dev.stack.demo_feeds import ApiFeed, ArchiveFeed, Feed, Feeds, NodeFeed
from dev.stack.demo_model import (
    APP_LABEL,
    HEALTHY,
    NAMESPACE,
    Lineage,
    NodeMarks,
    Note,
    Timeline,
    Workload,
    is_ready,
    manifest,
    node_of,
    phase,
)
from dev.stack.functions import ROOT
from dev.stack.stack import ADMISSION_MODES, LOCAL_PRESSURE_RULES, Stack
from shared.api.keys import (
    APISERVER_UPDATE,
    PREFIX,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
    SUSPECT_VALUE,
)
from shared.api.state import StateError, load_state
from shared.api.times import format_duration
from shared.nodes.label_nodes.rules import Rule, load_rules
from shared.platform.config import Config
from shared.platform.kube import Kube, KubeError, NotFound
from shared.workloads.policy import OwnerKind, Policy, parse_retries

JSON = dict[str, Any]

NODES: Final = 6
# node-1's container runtime crashes every container, node-3 OOM-kills them, node-5's image
# mirror is down. The even nodes are fine.
DEFAULT_FAULTS: Final = {"node-1": "crashloop", "node-3": "oom", "node-5": "imagepull"}
# On real nodes (--real-nodes N): real-1's app lacks a file of its node and crashes there,
# and with 4 nodes or more real-3's registry mirror refuses connections.
DEFAULT_REAL_FAULTS: Final = {"real-1": "app-crash", "real-3": "mirror-refused"}


def default_real_faults(nodes: int) -> dict[str, str]:
    """DEFAULT_REAL_FAULTS on the nodes a cluster of ``nodes`` real nodes has."""
    return {n: m for n, m in DEFAULT_REAL_FAULTS.items() if int(n.split("-")[1]) < nodes}


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
# The second act. label-nodes evaluates its rules this often (a PingSource's 30 s by default);
# short, so that the act is not mostly a wait.
LABEL_EVERY: Final = 2.0
# The pressured node's simulated CPU, and what it falls back to (the node exporter's default).
PRESSURE_CPU: Final = 0.9
QUIET_CPU: Final = 0.1
# The rule of dev/stack/pressure-rules.yaml the act drives.
PRESSURE_RULE: Final = "cpu-usage"
# How long each step of the act may take before the demo gives up on it.
ACT_STEP_TIMEOUT: Final = 60.0
# --install: the deploy targets' work directory (two levels under the repository, as their
# overlays expect), kept after the run: the rendered manifests that were applied.
INSTALL_WORK: Final = ".local/demo-install"


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
    "early": ("\033[2;31m", "✗"),
    "suspect": ("\033[1;35m", "⚑"),
    "pressure": ("\033[1;33m", "⚑"),
    "info": ("", " "),
    "step": ("\033[1m", "▸"),
    "warn": ("\033[1;31m", "!"),
}
_ASCII: Final = {
    "·": ".",
    "✗": "x",
    "↪": ">",
    "↺": "~",
    "✓": "+",
    "✔": "+",
    "▸": ">",
    "→": "->",
    "⚑": "!",
}


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
    first, the scheduler still picks a bad one, and the exclusions grow. The StatefulSet and the
    Job prefer the second: the first pod of each fails there first, so the second faulty node
    breaks pods of two workloads that failed nowhere else and turns suspect. A failure counts
    against a node only when its workload did not fail elsewhere too (an application broken
    everywhere looks like that: docs/node-health.md), so the Deployment, which meets the first
    and the second at once, cannot be relied on for it: whether its failure there counts
    depends on which of its pods failed first. The StatefulSet's second preference is the
    third: a pod kept off the second tries it, and its exclusions are kept per pod. Other
    faulty nodes that qualify later are held back by the cap, which says so.

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
        Workload("StatefulSet", "db", 2, prefs(pick(1), pick(2))),
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
    # Real nodes (a kubelet and containerd each) instead of kwok nodes: the cluster's size.
    real_nodes: int = 0
    # Knative Eventing and kn-rescheduler installed from their manifests (real nodes only).
    install: bool = False
    # How new pods get their exclusions on the local cluster (Stack's admission modes).
    admission: str = "policies"


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
    real_nodes: bool = False,
) -> Outcome:
    """Creates the workloads and narrates until all are healthy on good nodes, or the deadline."""
    _ensure_namespace(kube, console, recreate=recreate_namespace)
    deadline = time.monotonic() + timeout
    created = time.time() - console.t0
    timeline.started = created
    for w in workloads:
        kube.create(w.kind, NAMESPACE, manifest(w, RETRIES, real_nodes=real_nodes))
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


# -- act 2: node pressure ------------------------------------------------------------------------


@dataclass
class PressureOutcome:
    """What the second act saw, with times in seconds since the demo started."""

    node: str
    pool: list[str]
    rule: str
    threshold: float
    clear: float
    label_every: float
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    climbed: float | None = None
    # When the demo first saw Prometheus read the node over the threshold, and the value.
    read_over: float | None = None
    read_over_value: float | None = None
    labelled: float | None = None
    # Where the pods created while the node was labelled went, pod -> node.
    placed_while_labelled: dict[str, str] = field(default_factory=dict)
    fell: float | None = None
    read_under: float | None = None
    cleared: float | None = None
    # Where the pod created after the label went was placed.
    placed_after: dict[str, str] = field(default_factory=dict)


def plan_pressure(healthy: Sequence[str]) -> tuple[str, Workload] | None:
    """The node to press and the act's Deployment: it may only run on the healthy nodes (a
    faulty node would turn this act into the first one), and prefers the pressed node a little:
    half the weight of admission's affinity away from a pressured node. Without pressure its
    first pod goes to that node; under pressure admission's affinity outweighs the
    preference, and only then do its pods go elsewhere."""
    if len(healthy) < 2:
        return None
    node = healthy[1] if len(healthy) > 2 else healthy[0]
    weight = max(1, Config().pressure_affinity_weight // 2)
    api = Workload("Deployment", "api", len(healthy), ((node, weight),), tuple(healthy), act=2)
    return node, api


class Prometheus:
    """The pressure rule's value per node, asked of Prometheus as label-nodes asks it."""

    def __init__(self, url: str, rule: Rule):
        self.url = url.rstrip("/")
        self.rule = rule
        self.session = requests.Session()
        self.session.trust_env = False

    def values(self) -> dict[str, float]:
        try:
            body = self.session.get(
                f"{self.url}/api/v1/query", params={"query": self.rule.expr}, timeout=5
            ).json()
        except (requests.RequestException, ValueError):
            return {}
        out: dict[str, float] = {}
        for sample in (body.get("data") or {}).get("result") or []:
            node = (sample.get("metric") or {}).get("node")
            if node:
                out[str(node)] = float(sample["value"][1])
        return out


def _until(
    what: str, check: Callable[[], Any], feed: Feed, timeout: float = ACT_STEP_TIMEOUT
) -> Any:
    """Polls ``check`` (and the feed, so the story goes on) until it is truthy; None on time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        feed.poll()
        found = check()
        if found:
            return found
        time.sleep(POLL)
    log_what = f"{what}: not within {timeout:g}s"
    raise _ActFailed(log_what)


class _ActFailed(Exception):
    pass


def _until_told(timeline: Timeline, placed: Mapping[str, str], feed: Feed) -> None:
    """Until the timeline has the pods ``placed`` (name -> node) Ready too. The API said so
    first; the timeline hears it from the pipeline's own events (the ApiServerSource, through
    the Broker, into the archive), which under load come a moment later: the summary is made
    from the timeline, and would call a replica Ready on the API "not recovered"."""

    def told() -> bool:
        lives = [life for life in timeline.pods.values() if life.name in placed]
        return len(lives) >= len(placed) and all(life.ready is not None for life in lives)

    _until("the pipeline's events to tell those pods Ready", told, feed)


def _scale(kube: Kube, w: Workload, replicas: int) -> None:
    kube.merge_patch("Deployment", NAMESPACE, w.name, {"spec": {"replicas": replicas}})


def _ready_pods(kube: Kube, w: Workload, replicas: int) -> dict[str, str] | None:
    pods = _live_pods(kube, w)
    if len(pods) != replicas or not all(is_ready(p) and node_of(p) for p in pods):
        return None
    return {str(p["metadata"]["name"]): str(node_of(p)) for p in pods}


def pressure_act(
    cluster: Cluster,
    kube: Kube,
    feed: Feed,
    timeline: Timeline,
    console: Console,
    node: str,
    api: Workload,
    *,
    real_nodes: bool = False,
) -> PressureOutcome:
    rule = next(r for r in load_rules(LOCAL_PRESSURE_RULES) if r.name == PRESSURE_RULE)
    out = PressureOutcome(node, list(api.pool), rule.name, rule.threshold, rule.clear, LABEL_EVERY)
    prom = Prometheus(cluster.prometheus_url, rule)
    others = [n for n in api.pool if n != node]
    now = lambda: time.time() - console.t0  # noqa: E731
    console.plain()
    console.say(
        f"act 2: node pressure. label-nodes evaluates its rules every {LABEL_EVERY:g}s against "
        f"the cluster's Prometheus; rule {rule.name} labels a node over {rule.threshold:g} "
        f"and clears it under {rule.clear:g} (CPU %, a 10s rate)",
        "step",
    )
    console.plain(
        f"  {api.ref} opts in like the others, may only run on {', '.join(api.pool)} and "
        f"prefers {node} a little (weight {api.prefer[0][1]}; admission's affinity away from "
        f"a pressured node weighs {Config().pressure_affinity_weight})"
    )
    try:
        # A fresh node's first 10 s rate can read high: start once every node reads quiet.
        quiet = _until(
            "every node to read quiet",
            lambda: (
                (v := prom.values()).keys() >= set(cluster.nodes)
                and all(x < rule.clear for x in v.values())
                and v
            ),
            feed,
        )
        console.say(
            "Prometheus reads every node quiet: "
            + ", ".join(f"{n} {quiet[n]:.0f}%" for n in cluster.nodes)
        )
        manifest_ = manifest(api, RETRIES, real_nodes=real_nodes)
        manifest_["spec"]["replicas"] = 0
        kube.create("Deployment", NAMESPACE, manifest_)
        console.say(f"created {api.ref} with 0 replicas")
        cluster.set_node_usage(node, cpu=PRESSURE_CPU)
        out.climbed = now()
        console.say(
            f"{node}'s CPU climbs to {PRESSURE_CPU:.0%} (its node-exporter serves it)", "step"
        )

        def over() -> float | None:
            value = prom.values().get(node)
            return value if value is not None and value > rule.threshold else None

        out.read_over_value = _until(f"Prometheus to read {node} over the threshold", over, feed)
        out.read_over = now()
        console.say(
            f"Prometheus reads {node} at {out.read_over_value:.0f}%: over {rule.name}'s "
            f"{rule.threshold:g}, {out.read_over - out.climbed:.1f}s after the climb"
        )

        def labelled() -> float | None:
            marks = timeline.nodes.get(node)
            return marks.pressure_labelled if marks is not None else None

        out.labelled = _until(f"label-nodes to label {node}", labelled, feed)
        console.say(
            f"{node} labelled {out.labelled - out.read_over:.1f}s after Prometheus read it over "
            f"the threshold (label-nodes evaluates every {LABEL_EVERY:g}s)"
        )
        want = len(others)
        console.say(
            f"scaling {api.ref} to {want}: admission gives each new pod a preferred "
            f"affinity away from {node}'s label",
            "step",
        )
        _scale(kube, api, want)
        out.placed_while_labelled = _until(
            f"{want} pods of {api.ref} Ready", lambda: _ready_pods(kube, api, want), feed
        )
        _until_told(timeline, out.placed_while_labelled, feed)
        where = sorted(out.placed_while_labelled.values())
        on_node = [p for p, n in out.placed_while_labelled.items() if n == node]
        if on_node:
            out.problems.append(f"{', '.join(on_node)} went to {node}, which was labelled")
            console.say(f"{', '.join(on_node)} went to {node} although it was labelled", "warn")
        else:
            console.say(
                f"{api.ref}: {want}/{want} Ready on {', '.join(where)}; none on {node}, "
                "which it prefers but which is under pressure",
                "healthy",
            )
        cluster.set_node_usage(node, cpu=QUIET_CPU)
        out.fell = now()
        console.say(f"{node}'s CPU falls back to {QUIET_CPU:.0%}", "step")

        def under() -> float | None:
            value = prom.values().get(node)
            return value if value is not None and value < rule.clear else None

        value = _until(f"Prometheus to read {node} under the clear threshold", under, feed)
        out.read_under = now()
        console.say(
            f"Prometheus reads {node} at {value:.0f}%: under {rule.name}'s clear threshold "
            f"{rule.clear:g}, {out.read_under - out.fell:.1f}s after the fall"
        )

        def cleared() -> float | None:
            marks = timeline.nodes.get(node)
            return marks.pressure_cleared if marks is not None else None

        out.cleared = _until(f"label-nodes to remove {node}'s label", cleared, feed)
        console.say(
            f"{node}'s label went {out.cleared - out.read_under:.1f}s after Prometheus read it "
            f"under the clear threshold; it was labelled for {out.cleared - out.labelled:.1f}s"
        )
        console.say(f"scaling {api.ref} to {want + 1}", "step")
        before = set(out.placed_while_labelled)
        _scale(kube, api, want + 1)
        placed = _until(
            f"{want + 1} pods of {api.ref} Ready", lambda: _ready_pods(kube, api, want + 1), feed
        )
        _until_told(timeline, placed, feed)
        out.placed_after = {p: n for p, n in placed.items() if p not in before}
        new_nodes = ", ".join(sorted(set(out.placed_after.values())))
        console.say(
            f"{api.ref}: the pod created after the label went is Ready on {new_nodes}"
            + (
                " (the node it prefers, no longer under pressure)"
                if node in out.placed_after.values()
                else ""
            ),
            "healthy",
        )
    except _ActFailed as exc:
        out.problems.append(f"act 2: {exc}")
        console.say(f"act 2: {exc}", "warn")
    out.ok = not out.problems
    return out


_FAULT_TEXT: Final = {
    "crashloop": "every container exits 1: CrashLoopBackOff",
    "oom": "every container is OOMKilled (exit 137)",
    "imagepull": "its image mirror is down: ErrImagePull, ImagePullBackOff",
    "app-crash": "a file of its own the app needs is missing: the app exits 1, CrashLoopBackOff",
    "mirror-refused": "its registry mirror refuses connections: ErrImagePull, ImagePullBackOff",
    "mirror-hangs": "its registry mirror never answers: the pull hangs",
    "cni-broken": "its CNI plugin is missing: FailedCreatePodSandBox",
    "runtime-broken": "its runc fails: FailedCreatePodSandBox",
    "runtime-stopped": "its containerd is stopped: the node turns NotReady",
    "disk-pressure": "the kubelet sees its disk full: DiskPressure, evictions",
    "memory-pressure": "the kubelet sees its memory full: MemoryPressure, evictions",
    "evict": "evicts its pods under memory pressure",
    "createcontainer": "its runtime cannot create containers: CreateContainerError",
    "pullhang": "its image mirror never answers: the pull hangs, ContainerCreating",
}


def _describe_setup(
    console: Console,
    faults: Mapping[str, str],
    nodes: Sequence[str],
    workloads: Sequence[Workload],
    pressure: tuple[str, Workload] | None = None,
    *,
    real_nodes: bool = False,
) -> None:
    cfg = Config()
    console.plain()
    console.plain("nodes:")
    for n in nodes:
        mode = faults.get(n, HEALTHY)
        state = "healthy" if mode == HEALTHY else f"FAULTY {mode}: {_FAULT_TEXT.get(mode, mode)}"
        console.plain(f"  {n}  {state}")
    if real_nodes:
        console.plain(
            "real kubelets: a crashing container restarts on the kubelet's own back-off (10s, "
            "20s, 40s ... 5m); images are pulled from the cluster's registry"
        )
    else:
        console.plain(
            f"simulated kubelet: containers start {TIMING.start:g}s after binding; a crashing "
            f"container restarts every {TIMING.restart_interval:g}s (a real kubelet backs off "
            "10s, 20s, 40s ... 5m);"
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
    console.plain(
        f"assess-nodes: a node where {cfg.suspect_workloads} distinct workloads failed within "
        f"{format_duration(cfg.suspect_window)} turns suspect (label and PreferNoSchedule taint "
        f"{SUSPECT_LABEL}={SUSPECT_VALUE}), at most {cfg.suspect_max_share:.0%} of the nodes"
    )
    if pressure is not None:
        node, api = pressure
        console.plain(
            f"then act 2, node pressure: {node}'s CPU climbs, and {api.ref} (may only run on "
            f"{', '.join(api.pool)}, prefers {node} a little) scales up"
        )
    console.plain()


def _node_lines(timeline: Timeline, act2: PressureOutcome | None) -> list[str]:
    """The nodes' part of the summary: suspicions (and the cap), and the pressure act."""
    lines: list[str] = []
    for marks in sorted(timeline.nodes.values(), key=lambda m: m.name):
        if marks.suspect_labelled is not None:
            marked = [f"label {SUSPECT_LABEL}={SUSPECT_VALUE}"]
            if marks.suspect_tainted is not None:
                marked.append("PreferNoSchedule taint")
            if marks.event:
                marked.append("Warning Event NodeSuspected")
            if marks.suspected is not None:
                marked.append("reply event node.suspected")
            lines.append(
                f"{marks.name}  suspect at {marks.suspect_labelled:.1f}s: "
                f"{', '.join(marks.workloads) or '?'}; {', '.join(marked)}"
            )
        elif marks.why.startswith("cap: "):
            lines.append(f"{marks.name}  not marked: {marks.why[5:]}")
    if act2 is not None and act2.labelled is not None:
        marks = timeline.nodes.get(act2.node) or NodeMarks(act2.node)
        value = f"{marks.pressure_value:.0f}" if marks.pressure_value is not None else "?"
        until = f" to {act2.cleared:.1f}s" if act2.cleared is not None else " (still)"
        lines.append(
            f"{act2.node}  {timeline.pressure_label[0]}={timeline.pressure_label[1]} from "
            f"{act2.labelled:.1f}s{until} ({act2.rule} read {value}); pods placed meanwhile "
            f"on {', '.join(sorted(act2.placed_while_labelled.values())) or 'none'}, after on "
            f"{', '.join(sorted(act2.placed_after.values())) or 'none'}"
        )
    return lines


def _finish(
    kube: Kube,
    timeline: Timeline,
    workloads: Sequence[Workload],
    outcome: Outcome,
    console: Console,
    opts: Options,
    act2: PressureOutcome | None = None,
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
    if act2 is not None:
        outcome.problems.extend(act2.problems)
    outcome.ok = outcome.ok and not outcome.problems
    console.plain()
    console.plain("summary (✗: the pod failed on that node):", BOLD)
    for line in table(outcome.rows, "→"):
        console.plain("  " + line)
    node_lines = _node_lines(timeline, act2)
    if node_lines:
        console.plain()
        console.plain("nodes:", BOLD)
        for line in node_lines:
            console.plain("  " + line)
    console.plain()
    opts.png.parent.mkdir(parents=True, exist_ok=True)
    healthy_at = (
        timeline.started + outcome.story_seconds
        if timeline.started is not None and outcome.story_seconds is not None
        else None
    )
    spans = (
        [(act2.labelled, act2.cleared, f"{act2.node} labelled {'='.join(timeline.pressure_label)}")]
        if act2 is not None and act2.labelled is not None
        else []
    )
    demo_chart.render(
        timeline, workloads, opts.png, healthy_at=healthy_at, retries=RETRIES, spans=spans
    )
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
        "nodes": [asdict(m) for m in sorted(timeline.nodes.values(), key=lambda m: m.name)],
        "pressure": asdict(act2) if act2 is not None else None,
    }
    (opts.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    console.say(f"timeline chart: {_shown(opts.png)}")
    if outcome.ok:
        console.say(
            f"every workload recovered on a good node, {outcome.story_seconds:.1f}s after it was "
            "created",
            "healthy",
        )
        if act2 is not None:
            console.say(
                f"act 2: {act2.node} was labelled and unlabelled as its load rose and fell, and "
                "the pods created meanwhile went elsewhere",
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


def _local_nodes(opts: Options) -> tuple[list[str], dict[str, str], list[str]]:
    """The local cluster's nodes, the faulty ones with their faults, and the healthy ones;
    SystemExit for a --fault the cluster cannot have."""
    real = opts.real_nodes > 0
    nodes = (
        [f"real-{i}" for i in range(opts.real_nodes)]
        if real
        else [f"node-{i}" for i in range(opts.nodes)]
    )
    kinds = realnode.FAULTS if real else FAULT_MODES
    wrong = sorted(f"{n}={m}" for n, m in opts.faults.items() if m not in (*kinds, HEALTHY))
    if wrong:
        raise SystemExit(
            f"--fault {', '.join(wrong)}: {'real' if real else 'kwok'} nodes' faults are "
            f"{', '.join(kinds)}"
        )
    unknown = sorted(set(opts.faults) - set(nodes))
    if unknown:
        raise SystemExit(f"--fault names nodes the cluster will not have: {', '.join(unknown)}")
    faults = {n: m for n, m in opts.faults.items() if m != HEALTHY}
    return nodes, faults, [n for n in nodes if n not in faults]


def run_local(opts: Options, console: Console) -> int:
    real = opts.real_nodes > 0
    nodes, faults, healthy = _local_nodes(opts)
    workloads = plan_workloads(sorted(faults, key=nodes.index), healthy)
    pressure = plan_pressure(healthy)
    everything = [*workloads, *([pressure[1]] if pressure else [])]
    with contextlib.redirect_stderr(_QuietCached(sys.stderr)):
        bins = ensure_bins()
        adapter_binary()
    console.say(
        "starting a local control plane: etcd, kube-apiserver, kube-controller-manager, "
        + (
            f"kube-scheduler and {opts.real_nodes} real nodes (a kubelet and containerd each)"
            if real
            else f"kube-scheduler, kwok ({opts.nodes} nodes) and the fake kubelet"
        ),
        "step",
    )
    cluster = Cluster(
        opts.run_dir / "cluster",
        nodes=0 if real else opts.nodes,
        real_nodes=opts.real_nodes,
        timing=TIMING,
        bins_dir=bins,
        quiet=True,
    )
    try:
        with cluster:
            console.say(f"control plane ready in {cluster.startup_seconds or 0:.1f}s")
            for node, mode in faults.items():
                cluster.set_fault(node, mode)
            _describe_setup(console, faults, cluster.nodes, workloads, pressure, real_nodes=real)
            console.say(
                "starting the pipeline: ApiServerSource (Knative's adapter) -> Broker (the "
                "Triggers in knative/) -> detect-failures -> update-annotations, assess-nodes, "
                + (
                    "the MutatingAdmissionPolicies (no webhook)"
                    if opts.admission == "policies"
                    else "the mutate-admission webhook over TLS"
                )
                + ", and label-nodes on a timer",
                "step",
            )
            api = cluster.api_client()
            stack = Stack(
                cluster.kubeconfig,
                api,
                opts.run_dir / "stack",
                opts.run_dir / "logs",
                sweep_every=SWEEP_EVERY,
                prometheus_url=cluster.prometheus_url,
                label_every=LABEL_EVERY,
                settings=realnode.REAL_KUBELET_FUNCTION_SETTINGS if real else None,
                admission=opts.admission,
            )
            with stack:
                console.say(
                    "pipeline ready; the API server applies the admission policies, no webhook"
                    if opts.admission == "policies"
                    else "pipeline ready; the webhook is registered with the API server"
                )
                kube = Kube(api)
                timeline = Timeline(everything, faults, console.note)
                feed = Feeds(
                    ArchiveFeed(stack.archive, timeline, console.t0),
                    NodeFeed(kube, timeline, console.t0),
                )
                outcome = play(
                    kube,
                    feed,
                    timeline,
                    workloads,
                    console,
                    timeout=opts.timeout,
                    job_must_complete=True,
                    recreate_namespace=False,
                    real_nodes=real,
                )
                act2: PressureOutcome | None = None
                if outcome.ok and pressure is not None:
                    act2 = pressure_act(
                        cluster, kube, feed, timeline, console, *pressure, real_nodes=real
                    )
                elif pressure is None:
                    console.say("act 2 (node pressure) needs two healthy nodes: skipped")
                code = _finish(kube, timeline, everything, outcome, console, opts, act2)
                console.say("stopping the pipeline and the control plane")
    finally:
        # The logs and the archive stay for a post-mortem; etcd's data is only bulk.
        shutil.rmtree(opts.run_dir / "cluster" / "etcd", ignore_errors=True)
    console.say(f"stopped everything; logs and the event archive: {_shown(opts.run_dir)}")
    for line in replay_lines(opts.run_dir / "stack" / "archive.jsonl"):
        console.plain(line)
    return code


def run_installed(opts: Options, console: Console) -> int:
    """``--install``: the story on a cluster where Knative Eventing and kn-rescheduler are
    installed from their manifests as a platform team installs them
    (docs/install-without-serving.md), on real nodes with kube-proxy and CoreDNS. Nothing of the
    demo carries an event: it creates the workloads and reads what the installed system does,
    from the API."""
    nodes, faults, healthy = _local_nodes(opts)
    workloads = plan_workloads(sorted(faults, key=nodes.index), healthy)
    with contextlib.redirect_stderr(_QuietCached(sys.stderr)):
        bins = ensure_bins()
    console.say(
        "starting a local control plane with "
        f"{opts.real_nodes} real nodes (a kubelet, containerd and kube-proxy each), CoreDNS "
        "and an image registry",
        "step",
    )
    cluster = Cluster(
        opts.run_dir / "cluster",
        nodes=0,
        real_nodes=opts.real_nodes,
        prometheus=False,
        bins_dir=bins,
        quiet=True,
    )
    try:
        with cluster:
            console.say(f"control plane ready in {cluster.startup_seconds or 0:.1f}s")
            console.say(
                "installing Knative Eventing from its own manifests: core, the in-memory channel "
                "and the MT channel-based Broker (images built with ko on first use: minutes)",
                "step",
            )
            started = time.monotonic()
            cluster.install_knative_eventing()
            console.say(f"Knative Eventing running in {time.monotonic() - started:.0f}s")
            console.say("installing kn-rescheduler from knative/, without Knative Serving", "step")
            started = time.monotonic()
            installed.install(cluster, INSTALL_WORK, say=console.say)
            console.say(
                f"kn-rescheduler running in {time.monotonic() - started:.0f}s: every function a "
                "Deployment, the Broker and the ApiServerSource Ready (written by Knative)"
            )
            # Set once everything runs: a node whose mirror is down could not pull the install.
            for node, mode in faults.items():
                cluster.set_fault(node, mode)
            _describe_setup(console, faults, cluster.nodes, workloads, real_nodes=True)
            kube = Kube(cluster.api_client())
            timeline = Timeline(workloads, faults, console.note)
            feed = Feeds(ApiFeed(kube, timeline, console.t0), NodeFeed(kube, timeline, console.t0))
            outcome = play(
                kube,
                feed,
                timeline,
                workloads,
                console,
                timeout=opts.timeout,
                job_must_complete=True,
                recreate_namespace=False,
                real_nodes=True,
            )
            console.say(
                "act 2 (node pressure) reads the Prometheus of the local stack, which this "
                "install does not have: skipped"
            )
            code = _finish(kube, timeline, workloads, outcome, console, opts)
            archive = opts.run_dir / "archive.jsonl"
            try:
                installed.save_archive(cluster, archive)
            except installed.InstallError as e:
                console.say(f"could not save the functions' logs as an archive: {e}", "warn")
            console.say("stopping the control plane and the nodes")
    except (ClusterError, installed.InstallError) as e:
        # A step of the install that failed says which, with its output: no traceback.
        console.say(str(e), "warn")
        return 1
    finally:
        shutil.rmtree(opts.run_dir / "cluster" / "etcd", ignore_errors=True)
    console.say(
        f"stopped everything; logs and the archive of the functions' logs: {_shown(opts.run_dir)}"
    )
    for line in replay_lines(archive):
        console.plain(line)
    return code


def replay_lines(archive: Path) -> list[str]:
    """The closing lines: how to replay this run's archive, now that its cluster is stopped.

    ``make replay`` runs from the repository's root, so the path is given from there. The pod
    events replay anywhere (detect-failures judges each from the event alone); the functions
    that act read and write a cluster, and replay says so itself when there is none.
    """
    try:
        shown = str(archive.resolve().relative_to(ROOT))
    except ValueError:
        shown = str(archive.resolve())
    return [
        "replay what detect-failures judged, from the archive alone (no cluster needed):",
        f'  make replay FILE={shlex.quote(shown)} ARGS="--type {APISERVER_UPDATE}"',
        "update-annotations and assess-nodes act on a cluster, and the demo's is stopped: "
        "`make up` starts one to replay their events against (docs/demo.md, Replay)",
    ]


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
        events: Feed = (
            ArchiveFeed(archive, timeline, console.t0, from_end=True)
            if archive
            else ApiFeed(kube, timeline, console.t0)
        )
        feed = Feeds(events, NodeFeed(kube, timeline, console.t0))
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
    known = (*FAULT_MODES, *realnode.FAULTS, HEALTHY)
    if not sep or not node or mode not in known:
        raise argparse.ArgumentTypeError(
            f"expected NODE=MODE with MODE one of {', '.join(FAULT_MODES)} (kwok nodes), "
            f"{', '.join(realnode.FAULTS)} (real nodes) or none, got {value!r}"
        )
    return node, mode


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m dev.stack.demo",
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
        "--admission",
        choices=ADMISSION_MODES,
        default="policies",
        help="how new pods get their exclusions on the local cluster: the MutatingAdmission"
        "Policies (policies, the default: Kubernetes 1.36) or the mutate-admission webhook",
    )
    p.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        metavar="N",
        help="N real nodes (a kubelet and containerd each; needs root) instead of kwok nodes; "
        f"default faults then {' '.join(f'{n}={m}' for n, m in DEFAULT_REAL_FAULTS.items())} "
        "(real-3 with 4 nodes or more); act 2 needs two healthy nodes",
    )
    p.add_argument(
        "--install",
        action="store_true",
        help="install Knative Eventing and kn-rescheduler from their manifests, as a user does "
        "(docs/install-without-serving.md), on real nodes (--real-nodes, 2 by default; "
        "needs root), and tell the story from what they do",
    )
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
    if args.real_nodes and args.existing:
        raise SystemExit("--real-nodes starts a local cluster; it cannot go with --existing")
    if args.install and args.existing:
        raise SystemExit("--install starts and installs a local cluster; not with --existing")
    if args.install and not args.real_nodes:
        args.real_nodes = 2
    if args.real_nodes and args.real_nodes < 2:
        raise SystemExit("--real-nodes needs at least 2 nodes: a faulty one and a healthy one")
    local_faults = default_real_faults(args.real_nodes) if args.real_nodes else DEFAULT_FAULTS
    default_faults = {} if args.existing else dict(local_faults)
    faults = dict(args.fault) if args.fault else default_faults
    opts = Options(
        run_dir=run_dir,
        png=(args.png or run_dir / "timeline.png").resolve(),
        timeout=args.timeout,
        faults=faults,
        nodes=args.nodes,
        color=args.color,
        real_nodes=args.real_nodes,
        install=args.install,
        admission=args.admission,
    )
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    console.plain(
        "kn-rescheduler demo: pods that fail because of their node are moved off it", BOLD
    )
    try:
        if args.existing:
            return run_existing(opts, console, args.archive)
        if opts.install:
            return run_installed(opts, console)
        return run_local(opts, console)
    except KeyboardInterrupt:
        console.say("interrupted: everything the demo started is stopped", "warn")
        return 130


if __name__ == "__main__":
    sys.exit(main())
