"""The chaos suite's invariants and its kill evidence, on worlds built by hand.

A world is what the suite reads at the end of a run: a Deployment with its ReplicaSet (and the
state annotation update-annotations wrote), live and removed pods shaped as the API server
returns them, Events named as update-annotations names them, dead letters as the Broker's
dead-letter sink records them from Knative's extensions. Each case breaks one thing and names
the one invariant that must catch it.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable
from typing import Any, cast

import pytest

from dev.bench.chaos import faults, invariants, observe
from dev.bench.chaos.invariants import Snapshot
from dev.localcluster.podstatus import terminated_status
from dev.pipeline.broker import dead_letter_line
from dev.pipeline.cloudevent import Event
from shared.api.keys import POLICY_ANNOTATION, STATE_ANNOTATION
from shared.pods.update_annotations.bodies import ORIGIN_ANNOTATION, event_name
from shared.workloads.owners import Ref
from tests import builders
from tests.unit import pods

JSON = dict[str, Any]
NS = "shop"
RS = "web-7d9c8b6f4"
BAD, GOOD = "node-bad", "node-good"


def ready_pod(name: str, node: str = GOOD, **kw: Any) -> JSON:
    return dict(pods.pod(name, NS, owner=("ReplicaSet", RS), node=node, **kw))


def failing_pod(name: str, **kw: Any) -> JSON:
    return dict(
        pods.pod(
            name, NS, owner=("ReplicaSet", RS), node=BAD, containers=[pods.crash_looping()], **kw
        )
    )


def uid_of(pod: JSON) -> str:
    return str(pod["metadata"]["uid"])


def state(moves: int, handled: list[str], **extra: Any) -> str:
    return json.dumps({"version": 2, "moves": moves, "handled": handled, **extra})


def web_replicaset(raw_state: str | None) -> JSON:
    """The Deployment's ReplicaSet, with the state update-annotations wrote when there is
    one."""
    labels = {"app": "web", "pod-template-hash": RS.rsplit("-", 1)[-1]}
    return builders.replicaset(
        RS,
        replicas=2,
        retries="2",
        annotations={STATE_ANNOTATION: raw_state} if raw_state is not None else None,
        labels=labels,
        selector=labels,
        template=builders.template(labels),
        owner=builders.owner_reference("Deployment", "web", block_owner_deletion=None),
        namespace=NS,
        uid=pods.uid(f"ReplicaSet/{RS}"),
    )


def moved_event(holder: Ref, pod_uid: str, reason: str = "Rescheduled") -> JSON:
    return builders.event(
        reason,
        name=event_name(holder, reason, pod_uid),
        namespace=NS,
        kind=holder.kind,
        about=holder.name,
        uid=holder.uid,
        message="moved pod off node node-bad after CrashLoopBackOff",
        count=1,
    )


RS_REF = Ref("ReplicaSet", NS, RS, pods.uid(f"ReplicaSet/{RS}"))


def world() -> Snapshot:
    """Two replicas healthy on a good node; one pod was moved off the bad node, recorded."""
    moved = failing_pod("web-7d9c8b6f4-old11")
    live = [
        {**ready_pod("web-7d9c8b6f4-aaaa1"), "kind": "Pod"},
        {**ready_pod("web-7d9c8b6f4-bbbb2"), "kind": "Pod"},
    ]
    objects = [
        builders.deployment(replicas=2, retries="2", namespace=NS, uid=pods.uid("Deployment/web")),
        web_replicaset(state(1, [uid_of(moved)], excludedNodes=[BAD])),
        *live,
        moved_event(RS_REF, uid_of(moved)),
    ]
    seen = {uid_of(p): p for p in [moved, *live]}
    return Snapshot(frozenset({BAD}), objects, seen, frozenset({uid_of(moved)}), ())


def objects_of(s: Snapshot, kind: str) -> list[JSON]:
    return [o for o in s.objects if o["kind"] == kind]


def replace_state(s: Snapshot, raw: str) -> Snapshot:
    objects = [o for o in s.objects if o["kind"] != "ReplicaSet"]
    return Snapshot(s.faulty_nodes, [*objects, web_replicaset(raw)], s.seen, s.gone, s.dead_letters)


def without_events(s: Snapshot) -> Snapshot:
    objects = [o for o in s.objects if o["kind"] != "Event"]
    return Snapshot(s.faulty_nodes, objects, s.seen, s.gone, s.dead_letters)


def one_more_removed(s: Snapshot) -> Snapshot:
    extra = failing_pod("web-7d9c8b6f4-zzzz9")
    return Snapshot(
        s.faulty_nodes,
        s.objects,
        {**s.seen, uid_of(extra): extra},
        s.gone | {uid_of(extra)},
        s.dead_letters,
    )


def moved_uid(s: Snapshot) -> str:
    return next(iter(s.gone))


def live_on_bad_node(s: Snapshot) -> Snapshot:
    objects = [o for o in s.objects if not o["metadata"]["name"].endswith("bbbb2")]
    return Snapshot(
        s.faulty_nodes,
        [*objects, {**ready_pod("web-7d9c8b6f4-bbbb2", node=BAD), "kind": "Pod"}],
        s.seen,
        s.gone,
        s.dead_letters,
    )


SUBSCRIBER = "http://127.0.0.1:9100/"


def dead_letter(status: int | None) -> Callable[[Snapshot], Snapshot]:
    """A dead letter as the sink records it from Knative's extensions (a connection that
    failed carries no knativeerrorcode at all)."""

    def change(s: Snapshot) -> Snapshot:
        attributes = {
            "specversion": "1.0",
            "id": "e-1",
            "source": "kn-rescheduler/detect-failures",
            "type": "io.kn-rescheduler.pod.failing",
            "subject": "x",
            "knativeerrordest": SUBSCRIBER,
            "knativeerrordata": base64.b64encode(f"HTTP {status}".encode()).decode(),
        }
        if status is not None:
            attributes["knativeerrorcode"] = str(status)
        record = dead_letter_line(Event(attributes, b"{}"), {SUBSCRIBER: "update-annotations"})
        return Snapshot(s.faulty_nodes, s.objects, s.seen, s.gone, [record])

    return change


CASES: list[tuple[str, Callable[[Snapshot], Snapshot], set[str]]] = [
    ("nothing wrong", lambda s: s, set()),
    (
        "a pod went away that no state records",
        lambda s: replace_state(s, state(0, [])),
        {"removed-pods-recorded"},
    ),
    ("a pod was moved without its Rescheduled Event", without_events, {"removed-pods-recorded"}),
    (
        "a pod went away that nobody moved",
        one_more_removed,
        {"removed-pods-recorded"},
    ),
    (
        "more moves than the budget (2 retries x 2 replicas)",
        lambda s: replace_state(s, state(5, [moved_uid(s)])),
        {"within-budget", "counted-once"},
    ),
    (
        "one pod counted twice in the handled list",
        lambda s: replace_state(s, state(2, [moved_uid(s), moved_uid(s)])),
        {"counted-once"},
    ),
    (
        "one move counted twice in the move count",
        lambda s: replace_state(s, state(2, [moved_uid(s)])),
        {"counted-once"},
    ),
    (
        "a move counted for a pod that is still there",
        lambda s: replace_state(s, state(2, [moved_uid(s), uid_of(objects_of(s, "Pod")[0])])),
        {"counted-once"},
    ),
    ("a replica Ready on a faulty node", live_on_bad_node, {"replicas-healthy"}),
    ("a dead letter a retry could have fixed (503)", dead_letter(503), {"dead-letters-permanent"}),
    ("a dead letter with no answer at all", dead_letter(None), {"dead-letters-permanent"}),
    ("a dead letter the subscriber refused for good (400)", dead_letter(400), set()),
]


@pytest.mark.parametrize(("case", "change", "broken"), CASES, ids=[c[0] for c in CASES])
def test_each_invariant_catches_what_it_is_about(
    case: str, change: Callable[[Snapshot], Snapshot], broken: set[str]
) -> None:
    verdict = invariants.check(change(copy.deepcopy(world())))
    assert {v.invariant for v in verdict.violations} == broken, verdict.violations
    # Each check looked at something: a check of nothing proves nothing.
    assert all(
        verdict.checked[name] > 0
        for name in ("removed-pods-recorded", "within-budget", "replicas-healthy")
    )


def test_a_violation_carries_the_evidence_to_reproduce_it() -> None:
    verdict = invariants.check(without_events(world()))
    (v,) = verdict.violations
    assert v.subject == f"{NS}/web-7d9c8b6f4-old11"
    assert v.evidence["in_handled"] is True
    assert v.evidence["node"] == BAD and v.evidence["holder"] == f"ReplicaSet {NS}/{RS}"


# -- a StatefulSet removes its ended pods itself ----------------------------------------------
#
# The StatefulSet controller deletes a pod of its own that is Failed or Succeeded and not being
# deleted yet (processReplica, pkg/controller/statefulset), so such a removal is not ours to
# record. A kubelet also writes every pod it stops for a deletion Failed before removing it
# (localcluster.podstatus.terminated_status, the fake kubelet's copy of kubelet v1.36), so a
# removed pod last seen Failed proves nothing: only the ledger's sight of it ended with no
# deletionTimestamp does.

STS = "db"
STS_REF = Ref("StatefulSet", NS, STS, pods.uid(f"StatefulSet/{STS}"))


def db_pod(**kw: Any) -> JSON:
    return cast(JSON, pods.pod("db-0", NS, owner=("StatefulSet", STS), **kw))


def deleting(pod: JSON, grace: int = 30) -> JSON:
    """The pod once someone asked the API server to delete it (a DELETE with this grace)."""
    out = copy.deepcopy(pod)
    out["metadata"]["deletionTimestamp"] = pods.ts(pods.NOW)
    out["metadata"]["deletionGracePeriodSeconds"] = grace
    out["metadata"]["generation"] = 1
    return out


def stopped_by_its_kubelet(pod: JSON) -> JSON:
    """A deleting pod as its kubelet leaves it: the fake kubelet's terminal status, merged as
    the API server merges a strategic merge patch (conditions by type, nulls delete)."""
    patch = terminated_status(pod, pods.NOW.timestamp() + 0.2)
    assert patch is not None
    out = copy.deepcopy(pod)
    status = out["status"]
    order = [c["type"] for c in patch.pop("$setElementOrder/conditions")]
    by_type = {c["type"]: c for c in status.get("conditions", [])}
    for c in patch.pop("conditions"):
        merged = {**by_type.get(c["type"], {}), **c}
        by_type[c["type"]] = {k: v for k, v in merged.items() if v is not None}
    status["conditions"] = [by_type[t] for t in order if t in by_type]
    status.update(patch)
    return out


RUNNING = db_pod(node=BAD)
CRASH_LOOPING = db_pod(node=BAD, containers=[pods.crash_looping(pod_name="db-0", namespace=NS)])
EVICTED = cast(JSON, pods.evicted(node=BAD, name="db-0", namespace=NS, owner=("StatefulSet", STS)))

# What the ledger's pod watch delivers about db-0, from its last healthy-looking state to its
# DELETED event ("LIST" is a relist after a broken watch, with the pods then present).
WatchStory = list[tuple[str, list[JSON]]]


def deleted_by_someone(pod: JSON) -> WatchStory:
    stopping = deleting(pod)
    stopped = stopped_by_its_kubelet(stopping)
    return [
        ("MODIFIED", [pod]),
        ("MODIFIED", [stopping]),
        ("MODIFIED", [stopped]),
        ("DELETED", [stopped]),
    ]


# Ended by its kubelet, then deleted by the StatefulSet controller: the API server gives a
# terminal pod no grace period.
EVICTED_THEN_REMOVED: WatchStory = [
    ("MODIFIED", [RUNNING]),
    ("MODIFIED", [EVICTED]),
    ("DELETED", [deleting(EVICTED, grace=0)]),
]
EVICTED_SEEN_BY_A_RELIST: WatchStory = [("LIST", [EVICTED]), ("LIST", [])]


def ledger_of(story: WatchStory) -> observe.Ledger:
    ledger = observe.Ledger([NS])
    for kind, objs in story:
        if kind == "LIST":
            ledger.pod_list(objs)
        else:
            (obj,) = objs
            ledger.pod_event(kind, obj)
    return ledger


def db_statefulset(raw_state: str | None) -> JSON:
    """The set of db-0, with the state update-annotations wrote when there is one."""
    return builders.statefulset(
        STS,
        retries="3",
        annotations={STATE_ANNOTATION: raw_state} if raw_state is not None else None,
        namespace=NS,
        uid=STS_REF.uid,
    )


def statefulset_world(story: WatchStory, *, recorded: bool) -> Snapshot:
    """db-0 went through ``story``; its successor (same name, new uid) is Ready on a good node;
    the set's state records the move of the first db-0 when ``recorded``."""
    seen, gone, ended = ledger_of(story).snapshot()
    first = pods.uid("db-0")
    successor = {**db_pod(node=GOOD), "kind": "Pod"}
    successor["metadata"]["uid"] = pods.uid("db-0 again")
    objects = [successor]
    if recorded:
        pod_state = {"db-0": {"moves": 1, "excludedNodes": [BAD]}}
        objects += [
            db_statefulset(state(1, [first], pods=pod_state)),
            moved_event(STS_REF, first),
        ]
    else:
        objects.append(db_statefulset(None))
    return Snapshot(frozenset({BAD}), objects, seen, gone, (), ended)


STATEFULSET_CASES: list[tuple[str, WatchStory, bool, bool]] = [
    # (case, what the watch saw, the move recorded, a violation expected)
    ("deleted by someone while running, not recorded", deleted_by_someone(RUNNING), False, True),
    (
        "deleted by someone while crash looping, not recorded",
        deleted_by_someone(CRASH_LOOPING),
        False,
        True,
    ),
    (
        "deleted by someone, and recorded as our move",
        deleted_by_someone(CRASH_LOOPING),
        True,
        False,
    ),
    ("evicted by its kubelet, then removed by its StatefulSet", EVICTED_THEN_REMOVED, False, False),
    ("evicted, seen only by a relist, then gone", EVICTED_SEEN_BY_A_RELIST, False, False),
    (
        "evicted, and moved by us before its StatefulSet got to it",
        EVICTED_THEN_REMOVED,
        True,
        False,
    ),
]


@pytest.mark.parametrize(
    ("case", "story", "recorded", "violated"),
    STATEFULSET_CASES,
    ids=[c[0] for c in STATEFULSET_CASES],
)
def test_a_removed_statefulset_pod_is_let_off_only_if_it_ended_before_anyone_deleted_it(
    case: str, story: WatchStory, recorded: bool, violated: bool
) -> None:
    s = statefulset_world(story, recorded=recorded)
    # Whoever deleted it, the pod is last seen Failed: the phase cannot tell them apart.
    assert s.seen[pods.uid("db-0")]["status"]["phase"] == "Failed"
    verdict = invariants.check(s)
    assert {v.subject for v in verdict.violations} == ({f"{NS}/db-0"} if violated else set()), (
        verdict.violations
    )
    assert {v.invariant for v in verdict.violations} <= {"removed-pods-recorded"}
    for v in verdict.violations:
        assert v.evidence["deletionTimestamp"] and v.evidence["ended_before_deletion"] is False
    let_off = any("its StatefulSet removed it" in n for n in verdict.notes)
    assert let_off is (not recorded and not violated)
    # A pod let off is not judged; any other removed pod is.
    assert verdict.checked["removed-pods-recorded"] == (0 if let_off else 1)


def test_a_pod_deleted_by_someone_is_never_seen_ended_before_its_deletion() -> None:
    _, gone, ended = ledger_of(deleted_by_someone(RUNNING)).snapshot()
    assert gone == {pods.uid("db-0")} and ended == frozenset()
    _, gone, ended = ledger_of(EVICTED_THEN_REMOVED).snapshot()
    assert gone == ended == {pods.uid("db-0")}


def bare(name: str, node: str, *, origin: str | None = None, raw_state: str | None = None) -> JSON:
    annotations = {POLICY_ANNOTATION: "3"}
    if origin:
        annotations[ORIGIN_ANNOTATION] = origin
    if raw_state:
        annotations[STATE_ANNOTATION] = raw_state
    return {
        **dict(pods.pod(name, NS, owner=None, node=node, annotations=annotations)),
        "kind": "Pod",
    }


@pytest.mark.parametrize(
    ("successors", "healthy"),
    [(1, True), (2, False), (0, False)],
    ids=["one successor", "a replacement created twice", "no successor"],
)
def test_a_bare_pod_needs_exactly_one_live_successor_that_holds_its_record(
    successors: int, healthy: bool
) -> None:
    first = bare("solo", BAD)
    record = state(1, [uid_of(first)], excludedNodes=[BAD])
    live = [bare(f"solo-{i:05d}", GOOD, origin="solo", raw_state=record) for i in range(successors)]
    for i, p in enumerate(live):
        p["metadata"]["uid"] = pods.uid(f"solo successor {i}")
    said = moved_event(Ref("Pod", NS, "solo", uid_of(first)), uid_of(first))
    s = Snapshot(
        frozenset({BAD}), [*live, said], {uid_of(first): first}, frozenset({uid_of(first)})
    )
    verdict = invariants.check(s)
    assert (verdict.violations == ()) is healthy, verdict.violations


# -- where the kills landed -------------------------------------------------------------------


def line(ce: str, msg: str) -> str:
    return json.dumps({"msg": msg, "ce_id": ce, "ce_subject": f"namespaces/{NS}/pods/{ce}"})


LOG = "\n".join(
    [
        "# 11:35:59 starting: gunicorn",
        line("a", "plan: move (node-failure): moved pod a off node n1 (move 1 of 4)"),
        line("a", f"deleted pod {NS}/a (uid 1)"),
        line("a", "event handled"),
        line("b", "plan: move (node-failure): moved pod b off node n1 (move 2 of 4)"),
        line("c", "plan: nothing (already-handled): pod c was already moved"),
        "# 11:36:03 starting: gunicorn",
        line("d", "plan: move (node-failure): moved pod d off node n1 (move 3 of 4)"),
        line("d", "event handled"),
    ]
)


def test_a_kill_that_cut_a_move_between_its_state_write_and_its_removal_is_found() -> None:
    runs = faults.incarnations(LOG)
    assert len(runs) == 2
    cut = faults.interrupted_moves(runs[0])
    assert [c["ce_id"] for c in cut] == ["b"]
    # A move whose handling ended (a 503 after the state write, say) was not cut by a kill.
    assert faults.interrupted_moves(runs[1]) == []


def test_kills_are_matched_to_the_process_they_killed(tmp_path: Any) -> None:
    log = tmp_path / "update-annotations.log"
    log.write_text(LOG)
    kills = [
        faults.Kill(1.0, "state-write", "ReplicaSet shop/web", 100, 0),
        faults.Kill(5.0, "random", "", 101, 1),
    ]
    landed = faults.kills_in_window(log, kills)
    assert (landed["kills"], landed["kills_in_window"], landed["moves_cut"]) == (2, 1, 1)
    assert landed["detail"][0]["trigger"] == "state-write"
