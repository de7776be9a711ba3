"""A Deployment's policy and our state on it: what update-annotations decides about the
Deployment above a failing pod's ReplicaSet, and a model of kubectl and the Deployment
controller showing that the budget holds through `kubectl rollout undo`."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from shared.api.keys import POLICY_ANNOTATION, STATE_ANNOTATION
from shared.api.state import WorkloadState, dump_state, load_state
from shared.pods.update_annotations.rollouts import deployment_of, settle, strip_state_patch
from shared.workloads.owners import Ref, Resolution, holder_of
from shared.workloads.policy import OwnerKind, Policy
from shared.workloads.state import Action, FailureFacts, plan
from tests import builders

from . import pods
from .pods import NOW
from .test_owners import replicaset, statefulset

DEPLOYMENT_UID = pods.uid("Deployment/web")
WEB = Ref("Deployment", "shop", "web", DEPLOYMENT_UID, "apps/v1")
RS_UID = pods.uid("ReplicaSet/web-7d9c8b6f4")
A_STATE = dump_state(WorkloadState(moves=1, excluded_nodes=("node-a",), holder_uid="x"))


def web_deployment(
    annotations: dict[str, str] | None = None,
    uid: str = DEPLOYMENT_UID,
    policy: str | None = "3",
) -> dict[str, Any]:
    """The Deployment `web` as the API server returns it, at its third revision."""
    return builders.deployment(
        "web",
        replicas=3,
        retries=policy,
        annotations={"deployment.kubernetes.io/revision": "3", **(annotations or {})},
        template=builders.template(
            {"app": "web"}, containers=[builders.container("web")], grace_period=None
        ),
        namespace="shop",
        uid=uid,
        resource_version="51870",
        generation=3,
    )


def resolved(kind: str, obj: dict[str, Any]) -> Resolution:
    """What `owners.resolve` gives for a pod whose controller is `obj` (read by one GET)."""
    holder = holder_of(kind, obj)
    policy = holder.annotations.get(POLICY_ANNOTATION)
    return Resolution(kind, holder, policy, holder.ref if policy else None, chain=(holder.ref,))


RS = resolved("ReplicaSet", replicaset())


def test_only_a_replicaset_controlled_by_a_deployment_has_one_to_read() -> None:
    assert deployment_of(RS) == WEB
    assert deployment_of(resolved("ReplicaSet", replicaset(deployment=None))) is None
    assert deployment_of(resolved("StatefulSet", statefulset())) is None
    assert deployment_of(Resolution("DaemonSet", None, None, None, "never moved")) is None


class Case(NamedTuple):
    deployment: Any
    policy: str | None
    policy_ref: Ref | None
    strip: bool
    said: tuple[str, ...]


SETTLE = {
    "a Deployment with the same policy changes nothing": Case(
        web_deployment(), "3", RS.policy_ref, False, ()
    ),
    "our state on the Deployment is removed": Case(
        web_deployment({STATE_ANNOTATION: A_STATE}), "3", RS.policy_ref, True, ("rollout undo",)
    ),
    "a policy removed from the Deployment means not opted in, read as 0": Case(
        web_deployment(policy=None),
        "0",
        WEB,
        False,
        ("no longer has scheduling-retries", "never deletes a key", "not opted in"),
    ),
    "a policy changed on the Deployment applies before the copy reaches the ReplicaSet": Case(
        web_deployment({POLICY_ANNOTATION: "0"}), "0", WEB, False, ("the Deployment's applies",)
    ),
    "a Deployment gone leaves the ReplicaSet's own policy": Case(
        None, "3", RS.policy_ref, False, ("is gone",)
    ),
    "a namesake Deployment is not this ReplicaSet's": Case(
        web_deployment({POLICY_ANNOTATION: "0", STATE_ANNOTATION: A_STATE}, uid=pods.uid("other")),
        "3",
        RS.policy_ref,
        False,
        ("namesake",),
    ),
}


@pytest.mark.parametrize("case", SETTLE.values(), ids=SETTLE.keys())
def test_the_deployment_above_a_replicaset(case: Case) -> None:
    settled = settle(RS, case.deployment)
    assert settled.resolution.policy == case.policy
    assert settled.resolution.policy_ref == case.policy_ref
    assert settled.resolution.holder == RS.holder
    assert settled.strip_state is case.strip
    said = " ".join(settled.notes)
    assert all(words in said for words in case.said), said
    if not case.said:
        assert settled.notes == ()


def test_a_holder_without_a_deployment_is_left_as_resolved() -> None:
    for resolution in (
        resolved("ReplicaSet", replicaset(deployment=None)),
        resolved("StatefulSet", statefulset()),
    ):
        assert (
            settle(resolution, web_deployment({STATE_ANNOTATION: A_STATE})).resolution == resolution
        )
        assert not settle(resolution, None).strip_state


def test_the_strip_removes_our_state_and_nothing_else() -> None:
    # RFC 7386: a null removes the key, absent keys are left alone.
    assert strip_state_patch() == {
        "metadata": {"annotations": {STATE_ANNOTATION: None, "kn-rescheduler.io/avoid-nodes": None}}
    }


# A model of the two copiers, after their Go sources (Kubernetes 1.36), and of the order in
# which update-annotations works. Annotations only: nothing else matters here.

SKIPPED = frozenset(
    {
        "kubectl.kubernetes.io/last-applied-configuration",
        "deployment.kubernetes.io/revision",
        "deployment.kubernetes.io/revision-history",
        "deployment.kubernetes.io/desired-replicas",
        "deployment.kubernetes.io/max-replicas",
        "deprecated.deployment.rollback.to",
    }
)


def kubectl_rollout_undo(dep: dict[str, str], target: dict[str, str]) -> dict[str, str]:
    """rollback.go: the Deployment's skipped keys, then every other key of the target RS; the
    result replaces the Deployment's annotations (JSON Patch `replace`)."""
    kept = {k: v for k, v in dep.items() if k in SKIPPED}
    return kept | {k: v for k, v in target.items() if k not in SKIPPED}


def controller_sync(dep: dict[str, str], newest: dict[str, str]) -> None:
    """copyDeploymentAnnotationsToReplicaSet: every key but the skipped ones, over whatever the
    newest ReplicaSet has; nothing is ever deleted."""
    for key, value in dep.items():
        if key not in SKIPPED and newest.get(key) != value:
            newest[key] = value


class Cluster:
    """One Deployment and its newest ReplicaSet, as annotations, and update-annotations."""

    def __init__(self, dep: dict[str, str], rs: dict[str, Any], *, strip: bool = True) -> None:
        self.dep = dep
        self.rs = rs
        # False: update-annotations as it was, leaving the Deployment's copy in place.
        self.strip = strip
        self.moves = 0

    @property
    def rs_annotations(self) -> dict[str, str]:
        return self.rs["metadata"]["annotations"]  # type: ignore[no-any-return]

    def fail(self, pod: int, node: str) -> Action:
        """update-annotations handling one failing pod: settle with the Deployment (removing
        our state from it), plan on the ReplicaSet's state, write it. Then the controller
        syncs, as the write wakes it."""
        settled = settle(resolved("ReplicaSet", self.rs), web_deployment(self.dep))
        if settled.strip_state and self.strip:
            del self.dep[STATE_ANNOTATION]
        holder = settled.resolution.holder
        assert holder is not None and settled.resolution.policy is not None
        policy = Policy(int(settled.resolution.policy), OwnerKind.REPLICA_SET, replicas=1)
        name = f"web-7d9c8b6f4-p{pod:03d}"
        facts = FailureFacts(name, pods.uid(name), OwnerKind.REPLICA_SET, node, "ErrImagePull")
        state = load_state(self.rs_annotations.get(STATE_ANNOTATION))
        decided = plan(state, facts, policy, NOW, holder_uid=holder.ref.uid)
        if decided.new_state is not None:
            self.rs_annotations[STATE_ANNOTATION] = dump_state(decided.new_state)
        if decided.action is Action.MOVE:
            self.moves += 1
        controller_sync(self.dep, self.rs_annotations)
        return decided.action


def undone(*, strip: bool = True) -> Cluster:
    """Revision 1 (a budget of 2 x 1 replica) moved one pod; revision 2 was rolled out; then
    `kubectl rollout undo` went back to revision 1."""
    first = replicaset(annotations={POLICY_ANNOTATION: "2"})
    first["spec"]["replicas"] = 1
    rs_uid = first["metadata"]["uid"]
    first["metadata"]["annotations"][STATE_ANNOTATION] = dump_state(
        WorkloadState(moves=1, excluded_nodes=("node-0",), handled=("p0",), holder_uid=rs_uid)
    )
    dep = web_deployment({POLICY_ANNOTATION: "2", "deployment.kubernetes.io/revision": "2"})
    dep_annotations = kubectl_rollout_undo(
        dep["metadata"]["annotations"], first["metadata"]["annotations"]
    )
    assert STATE_ANNOTATION in dep_annotations  # what kubectl really does
    return Cluster(dep_annotations, first, strip=strip)


def test_through_a_rollout_undo_the_budget_allows_exactly_its_moves() -> None:
    cluster = undone()
    actions = [cluster.fail(pod, f"node-{pod % 4}") for pod in range(1, 11)]
    # One move left after the undo, then the budget is spent and said so once.
    assert cluster.moves == 1
    assert actions[:2] == [Action.MOVE, Action.EXHAUSTED]
    assert set(actions[2:]) == {Action.NOTHING}
    assert STATE_ANNOTATION not in cluster.dep
    assert load_state(cluster.rs_annotations[STATE_ANNOTATION]).moves == 2


def test_a_rollout_after_an_undo_starts_afresh_from_the_copy_it_is_born_with() -> None:
    cluster = undone()
    # A new revision before any failure: the controller gives the new ReplicaSet every
    # annotation of the Deployment, the copy of the old state included.
    born = replicaset("web-5c8f9d7b6", annotations={POLICY_ANNOTATION: "2"})
    born["spec"]["replicas"] = 1
    controller_sync(cluster.dep, born["metadata"]["annotations"])
    cluster = Cluster(cluster.dep, born)
    assert load_state(cluster.rs_annotations[STATE_ANNOTATION]).moves == 1
    actions = [cluster.fail(pod, f"node-{pod % 4}") for pod in range(1, 11)]
    assert cluster.moves == 2
    assert actions[:3] == [Action.MOVE, Action.MOVE, Action.EXHAUSTED]
    state = load_state(cluster.rs_annotations[STATE_ANNOTATION])
    assert state.holder_uid == born["metadata"]["uid"]
    assert STATE_ANNOTATION not in cluster.dep


def test_the_model_reproduces_the_finding_when_the_deployment_keeps_its_copy() -> None:
    # The same story without the strip: the controller undoes every write, the count stays 1.
    cluster = undone(strip=False)
    actions = [cluster.fail(pod, f"node-{pod % 4}") for pod in range(1, 11)]
    assert cluster.moves == 10 and set(actions) == {Action.MOVE}
    assert load_state(cluster.rs_annotations[STATE_ANNOTATION]).moves == 1


def test_without_its_policy_our_exclusions_in_a_pods_way_are_still_cleared() -> None:
    # The ReplicaSet keeps its copy of the policy, so the webhook still adds the recorded
    # exclusions; a pod they keep from being scheduled must not stay Pending for ever.
    rs = replicaset(annotations={STATE_ANNOTATION: A_STATE.replace('"x"', '"' + RS_UID + '"')})
    settled = settle(resolved("ReplicaSet", rs), web_deployment(policy=None))
    assert settled.resolution.policy is not None
    policy = Policy(int(settled.resolution.policy), OwnerKind.REPLICA_SET, replicas=3)
    state = load_state(rs["metadata"]["annotations"][STATE_ANNOTATION])
    name = "web-7d9c8b6f4-q8w2n"
    stuck = FailureFacts(
        name, pods.uid(name), OwnerKind.REPLICA_SET, None, "Unschedulable", unschedulable=True
    )
    cleared = plan(state, stuck, policy, NOW, holder_uid=RS_UID)
    assert (cleared.action, cleared.excluded_nodes) == (Action.CLEAR_AND_MOVE, ())
    failing = FailureFacts(name, pods.uid(name), OwnerKind.REPLICA_SET, "node-b", "ErrImagePull")
    assert plan(state, failing, policy, NOW, holder_uid=RS_UID).reason == "policy-disabled"
