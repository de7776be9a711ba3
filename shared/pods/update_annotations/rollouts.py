"""Deployments and the state kept on their ReplicaSets: `kubectl rollout undo`, and a policy
removed from a Deployment.

What Kubernetes does (kubectl's polymorphichelpers/rollback.go; the Deployment controller's
deployment/util/deployment_util.go and sync.go; checked against Kubernetes 1.36):

- `kubectl rollout undo` patches the Deployment with a JSON Patch that replaces
  `/metadata/annotations` with the annotations of the ReplicaSet it rolls back to, all but its
  `annotationsToSkip` (last-applied-configuration, `deployment.kubernetes.io/revision`,
  `revision-history`, `desired-replicas`, `max-replicas`, the deprecated rollbackTo), which
  keep the Deployment's values. Our state on that ReplicaSet lands on the Deployment.
- The Deployment controller, on every sync (getNewReplicaSet -> SetNewReplicaSetAnnotations ->
  copyDeploymentAnnotationsToReplicaSet), copies every Deployment annotation but the same skip
  list onto the newest ReplicaSet wherever the values differ, and gives all of them to a
  ReplicaSet it creates. It never deletes a key and never touches older ReplicaSets. An update
  of a ReplicaSet wakes its Deployment's sync.

So after an undo, each state written on the rolled-back ReplicaSet is overwritten moments later
by the copy on the Deployment: the count never grows (on the local control plane, 7 pods
removed against a budget of 2 before the test gave up), and the next rollout's ReplicaSet is
born with the old state.

What we do:

1. Every state records its holder's uid (`shared.workloads.state`, "Whose state"): a ReplicaSet
born with
   a copy (the next rollout) has its copy ignored by update-annotations and the webhook. That
   alone is not enough: after an undo, the copy on the Deployment is the rolled-back
   ReplicaSet's own state, an older version of it, with its own uid.
2. So update-annotations removes our state from the Deployment (a JSON merge patch setting the
   key to null; no precondition is needed, since our state never belongs on a Deployment)
   before it writes the ReplicaSet's state. From then on the controller has nothing of ours to
   copy. That costs one GET of the Deployment per delivery for a Deployment's pod, on the
   failure path only: the webhook's hot path never reads a Deployment.
3. The Deployment is where the user states the policy; its ReplicaSets hold copies that lag
   (never deleted, and only the newest one updated). update-annotations takes the
   Deployment's `scheduling-retries` for the pods of its ReplicaSets: a changed value applies
   to the pods of older ReplicaSets too, and a policy removed from the Deployment means "not
   opted in" whatever its ReplicaSet still carries. Removed is read as "0", not as "no policy
   at all": the ReplicaSet's copy keeps the webhook adding the recorded exclusions to new pods,
   and with "0" update-annotations still clears those when they keep a pod from being
   scheduled (`state.plan` does that even with rescheduling off: we caused it), where "no
   policy" would leave such a pod Pending for ever. (A policy put on a Deployment's
   ReplicaSet by hand cannot be told from a stale copy, so it is not honoured.)

Why not keep the state where the controller does not copy it: it copies every annotation but
a fixed list, so no key of ours escapes it; labels are too small for the state (63
characters); a separate object per workload would add a read to the webhook's hot path and
more RBAC.

What remains:

- `scheduling-retries: "0"` takes effect at once and everywhere: the controller copies the new
  value onto the newest ReplicaSet within a sync, where the webhook reads it (no exclusions
  for 0), and update-annotations reads it from the Deployment. Removing the annotation stops
  the moves at the next failure (update-annotations reads the Deployment), but the ReplicaSet
  keeps its copy until the next rollout replaces it, so the webhook goes on stamping its new
  pods and adding the recorded exclusions (cleared if they keep a pod from being scheduled).
  To stop everything at once, set "0" rather than removing the annotation.
- A narrow race right after an undo: the controller may sync from a cached Deployment that
  still has the copy after we removed it, and overwrite the state written at that moment. At
  most the writes of those milliseconds are lost, once per undo: nothing puts the copy back.
- A Deployment we may not read or patch (RBAC not updated) leaves things as before this
  module, said in the trace: the policy of the ReplicaSet, and the copy on the Deployment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from shared.api.avoidnodes import ANNOTATION as AVOID_NODES_ANNOTATION
from shared.api.keys import POLICY_ANNOTATION, STATE_ANNOTATION
from shared.platform import kube
from shared.workloads.owners import REPLICASET, Ref, Resolution

DEPLOYMENT: Final = "Deployment"
# The policy of a Deployment's pods once the Deployment lost its own (see the docstring, 3.).
REMOVED: Final = "0"


@dataclass(frozen=True)
class Settled:
    """The pod's resolution with its Deployment taken into account, and what to do about the
    Deployment."""

    resolution: Resolution
    # The Deployment carries our state (a copy kubectl made): remove it.
    strip_state: bool = False
    # What was found and done, in words, for the trace.
    notes: tuple[str, ...] = ()


def deployment_of(resolution: Resolution) -> Ref | None:
    """The Deployment controlling the holder, when the holder is a ReplicaSet that has one."""
    holder = resolution.holder
    if holder is None or holder.ref.kind != REPLICASET:
        return None
    controller = holder.controller
    if controller is None or controller.kind != DEPLOYMENT:
        return None
    return controller


def settle(resolution: Resolution, deployment: Mapping[str, Any] | None) -> Settled:
    """Take the Deployment (as read; None when it is gone) into account: its policy is the
    pod's, and our state on it must go."""
    ref = deployment_of(resolution)
    if ref is None:
        return Settled(resolution)
    if deployment is None:
        return Settled(
            resolution, notes=(f"{ref.describe()} is gone: the ReplicaSet's own policy applies",)
        )
    meta = deployment.get("metadata") or {}
    if ref.uid and meta.get("uid") != ref.uid:
        return Settled(
            resolution,
            notes=(
                f"{ref.describe()} was replaced by a namesake: the ReplicaSet's own policy applies",
            ),
        )
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    notes: list[str] = []
    strip = STATE_ANNOTATION in annotations
    if strip:
        notes.append(
            f"{ref.describe()} carries a copy of our state (kubectl rollout undo copies a "
            "ReplicaSet's annotations onto its Deployment); removing it, so that the "
            "Deployment controller stops copying it over the ReplicaSet's state"
        )
    policy = annotations.get(POLICY_ANNOTATION)
    settled = resolution
    if policy is None and resolution.policy is not None:
        notes.append(
            f"{ref.describe()} no longer has {POLICY_ANNOTATION} (its ReplicaSet keeps a copy: "
            "the Deployment controller never deletes a key): the workload is not opted in, "
            f"read as {POLICY_ANNOTATION}={REMOVED!r} (no pod is moved; exclusions of ours that "
            "keep a pod from being scheduled are still cleared)"
        )
        settled = replace(resolution, policy=REMOVED, policy_ref=ref)
    elif policy is not None and policy != resolution.policy:
        was = "none" if resolution.policy is None else repr(resolution.policy[:64])
        notes.append(
            f"{ref.describe()} has {POLICY_ANNOTATION}={policy[:64]!r}, its ReplicaSet {was} "
            "(the controller copies it onto the newest ReplicaSet only): the Deployment's applies"
        )
        settled = replace(resolution, policy=policy, policy_ref=ref)
    return Settled(settled, strip, tuple(notes))


def strip_state_patch() -> dict[str, Any]:
    """A JSON merge patch removing our state, and only it (with its flat exclusions), from a
    Deployment."""
    return {"metadata": {"annotations": {STATE_ANNOTATION: None, AVOID_NODES_ANNOTATION: None}}}


def check_deployment(api: kube.Kube, resolution: Resolution) -> Settled:
    """Read the holder's Deployment (nothing for other holders), settle, and remove our state
    from it when it carries some. Call before writing the ReplicaSet's state.

    A Deployment we may not read or patch is said in the notes and changes nothing (the
    install's RBAC may predate this); other API errors are raised.
    """
    ref = deployment_of(resolution)
    if ref is None:
        return Settled(resolution)
    grant = "grant update-annotations get and patch on deployments (knative/rbac.yaml)"
    try:
        obj: Mapping[str, Any] | None = api.get(DEPLOYMENT, ref.namespace, ref.name)
    except kube.NotFound:
        obj = None
    except kube.Forbidden as exc:
        return Settled(
            resolution,
            notes=(
                f"may not read {ref.describe()} ({exc}): after kubectl rollout undo its "
                f"copy of our state can undo our counts; {grant}",
            ),
        )
    settled = settle(resolution, obj)
    if not settled.strip_state:
        return settled
    try:
        api.merge_patch(DEPLOYMENT, ref.namespace, ref.name, strip_state_patch())
        done = f"removed our state from {ref.describe()}"
    except kube.NotFound:
        done = f"{ref.describe()} is gone meanwhile"
    except kube.Forbidden as exc:
        done = f"may not remove our state from {ref.describe()} ({exc}); {grant}"
    return replace(settled, notes=(*settled.notes, done))
