"""What must hold after a failure storm under chaos, judged on what the API server says.

Pure functions of a :class:`Snapshot` (everything read at the end of a run: the workloads, the
live pods, every pod seen during the run, the Events, the Broker's dead letters), each
returning :class:`Violation` s with the evidence a person needs to reproduce the finding.

The state annotation is read here with a reader of its own (the documented JSON format, see
shared/workloads/state.py), and budgets are computed from the documented rule
(``scheduling-retries`` times the replicas of a ReplicaSet; per pod for a StatefulSet; per Job; per
bare pod), not with the product's functions: a bug there must not hide itself. Only the Event naming
rule (one Event per object, reason and pod uid,
``shared.pods.update_annotations.bodies.event_name``) is the product's own: it is the contract by
which a move's Event is found.

The invariants:

``removed-pods-recorded``
    Every pod that went away during the run, unless a Kubernetes controller removes such pods
    itself or it was redirected (a ``ReplacementRedirected`` Event names it), was a move of
    ours: its uid is in the ``handled`` list of its workload's state (for a bare pod: of the
    live pod that replaced it) and a ``Rescheduled`` (or ``ExclusionsCleared``) Event keyed by
    that uid exists. The controller's own removals: a StatefulSet deletes a pod of its own that
    is Failed or Succeeded and not being deleted yet (``processReplica`` in
    pkg/controller/statefulset), so a StatefulSet pod the ledger saw ended *before anyone
    deleted it* (an eviction by its kubelet, say) is let off. A pod's last-seen phase is no
    such evidence: a kubelet writes every pod it stops for a deletion Failed before removing
    it, so every deleted pod is last seen Failed, the ones we forgot to record included.
``within-budget``
    No workload's state counts more moves than its budget (per pod for a StatefulSet), and no
    workload has more ``Rescheduled`` Events than its budget.
``counted-once``
    No uid is in a ``handled`` list twice; a state's move count equals the number of distinct
    pods it moved (``ExclusionsCleared`` moves are not charged), a StatefulSet's equals the sum
    of its per-pod counts; every pod counted as moved is gone.
``replicas-healthy``
    Every Deployment has exactly its replicas, Ready, on nodes without a fault; every
    StatefulSet pod ordinal is Ready on such a node; every Job completed; every bare pod has
    exactly one live successor, Ready on such a node.
``dead-letters-permanent``
    Nothing was dead-lettered whose last answer a retry could have changed (no answer, 404,
    408, 409, 429, 5xx: Knative's retriable statuses), as the dead-letter sink got it from
    Knative: the subscriber's last status is the ``knativeerrorcode`` extension
    (dev/pipeline/broker.py ``dead_letter_line``; a connection that failed reaches it as the
    broker filter's 500). The injected faults fail at most ``max_failures`` attempts of an
    event per function, fewer than a Trigger's retries (dev/pipeline/faults.py): a dead letter is
    the subscriber's own last word, or the sign of a function that stayed down.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from dev.pipeline.faults import retriable
from shared.api.keys import (
    POLICY_ANNOTATION,
    REASON_EXCLUSIONS_CLEARED,
    REASON_REPLACEMENT_REDIRECTED,
    REASON_RESCHEDULED,
    STATE_ANNOTATION,
)
from shared.pods.update_annotations.bodies import ORIGIN_ANNOTATION, event_name
from shared.workloads.owners import Ref

JSON = dict[str, Any]

INVARIANTS: Final = (
    "removed-pods-recorded",
    "within-budget",
    "counted-once",
    "replicas-healthy",
    "dead-letters-permanent",
)
# update-annotations keeps this many handled uids (shared/workloads/state.py
# DEFAULT_HANDLED_LIMIT): a longer history is cut, so counting moves against the list is only exact
# below it.
HANDLED_LIMIT: Final = 64
MOVE_REASONS: Final = (REASON_RESCHEDULED, REASON_EXCLUSIONS_CLEARED)


@dataclass(frozen=True)
class Violation:
    invariant: str
    subject: str
    message: str
    evidence: JSON = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {
            "invariant": self.invariant,
            "subject": self.subject,
            "message": self.message,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class Snapshot:
    """Everything the invariants look at. ``objects`` carry their ``kind`` (list answers
    leave it out; the collector puts it back)."""

    faulty_nodes: frozenset[str]
    # Deployments, ReplicaSets, StatefulSets, Jobs, live Pods and Events of the chaos namespaces.
    objects: Sequence[JSON]
    # Every pod seen during the run (by uid, as last seen) and the uids seen going away.
    seen: Mapping[str, JSON]
    gone: frozenset[str]
    dead_letters: Sequence[JSON] = ()
    # The uids seen terminal (Failed or Succeeded) with no deletionTimestamp: ended by their
    # kubelet before anyone deleted them (observe.ended_undeleted).
    ended_undeleted: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Verdict:
    violations: tuple[Violation, ...]
    # How many subjects each invariant looked at (a check of nothing proves nothing).
    checked: Mapping[str, int]
    # What was explained rather than judged (pods removed by a controller, unseen uids).
    notes: tuple[str, ...] = ()

    def to_json(self) -> JSON:
        return {
            "violations": [v.to_json() for v in self.violations],
            # Every invariant checked, in order (the soak's Verdict is this one with its own).
            "violations_by_invariant": {
                name: sum(1 for v in self.violations if v.invariant == name)
                for name in self.checked
            },
            "checked": dict(self.checked),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class State:
    """The parts of the state annotation the invariants read."""

    moves: int
    handled: tuple[str, ...]
    per_pod: Mapping[str, int]

    @classmethod
    def parse(cls, raw: str | None) -> State:
        """Raises ValueError for a state that is not the documented JSON."""
        if not raw:
            return cls(0, (), {})
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("the state is not a JSON object")
        pods = data.get("pods") or {}
        return cls(
            moves=int(data.get("moves", 0)),
            handled=tuple(str(u) for u in data.get("handled") or ()),
            per_pod={str(name): int((entry or {}).get("moves", 0)) for name, entry in pods.items()},
        )


@dataclass(frozen=True)
class Holder:
    """The object a pod's moves are recorded on, with its policy."""

    kind: str
    obj: JSON
    retries: int | None
    replicas: int

    @property
    def meta(self) -> JSON:
        meta: JSON = self.obj.get("metadata") or {}
        return meta

    @property
    def ref(self) -> Ref:
        m = self.meta
        return Ref(self.kind, m.get("namespace", ""), m.get("name", ""), m.get("uid", ""))

    @property
    def describe(self) -> str:
        return f"{self.kind} {self.meta.get('namespace')}/{self.meta.get('name')}"

    @property
    def per_pod(self) -> bool:
        return self.kind == "StatefulSet"

    @property
    def budget(self) -> int | None:
        """scheduling-retries, times the replicas for a ReplicaSet (shared among its pods)."""
        if self.retries is None:
            return None
        if self.kind == "ReplicaSet":
            return self.retries * max(self.replicas, 1)
        return self.retries

    def state(self) -> State:
        return State.parse((self.meta.get("annotations") or {}).get(STATE_ANNOTATION))


def _meta(obj: Mapping[str, Any]) -> JSON:
    meta: JSON = obj.get("metadata") or {}
    return meta


def _controller(obj: Mapping[str, Any]) -> JSON | None:
    for owner in _meta(obj).get("ownerReferences") or []:
        if owner.get("controller"):
            found: JSON = owner
            return found
    return None


def _retries(obj: Mapping[str, Any]) -> int | None:
    raw = (_meta(obj).get("annotations") or {}).get(POLICY_ANNOTATION)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def is_ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def chain(pod: Mapping[str, Any]) -> str:
    """A bare pod's lineage: the name of the first pod, which every replacement carries."""
    meta = _meta(pod)
    return str((meta.get("annotations") or {}).get(ORIGIN_ANNOTATION) or meta.get("name", ""))


def _where(pod: Mapping[str, Any]) -> JSON:
    meta = _meta(pod)
    return {
        "pod": f"{meta.get('namespace')}/{meta.get('name')}",
        "uid": meta.get("uid"),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "phase": (pod.get("status") or {}).get("phase"),
        "ready": is_ready(pod),
    }


class _Index:
    def __init__(self, snapshot: Snapshot) -> None:
        self.s = snapshot
        self.by_uid: dict[str, JSON] = {}
        self.by_kind: dict[str, list[JSON]] = {}
        for obj in snapshot.objects:
            self.by_kind.setdefault(obj.get("kind", ""), []).append(obj)
            uid = _meta(obj).get("uid")
            if uid:
                self.by_uid[uid] = obj
        self.live_pods = [
            p for p in self.by_kind.get("Pod", []) if not _meta(p).get("deletionTimestamp")
        ]
        self.live_uids = {_meta(p).get("uid") for p in self.by_kind.get("Pod", [])}
        self.event_names: dict[str, JSON] = {
            f"{_meta(e).get('namespace')}/{_meta(e).get('name')}": e
            for e in self.by_kind.get("Event", [])
        }

    def kind(self, kind: str) -> list[JSON]:
        return self.by_kind.get(kind, [])

    def event(self, ref: Ref, reason: str, pod_uid: str) -> JSON | None:
        return self.event_names.get(f"{ref.namespace}/{event_name(ref, reason, pod_uid)}")

    def holder_of(self, pod: Mapping[str, Any]) -> Holder | None:
        owner = _controller(pod)
        if owner is None:
            ns, key = _meta(pod).get("namespace"), chain(pod)
            current = [
                p
                for p in self.live_pods
                if _meta(p).get("namespace") == ns and _controller(p) is None and chain(p) == key
            ]
            if len(current) != 1:
                return None
            return Holder("Pod", current[0], _retries(current[0]), 1)
        obj = self.by_uid.get(owner.get("uid", ""))
        if obj is None:
            return None
        return self.holder(owner.get("kind", ""), obj)

    def holder(self, kind: str, obj: JSON) -> Holder:
        spec = obj.get("spec") or {}
        replicas = int(spec.get("replicas", 1) if kind != "Job" else spec.get("parallelism", 1))
        retries = _retries(obj)
        if kind == "ReplicaSet":
            # A Deployment's policy applies to its ReplicaSets' pods.
            deployment = _controller(obj)
            if deployment is not None and deployment.get("uid") in self.by_uid:
                retries = _retries(self.by_uid[deployment["uid"]])
        return Holder(kind, obj, retries, replicas)

    def holders(self) -> list[Holder]:
        """Every object that holds a policy or a state: ReplicaSets, StatefulSets, Jobs and
        live bare pods."""
        found = [
            self.holder(kind, obj)
            for kind in ("ReplicaSet", "StatefulSet", "Job")
            for obj in self.kind(kind)
        ]
        found += [
            Holder("Pod", p, _retries(p), 1) for p in self.live_pods if _controller(p) is None
        ]
        return [
            h
            for h in found
            if h.retries is not None or STATE_ANNOTATION in (h.meta.get("annotations") or {})
        ]


def removed_pods_recorded(snapshot: Snapshot) -> tuple[list[Violation], int, list[str]]:
    idx = _Index(snapshot)
    violations: list[Violation] = []
    notes: list[str] = []
    checked = 0
    for uid in sorted(snapshot.gone):
        pod = snapshot.seen.get(uid)
        if pod is None:
            continue
        # The last-seen phase of a deleted pod is its kubelet's Failed of the stop: say whether
        # it was deleted, and whether it had ended before that, the fact a reader needs.
        where = {
            **_where(pod),
            "deletionTimestamp": _meta(pod).get("deletionTimestamp"),
            "ended_before_deletion": uid in snapshot.ended_undeleted,
        }
        holder = idx.holder_of(pod)
        if holder is None:
            violations.append(
                Violation(
                    "removed-pods-recorded",
                    where["pod"],
                    "pod went away and no workload (or bare-pod successor) holds its record",
                    {**where, "owner": _controller(pod)},
                )
            )
            continue
        if idx.event(holder.ref, REASON_REPLACEMENT_REDIRECTED, uid) is not None:
            notes.append(f"{where['pod']} ({uid}) was redirected (ReplacementRedirected)")
            continue
        try:
            state = holder.state()
        except ValueError as exc:
            violations.append(
                Violation("removed-pods-recorded", holder.describe, f"state unreadable: {exc}")
            )
            continue
        if (
            holder.kind == "StatefulSet"
            and uid in snapshot.ended_undeleted
            and uid not in state.handled
        ):
            notes.append(
                f"{where['pod']} ({uid}) ended ({where['phase']}) before anyone deleted it, "
                "and its StatefulSet removed it"
            )
            continue
        checked += 1
        if uid not in state.handled:
            violations.append(
                Violation(
                    "removed-pods-recorded",
                    where["pod"],
                    f"pod went away but its uid is not in the handled list of {holder.describe}",
                    {**where, "holder": holder.describe, "handled": list(state.handled)},
                )
            )
        if holder.kind == "Pod":
            # A bare pod's Events are about the pod itself (its state travels on).
            ref = Ref("Pod", _meta(pod).get("namespace", ""), _meta(pod).get("name", ""), uid)
        else:
            ref = holder.ref
        if not any(idx.event(ref, reason, uid) for reason in MOVE_REASONS):
            violations.append(
                Violation(
                    "removed-pods-recorded",
                    where["pod"],
                    f"pod went away but no Rescheduled Event keyed by its uid is on {ref.kind} "
                    f"{ref.name}",
                    {
                        **where,
                        "holder": holder.describe,
                        "in_handled": uid in state.handled,
                        "events_on_holder": _events_about(idx, ref),
                    },
                )
            )
    return violations, checked, notes


def _events_about(idx: _Index, ref: Ref) -> list[JSON]:
    return [
        {"name": _meta(e).get("name"), "reason": e.get("reason"), "message": e.get("message")}
        for e in idx.kind("Event")
        if (e.get("involvedObject") or {}).get("uid") == ref.uid
    ]


def within_budget(snapshot: Snapshot) -> tuple[list[Violation], int]:
    idx = _Index(snapshot)
    violations: list[Violation] = []
    checked = 0
    for holder in idx.holders():
        budget = holder.budget
        if budget is None:
            continue
        checked += 1
        try:
            state = holder.state()
        except ValueError as exc:
            violations.append(
                Violation("within-budget", holder.describe, f"state unreadable: {exc}")
            )
            continue
        if holder.per_pod:
            for name, moves in sorted(state.per_pod.items()):
                if moves > budget:
                    violations.append(
                        Violation(
                            "within-budget",
                            f"{holder.describe} pod {name}",
                            f"{moves} moves recorded for pod {name}, budget {budget}",
                            {"state": state.per_pod, "budget": budget},
                        )
                    )
            continue
        if state.moves > budget:
            violations.append(
                Violation(
                    "within-budget",
                    holder.describe,
                    f"{state.moves} moves recorded, budget {budget}",
                    {"moves": state.moves, "budget": budget, "handled": list(state.handled)},
                )
            )
        said = [
            e
            for e in idx.kind("Event")
            if e.get("reason") == REASON_RESCHEDULED
            and (e.get("involvedObject") or {}).get("uid") == holder.ref.uid
        ]
        if holder.kind != "Pod" and len(said) > budget:
            violations.append(
                Violation(
                    "within-budget",
                    holder.describe,
                    f"{len(said)} Rescheduled Events, budget {budget}",
                    {"events": [e.get("message") for e in said], "budget": budget},
                )
            )
    return violations, checked


def counted_once(snapshot: Snapshot) -> tuple[list[Violation], int, list[str]]:
    idx = _Index(snapshot)
    violations: list[Violation] = []
    notes: list[str] = []
    checked = 0
    for holder in idx.holders():
        try:
            state = holder.state()
        except ValueError as exc:
            violations.append(
                Violation("counted-once", holder.describe, f"state unreadable: {exc}")
            )
            continue
        if not state.handled and not state.moves:
            continue
        checked += 1
        twice = sorted(u for u, n in Counter(state.handled).items() if n > 1)
        if twice:
            violations.append(
                Violation(
                    "counted-once",
                    holder.describe,
                    f"uids in the handled list more than once: {', '.join(twice)}",
                    {"handled": list(state.handled)},
                )
            )
        distinct = set(state.handled)
        cleared = {
            u
            for u in distinct
            if idx.event(_event_ref(holder, snapshot, u), REASON_EXCLUSIONS_CLEARED, u) is not None
            and idx.event(_event_ref(holder, snapshot, u), REASON_RESCHEDULED, u) is None
        }
        charged = len(distinct) - len(cleared)
        if len(state.handled) < HANDLED_LIMIT and state.moves != charged:
            violations.append(
                Violation(
                    "counted-once",
                    holder.describe,
                    f"{state.moves} moves counted for {charged} distinct pods moved",
                    {
                        "moves": state.moves,
                        "handled": list(state.handled),
                        "cleared": sorted(cleared),
                    },
                )
            )
        if holder.per_pod and sum(state.per_pod.values()) != state.moves:
            violations.append(
                Violation(
                    "counted-once",
                    holder.describe,
                    f"per-pod moves add up to {sum(state.per_pod.values())}, the set counts "
                    f"{state.moves}",
                    {"per_pod": dict(state.per_pod), "moves": state.moves},
                )
            )
        for uid in state.handled:
            if uid in idx.live_uids and uid not in snapshot.gone:
                live = idx.by_uid.get(uid, {})
                violations.append(
                    Violation(
                        "counted-once",
                        holder.describe,
                        f"a move is counted for pod {_meta(live).get('name')} ({uid}), which is "
                        "still there",
                        _where(live),
                    )
                )
            elif uid not in snapshot.seen:
                notes.append(f"{holder.describe}: handled uid {uid} was never seen by the ledger")
    return violations, checked, notes


def _event_ref(holder: Holder, snapshot: Snapshot, uid: str) -> Ref:
    if holder.kind != "Pod":
        return holder.ref
    pod = snapshot.seen.get(uid) or {}
    return Ref("Pod", holder.ref.namespace, str(_meta(pod).get("name", "")), uid)


def replicas_healthy(snapshot: Snapshot) -> tuple[list[Violation], int]:
    idx = _Index(snapshot)
    bad_nodes = snapshot.faulty_nodes
    violations: list[Violation] = []
    checked = 0

    def healthy(pod: JSON) -> bool:
        return is_ready(pod) and (pod.get("spec") or {}).get("nodeName") not in bad_nodes

    def owned_by(uid: str) -> list[JSON]:
        return [p for p in idx.live_pods if (_controller(p) or {}).get("uid") == uid]

    for d in idx.kind("Deployment"):
        checked += 1
        name = f"Deployment {_meta(d).get('namespace')}/{_meta(d).get('name')}"
        want = int((d.get("spec") or {}).get("replicas", 1))
        sets = [
            rs
            for rs in idx.kind("ReplicaSet")
            if (_controller(rs) or {}).get("uid") == _meta(d).get("uid")
        ]
        pods = [p for rs in sets for p in owned_by(_meta(rs).get("uid", ""))]
        good = [p for p in pods if healthy(p)]
        if len(good) != want or len(pods) != want:
            violations.append(
                Violation(
                    "replicas-healthy",
                    name,
                    f"{len(good)} of {want} replicas Ready on healthy nodes ({len(pods)} pods)",
                    {"pods": [_where(p) for p in pods], "faulty_nodes": sorted(bad_nodes)},
                )
            )
    for s in idx.kind("StatefulSet"):
        checked += 1
        meta = _meta(s)
        want = int((s.get("spec") or {}).get("replicas", 1))
        members = {_meta(p).get("name"): p for p in owned_by(meta.get("uid", ""))}
        missing = [
            f"{meta.get('name')}-{i}"
            for i in range(want)
            if not (p := members.get(f"{meta.get('name')}-{i}")) or not healthy(p)
        ]
        if missing:
            violations.append(
                Violation(
                    "replicas-healthy",
                    f"StatefulSet {meta.get('namespace')}/{meta.get('name')}",
                    f"not Ready on a healthy node: {', '.join(missing)}",
                    {
                        "pods": [_where(p) for p in members.values()],
                        "faulty_nodes": sorted(bad_nodes),
                    },
                )
            )
    for j in idx.kind("Job"):
        checked += 1
        meta, spec, status = _meta(j), j.get("spec") or {}, j.get("status") or {}
        complete = any(
            c.get("type") == "Complete" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        want = int(spec.get("completions", 1))
        done_on_bad = [
            _where(p)
            for p in snapshot.seen.values()
            if (_controller(p) or {}).get("uid") == meta.get("uid")
            and (p.get("status") or {}).get("phase") == "Succeeded"
            and (p.get("spec") or {}).get("nodeName") in bad_nodes
        ]
        if not complete or int(status.get("succeeded", 0)) < want or done_on_bad:
            violations.append(
                Violation(
                    "replicas-healthy",
                    f"Job {meta.get('namespace')}/{meta.get('name')}",
                    f"not complete ({status.get('succeeded', 0)} of {want} succeeded)",
                    {
                        "status": status,
                        "succeeded_on_faulty_nodes": done_on_bad,
                        "pods": [_where(p) for p in owned_by(meta.get("uid", ""))],
                    },
                )
            )
    chains: dict[tuple[str, str], list[JSON]] = {}
    for p in snapshot.seen.values():
        if _controller(p) is None:
            chains.setdefault((_meta(p).get("namespace", ""), chain(p)), [])
    for p in idx.live_pods:
        if _controller(p) is None:
            chains.setdefault((_meta(p).get("namespace", ""), chain(p)), []).append(p)
    for (ns, key), live in sorted(chains.items()):
        checked += 1
        if len(live) != 1 or not healthy(live[0]):
            violations.append(
                Violation(
                    "replicas-healthy",
                    f"bare pod {ns}/{key}",
                    f"{len(live)} live pods in its lineage, "
                    f"{sum(1 for p in live if healthy(p))} Ready on a healthy node",
                    {"pods": [_where(p) for p in live], "faulty_nodes": sorted(bad_nodes)},
                )
            )
    return violations, checked


def dead_letters_permanent(snapshot: Snapshot) -> tuple[list[Violation], int]:
    violations = []
    for record in snapshot.dead_letters:
        status = record.get("status")
        if retriable(status if isinstance(status, int) else None):
            event = record.get("event") or {}
            who = record.get("trigger") or record.get("subscriber") or "an unknown subscriber"
            violations.append(
                Violation(
                    "dead-letters-permanent",
                    f"{event.get('type')} {event.get('subject')}",
                    f"dead-lettered by {who} with a retriable last answer "
                    f"({status}: {record.get('reason')})",
                    {
                        "trigger": record.get("trigger"),
                        "subscriber": record.get("subscriber"),
                        "time": record.get("time"),
                        "ce_id": event.get("id"),
                        "status": status,
                        "reason": record.get("reason"),
                    },
                )
            )
    return violations, len(snapshot.dead_letters)


def moves_recorded(snapshot: Snapshot) -> int:
    """Every move counted in a state of the snapshot (unreadable states count nothing)."""
    total = 0
    for holder in _Index(snapshot).holders():
        with contextlib.suppress(ValueError):
            total += holder.state().moves
    return total


def check(snapshot: Snapshot) -> Verdict:
    """Every invariant, in the order of the module docstring."""
    removed, n_removed, notes_removed = removed_pods_recorded(snapshot)
    budget, n_budget = within_budget(snapshot)
    once, n_once, notes_once = counted_once(snapshot)
    healthy, n_healthy = replicas_healthy(snapshot)
    dead, n_dead = dead_letters_permanent(snapshot)
    return Verdict(
        violations=(*removed, *budget, *once, *healthy, *dead),
        checked={
            "removed-pods-recorded": n_removed,
            "within-budget": n_budget,
            "counted-once": n_once,
            "replicas-healthy": n_healthy,
            "dead-letters-permanent": n_dead,
        },
        notes=(*notes_removed, *notes_once),
    )
