"""The fast path: a pod moves before its thresholds when what is beside it says the node is why.

The crash-loop threshold (3 restarts in a row) and the 30 s a failed pull or start must last
protect a workload from being moved for one bad run. With a real kubelet's back-off (10 s,
20 s, 40 s ...) they cost 30-45 s of a user's time, and on a node known to be broken that wait
buys nothing. Measured (dev/bench/RESULTS.md): 42 s p50 from a pod's first failure to Ready
elsewhere, 39 s of it waiting for the threshold.

So detect-failures, which has no API access, reports a pod's *first* node-fixable failure as
an early report (``kind: early``) when the full rules do not call it failing yet, and
update-annotations acts on it only with evidence beside the pod:

- **The node is suspect** (assess-nodes' label): moved at its first failure.
- **Corroborated** (`corroborated_config`: 1 restart in a row, or a pull or start failing for
  10 s, instead of 3 and 30 s), and either
  - **another workload failed on the same node within the window** (`recorded_on_node`: the
    node's health record, read with the Node) **or fails there now** (`other_workloads_failing`:
    a pod of another controller on that node, failing there for a reason another node could
    fix), or
  - **the same template runs elsewhere** (`ready_elsewhere`: a pod of the same ReplicaSet is
    Ready and proven so on another node, and none fails on another node).

A pod that crashes once and recovers is never moved: the kubelet restarts a crashed container
at once (no back-off entry yet at a first exit: pkg/kubelet/kuberuntime, doBackOff, v1.36.3,
read), so CrashLoopBackOff after 1 restart is a container
that failed twice in a row, and a container that runs after its first crash is never failing.
A failure every node would repeat (a missing Secret, an image that does not exist, an OOM kill
at the container's own limit) is no evidence and is never corroborated.

assess-nodes never counts a suspect-node move as evidence against the node: otherwise a
one-off crash on a suspect node would keep it suspect and suspicion would feed itself. A
corroborated move is counted (its reply says ``kind: node-fixable``): the pod failed twice
in a row there, with another workload failing beside it or its twin healthy elsewhere.
(Each of two workloads moved so counts, and two make the node suspect; a shared dependency
crashing both on one node, say a database starting, can do that too. The suspicion is soft, a
PreferNoSchedule taint under the cap, and expires with its window.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Final

from shared.api import nodehealth
from shared.api.keys import NODE_HEALTH_ANNOTATION, SUSPECT_LABEL, SUSPECT_VALUE
from shared.api.kubetypes import Pod
from shared.api.records import RecordError
from shared.api.workloadid import family, workload_id
from shared.platform.config import Config
from shared.workloads.classify import (
    Failure,
    FailureKind,
    classify,
    controller_of,
    crash_looping_for_at_least,
)
from shared.workloads.everywhere import Health, health_of, proof_for, recorded_elsewhere
from shared.workloads.siblings import sibling_evidence

# A pod in one of these phases never runs again (its containers are not restarted).
_TERMINAL_PHASES: Final = frozenset({"Failed", "Succeeded"})


def early_config(cfg: Config) -> Config:
    """The rules at first sight: one crash in a row, a failed pull or start at once."""
    return replace(cfg, crashloop_restart_threshold=1, waiting_failure_after=timedelta(0))


def corroborated_config(cfg: Config) -> Config:
    """The rules for a failure with evidence beside it: the corroborated thresholds, never
    looser than first sight nor stricter than the full rules."""
    return replace(
        cfg,
        crashloop_restart_threshold=min(
            cfg.corroborated_restart_threshold, cfg.crashloop_restart_threshold
        ),
        waiting_failure_after=min(cfg.corroborated_waiting_after, cfg.waiting_failure_after),
    )


def is_suspect(node: Mapping[str, Any]) -> bool:
    """Does the Node carry the suspect label assess-nodes sets?"""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(SUSPECT_LABEL) == SUSPECT_VALUE)


def killed_at_its_own_limit(pod: Pod, found: Failure) -> bool:
    """An OOM kill at the container's own memory limit: the application's doing, on any node.
    (Without a limit the full rules count it at first sight, as the node running out.)"""
    status = pod.get("status") or {}
    statuses = (
        status.get("initContainerStatuses")
        if found.init_container
        else status.get("containerStatuses")
    )
    for container in statuses or []:
        if container.get("name") != found.container:
            continue
        terminated = (container.get("state") or {}).get("terminated") or (
            container.get("lastState") or {}
        ).get("terminated")
        return bool(terminated and terminated.get("reason") == "OOMKilled")
    return False


def corroborated_failure(pod: Pod, cfg: Config, now: datetime) -> Failure | None:
    """The pod's failure by the corroborated thresholds, or None (not failing often or long
    enough, or failing in a way no node can fix)."""
    return fast_failure(pod, corroborated_config(cfg), cfg, now)


def fast_failure(pod: Pod, rules: Config, cfg: Config, now: datetime) -> Failure | None:
    """The pod's failure by a fast path's looser ``rules`` (``early_config`` on a suspect
    node, ``corroborated_config`` with evidence beside it), or None: not failing by them, not
    a failure another node could fix, or an OOM kill at its own limit, which counts only at the
    full threshold (detect-failures never reports one early; a report that claims so is judged
    here the same)."""
    found = classify(pod, rules, now)
    if found is None or found.kind is not FailureKind.NODE_FIXABLE or not found.node:
        return None
    if _only_at_first_sight(pod, found, cfg, now):
        return None
    return found


def _only_at_first_sight(pod: Pod, found: Failure, cfg: Config, now: datetime) -> bool:
    """An OOM kill at the pod's own limit counts as a crash loop only at the full threshold:
    the looser rules must not count it sooner."""
    if not killed_at_its_own_limit(pod, found):
        return False
    return classify(pod, cfg, now) is None


def recorded_on_node(
    pod: Pod, node: Mapping[str, Any] | None, cfg: Config, now: datetime
) -> tuple[str, ...]:
    """The other workloads that failed on ``pod``'s node within ``suspect_window``, as the
    node's health record says (assess-nodes writes it from the failures and moves it counts);
    sorted. None read, or a record that cannot be read: none.

    The pods beside it say what fails there *now*; the record remembers what failed there a
    moment ago and was moved away since. In a burst both matter: the first pod of two to fail
    twice sees its neighbour not yet failing, and by its next report the neighbour has been
    moved; only the record still says that the node failed it.
    """
    if node is None:
        return ()
    return others_recorded(node, family_of(pod), cfg, now)


def others_recorded(
    node: Mapping[str, Any], own: str, cfg: Config, now: datetime
) -> tuple[str, ...]:
    """The workloads other than ``own`` (a ``family``) the node's health record names within
    ``suspect_window``; sorted. A record that cannot be read: none."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(NODE_HEALTH_ANNOTATION)
    try:
        record = nodehealth.load(raw)
    except RecordError:
        return ()
    return tuple(sorted(w for w in record.workloads(now, cfg.suspect_window) if family(w) != own))


def speaks_against_itself(
    node: Mapping[str, Any], own: str, cfg: Config, now: datetime
) -> str | None:
    """Why a node read whole is evidence against itself for a workload of family ``own``:
    suspect, or its record names another workload within ``suspect_window``; None."""
    if is_suspect(node):
        return "suspect"
    others = others_recorded(node, own, cfg, now)
    if others:
        return f"{len(others)} other workload(s) failed there ({others[0]} ...)"
    return None


def family_of(pod: Mapping[str, Any]) -> str:
    """The workload a pod counts for, as assess-nodes counts failures
    (`shared.api.workloadid.family`): ``namespace/name`` of its controller with the suffix its
    controller adds taken off (both ReplicaSets of a rollout are their Deployment, a CronJob's
    Jobs the CronJob), or of the pod itself when it has none."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    owner = controller_of(pod)  # type: ignore[arg-type]
    if owner is None:
        return family(workload_id("Pod", namespace, str(meta.get("name") or "")))
    return family(workload_id(str(owner.get("kind")), namespace, str(owner.get("name"))))


def other_workloads_failing(
    pod: Pod, on_node: Iterable[Mapping[str, Any]], cfg: Config, now: datetime
) -> tuple[str, ...]:
    """The other workloads with a pod failing on ``pod``'s node now, for a reason another node
    could fix; sorted.

    ``on_node`` are the pods listed on that node (anything else is ignored). A neighbour counts
    from the first failure of its series (`sibling_evidence`), as a sibling does: the pod being
    judged has already failed in a row, and waiting for the neighbour to do the
    same is a race the first of a burst always loses. A neighbour killed at its own memory
    limit, being deleted, or of the same workload says nothing about the node.

    Nor does a terminal neighbour (phase ``Failed`` or ``Succeeded``): it is history, not a
    failure now. Kubernetes keeps such pods until the pod garbage collector's threshold
    (``--terminated-pod-gc-threshold``, 12,500 by default) or their owner removes them: an
    Evicted, ``Terminated`` (graceful node shutdown), ``OutOfcpu`` or ``NodeAffinity`` pod left
    days ago, of a workload that never opted in, would otherwise corroborate every crash on
    its node. A neighbour that failed terminally moments ago and was moved counts through the
    node's record instead (`recorded_on_node`), where assess-nodes wrote it once confirmed.
    """
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return ()
    return workloads_failing_on(str(node), family_of(pod), on_node, cfg, now)


def workloads_failing_on(
    node: str, own: str, on_node: Iterable[Mapping[str, Any]], cfg: Config, now: datetime
) -> tuple[str, ...]:
    """The workloads other than ``own`` (a ``family_of``) with a pod failing on ``node`` now,
    for a reason another node could fix, as ``other_workloads_failing`` counts them; sorted.
    Opted in or not: a node that crash-loops everyone's pods is the node's doing whoever asked
    us to watch."""
    evidence = sibling_evidence(cfg)
    found: set[str] = set()
    for candidate in on_node:
        meta = candidate.get("metadata") or {}
        if (candidate.get("spec") or {}).get("nodeName") != node or meta.get("deletionTimestamp"):
            continue
        if (candidate.get("status") or {}).get("phase") in _TERMINAL_PHASES:
            continue
        workload = family_of(candidate)
        if workload == own or workload in found:
            continue
        neighbour: Pod = candidate  # type: ignore[assignment]
        if recorded_elsewhere(neighbour, cfg, now, None):
            # Kept off other nodes where its workload failed lately (a stamp younger than
            # reset_after): its failure here may follow it (an application broken
            # everywhere), not the node.
            continue
        failure = classify(neighbour, evidence, now)
        if failure is None or failure.kind is not FailureKind.NODE_FIXABLE:
            continue
        if failure.node != node or killed_at_its_own_limit(neighbour, failure):
            continue
        if failing_since_before(neighbour, failure, cfg.suspect_window):
            # A neighbour crash-looping since before the window (a Deployment broken on
            # every node for days, never opted in, or whose moves we stopped) is no news
            # about the node: a node that broke now fails its pods from now.
            continue
        found.add(workload)
    return tuple(sorted(found))


def failing_since_before(pod: Pod, failure: Failure, window: timedelta) -> bool:
    """Whether ``pod``'s failing container has crash-looped for at least ``window`` already
    (``classify.crash_looping_for_at_least``: only a kubelet at its default maximum back-off
    says so)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if failure.container and status.get("name") != failure.container:
            continue
        lasted = crash_looping_for_at_least(status)
        if lasted is not None and lasted >= window:
            return True
    return False


def ready_elsewhere(
    pod: Pod, candidates: Iterable[Mapping[str, Any]], cfg: Config, now: datetime
) -> tuple[str, ...]:
    """The pods of ``pod``'s ReplicaSet that are Ready, and proven so (`health_of`), on
    another node: ``name on node``, sorted.

    Only a ReplicaSet's pods are twins: a StatefulSet's carry their own identity and volume,
    a Job's run to completion. A crash-looping container with no readiness probe is Ready
    between two crashes, so Ready alone proves nothing (`health_of` asks for a pod that never
    restarted or stayed Ready long after); and a twin Ready for seconds has not yet outlived
    the failing pod's own runs (`proof_for`): a rollout whose image crashes 20 s after start
    has one in every step.
    """
    owner = controller_of(pod)
    if owner is None or owner.get("kind") != "ReplicaSet" or not owner.get("uid"):
        return ()
    own_node = (pod.get("spec") or {}).get("nodeName")
    own_uid = (pod.get("metadata") or {}).get("uid")
    proof = proof_for(pod, cfg)
    found = []
    for candidate in candidates:
        meta = candidate.get("metadata") or {}
        node = (candidate.get("spec") or {}).get("nodeName")
        if not node or node == own_node or meta.get("uid") == own_uid:
            continue
        if meta.get("deletionTimestamp"):
            continue
        twin: Pod = candidate  # type: ignore[assignment]
        cowner = controller_of(twin)
        if cowner is None or cowner.get("uid") != owner.get("uid"):
            continue
        if health_of(twin, cfg, now, proof)[0] is Health.HEALTHY:
            found.append(f"{meta.get('name', '')} on {node}")
    return tuple(sorted(found))


def implicated_nodes(
    pod: Pod,
    nodes: Mapping[str, Mapping[str, Any] | None],
    cfg: Config,
    now: datetime,
    on_nodes: Mapping[str, Sequence[Mapping[str, Any]] | None] | None = None,
) -> dict[str, str]:
    """Of the nodes ``pod``'s workload failed on (``nodes``: each as read, None when it could
    not be read), those that speak against themselves rather than against the application,
    with why: suspect, another workload failed there within ``suspect_window`` (the node's
    record, `recorded_on_node`), or a pod of another workload fails there now, opted in or not
    (``on_nodes``: the pods listed on each node, None when they could not be listed). A node
    not read is in doubt, and counted here too: a stop rests only on nodes known to run other
    workloads fine."""
    found: dict[str, str] = {}
    own = family_of(pod)
    for name, node in nodes.items():
        listed = () if on_nodes is None else on_nodes.get(name)
        if node is None or listed is None:
            found[name] = "could not be read"
        elif is_suspect(node):
            found[name] = "suspect"
        elif others := recorded_on_node(pod, node, cfg, now):
            found[name] = f"{len(others)} other workload(s) failed there ({others[0]} ...)"
        elif failing := workloads_failing_on(name, own, listed, cfg, now):
            found[name] = f"{len(failing)} other workload(s) fail there now ({failing[0]} ...)"
    return found
