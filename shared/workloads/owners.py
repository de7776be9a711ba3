"""Who owns a pod, where its policy comes from, and where its state is kept.

The chains Kubernetes builds:

    Pod -> ReplicaSet -> Deployment     state on the ReplicaSet (a rollout starts afresh)
    Pod -> StatefulSet                  state on the StatefulSet, per pod name
    Pod -> Job -> CronJob               state on the Job (the CronJob makes a Job per run)
    Pod -> DaemonSet                    never moved: it belongs on every node
    Pod (no controller)                 state on the pod itself

The policy (``scheduling-retries``) is read from the nearest object of the chain, starting at
the pod's controller, that has it. The Deployment controller copies a Deployment's annotations
onto its ReplicaSets, so a Deployment's policy is found on the ReplicaSet and ``resolve`` never
reads the Deployment: one GET per pod create in the webhook's hot path. The copy lags in one
way that matters (the controller never deletes a key, so a policy removed from the Deployment
stays on its ReplicaSets), and ``kubectl rollout undo`` copies our state onto the Deployment:
update-annotations, on its failure path only, reads the Deployment the holder names as its
controller (``Holder.controller``) to handle both (``shared.pods.update_annotations.rollouts``). A
CronJob's annotations are not copied onto its Jobs (only the jobTemplate's are), hence the one extra
hop there.

A pod without a controller reads its policy only from its own ``scheduling-retries``, never
from the webhook's stamp (``kn-rescheduler.io/scheduling-retries``): a pod orphaned from its
ReplicaSet (``kubectl delete rs --cascade=orphan``) keeps the stamp, and must not become an
opted-in bare pod that update-annotations would recreate on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from shared.api.keys import POLICY_ANNOTATION
from shared.platform.kube import Kube
from shared.workloads.classify import controller_of
from shared.workloads.jobs import JobFacts
from shared.workloads.policy import OwnerKind
from shared.workloads.state import StatefulSetRange

# Kinds whose pods we act on, and the kind that holds their state.
STATEFUL: Final = OwnerKind.STATEFUL_SET.value
REPLICASET: Final = OwnerKind.REPLICA_SET.value
JOB: Final = OwnerKind.JOB.value
BARE: Final = OwnerKind.POD.value
DAEMONSET: Final = "DaemonSet"

# The next hop up a chain, when the policy was not found yet (see the module docstring).
_PARENTS: Final[Mapping[str, str]] = {JOB: "CronJob"}


@dataclass(frozen=True)
class Ref:
    kind: str
    namespace: str
    name: str
    uid: str = ""
    api_version: str = ""

    def describe(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True)
class Holder:
    """The object that carries the state annotation, as it was read."""

    ref: Ref
    resource_version: str
    annotations: Mapping[str, str]
    replicas: int | None = None
    # A StatefulSet's first ordinal: spec.ordinals.start, 0 when unset. None when unknown (not
    # a StatefulSet, or not read): then its pod entries are never pruned for their names,
    # since a wrong start would drop the entries of pods the set still has.
    start_ordinal: int | None = None
    # The holder's own controller (a ReplicaSet's Deployment) as its ownerReference names it;
    # not read. None for a holder without one.
    controller: Ref | None = None
    # A Job holder's spec and status as far as the cost of a move goes (shared.workloads.jobs);
    # None for other kinds. Re-read with the holder, so a re-plan sees the Job's latest counts.
    job: JobFacts | None = field(default=None, compare=False)

    @property
    def statefulset(self) -> StatefulSetRange | None:
        """The pod names a StatefulSet holder wants now, for pruning its per-pod state."""
        if self.ref.kind != STATEFUL or self.replicas is None or self.start_ordinal is None:
            return None
        return StatefulSetRange(self.ref.name, self.replicas, self.start_ordinal)


@dataclass(frozen=True)
class Resolution:
    """What resolving a pod's owners found.

    ``holder`` is None when the pod must never be moved (DaemonSet) or has a controller kind we
    do not know how to handle; ``why`` then says which.
    """

    owner_kind: str
    holder: Holder | None
    policy: str | None
    policy_ref: Ref | None
    why: str = ""
    chain: tuple[Ref, ...] = field(default_factory=tuple)


def _ref(namespace: str, owner: Mapping[str, Any]) -> Ref:
    return Ref(
        kind=str(owner.get("kind", "")),
        namespace=namespace,
        name=str(owner.get("name", "")),
        uid=str(owner.get("uid", "")),
        api_version=str(owner.get("apiVersion", "")),
    )


def holder_of(kind: str, obj: Mapping[str, Any]) -> Holder:
    """The Holder view of an object of `kind` as the API returned it (also for re-reads)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    replicas = spec.get("replicas")
    start: int | None = None
    if kind == STATEFUL:
        # spec.ordinals.start (StatefulSetStartOrdinal, GA in 1.31): pods are numbered from
        # there, and the controller's getStartOrdinal is 0 when spec.ordinals is unset.
        ordinals = spec.get("ordinals")
        raw = (ordinals or {}).get("start", 0) if isinstance(ordinals, dict | None) else None
        start = raw if type(raw) is int and raw >= 0 else None
    controller = controller_of(obj)  # type: ignore[arg-type]
    return Holder(
        ref=Ref(
            kind=kind,
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
        ),
        resource_version=str(meta.get("resourceVersion", "")),
        annotations=dict(meta.get("annotations") or {}),
        replicas=replicas if type(replicas) is int and replicas >= 0 else None,
        start_ordinal=start,
        controller=_ref(str(meta.get("namespace", "")), controller) if controller else None,
        job=JobFacts.from_job(obj) if kind == JOB else None,
    )


def resolve(kube: Kube, namespace: str, pod: Mapping[str, Any]) -> Resolution:
    """Follow the pod's controller chain with GETs (one, sometimes two).

    Raises kube.NotFound when the controller is gone (nothing to do), and the other kube
    errors as they come.
    """
    meta = pod.get("metadata") or {}
    owner = controller_of(pod)  # type: ignore[arg-type]
    if owner is None:
        pod_ref = Ref(BARE, namespace, str(meta.get("name", "")), str(meta.get("uid", "")))
        holder = holder_of(BARE, {**pod, "metadata": {**meta, "namespace": namespace}})
        policy = holder.annotations.get(POLICY_ANNOTATION)
        return Resolution(BARE, holder, policy, pod_ref if policy is not None else None)

    first = _ref(namespace, owner)
    if first.kind == DAEMONSET:
        return Resolution(DAEMONSET, None, None, None, "DaemonSet pods belong on every node")
    if first.kind not in (REPLICASET, STATEFUL, JOB):
        return Resolution(first.kind, None, None, None, f"controller kind {first.kind} unsupported")

    if not first.uid:
        # The API server refuses an ownerReference without a uid, so only a hand-made request
        # (a forged AdmissionReview, say) has one: never read an object by name for it, or
        # anyone reaching the webhook could learn another namespace's policy and nodes.
        return Resolution(first.kind, None, None, None, f"{first.describe()} has no uid")
    obj = kube.get(first.kind, namespace, first.name)
    holder = holder_of(first.kind, obj)
    if holder.ref.uid and first.uid != holder.ref.uid:
        # Same name, new object: the pod's own controller is gone.
        return Resolution(first.kind, None, None, None, f"{first.describe()} was replaced")
    chain = [holder.ref]
    policy = holder.annotations.get(POLICY_ANNOTATION)
    policy_ref: Ref | None = holder.ref if policy is not None else None

    parent_kind = _PARENTS.get(first.kind)
    parent = controller_of(obj)  # type: ignore[arg-type]
    if policy is None and parent_kind and parent and parent.get("kind") == parent_kind:
        parent_ref = _ref(namespace, parent)
        parent_obj = kube.get(parent_kind, namespace, parent_ref.name)
        parent_meta = parent_obj.get("metadata") or {}
        chain.append(parent_ref)
        policy = (parent_meta.get("annotations") or {}).get(POLICY_ANNOTATION)
        policy_ref = parent_ref if policy is not None else None
    return Resolution(first.kind, holder, policy, policy_ref, chain=tuple(chain))
