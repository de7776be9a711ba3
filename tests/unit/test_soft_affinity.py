"""The webhook's soft affinities away from suspect nodes and nodes under pressure.

Preferred, never required: the scheduler scores those nodes lower and still uses them when
nothing else fits. They are labels, so the webhook needs no lookup of the nodes, except one
LIST (a label and a field selector, one Node back at most) for a replacement: whether a node
outside its own exclusions has failing workloads.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from shared.admission.decide import OwnerFacts, SoftAvoid, mutate
from shared.admission.handler import Admitter
from shared.api.keys import (
    AVOID_PRESSURE_KEY,
    FAILING_WORKLOADS_LABEL,
    LOAD_AWARE_KEY,
    LOAD_LABEL,
    SUSPECT_LABEL,
)
from shared.platform import kube
from shared.platform.config import Config
from shared.workloads.owners import Holder, Ref

from . import pods
from .apivalidation import api_server_errors

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


def admitter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: Config) -> Admitter:
    # An API server nobody listens on: the namespace lookup fails, which must mean "no".
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    return Admitter(kube.Kube.from_environment, cfg)


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
    """The API as the webhook's one Node LIST sees it: the nodes carrying the failing-workloads
    label, filtered by the field selector as the API server filters it."""

    def __init__(self, failing: list[str], *, down: bool = False) -> None:
        self.failing = failing
        self.down = down
        self.calls: list[dict[str, Any]] = []
        self.timeouts: list[float | None] = []

    def with_options(self, *, timeout: float | None = None) -> Nodes:
        self.timeouts.append(timeout)
        return self

    def list_page(self, kind: str, namespace: str | None = None, **query: Any) -> dict[str, Any]:
        self.calls.append({"kind": kind, **query})
        if self.down:
            raise kube.Transient("connection refused")
        assert query["label_selector"] == FAILING_WORKLOADS_LABEL
        unwanted = {f.split("!=", 1)[1] for f in query["field_selector"].split(",")}
        items = [{"metadata": {"name": n}} for n in self.failing if n not in unwanted]
        return {"items": items[: query["limit"]]}

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        # The namespace's opt-in labels: none here.
        return {"metadata": {"name": name, "labels": {}}}


def burst_admitter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: Nodes, cfg: Config | None = None
) -> Admitter:
    made = admitter(tmp_path, monkeypatch, cfg or Config())
    made._api = api  # type: ignore[assignment]
    return made


FAILING = "failing for other workloads"


def test_a_replacement_prefers_nodes_where_no_other_workload_fails_while_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = Nodes(["node-1", "node-4"])
    found = burst_admitter(tmp_path, monkeypatch, api)._avoid("3", holder(), "shop", ("node-1",))
    assert [soft.what for soft in found] == [FAILING, "labelled status=presure"]
    # Any count: a node with one failing workload is avoided like one with five.
    assert found[0].term() == {
        "weight": 100,
        "preference": {
            "matchExpressions": [{"key": FAILING_WORKLOADS_LABEL, "operator": "DoesNotExist"}]
        },
    }
    # One LIST, one Node back at most, the pod's own exclusions left out by the API server.
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


@pytest.mark.parametrize(
    ("failing", "excluded", "down", "cfg"),
    [
        # Only the nodes it failed on itself: those it is kept off already, a preference every
        # other node matches would only dilute its own.
        (["node-1", "node-2"], ("node-1", "node-2"), False, Config()),
        # No node where workloads fail.
        ([], ("node-1",), False, Config()),
        # The API cannot say: no preference, and the pod is admitted.
        (["node-4"], ("node-1",), True, Config()),
        # Turned off.
        (["node-4"], ("node-1",), False, Config(failing_affinity_weight=0)),
    ],
    ids=["only-its-own", "none-failing", "api-down", "off"],
)
def test_a_replacement_gets_no_such_preference_when_it_would_change_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    failing: list[str],
    excluded: tuple[str, ...],
    down: bool,
    cfg: Config,
) -> None:
    api = Nodes(failing, down=down)
    found = burst_admitter(tmp_path, monkeypatch, api, cfg)._avoid("3", holder(), "shop", excluded)
    assert FAILING not in [soft.what for soft in found]


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
    api = Nodes(["node-4"])
    found = burst_admitter(tmp_path, monkeypatch, api)._avoid(policy, holder(), "shop", excluded)
    assert FAILING not in [soft.what for soft in found]
    assert api.calls == []


def test_the_preference_away_from_failing_nodes_is_a_pod_the_api_server_accepts() -> None:
    soft = SoftAvoid(FAILING_WORKLOADS_LABEL, "", 100, FAILING, any_value=True)
    done = mutate(new_pod(), OwnerFacts(policy="3", excluded_nodes=("node-1",), avoid=(soft,)))
    assert soft.term() in preferred(done.pod)
    assert api_server_errors(done.pod) == []
    assert f"prefers nodes that are not {FAILING} (weight 100)" in done.reasons
