"""End-to-end fixtures for the rescheduling core, on the real local control plane.

The webhook runs as its real server (gunicorn, TLS) and is registered with the API server, so
every pod the controllers create in a test passes through it. detect-failures and
update-annotations run in-process on their shared logic with a real API client: what a Broker
would deliver is built here from the live pod exactly as ApiServerSource shapes it (the whole
pipeline through Knative's Broker is tested separately).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from kubernetes import client as k8s

from dev.localcluster import realnode
from dev.localcluster.cluster import Cluster
from dev.localcluster.keys import (
    SIM_CPU_USAGE_ANNOTATION,
    SIM_MEMORY_USAGE_ANNOTATION,
)
from dev.localcluster.kubelet import LOCAL_FUNCTION_SETTINGS
from dev.stack import webhook as webhook_setup
from dev.stack.functions import FunctionServer, environment
from kubectl_kn_rescheduler import explain
from shared.api.keys import (
    FAILING_WORKLOADS_LABEL,
    LOAD_LABEL,
    MAINTENANCE_LABEL,
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    NODE_OPT_OUT_LABEL,
    PRESSURE_ANNOTATION,
    PRESSURE_LABEL_KEY,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
    USAGE_ANNOTATION,
)
from shared.api.state import WorkloadState, load_state
from shared.platform import events
from shared.platform.config import Config
from shared.platform.kube import Kube
from shared.pods.detect_failures.decide import detect
from shared.pods.update_annotations.handler import Rescheduler
from tests import builders
from tests.handlers.conftest import function_client  # noqa: F401 - shared fixture

FAULTY_PREFERENCE_WEIGHT = 100
# The functions' settings for the fake kubelet's compressed clock (see LOCAL_FUNCTION_SETTINGS).
LOCAL = Config.from_env(LOCAL_FUNCTION_SETTINGS)


# The real-node tests (docs/local-cluster-real-nodes.md) need root and what
# hack/install-packages.sh installs; elsewhere they are skipped, saying what is missing.
REAL_NODES_MISSING: Final = realnode.missing_tools()
needs_real_nodes: Final = pytest.mark.skipif(
    bool(REAL_NODES_MISSING),
    reason=f"real nodes need {', '.join(REAL_NODES_MISSING)} (hack/install-packages.sh, as root)",
)


@contextlib.contextmanager
def real_cluster(directory: Path, real_nodes: int = 2, **options: Any) -> Iterator[Cluster]:
    """A started cluster of ``real_nodes`` real nodes and no kwok one, stopped after."""
    c = Cluster(directory, nodes=0, real_nodes=real_nodes, prometheus=False, quiet=True, **options)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def kubectl(c: Cluster, *args: str, stdin: str | None = None, check: bool = True) -> str:
    """The cluster's own kubectl, as a user runs it; fails the test on an error (``check``)."""
    done = subprocess.run(
        [str(c.bins_dir / "kubectl"), f"--kubeconfig={c.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check:
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


# How the end-to-end tests wait. Whatever they read was written by something else (the
# kubelet, a controller, the scheduler, the Broker, one of our functions), on its own watch and
# a moment after the thing that caused it: a read right after the trigger is a race. So:
#
# - ``wait_for`` until what is read says what the test expects, and fail with what it saw;
# - ``holds`` for what must stay true over a quiet period (nothing more is moved), checked all
#   along, not once at the end;
# - ``let_time_pass`` only where a rule of ours or of Kubernetes counts time (a window, a
#   threshold, timestamps with whole seconds), saying which.
#
# tests/unit/test_e2e_waits.py refuses any other sleep in tests/e2e.


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float = 60.0,
    every: float = 0.25,
    seen: Callable[[], Any] | None = None,
) -> Any:
    """Poll ``check`` every ``every`` seconds until it returns something truthy, and return
    that; fail the test with ``what``, the last answer and, with ``seen``, what else there was
    to see (a node's conditions and taints), if not within ``timeout``. Each is shown up to
    2,000 characters. Files that wait differently bind their timeout and interval."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            extra = f"; saw {seen()!r:.2000}" if seen is not None else ""
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r:.2000}){extra}"
            )
        time.sleep(every)


def holds(
    what: str,
    check: Callable[[], Any],
    seconds: float,
    every: float = 0.25,
    seen: Callable[[], Any] | None = None,
) -> None:
    """Check ``check`` every ``every`` seconds for ``seconds``; fail at the first answer that
    is not truthy, with ``what``, that answer and, with ``seen``, what else there was to see.
    For what must not happen: a check once at the end misses what happened and was undone in
    between."""
    deadline = time.monotonic() + seconds
    while True:
        answer = check()
        if not answer:
            extra = f"; saw {seen()!r:.2000}" if seen is not None else ""
            raise AssertionError(f"no longer {what} (answered {answer!r:.2000}){extra}")
        if time.monotonic() >= deadline:
            return
        time.sleep(every)


def let_time_pass(seconds: float, why: str) -> None:
    """Sleep, where a rule counts time rather than waits for a write: ``why`` says which (it
    is there for the reader; a wait for a write is ``wait_for``)."""
    assert why, "say which rule counts the time"
    if seconds > 0:
        time.sleep(seconds)


def earlier_tests_gone(cluster: Cluster, namespace: str, timeout: float = 60.0) -> None:
    """Wait until no pod of another test's namespace still holds a place on a node.

    The ``namespace`` fixture deletes a test's namespace without waiting: its pods stay bound,
    terminating, until the namespace controller and the kubelet are done, and the scheduler
    counts their requests until then. A test whose placement weighs requests (a CPU each
    against a node's preference) needs the nodes as a fresh cluster has them. A terminal pod
    (Succeeded or Failed) holds nothing: the scheduler's cache leaves it out."""

    def holding() -> list[str]:
        return [
            f"{p['metadata']['namespace']}/{p['metadata']['name']} on {p['spec']['nodeName']}"
            for p in cluster.rest.get("/api/v1/pods").get("items", [])
            if p["metadata"]["namespace"].startswith("t-")
            and p["metadata"]["namespace"] != namespace
            and p["spec"].get("nodeName")
            and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        ]

    wait_for("no pod of earlier tests on the nodes", lambda: not holding(), timeout, seen=holding)


@dataclass
class Webhook:
    server: FunctionServer
    url: str
    ca_file: Path
    api_client: k8s.ApiClient

    # Its own registration, so that it never collides with a whole Stack's in the same session.
    name: str = webhook_setup.NAME + "-core-tests"

    def register(self) -> None:
        body = webhook_setup.configuration(self.url, self.ca_file, name=self.name)
        webhook_setup.register(self.api_client, body)
        webhook_setup.wait_until_called(self.api_client)


@pytest.fixture(autouse=True)
def local_function_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Functions loaded in-process (functions-framework's test client) read their settings
    from the environment: give them the fake kubelet's compressed clock too."""
    for key, value in LOCAL_FUNCTION_SETTINGS.items():
        monkeypatch.setenv(key, value)


@pytest.fixture(autouse=True)
def node_marks_cleared(request: pytest.FixtureRequest) -> Iterator[None]:
    """Suspect marks, health records and pressure labels are the cluster's, which outlives
    the test: take them off every node after a test that used the cluster, so the next test's
    pods are scheduled as on fresh nodes."""
    yield
    if "cluster" not in request.fixturenames:
        return
    cluster = request.getfixturevalue("cluster")
    for node in cluster.rest.get("/api/v1/nodes")["items"]:
        meta = node["metadata"]
        labels = meta.get("labels") or {}
        taints = node["spec"].get("taints") or []
        kept = [t for t in taints if t.get("key") != SUSPECT_LABEL]
        patch: dict[str, Any] = {"metadata": {}}
        stale_labels = {
            key: None
            for key in (
                SUSPECT_LABEL,
                FAILING_WORKLOADS_LABEL,
                MOVED_OFF_LABEL,
                NODE_OPT_OUT_LABEL,
                PRESSURE_LABEL_KEY,
                LOAD_LABEL,
                MAINTENANCE_LABEL,
            )
            if key in labels
        }
        if stale_labels:
            patch["metadata"]["labels"] = stale_labels
        stale = [
            k
            for k in (
                NODE_HEALTH_ANNOTATION,
                PRESSURE_ANNOTATION,
                USAGE_ANNOTATION,
                SIM_CPU_USAGE_ANNOTATION,
                SIM_MEMORY_USAGE_ANNOTATION,
            )
            if k in (meta.get("annotations") or {})
        ]
        if stale:
            patch["metadata"]["annotations"] = {k: None for k in stale}
        if len(kept) != len(taints):
            patch["spec"] = {"taints": kept}
        if node["spec"].get("unschedulable"):
            patch.setdefault("spec", {})["unschedulable"] = None
        if patch != {"metadata": {}}:
            cluster.rest.patch(f"/api/v1/nodes/{meta['name']}", patch)


def mutate_admission_over_tls(
    cluster: Any, log_dir: Path, tls_dir: Path, **kw: Any
) -> tuple[FunctionServer, Path]:
    """mutate-admission serving TLS with a CA made in ``tls_dir``, reading the cluster with
    its credentials (``kw``: FunctionServer's other options); not started. And the CA."""
    ca, crt, key = webhook_setup.make_tls(tls_dir)
    server = FunctionServer(
        "mutate-admission",
        log_dir,
        env=environment(cluster.kubeconfig),
        tls=(crt, key),
        ca_file=ca,
        **kw,
    )
    return server, ca


def register_for_one_namespace(
    api_client: k8s.ApiClient, url: str, ca: Path, name: str, namespace: str
) -> None:
    """Register a webhook at ``url`` as shipped, but sent only what is created in
    ``namespace``: nothing else in the session reaches it."""
    body = webhook_setup.configuration(url, ca, name=name)
    for hook in body["webhooks"]:
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    webhook_setup.register(api_client, body)


@pytest.fixture(scope="session")
def webhook(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    """mutate-admission over TLS, registered with the API server for the whole session."""
    tls_dir = tmp_path_factory.mktemp("webhook-tls")
    server, ca = mutate_admission_over_tls(cluster, cluster.log_dir, tls_dir)
    server.start()
    hook = Webhook(server, server.url, ca, cluster.api_client())
    hook.register()
    yield hook
    webhook_setup.unregister(hook.api_client, hook.name)
    server.stop()


@pytest.fixture(scope="session")
def api(cluster: Any) -> Kube:
    return Kube(cluster.api_client())


@pytest.fixture
def core(cluster: Any) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(cluster.api_client())


@pytest.fixture
def apps(cluster: Any) -> k8s.AppsV1Api:
    return k8s.AppsV1Api(cluster.api_client())


@pytest.fixture
def batch(cluster: Any) -> k8s.BatchV1Api:
    return k8s.BatchV1Api(cluster.api_client())


@pytest.fixture
def faults(cluster: Any) -> Iterator[Callable[..., None]]:
    """Set node faults for one test; every node is healed afterwards."""
    touched: set[str] = set()

    def set_faults(mode: str | None, *nodes: str) -> None:
        for node in nodes:
            cluster.set_fault(node, mode)
            touched.add(node)

    yield set_faults
    for node in touched:
        cluster.set_fault(node, None)


# Faults that fail a pod in different ways (different reasons), for every node broken at once.
# Each writes the pod's status again and again (pulls retried, containers restarted), so each
# failure reaches detect-failures past its threshold; a CreateContainerError is written once
# and, with no later update, waits for the sweep.
DIFFERENT_WAYS: Final = ("imagepull", "crashloop", "oom")


def break_every_node_differently(faults: Callable[..., None], nodes: Sequence[str]) -> None:
    """Break every node, no way on more than two of them: a lone pod then never fails the same
    way on the three nodes that stop its moves (shared/workloads/everywhere.py), so every node
    is tried and the story of a pod our exclusions leave unschedulable can be told. One fault
    everywhere is the stop's own story (tests/e2e/test_fails_everywhere.py)."""
    assert len(nodes) <= 2 * len(DIFFERENT_WAYS), "a way would repeat on three nodes"
    for i, way in enumerate(DIFFERENT_WAYS):
        faults(way, *nodes[i :: len(DIFFERENT_WAYS)])


def pod_event(pod: dict[str, Any]) -> events.Event:
    """The event ApiServerSource (Resource mode) sends for this pod's latest update: the one the
    kubectl plugin's ``explain`` builds."""
    return explain.pod_event(pod)


@dataclass
class Loop:
    """detect-failures then update-annotations, as the Triggers chain them, in-process."""

    api: Kube
    cfg: Config

    def __post_init__(self) -> None:
        self.rescheduler = Rescheduler(self.api, self.cfg)
        self.replies: list[events.Reply] = []

    def failing_event(self, pod: dict[str, Any], *, early: bool = False) -> events.Event | None:
        """The failing-pod event detect-failures sends for ``pod``'s latest state; an early
        report (a first failure, for the fast path) only when ``early``: the tests driving
        this loop are about the full rules, and update-annotations answers an early report
        on a node that is not suspect with nothing (tests/e2e/test_node_health.py)."""
        reply = detect(pod_event(pod), self.cfg)
        if reply is None or (reply.data.get("kind") == "early" and not early):
            return None
        return events.Event(
            str(uuid.uuid4()),
            "/kn-rescheduler/detect-failures",
            reply.type,
            {"subject": reply.subject},
            dict(reply.data),
        )

    def deliver(self, event: events.Event) -> events.Reply | None:
        reply = self.rescheduler.handle(event)
        if reply is not None:
            self.replies.append(reply)
        return reply

    def pump(self, namespace: str, *, kinds: tuple[str, ...] = ()) -> int:
        """Deliver a failing event for every failing pod in ``namespace`` (only failures of
        the given kinds, when given); how many there were."""
        handled = 0
        for pod in self.api.list_all("Pod", namespace):
            failing = self.failing_event(pod)
            if failing is not None and (not kinds or failing.data["kind"] in kinds):
                self.deliver(failing)
                handled += 1
        return handled


@pytest.fixture
def loop(api: Kube, webhook: Webhook) -> Loop:
    return Loop(api, LOCAL)


def state_of(api: Kube, kind: str, namespace: str, name: str) -> WorkloadState:
    obj = api.get(kind, namespace, name)
    return load_state((obj["metadata"].get("annotations") or {}).get(STATE_ANNOTATION))


def excluded_stamp(pod: dict[str, Any]) -> list[str]:
    raw = (pod["metadata"].get("annotations") or {}).get("kn-rescheduler.io/excluded-nodes")
    return json.loads(raw) if raw else []


def preferring(node: str) -> dict[str, Any]:
    """Affinity that makes the scheduler pick ``node`` first while it is allowed."""
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": FAULTY_PREFERENCE_WEIGHT,
                    "preference": {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node]}
                        ]
                    },
                }
            ]
        }
    }


def pod_template(labels: dict[str, str], node: str, **spec: Any) -> dict[str, Any]:
    """The tests' pod template (tests/builders.py) preferring ``node``; ``spec`` adds fields
    or replaces them."""
    made = builders.template(labels, affinity=preferring(node))
    made["spec"].update(spec)
    return made


def run_demo(run_dir: Path, *args: str, timeout: float) -> dict[str, Any]:
    """``python -m dev.stack.demo ARGS --no-color --run-dir RUN_DIR``, as ``make demo`` runs it:
    its exit code, output and summary.json (None when it wrote none)."""
    result = subprocess.run(
        [sys.executable, "-m", "dev.stack.demo", *args, "--no-color", "--run-dir", str(run_dir)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    summary = run_dir / "summary.json"
    return {
        "code": result.returncode,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "summary": json.loads(summary.read_text()) if summary.exists() else None,
    }
