"""The webhook's soft affinities away from suspect nodes and nodes under pressure.

Preferred, never required: the scheduler scores those nodes lower and still uses them when
nothing else fits. They are labels, so the webhook needs no lookup of the nodes, except for a
replacement: one LIST (a label and a field selector, one Node back at most) for whether a node
outside its own exclusions has failing workloads, and only when none has, a second for whether
one was freshly marked moved off (shared.api.movedoff). The scheduler reads that mark's age from
the label itself (node affinity's Lt), so the terms are scored here as its NodeAffinity plugin
scores them.
"""

from __future__ import annotations

import base64
import copy
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

import jsonpatch
import pytest

from shared.admission.decide import OwnerFacts, SoftAvoid, mutate
from shared.admission.handler import FAILING_LOOKUP_TIMEOUT, MOVED_OFF_LOOKUP_LIMIT, Admitter
from shared.api import movedoff
from shared.api.keys import (
    AVOID_PRESSURE_KEY,
    FAILING_WORKLOADS_LABEL,
    LOAD_AWARE_KEY,
    LOAD_LABEL,
    MOVED_OFF_LABEL,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
)
from shared.api.kubetypes import Node
from shared.nodes.rebalance_nodes.decide import _term_matches
from shared.platform import kube
from shared.platform.config import Config
from shared.workloads.owners import Holder, Ref

from . import nodes, pods
from .apivalidation import api_server_errors
from .test_admission import checked_mutate

SUSPECT = SoftAvoid(SUSPECT_LABEL, "true", 100, "suspect")
PRESSURE = SoftAvoid("status", "presure", 20, "labelled status=presure")


def preferred(pod: Any) -> list[dict[str, Any]]:
    return list(
        pod["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("preferredDuringSchedulingIgnoredDuringExecution", [])
    )


def new_pod(**kw: Any) -> Any:
    return pods.pod(node=None, stamp=None, **kw)


def test_an_opted_in_pod_prefers_nodes_that_are_neither_suspect_nor_under_pressure() -> None:
    done = mutate(new_pod(), OwnerFacts(policy="3", avoid=(SUSPECT, PRESSURE)))
    assert preferred(done.pod) == [SUSPECT.term(), PRESSURE.term()]
    assert SUSPECT.term()["preference"]["matchExpressions"] == [
        {"key": "kn-rescheduler.io/suspect", "operator": "NotIn", "values": ["true"]}
    ]
    assert api_server_errors(done.pod) == []
    assert jsonpatch.apply_patch(new_pod(), list(done.patch)) == done.pod


def test_the_users_own_preferences_are_kept_and_the_seeds_term_is_not_added_twice() -> None:
    pod = new_pod()
    own = {
        "weight": 5,
        "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
    }
    pod["spec"]["affinity"] = {
        "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [own, PRESSURE.term()]}
    }
    done = mutate(pod, OwnerFacts(policy="3", avoid=(SUSPECT, PRESSURE)))
    assert preferred(done.pod) == [own, PRESSURE.term(), SUSPECT.term()]


def test_a_pod_bound_at_creation_gets_no_affinity() -> None:
    pod = pods.pod(node="node-1", stamp=None)
    done = mutate(pod, OwnerFacts(policy="3", avoid=(SUSPECT,)))
    assert preferred(done.pod) == []


def test_a_pod_opted_in_to_pressure_only_gets_that_preference_and_no_stamps() -> None:
    pod = new_pod()
    done = mutate(pod, OwnerFacts(policy=None, avoid=(PRESSURE,)))
    assert preferred(done.pod) == [PRESSURE.term()]
    assert done.pod["metadata"].get("annotations", {}) == pod["metadata"].get("annotations", {})
    assert "kn-rescheduler.io/opted-in" not in done.pod["metadata"].get("labels", {})


def test_a_second_admission_of_the_same_pod_changes_nothing() -> None:
    once = mutate(new_pod(), OwnerFacts(policy="3", avoid=(SUSPECT, PRESSURE))).pod
    assert (
        mutate(copy.deepcopy(once), OwnerFacts(policy="3", avoid=(SUSPECT, PRESSURE))).patch == ()
    )


# -- who gets which (the Admitter reads the policy, the workload and the namespace) -------------


def admitter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: Config, clock: Any = None
) -> Admitter:
    # An API server nobody listens on: the namespace lookup fails, which must mean "no".
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    if clock is None:
        return Admitter(kube.Kube.from_environment, cfg)
    return Admitter(kube.Kube.from_environment, cfg, clock)


LOAD_TERMS = ["under high load or overloaded", "under medium load or more"]

# The preference away from suspect nodes, turned on (off by default: the taint does the work).
SUSPECT_ON = Config(suspect_affinity_weight=100)


def holder(**annotations: str) -> Holder:
    return Holder(Ref("ReplicaSet", "shop", "web-7d9c8b6f4", "u"), "1", annotations)


@pytest.mark.parametrize(
    ("policy", "annotations", "cfg", "expected"),
    [
        ("3", {}, Config(), ["labelled status=presure"]),
        ("0", {}, Config(), []),
        ("abc", {}, Config(), []),
        (None, {AVOID_PRESSURE_KEY: "true"}, Config(), ["labelled status=presure"]),
        ("3", {}, SUSPECT_ON, ["suspect", "labelled status=presure"]),
        ("0", {}, SUSPECT_ON, []),
        ("3", {}, Config(suspect_affinity_weight=100, pressure_affinity_weight=0), ["suspect"]),
        ("3", {}, Config(pressure_label="load=high"), ["labelled load=high"]),
        (None, {LOAD_AWARE_KEY: "true"}, Config(), LOAD_TERMS),
        ("3", {LOAD_AWARE_KEY: "true"}, Config(), ["labelled status=presure", *LOAD_TERMS]),
        (None, {LOAD_AWARE_KEY: "true"}, Config(load_affinity_weight=0), []),
        (None, {LOAD_AWARE_KEY: "yes"}, Config(), []),
    ],
    ids=[
        "moves",
        "zero",
        "unreadable",
        "workload-opt-in",
        "suspect-on",
        "suspect-on-zero",
        "no-pressure",
        "label",
        "load-aware",
        "load-aware-and-moves",
        "load-aware-off",
        "load-aware-not-true",
    ],
)
def test_who_gets_which_preference(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    policy: str | None,
    annotations: dict[str, str],
    cfg: Config,
    expected: list[str],
) -> None:
    found = admitter(tmp_path, monkeypatch, cfg)._avoid(policy, holder(**annotations), "shop")
    assert [soft.what for soft in found] == expected


def test_a_load_aware_pod_prefers_low_load_nodes_then_medium_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = admitter(tmp_path, monkeypatch, Config(load_affinity_weight=30))._avoid(
        None, holder(**{LOAD_AWARE_KEY: "true"}), "shop"
    )
    terms = [soft.term() for soft in found]
    assert terms == [
        {
            "weight": 30,
            "preference": {
                "matchExpressions": [
                    {"key": LOAD_LABEL, "operator": "NotIn", "values": ["high", "overloaded"]}
                ]
            },
        },
        {
            "weight": 15,
            "preference": {
                "matchExpressions": [
                    {
                        "key": LOAD_LABEL,
                        "operator": "NotIn",
                        "values": ["medium", "high", "overloaded"],
                    }
                ]
            },
        },
    ]

    # What the scheduler's NodeAffinity plugin adds up per node: low (or unlabelled) 45,
    # medium 30, high and overloaded 0.
    def score(bucket: str | None) -> int:
        return sum(
            t["weight"]
            for t in terms
            if bucket not in t["preference"]["matchExpressions"][0]["values"]
        )

    assert [score(b) for b in ("low", None, "medium", "high", "overloaded")] == [45, 45, 30, 0, 0]


# -- a replacement while other workloads fail on other nodes (a burst) --------------------------


class Nodes:
    """The API as the webhook's Node LISTs see it: the nodes carrying the failing-workloads
    label, and those carrying the moved-off mark (name -> value), each LIST filtered by its
    label selector (existence) and field selector as the API server filters it."""

    def __init__(
        self,
        failing: list[str],
        marked: dict[str, str] | None = None,
        *,
        down: bool = False,
        marks_down: bool = False,
    ) -> None:
        self.failing = failing
        self.marked = marked or {}
        self.down = down
        self.marks_down = marks_down
        self.calls: list[dict[str, Any]] = []
        self.timeouts: list[float | None] = []

    def with_options(self, *, timeout: float | None = None) -> Nodes:
        self.timeouts.append(timeout)
        return self

    def list_page(self, kind: str, namespace: str | None = None, **query: Any) -> dict[str, Any]:
        self.calls.append({"kind": kind, **query})
        if self.down:
            raise kube.Transient("connection refused")
        labelled: dict[str, dict[str, str]] = {}
        for name in self.failing:
            labelled.setdefault(name, {})[FAILING_WORKLOADS_LABEL] = "2"
        for name, value in self.marked.items():
            labelled.setdefault(name, {})[MOVED_OFF_LABEL] = value
        if query["label_selector"] == MOVED_OFF_LABEL and self.marks_down:
            raise kube.Transient("connection refused")
        assert query["label_selector"] in (FAILING_WORKLOADS_LABEL, MOVED_OFF_LABEL)
        unwanted = {f.split("!=", 1)[1] for f in query["field_selector"].split(",")}
        items = [
            nodes.node(name, labels=labels)
            for name, labels in labelled.items()
            if query["label_selector"] in labels and name not in unwanted
        ]
        return {"items": items[: query["limit"]]}

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        # The namespace's opt-in labels: none here.
        return {"metadata": {"name": name, "labels": {}}}


NOW = pods.NOW
WINDOW = Config().moved_off_window


def burst_admitter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: Nodes, cfg: Config | None = None
) -> Admitter:
    made = admitter(tmp_path, monkeypatch, cfg or Config(), clock=lambda: NOW)
    made._api = api  # type: ignore[assignment]
    return made


def seconds(moment: datetime) -> str:
    """A moved-off mark's value for a move at ``moment``."""
    return movedoff.mark_value(moment)


FAILING = "failing for other workloads or moved off within 2m0s"
# The term the preference was before the moved-off mark joined it.
EARLIER_FAILING = {"key": FAILING_WORKLOADS_LABEL, "operator": "DoesNotExist"}
# The Lt operand at NOW: the first whole second whose mark is fresh, NOW - 2 min + 1 s.
BEFORE = str(int(NOW.timestamp()) - 120 + 1)
FAILING_AWAY = SoftAvoid(
    FAILING_WORKLOADS_LABEL, "", 100, FAILING, any_value=True, moved_off_before=BEFORE
)
# Exactly the two terms, nothing else: the scheduler reads this.
FAILING_TERMS = (
    {
        "weight": 100,
        "preference": {
            "matchExpressions": [
                {"key": FAILING_WORKLOADS_LABEL, "operator": "DoesNotExist"},
                {"key": MOVED_OFF_LABEL, "operator": "DoesNotExist"},
            ]
        },
    },
    {
        "weight": 100,
        "preference": {
            "matchExpressions": [
                {"key": FAILING_WORKLOADS_LABEL, "operator": "DoesNotExist"},
                {"key": MOVED_OFF_LABEL, "operator": "Lt", "values": [BEFORE]},
            ]
        },
    },
)


def test_a_replacement_prefers_nodes_where_no_other_workload_fails_while_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = Nodes(["node-1", "node-4"])
    found = burst_admitter(tmp_path, monkeypatch, api)._avoid("3", holder(), "shop", ("node-1",))
    assert [soft.what for soft in found] == [FAILING, "labelled status=presure"]
    # Any count: a node with one failing workload is avoided like one with five; a node marked
    # moved off within the window like one of those.
    assert found[0].terms() == FAILING_TERMS
    assert found[0] == FAILING_AWAY
    assert movedoff.steers_before(NOW, WINDOW) == BEFORE
    # One LIST, one Node back at most, the pod's own exclusions left out by the API server; a
    # failing node found, the marks are not read.
    assert api.calls == [
        {
            "kind": "Node",
            "limit": 1,
            "label_selector": FAILING_WORKLOADS_LABEL,
            "field_selector": "metadata.name!=node-1",
        }
    ]
    # Half a second at most: with the owner lookups (2 s each), within the webhook's 5 s.
    assert api.timeouts == [0.5]


def test_the_two_term_form_has_no_single_term() -> None:
    with pytest.raises(ValueError):
        FAILING_AWAY.term()


# -- how the scheduler scores a node with the two terms -----------------------------------------


def score(terms: tuple[Any, ...], labels: dict[str, str]) -> int:
    """What the NodeAffinity plugin adds up for a node (component-helpers nodeaffinity's
    PreferredSchedulingTerms.Score): the weight of every term whose expressions all match,
    evaluated by the repo's own node-affinity matcher (Lt on integers only)."""
    node = cast(Node, nodes.node("node-9", labels=labels))
    return sum(term["weight"] for term in terms if _term_matches(term["preference"], node))


@pytest.mark.parametrize(
    ("labels", "scored"),
    [
        ({}, 100),
        ({FAILING_WORKLOADS_LABEL: "2"}, 0),
        ({MOVED_OFF_LABEL: seconds(NOW)}, 0),
        # The first fresh second and the last stale one, as movedoff.fresh draws the line.
        ({MOVED_OFF_LABEL: seconds(NOW - WINDOW + timedelta(seconds=1))}, 0),
        ({MOVED_OFF_LABEL: seconds(NOW - WINDOW)}, 100),
        ({MOVED_OFF_LABEL: seconds(NOW - timedelta(hours=3))}, 100),
        # A mark written after the admission (the pod still Pending) steers it too.
        ({MOVED_OFF_LABEL: seconds(NOW + timedelta(seconds=30))}, 0),
        ({FAILING_WORKLOADS_LABEL: "1", MOVED_OFF_LABEL: seconds(NOW - timedelta(hours=3))}, 0),
        ({FAILING_WORKLOADS_LABEL: "1", MOVED_OFF_LABEL: seconds(NOW)}, 0),
        # Not a time: Lt compares integers only, so the node scores as a freshly marked one
        # (never above an unmarked one) until assess-nodes' review removes the label.
        ({MOVED_OFF_LABEL: "soon"}, 0),
    ],
    ids=[
        "unlabelled",
        "failing",
        "marked-now",
        "marked-just-fresh",
        "marked-just-stale",
        "marked-long-ago",
        "marked-after-admission",
        "failing-and-old-mark",
        "failing-and-fresh-mark",
        "not-a-time",
    ],
)
def test_a_freshly_marked_node_scores_as_one_where_workloads_fail(
    labels: dict[str, str], scored: int
) -> None:
    assert score(FAILING_TERMS, labels) == scored
    # The terms never both match: a node scores the weight or nothing, never twice it.
    assert sum(_term_matches(t["preference"], nodes.node(labels=labels)) for t in FAILING_TERMS) < 2
    if labels.get(MOVED_OFF_LABEL, "").isdigit() and FAILING_WORKLOADS_LABEL not in labels:
        # The scheduler and the webhook's gate agree on what is fresh, to the second.
        assert (scored == 0) == movedoff.fresh(labels, NOW, WINDOW)


def test_on_a_cluster_without_marks_the_terms_score_as_the_failing_term_alone() -> None:
    earlier = ({"weight": 100, "preference": {"matchExpressions": [EARLIER_FAILING]}},)
    for labels in ({}, {FAILING_WORKLOADS_LABEL: "3"}, {"zone": "a"}):
        assert score(FAILING_TERMS, labels) == score(earlier, labels)


# -- a pod carrying terms of ours from an earlier admission ------------------------------------

OWN = {
    "weight": 5,
    "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
}
# The user's own term naming the failing-workloads label among others: not ours.
OWN_FAILING = {
    "weight": 7,
    "preference": {
        "matchExpressions": [EARLIER_FAILING, {"key": "disk", "operator": "In", "values": ["ssd"]}]
    },
}


def with_preferred(*terms: Any) -> Any:
    return new_pod(
        affinity={
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": copy.deepcopy(list(terms))
            }
        }
    )


def away_at(moment: datetime, weight: int = 100) -> SoftAvoid:
    return SoftAvoid(
        FAILING_WORKLOADS_LABEL,
        "",
        weight,
        FAILING,
        any_value=True,
        moved_off_before=movedoff.steers_before(moment, WINDOW),
    )


@pytest.mark.parametrize(
    "earlier",
    [
        # Before the moved-off mark: the single failing-workloads term.
        [{"weight": 100, "preference": {"matchExpressions": [EARLIER_FAILING]}}],
        # An earlier admission's two terms, its Lt operand ten minutes old.
        list(away_at(NOW - timedelta(minutes=10)).terms()),
        # Both, from two earlier moves (another weight then).
        [
            {"weight": 50, "preference": {"matchExpressions": [EARLIER_FAILING]}},
            *away_at(NOW - timedelta(minutes=10), weight=50).terms(),
        ],
    ],
    ids=["single-term", "older-operand", "both-and-another-weight"],
)
def test_a_replacement_gets_the_fresh_terms_in_place_of_ours_from_an_earlier_admission(
    earlier: list[Any],
) -> None:
    # A bare pod's replacement is created with the failed pod's spec, affinity and all.
    pod = with_preferred(OWN, PRESSURE.term(), *earlier, OWN_FAILING)
    done = checked_mutate(
        pod, OwnerFacts(policy="3", excluded_nodes=("node-1",), avoid=(FAILING_AWAY, PRESSURE))
    )
    # The user's terms as they were, ours exactly the fresh two (one of ours that is already
    # exactly a fresh one stays where it is: the smallest patch).
    users = [OWN, PRESSURE.term(), OWN_FAILING]
    assert [term for term in preferred(done.pod) if term not in FAILING_TERMS] == users
    assert [term for term in preferred(done.pod) if term in FAILING_TERMS] == list(FAILING_TERMS)
    assert len(preferred(done.pod)) == 5
    gone = [term for term in earlier if term not in FAILING_TERMS]
    assert f"removed {len(gone)} earlier preference term(s) of ours" in done.reasons
    assert f"prefers nodes that are not {FAILING} (weight 100)" in done.reasons


def test_the_same_terms_admitted_again_are_kept_and_a_later_admission_renews_the_operand() -> None:
    facts = OwnerFacts(policy="3", excluded_nodes=("node-1",), avoid=(FAILING_AWAY,))
    once = checked_mutate(with_preferred(OWN), facts).pod
    assert preferred(once) == [OWN, *FAILING_TERMS]
    assert mutate(copy.deepcopy(once), facts).patch == ()
    # A minute later: only the Lt term's operand changes, never a third term.
    later = away_at(NOW + timedelta(minutes=1))
    again = checked_mutate(
        copy.deepcopy(once), OwnerFacts(policy="3", excluded_nodes=("node-1",), avoid=(later,))
    )
    assert preferred(again.pod) == [OWN, *later.terms()]
    assert later.terms()[0] == FAILING_TERMS[0]
    assert [op["op"] for op in again.patch] == ["replace"]
    assert again.patch[0]["value"] == movedoff.steers_before(NOW + timedelta(minutes=1), WINDOW)


def test_without_the_preference_our_earlier_terms_go_and_the_users_stay() -> None:
    # Nothing failing now, or the nodes could not be listed: an old operand would keep the pod
    # off nodes whose marks have long expired.
    pod = with_preferred(OWN, *away_at(NOW - timedelta(minutes=10)).terms(), OWN_FAILING)
    done = checked_mutate(
        pod, OwnerFacts(policy="3", excluded_nodes=("node-1",), avoid=(PRESSURE,))
    )
    assert preferred(done.pod) == [OWN, OWN_FAILING, PRESSURE.term()]
    only_ours = with_preferred(*away_at(NOW - timedelta(minutes=10)).terms())
    done = checked_mutate(only_ours, OwnerFacts(policy="3", excluded_nodes=("node-1",)))
    assert preferred(done.pod) == []
    assert "removed 2 earlier preference term(s) of ours" in done.reasons
    # A pod not placed after a move never got them from us: whatever its terms name, they are
    # its author's, and they stay.
    untouched = mutate(copy.deepcopy(only_ours), OwnerFacts(policy="3"))
    assert preferred(untouched.pod) == preferred(only_ours)
    assert not [op for op in untouched.patch if op["path"].startswith("/spec")]


def test_a_pod_bound_at_creation_keeps_whatever_terms_it_carries() -> None:
    pod = pods.pod(node="node-1", stamp=None)
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": list(
                away_at(NOW - timedelta(minutes=10)).terms()
            )
        }
    }
    done = mutate(pod, OwnerFacts(policy="3", avoid=(FAILING_AWAY,)))
    assert preferred(done.pod) == list(away_at(NOW - timedelta(minutes=10)).terms())


# -- the gate: is there a node such a preference would steer off? ------------------------------

FRESH = seconds(NOW - timedelta(seconds=30))
STALE = seconds(NOW - timedelta(minutes=5))


@pytest.mark.parametrize(
    ("marked", "excluded", "cfg", "gets"),
    [
        # A burst: the replacement's own node and another one marked seconds ago, neither
        # labelled by assess-nodes yet.
        ({"node-1": FRESH, "node-4": FRESH}, ("node-1",), Config(), True),
        ({"node-4": seconds(NOW)}, ("node-1",), Config(), True),
        # Marks whose window has passed (assess-nodes not deployed: nobody removed them).
        ({"node-4": STALE, "node-5": seconds(NOW - WINDOW)}, ("node-1",), Config(), False),
        # Fresh marks only on the nodes the pod is kept off already.
        ({"node-1": FRESH, "node-2": FRESH}, ("node-1", "node-2"), Config(), False),
        # A value that is not a time is no fresh mark.
        ({"node-4": "soon"}, ("node-1",), Config(), False),
        # Marks turned off: not read.
        ({"node-4": FRESH}, ("node-1",), Config(moved_off_mark=False), False),
        # A shorter window: the same mark is stale.
        ({"node-4": FRESH}, ("node-1",), Config(moved_off_window=timedelta(seconds=20)), False),
    ],
    ids=[
        "fresh",
        "marked-now",
        "stale",
        "only-its-own",
        "not-a-time",
        "marks-off",
        "short-window",
    ],
)
def test_a_fresh_moved_off_mark_elsewhere_is_enough_for_the_preference(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    marked: dict[str, str],
    excluded: tuple[str, ...],
    cfg: Config,
    gets: bool,
) -> None:
    api = Nodes([], marked)
    found = burst_admitter(tmp_path, monkeypatch, api, cfg)._avoid("3", holder(), "shop", excluded)
    whats = [soft.what for soft in found]
    assert any(what.startswith("failing for other workloads") for what in whats) == gets
    fields = ",".join(f"metadata.name!={name}" for name in excluded)
    failing_list = {
        "kind": "Node",
        "limit": 1,
        "label_selector": FAILING_WORKLOADS_LABEL,
        "field_selector": fields,
    }
    marks_list = {
        "kind": "Node",
        "limit": MOVED_OFF_LOOKUP_LIMIT,
        "label_selector": MOVED_OFF_LABEL,
        "field_selector": fields,
    }
    # The failing-workloads LIST first; the marks only when it found nothing and marks are on.
    assert api.calls == ([failing_list, marks_list] if cfg.moved_off_mark else [failing_list])
    # Both within the one half second.
    assert api.timeouts[0] == FAILING_LOOKUP_TIMEOUT
    assert all(t is not None and 0 < t <= FAILING_LOOKUP_TIMEOUT for t in api.timeouts)


def test_a_fresh_marks_preference_follows_the_configured_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = Config(moved_off_window=timedelta(minutes=5))
    api = Nodes([], {"node-4": seconds(NOW - timedelta(minutes=4))})
    found = burst_admitter(tmp_path, monkeypatch, api, cfg)._avoid("3", holder(), "shop", ("n",))
    assert found[0].what == "failing for other workloads or moved off within 5m0s"
    assert found[0].moved_off_before == movedoff.steers_before(NOW, timedelta(minutes=5))


@pytest.mark.parametrize(
    ("failing", "marked", "excluded", "down", "marks_down", "cfg"),
    [
        # Only the nodes it failed on itself: those it is kept off already, a preference every
        # other node matches would only dilute its own.
        (["node-1", "node-2"], {}, ("node-1", "node-2"), False, False, Config()),
        # No node where workloads fail, none marked.
        ([], {}, ("node-1",), False, False, Config()),
        # The API cannot say: no preference, and the pod is admitted.
        (["node-4"], {}, ("node-1",), True, False, Config()),
        # The failing nodes are listed, the marked ones cannot be: no preference either.
        ([], {"node-4": FRESH}, ("node-1",), False, True, Config()),
        # Turned off.
        (
            ["node-4"],
            {"node-4": FRESH},
            ("node-1",),
            False,
            False,
            Config(failing_affinity_weight=0),
        ),
    ],
    ids=["only-its-own", "none-failing", "api-down", "marks-unreadable", "off"],
)
def test_a_replacement_gets_no_such_preference_when_it_would_change_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    failing: list[str],
    marked: dict[str, str],
    excluded: tuple[str, ...],
    down: bool,
    marks_down: bool,
    cfg: Config,
) -> None:
    api = Nodes(failing, marked, down=down, marks_down=marks_down)
    found = burst_admitter(tmp_path, monkeypatch, api, cfg)._avoid("3", holder(), "shop", excluded)
    assert FAILING not in [soft.what for soft in found]


def review_of(pod: Any) -> dict[str, Any]:
    return {
        "request": {
            "uid": "u-1",
            "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "shop",
            "object": pod,
        }
    }


@pytest.mark.parametrize(
    ("down", "marks_down"), [(True, False), (False, True)], ids=["api-down", "marks-unreadable"]
)
def test_a_replacement_whose_nodes_cannot_be_listed_is_admitted_with_its_exclusions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, down: bool, marks_down: bool
) -> None:
    # A bare pod's replacement carries its state: no owner lookup, only the Node LISTs.
    state = '{"version":2,"moves":1,"excludedNodes":["node-1"]}'
    pod = pods.pod(
        "solo-3f9c2",
        owner=None,
        node=None,
        stamp=None,
        annotations={"scheduling-retries": "2", STATE_ANNOTATION: state},
        affinity={
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    OWN,
                    *away_at(NOW - timedelta(minutes=10)).terms(),
                ]
            }
        },
    )
    api = Nodes([], {"node-4": FRESH}, down=down, marks_down=marks_down)
    answer = burst_admitter(tmp_path, monkeypatch, api).review(review_of(pod))["response"]
    assert answer["allowed"] is True
    assert answer["patchType"] == "JSONPatch"
    created = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(answer["patch"])))
    required = created["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]}
        ]
    }
    assert preferred(created) == [OWN, PRESSURE.term()]


@pytest.mark.parametrize(
    ("policy", "excluded"),
    [("3", ()), ("0", ("node-1",)), (None, ("node-1",))],
    ids=["first-placement", "policy-zero", "not-opted-in"],
)
def test_a_pod_not_placed_after_a_move_costs_no_lookup(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    policy: str | None,
    excluded: tuple[str, ...],
) -> None:
    api = Nodes(["node-4"], {"node-4": FRESH})
    found = burst_admitter(tmp_path, monkeypatch, api)._avoid(policy, holder(), "shop", excluded)
    assert FAILING not in [soft.what for soft in found]
    assert api.calls == []


def test_the_preference_away_from_failing_nodes_is_a_pod_the_api_server_accepts() -> None:
    done = mutate(
        new_pod(), OwnerFacts(policy="3", excluded_nodes=("node-1",), avoid=(FAILING_AWAY,))
    )
    assert preferred(done.pod) == list(FAILING_TERMS)
    assert api_server_errors(done.pod) == []
    assert f"prefers nodes that are not {FAILING} (weight 100)" in done.reasons
    # What the API server checks of a preferred term (ValidateNodeSelectorRequirement) and the
    # scheduler parses (labels.NewRequirement: Lt needs one integer, or the pod cannot be
    # scored): one value, a label value, a whole number.
    for term in preferred(done.pod):
        assert 1 <= term["weight"] <= 100
        for expression in term["preference"]["matchExpressions"]:
            if expression["operator"] == "DoesNotExist":
                assert "values" not in expression
            else:
                (value,) = expression["values"]
                assert value.isdigit() and len(value) <= 63
