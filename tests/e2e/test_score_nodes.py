"""score-nodes called by the real kube-scheduler, on the real control plane.

This module starts a control plane of its own, whose kube-scheduler runs with a
KubeSchedulerConfiguration that calls score-nodes on its default profile (the extender served
as it ships: gunicorn, FunctionServer), and, beside it, a second kube-scheduler for the
``kn-rescheduler-load-aware`` profile, and a third without any extender. Node usage is written
onto the Nodes as annotate-usage writes it (the usage annotation, sampled now), so each test
sets exactly the load it needs. No Prometheus: nothing here reads it.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dev.localcluster import Cluster
from dev.localcluster.rest import ApiError
from dev.stack.functions import FunctionServer, environment, free_port
from shared.api.keys import LOAD_AWARE_SCHEDULER_NAME, MAINTENANCE_LABEL, USAGE_ANNOTATION
from shared.api.kubetypes import Node, Pod
from shared.api.usage import Estimate, Reading, UsageRecord
from shared.nodes.usage import allocatable, estimate
from tests.e2e.conftest import let_time_pass, wait_for

pytestmark = pytest.mark.e2e

PLAIN_SCHEDULER = "plain-scheduler"
NODES = 4


def extender_config(url: str, scheduler_name: str) -> dict[str, Any]:
    """A KubeSchedulerConfiguration (without the client and leader-election parts, which the
    cluster fills in) whose one profile calls score-nodes."""
    return {
        "profiles": [{"schedulerName": scheduler_name}],
        "extenders": [
            {
                "urlPrefix": url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": 5,
                # As shipped: names only, looked up in score-nodes' node cache.
                "nodeCacheCapable": True,
                "ignorable": True,
            }
        ],
    }


@dataclass
class Setup:
    cluster: Cluster
    server: FunctionServer
    namespace: str

    def calls(self, verb: str) -> float:
        """How many calls of ``verb`` score-nodes answered with 200, from its /metrics."""
        with urllib.request.urlopen(self.server.url + "metrics", timeout=5) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            if family.name == "knr_extender_requests":
                return sum(
                    s.value
                    for s in family.samples
                    if s.name.endswith("_total") and s.labels == {"verb": verb, "code": "200"}
                )
        return 0.0


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("extender-cluster")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cluster = Cluster(
        workdir,
        nodes=NODES,
        keep_workdir=True,
        prometheus=False,
        scheduler_config=extender_config(url, "default-scheduler"),
    )
    cluster.start()
    server = FunctionServer(
        "score-nodes", cluster.log_dir, env=environment(cluster.kubeconfig), port=port
    )
    try:
        server.start()
        namespace = f"extender-{uuid.uuid4().hex[:6]}"
        cluster.rest.post(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        )
        wait_for(
            "the namespace's default ServiceAccount",
            lambda: _exists(cluster, f"/api/v1/namespaces/{namespace}/serviceaccounts/default"),
        )
        yield Setup(cluster, server, namespace)
    finally:
        server.stop()
        cluster.stop()


@pytest.fixture(autouse=True)
def quiet_nodes(setup: Setup) -> Iterator[None]:
    """Every test starts on nodes at 20 % with nothing in maintenance and no pods of ours."""
    for node in setup.cluster.nodes:
        set_usage(setup, node, 20.0)
    yield
    for node in setup.cluster.nodes:
        maintenance(setup, node, None)
    pods = setup.cluster.rest.get(f"/api/v1/namespaces/{setup.namespace}/pods")["items"]
    for pod in pods:
        try:
            setup.cluster.rest.delete(
                f"/api/v1/namespaces/{setup.namespace}/pods/{pod['metadata']['name']}"
            )
        except ApiError as e:
            # Gone between the list and the delete: the garbage collector removes a deleted
            # DaemonSet's pods on its own.
            if e.status != 404:
                raise
    wait_for(
        "our pods to be gone",
        lambda: not setup.cluster.rest.get(f"/api/v1/namespaces/{setup.namespace}/pods")["items"],
    )


def _exists(cluster: Cluster, path: str) -> bool:
    try:
        cluster.rest.get(path)
    except ApiError:
        return False
    return True


def set_usage(
    setup: Setup,
    node: str,
    cpu: float,
    memory: float = 20.0,
    guess: Estimate | None = None,
    at: datetime | None = None,
) -> None:
    """Writes the usage record annotate-usage would write, sampled now."""
    record = UsageRecord(
        sampled_at=(at or datetime.now(UTC)).replace(microsecond=0),
        source="prometheus",
        cpu=Reading(now=cpu, avg5m=cpu, max1h=cpu),
        memory=Reading(now=memory, avg5m=memory, max1h=memory),
        estimate=guess or Estimate(),
    )
    write_node(setup, node, {"annotations": {USAGE_ANNOTATION: record.to_json()}})


def maintenance(setup: Setup, node: str, value: str | None) -> None:
    write_node(setup, node, {"labels": {MAINTENANCE_LABEL: value}})


def node_cache(setup: Setup) -> dict[str, Any]:
    """score-nodes' node cache as its decisions see it (GET /debug/node-cache)."""
    with urllib.request.urlopen(setup.server.url + "debug/node-cache", timeout=5) as answer:
        return dict(json.loads(answer.read()))


def write_node(setup: Setup, node: str, metadata: dict[str, Any]) -> None:
    """Patches the Node's metadata, then waits until score-nodes' node cache holds it as
    written: the scheduler sends names only (nodeCacheCapable: true, as shipped), so a pod
    created before the watch event arrived (milliseconds) would be judged on the old record."""
    written = setup.cluster.rest.patch(f"/api/v1/nodes/{node}", {"metadata": metadata})
    annotations = written["metadata"].get("annotations") or {}
    labels = written["metadata"].get("labels") or {}
    wanted = {
        "usage": annotations.get(USAGE_ANNOTATION),
        "maintenance": labels.get(MAINTENANCE_LABEL) == "true",
    }

    def cached() -> bool:
        cache = node_cache(setup)
        kept = cache["nodes"].get(node) or {}
        return bool(cache["ready"]) and {key: kept.get(key) for key in wanted} == wanted

    wait_for(f"score-nodes' node cache to hold {node} as written", cached, 10)


def create_pod(
    setup: Setup,
    name: str,
    *,
    scheduler: str | None = None,
    node_selector: dict[str, str] | None = None,
    cpu: str = "100m",
    namespace: str | None = None,
    priority_class: str | None = None,
) -> None:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    if node_selector:
        spec["nodeSelector"] = node_selector
    if priority_class:
        spec["priorityClassName"] = priority_class
    setup.cluster.rest.post(
        f"/api/v1/namespaces/{namespace or setup.namespace}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec},
    )


def node_of(setup: Setup, name: str, namespace: str | None = None) -> str | None:
    pod = setup.cluster.rest.get(f"/api/v1/namespaces/{namespace or setup.namespace}/pods/{name}")
    node = pod["spec"].get("nodeName")
    return str(node) if node else None


def bound(setup: Setup, name: str, timeout: float = 30.0, namespace: str | None = None) -> str:
    return str(
        wait_for(f"pod {name} to be bound", lambda: node_of(setup, name, namespace), timeout)
    )


def with_load_aware_scheduler(setup: Setup) -> None:
    """Starts the second scheduler, kn-rescheduler-load-aware, calling score-nodes (once)."""
    if not any(p.name == LOAD_AWARE_SCHEDULER_NAME for p in setup.cluster.procs):
        setup.cluster.start_scheduler(
            LOAD_AWARE_SCHEDULER_NAME,
            extender_config(setup.server.url.rstrip("/"), LOAD_AWARE_SCHEDULER_NAME),
        )


def scheduler_events(setup: Setup, pod: str, reason: str) -> list[dict[str, Any]]:
    """The events.k8s.io Events about ``pod`` with ``reason``, as the scheduler records them."""
    items = setup.cluster.rest.get(f"/apis/events.k8s.io/v1/namespaces/{setup.namespace}/events")[
        "items"
    ]
    return [
        e for e in items if e.get("regarding", {}).get("name") == pod and e.get("reason") == reason
    ]


def test_the_scheduler_calls_the_extender_and_places_no_pod_on_a_node_over_the_cpu_threshold(
    setup: Setup,
) -> None:
    set_usage(setup, "node-0", 92.0)
    before = setup.calls("filter"), setup.calls("prioritize")
    names = [f"spread-{i}" for i in range(8)]
    for name in names:
        create_pod(setup, name)
    placed = {name: bound(setup, name) for name in names}
    assert "node-0" not in placed.values(), placed
    assert setup.calls("filter") >= before[0] + len(names)
    assert setup.calls("prioritize") >= before[1] + len(names)


def test_a_node_in_maintenance_gets_no_pod_even_when_it_is_the_coolest(setup: Setup) -> None:
    # The coolest node: without the maintenance filter the score would send every pod there.
    set_usage(setup, "node-1", 5.0, memory=5.0)
    maintenance(setup, "node-1", "true")
    names = [f"maint-{i}" for i in range(6)]
    for name in names:
        create_pod(setup, name)
    placed = {name: bound(setup, name) for name in names}
    assert "node-1" not in placed.values(), placed


def test_when_every_node_is_hot_a_load_aware_pod_waits_and_failed_scheduling_names_our_reason(
    setup: Setup,
) -> None:
    with_load_aware_scheduler(setup)
    for node in setup.cluster.nodes:
        set_usage(setup, node, 90.0)
    create_pod(setup, "nowhere", scheduler=LOAD_AWARE_SCHEDULER_NAME)
    events = wait_for(
        "a FailedScheduling event", lambda: scheduler_events(setup, "nowhere", "FailedScheduling")
    )
    note = events[-1]["note"]
    # Identical reasons are counted into one phrase; unresolvable keeps preemption out of it.
    assert f"0/{NODES} nodes are available: {NODES} node CPU usage over 80 percent." in note, note
    assert "Preemption is not helpful for scheduling" in note, note
    assert node_of(setup, "nowhere") is None
    # Once a node cools down, the pod waiting for one is placed there: by the next sample at
    # the latest. The scheduler retries a pod an extender rejected on any cluster event, and
    # it may see this Node update (and retry at once) before score-nodes' watch does; the
    # pod then waits for the next event, which annotate-usage's next sample is.
    set_usage(setup, "node-3", 30.0)
    let_time_pass(1.0, "the record's time has whole seconds: the next sample must differ")
    set_usage(setup, "node-3", 30.0)
    assert bound(setup, "nowhere", timeout=60.0) == "node-3"


def test_when_every_node_is_hot_the_default_scheduler_still_places_pods_on_the_coolest(
    setup: Setup,
) -> None:
    """The default scheduler with the extender: every pod of the cluster is filtered, and none
    can wait for a cool node (nothing ends the wait: no preemption, no autoscaler). The hot
    nodes pass and the score ranks them; nothing in maintenance is used."""
    for node, cpu in zip(setup.cluster.nodes, (97.0, 91.0, 85.0, 93.0), strict=True):
        set_usage(setup, node, cpu, memory=60.0)
    maintenance(setup, "node-1", "true")
    names = [f"hot-{i}" for i in range(4)]
    started = time.monotonic()
    for name in names:
        create_pod(setup, name)
    placed = {name: bound(setup, name) for name in names}
    seconds = time.monotonic() - started
    # 85 % CPU and 60 % memory score 3 of 10, 93 and 97 % score 2: the coolest wins each time
    # (the score does not move within one sample).
    assert set(placed.values()) == {"node-2"}, placed
    assert seconds < 30, seconds
    for name in names:
        assert not scheduler_events(setup, name, "FailedScheduling"), name


def test_system_critical_and_kube_system_pods_run_even_for_the_load_aware_scheduler(
    setup: Setup,
) -> None:
    with_load_aware_scheduler(setup)
    for node in setup.cluster.nodes:
        set_usage(setup, node, 97.0, memory=97.0)
    create_pod(
        setup,
        "critical",
        scheduler=LOAD_AWARE_SCHEDULER_NAME,
        priority_class="system-cluster-critical",
    )
    assert bound(setup, "critical") in setup.cluster.nodes
    system = f"system-{uuid.uuid4().hex[:6]}"
    create_pod(setup, system, scheduler=LOAD_AWARE_SCHEDULER_NAME, namespace="kube-system")
    try:
        assert bound(setup, system, namespace="kube-system") in setup.cluster.nodes
    finally:
        setup.cluster.rest.delete(f"/api/v1/namespaces/kube-system/pods/{system}")


@pytest.mark.parametrize("coolest", ["node-2", "node-3"])
def test_the_score_sends_a_pod_to_the_coolest_node(setup: Setup, coolest: str) -> None:
    for node, cpu in zip(setup.cluster.nodes, (55.0, 60.0, 65.0, 70.0), strict=True):
        set_usage(setup, node, cpu, memory=50.0)
    set_usage(setup, coolest, 10.0, memory=10.0)
    create_pod(setup, f"cool-{coolest}")
    assert bound(setup, f"cool-{coolest}") == coolest


def test_a_burst_follows_the_score_until_the_estimate_of_its_pods_counts(setup: Setup) -> None:
    """Within one sample the extender sees the same usage for every pod of a burst (and, with
    nodeCacheCapable false, kube-scheduler 1.36 scores the nodes it returns without their pods:
    kubernetes/kubernetes#141781), so a burst lands on the coolest node. The annotator's next
    record counts those pods' requests as estimated usage, and the next pod goes elsewhere."""
    for node in setup.cluster.nodes:
        set_usage(setup, node, 50.0, memory=50.0)
    set_usage(setup, "node-2", 5.0, memory=5.0)
    names = [f"burst-{i}" for i in range(4)]
    for name in names:
        create_pod(setup, name, cpu="1500m")
    assert {bound(setup, name) for name in names} == {"node-2"}
    # annotate-usage's next tick: the same measured usage, plus the estimate it computes from
    # the pods' PodScheduled conditions as the real scheduler wrote them.
    sampled = datetime.now(UTC)
    pods = setup.cluster.rest.get(
        f"/api/v1/namespaces/{setup.namespace}/pods", {"fieldSelector": "spec.nodeName=node-2"}
    )["items"]
    whole = allocatable(cast(Node, setup.cluster.rest.get("/api/v1/nodes/node-2")))
    assert whole is not None
    guess = estimate(cast(list[Pod], pods), whole, sampled, timedelta(minutes=1), 1.0)
    # 4 x 1500m of 7800m allocatable.
    assert guess.pods == 4 and round(guess.cpu, 1) == 76.9
    set_usage(setup, "node-2", 5.0, memory=5.0, guess=guess, at=sampled)
    create_pod(setup, "after-burst")
    assert bound(setup, "after-burst") != "node-2"
    # A pod of the load-aware scheduler waits rather than go there (one of the default
    # scheduler's would go: the only node it may use is hot, so it ranks first).
    with_load_aware_scheduler(setup)
    create_pod(
        setup,
        "after-burst-pinned",
        scheduler=LOAD_AWARE_SCHEDULER_NAME,
        node_selector={"kubernetes.io/hostname": "node-2"},
    )
    failed = wait_for(
        "a FailedScheduling event",
        lambda: scheduler_events(setup, "after-burst-pinned", "FailedScheduling"),
    )
    assert "1 node CPU usage over 80 percent" in failed[-1]["note"], failed[-1]["note"]


def test_a_daemonsets_pod_still_lands_on_a_hot_node(setup: Setup) -> None:
    """The DaemonSet controller pins each of its pods to one node; a hot node keeps its
    daemon (filtered away, it would go without for as long as it stays hot)."""
    set_usage(setup, "node-0", 97.0, memory=97.0)
    rest, ns = setup.cluster.rest, setup.namespace
    rest.post(
        f"/apis/apps/v1/namespaces/{ns}/daemonsets",
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "node-agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "node-agent"}},
                "template": {
                    "metadata": {"labels": {"app": "node-agent"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "agent",
                                "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
                            }
                        ],
                        "terminationGracePeriodSeconds": 0,
                    },
                },
            },
        },
    )
    try:

        def daemon_nodes() -> set[str]:
            pods = rest.get(f"/api/v1/namespaces/{ns}/pods", {"labelSelector": "app=node-agent"})
            return {p["spec"].get("nodeName") for p in pods["items"]} - {None}

        wait_for(
            "a node-agent pod bound on every node",
            lambda: daemon_nodes() == set(setup.cluster.nodes),
        )
    finally:
        rest.delete(f"/apis/apps/v1/namespaces/{ns}/daemonsets/node-agent")


def test_a_pod_for_the_load_aware_profile_is_placed_by_the_second_scheduler_with_the_extender(
    setup: Setup,
) -> None:
    with_load_aware_scheduler(setup)
    set_usage(setup, "node-0", 95.0)
    set_usage(setup, "node-1", 5.0, memory=5.0)
    before = setup.calls("filter")
    create_pod(setup, "aware", scheduler=LOAD_AWARE_SCHEDULER_NAME)
    assert bound(setup, "aware") == "node-1"
    scheduled = wait_for("a Scheduled event", lambda: scheduler_events(setup, "aware", "Scheduled"))
    assert scheduled[-1]["reportingController"] == LOAD_AWARE_SCHEDULER_NAME
    # Pinned to the hot node, it waits there, for our reason.
    create_pod(
        setup,
        "aware-pinned",
        scheduler=LOAD_AWARE_SCHEDULER_NAME,
        node_selector={"kubernetes.io/hostname": "node-0"},
    )
    failed = wait_for(
        "a FailedScheduling event",
        lambda: scheduler_events(setup, "aware-pinned", "FailedScheduling"),
    )
    assert failed[-1]["reportingController"] == LOAD_AWARE_SCHEDULER_NAME
    assert "1 node CPU usage over 80 percent" in failed[-1]["note"], failed[-1]["note"]
    assert setup.calls("filter") >= before + 2


def test_a_scheduler_without_the_extender_in_its_configuration_places_pods_as_before(
    setup: Setup,
) -> None:
    if not any(p.name == PLAIN_SCHEDULER for p in setup.cluster.procs):
        setup.cluster.start_scheduler(
            PLAIN_SCHEDULER, {"profiles": [{"schedulerName": PLAIN_SCHEDULER}]}
        )
    set_usage(setup, "node-0", 95.0)
    before = setup.calls("filter"), setup.calls("prioritize")
    create_pod(
        setup,
        "plain-pinned",
        scheduler=PLAIN_SCHEDULER,
        node_selector={"kubernetes.io/hostname": "node-0"},
    )
    assert bound(setup, "plain-pinned") == "node-0"
    scheduled = wait_for(
        "a Scheduled event", lambda: scheduler_events(setup, "plain-pinned", "Scheduled")
    )
    assert scheduled[-1]["reportingController"] == PLAIN_SCHEDULER
    assert (setup.calls("filter"), setup.calls("prioritize")) == before


def test_an_extender_that_is_down_never_blocks_scheduling(setup: Setup) -> None:
    for node in setup.cluster.nodes:
        set_usage(setup, node, 90.0)
    setup.server.stop()
    try:
        started = time.monotonic()
        create_pod(setup, "extender-down")
        # ignorable: true. The scheduler logs the refused call and places the pod without it.
        assert bound(setup, "extender-down") in setup.cluster.nodes
        assert time.monotonic() - started < 30
    finally:
        setup.server.start()
    # And back up, once its node cache has listed, it filters again (a pod of the load-aware
    # scheduler waits for a cool node); until then it steps aside.
    wait_for("the node cache to list", lambda: node_cache(setup)["ready"])
    with_load_aware_scheduler(setup)
    create_pod(setup, "extender-up", scheduler=LOAD_AWARE_SCHEDULER_NAME)
    wait_for(
        "a FailedScheduling event",
        lambda: scheduler_events(setup, "extender-up", "FailedScheduling"),
    )
