"""rebalance-nodes on the real control plane: the real Eviction API and PodDisruptionBudgets,
the real ReplicaSet controller recreating evicted pods and the real scheduler placing them.

The function runs in-process exactly as functions-framework serves it (its own module, its own
settings from the environment) with a real API client; each evaluation is one PingSource event
posted to it. Usage records are written onto the Nodes here, as annotate-usage writes them
(``UsageRecord(...).to_json()``), so neither Prometheus nor annotate-usage is needed.

The scheduler in these tests knows nothing of usage (no extender, no load label), so what keeps
a replacement off the node it was evicted from is the node's cordon, set once the workload's
pods are in place: the tests assert where the real scheduler put the replacements, not that it
chose the cooler node for its usage.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import flask.testing
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dev.localcluster import Cluster, production
from shared.api.keys import (
    EVENT_POD_REBALANCED,
    HOT_STREAK_ANNOTATION,
    MAINTENANCE_LABEL,
    PING_EVENT_TYPE,
    REASON_REBALANCED,
    REBALANCE_KEY,
    USAGE_ANNOTATION,
)
from shared.api.usage import Reading, UsageRecord
from shared.platform.kube import Kube
from tests import builders
from tests.e2e.conftest import earlier_tests_gone, preferring, wait_for
from tests.handlers.conftest import ON_DEMAND_TICKS, ClientFactory, cloudevent, reply_of

pytestmark = pytest.mark.e2e

PDB_PATH = "/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
# 1 CPU of the local nodes' 7800m allocatable: 12.8 % each.
POD_CPU = "1"
POD_SHARE = 100 / 7.8


def write_usage(
    cluster: Cluster, node: str, cpu: float, memory: float = 30.0, *, at: datetime | None = None
) -> None:
    """The usage record annotate-usage would write, sampled ``at`` (now by default)."""
    record = UsageRecord(
        sampled_at=at or datetime.now(UTC),
        source="prometheus",
        cpu=Reading(now=cpu, avg5m=cpu, max1h=cpu),
        memory=Reading(now=memory, avg5m=memory, max1h=memory),
    )
    cluster.rest.patch(
        f"/api/v1/nodes/{node}", {"metadata": {"annotations": {USAGE_ANNOTATION: record.to_json()}}}
    )


def samples(count: int) -> list[datetime]:
    """``count`` sample times, a second apart and ending now: a record's sampledAt has
    second precision, and a hot streak counts only a record sampled after the last it
    counted, however many evaluations read it."""
    now = datetime.now(UTC)
    return [now - timedelta(seconds=count - 1 - i) for i in range(count)]


def cordon(cluster: Cluster, node: str, **labels: str) -> None:
    cluster.rest.patch(
        f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}, "metadata": {"labels": labels}}
    )


def streak_on(cluster: Cluster, node: str) -> str | None:
    meta = cluster.rest.get(f"/api/v1/nodes/{node}")["metadata"]
    value = (meta.get("annotations") or {}).get(HOT_STREAK_ANNOTATION)
    return str(value) if value is not None else None


def ping(client: flask.testing.FlaskClient) -> Any:
    headers, body = cloudevent(PING_EVENT_TYPE, {"reason": "rebalance"}, source="/pingsource")
    response = client.post("/", headers=headers, data=body)
    assert response.status_code in (200, 202), response.get_data(as_text=True)
    return response


def evictions(client: flask.testing.FlaskClient) -> dict[tuple[str, str], float]:
    """rescheduler_pod_evictions_total by (reason, result), from the function's /metrics."""
    text = client.get("/metrics").get_data(as_text=True)
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "rescheduler_pod_evictions":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[(sample.labels["reason"], sample.labels["result"])] = sample.value
    return out


def since(
    before: dict[tuple[str, str], float], client: flask.testing.FlaskClient
) -> dict[tuple[str, str], float]:
    """What the counter gained since ``before`` (the process's counters outlive a test)."""
    return {k: v - before.get(k, 0) for k, v in evictions(client).items() if v - before.get(k, 0)}


def create_deployment(
    api: Kube,
    namespace: str,
    name: str,
    node: str,
    replicas: int,
    annotations: dict[str, str] | None = None,
) -> None:
    """The Deployment ``name``: ``replicas`` pods preferring ``node``, each requesting
    ``POD_CPU``, which is what rebalance-nodes weighs."""
    requesting = builders.container(requests={"cpu": POD_CPU, "memory": "256Mi"})
    template = builders.template({"app": name}, affinity=preferring(node), containers=[requesting])
    body = builders.deployment(
        name, replicas=replicas, annotations=annotations or {}, template=template
    )
    api.create("Deployment", namespace, body)


def running(api: Kube, namespace: str, app: str) -> dict[str, str]:
    """Running, not terminating pods of ``app``: uid -> node."""
    return {
        p["metadata"]["uid"]: p["spec"].get("nodeName", "")
        for p in api.list_all("Pod", namespace, label_selector=f"app={app}")
        if p.get("status", {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    }


def settle(api: Kube, namespace: str, app: str, replicas: int, node: str) -> dict[str, str]:
    """Wait for every replica to run on ``node`` (their preferred node)."""
    return wait_for(
        f"{replicas} pods of {app} running on {node}",
        lambda: (
            (pods := running(api, namespace, app))
            and len(pods) == replicas
            and set(pods.values()) == {node}
            and pods
        ),
    )


def rebalanced_events(api: Kube, namespace: str) -> list[dict[str, Any]]:
    return [e for e in api.list_all("Event", namespace) if e["reason"] == REASON_REBALANCED]


@pytest.fixture
def api(cluster: Cluster) -> Kube:
    return Kube(cluster.api_client())


@pytest.fixture
def streaks_cleared(cluster: Cluster) -> Iterator[None]:
    """The hot streaks this function writes are taken off every node afterwards (the shared
    fixture clears usage, labels and cordons)."""
    yield
    for node in cluster.nodes:
        cluster.rest.patch(
            f"/api/v1/nodes/{node}", {"metadata": {"annotations": {HOT_STREAK_ANNOTATION: None}}}
        )


@pytest.fixture
def rebalance(
    cluster: Cluster, namespace: str, function_client: ClientFactory, streaks_cleared: None
) -> ClientFactory:
    # These pods request a CPU each: an earlier test's pods still terminating on the preferred
    # node would outweigh the preference (CI saw a replica placed on another node).
    earlier_tests_gone(cluster, namespace)

    def make(**env: str) -> flask.testing.FlaskClient:
        env = {**ON_DEMAND_TICKS, **env}
        return function_client("rebalance-nodes", KUBECONFIG=str(cluster.kubeconfig), **env)

    return make


def test_a_node_hot_for_three_evaluations_sheds_pods_that_land_elsewhere_and_then_it_stops(
    cluster: Cluster, api: Kube, namespace: str, rebalance: ClientFactory
) -> None:
    hot, *others = cluster.nodes
    # Opted in on the Deployment: its controller copies the annotation onto the ReplicaSet.
    create_deployment(api, namespace, "web", hot, 4, {REBALANCE_KEY: "true"})
    before = settle(api, namespace, "web", 4, hot)
    cordon(cluster, hot)
    client = rebalance(KN_RESCHEDULER_REBALANCE_MAX_PER_WORKLOAD="2")
    # The cordoned node is no part of the mean: 30 %, so the bound is 50 (the mean plus 20),
    # 40 points to shed; the limit per workload lets two pods of 12.8 % go.
    first, second, third = samples(3)
    for node in others:
        write_usage(cluster, node, 30.0, at=first)
    counted = evictions(client)

    for expected, at in ((1, first), (2, second)):
        write_usage(cluster, hot, 90.0, at=at)
        assert ping(client).status_code == 202
        assert f'"hot":{expected}' in (streak_on(cluster, hot) or "")
        # The same sample read again counts for nothing.
        assert ping(client).status_code == 202
        assert f'"hot":{expected}' in (streak_on(cluster, hot) or "")
    assert running(api, namespace, "web") == before

    write_usage(cluster, hot, 90.0, at=third)
    response = ping(client)
    attributes, data = reply_of(response)
    assert attributes["type"] == EVENT_POD_REBALANCED
    assert [e["node"] for e in data["evictions"]] == [hot, hot]
    assert {e["reason"] for e in data["evictions"]} == {"cpu-over-threshold"}
    assert data["evictions"][0]["nodeUsage"] == {"cpu": 90.0, "memory": 30.0}
    assert {e["fitsOn"] for e in data["evictions"]} <= set(others)
    gone = {e["pod"] for e in data["evictions"]}
    assert len(gone) == 2
    delta = since(counted, client)
    assert delta.get(("cpu-over-threshold", "evicted")) == 2
    # Acting starts the node's count afresh, the sample acted on remembered.
    assert '"hot":0' in (streak_on(cluster, hot) or "")

    # The ReplicaSet controller replaces them; the scheduler puts them on the other nodes.
    after = wait_for(
        "two replacements running off the hot node",
        lambda: (
            (pods := running(api, namespace, "web"))
            and len(pods) == 4
            and sum(1 for n in pods.values() if n != hot) == 2
            and pods
        ),
    )
    assert len(set(after) & set(before)) == 2
    # The Event on each pod and on the ReplicaSet says which usage justified it.
    said = rebalanced_events(api, namespace)
    on_pods = [e for e in said if e["involvedObject"]["kind"] == "Pod"]
    on_rs = [e for e in said if e["involvedObject"]["kind"] == "ReplicaSet"]
    assert {e["involvedObject"]["name"] for e in on_pods} == gone
    assert len(on_rs) == 2
    assert all("CPU 90.0 %" in e["message"] for e in said)

    # The cordon only steered the replacements; lifted, the node is back in the mean. The next
    # samples read it under its bound: evaluations evict nothing any more, however many (no
    # ping-pong). (Still cordoned, it would be judged against the mean of the others alone,
    # 38.5 %: 64.4 % is above that by more than the gap.)
    cluster.rest.patch(f"/api/v1/nodes/{hot}", {"spec": {"unschedulable": None}})
    write_usage(cluster, hot, 90.0 - 2 * POD_SHARE)
    for node in others:
        moved_in = sum(1 for n in after.values() if n == node)
        write_usage(cluster, node, 30.0 + moved_in * POD_SHARE)
    settled = evictions(client)
    for _ in range(6):
        assert ping(client).status_code == 202
    assert evictions(client) == settled
    assert streak_on(cluster, hot) is None  # cool: the annotation goes
    assert running(api, namespace, "web") == after


def test_a_workload_not_opted_in_is_never_touched(
    cluster: Cluster, api: Kube, namespace: str, rebalance: ClientFactory
) -> None:
    hot, *others = cluster.nodes
    create_deployment(api, namespace, "web", hot, 2, {REBALANCE_KEY: "true"})
    create_deployment(api, namespace, "legacy", hot, 2)
    settle(api, namespace, "web", 2, hot)
    legacy = settle(api, namespace, "legacy", 2, hot)
    cordon(cluster, hot)
    client = rebalance()
    for node in others:
        write_usage(cluster, node, 30.0)

    replies = []
    for at in samples(6):
        write_usage(cluster, hot, 95.0, at=at)
        replies.append(ping(client))

    # The opted-in workload lost a pod (the positive control): the node was acted on.
    assert any(r.status_code == 200 for r in replies)
    wait_for(
        "a web pod off the hot node", lambda: set(running(api, namespace, "web").values()) - {hot}
    )
    for response in replies:
        if response.status_code == 200:
            _, data = reply_of(response)
            assert all(e["workload"].startswith("ReplicaSet") for e in data["evictions"])
            assert not any("legacy" in e["pod"] for e in data["evictions"])
    assert running(api, namespace, "legacy") == legacy


def test_a_disruption_budget_holds_a_maintenance_drain_until_it_allows_it(
    cluster: Cluster, api: Kube, namespace: str, rebalance: ClientFactory
) -> None:
    draining, *others = cluster.nodes[1:] + cluster.nodes[:1]
    # Opted in through the namespace's label; the Deployment says nothing.
    cluster.rest.patch(
        f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {REBALANCE_KEY: "true"}}}
    )
    create_deployment(api, namespace, "db", draining, 2)
    before = settle(api, namespace, "db", 2, draining)
    api.request(
        "POST",
        PDB_PATH.format(namespace=namespace),
        body={
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "db"},
            "spec": {"selector": {"matchLabels": {"app": "db"}}, "minAvailable": 2},
        },
        write=True,
    )
    pdb_path = PDB_PATH.format(namespace=namespace) + "/db"
    wait_for(
        "the budget observed",
        lambda: api.request("GET", pdb_path).get("status", {}).get("currentHealthy") == 2,
    )
    cordon(cluster, draining, **{MAINTENANCE_LABEL: "true"})
    # The targets need fresh usage; the node in maintenance needs none.
    for node in others:
        write_usage(cluster, node, 20.0)
    # The share is the budget's business here.
    client = rebalance(KN_RESCHEDULER_REBALANCE_MIN_AVAILABLE="0")
    counted = evictions(client)

    for _ in range(2):
        # 429 from the budget: "not now", answered 202, counted, the pods stay.
        assert ping(client).status_code == 202
    delta = since(counted, client)
    assert delta.get(("maintenance", "refused")) == 2
    assert ("maintenance", "evicted") not in delta
    assert running(api, namespace, "db") == before
    status = client.get("/status").get_json()
    assert status["last_run"] == {"refused": 1}
    assert "db" in status["last_evictions"][0]["detail"]

    api.request(
        "PATCH",
        pdb_path,
        body={"spec": {"minAvailable": 0}},
        content_type="application/merge-patch+json",
        write=True,
    )
    wait_for(
        "the budget to allow disruptions",
        lambda: api.request("GET", pdb_path).get("status", {}).get("disruptionsAllowed", 0) >= 1,
    )

    def drained() -> bool:
        pods = running(api, namespace, "db")
        if len(pods) == 2 and draining not in pods.values():
            return True
        ping(client)
        return False

    # One pod a run (the limit per workload), gradually.
    wait_for("the node in maintenance drained", drained, timeout=60, every=1.0)
    delta = since(counted, client)
    assert delta.get(("maintenance", "evicted")) == 2


def test_a_dry_run_decides_and_evicts_nothing(
    cluster: Cluster, api: Kube, namespace: str, rebalance: ClientFactory
) -> None:
    hot, *others = cluster.nodes[2:] + cluster.nodes[:2]
    create_deployment(api, namespace, "web", hot, 2, {REBALANCE_KEY: "true"})
    before = settle(api, namespace, "web", 2, hot)
    cordon(cluster, hot)
    client = rebalance(KN_RESCHEDULER_DRY_RUN="true")
    for node in others:
        write_usage(cluster, node, 30.0)
    counted = evictions(client)
    *three, fourth = samples(4)

    responses = []
    for at in three:
        write_usage(cluster, hot, 95.0, at=at)
        responses.append(ping(client))

    assert [r.status_code for r in responses] == [202, 202, 200]
    _, data = reply_of(responses[-1])
    assert data["dryRun"] is True
    assert [e["result"] for e in data["evictions"]] == ["dry-run"]
    delta = since(counted, client)
    assert delta == {("cpu-over-threshold", "dry-run"): 1}
    # The API server kept nothing: no streak on the node, no Event, every pod where it was.
    assert streak_on(cluster, hot) is None
    assert rebalanced_events(api, namespace) == []
    assert running(api, namespace, "web") == before
    # The process remembered the streaks itself, and started afresh after "acting": the
    # next sample is the first of a new count.
    write_usage(cluster, hot, 95.0, at=fourth)
    assert ping(client).status_code == 202
    assert client.get("/status").get_json()["hot_streaks"] == {hot: 1}


@pytest.fixture
def local_volume(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A StorageClass for static local volumes (no provisioner, bound when the first pod is
    scheduled), as https://kubernetes.io/docs/concepts/storage/volumes/#local sets it up;
    the PersistentVolumes the test creates are deleted with it."""
    name = f"local-{namespace}"[:63]
    cluster.rest.post(
        "/apis/storage.k8s.io/v1/storageclasses",
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
        },
    )
    try:
        yield name
    finally:
        for pv in cluster.rest.get("/api/v1/persistentvolumes").get("items", []):
            if pv["spec"].get("storageClassName") == name:
                cluster.rest.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
        cluster.rest.delete(f"/apis/storage.k8s.io/v1/storageclasses/{name}")


def test_a_statefulset_pod_on_a_local_volume_stays_on_its_hot_node(
    cluster: Cluster, api: Kube, namespace: str, rebalance: ClientFactory, local_volume: str
) -> None:
    """The issue's reproduction: evicted, the pod could only come back to its disk's node, and
    was evicted again and again. A Deployment's pod on the same node is the positive control:
    the node is acted on, the pod on the local volume is not."""
    hot, *others = cluster.nodes
    # The local PV, as the docs show it: its path on the node, and a node affinity naming it.
    cluster.rest.post(
        "/api/v1/persistentvolumes",
        production.local_volume(
            f"{local_volume}-0"[:63], hot, local_volume, "/mnt/disks/ssd1", size="1Gi"
        ),
    )
    api.create(
        "StatefulSet",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "db", "annotations": {REBALANCE_KEY: "true"}},
            "spec": {
                "replicas": 1,
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": {
                    "metadata": {"labels": {"app": "db"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "db",
                                "image": "registry.example.com/shop/db:16.4",
                                "resources": {"requests": {"cpu": POD_CPU, "memory": "256Mi"}},
                                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/db"}],
                            }
                        ],
                        "terminationGracePeriodSeconds": 0,
                    },
                },
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "data"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "storageClassName": local_volume,
                            "resources": {"requests": {"storage": "1Gi"}},
                        },
                    }
                ],
            },
        },
    )
    create_deployment(api, namespace, "web", hot, 2, {REBALANCE_KEY: "true"})
    (db,) = settle(api, namespace, "db", 1, hot)
    settle(api, namespace, "web", 2, hot)
    # Not cordoned, placed by the stock scheduler, a single replica: the settings let such
    # pods go, so that only the volume can keep db-0 where it is.
    client = rebalance(
        KN_RESCHEDULER_REBALANCE_ANY_PLACEMENT="true", KN_RESCHEDULER_REBALANCE_MIN_AVAILABLE="0"
    )
    for node in others:
        write_usage(cluster, node, 30.0)
    counted = evictions(client)

    evicted: list[str] = []
    for at in samples(6):
        write_usage(cluster, hot, 95.0, at=at)
        response = ping(client)
        if response.status_code == 200:
            _, data = reply_of(response)
            evicted += [e["pod"] for e in data["evictions"]]

    # Acted on at the third and sixth samples, a web pod each time (the limit per workload;
    # the second time only if the first replacement is ready by then); never db-0.
    assert evicted and all(name.startswith("web-") for name in evicted)
    assert since(counted, client) == {("cpu-over-threshold", "evicted"): len(evicted)}
    assert running(api, namespace, "db") == {db: hot}
