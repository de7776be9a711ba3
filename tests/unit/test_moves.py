"""Removing a pod whose move is decided: which API refusals mean "not now", what people are
told, and how the one Event per (object, reason) is counted.

The end-to-end stories (a PodDisruptionBudget, ephemeral containers, RBAC) run on the real
control plane in tests/e2e/test_moves.py; here are the pure decisions, table-driven, with the
error bodies exactly as kube-apiserver writes them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.api.keys import (
    REASON_EXCLUSIONS_CLEARED,
    REASON_MOVE_DEFERRED,
    REASON_REPLACEMENT_NOT_ALLOWED,
    REASON_REPLACEMENT_REFUSED,
    REASON_RESCHEDULED,
)
from shared.platform import kube
from shared.platform.config import Config
from shared.pods.update_annotations.bodies import event_name
from shared.pods.update_annotations.decide import moved
from shared.pods.update_annotations.handler import (
    BARE_POD_CLUSTER_ROLE,
    Rescheduler,
    Step,
    deferral_for,
)
from shared.workloads.classify import Failure, FailureKind
from shared.workloads.owners import Ref
from shared.workloads.state import Action, Plan

NOW = datetime(2026, 3, 14, 9, 26, 53, tzinfo=UTC)
EVICT = "POST /api/v1/namespaces/shop/pods/web-7d9c8b6f4-x2x9z/eviction"
CREATE = "POST /api/v1/namespaces/shop/pods"


def status(code: int, reason: str, message: str, **details: Any) -> bytes:
    """A metav1.Status as the API server writes it (a StatusCause's type is "reason")."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return json.dumps(body).encode()


# pkg/registry/core/pod/storage/eviction.go, checkAndDecrement: DisruptionsAllowed == 0.
PDB_REFUSES = status(
    429,
    "TooManyRequests",
    "Cannot evict pod as it would violate the pod's disruption budget.",
    causes=[
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget web needs 1 healthy pods and has 1 currently",
        }
    ],
)
# The same file, createTooManyRequestsError: the controller has not observed the budget yet.
PDB_UNOBSERVED = status(
    429,
    "TooManyRequests",
    "Cannot evict pod as it would violate the pod's disruption budget.",
    retryAfterSeconds=10,
    causes=[
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget web is still being processed by the server.",
        }
    ],
)
# API Priority and Fairness throttling: a 429 with no budget in it.
THROTTLED = status(429, "TooManyRequests", "Too many requests, please try again later.")
RBAC_DENIES = status(
    403,
    "Forbidden",
    'pods is forbidden: User "system:serviceaccount:kn-rescheduler:update-annotations" cannot '
    'create resource "pods" in API group "" in the namespace "shop"',
    kind="pods",
)
QUOTA_DENIES = status(
    403,
    "Forbidden",
    'pods "solo-3f2a1" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=4, '
    "limited: pods=4",
    name="solo-3f2a1",
    kind="pods",
)
INVALID = status(
    422,
    "Invalid",
    'Pod "solo-3f2a1" is invalid: spec.ephemeralContainers: Forbidden: cannot be set on create',
    name="solo-3f2a1",
    kind="Pod",
)


def error(code: int, body: bytes, what: str) -> kube.KubeError:
    return kube._error_for(code, body, what)


def test_a_budget_refusal_is_told_apart_from_throttling() -> None:
    refused = error(429, PDB_REFUSES, EVICT)
    assert isinstance(refused, kube.DisruptionBudgetRefused)
    assert refused.causes == ("The disruption budget web needs 1 healthy pods and has 1 currently",)
    assert "needs 1 healthy pods" in str(refused)
    assert isinstance(error(429, PDB_UNOBSERVED, EVICT), kube.DisruptionBudgetRefused)
    throttled = error(429, THROTTLED, EVICT)
    assert isinstance(throttled, kube.Transient)
    assert not isinstance(throttled, kube.DisruptionBudgetRefused)


@pytest.mark.parametrize(
    ("step", "code", "body", "what", "reason", "says"),
    [
        (Step.EVICTION, 429, PDB_REFUSES, EVICT, REASON_MOVE_DEFERRED, "needs 1 healthy pods"),
        (Step.EVICTION, 429, PDB_UNOBSERVED, EVICT, REASON_MOVE_DEFERRED, "being processed"),
        (
            Step.REPLACEMENT,
            403,
            RBAC_DENIES,
            CREATE,
            REASON_REPLACEMENT_NOT_ALLOWED,
            f"ClusterRole {BARE_POD_CLUSTER_ROLE}",
        ),
        (Step.REPLACEMENT, 403, QUOTA_DENIES, CREATE, REASON_REPLACEMENT_REFUSED, "quota"),
        (Step.REPLACEMENT, 422, INVALID, CREATE, REASON_REPLACEMENT_REFUSED, "cannot be set"),
        # Errors a person must fix, or that a redelivery fixes: raised, not deferred.
        (Step.EVICTION, 429, THROTTLED, EVICT, None, ""),
        (Step.EVICTION, 403, RBAC_DENIES, EVICT, None, ""),
        (Step.EVICTION, 500, status(500, "InternalError", "etcd"), EVICT, None, ""),
        (Step.REPLACEMENT, 503, status(503, "ServiceUnavailable", "x"), CREATE, None, ""),
    ],
)
def test_which_refusals_of_a_removal_mean_not_now(
    step: Step, code: int, body: bytes, what: str, reason: str | None, says: str
) -> None:
    deferral = deferral_for(step, error(code, body, what), "shop", "solo", charged=False)
    if reason is None:
        assert deferral is None
        return
    assert deferral is not None
    assert deferral.reason == reason
    assert says in deferral.message
    assert "pod shop/solo" in deferral.message
    assert "not counted" in deferral.message
    assert "sweep" in deferral.message


def test_a_refusal_after_the_move_was_recorded_says_it_is_not_counted_twice() -> None:
    deferral = deferral_for(
        Step.EVICTION, error(429, PDB_REFUSES, EVICT), "shop", "web", charged=True
    )
    assert deferral is not None
    assert "counted once and will not be counted again" in deferral.message


@pytest.mark.parametrize("installed_in", ["kn-rescheduler", "platform-tools"])
def test_a_refused_bare_pod_replacement_names_the_role_binding_that_enables_it(
    installed_in: str,
) -> None:
    deferral = deferral_for(
        Step.REPLACEMENT,
        error(403, RBAC_DENIES, CREATE),
        "shop",
        "solo",
        charged=False,
        installed_in=installed_in,
    )
    assert deferral is not None
    assert "RoleBinding in shop" in deferral.message
    assert f"ServiceAccount {installed_in}/update-annotations" in deferral.message


FAILURE = Failure(FailureKind.NODE_FIXABLE, "CrashLoopBackOff", "back-off", "node-b")
UNSCHEDULABLE = Failure(FailureKind.EXCLUSIONS_UNSCHEDULABLE, "Unschedulable", "0/4", None)
MOVE = Plan(
    Action.MOVE,
    None,
    "node-failure",
    REASON_RESCHEDULED,
    "moved pod web off node node-b after CrashLoopBackOff (move 1 of 3); excluded nodes now: "
    "node-b",
    delete_pod=True,
    moves=1,
    budget=3,
    excluded_nodes=("node-b",),
)
HANDLED = Plan(
    Action.NOTHING,
    None,
    "already-handled",
    None,
    "pod web (uid u) was already moved; nothing more to record",
    delete_pod=True,
    moves=2,
    budget=3,
    excluded_nodes=("node-b", "node-c"),
)


@pytest.mark.parametrize(
    ("decided", "failure", "action", "reason", "says"),
    [
        # Planned now: the plan's own Event.
        (MOVE, FAILURE, Action.MOVE, REASON_RESCHEDULED, "(move 1 of 3)"),
        # Recorded by an earlier delivery, removed by this one (after a PodDisruptionBudget
        # let it, or after a crash between the state write and the delete).
        (HANDLED, FAILURE, Action.MOVE, REASON_RESCHEDULED, "node-b, node-c"),
        (HANDLED, UNSCHEDULABLE, Action.CLEAR_AND_MOVE, REASON_EXCLUSIONS_CLEARED, "stay 2/3"),
    ],
)
def test_what_is_said_once_a_pod_is_really_gone(
    decided: Plan, failure: Failure, action: Action, reason: str, says: str
) -> None:
    said = moved(decided, failure, "web")
    assert (said.action, said.event_reason) == (action, reason)
    assert says in said.message


class BusyEvents(kube.Kube):
    """Every count on the Event loses the race (409 on the resourceVersion). A real API
    server gives that only under a load no test can time; the fake is for that path alone."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def create(self, kind: str, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("create")
        raise kube.AlreadyExists("exists", 409, "AlreadyExists")

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        self.calls.append("get")
        return {"metadata": {"name": name, "resourceVersion": "7"}, "count": 2}

    def merge_patch(
        self, kind: str, namespace: str | None, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        self.calls.append("patch")
        raise kube.Conflict("changed", 409, "Conflict")


def test_counting_an_event_gives_up_quietly_after_a_few_lost_races() -> None:
    api = BusyEvents()
    rescheduler = Rescheduler(api, Config(), clock=lambda: NOW)
    ref = Ref("ReplicaSet", "shop", "web-7d9c8b6f4", "uid-1")
    rescheduler._event(ref, "InvalidPolicy", "not a number", warning=True)
    assert api.calls == ["create"] + ["get", "patch"] * 3
    assert event_name(ref, "InvalidPolicy", "not a number").startswith("web-7d9c8b6f4.")
