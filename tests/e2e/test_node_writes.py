"""knative/node-writes.yaml, enforced by the real API server.

Five functions may patch Nodes and RBAC cannot say "only these keys". The base's
ValidatingAdmissionPolicy lets each of their ServiceAccounts change only the labels,
annotations and (assess-nodes alone) the taint it owns. Here each account's own token makes
the writes: what the function really writes goes through, next to a node's other taints and
labels, and a NoExecute taint, a cordon, someone else's label or another function's key is
refused by the policy although RBAC allows the patch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config as k8s_config

from shared.api.keys import (
    FAILING_WORKLOADS_LABEL,
    HOT_STREAK_ANNOTATION,
    LOAD_LABEL,
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    PRESSURE_ANNOTATION,
    PRESSURE_LABEL_KEY,
    PRESSURE_LABEL_VALUE,
    SUSPECT_LABEL,
    SUSPECT_TAINT_EFFECT,
    USAGE_ANNOTATION,
)
from shared.nodes.assess_nodes import decide
from shared.platform import kube
from shared.platform.kube import Kube
from tests.e2e.conftest import wait_for
from tests.e2e.knative_manifests import (
    Obj,
    apply,
    install_rbac,
    kubeconfig_for,
    of_kind,
    render,
    service_account_token,
)

pytestmark = pytest.mark.e2e

POLICY = "kn-rescheduler-node-writes"
NODE = "node-1"
THEIR_TAINT = {"key": "example.com/gpu", "value": "true", "effect": "NoSchedule"}
THEIR_LABEL = ("example.com/team", "blue")


@pytest.fixture(scope="module")
def installed(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    rendered = render(workdir=tmp_path_factory.mktemp("overlay-node-writes"))
    install_rbac(cluster.kubeconfig, rendered)
    policies = of_kind(rendered, "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    done = apply(cluster.kubeconfig, policies, "--server-side")
    assert done.returncode == 0, done.stderr
    return rendered


@pytest.fixture
def as_account(cluster: Any, installed: list[Obj], tmp_path: Path) -> Callable[..., Kube]:
    """A client with the named function's own ServiceAccount token (its RBAC, the policy)."""

    def make(function: str, *, dry_run: bool = False) -> Kube:
        token = service_account_token(cluster.api_client(), function)
        path = kubeconfig_for(cluster.server, cluster.ca_file, token, tmp_path / function)
        client = k8s_config.new_client_from_config(str(path))
        return Kube(client, dry_run=dry_run, attempts=1)

    return make


@pytest.fixture
def their_node(api: Kube) -> Iterator[str]:
    """node-1 carrying someone else's taint and label, as a GPU pool's nodes would; both
    removed again afterwards, with everything of ours."""
    node = api.get("Node", None, NODE)
    taints = [t for t in node["spec"].get("taints") or [] if t["key"] != THEIR_TAINT["key"]]
    api.merge_patch(
        "Node",
        None,
        NODE,
        {
            "metadata": {"labels": {THEIR_LABEL[0]: THEIR_LABEL[1]}},
            "spec": {"taints": [*taints, THEIR_TAINT]},
        },
    )
    yield NODE
    node = api.get("Node", None, NODE)
    kept = [
        t
        for t in node["spec"].get("taints") or []
        if t["key"] not in (THEIR_TAINT["key"], SUSPECT_LABEL)
    ]
    ours = (SUSPECT_LABEL, FAILING_WORKLOADS_LABEL, MOVED_OFF_LABEL, LOAD_LABEL, THEIR_LABEL[0])
    notes = (NODE_HEALTH_ANNOTATION, PRESSURE_ANNOTATION, USAGE_ANNOTATION, HOT_STREAK_ANNOTATION)
    api.merge_patch(
        "Node",
        None,
        NODE,
        {
            "metadata": {
                "labels": dict.fromkeys(ours) | {PRESSURE_LABEL_KEY: None},
                "annotations": dict.fromkeys(notes),
            },
            "spec": {"taints": kept},
        },
    )


def refused(write: Callable[[], Any]) -> str:
    """The policy's message for a write it refuses (RBAC allowed the write)."""
    try:
        write()
    except (kube.Forbidden, kube.Invalid) as exc:
        assert POLICY in str(exc), exc
        return str(exc)
    raise AssertionError("the write went through")


def _refuses(write: Callable[[], Any]) -> bool:
    try:
        write()
    except (kube.Forbidden, kube.Invalid) as exc:
        return POLICY in str(exc)
    return False


def patcher(writer: Kube, node: str) -> Callable[[Obj], Callable[[], Any]]:
    return lambda body: lambda: writer.merge_patch("Node", None, node, body)


def test_assess_nodes_may_mark_a_node_suspect_beside_its_other_taints_and_nothing_more(
    api: Kube, as_account: Callable[..., Kube], their_node: str
) -> None:
    dry = patcher(as_account("assess-nodes", dry_run=True), their_node)
    no_execute = {"key": SUSPECT_LABEL, "value": "true", "effect": "NoExecute"}
    wait_for(
        "the policy to refuse a NoExecute taint",
        lambda: _refuses(dry({"spec": {"taints": [THEIR_TAINT, no_execute]}})),
        timeout=30,
    )
    # Another key with our effect, our key with NoSchedule, their taint removed, a cordon.
    foreign = {"key": "example.com/evict", "value": "true", "effect": SUSPECT_TAINT_EFFECT}
    refused(dry({"spec": {"taints": [THEIR_TAINT, foreign]}}))
    refused(dry({"spec": {"taints": [THEIR_TAINT, {**no_execute, "effect": "NoSchedule"}]}}))
    refused(dry({"spec": {"taints": []}}))
    refused(dry({"spec": {"unschedulable": True}}))
    # Someone else's label, another function's label, an annotation not its own.
    refused(dry({"metadata": {"labels": {THEIR_LABEL[0]: None}}}))
    refused(dry({"metadata": {"labels": {LOAD_LABEL: "low"}}}))
    refused(dry({"metadata": {"annotations": {USAGE_ANNOTATION: "{}"}}}))

    # What a mark really writes goes through, for real, and keeps their taint and label.
    writer = as_account("assess-nodes")
    facts = decide.NodeFacts.from_node(api.get("Node", None, their_node))
    mark = decide.node_patch(facts, facts.record, suspect=True, taint=True, failing="2")
    assert mark is not None
    marked = writer.merge_patch("Node", None, their_node, mark)
    taints = marked["spec"]["taints"]
    assert THEIR_TAINT in taints
    assert {"key": SUSPECT_LABEL, "value": "true", "effect": SUSPECT_TAINT_EFFECT} in taints
    assert marked["metadata"]["labels"][THEIR_LABEL[0]] == THEIR_LABEL[1]
    # And the clearing, which removes our taint and labels only.
    facts = decide.NodeFacts.from_node(marked)
    clear = decide.node_patch(facts, facts.record, suspect=False, taint=True, failing=None)
    assert clear is not None
    cleared = writer.merge_patch("Node", None, their_node, clear)
    assert THEIR_TAINT in cleared["spec"]["taints"]
    assert not any(t["key"] == SUSPECT_LABEL for t in cleared["spec"]["taints"])
    assert SUSPECT_LABEL not in cleared["metadata"]["labels"]


@pytest.mark.parametrize(
    ("function", "labels", "annotations"),
    [
        ("label-nodes", {PRESSURE_LABEL_KEY: PRESSURE_LABEL_VALUE}, (PRESSURE_ANNOTATION,)),
        ("annotate-usage", {LOAD_LABEL: "high"}, (USAGE_ANNOTATION,)),
        ("rebalance-nodes", {}, (HOT_STREAK_ANNOTATION,)),
        ("update-annotations", {MOVED_OFF_LABEL: "1700000000"}, ()),
    ],
)
def test_each_node_writer_may_write_its_own_keys_and_no_taint_or_other_key(
    as_account: Callable[..., Kube],
    their_node: str,
    function: str,
    labels: dict[str, str],
    annotations: tuple[str, ...],
) -> None:
    dry = patcher(as_account(function, dry_run=True), their_node)
    suspect_taint = {"key": SUSPECT_LABEL, "value": "true", "effect": SUSPECT_TAINT_EFFECT}
    wait_for(
        f"the policy to refuse {function} a taint",
        lambda: _refuses(dry({"spec": {"taints": [THEIR_TAINT, suspect_taint]}})),
        timeout=30,
    )
    refused(dry({"spec": {"unschedulable": True}}))
    refused(dry({"metadata": {"labels": {THEIR_LABEL[0]: "red"}}}))
    refused(dry({"metadata": {"labels": {SUSPECT_LABEL: "true"}}}))
    refused(dry({"metadata": {"annotations": {NODE_HEALTH_ANNOTATION: "{}"}}}))

    # Its own keys, for real.
    body: Obj = {"metadata": {}}
    if labels:
        body["metadata"]["labels"] = labels
    if annotations:
        body["metadata"]["annotations"] = dict.fromkeys(annotations, '{"version":1}')
    written = as_account(function).merge_patch("Node", None, their_node, body)
    for key, value in labels.items():
        assert written["metadata"]["labels"][key] == value
    for key in annotations:
        assert written["metadata"]["annotations"][key] == '{"version":1}'
    assert THEIR_TAINT in written["spec"]["taints"]


def test_nobody_else_is_fenced(api: Kube, their_node: str, installed: list[Obj]) -> None:
    """An administrator (and the kubelet, the node controller) writes as before."""
    taint = {"key": SUSPECT_LABEL, "value": "true", "effect": "NoExecute"}
    dry = api.with_options(dry_run=True)
    written = dry.merge_patch("Node", None, their_node, {"spec": {"taints": [THEIR_TAINT, taint]}})
    assert taint in written["spec"]["taints"]


def test_a_taint_of_our_key_someone_else_set_does_not_lock_assess_nodes_out(
    api: Kube, as_account: Callable[..., Kube], their_node: str
) -> None:
    """Found by review: the policy checked every taint of our key and effect for the value
    "true", so a hand-set one refused every later write of assess-nodes to that node."""
    manual = {"key": SUSPECT_LABEL, "value": "manual", "effect": SUSPECT_TAINT_EFFECT}
    taints = api.get("Node", None, their_node)["spec"]["taints"]
    api.merge_patch("Node", None, their_node, {"spec": {"taints": [*taints, manual]}})
    writer = as_account("assess-nodes")
    wait_for(
        "the policy to be in force",
        lambda: _refuses(
            patcher(as_account("assess-nodes", dry_run=True), their_node)(
                {"spec": {"unschedulable": True}}
            )
        ),
        timeout=30,
    )
    record = {"metadata": {"annotations": {NODE_HEALTH_ANNOTATION: '{"version":1}'}}}
    written = writer.merge_patch("Node", None, their_node, record)
    assert written["metadata"]["annotations"][NODE_HEALTH_ANNOTATION] == '{"version":1}'
    # Changing it to another value than ours is still refused.
    changed = [{**t, "value": "mine"} if t == manual else t for t in written["spec"]["taints"]]
    refused(patcher(writer, their_node)({"spec": {"taints": changed}}))
