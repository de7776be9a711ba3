"""Where the sweep's paginated pod list is read from, on the real API server (issue 11, item 20).

The sweep lists every pod in the cluster every few minutes. On the API server this project
runs against, a list without resourceVersion is served from the watch cache (first page a
consistent read, further pages from the cache's snapshot); this test pins that with the API
server's own metrics, so the sweep's docstring cannot drift from what the server does.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.platform.config import Config
from shared.platform.kube import Kube
from shared.pods.sweep_failures.handler import Sweeper

pytestmark = pytest.mark.e2e

PODS = 30
PAGE = 10


def pod_list_counters(cluster: Any) -> dict[str, float]:
    """The API server's counters of pod lists served from its cache and of etcd requests."""
    _, text = cluster.rest.text("/metrics")
    counters: dict[str, float] = {}
    for line in text.splitlines():
        if 'resource="pods"' not in line:
            continue
        if line.startswith(("apiserver_cache_list_total", "etcd_requests_total")):
            key, value = line.rsplit(" ", 1)
            counters[key] = float(value)
    return counters


def grew(before: dict[str, float], after: dict[str, float], prefix: str) -> float:
    return sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(prefix))


def test_every_page_of_the_sweeps_pod_list_comes_from_the_watch_cache(
    cluster: Any, namespace: str
) -> None:
    for i in range(PODS):
        cluster.rest.post(
            f"/api/v1/namespaces/{namespace}/pods",
            {
                "metadata": {"name": f"idle-{i}"},
                # Bound to a node that does not exist: nothing ever runs or fails.
                "spec": {"nodeName": "nowhere", "containers": [{"name": "a", "image": "x"}]},
            },
        )
    sweeper = Sweeper(Kube(cluster.api_client()), Config(), "http://127.0.0.1:9/", page_size=PAGE)
    before = pod_list_counters(cluster)
    result = sweeper.sweep()
    after = pod_list_counters(cluster)

    pages = -(-result.listed // PAGE)
    assert result.listed >= PODS
    # At least our pages (the counters are the API server's: other clients of the shared test
    # cluster may list pods meanwhile, from the cache too).
    assert grew(before, after, "apiserver_cache_list_total") >= pages
    # No page was a list against etcd (a consistent read only asks etcd for its revision).
    etcd_lists = [
        k for k in after if k.startswith("etcd_requests_total") and 'operation="list' in k
    ]
    assert all(after[k] == before.get(k, 0.0) for k in etcd_lists)
