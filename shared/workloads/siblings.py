"""Where else a workload is failing now: the nodes a move records besides its own.

When several nodes fail one workload at once (its pods prefer them, or they were simply
placed there), the first move used to record only its own node. Its replacement was admitted
with that one exclusion and the scheduler, free to use the other faulty nodes, often picked
one of them (the same preference, or an emptied node scoring best): one more failure, one
more move, one more trip to the crash-loop threshold. So when update-annotations records a
move of a pod whose budget is the workload's (a ReplicaSet's, a Job's), it lists the pods of
the same controller once and `shared.workloads.state.plan` excludes, without charging a move,
every other node where one of them is failing now.

What counts is what detect-failures would call a node failure (`classify`, kind
node-fixable), with one difference: a sibling need not have repeated its failure as often or as
long. Those thresholds (`crashloop_restart_threshold` restarts in a row,
`waiting_failure_after` of failed pulls or starts) keep one crash from costing a move; a
sibling's node costs no move, and the pod being moved has just crossed them, so the workload is
failing in earnest. Waiting for the siblings to cross them too is what loses the race: the
first pod crosses the threshold a moment before the pods on the other faulty node do, and its
replacement is admitted in that moment. Measured on the local control plane with 12 replicas
on two crash-looping nodes: with the thresholds kept, 2 of 3 runs still wasted a move (the
first move found every pod on the other node one restart short). So a sibling counts from the
first failure of its current series: its first run just ended in an error (the kubelet writes
``state.terminated`` with restartCount 0 and restarts it at its next sync), in CrashLoopBackOff
(or OOM-killed) now, or waiting with a failed pull or start. The first crash counts because a
burst's pods are not created at once: a ReplicaSet's first pods come in slow-start batches
(1, 2, 4, ... in `slowStartBatch`, pkg/controller/replicaset), each waiting for the last
batch's creates and their admission, so the first pod on the other faulty node can start a
few hundred milliseconds after the moving pod, and be one crash short of a restart when the
moving pod crosses its threshold. Counted only from its first restart, a sibling lost that race
on a busy machine: in CI the first replacement went to the second faulty node. A first run
killed at its own memory limit is not counted: one such kill is the application's doing (see
`classify`). Everything else still says nothing about its node: a pod failing for a reason
no node can fix (a missing Secret, an image that does not exist), a pod running again, being
deleted or opted out, and a pod whose own move would not record its node (its container ran
longer than reset-after before it failed, see `shared.workloads.state`). A pod on the failing
pod's own node adds nothing.

StatefulSets are left out: their exclusions are kept per pod name (web-0 failing on a node says
nothing about where web-1, with its own volume and identity, may run), so a sibling's node is
recorded when that sibling moves. A bare pod has no siblings.

The list is narrowed by the failing pod's labels (the controller's template labels, with
`pod-template-hash` or the Job's `controller-uid`); siblings are then only the pods whose
controller reference has the failing pod's controller uid. Labels a controller sets per pod
are left out of the selector: an Indexed Job's `batch.kubernetes.io/job-completion-index`
differs on every index, and kept in it would find only the retries of the same index.

This module decides (pure); update-annotations lists the candidates, once per move.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final

from shared.api.kubetypes import Pod
from shared.platform.config import Config
from shared.workloads.classify import (
    CRASH_LOOP_BACK_OFF,
    Failure,
    FailureKind,
    classify,
    controller_of,
)

# The Job controller labels (and annotates) each pod of an Indexed Job with its completion
# index (addCompletionIndexLabel in pkg/controller/job): the one label that differs between
# pods of the same controller.
JOB_COMPLETION_INDEX_LABEL: Final = "batch.kubernetes.io/job-completion-index"
# The StatefulSet controller's per-pod labels (updateIdentity, pkg/controller/statefulset).
_PER_POD_LABELS: Final = frozenset(
    {
        JOB_COMPLETION_INDEX_LABEL,
        "statefulset.kubernetes.io/pod-name",
        "apps.kubernetes.io/pod-index",
    }
)
# Labels that say where a pod runs, not whose it is: the API server's PodTopologyLabels
# admission (KEP-4742, beta and on by default since 1.35) copies the Node's
# topology.kubernetes.io/zone and /region onto the pod at binding, and cluster policies
# (kyverno's add-node-labels-pod, node2pod) copy the same. Two replicas in two zones differ in
# them: selected on, each would see no sibling, and the moves-stop rule no witness. The
# plugin's package documentation names topology.k8s.io/ keys: left out as well.
PER_NODE_PREFIXES: Final = ("topology.kubernetes.io/", "topology.k8s.io/")
# Labels only the controller sets, the same on every pod of it and on no other: enough on their
# own, and immune to whatever else is added per pod (the candidates are checked against the
# controller's uid anyway). The Deployment controller's ReplicaSet hash; the Job controller's uid.
_CONTROLLER_LABELS: Final = ("batch.kubernetes.io/controller-uid", "pod-template-hash")


def sibling_evidence(cfg: Config) -> Config:
    """The classifier's settings for a sibling: the first failure of a series counts (see the
    module docstring); every other rule is the configured one."""
    return replace(cfg, crashloop_restart_threshold=1, waiting_failure_after=timedelta(0))


@dataclass(frozen=True)
class FailingSibling:
    """Another pod of the same controller, failing now on another node."""

    name: str
    node: str
    reason: str


def sibling_selector(pod: Mapping[str, Any]) -> str | None:
    """A label selector for the pods of the same controller: a label only the controller sets
    when the pod has one, else the pod's labels without the ones set per pod or per node. None
    when nothing is left to select on."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    for key in _CONTROLLER_LABELS:
        if labels.get(key):
            return f"{key}={labels[key]}"
    shared = sorted(
        (k, v)
        for k, v in labels.items()
        if k not in _PER_POD_LABELS and not k.startswith(PER_NODE_PREFIXES)
    )
    if not shared:
        return None
    return ",".join(f"{key}={value}" for key, value in shared)


def failing_siblings(
    pod: Pod,
    candidates: Iterable[Mapping[str, Any]],
    cfg: Config,
    now: datetime,
    *,
    reset_after: timedelta,
) -> tuple[FailingSibling, ...]:
    """The other pods of ``pod``'s controller that are failing now, on a node other than
    ``pod``'s, for a reason another node could fix; ordered by node, then name.

    ``candidates`` are the pods listed by `sibling_selector` (anything else is ignored);
    ``cfg`` is the functions' configuration (judged with `sibling_evidence`); ``reset_after``
    is the workload's (a failure after a longer run records no node).
    """
    meta = pod.get("metadata") or {}
    owner = controller_of(pod)
    owner_uid = owner.get("uid") if owner else None
    if not owner_uid:
        return ()
    own_uid, own_node = meta.get("uid"), (pod.get("spec") or {}).get("nodeName")
    evidence = sibling_evidence(cfg)
    found = []
    for candidate in candidates:
        cmeta = candidate.get("metadata") or {}
        node = (candidate.get("spec") or {}).get("nodeName")
        if not node or node == own_node or cmeta.get("uid") == own_uid:
            continue
        if cmeta.get("deletionTimestamp"):
            continue  # already going: its move (or a person's delete) is under way
        sibling: Pod = candidate  # type: ignore[assignment]
        cowner = controller_of(sibling)
        if cowner is None or cowner.get("uid") != owner_uid:
            continue
        failure = classify(sibling, evidence, now) or _first_crash(sibling, evidence, now)
        if failure is None or failure.kind is not FailureKind.NODE_FIXABLE or not failure.node:
            continue
        ran = failure.ran_for_seconds
        if ran is not None and timedelta(seconds=ran) > reset_after:
            continue
        found.append(FailingSibling(str(cmeta.get("name", "")), failure.node, failure.reason))
    return tuple(sorted(found, key=lambda s: (s.node, s.name)))


def _first_crash(pod: Pod, evidence: Config, now: datetime) -> Failure | None:
    """The failure of a container whose first run just ended in an error, before the kubelet
    restarted it: what the classifier says with no restart required, kept only when it is a
    crash with restartCount 0 (not an OOM kill, which needs repeating, see `classify`)."""
    failure = classify(pod, replace(evidence, crashloop_restart_threshold=0), now)
    if failure is None or failure.restart_count != 0 or failure.reason != CRASH_LOOP_BACK_OFF:
        return None
    return failure


def nodes_of(siblings: Iterable[FailingSibling]) -> tuple[str, ...]:
    """The distinct nodes of ``siblings``, in their order."""
    return tuple(dict.fromkeys(s.node for s in siblings))
