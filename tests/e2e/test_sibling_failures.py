"""A move records every node where the workload is failing now (issue 13, part 2).

A Deployment whose pods prefer two crash-looping nodes starts pods on both. The first move
used to record only its own node: a replacement admitted before the second node was recorded
went to the second node (the preferred one still allowed) and failed again, one wasted move.
Now update-annotations lists the workload's pods once per move and records, free of charge,
every other node where one of them is failing for a reason another node could fix.

The scenario runs the whole pipeline (Knative's ApiServerSource adapter, Knative's Broker with the
Triggers in knative/, detect-failures, update-annotations, the webhook the API server calls,
and the sweep) and watches every pod of the namespace from its creation, so no binding to a
faulty node can go unseen. The deliveries before it go through functions-framework's test
client against the same real API server, with a log of every API request: what one move costs
and what a refused list changes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch

from dev.localcluster.keys import (
    SIM_FAULT_LABEL,
)
from dev.stack.stack import Stack
from shared.api.keys import (
    EVENT_POD_RESCHEDULED,
    POLICY_ANNOTATION,
    STATE_ANNOTATION,
)
from shared.platform.kube import Kube, KubeError
from tests import builders
from tests.e2e.conftest import FAULTY_PREFERENCE_WEIGHT, Loop, state_of, wait_for
from tests.e2e.test_moves import account, post
from tests.e2e.test_pipeline import replies_for, settled
from tests.e2e.test_rescheduling import events_for, gone, only, pods
from tests.handlers.conftest import ClientFactory, reply_of

pytestmark = pytest.mark.e2e

REPLICAS = 12
# Every replica may be moved this many times: far more than the scenario needs, so that a
# wasted move shows in the count instead of ending in an exhausted budget.
RETRIES = "3"
SETTLE = 120.0
# How often the sweep resends every failing pod (a real install: every few minutes).
SWEEP_EVERY = 10.0


@pytest.fixture
def stack(cluster: Any, tmp_path: Any) -> Iterator[Stack]:
    """The whole pipeline, for one test: it acts on every namespace."""
    with Stack(
        cluster.kubeconfig,
        cluster.api_client(),
        tmp_path / "stack",
        cluster.log_dir,
        sweep_every=SWEEP_EVERY,
    ) as running:
        yield running


@dataclass
class Bindings:
    """Every pod of a namespace in the order it was created, and the node it was bound to,
    from a watch started before the workload: nothing happens between two looks."""

    core: k8s.CoreV1Api
    namespace: str
    created: list[str] = field(default_factory=list)
    node_of: dict[str, str] = field(default_factory=dict)
    name_of: dict[str, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _ready: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Bindings:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the pod watch did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        version = self.core.list_namespaced_pod(self.namespace).metadata.resource_version
        self._ready.set()
        while not self._stop.is_set():
            stream = watch.Watch().stream(
                self.core.list_namespaced_pod,
                self.namespace,
                resource_version=version,
                timeout_seconds=2,
                allow_watch_bookmarks=True,
            )
            for event in stream:
                pod = event["object"]
                version = pod.metadata.resource_version
                if event["type"] == "BOOKMARK":
                    continue
                self._saw(pod)

    def _saw(self, pod: Any) -> None:
        uid, node = pod.metadata.uid, pod.spec.node_name
        with self._lock:
            if uid not in self.name_of:
                self.created.append(uid)
                self.name_of[uid] = pod.metadata.name
            if node and uid not in self.node_of:
                self.node_of[uid] = node

    def snapshot(self) -> tuple[list[str], dict[str, str]]:
        with self._lock:
            return list(self.created), dict(self.node_of)


def preferring_faulty(mode: str) -> dict[str, Any]:
    """A preferred node affinity for the nodes with the simulated fault ``mode``: the
    scheduler puts pods there while it may (a favourite node that happens to be broken)."""
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": FAULTY_PREFERENCE_WEIGHT,
                    "preference": {
                        "matchExpressions": [
                            {"key": SIM_FAULT_LABEL, "operator": "In", "values": [mode]}
                        ]
                    },
                }
            ]
        }
    }


# -- one delivery: what it records, what it costs -------------------------------------------------


def one_pod_on_each_faulty_node(api: Kube, namespace: str, mode: str) -> None:
    """A ReplicaSet of two pods, each required on a different node with the fault ``mode``."""
    labels = {"app": "web"}
    on_faulty = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": SIM_FAULT_LABEL, "operator": "In", "values": [mode]}]}
            ]
        }
    }
    apart = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}
        ]
    }
    api.create(
        "ReplicaSet",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "web", "annotations": {POLICY_ANNOTATION: RETRIES}},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "affinity": {"nodeAffinity": on_faulty, "podAntiAffinity": apart},
                        "containers": [{"name": "app", "image": "registry.example.com/web:1"}],
                        "terminationGracePeriodSeconds": 0,
                    },
                },
            },
        },
    )


def both_failing(api: Kube, loop: Loop, namespace: str) -> list[dict[str, Any]] | None:
    failing = [p for p in pods(api, namespace) if loop.failing_event(p) is not None]
    return failing if len(failing) == 2 else None


@dataclass
class RequestLog:
    """The API requests made while `deliver` runs: update-annotations' own (a spy on the one
    request path of shared.platform.kube; each request still goes to the real API server)."""

    client: Any
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    _on: bool = False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> RequestLog:
        original = Kube.request

        def request(kube: Kube, method: str, path: str, **kwargs: Any) -> Any:
            if not self._on:
                return original(kube, method, path, **kwargs)
            selector = (kwargs.get("query") or {}).get("labelSelector", "")
            try:
                answer = original(kube, method, path, **kwargs)
            except KubeError as exc:
                self.calls.append((method, path, f"{selector} -> {type(exc).__name__}"))
                raise
            self.calls.append((method, path, selector))
            return answer

        monkeypatch.setattr(Kube, "request", request)
        return self

    def deliver(self, event: Any) -> Any:
        """Post ``event`` to update-annotations; its requests replace the ones logged before."""
        self.calls.clear()
        self._on = True
        try:
            return post(self.client, event)
        finally:
            self._on = False

    def pod_lists(self) -> list[tuple[str, str, str]]:
        return [c for c in self.calls if c[0] == "GET" and c[1].endswith("/pods")]


def test_a_move_records_the_node_where_another_pod_of_its_replicaset_is_failing_now(
    cluster: Any,
    namespace: str,
    api: Kube,
    loop: Loop,
    faults: Callable[..., None],
    function_client: ClientFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faults("crashloop", *cluster.nodes[:2])
    one_pod_on_each_faulty_node(api, namespace, "crashloop")
    moving, other = wait_for("both pods failing", lambda: both_failing(api, loop, namespace))
    own, elsewhere = moving["spec"]["nodeName"], other["spec"]["nodeName"]
    event = loop.failing_event(moving)
    assert event is not None
    client = function_client("update-annotations", KUBECONFIG=str(cluster.kubeconfig))
    log = RequestLog(client).install(monkeypatch)

    response = log.deliver(event)
    moved = list(log.calls)
    assert response.status_code == 200
    _, data = reply_of(response)
    assert (data["moves"], data["excludedNodes"]) == (1, [elsewhere, own])
    state = state_of(api, "ReplicaSet", namespace, "web")
    # One move charged, both nodes recorded: the other pod's node came free.
    assert (state.moves, state.excluded_nodes) == (1, (elsewhere, own))
    assert gone(api, namespace, moving["metadata"]["name"], moving["metadata"]["uid"])
    assert not gone(api, namespace, other["metadata"]["name"], other["metadata"]["uid"])
    (said,) = events_for(api, namespace, "web", "Rescheduled")
    assert f"also excluded node {elsewhere}" in said["message"]
    assert "no move counted" in said["message"]
    # The price: one LIST of the namespace's pods by the pod's labels, nothing more.
    listed = [c for c in moved if c[0] == "GET" and c[1].endswith("/pods")]
    ((_, path, selector),) = listed
    assert path == f"/api/v1/namespaces/{namespace}/pods" and "app=web" in selector.split(",")
    print(f"\none move: {len(moved)} API requests: " + "; ".join(map(str, moved)))

    # The same event again: already handled, nothing listed.
    assert log.deliver(event).status_code == 202
    assert log.pod_lists() == []
    print(f"its redelivery: {len(log.calls)} API requests: " + "; ".join(map(str, log.calls)))

    # The other pod moves in its turn: one more move, no node lost, no new node to announce.
    event = loop.failing_event(api.get("Pod", namespace, other["metadata"]["name"]))
    assert event is not None
    assert log.deliver(event).status_code == 200
    state = state_of(api, "ReplicaSet", namespace, "web")
    assert (state.moves, sorted(state.excluded_nodes)) == (2, sorted([own, elsewhere]))
    assert len(log.pod_lists()) == 1


def test_a_jobs_counted_move_counts_its_pending_failures_from_the_same_single_list(
    cluster: Any,
    namespace: str,
    api: Kube,
    loop: Loop,
    faults: Callable[..., None],
    function_client: ClientFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    faults("imagepull", cluster.nodes[0])
    labels = {"app": "report"}
    on_faulty = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": SIM_FAULT_LABEL, "operator": "In", "values": ["imagepull"]}
                    ]
                }
            ]
        }
    }
    api.create(
        "Job",
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "report", "annotations": {POLICY_ANNOTATION: RETRIES}},
            "spec": {
                "backoffLimit": 6,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "restartPolicy": "Never",
                        "affinity": {"nodeAffinity": on_faulty},
                        "containers": [{"name": "app", "image": "registry.example.com/report:1"}],
                        "terminationGracePeriodSeconds": 0,
                    },
                },
            },
        },
    )
    failing = wait_for(
        "the Job's pod failing",
        lambda: next((p for p in pods(api, namespace) if loop.failing_event(p)), None),
    )
    event = loop.failing_event(failing)
    assert event is not None
    client = function_client("update-annotations", KUBECONFIG=str(cluster.kubeconfig))
    log = RequestLog(client).install(monkeypatch)

    assert log.deliver(event).status_code == 200
    # The move counts against backoffLimit, so the Job's pending failures were counted, from
    # the list the sibling search made: one LIST of the namespace's pods for both. (The
    # moved-off mark may list the node's pods, cluster-wide, to see whether others fail there.)
    namespaced = [c for c in log.pod_lists() if c[1].startswith("/api/v1/namespaces/")]
    assert len(namespaced) == 1, log.calls
    assert state_of(api, "Job", namespace, "report").moves == 1
    (said,) = events_for(api, namespace, "report", "Rescheduled")
    assert "1 failure(s) against backoffLimit 6" in said["message"]


# update-annotations' rights on one namespace, except listing pods.
WITHOUT_LIST = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "delete"]},
    {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "patch"]},
]


def test_a_refused_list_costs_the_move_only_its_extra_nodes(
    cluster: Any,
    namespace: str,
    api: Kube,
    loop: Loop,
    faults: Callable[..., None],
    function_client: ClientFactory,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    faults("crashloop", *cluster.nodes[:2])
    one_pod_on_each_faulty_node(api, namespace, "crashloop")
    moving, _ = wait_for("both pods failing", lambda: both_failing(api, loop, namespace))
    event = loop.failing_event(moving)
    assert event is not None
    kubeconfig = account(cluster, api, namespace, "mover", WITHOUT_LIST, tmp_path / "kc")
    client = function_client("update-annotations", KUBECONFIG=str(kubeconfig))
    log = RequestLog(client).install(monkeypatch)

    response = log.deliver(event)
    # Best effort: the move goes on, recorded, with its own node only.
    assert response.status_code == 200
    assert [c[2].rsplit(" -> ", 1)[-1] for c in log.pod_lists()] == ["Forbidden"]
    state = state_of(api, "ReplicaSet", namespace, "web")
    assert (state.moves, state.excluded_nodes) == (1, (moving["spec"]["nodeName"],))
    assert moving["metadata"]["uid"] in state.handled
    assert gone(api, namespace, moving["metadata"]["name"], moving["metadata"]["uid"])
    annotations = api.get("ReplicaSet", namespace, "web")["metadata"]["annotations"]
    assert STATE_ANNOTATION in annotations


# -- the whole pipeline ---------------------------------------------------------------------------


def test_replicas_on_two_faulty_nodes_are_each_moved_exactly_once(
    cluster: Any,
    namespace: str,
    api: Kube,
    core: k8s.CoreV1Api,
    stack: Stack,
    faults: Callable[..., None],
) -> None:
    bad = list(cluster.nodes[:2])
    good = set(cluster.nodes) - set(bad)
    assert good, "the scenario needs healthy nodes"
    faults("crashloop", *bad)

    web = builders.template({"app": "web"}, affinity=preferring_faulty("crashloop"))
    with Bindings(core, namespace) as bindings:
        started = time.monotonic()
        api.create(
            "Deployment",
            namespace,
            builders.deployment("web", replicas=REPLICAS, retries=RETRIES, template=web),
        )
        settled(api, namespace, REPLICAS, good, f"{REPLICAS} pods Ready on good nodes", SETTLE)
        took = time.monotonic() - started
        assert stack.wait_idle(10)
        created, node_of = bindings.snapshot()

    originals = set(created[:REPLICAS])
    on_bad = {uid for uid, node in node_of.items() if node in bad}
    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]
    state = state_of(api, "ReplicaSet", namespace, rs)
    where = {bindings.name_of[uid]: node_of.get(uid) for uid in created}
    print(
        f"\nall {REPLICAS} Ready on good nodes after {took:.1f} s; {len(on_bad)} started on the "
        f"faulty nodes, {state.moves} moves; excluded {state.excluded_nodes}; pods: {where}"
    )

    # The scenario happened: replicas started on both faulty nodes.
    assert {node_of[uid] for uid in on_bad} == set(bad), where
    # No replacement was ever bound to a faulty node ...
    assert on_bad <= originals, f"a replacement went to a faulty node: {where}"
    # ... so every replica that started on one was moved exactly once, and no other pod was.
    assert state.moves == len(on_bad), where
    assert len(created) == REPLICAS + state.moves, where
    assert sorted(state.excluded_nodes) == sorted(bad)
    moved = replies_for(stack, namespace, EVENT_POD_RESCHEDULED)
    assert len(moved) == state.moves
    assert {r["data"]["uid"] for r in moved} == on_bad
    assert len(events_for(api, namespace, rs, "Rescheduled")) == state.moves
