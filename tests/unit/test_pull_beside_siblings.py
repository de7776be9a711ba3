"""A pull that never ends on one node while another pod of the same controller started the
same image elsewhere: stuck after pending_stuck_after, not pull_stuck_after.

What a node-local registry mirror that accepts connections and never answers leaves on a real
node (tests/fixtures/real-kubelet/image-pull-hangs.json): ContainerCreating with the sandbox
up, one Pulling Event, no error and no timeout, while the same image starts in seconds on the
other nodes. The pod's status alone cannot tell that from a big image pulled slowly; its
siblings can.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from shared.api.kubetypes import Pod
from shared.platform.config import Config
from shared.pods.sweep_failures.handler import find_failures
from shared.workloads.classify import STUCK_PENDING, started_containers, stuck_pending

from . import pods
from .pods import NOW, running

CFG = Config()
SANDBOX_UP = NOW - timedelta(minutes=11)


def pulling(name: str = "web-7d9c8b6f4-pull1", node: str = "node-b") -> Pod:
    """Bound to ``node``, its sandbox up 11 minutes ago, its container still being created."""
    return pods.sandbox_ready_since(
        pods.pending_on_node(timedelta(minutes=11), name=name, node=node), SANDBOX_UP
    )


def sibling(node: str = "node-c", started: timedelta = timedelta(minutes=10), **kw: Any) -> Pod:
    """Another pod of the same ReplicaSet, its container started ``started`` ago."""
    return pods.pod(
        "web-7d9c8b6f4-ok001", node=node, containers=[running(started=NOW - started)], **kw
    )


def test_a_pull_the_siblings_image_started_beside_is_stuck_after_ten_minutes() -> None:
    failure = stuck_pending(pulling(), CFG, NOW, started_elsewhere=started_containers(sibling()))
    assert failure is not None and failure.reason == STUCK_PENDING
    assert "node-c" in failure.why and failure.node == "node-b"


def test_without_siblings_the_same_pull_has_its_hour() -> None:
    assert stuck_pending(pulling(), CFG, NOW) is None
    assert stuck_pending(pulling(), CFG, SANDBOX_UP + CFG.pull_stuck_after) is not None


def test_a_sibling_that_started_before_the_pull_began_says_nothing_about_it() -> None:
    # Its image was there before this pod asked for it: no evidence about this node's pull.
    early = sibling(started=timedelta(minutes=12))
    assert stuck_pending(pulling(), CFG, NOW, started_elsewhere=started_containers(early)) is None


def test_a_sibling_on_the_same_node_is_no_evidence_against_it() -> None:
    same = sibling(node="node-b")
    assert stuck_pending(pulling(), CFG, NOW, started_elsewhere=started_containers(same)) is None


def test_a_pod_of_another_controller_is_no_sibling() -> None:
    other = sibling(owner=("ReplicaSet", "api-5f6d7c8b9"))
    assert stuck_pending(pulling(), CFG, NOW, started_elsewhere=started_containers(other)) is None


def test_under_ten_minutes_even_with_siblings_it_is_a_pull_in_progress() -> None:
    young = pods.sandbox_ready_since(
        pods.pending_on_node(timedelta(minutes=3), name="web-7d9c8b6f4-pull1"),
        NOW - timedelta(minutes=3),
    )
    fresh = sibling(started=timedelta(minutes=2))
    assert stuck_pending(young, CFG, NOW, started_elsewhere=started_containers(fresh)) is None


def test_the_sweep_finds_it_whichever_page_the_sibling_is_on() -> None:
    for order in ([pulling(), sibling()], [sibling(), pulling()]):
        found = find_failures(order, CFG, NOW)
        assert [(f.name, f.failure.reason) for f in found] == [
            ("web-7d9c8b6f4-pull1", STUCK_PENDING)
        ]
