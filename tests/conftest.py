"""Fixtures every test directory shares: the local control plane, on demand.

``cluster`` is session-scoped and lazy: the control plane (etcd, kube-apiserver, controllers,
scheduler, kwok nodes, fake kubelet) starts the first time a test asks for it and stops when
the session ends, so ``pytest -m "not e2e"`` starts nothing. Its work directory (logs included)
is kept under pytest's basetemp for post-mortems. ``KN_RESCHEDULER_NODES`` sets the node count.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from dev.localcluster import Cluster
from dev.localcluster.rest import ApiError


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One real local control plane for the whole test session."""
    workdir = tmp_path_factory.mktemp("cluster")
    nodes = int(os.environ.get("KN_RESCHEDULER_NODES", "4"))
    c = Cluster(workdir, nodes=nodes, keep_workdir=True)
    c.start()
    try:
        yield c
    finally:
        c.stop()
        # The logs stay for post-mortems; etcd's data is only bulk.
        shutil.rmtree(workdir / "etcd", ignore_errors=True)


@pytest.fixture
def kube(cluster: Cluster) -> Iterator[k8s.ApiClient]:
    """An official-client ApiClient with cluster-admin credentials."""
    api = cluster.api_client()
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test (its default ServiceAccount already exists),
    deleted afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:5]}"
    cluster.rest.post(
        "/api/v1/namespaces",
        {"metadata": {"name": name, "labels": {"kn-rescheduler.io/test": slug[:63]}}},
    )
    # Pods are refused until the ServiceAccount controller has created "default".
    deadline = time.monotonic() + 30
    while True:
        try:
            cluster.rest.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
            break
        except ApiError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    try:
        yield name
    finally:
        try:
            cluster.rest.delete(f"/api/v1/namespaces/{name}")
        except ApiError as e:
            if e.status != 404:
                raise


# The real-node suite in two lengths (docs/testing.md): `make test` (and CI) runs the short
# one; `make real-nodes` sets KN_RESCHEDULER_REAL_NODES=full and runs every real-node test.
REAL_NODES_FULL_ENV = "KN_RESCHEDULER_REAL_NODES"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(REAL_NODES_FULL_ENV) == "full":
        return
    skip = pytest.mark.skip(reason="the full real-node suite only: make real-nodes")
    for item in items:
        if item.get_closest_marker("real_nodes_full") is not None:
            item.add_marker(skip)
