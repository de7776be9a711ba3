"""What the demo saw: every pod, the line of pods that replaced it, and what the pipeline did.

``Timeline`` is fed facts from one of the feeds in ``stack.demo_feeds`` (pod snapshots, pods
gone, the pipeline's failing / rescheduled / exhausted events) and keeps one ``Lineage`` per
replica: a StatefulSet pod keeps its name, a Job runs one pod at a time, and a Deployment
replica's replacement is the next pod of the Deployment created after one of its pods went
away. Every change worth telling a person is handed to ``sink`` as a ``Note``.

It also keeps what happened to the nodes: the suspicions assess-nodes announced (its reply
``io.kn-rescheduler.node.suspected``) and, from Node snapshots, when the suspect label and
taint and the pressure label ``status=presure`` appeared and went. A node's marks are facts of
the Node object, so they come from snapshots; the reply event says why.

Times are seconds since the demo started (wall clock, so the archive's arrival times and the
demo's own clock agree).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from dev.localcluster.keys import (
    SIM_FAULT_LABEL,
)
from dev.localcluster.nodeimages import BUSYBOX_IMAGE
from dev.localcluster.realnode import NODE_DEPENDENT_APP, NODE_LOCAL_DIR
from shared.api.keys import (
    EXCLUDED_NODES_ANNOTATION,
    PRESSURE_ANNOTATION,
    PRESSURE_LABEL_KEY,
    PRESSURE_LABEL_VALUE,
    REASON_NODE_SUSPECTED,
    REASON_SUSPECT_CAP_REACHED,
    SUSPECT_LABEL,
    SUSPECT_VALUE,
)
from shared.workloads.classify import FailureKind

JSON = dict[str, Any]

NAMESPACE: Final = "demo"
APP_LABEL: Final = "app"
IMAGE: Final = "registry.k8s.io/pause:3.10"
HEALTHY: Final = "none"


@dataclass(frozen=True)
class Workload:
    kind: str  # Deployment, StatefulSet or Job
    name: str
    replicas: int
    # (node, weight) pairs of a preferred node affinity: what makes the scheduler pick the
    # faulty nodes first, as a bad node with free capacity attracts pods.
    prefer: tuple[tuple[str, int], ...] = ()
    # The only nodes the pods may run on (a required node affinity): a node pool.
    pool: tuple[str, ...] = ()
    # Which act of the demo it belongs to (the second one is about node pressure).
    act: int = 1

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"


def container(w: Workload, *, real_nodes: bool) -> JSON:
    """The pod's one container. On kwok nodes the image is never pulled and nothing runs. On
    real nodes (a kubelet and containerd each) it is the local registry's busybox running an
    app that needs a file of its node (realnode.NODE_DEPENDENT_APP: the app-crash fault takes
    it away); a Job's does the same check and finishes in 2 s."""
    if not real_nodes:
        return {"name": "app", "image": IMAGE}
    if w.kind == "Job":
        command = ["sh", "-c", f"test -e {NODE_LOCAL_DIR}/app-ok || exit 1; sleep 2"]
    else:
        command = list(NODE_DEPENDENT_APP)
    return {"name": "app", "image": BUSYBOX_IMAGE, "command": command}


def pod_template(w: Workload, *, real_nodes: bool = False) -> JSON:
    # The default termination grace period on purpose: a pod deleted with grace 0 vanishes at
    # once, and kwok's delayed delete by name would then remove a StatefulSet pod's namesake.
    spec: JSON = {"containers": [container(w, real_nodes=real_nodes)]}
    affinity: JSON = {}
    if w.prefer:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {
                "weight": weight,
                "preference": {
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]
                },
            }
            for node, weight in w.prefer
        ]
    if w.pool:
        # One term per node: a node field selector takes exactly one value; terms are ORed.
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                for node in w.pool
            ]
        }
    if affinity:
        spec["affinity"] = {"nodeAffinity": affinity}
    if w.kind == "Job":
        spec["restartPolicy"] = "OnFailure"
    return {"metadata": {"labels": {APP_LABEL: w.name}}, "spec": spec}


def manifest(w: Workload, retries: int, *, real_nodes: bool = False) -> JSON:
    """The workload as a user would write it: only ``scheduling-retries`` is ours."""
    meta = {"name": w.name, "annotations": {"scheduling-retries": str(retries)}}
    template = pod_template(w, real_nodes=real_nodes)
    if w.kind == "Deployment":
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": w.replicas,
                "selector": {"matchLabels": {APP_LABEL: w.name}},
                "template": template,
            },
        }
    if w.kind == "StatefulSet":
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": meta,
            "spec": {
                "replicas": w.replicas,
                "serviceName": w.name,
                "selector": {"matchLabels": {APP_LABEL: w.name}},
                "template": template,
            },
        }
    if w.kind == "Job":
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta,
            "spec": {"backoffLimit": 6, "template": template},
        }
    raise ValueError(f"the demo has no {w.kind}")


# -- pods ---------------------------------------------------------------------------------------


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def node_of(pod: Mapping[str, Any]) -> str | None:
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def _json_object(raw: object) -> dict[str, Any]:
    try:
        value = json.loads(str(raw)) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def kept_off(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The nodes the webhook stamped on the pod when it was created."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(EXCLUDED_NODES_ANNOTATION)
    try:
        value = json.loads(raw) if raw else []
    except ValueError:
        return ()
    return tuple(str(n) for n in value) if isinstance(value, list) else ()


@dataclass
class PodLife:
    uid: str
    name: str
    workload: Workload
    created: float
    node: str | None = None
    fault: str = HEALTHY  # the node's fault when the pod was placed there
    scheduled: float | None = None
    kept_off: tuple[str, ...] = ()
    ready: float | None = None
    # detect-failures' early report: the pod's first failure, below the thresholds (acted on
    # only when the node is already suspect: the fast path).
    first_failure: float | None = None
    failing: float | None = None
    reason: str = ""
    restarts: int = 0
    moved: float | None = None
    move: int = 0
    budget: int = 0
    excluded_after: tuple[str, ...] = ()
    exclusions_cleared: bool = False
    exhausted: float | None = None
    deleting: float | None = None
    gone: float | None = None
    succeeded: float | None = None

    @property
    def ended(self) -> float | None:
        """When the pod stopped counting: deleted (or being deleted), else None."""
        times = [t for t in (self.deleting, self.gone, self.moved) if t is not None]
        return min(times) if times else None

    @property
    def healthy(self) -> bool:
        return self.fault == HEALTHY


@dataclass
class Lineage:
    """One replica over time: a pod and every pod that replaced it."""

    key: str
    label: str
    workload: Workload
    pods: list[PodLife] = field(default_factory=list)

    @property
    def current(self) -> PodLife:
        return self.pods[-1]

    @property
    def start(self) -> float:
        return self.pods[0].created

    @property
    def moves(self) -> int:
        return sum(1 for p in self.pods if p.moved is not None)

    @property
    def recovered(self) -> float | None:
        """When the replica's last pod became Ready (or its Job pod succeeded)."""
        last = self.current
        if last.ended is not None or last.failing is not None:
            return None
        done = [t for t in (last.ready, last.succeeded) if t is not None]
        return min(done) if done else None

    @property
    def nodes(self) -> list[str]:
        return [p.node for p in self.pods if p.node]


@dataclass
class NodeMarks:
    """What the demo saw on one Node over time: blame (suspect) and pressure."""

    name: str
    # assess-nodes' reply: when it arrived, the workloads it named, its reason.
    suspected: float | None = None
    workloads: tuple[str, ...] = ()
    why: str = ""
    # The Node object: when the suspect label and taint were first seen, and when they went.
    suspect_labelled: float | None = None
    suspect_tainted: float | None = None
    suspect_cleared: float | None = None
    # The NodeSuspected Warning Event recorded on the Node (its message), once seen.
    event: str = ""
    # label-nodes' pressure label: when first seen, the rule and value it named, when it went.
    pressure_labelled: float | None = None
    pressure_rule: str = ""
    pressure_value: float | None = None
    pressure_cleared: float | None = None


@dataclass(frozen=True)
class Note:
    """One line for a person: at ``t``, about ``subject`` (a pod or a workload)."""

    t: float
    subject: str
    kind: str  # scheduled, failing, moved, cleared, exhausted, ready, succeeded, info
    text: str
    # Who said so: the function whose event this is, or "" for what the demo saw itself.
    source: str = ""


class Timeline:
    def __init__(
        self,
        workloads: Sequence[Workload],
        faults: Mapping[str, str],
        sink: Callable[[Note], None] = lambda note: None,
        *,
        namespace: str = NAMESPACE,
    ) -> None:
        self.workloads = {w.name: w for w in workloads}
        self.faults = dict(faults)
        self.sink = sink
        self.namespace = namespace
        self.pods: dict[str, PodLife] = {}
        # When the workloads were created (the chart's zero).
        self.started: float | None = None
        self.lineages: dict[str, Lineage] = {}
        # Per Deployment: lineages whose pod went away and that wait for its replacement.
        self._vacant: dict[str, list[Lineage]] = {}
        # Pipeline events that named a pod we had not seen yet (a feed may be behind).
        self._pending: list[tuple[float, str, str, JSON]] = []
        # Pods reported gone before we saw them (a late snapshot must not revive them).
        self._gone_uids: set[str] = set()
        # New pod uid -> the pod it replaced.
        self._replaces: dict[str, PodLife] = {}
        self.nodes: dict[str, NodeMarks] = {}
        # The pressure label as label-nodes writes it (key, value).
        self.pressure_label: tuple[str, str] = (PRESSURE_LABEL_KEY, PRESSURE_LABEL_VALUE)

    # -- queries -----------------------------------------------------------------------------

    def lineages_of(self, w: Workload) -> list[Lineage]:
        return [lin for lin in self.lineages.values() if lin.workload.name == w.name]

    def fault_of(self, node: str | None) -> str:
        return self.faults.get(node or "", HEALTHY) or HEALTHY

    def bad_nodes(self) -> set[str]:
        """Nodes labelled faulty, and any node a pod was seen failing on."""
        bad = {n for n, mode in self.faults.items() if mode != HEALTHY}
        bad.update(p.node for p in self.pods.values() if p.failing is not None and p.node)
        return bad

    # -- facts in ----------------------------------------------------------------------------

    def on_pod(self, t: float, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") != self.namespace:
            return
        uid, name = str(meta.get("uid") or ""), str(meta.get("name") or "")
        labels = meta.get("labels") or {}
        workload = self.workloads.get(str(labels.get(APP_LABEL, "")))
        if not uid or workload is None:
            return
        life = self.pods.get(uid)
        if life is None:
            if uid in self._gone_uids:
                return
            life = PodLife(uid, name, workload, created=t, kept_off=kept_off(pod))
            self.pods[uid] = life
            self._attach(life)
        self._update(t, life, pod)
        self._replay_pending()

    def on_pod_gone(self, t: float, uid: str) -> None:
        life = self.pods.get(uid)
        if life is None:
            self._gone_uids.add(uid)
            return
        if life.gone is None:
            life.gone = t
            self._vacate(life)
            if life.failing is None and life.moved is None and life.succeeded is None:
                # On the local cluster: kwok's delayed delete by name can hit the namesake that
                # replaced a StatefulSet pod. Said plainly, since it is not our doing.
                self.sink(Note(t, life.name, "info", "deleted, not by kn-rescheduler"))

    def on_failing(self, t: float, data: Mapping[str, Any], *, source: str = "") -> None:
        """detect-failures (or the sweep) said this pod fails because of its node."""
        life = self._find(data)
        if life is None:
            self._pending.append((t, "failing", source, dict(data)))
            return
        if data.get("kind") == FailureKind.EARLY:
            self._on_early(t, life, data, source)
            return
        if life.failing is not None:
            return  # the same failure, reported again (at-least-once delivery, sweeps)
        life.failing = t
        life.reason = str(data.get("reason") or "")
        life.restarts = int(data.get("restartCount") or 0)
        node = data.get("node") or life.node or "?"
        after = f" after {life.restarts} restarts" if life.restarts else ""
        self.sink(Note(t, life.name, "failing", f"failing on {node}: {life.reason}{after}", source))

    def _on_early(self, t: float, life: PodLife, data: Mapping[str, Any], source: str) -> None:
        if life.first_failure is not None or life.failing is not None:
            return
        life.first_failure = t
        node = str(data.get("node") or life.node or "?")
        restarts = int(data.get("restartCount") or 0)
        after = f" after {restarts} restart{'s' if restarts != 1 else ''}" if restarts else ""
        marks = self.nodes.get(node)
        suspect = (
            marks is not None and marks.suspected is not None and marks.suspect_cleared is None
        )
        then = (
            f"{node} is suspect: moved now (the fast path)"
            if suspect
            else f"{node} is not suspect: moved at the threshold, or sooner with evidence beside it"
        )
        text = f"first failure on {node}: {data.get('reason') or '?'}{after}; {then}"
        self.sink(Note(t, life.name, "early", text, source))

    def on_decision(
        self, t: float, data: Mapping[str, Any], *, exhausted: bool = False, source: str = ""
    ) -> None:
        """update-annotations moved the pod (``.rescheduled``) or left it (``.exhausted``)."""
        life = self._find(data)
        if life is None:
            self._pending.append((t, "exhausted" if exhausted else "moved", source, dict(data)))
            return
        if life.moved is not None or life.exhausted is not None:
            return
        if life.failing is None:  # the feed saw the decision before (or without) the failure
            self.on_failing(t, {**data, "kind": FailureKind.NODE_FIXABLE}, source=source)
        action = str(data.get("action") or "")
        moves, budget = int(data.get("moves") or 0), int(data.get("budget") or 0)
        excluded = tuple(str(n) for n in data.get("excludedNodes") or ())
        node = data.get("node") or life.node or "?"
        workload = data.get("workload") or {}
        holder = f"{workload.get('kind', '')} {workload.get('name', '')}".strip()
        of = f" of {holder}" if holder else ""
        if exhausted:
            life.exhausted = t
            text = f"not moved: all {budget} moves{of} are used; left on {node}"
            self.sink(Note(t, life.name, "exhausted", text, source))
            return
        life.moved, life.move, life.budget = t, moves, budget
        life.excluded_after = excluded
        life.exclusions_cleared = bool(data.get("exclusionsCleared"))
        if action == "clear-and-move":
            text = (
                f"unschedulable while kept off nodes: exclusions cleared and deleted "
                f"(moves stay {moves}/{budget}{of})"
            )
            self.sink(Note(t, life.name, "cleared", text, source))
        else:
            avoid = ", ".join(excluded) if excluded else "nothing (exclusions cleared)"
            text = f"deleted, move {moves}/{budget}{of}; its replacement avoids {avoid}"
            _, sooner, why = str(data.get("message") or "").partition("; before the thresholds: ")
            if sooner:
                text += f"; moved before the thresholds: {why}"
            self.sink(Note(t, life.name, "moved", text, source))
        self._vacate(life)

    def on_node_suspected(self, t: float, data: Mapping[str, Any], *, source: str = "") -> None:
        """assess-nodes' reply ``io.kn-rescheduler.node.suspected``: the node, the workloads."""
        name = str(data.get("node") or "")
        if not name:
            return
        marks = self.nodes.setdefault(name, NodeMarks(name))
        if marks.suspected is not None and marks.suspect_cleared is None:
            return  # the same suspicion, told again (at-least-once delivery)
        marks.suspected, marks.suspect_cleared = t, None
        marks.workloads = tuple(
            f"{w.get('workload', '?')} ({w.get('reason', '?')})"
            for w in data.get("workloads") or ()
            if isinstance(w, Mapping)
        )
        marks.why = str(data.get("message") or "")
        why = marks.why or "distinct workloads failed here"
        text = f"suspect: {why}: {', '.join(marks.workloads)}"
        self.sink(Note(t, name, "suspect", text, source))

    def on_node(self, t: float, node: Mapping[str, Any]) -> None:
        """A snapshot of a Node: the suspect label and taint, the pressure label, as they are."""
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name:
            return
        labels = meta.get("labels") or {}
        taints = (node.get("spec") or {}).get("taints") or []
        marks = self.nodes.get(name)
        suspect = labels.get(SUSPECT_LABEL) == SUSPECT_VALUE
        tainted = any(tn.get("key") == SUSPECT_LABEL for tn in taints)
        key, value = self.pressure_label
        pressured = labels.get(key) == value
        if marks is None:
            if not (suspect or tainted or pressured):
                return
            marks = self.nodes[name] = NodeMarks(name)
        if suspect and marks.suspect_labelled is None:
            marks.suspect_labelled = t
            effect = next(
                (str(tn.get("effect")) for tn in taints if tn.get("key") == SUSPECT_LABEL), ""
            )
            marks.suspect_tainted = t if tainted else None
            text = f"labelled {SUSPECT_LABEL}={SUSPECT_VALUE}" + (
                f" and tainted {SUSPECT_LABEL}={SUSPECT_VALUE}:{effect}" if tainted else ""
            )
            self.sink(Note(t, name, "suspect", text + ": new pods prefer other nodes"))
        if marks.suspect_labelled is not None and not suspect and marks.suspect_cleared is None:
            marks.suspect_cleared = t
            self.sink(Note(t, name, "info", f"no longer suspect: label {SUSPECT_LABEL} removed"))
        if pressured and (marks.pressure_labelled is None or marks.pressure_cleared is not None):
            marks.pressure_labelled, marks.pressure_cleared = t, None
            record = _json_object((meta.get("annotations") or {}).get(PRESSURE_ANNOTATION))
            marks.pressure_rule = str(record.get("rule") or "")
            raw_value = record.get("value")
            marks.pressure_value = float(raw_value) if isinstance(raw_value, int | float) else None
            shown = f"{marks.pressure_value:.0f}" if marks.pressure_value is not None else "?"
            text = (
                f"label-nodes labelled it {key}={value}: rule {marks.pressure_rule or '?'} "
                f"read {shown}"
            )
            self.sink(Note(t, name, "pressure", text))
        if not pressured and marks.pressure_labelled is not None and marks.pressure_cleared is None:
            marks.pressure_cleared = t
            self.sink(Note(t, name, "healthy", f"label-nodes removed its label {key}={value}"))

    def on_node_event(self, t: float, event: Mapping[str, Any]) -> None:
        """A Kubernetes Event on a Node (assess-nodes' NodeSuspected, SuspectCapReached)."""
        involved = event.get("involvedObject") or {}
        if involved.get("kind") != "Node":
            return
        name, reason = str(involved.get("name") or ""), str(event.get("reason") or "")
        message = str(event.get("message") or "")
        if reason == REASON_NODE_SUSPECTED:
            marks = self.nodes.setdefault(name, NodeMarks(name))
            if marks.event:
                return
            marks.event = message
            self.sink(Note(t, name, "suspect", f"Warning Event NodeSuspected: {message}"))
        elif reason == REASON_SUSPECT_CAP_REACHED:
            marks = self.nodes.setdefault(name, NodeMarks(name))
            if marks.why.startswith("cap: "):
                return
            marks.why = f"cap: {message}"
            self.sink(
                Note(t, name, "info", f"not marked, Warning Event SuspectCapReached: {message}")
            )

    def suspects(self) -> list[NodeMarks]:
        return [m for m in self.nodes.values() if m.suspect_labelled is not None]

    # -- internals ---------------------------------------------------------------------------

    def _find(self, data: Mapping[str, Any]) -> PodLife | None:
        if data.get("namespace") not in (None, self.namespace):
            return None
        uid = str(data.get("uid") or "")
        if uid:
            return self.pods.get(uid)
        name = str(data.get("name") or "")
        named = [p for p in self.pods.values() if p.name == name]
        return named[-1] if named else None

    def _replay_pending(self) -> None:
        pending, self._pending = self._pending, []
        for t, what, source, data in pending:
            if what == "failing":
                self.on_failing(t, data, source=source)
            else:
                self.on_decision(t, data, exhausted=what == "exhausted", source=source)

    def _attach(self, life: PodLife) -> None:
        w = life.workload
        if w.kind == "StatefulSet":
            key, label = f"{w.name}/{life.name}", life.name
        elif w.kind == "Job":
            key, label = f"{w.name}/job", w.name
        else:
            vacant = self._vacant.get(w.name) or []
            if vacant:
                self._join(vacant.pop(0), life)
                return
            n = len(self.lineages_of(w)) + 1
            key, label = f"{w.name}/{n}", f"{w.name} #{n}"
        existing = self.lineages.get(key)
        if existing is None:
            self.lineages[key] = Lineage(key, label, w, [life])
        else:
            self._join(existing, life)

    def _join(self, lineage: Lineage, life: PodLife) -> None:
        self._replaces[life.uid] = lineage.current
        lineage.pods.append(life)

    def _vacate(self, life: PodLife) -> None:
        """``life`` went away: its Deployment replica waits for the next pod."""
        if life.workload.kind != "Deployment" or life.succeeded is not None:
            return
        lineage = self._lineage_of(life)
        if lineage is None or lineage.current is not life:
            return
        vacant = self._vacant.setdefault(life.workload.name, [])
        if lineage not in vacant:
            vacant.append(lineage)

    def _lineage_of(self, life: PodLife) -> Lineage | None:
        for lineage in self.lineages.values():
            if life in lineage.pods:
                return lineage
        return None

    def _update(self, t: float, life: PodLife, pod: Mapping[str, Any]) -> None:
        node = node_of(pod)
        if node and life.node is None:
            life.node, life.scheduled = node, t
            life.fault = self._fault_at_binding(pod, node)
            self.sink(Note(t, life.name, "scheduled", self._scheduled_text(life)))
        if is_ready(pod) and life.ready is None and life.ended is None:
            life.ready = t
            self.sink(Note(t, life.name, "ready", f"Ready on {life.node}"))
        if phase(pod) == "Succeeded" and life.succeeded is None:
            life.succeeded = t
            self.sink(Note(t, life.name, "succeeded", f"completed on {life.node}"))
        if (pod.get("metadata") or {}).get("deletionTimestamp") and life.deleting is None:
            life.deleting = t
            self._vacate(life)

    def _fault_at_binding(self, pod: Mapping[str, Any], node: str) -> str:
        # The fake kubelet stamps the fate it gave the pod; until it has, the node's label.
        stamped = ((pod.get("metadata") or {}).get("annotations") or {}).get(SIM_FAULT_LABEL)
        return str(stamped) if stamped else self.fault_of(node)

    def _scheduled_text(self, life: PodLife) -> str:
        node = life.node or "?"
        text = f"scheduled on {node}"
        text += f" (faulty: {life.fault})" if life.fault != HEALTHY else " (healthy)"
        replaces = self._replaces.get(life.uid)
        if replaces is not None:
            previous = replaces
            text += (
                ", recreated under the same name"
                if previous.name == life.name
                else f", replaces {previous.name}"
            )
            went = previous.ended
            if life.workload.kind == "Job" and went is not None and life.created - went > 2:
                text += f" ({life.created - went:.0f}s later: the Job controller's back-off)"
        if life.kept_off:
            text += f"; admission kept it off {', '.join(life.kept_off)}"
        return text
