"""When moving cannot help: a workload that fails the same way wherever it runs.

A move is worth its cost when another node would fix the failure. When the same workload has
failed the same way (the same reason: CrashLoopBackOff, OOMKilled, ...) on several distinct
nodes and none of its pods is healthy anywhere, the application is broken, or the whole
cluster is: another move only restarts a pod somewhere else, spends the budget, and piles
failures onto healthy nodes (enough of them and node-health marks one suspect). Measured on
the local control plane before this rule: a Deployment of 2 replicas with
``scheduling-retries: "3"``, crash-looping on every node, was moved 9 times across one rollout
restart. So update-annotations stops: nothing is charged, no pod is deleted, one Warning Event
says why, and moves resume when a pod of the workload is healthy somewhere (a node fixed it
after all, or the application recovered) or its template changes (a Deployment's new
ReplicaSet is a new holder with a state of its own).

The evidence, and why each part:

- **Same reason on distinct nodes, recorded by moves, seen by a replacement.** The holder's
  state keeps, for each node a move of the workload was charged for, the failure that moved it
  (``shared.workloads.state``); what counts are the recorded nodes the failing pod was kept
  off (the webhook's excluded-nodes stamp on it) and its own node: a replacement that avoided
  them and failed the same way again. A pod placed before those moves proves nothing (twenty
  replicas pinned to two bad nodes are each moved once). A sibling failing now counts as a
  witness below, not as a recorded node: it was judged on its first failure
  (``shared.workloads.siblings``), and two bad nodes out of many must not stop a workload
  before a single move was tried. So a stop always needs at least one move whose replacement
  failed the same way elsewhere.
- **Two nodes when other pods witness it, three when the workload has one pod.** With other
  pods of the controller all failing too, the failure was seen by several pods, on several
  nodes. A workload of one pod is one lineage: the same pod failing on two nodes in a row may
  simply have met two bad nodes (nodes of one broken pool, the same bad image mirror), and
  stopping there leaves the only replica down where a third node might have fixed it. A third
  node costs one more restart; stopping too early costs an outage. So a lone pod needs three.
- **None healthy anywhere.** Every other pod of the controller, listed with the one LIST the
  move already makes, must have failed in its current life. A pod that is Ready, never
  restarted, or Ready for ``crashloop_recent_run`` after its restarts, or that completed (a
  Job's), is healthy: another node demonstrably fixed the failure, never stop. A pod that has
  not failed yet (Pending, starting, running without a restart) is not healthy either: with a
  replacement's failure as evidence, waiting for it would never stop a workload whose pods
  fail in lockstep (each lineage's replacement is just starting when the other fails; measured
  in the soak: the whole budget spent). A stop it did not deserve lasts until that pod turns
  Ready, which lifts it at the next failure. A pod whose containers restarted and is not Ready
  for that long has failed: a crash-looping container is Ready for the seconds between two
  crashes when it has no readiness probe, so Ready alone says nothing about it. A pod being
  deleted, and a pod that ended Failed (a Job keeps those, the pods we moved among them), say
  nothing. A pod Ready that never restarted is healthy only once it has been Ready longer than
  the failing pod's containers ran before they failed (twice that, at least ``PROVEN_MIN``, at
  most ``crashloop_recent_run``: ``proof_for``): an image that crashes 20 s after start has a
  twin Ready for 7 s in every rollout step and after every move, which proves nothing.
- **Nobody missing.** Fewer pods than the ReplicaSet wants means a replacement is on its way,
  perhaps to a good node: no stop until it shows what it does.

Once stopped, the stop holds (for failures of its reason) until a pod is healthy: a pod that
merely has not failed yet does not lift it, or the next scale-up would restart the cycle
before it proved anything.

This module decides (pure, clock passed in); ``shared.workloads.state.plan`` applies the
verdict and records the stop; update-annotations lists the pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from shared.api.kubetypes import Pod
from shared.api.state import Stopped
from shared.api.times import format_duration, parse_kube_time
from shared.platform.config import Config
from shared.workloads.classify import (
    FailureKind,
    classify,
    controller_of,
    excluded_nodes_of,
    longest_run,
    same_failure,
)
from shared.workloads.siblings import JOB_COMPLETION_INDEX_LABEL, failing_siblings, sibling_evidence

# The least time a twin that never restarted must have been Ready to prove its template runs
# (`proof_for`): a container that fails at start does so within seconds.
PROVEN_MIN: Final = timedelta(seconds=10)
# Distinct nodes one failure reason must have been recorded on (the current one included).
NODES_WITH_WITNESSES: Final = 2
NODES_ALONE: Final = 3


class Health(StrEnum):
    """What another pod of the controller says about moving."""

    # Ready (and proven so), or completed: another node fixed the failure.
    HEALTHY = "healthy"
    # Has not failed in its current life: it may be on a good node.
    UNPROVEN = "unproven"
    # Failed in its current life and not healthy since.
    FAILED = "failed"


@dataclass(frozen=True)
class Witness:
    """Another pod of the failing pod's controller, as it is now."""

    name: str
    node: str | None
    health: Health
    why: str


@dataclass(frozen=True)
class Witnesses:
    """The other pods of the controller, and how many more it wants than it has."""

    pods: tuple[Witness, ...] = ()
    missing: int = 0


# A workload of one pod, known without listing (a bare pod has no siblings).
ALONE: Final = Witnesses()


@dataclass(frozen=True)
class Verdict:
    """Whether moving can help; ``why`` says what decided it, for the plan's message."""

    stop: bool
    why: str
    # The nodes the failure was seen on (recorded moves and the current node), in that order.
    nodes: tuple[str, ...] = ()


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return condition
    return None


def _restarts(pod: Mapping[str, Any]) -> int:
    status = pod.get("status") or {}
    total = 0
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            count = container.get("restartCount", 0) if isinstance(container, Mapping) else 0
            total += count if type(count) is int and count > 0 else 0
    return total


def proof_for(failing: Pod, cfg: Config) -> timedelta:
    """How long a twin of ``failing`` that never restarted must have been Ready to prove that
    its template runs: twice the longest run of ``failing``'s containers, at least
    ``PROVEN_MIN``, at most ``crashloop_recent_run`` (a longer run starts a new series)."""
    ran = longest_run(failing) or timedelta(0)
    return min(max(2 * ran, PROVEN_MIN), max(cfg.crashloop_recent_run, PROVEN_MIN))


def health_of(
    pod: Pod, cfg: Config, now: datetime, proof: timedelta = PROVEN_MIN
) -> tuple[Health, str]:
    """How a pod of the controller stands (see the module docstring), and why. ``proof``: how
    long it must have been Ready, when it never restarted (``proof_for`` the failing pod)."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    node = (pod.get("spec") or {}).get("nodeName")
    where = f"on node {node}" if node else "not bound to a node yet"
    if phase == "Succeeded":
        return Health.HEALTHY, f"completed {where}"
    if phase == "Failed":
        return Health.FAILED, f"failed {where} ({status.get('reason') or 'phase Failed'})"
    failure = classify(pod, sibling_evidence(cfg), now)
    if failure is not None and failure.kind is not FailureKind.EXCLUSIONS_UNSCHEDULABLE:
        return Health.FAILED, f"failing {where} ({failure.reason})"
    restarts = _restarts(pod)
    ready = _condition(pod, "Ready")
    if ready is not None and ready.get("status") == "True":
        since = parse_kube_time(ready.get("lastTransitionTime"))
        if restarts == 0:
            if since is not None and now - since >= proof:
                return Health.HEALTHY, f"Ready {where} for {format_duration(now - since)}"
            lasted = f"only {format_duration(now - since)}" if since is not None else "a while"
            return Health.UNPROVEN, (
                f"Ready {where} for {lasted}, less than the {format_duration(proof)} that "
                "prove its template runs"
            )
        if since is not None and now - since >= cfg.crashloop_recent_run:
            return Health.HEALTHY, f"Ready {where} since {since:%Y-%m-%dT%H:%M:%SZ}"
        return Health.FAILED, f"Ready {where} only briefly after {restarts} restart(s)"
    if restarts:
        return Health.FAILED, f"not Ready {where} after {restarts} restart(s)"
    return Health.UNPROVEN, f"not failed yet, {where}"


def witnesses_of(
    pod: Pod,
    candidates: Iterable[Mapping[str, Any]],
    cfg: Config,
    now: datetime,
    *,
    replicas: int | None = None,
) -> Witnesses:
    """The other pods of ``pod``'s controller among ``candidates`` (the list
    ``shared.workloads.siblings`` already makes), judged; ``replicas`` is how many pods
    the controller wants (a ReplicaSet's spec.replicas), None when that is not a fixed
    number (a Job)."""
    owner = controller_of(pod)
    owner_uid = owner.get("uid") if owner else None
    if not owner_uid:
        return ALONE
    own_uid = (pod.get("metadata") or {}).get("uid")
    proof = proof_for(pod, cfg)
    found: list[Witness] = []
    live = 1  # the failing pod itself
    index = _completion_index(pod)
    for candidate in candidates:
        cmeta = candidate.get("metadata") or {}
        if cmeta.get("uid") == own_uid or cmeta.get("deletionTimestamp"):
            continue
        if index is not None and _completion_index(candidate) != index:
            # An Indexed Job's other indexes read other input: index 0 completing says
            # nothing of index 1 crashing on its shard on every node.
            continue
        other: Pod = candidate  # type: ignore[assignment]
        cowner = controller_of(other)
        if cowner is None or cowner.get("uid") != owner_uid:
            continue
        phase = (other.get("status") or {}).get("phase")
        if phase == "Failed":
            # History, not a witness: a Job keeps its failed pods (our evicted ones among
            # them) until it finishes, and they are the same lineage as the failing pod.
            continue
        health, why = health_of(other, cfg, now, proof)
        # The ReplicaSet controller counts neither terminal nor deleted pods as its own
        # (FilterActivePods): it replaces them.
        if phase != "Succeeded":
            live += 1
        node = (candidate.get("spec") or {}).get("nodeName") or None
        found.append(Witness(str(cmeta.get("name", "")), node, health, why))
    missing = max(replicas - live, 0) if replicas is not None else 0
    return Witnesses(tuple(sorted(found, key=lambda w: w.name)), missing)


def judge(
    recorded: Mapping[str, str],
    stopped: Stopped | None,
    node: str,
    reason: str,
    others: Witnesses,
    kept_off: Iterable[str] = (),
    implicated: Mapping[str, str] | None = None,
) -> Verdict:
    """Whether moving a pod that failed with ``reason`` on ``node`` can help.

    ``recorded`` maps each node a move was charged for to the failure that moved it (the
    holder's state, pruned); ``stopped`` is the stop already recorded, if any; ``others`` are
    the other pods of the controller; ``kept_off`` the nodes the failing pod was admitted
    avoiding (the webhook's stamp).

    The nodes that count are the failing pod's own node and the recorded nodes **it was kept
    off**: a replacement that avoided the nodes the failure was recorded on and failed the same
    way again elsewhere. A pod that was already running when the moves were recorded was never
    given the chance: twenty replicas pinned to two bad nodes are each moved once, not stopped
    at the second node's first failure (tests/e2e/test_rescheduling_safety.py).

    ``implicated`` maps the nodes that are evidence against themselves rather than against the
    application (suspect, or other workloads failed there within the window; a node that could
    not be read is in it too) to why. They do not count: failing on nodes where other workloads
    fail too is what a cluster with several bad nodes looks like (3 bad nodes of 8 stopped 3 of
    6 workloads after 1-2 moves, their replicas left crash-looping beside 5 healthy nodes). A
    stop needs the failure on enough nodes where others run fine. None: not read yet.
    """
    again = [n for n in kept_off if n in recorded and same_failure(recorded[n], reason)]
    seen = tuple(dict.fromkeys([*again, node]))
    healthy = next((w for w in others.pods if w.health is Health.HEALTHY), None)
    if healthy is not None:
        return Verdict(False, f"pod {healthy.name} is {healthy.why}", seen)
    if stopped is not None and same_failure(stopped.reason, reason):
        held = tuple(dict.fromkeys([*stopped.nodes, *seen]))
        return Verdict(True, "moves stay stopped: no pod of the workload is healthy yet", held)
    if others.missing:
        return Verdict(False, f"{others.missing} pod(s) of the workload are not created yet", seen)
    needed = NODES_WITH_WITNESSES if others.pods else NODES_ALONE
    if len(seen) < needed:
        return Verdict(
            False, f"{reason} was seen on {len(seen)} node(s), fewer than {needed}", seen
        )
    blamed = [n for n in seen if n in (implicated or {})]
    if len(seen) - len(blamed) < needed:
        shown = "; ".join(f"{n}: {(implicated or {})[n]}" for n in blamed)
        return Verdict(
            False,
            f"{reason} was seen on {len(seen)} node(s), but only {len(seen) - len(blamed)} of "
            f"them are nodes where other workloads run fine, fewer than {needed} ({shown})",
            seen,
        )
    failing = (
        f"its other {len(others.pods)} pod(s) are failing too"
        if others.pods
        else "it has no other pod"
    )
    return Verdict(
        True,
        f"it failed with {reason} on {len(seen)} nodes ({', '.join(seen)}) and {failing}: "
        "no pod of it is healthy anywhere",
        seen,
    )


# How long a pod of the workload must have been Ready, never restarted, to prove its template
# runs when the failing pod is gone (a move's reply) and its own runs cannot be read: longer
# than an image that crashes a while after it starts runs.
REPLY_PROOF: Final = timedelta(seconds=60)


def follows_its_workload(
    pod: Pod,
    siblings: Iterable[Mapping[str, Any]],
    cfg: Config,
    now: datetime,
    failed_before: Iterable[str] | None = None,
    implicated: Mapping[str, str] | None = None,
) -> str | None:
    """Why ``pod``'s failure on its node may follow its workload rather than the node, or
    None: evidence against the node.

    A failure may follow the workload when the workload failed elsewhere too and no pod of it
    is proven healthy on another node (``health_of`` with ``proof_for`` the failing pod, among
    pods of its own controller and, for a pod with an identity of its own, an Indexed Job's
    completion index or a StatefulSet's ordinal, only pods of that identity). An application
    broken everywhere looks so; counted against the nodes it meets, two of them make a healthy
    node suspect and corroborate each other's early moves there.

    "Elsewhere" is: the nodes its workload's state names (``failed_before``: the caller's
    ``failedOn``, fresh within ``reset_after``; None when the state is not known, and then the
    webhook's excluded-nodes stamp on the pod stands in for it while the pod is younger than
    ``reset_after``), or another pod of its controller failing on another node now, or
    restarted there within ``crashloop_recent_run`` and not running that long since (a
    crash-looping container between two crashes is ``Running``, no failure by the rules, and
    no proof either). Terminal pods are history. Nodes in ``implicated`` (suspect, or other
    workloads failed there: ``elsewhere_nodes`` names the nodes to read) do not count: failing
    on a bad node, then on this one, is what several bad nodes look like, and the second one
    must still be blamed."""
    node = (pod.get("spec") or {}).get("nodeName")
    blamed = implicated or {}
    pods = [p for p in _same_identity(pod, siblings) if not _terminal(p)]
    recorded, live = _failed_elsewhere(pod, pods, cfg, now, failed_before)
    kept_off = [n for n in recorded if n not in blamed]
    elsewhere = [why for where, why in live if where not in blamed]
    if not kept_off and not elsewhere:
        return None
    if _proven_elsewhere(pod, pods, node, cfg, now, proof_for(pod, cfg)):
        return None
    if kept_off:
        return f"its workload failed on {', '.join(kept_off[:3])} before and runs nowhere else"
    return f"{elsewhere[0]} and none runs elsewhere"


def elsewhere_nodes(
    pod: Pod,
    siblings: Iterable[Mapping[str, Any]],
    cfg: Config,
    now: datetime,
    failed_before: Iterable[str] | None = None,
) -> tuple[str, ...]:
    """The other nodes ``follows_its_workload`` would say the workload failed on, before any
    is found implicated: the nodes a caller reads to tell several bad nodes from an
    application broken everywhere."""
    pods = [p for p in _same_identity(pod, siblings) if not _terminal(p)]
    recorded, live = _failed_elsewhere(pod, pods, cfg, now, failed_before)
    return tuple(dict.fromkeys([*recorded, *(where for where, _ in live)]))


def _failed_elsewhere(
    pod: Pod,
    pods: list[Mapping[str, Any]],
    cfg: Config,
    now: datetime,
    failed_before: Iterable[str] | None,
) -> tuple[list[str], list[tuple[str, str]]]:
    """The other nodes the workload's record names, and the pods of it (``pods``, of its
    identity) failing on another node now or just restarted there: (node, in words)."""
    node = (pod.get("spec") or {}).get("nodeName")
    own = (pod.get("metadata") or {}).get("uid")
    live = [
        (s.node, f"{s.name} of its controller fails on {s.node} now")
        for s in failing_siblings(pod, pods, cfg, now, reset_after=cfg.reset_after)
    ]
    live += _restarting_elsewhere(pods, node, own, cfg, now)
    return recorded_elsewhere(pod, cfg, now, failed_before), [(n, w) for n, w in live if n]


def moves_follow_the_workload(
    failed_on: Iterable[str],
    node: str,
    holder_pods: Iterable[Mapping[str, Any]],
    cfg: Config,
    now: datetime,
    *,
    holder_uid: str | None = None,
    implicated: Mapping[str, str] | None = None,
) -> str | None:
    """For a move's reply (the pod gone): why the move off ``node`` may follow its workload,
    or None. The workload's state records failures on other nodes too (``failed_on``), or a
    pod of the holder fails on another node now (a twin crashing as this one did, moved a
    moment later, so not in the state yet), and no pod of the holder (``holder_pods``, those of
    ``holder_uid`` only) is proven healthy on another node (``REPLY_PROOF``). Nodes in
    ``implicated`` do not count (``follows_its_workload``)."""
    blamed = implicated or {}
    pods = _holder_pods(holder_pods, holder_uid)
    others = [n for n in dict.fromkeys(failed_on) if n != node and n not in blamed]
    failing = [
        why
        for where, why in _restarting_elsewhere(pods, node, None, cfg, now, any_failure=True)
        if where not in blamed
    ]
    if not others and not failing:
        return None
    if _proven_elsewhere(None, pods, node, cfg, now, REPLY_PROOF):
        return None
    if others:
        return f"its workload failed on {', '.join(others[:3])} too and runs nowhere else"
    return f"{failing[0]} and none runs elsewhere"


def reply_elsewhere_nodes(
    failed_on: Iterable[str],
    node: str,
    holder_pods: Iterable[Mapping[str, Any]],
    cfg: Config,
    now: datetime,
    *,
    holder_uid: str | None = None,
) -> tuple[str, ...]:
    """``elsewhere_nodes`` for a move's reply (``moves_follow_the_workload``)."""
    pods = _holder_pods(holder_pods, holder_uid)
    found = [*failed_on]
    found += [w for w, _ in _restarting_elsewhere(pods, node, None, cfg, now, any_failure=True)]
    return tuple(n for n in dict.fromkeys(found) if n and n != node)


def _holder_pods(
    candidates: Iterable[Mapping[str, Any]], holder_uid: str | None
) -> list[Mapping[str, Any]]:
    """The pods of the holder (``holder_uid``'s; any when None) that are not terminal."""
    return [
        p
        for p in candidates
        if not _terminal(p)
        and (holder_uid is None or (controller_of(p) or {}).get("uid") == holder_uid)  # type: ignore[arg-type]
    ]


def proven_elsewhere(
    pod: Pod, siblings: Iterable[Mapping[str, Any]], cfg: Config, now: datetime
) -> bool:
    """Whether a pod of ``pod``'s workload (of its identity: ``_same_identity``) among
    ``siblings`` is proven healthy on another node (``health_of`` with ``proof_for`` the
    failing pod): the failure is then the node's."""
    node = (pod.get("spec") or {}).get("nodeName")
    pods = _same_identity(pod, siblings)
    return _proven_elsewhere(pod, pods, node, cfg, now, proof_for(pod, cfg))


def recorded_elsewhere(
    pod: Pod, cfg: Config, now: datetime, failed_before: Iterable[str] | None
) -> list[str]:
    """The other nodes the workload's record names: the caller's fresh ``failedOn``, or when
    it has none to give (None), the pod's stamp while the pod is younger than ``reset_after``
    (a stamp outlives the record it was copied from)."""
    node = (pod.get("spec") or {}).get("nodeName")
    if failed_before is None:
        found = list(excluded_nodes_of(pod)) if _younger_than(pod, cfg.reset_after, now) else []
    else:
        found = list(failed_before)
    return [n for n in dict.fromkeys(found) if n != node]


def _same_identity(pod: Pod, candidates: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Of ``candidates``, the pods that can vouch for ``pod``'s template: of its own
    controller (a hand-made copy of a ReplicaSet shares its pod-template-hash, not its uid)
    and, for a pod with an identity of its own, of that identity. One completion index of an
    Indexed Job finishing says nothing of another's input; one StatefulSet ordinal running
    says nothing of another's volume (and its own earlier incarnations are gone)."""
    owner = controller_of(pod)
    if owner is None or not owner.get("uid") or owner.get("kind") == "StatefulSet":
        return []
    index = _completion_index(pod)
    found = []
    for candidate in candidates:
        theirs = controller_of(candidate)  # type: ignore[arg-type]
        if theirs is None or theirs.get("uid") != owner.get("uid"):
            continue
        if index is not None and _completion_index(candidate) != index:
            continue
        found.append(candidate)
    return found


def _completion_index(pod: Mapping[str, Any]) -> str | None:
    meta = pod.get("metadata") or {}
    found = (meta.get("labels") or {}).get(JOB_COMPLETION_INDEX_LABEL) or (
        meta.get("annotations") or {}
    ).get(JOB_COMPLETION_INDEX_LABEL)
    return str(found) if found is not None else None


def _terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")


def _younger_than(pod: Mapping[str, Any], age: timedelta, now: datetime) -> bool:
    created = parse_kube_time((pod.get("metadata") or {}).get("creationTimestamp"))
    return created is None or now - created <= age


def _restarting_elsewhere(
    candidates: Iterable[Mapping[str, Any]],
    node: str | None,
    own: str | None,
    cfg: Config,
    now: datetime,
    *,
    any_failure: bool = False,
) -> list[tuple[str, str]]:
    """Of ``candidates`` (pods of one workload), those on a node other than ``node``, neither
    terminal nor being deleted, whose container ended in an error within
    ``crashloop_recent_run`` and has not run that long since (or, with ``any_failure``,
    failing by the rules too): (node, in words). A twin running for days after a restart long
    ago, or not Ready because its readiness probe blipped, is not one."""
    found = []
    evidence = sibling_evidence(cfg)
    for candidate in candidates:
        meta = candidate.get("metadata") or {}
        where = (candidate.get("spec") or {}).get("nodeName")
        if not where or where == node or meta.get("uid") == own or meta.get("deletionTimestamp"):
            continue
        if _terminal(candidate):
            continue
        other: Pod = candidate  # type: ignore[assignment]
        failure = classify(other, evidence, now) if any_failure else None
        failing = failure is not None and failure.kind is FailureKind.NODE_FIXABLE
        if failing or _crashed_lately(candidate, cfg.crashloop_recent_run, now):
            found.append(
                (str(where), f"{meta.get('name', '')} of its workload fails on {where} now")
            )
    return found


def _crashed_lately(pod: Mapping[str, Any], within: timedelta, now: datetime) -> bool:
    """A container of ``pod`` ended in an error within ``within`` and has not run that long
    since (running again for a moment, or waiting to be restarted)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        last = (status.get("lastState") or {}).get("terminated") or {}
        if not last or last.get("exitCode") in (0, None):
            continue
        finished = parse_kube_time(last.get("finishedAt"))
        if finished is None or now - finished > within:
            continue
        running = (status.get("state") or {}).get("running") or {}
        started = parse_kube_time(running.get("startedAt"))
        if started is None or now - started < within:
            return True
    return False


def _proven_elsewhere(
    pod: Pod | None,
    candidates: list[Mapping[str, Any]],
    node: str | None,
    cfg: Config,
    now: datetime,
    proof: timedelta,
) -> bool:
    own = ((pod or {}).get("metadata") or {}).get("uid")
    for candidate in candidates:
        meta = candidate.get("metadata") or {}
        where = (candidate.get("spec") or {}).get("nodeName")
        if not where or where == node or meta.get("uid") == own or meta.get("deletionTimestamp"):
            continue
        other: Pod = candidate  # type: ignore[assignment]
        if health_of(other, cfg, now, proof)[0] is Health.HEALTHY:
            return True
    return False
