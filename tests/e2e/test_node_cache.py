"""score-nodes' node cache on the real API server: one list, then a watch that follows every
change to the Nodes (a usage record written, a node joining, a node leaving), resumed after
the API server ends it. (A 410 for an expired version needs an etcd compacted past it, which
a cluster minutes old has not done: the loop's answer to it is a unit test, with the Status
line the API server sends.)"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest

from shared.api.keys import USAGE_ANNOTATION
from shared.api.kubetypes import Node
from shared.nodes.score_nodes import decide as extender
from shared.platform import informer
from shared.platform.config import Config
from shared.platform.kube import Kube
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def nodes(api: Kube) -> Iterator[informer.Cache[extender.NodeView]]:
    cache = informer.Cache(
        lambda obj: extender.view_of(cast(Node, obj), Config()), max_outage=180.0
    )
    stop = threading.Event()
    # Short watches, so that the test also sees the loop resume one the API server ended.
    thread = threading.Thread(
        target=informer.run, args=(lambda: api, "Node", cache, stop), kwargs={"watch_seconds": 2}
    )
    thread.start()
    yield cache
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the loop did not stop"


def annotation(cache: informer.Cache[extender.NodeView], node: str) -> str | None:
    kept = cache.get(node)
    return kept.usage if kept else None


def test_the_cache_lists_every_node_then_follows_their_changes(
    cluster: Any, api: Kube, nodes: informer.Cache[extender.NodeView]
) -> None:
    wait_for("the first list", lambda: nodes.ready(0.0))
    names = {n["metadata"]["name"] for n in api.list_all("Node")}
    assert set(nodes.snapshot()) == names
    node = cluster.nodes[0]
    marker = f'{{"test":"{uuid.uuid4().hex}"}}'
    try:
        cluster.rest.patch(
            f"/api/v1/nodes/{node}", {"metadata": {"annotations": {USAGE_ANNOTATION: marker}}}
        )
        wait_for("the change to reach the cache", lambda: annotation(nodes, node) == marker)
    finally:
        cluster.rest.patch(
            f"/api/v1/nodes/{node}", {"metadata": {"annotations": {USAGE_ANNOTATION: None}}}
        )
    wait_for("the removal to reach the cache", lambda: annotation(nodes, node) is None)


def test_a_node_that_joins_and_leaves_comes_and_goes_across_resumed_watches(
    cluster: Any, api: Kube, nodes: informer.Cache[extender.NodeView]
) -> None:
    wait_for("the first list", lambda: nodes.ready(0.0))
    first = nodes.status().resource_version
    name = f"cache-{uuid.uuid4().hex[:6]}"
    # Past at least one end of a 2-second watch.
    threading.Event().wait(3)
    api.create("Node", None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    try:
        wait_for("the new node in the cache", lambda: nodes.get(name) is not None)
    finally:
        api.delete("Node", None, name)
    wait_for("the deleted node gone from the cache", lambda: nodes.get(name) is None)
    assert nodes.status().resource_version != first
    assert nodes.status().failing_since is None
