"""``status TYPE/NAME``: a workload's budget, the nodes it is kept off and why, a stop, its pods
and the last Events of ours, across a Deployment's ReplicaSets.

The state lives on the pod's controller (a ReplicaSet, not the Deployment: a rollout starts
afresh), so a Deployment's answer is one block per ReplicaSet that has pods or a record. The
budget is the functions' own ``Policy.budget`` (retries per replica for a ReplicaSet, per pod
for a StatefulSet and a Job); the record is read with their own parser, and one they would
refuse is shown as refused, with their reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from kubectl_kn_rescheduler.reading import RULES, OurEvent, UsageError, ago, our_events, section
from shared.api.avoidnodes import ANNOTATION as AVOID_NODES_ANNOTATION
from shared.api.keys import ADMISSION_PARAM_LABEL, POLICY_ANNOTATION, STATE_ANNOTATION
from shared.api.state import StateError, WorkloadState, load_state
from shared.api.times import format_time
from shared.platform import kube
from shared.platform.config import Config
from shared.workloads.classify import excluded_nodes_of
from shared.workloads.owners import resolve
from shared.workloads.policy import InvalidPolicy, OwnerKind, Policy, parse_retries
from shared.workloads.state import foreign_copy

REVISION: Final = "deployment.kubernetes.io/revision"
# The section of docs/failure-rules.md on the stop.
STOP: Final = "A workload that fails the same way everywhere (moves stop)"
# The last Events shown; `kubectl get events` has the rest.
EVENTS_SHOWN: Final = 10


@dataclass(frozen=True)
class PodLine:
    name: str
    node: str
    phase: str
    ready: bool
    kept_off: tuple[str, ...]


@dataclass(frozen=True)
class HolderStatus:
    """One object that holds (or may hold) a state: a ReplicaSet, StatefulSet, Job, bare pod."""

    kind: str
    name: str
    role: str
    replicas: int | None
    state: WorkloadState | None
    # Why the functions would refuse the record, or ignore it as another object's copy.
    refused: str = ""
    avoid_nodes: str | None = None
    param: bool = False


@dataclass(frozen=True)
class WorkloadStatus:
    kind: str
    namespace: str
    name: str
    policy_on: str
    policy: int | InvalidPolicy | None
    holders: tuple[HolderStatus, ...]
    pods: tuple[PodLine, ...]
    events: tuple[OurEvent, ...]
    # Why this workload answers for what was asked (a pod of it), or "".
    note: str = ""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _controller_uid(obj: Mapping[str, Any]) -> str:
    for ref in _meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid", ""))
    return ""


def holder_status(kind: str, obj: Mapping[str, Any], role: str) -> HolderStatus:
    """The record on one holder as the functions read it (pure)."""
    meta = _meta(obj)
    annotations = meta.get("annotations") or {}
    replicas = (obj.get("spec") or {}).get("replicas")
    raw = annotations.get(STATE_ANNOTATION)
    state: WorkloadState | None = None
    refused = ""
    if raw is not None:
        try:
            state = load_state(raw)
        except StateError as exc:
            refused = (
                f"the functions refuse this record, and leave the workload's pods alone: {exc}"
            )
        else:
            copy = foreign_copy(state, kind, str(meta.get("uid", "")))
            if copy:
                refused = f"ignored: {copy}"
    return HolderStatus(
        kind=kind,
        name=str(meta.get("name", "")),
        role=role,
        replicas=replicas if isinstance(replicas, int) and kind != "Pod" else None,
        state=state,
        refused=refused,
        avoid_nodes=annotations.get(AVOID_NODES_ANNOTATION),
        param=ADMISSION_PARAM_LABEL in (meta.get("labels") or {}),
    )


def pod_line(pod: Mapping[str, Any]) -> PodLine:
    meta = _meta(pod)
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return PodLine(
        name=str(meta.get("name", "")),
        node=str((pod.get("spec") or {}).get("nodeName") or "(not scheduled)"),
        phase=str(status.get("phase", "")),
        ready=ready,
        # The functions' own reader: a stamp that is not a list of names counts as none.
        kept_off=excluded_nodes_of(pod),  # type: ignore[arg-type]
    )


def _revision(obj: Mapping[str, Any]) -> int:
    """The Deployment controller's revision number of a ReplicaSet; -1 when unreadable (anyone
    may annotate a ReplicaSet)."""
    raw = (_meta(obj).get("annotations") or {}).get(REVISION, "")
    return int(raw) if isinstance(raw, str) and raw.isdigit() and len(raw) < 19 else -1


def _controller(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in _meta(obj).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


def _policy(
    api: kube.Kube, namespace: str, kind: str, obj: Mapping[str, Any]
) -> tuple[str | None, str]:
    """The ``scheduling-retries`` in force for ``obj``'s pods and where it is, as the functions
    resolve it (``shared.workloads.owners.resolve``: the holder, then a ReplicaSet's Deployment
    or a Job's CronJob); a bare pod's is its own."""
    meta = _meta(obj)
    if kind == "Pod":
        own = (meta.get("annotations") or {}).get(POLICY_ANNOTATION)
        return own, (f"Pod {meta.get('name')}" if own is not None else "")
    # A pod of this holder, as its controller reference names it: the functions' own path.
    child = {
        "metadata": {
            "name": "status",
            "namespace": namespace,
            "ownerReferences": [
                {
                    "kind": kind,
                    "name": meta.get("name"),
                    "uid": meta.get("uid"),
                    "apiVersion": obj.get("apiVersion", ""),
                    "controller": True,
                }
            ],
        }
    }
    try:
        found = resolve(api, namespace, child)
    except kube.NotFound:
        return None, ""
    ref = found.policy_ref
    return found.policy, (f"{ref.kind} {ref.name}" if ref is not None else "")


def gather(
    api: kube.Kube, kind: str, namespace: str, name: str, cfg: Config | None = None
) -> WorkloadStatus:
    """Read the workload, its holders, their pods and our Events (GETs and LISTs only).

    A pod with a controller is answered for its workload (a Deployment's pod for the
    Deployment): its state is on the controller.
    """
    cfg = cfg or Config()
    try:
        top = api.get(kind, namespace, name)
    except kube.NotFound as exc:
        raise UsageError(f"{kind} {namespace}/{name} not found") from exc
    note = ""
    if kind == "Pod" and (owner := _controller(top)) is not None:
        note = f"pod {name} belongs to {owner.get('kind')} {owner.get('name')}"
        kind, name = str(owner.get("kind", "")), str(owner.get("name", ""))
        if kind not in ("ReplicaSet", "StatefulSet", "Job"):
            raise UsageError(f"{note}, whose pods kn-rescheduler never moves")
        try:
            top = api.get(kind, namespace, name)
        except kube.NotFound as exc:
            raise UsageError(f"{note}, which is gone") from exc
        parent = _controller(top) if kind == "ReplicaSet" else None
        if parent is not None and parent.get("kind") == "Deployment":
            kind, name = "Deployment", str(parent.get("name", ""))
            top = api.get(kind, namespace, name)
    top_meta = _meta(top)
    holder_objs: list[tuple[str, Mapping[str, Any], str]] = []
    if kind == "Deployment":
        current = _revision(top)
        owned = [
            rs
            for rs in api.list_all("ReplicaSet", namespace)
            if _controller_uid(rs) == top_meta.get("uid")
        ]
        owned.sort(key=lambda rs: -_revision(rs))
        for rs in owned:
            revision = _revision(rs)
            role = "current" if revision == current >= 0 else "old"
            holder_objs.append(("ReplicaSet", rs, f"{role}, revision {revision}"))
    else:
        holder_objs.append((kind, top, "bare pod" if kind == "Pod" else ""))
    policy_raw, policy_on = (
        _policy(api, namespace, holder_objs[0][0], holder_objs[0][1])
        if holder_objs
        else ((top_meta.get("annotations") or {}).get(POLICY_ANNOTATION), f"{kind} {name}")
    )
    holder_uids = {str(_meta(o).get("uid")) for _, o, _ in holder_objs}
    if kind == "Pod":
        pods = [top]
    else:
        pods = [p for p in api.list_all("Pod", namespace) if _controller_uid(p) in holder_uids]
    holders = []
    for holder_kind, obj, role in holder_objs:
        status = holder_status(holder_kind, obj, role)
        has_pods = any(_controller_uid(p) == _meta(obj).get("uid") for p in pods)
        # An old ReplicaSet with neither pods nor a record says nothing: a Deployment keeps ten.
        if kind != "Deployment" or has_pods or status.state is not None or status.refused:
            holders.append(status)
    # Our Events about these objects by uid: the workload, its holders, their live pods and the
    # pods their records say were moved (a name is no proof: another workload's pods may share
    # its prefix).
    known = {str(top_meta.get("uid"))} | holder_uids
    known |= {str(_meta(p).get("uid")) for p in pods}
    for holder in holders:
        if holder.state is not None:
            known |= set(holder.state.handled)
    mine = [e for e in our_events(api.list_all("Event", namespace)) if e.uid and e.uid in known]
    return WorkloadStatus(
        kind=kind,
        namespace=namespace,
        name=name,
        policy_on=policy_on,
        policy=parse_retries(policy_raw, cfg.max_retries) if policy_raw is not None else None,
        holders=tuple(holders),
        pods=tuple(sorted((pod_line(p) for p in pods), key=lambda p: p.name)),
        events=tuple(mine[-EVENTS_SHOWN:]),
        note=note,
    )


def _budget(policy: int | InvalidPolicy | None, holder: HolderStatus) -> Policy | None:
    if not isinstance(policy, int):
        return None
    kind = OwnerKind(holder.kind) if holder.kind in OwnerKind.__members__.values() else None
    if kind is None:
        return None
    return Policy(policy, kind, replicas=holder.replicas or 1)


def render(status: WorkloadStatus, now: datetime) -> list[str]:
    """The status in sentences (pure)."""
    out = [f"{status.kind} {status.namespace}/{status.name}"]
    if status.note:
        out.append(f"  ({status.note})")
    policy = status.policy
    if policy is None:
        out.append(
            f"  not opted in: no {POLICY_ANNOTATION} annotation on it; kn-rescheduler moves none "
            "of its pods"
        )
    elif isinstance(policy, InvalidPolicy):
        out.append(f"  {POLICY_ANNOTATION}: refused, {policy.reason}; its pods are left alone")
    elif policy == 0:
        out.append(f'  {POLICY_ANNOTATION}: "0", moves turned off')
    else:
        out.append(f'  {POLICY_ANNOTATION}: "{policy}" (on {status.policy_on})')
    for holder in status.holders:
        out.extend(_holder_lines(holder, policy, now))
    out.append("  pods:" if status.pods else "  pods: none")
    for pod in status.pods:
        kept = f", kept off {', '.join(pod.kept_off)}" if pod.kept_off else ""
        ready = "ready" if pod.ready else "not ready"
        out.append(f"    {pod.name} on {pod.node}: {pod.phase}, {ready}{kept}")
    out.append(
        "  events of kn-rescheduler:" if status.events else "  events of kn-rescheduler: none"
    )
    for event in status.events:
        times = f" (x{event.count})" if event.count > 1 else ""
        out.append(
            f"    {ago(event.at, now)} {event.type} {event.reason} {event.kind}/{event.name}"
            f"{times}: {event.message}"
        )
    return out


def _holder_lines(
    holder: HolderStatus, policy: int | InvalidPolicy | None, now: datetime
) -> list[str]:
    if holder.kind == "Pod":
        head = "  the pod's own record"
    else:
        count = holder.replicas
        parts = [holder.role] if holder.role else []
        if count is not None:
            parts.append(f"{count} replica{'' if count == 1 else 's'}")
        head = f"  {holder.kind} {holder.name}" + (f" ({', '.join(parts)})" if parts else "")
    if holder.refused:
        return [f"{head}: {holder.refused}"]
    state = holder.state
    if state is None:
        return [f"{head}: nothing recorded, no move yet"]
    lines = [head + ":"]
    budget = _budget(policy, holder)
    if holder.kind == "StatefulSet":
        lines.append(f"    moves: {state.moves} in all; the budget is per pod")
        for pod_name, entry in state.per_pod.items():
            of = f" of {budget.budget}" if budget else ""
            kept = f", kept off {', '.join(entry.excluded_nodes)}" if entry.excluded_nodes else ""
            spent = ", budget spent" if entry.exhausted_recorded else ""
            lines.append(f"    {pod_name}: {entry.moves}{of} moves{kept}{spent}")
    else:
        of = f" of {budget.budget}" if budget else ""
        per = (
            f" ({policy} per replica)"
            if budget and holder.kind == "ReplicaSet" and (holder.replicas or 1) > 1
            else ""
        )
        spent = ", budget spent (RetriesExhausted said)" if state.exhausted_recorded else ""
        lines.append(f"    moves: {state.moves}{of} used{per}{spent}")
        if state.excluded_nodes:
            lines.append("    kept off:")
            for node in state.excluded_nodes:
                why = state.failed_on.get(node)
                lines.append(f"      {node}" + (f": failed there with {why}" if why else ""))
        else:
            lines.append("    kept off: no node")
    if state.stopped is not None:
        stop = state.stopped
        lines.append(
            f"    moves stopped {ago(stop.at, now)}: it failed with {stop.reason} on "
            f"{', '.join(stop.nodes)}; no move until a pod of it is healthy or its template "
            f"changes ({section(RULES, STOP)})"
        )
    if state.updated_at is not None:
        lines.append(
            f"    recorded: {format_time(state.updated_at)} ({ago(state.updated_at, now)})"
        )
    if holder.param:
        lines.append("    admission policies: a param (kn-rescheduler.io/admission-param)")
    return lines


def as_json(status: WorkloadStatus) -> dict[str, Any]:
    def state_json(state: WorkloadState | None) -> dict[str, Any] | None:
        if state is None:
            return None
        return {
            "moves": state.moves,
            "excludedNodes": list(state.excluded_nodes),
            "failedOn": dict(state.failed_on),
            "exhausted": state.exhausted_recorded,
            "stopped": None
            if state.stopped is None
            else {
                "reason": state.stopped.reason,
                "nodes": list(state.stopped.nodes),
                "at": format_time(state.stopped.at) if state.stopped.at else None,
            },
            "pods": {
                name: {"moves": e.moves, "excludedNodes": list(e.excluded_nodes)}
                for name, e in state.per_pod.items()
            },
            "updatedAt": format_time(state.updated_at) if state.updated_at else None,
        }

    policy = status.policy
    return {
        "kind": status.kind,
        "namespace": status.namespace,
        "name": status.name,
        "policy": policy.value if isinstance(policy, InvalidPolicy) else policy,
        "policyRefused": policy.reason if isinstance(policy, InvalidPolicy) else None,
        "policyOn": status.policy_on or None,
        "note": status.note or None,
        "holders": [
            {
                "kind": h.kind,
                "name": h.name,
                "role": h.role,
                "replicas": h.replicas,
                "budget": b.budget if (b := _budget(policy, h)) else None,
                "state": state_json(h.state),
                "refused": h.refused or None,
                "avoidNodes": h.avoid_nodes,
                "admissionParam": h.param,
            }
            for h in status.holders
        ],
        "pods": [
            {
                "name": p.name,
                "node": p.node,
                "phase": p.phase,
                "ready": p.ready,
                "keptOff": list(p.kept_off),
            }
            for p in status.pods
        ],
        "events": [e.as_json() for e in status.events],
    }
