"""Owner resolution: where a pod's policy comes from, and what a StatefulSet holder wants."""

from __future__ import annotations

from typing import Any, cast

import pytest

from shared.platform.kube import Kube
from shared.workloads.owners import Holder, Ref, holder_of, resolve
from shared.workloads.state import StatefulSetRange
from tests import builders

from . import pods

# Bare pods are resolved from the pod alone; any API call would fail the test.
NO_API = cast(Kube, None)


def test_an_orphaned_pod_carrying_only_our_stamp_has_no_policy() -> None:
    # After `kubectl delete rs --cascade=orphan` the garbage collector drops the pod's
    # ownerReference; the webhook's stamp and exclusions stay on it.
    orphan = pods.pod(owner=None, stamp="3", excluded=["node-a"])
    resolution = resolve(NO_API, "shop", orphan)
    assert resolution.owner_kind == "Pod"
    assert resolution.policy is None
    assert resolution.policy_ref is None


def test_an_owner_reference_without_a_uid_is_never_looked_up_by_name() -> None:
    # The API server refuses such a reference, so only a forged AdmissionReview carries one:
    # reading the named object would tell its sender another namespace's policy and nodes.
    forged = pods.new_pod()
    del forged["metadata"]["ownerReferences"][0]["uid"]
    resolution = resolve(NO_API, "bank", forged)
    assert resolution.holder is None
    assert resolution.policy is None
    assert "has no uid" in resolution.why


def test_a_bare_pod_reads_its_policy_from_the_users_own_key() -> None:
    bare = pods.pod("debug-shell", owner=None, stamp=None, annotations={"scheduling-retries": "2"})
    resolution = resolve(NO_API, "shop", bare)
    assert resolution.policy == "2"
    assert resolution.policy_ref == Ref("Pod", "shop", "debug-shell", pods.uid("debug-shell"))


def test_a_bare_pods_own_key_wins_over_a_stamp_it_carries() -> None:
    bare = pods.pod(owner=None, stamp="9", annotations={"scheduling-retries": "2"})
    assert resolve(NO_API, "shop", bare).policy == "2"


def statefulset(
    name: str = "db", replicas: int = 3, ordinals: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A StatefulSet as the API server returns it (defaults filled in)."""
    return builders.statefulset(
        name,
        replicas=replicas,
        retries="3",
        template=builders.template(
            {"app": name},
            containers=[builders.container("db", image="postgres:16")],
            grace_period=None,
        ),
        namespace="shop",
        uid=pods.uid(f"StatefulSet/{name}"),
        resource_version="48213",
        generation=2,
        status={"replicas": replicas, "readyReplicas": replicas, "observedGeneration": 2},
        podManagementPolicy="OrderedReady",
        updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
        revisionHistoryLimit=10,
        persistentVolumeClaimRetentionPolicy={"whenDeleted": "Retain", "whenScaled": "Retain"},
        **({"ordinals": ordinals} if ordinals is not None else {}),
    )


RANGES = {
    "a set without spec.ordinals numbers its pods from 0": (
        statefulset(),
        StatefulSetRange("db", 3, 0),
    ),
    "spec.ordinals.start moves the first ordinal": (
        statefulset(ordinals={"start": 5}),
        StatefulSetRange("db", 3, 5),
    ),
    "spec.ordinals without start starts at 0": (
        statefulset(ordinals={}),
        StatefulSetRange("db", 3, 0),
    ),
    "a set scaled to zero wants no pod": (
        statefulset(replicas=0),
        StatefulSetRange("db", 0, 0),
    ),
    "an unreadable start is unknown, so nothing is pruned by name": (
        statefulset(ordinals={"start": "5"}),
        None,
    ),
}


@pytest.mark.parametrize(("obj", "expected"), RANGES.values(), ids=RANGES.keys())
def test_a_statefulset_holder_knows_which_pods_the_set_wants(
    obj: dict[str, Any], expected: StatefulSetRange | None
) -> None:
    assert holder_of("StatefulSet", obj).statefulset == expected


def test_only_a_statefulset_has_a_range_of_pods() -> None:
    replicaset = {"metadata": {"name": "web-7d9c8b6f4"}, "spec": {"replicas": 3}}
    assert holder_of("ReplicaSet", replicaset).statefulset is None
    # A Holder built without reading spec.ordinals does not guess a start.
    assert Holder(Ref("StatefulSet", "shop", "db"), "1", {}, replicas=3).statefulset is None


def replicaset(
    name: str = "web-7d9c8b6f4",
    deployment: str | None = "web",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A ReplicaSet as the API server returns it; by default one the Deployment controller
    made (controlled by the Deployment, with the annotations the controller gives it)."""
    labels = {"app": "web", "pod-template-hash": name.rsplit("-", 1)[-1]}
    controller = {
        "deployment.kubernetes.io/desired-replicas": "3",
        "deployment.kubernetes.io/max-replicas": "4",
        "deployment.kubernetes.io/revision": "1",
    }
    return builders.replicaset(
        name,
        replicas=3,
        retries="3",
        annotations={**controller, **(annotations or {})},
        labels=labels,
        selector=labels,
        template=builders.template(
            labels, containers=[builders.container("web")], grace_period=None
        ),
        owner=builders.owner_reference("Deployment", deployment) if deployment else None,
        namespace="shop",
        uid=pods.uid(f"ReplicaSet/{name}"),
        resource_version="51877",
        generation=1,
        status={"replicas": 3, "readyReplicas": 3, "observedGeneration": 1},
    )


def test_a_replicaset_holder_names_the_deployment_controlling_it_without_reading_it() -> None:
    holder = holder_of("ReplicaSet", replicaset())
    assert holder.controller == Ref(
        "Deployment", "shop", "web", pods.uid("Deployment/web"), "apps/v1"
    )


def test_a_replicaset_of_its_own_and_a_bare_pod_name_no_controller() -> None:
    assert holder_of("ReplicaSet", replicaset(deployment=None)).controller is None
    bare = pods.pod(owner=None, annotations={"scheduling-retries": "2"})
    resolution = resolve(NO_API, "shop", bare)
    assert resolution.holder is not None and resolution.holder.controller is None
