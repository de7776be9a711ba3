"""``cleanup``: remove every mark kn-rescheduler wrote, after its manifests are deleted.

Deleting the manifests (``helm uninstall``, ``kubectl delete -k``) stops the functions; it does
not take back what they wrote on objects that are not theirs: the suspect taint
(PreferNoSchedule) and labels that steer the scheduler away from nodes, the pressure label the
admission affinities and users' manifests read, usage records, and the state on workloads.
``kubectl kn-rescheduler cleanup`` lists them, ``--dry-run=server`` has the API server validate
the removals, and ``--yes`` removes them (``make cleanup``), and only them:

- Nodes: the labels ``kn-rescheduler.io/suspect``, ``failing-workloads``, ``moved-off`` and
  ``load``; the annotations ``node-health``, ``pressure``, ``usage`` and ``hot-streak``; the taint
  ``kn-rescheduler.io/suspect=true:PreferNoSchedule``. The pressure label (``status=presure``)
  only with our value and where our readable ``pressure`` record says label-nodes put it there
  (its ``since``), as label-nodes itself decides (``hands_off``): the same key with another
  value, or beside a record that says nothing of it, is someone else's and stays. Never
  ``kn-rescheduler.io/maintenance`` or ``ignore``: people set those.
- Deployments, ReplicaSets, StatefulSets, Jobs and bare pods: the annotations
  ``kn-rescheduler.io/state`` (on a bare pod's replacement, where update-annotations carried
  it) and ``kn-rescheduler.io/avoid-nodes`` (its exclusions, flat, for the admission
  policies), and the label ``kn-rescheduler.io/admission-param`` (the admission policies' param
  label).

Pods keep what admission stamped on them: a pod's affinity cannot change, and the pods go
with their next rollout. Every write is a JSON merge patch of those keys alone, with the
resourceVersion it was read at (a conflict is read again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.api.avoidnodes import ANNOTATION as AVOID_NODES_ANNOTATION
from shared.api.keys import (
    ADMISSION_PARAM_LABEL,
    FAILING_WORKLOADS_LABEL,
    HOT_STREAK_ANNOTATION,
    LOAD_LABEL,
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    PRESSURE_ANNOTATION,
    PRESSURE_LABEL_KEY,
    PRESSURE_LABEL_VALUE,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
    SUSPECT_TAINT_EFFECT,
    USAGE_ANNOTATION,
)
from shared.api.pressure import Record as PressureRecord
from shared.api.records import RecordError
from shared.nodes.assess_nodes.decide import is_our_taint
from shared.platform import kube
from shared.platform.kube import Kube

NODE_LABELS = (SUSPECT_LABEL, FAILING_WORKLOADS_LABEL, MOVED_OFF_LABEL, LOAD_LABEL)
NODE_ANNOTATIONS = (
    NODE_HEALTH_ANNOTATION,
    PRESSURE_ANNOTATION,
    USAGE_ANNOTATION,
    HOT_STREAK_ANNOTATION,
)
WORKLOAD_KINDS = ("Deployment", "ReplicaSet", "StatefulSet", "Job", "Pod")
# The kinds the admission policies make their params, with ADMISSION_PARAM_LABEL.
PARAM_KINDS = frozenset({"ReplicaSet", "StatefulSet", "Job"})
# label-nodes' label as KN_RESCHEDULER_PRESSURE_LABEL sets it: KEY=VALUE.
PRESSURE_LABEL = f"{PRESSURE_LABEL_KEY}={PRESSURE_LABEL_VALUE}"
ATTEMPTS = 5


@dataclass(frozen=True)
class Cleanup:
    """One object's patch and the keys it removes (for the report)."""

    kind: str
    namespace: str | None
    name: str
    patch: dict[str, Any]
    removed: tuple[str, ...]


def _our_pressure_label(
    labels: Mapping[str, str], annotations: Mapping[str, str], pressure_label: str | None
) -> str | None:
    """The pressure label's key when label-nodes put the label there, else None (and None
    when which label label-nodes writes is not known: the record does not name it)."""
    if pressure_label is None:
        return None
    key, _, value = pressure_label.partition("=")
    if labels.get(key) != value or PRESSURE_ANNOTATION not in annotations:
        return None
    try:
        record = PressureRecord.from_json(annotations[PRESSURE_ANNOTATION])
    except RecordError:
        return None
    return key if record.since is not None else None


def node_cleanup(
    node: Mapping[str, Any], pressure_label: str | None = PRESSURE_LABEL
) -> Cleanup | None:
    """The patch taking our marks off a Node, or None when it carries none (pure). None too
    for an object with no resourceVersion (the API always gives one): a patch without it would
    be unconditional, and would replace a taint list someone changed meanwhile."""
    meta = node.get("metadata") or {}
    if not meta.get("resourceVersion"):
        return None
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    taints = (node.get("spec") or {}).get("taints") or []
    gone_labels = [k for k in NODE_LABELS if k in labels]
    # Ours only with our value and label-nodes' record of putting it there (its hands_off).
    pressure_key = _our_pressure_label(labels, annotations, pressure_label)
    if pressure_key is not None:
        gone_labels.append(pressure_key)
    gone_annotations = [k for k in NODE_ANNOTATIONS if k in annotations]
    kept_taints = [t for t in taints if not is_our_taint(t)]
    metadata: dict[str, Any] = {}
    if gone_labels:
        metadata["labels"] = dict.fromkeys(gone_labels)
    if gone_annotations:
        metadata["annotations"] = dict.fromkeys(gone_annotations)
    patch: dict[str, Any] = {}
    removed = [f"label {k}={labels[k]}" for k in gone_labels]
    removed += [f"annotation {k}" for k in gone_annotations]
    if len(kept_taints) != len(taints):
        # A merge patch replaces the whole list: the resourceVersion below keeps a taint the
        # node lifecycle controller adds meanwhile from being dropped (a conflict, read again).
        patch["spec"] = {"taints": kept_taints}
        removed.append(f"taint {SUSPECT_LABEL}:{SUSPECT_TAINT_EFFECT}")
    if not metadata and "spec" not in patch:
        return None
    metadata["resourceVersion"] = meta["resourceVersion"]
    patch["metadata"] = metadata
    return Cleanup("Node", None, str(meta.get("name", "")), patch, tuple(removed))


def workload_cleanup(kind: str, obj: Mapping[str, Any]) -> Cleanup | None:
    """The patch taking our state and marks off a workload, or None when it has none, or no
    resourceVersion (pure)."""
    meta = obj.get("metadata") or {}
    if not meta.get("resourceVersion"):
        return None
    annotations = meta.get("annotations") or {}
    ours = [k for k in (STATE_ANNOTATION, AVOID_NODES_ANNOTATION) if k in annotations]
    # The admission policies label only the kinds that create pods from a template of their
    # own (shared/admission/policies.py): the label on a Deployment or a Pod is someone else's.
    labelled = kind in PARAM_KINDS and ADMISSION_PARAM_LABEL in (meta.get("labels") or {})
    if not ours and not labelled:
        return None
    metadata: dict[str, Any] = {"resourceVersion": meta["resourceVersion"]}
    if ours:
        metadata["annotations"] = dict.fromkeys(ours)
    if labelled:
        metadata["labels"] = {ADMISSION_PARAM_LABEL: None}
    removed = tuple(f"annotation {key}" for key in ours)
    removed += (f"label {ADMISSION_PARAM_LABEL}",) if labelled else ()
    return Cleanup(
        kind, meta.get("namespace"), str(meta.get("name", "")), {"metadata": metadata}, removed
    )


def _apply(
    api: Kube, kind: str, namespace: str | None, name: str, pressure_label: str | None
) -> str:
    """Clean one object, reading it again on a conflict. The outcome, for the report."""
    for _ in range(ATTEMPTS):
        try:
            obj = api.get(kind, namespace, name)
        except kube.NotFound:
            return "gone"
        plan = node_cleanup(obj, pressure_label) if kind == "Node" else workload_cleanup(kind, obj)
        if plan is None:
            return "clean"
        try:
            api.merge_patch(kind, namespace, name, plan.patch)
        except kube.NotFound:
            return "gone"
        except kube.Conflict:
            continue
        return "removed " + ", ".join(plan.removed)
    return f"still changing after {ATTEMPTS} attempts: run again"


def clean(api: Kube, *, pressure_label: str | None = PRESSURE_LABEL) -> list[str]:
    """Every mark of ours off every Node and workload; one line per object that had one."""
    report = []
    for node in api.list_all("Node"):
        if node_cleanup(node, pressure_label) is not None:
            name = node["metadata"]["name"]
            report.append(f"Node {name}: {_apply(api, 'Node', None, name, pressure_label)}")
    for kind in WORKLOAD_KINDS:
        for obj in api.list_all(kind):
            if workload_cleanup(kind, obj) is not None:
                meta = obj["metadata"]
                outcome = _apply(api, kind, meta["namespace"], meta["name"], pressure_label)
                report.append(f"{kind} {meta['namespace']}/{meta['name']}: {outcome}")
    return report


def plans(api: Kube, *, pressure_label: str | None = PRESSURE_LABEL) -> list[Cleanup]:
    """What a cleanup would remove, read and planned, nothing sent (the listing)."""
    found = [
        plan
        for node in api.list_all("Node")
        if (plan := node_cleanup(node, pressure_label)) is not None
    ]
    for kind in WORKLOAD_KINDS:
        found += [
            plan for obj in api.list_all(kind) if (plan := workload_cleanup(kind, obj)) is not None
        ]
    return found


def listed(plan: Cleanup) -> str:
    where = f"{plan.namespace}/{plan.name}" if plan.namespace else plan.name
    return f"{plan.kind} {where}: would remove {', '.join(plan.removed)}"
