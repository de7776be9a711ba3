"""The plugin's cleanup on the real API server: after an uninstall, our marks go, nobody else's.

A node carries what assess-nodes, label-nodes, annotate-usage, rebalance-nodes and
update-annotations write, beside someone else's taint and labels (one of them the pressure
label's key, set by someone else on another node); a ReplicaSet carries our state beside its
owner's annotation. The cleanup removes exactly ours, with compare-and-swap writes, and a second
run finds nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from kubectl_kn_rescheduler import cleanup
from shared.api.keys import (
    FAILING_WORKLOADS_LABEL,
    HOT_STREAK_ANNOTATION,
    LOAD_LABEL,
    MAINTENANCE_LABEL,
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    PRESSURE_ANNOTATION,
    PRESSURE_LABEL_KEY,
    PRESSURE_LABEL_VALUE,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
    SUSPECT_TAINT_EFFECT,
    USAGE_ANNOTATION,
)
from shared.api.pressure import Record
from shared.platform.kube import Kube
from tests import builders

pytestmark = pytest.mark.e2e

OURS_TAINT = {"key": SUSPECT_LABEL, "value": "true", "effect": SUSPECT_TAINT_EFFECT}
# Same key, another effect: an administrator's, kept.
THEIR_TAINTS = [
    {"key": "example.com/gpu", "value": "true", "effect": "NoSchedule"},
    {"key": SUSPECT_LABEL, "value": "true", "effect": "NoSchedule"},
]
THEIR_LABELS = {"example.com/team": "blue", MAINTENANCE_LABEL: "true"}
OUR_LABELS = {
    SUSPECT_LABEL: "true",
    FAILING_WORKLOADS_LABEL: "2",
    MOVED_OFF_LABEL: "1700000000",
    LOAD_LABEL: "high",
    PRESSURE_LABEL_KEY: PRESSURE_LABEL_VALUE,
}
OUR_ANNOTATIONS = {
    **dict.fromkeys((NODE_HEALTH_ANNOTATION, USAGE_ANNOTATION, HOT_STREAK_ANNOTATION), "{}"),
    # label-nodes' record of putting the label there, as it writes it.
    PRESSURE_ANNOTATION: Record(
        rule="cpu-usage", value=91.0, since=datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
    ).to_json(),
}


@pytest.fixture
def marked(api: Kube, cluster: Any) -> Iterator[tuple[str, str]]:
    """node-2 with every mark of ours and others'; node-3 with only someone's status label."""
    ours, theirs = cluster.nodes[2], cluster.nodes[3]
    before = {n: api.get("Node", None, n)["spec"].get("taints") for n in (ours, theirs)}
    api.merge_patch(
        "Node",
        None,
        ours,
        {
            "metadata": {
                "labels": {**OUR_LABELS, **THEIR_LABELS},
                "annotations": {**OUR_ANNOTATIONS, "example.com/owner": "team-blue"},
            },
            "spec": {"taints": [*THEIR_TAINTS, OURS_TAINT]},
        },
    )
    # Someone's value of the pressure key beside a record of ours left from before (label-nodes
    # leaves such a label alone, and so does the cleanup).
    api.merge_patch(
        "Node",
        None,
        theirs,
        {
            "metadata": {
                "labels": {PRESSURE_LABEL_KEY: "maintenance"},
                "annotations": {PRESSURE_ANNOTATION: OUR_ANNOTATIONS[PRESSURE_ANNOTATION]},
            }
        },
    )
    yield ours, theirs
    for name in (ours, theirs):
        labels = {**dict.fromkeys(OUR_LABELS), **dict.fromkeys(THEIR_LABELS)}
        notes = {**dict.fromkeys(OUR_ANNOTATIONS), "example.com/owner": None}
        api.merge_patch("Node", None, name, {"metadata": {"labels": labels, "annotations": notes}})
        api.merge_patch("Node", None, name, {"spec": {"taints": before[name]}})


def test_the_cleanup_removes_our_marks_and_keeps_everyone_elses(
    api: Kube, namespace: str, marked: tuple[str, str]
) -> None:
    ours, theirs = marked
    annotations = {STATE_ANNOTATION: '{"version":1,"moves":1}', "team": "blue"}
    api.create(
        "ReplicaSet",
        namespace,
        builders.replicaset("web", replicas=0, annotations=annotations, namespace=namespace),
    )

    # A dry run changes nothing.
    dry = cleanup.clean(api.with_options(dry_run=True))
    assert any(line.startswith(f"Node {ours}: removed") for line in dry)
    assert SUSPECT_LABEL in api.get("Node", None, ours)["metadata"]["labels"]

    report = cleanup.clean(api)
    assert f"ReplicaSet {namespace}/web: removed annotation {STATE_ANNOTATION}" in report

    node = api.get("Node", None, ours)
    labels, notes = node["metadata"].get("labels", {}), node["metadata"].get("annotations", {})
    assert not set(OUR_LABELS) & set(labels)
    assert THEIR_LABELS.items() <= labels.items()
    assert not set(OUR_ANNOTATIONS) & set(notes)
    assert notes["example.com/owner"] == "team-blue"
    assert node["spec"]["taints"] == THEIR_TAINTS
    # Someone else's value of the pressure key stays, our record beside it goes.
    their_node = api.get("Node", None, theirs)["metadata"]
    assert their_node["labels"][PRESSURE_LABEL_KEY] == "maintenance"
    assert PRESSURE_ANNOTATION not in (their_node.get("annotations") or {})
    rs = api.get("ReplicaSet", namespace, "web")
    assert rs["metadata"]["annotations"] == {"team": "blue"}

    # Nothing left: a second run writes nothing.
    assert not [line for line in cleanup.clean(api) if namespace in line or ours in line]
