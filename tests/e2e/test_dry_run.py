"""Dry runs change nothing on the real API server, deletes included (issue 11 review).

`KN_RESCHEDULER_DRY_RUN`, `make replay --dry-run` (the `knrdryrun` extension) and the checks
update-annotations makes before charging a move all rely on it. A DELETE carries its options in
its body, and the API server reads the query string only when the body is empty: a dryRun query
parameter next to DeleteOptions was ignored, and the pod really deleted.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.platform import kube
from shared.platform.kube import Kube

pytestmark = pytest.mark.e2e


def a_pod(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    created: dict[str, Any] = cluster.rest.post(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {"name": name},
            "spec": {"nodeName": "nowhere", "containers": [{"name": "a", "image": "x"}]},
        },
    )
    return created


def test_a_dry_run_client_deletes_nothing(cluster: Any, namespace: str) -> None:
    pod = a_pod(cluster, namespace, "kept")
    dry = Kube(cluster.api_client(), dry_run=True)
    answer = dry.delete("Pod", namespace, "kept", uid=pod["metadata"]["uid"])
    # The API server answered as if it deleted it (the object, with a deletion timestamp)...
    assert answer["metadata"]["uid"] == pod["metadata"]["uid"]
    # ...and the pod is still there, untouched.
    live = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/kept")
    assert live["metadata"]["uid"] == pod["metadata"]["uid"]
    assert "deletionTimestamp" not in live["metadata"]


def test_a_forced_dry_run_deletes_nothing_either(cluster: Any, namespace: str) -> None:
    pod = a_pod(cluster, namespace, "replayed")
    api = Kube(cluster.api_client())
    with kube.forced_dry_run():
        api.delete("Pod", namespace, "replayed", uid=pod["metadata"]["uid"])
    live = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/replayed")
    assert "deletionTimestamp" not in live["metadata"]
    # Outside the block the same client deletes for real.
    api.delete("Pod", namespace, "replayed", uid=pod["metadata"]["uid"])
    live = cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods/replayed")
    assert live["metadata"].get("deletionTimestamp")
