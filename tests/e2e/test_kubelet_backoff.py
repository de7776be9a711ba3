"""With ``Timing.real()`` the fake kubelet restarts a crash-looping container as kubelet v1.36
does, on the real local control plane: at once after its first exit, then after 10 s, then after
20 s (each up to 1.5x, the pod worker's jitter), each restart's CrashLoopBackOff naming the
back-off a real kubelet names. The unit tests (tests/unit/test_kubelet_backoff.py) cover the
whole rule; this one shows the restarts arrive through the API server at those intervals.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dev.localcluster import Cluster
from dev.localcluster.kubelet import Timing
from dev.localcluster.rest import ApiError
from tests.e2e.conftest import let_time_pass

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
IMAGE = "registry.example.com/shop/web:1.4.2"
NAMESPACE = "backoff"
NODE = "node-0"
# How late a status may arrive here (watch delivery, a shard busy, a loaded machine).
SLACK = 2.5


@dataclass(frozen=True)
class Restart:
    """The first status seen with this restartCount."""

    count: int
    at: float
    waiting: JSON


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=1, timing=Timing.real(), quiet=True) as c:
        yield c


def restarts_of(cluster: Cluster, name: str, upto: int, timeout: float) -> list[Restart]:
    """Watches the pod until restartCount ``upto``; each count as first seen, with its time."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    rv = str(cluster.rest.get(path)["metadata"]["resourceVersion"])
    seen: dict[int, Restart] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and upto not in seen:
        try:
            params = {"resourceVersion": rv, "fieldSelector": f"metadata.name={name}"}
            for event in cluster.rest.watch(path, params, 5):
                obj = event.get("object", {})
                rv = str(obj.get("metadata", {}).get("resourceVersion", rv))
                if event.get("type") not in ("ADDED", "MODIFIED"):
                    continue
                for c in obj.get("status", {}).get("containerStatuses") or []:
                    count = int(c.get("restartCount", 0))
                    if count not in seen and ("terminated" in c["state"] or count > 0):
                        waiting = c["state"].get("waiting", {})
                        seen[count] = Restart(count, time.monotonic(), waiting)
                if upto in seen:
                    break
        except ApiError:
            let_time_pass(0.2, "the watch failed: watch again after a pause")
    return [seen[k] for k in sorted(seen)]


def test_a_crash_looping_pods_restarts_come_after_the_kubelets_back_off(
    cluster: Cluster,
) -> None:
    rest = cluster.rest
    rest.post("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    cluster.set_fault(NODE, "crashloop")
    pod = rest.post(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "metadata": {"name": "web"},
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "app", "image": IMAGE}],
                "terminationGracePeriodSeconds": 0,
            },
        },
    )
    uid = pod["metadata"]["uid"]
    # 0.5 s + up to 15 s + up to 30 s, and room for a loaded machine.
    restarts = restarts_of(cluster, "web", 3, timeout=75)
    assert [r.count for r in restarts] == [0, 1, 2, 3], restarts

    first_exit, first, second, third = restarts
    assert first_exit.waiting == {}  # exited, not waiting: restarted at once
    assert first.at - first_exit.at < SLACK
    # Then 10 s (to 15 s), 20 s (to 30 s): not the compressed clock's 3 s.
    assert 10.0 - SLACK <= second.at - first.at <= 15.0 + SLACK
    assert 20.0 - SLACK <= third.at - second.at <= 30.0 + SLACK
    for restart, back_off in ((first, "10s"), (second, "20s"), (third, "40s")):
        assert restart.waiting == {
            "reason": "CrashLoopBackOff",
            "message": f"back-off {back_off} restarting failed container=app "
            f"pod=web_{NAMESPACE}({uid})",
        }
