"""Fixtures every test directory shares: the local control plane, on demand.

``cluster`` is session-scoped and lazy: the control plane (etcd, kube-apiserver, controllers,
scheduler, kwok nodes, fake kubelet) starts the first time a test asks for it and stops when
the session ends, so ``pytest -m "not e2e"`` starts nothing. Its work directory (logs included)
is kept under pytest's basetemp for post-mortems. ``KN_RESCHEDULER_NODES`` sets the node count.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from kubernetes import client as k8s

from dev.localcluster import Cluster
from dev.localcluster.rest import ApiError
from dev.tools import durations


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


# `make test` runs on pytest-xdist's workers (`-n`): each worker is a session of its own, with
# its own control plane started on demand. An end-to-end file stays on one worker, so its module
# fixtures (a Stack, a cluster, Knative's install) start once. Every real-node file runs on one
# worker, one file after the other, as in a run without xdist: they share the machine's
# iptables, sysctls, node image cache and the record of real clusters that test_real_nodes.py
# checks is left as it was. The unit, handler and fuzz tests go one by one to whichever worker
# is free. The scheduler sees only test ids, so the real-node files are named here; collection
# checks that this list and the files marked `real_nodes` are the same.
REAL_NODES_GROUP = "real-nodes"
REAL_NODE_FILES = frozenset(
    f"tests/e2e/{name}.py"
    for name in (
        "test_cluster_network",
        "test_demo_installed",
        "test_demo_real_nodes",
        "test_knative_installed",
        "test_node_images",
        "test_oidc_installed",
        "test_real_node_metrics",
        "test_real_node_pipeline",
        "test_real_nodes",
    )
)


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its real-node group, its end-to-end file, or itself."""
    path = nodeid.split("::", 1)[0]
    if path in REAL_NODE_FILES:
        return REAL_NODES_GROUP
    if path.startswith("tests/e2e/"):
        return path
    return nodeid


if importlib.util.find_spec("xdist") is not None:
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):  # type: ignore[misc]
        """pytest-xdist's scope scheduling with our units (``unit_of``); handed out in the
        order of collection (``--no-loadscope-reorder``). pytest-xdist's own ``loadgroup``
        names groups by rewriting test ids, which pytest 9 no longer allows."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Groups:
        return Groups(config, log)


def check_real_node_files(items: list[pytest.Item]) -> None:
    marked = {i.nodeid.split("::", 1)[0] for i in items if i.get_closest_marker("real_nodes")}
    collected = {i.nodeid.split("::", 1)[0] for i in items}
    listed = REAL_NODE_FILES & collected
    if marked != listed:
        raise pytest.UsageError(
            "tests/conftest.py REAL_NODE_FILES and the files marked real_nodes differ: "
            f"marked only {sorted(marked - listed)}, listed only {sorted(listed - marked)}"
        )


# The last run's JUnit XML (make test writes it): the files that took longest start first, so
# that none of them is the last one left running (`--no-loadscope-reorder` keeps this order).
LAST_RESULTS = Path(__file__).resolve().parents[1] / ".local" / "test-results.xml"


# Without a last run (a fresh clone, CI): the real-node unit and the runs of a whole world, the
# longest units by far (docs/testing.md), then the rest in the order of collection.
FIRST_WITHOUT_A_LAST_RUN: Final = (
    REAL_NODES_GROUP,
    "tests/e2e/test_bench_quick.py",
    "tests/e2e/test_soak_quick.py",
    "tests/e2e/test_chaos_quick.py",
)


def last_seconds_per_group() -> dict[str, float]:
    """Each unit's seconds in the last run; none when there was none or it cannot be read."""
    try:
        run = durations.read(LAST_RESULTS)
    except durations.ResultsError:
        return {}
    seconds: dict[str, float] = {}
    for path, entry in run.files.items():
        if path.startswith("tests/e2e/"):
            group = unit_of(path)
            seconds[group] = seconds.get(group, 0.0) + entry.seconds
    return seconds


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    check_real_node_files(items)
    last = last_seconds_per_group()

    def start_order(item: pytest.Item) -> tuple[int, float]:
        group = unit_of(item.nodeid)
        if group == item.nodeid:
            return (2, 0.0)
        if not last and group in FIRST_WITHOUT_A_LAST_RUN:
            return (0, float(FIRST_WITHOUT_A_LAST_RUN.index(group)))
        return (1, -last.get(group, 0.0))

    items.sort(key=start_order)  # stable: a file's tests keep their order
    if os.environ.get(REAL_NODES_FULL_ENV) == "full":
        return
    skip = pytest.mark.skip(reason="the full real-node suite only: make real-nodes")
    for item in items:
        if item.get_closest_marker("real_nodes_full") is not None:
            item.add_marker(skip)
