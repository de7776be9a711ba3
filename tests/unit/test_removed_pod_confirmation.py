"""A StatefulSet's failed pod its controller already removed is recorded only on the kubelet's
word, never on the report's.

When the kubelet fails a pod (an eviction, an admission rejection), the StatefulSet controller
deletes it and creates its namesake, often before update-annotations hears of it; the report is
then the only thing naming the node and the reason. A report is a claim (any pod can post one),
and three forged ones used to spend a ``scheduling-retries: "3"`` budget and exclude nodes the
sender chose. So the record rests on the kubelet's own Warning Event about that pod: its uid,
the reported reason, from the reported node. The kubelet writes one for every eviction
(pkg/kubelet/eviction) and rejection (``rejectPod`` in pkg/kubelet/kubelet.go).

The eviction is the recorded one (tests/fixtures/real-kubelet/evicted-disk-pressure.json,
kubelet v1.36.3: the pod and its Events as written).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from shared.api.kubetypes import Pod
from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.pods.update_annotations.decide import (
    claims_removed_by_statefulset,
    removed_confirmed,
)
from shared.workloads.classify import Failure, FailureKind
from shared.workloads.podevents import PodEvent, warning_events

CFG = Config()
RECORDED = json.loads(
    (
        Path(__file__).resolve().parent.parent
        / "fixtures"
        / "real-kubelet"
        / "evicted-disk-pressure.json"
    ).read_text()
)
STATEFULSET = {
    "apiVersion": "apps/v1",
    "kind": "StatefulSet",
    "name": "db",
    "uid": "5b1c1d43-1f5e-4f59-9f0e-2b7a8f3d0c11",
    "controller": True,
    "blockOwnerDeletion": True,
}


def report(reason: str = "Evicted", node: str = "real-1", uid: str | None = None) -> FailingPod:
    """The report detect-failures sends for the recorded pod, as a StatefulSet's."""
    pod = cast(Pod, json.loads(json.dumps(RECORDED["pod"])))
    pod["metadata"]["ownerReferences"] = [dict(STATEFULSET)]
    if uid is not None:
        pod["metadata"]["uid"] = uid
    failure = Failure(
        kind=FailureKind.NODE_FIXABLE,
        reason=reason,
        message="The node had condition: [DiskPressure].",
        node=node,
        ran_for_seconds=0,
        why="the kubelet failed the pod",
    )
    return FailingPod.from_pod(pod, failure)


def kubelet_said() -> tuple[PodEvent, ...]:
    uid = RECORDED["pod"]["metadata"]["uid"]
    return warning_events(RECORDED["events"]).get(uid, ())


def test_an_eviction_the_kubelet_recorded_is_recorded() -> None:
    failing = report()
    assert claims_removed_by_statefulset(failing, CFG)
    confirmed, why = removed_confirmed(failing, kubelet_said())
    assert confirmed, why
    assert "as its kubelet recorded" in why and "DiskPressure" in why


@pytest.mark.parametrize(
    ("forged", "what"),
    [
        (report(uid="00000000-0000-0000-0000-000000000001"), "a made-up pod"),
        (report(node="real-0"), "the node the sender chose"),
        (report(reason="OutOfcpu"), "a reason the kubelet did not say"),
    ],
    ids=["made-up-uid", "other-node", "other-reason"],
)
def test_a_claim_the_kubelet_did_not_make_records_nothing(forged: FailingPod, what: str) -> None:
    events: Any = warning_events(RECORDED["events"]).get(forged.uid, ())
    confirmed, why = removed_confirmed(forged, events)
    assert not confirmed, what
    assert "the report alone records nothing" in why


def test_a_pod_without_any_event_records_nothing() -> None:
    confirmed, _ = removed_confirmed(report(), ())
    assert not confirmed


def test_only_a_statefulsets_terminal_failure_on_a_node_is_a_removal_claim() -> None:
    assert not claims_removed_by_statefulset(report(reason="CrashLoopBackOff"), CFG)
    bare = replace(report(), owner_references=())
    assert not claims_removed_by_statefulset(bare, CFG)
    early = report()
    early = replace(early, failure=replace(early.failure, kind=FailureKind.EARLY))
    assert not claims_removed_by_statefulset(early, CFG)


def test_another_pods_event_borrowed_under_its_uid_confirms_nothing() -> None:
    """A report naming db-0 under the uid of another pod the kubelet really evicted: the
    Event is about that other pod (its involvedObject names it), not db-0."""
    borrowed = replace(report(), name="db-0")
    confirmed, why = removed_confirmed(borrowed, kubelet_said())
    assert not confirmed and "the report alone records nothing" in why


def test_an_eviction_for_the_pods_own_storage_limit_is_no_nodes_doing() -> None:
    own_limit = "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. "
    said = tuple(
        replace(e, message=own_limit) if e.reason == "Evicted" else e for e in kubelet_said()
    )
    confirmed, why = removed_confirmed(report(), said)
    assert not confirmed and "its own limits" in why


def test_a_namesake_of_another_controller_confirms_nothing() -> None:
    namesake: Any = {
        "metadata": {
            "name": "evicted-disk-pressure",
            "namespace": "default",
            "uid": "new",
            "ownerReferences": [{**STATEFULSET, "uid": "another-statefulset"}],
        }
    }
    confirmed, why = removed_confirmed(report(), kubelet_said(), namesake)
    assert not confirmed and "another controller" in why
    namesake["metadata"]["ownerReferences"] = [dict(STATEFULSET)]
    assert removed_confirmed(report(), kubelet_said(), namesake)[0]
