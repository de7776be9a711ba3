"""A deleted pod ends as a kubelet ends it: containers stopped, phase terminal, then gone.

On the real local control plane. Each test watches the pod's every update, so a pod that
vanished without first turning terminal (what the fake kubelet did before) fails it; and the
Job test shows why it matters: a Job with a pod failure policy replaces a pod, and releases its
``batch.kubernetes.io/job-tracking`` finalizer, only once the pod is terminal.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

import pytest
from kubernetes import client as k8s

from dev.localcluster import Cluster
from dev.localcluster.rest import ApiError
from tests.e2e import conftest as e2e

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
IMAGE = "registry.example.com/shop/web:1.4.2"
JOB_TRACKING = "batch.kubernetes.io/job-tracking"
# pkg/controller/job: DefaultJobPodFailureBackOff.
JOB_BACKOFF = 10.0


# Half the e2e suite's patience, polled fast enough to catch a pod's short-lived states.
wait_for = partial(e2e.wait_for, timeout=30.0, every=0.1)


@dataclass
class Seen:
    """One watch event, with when this test received it."""

    kind: str
    pod: JSON
    at: float


@dataclass
class PodWatch:
    """Every pod event of a namespace from the moment it starts, in order."""

    cluster: Cluster
    namespace: str
    events: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)

    def start(self) -> PodWatch:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        rv = str(self.cluster.rest.get(path)["metadata"]["resourceVersion"])
        self.thread = threading.Thread(target=self._run, args=(path, rv), daemon=True)
        self.thread.start()
        return self

    def _run(self, path: str, rv: str) -> None:
        while not self.stopped.is_set():
            try:
                for event in self.cluster.rest.watch(path, {"resourceVersion": rv}, 2):
                    obj = event.get("object", {})
                    rv = str(obj.get("metadata", {}).get("resourceVersion", rv))
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        with self.lock:
                            self.events.append(Seen(event["type"], obj, time.monotonic()))
                    if self.stopped.is_set():
                        return
            except ApiError:
                e2e.let_time_pass(0.2, "the watch failed: watch again after a pause")

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)

    def of(self, uid: str) -> list[Seen]:
        with self.lock:
            return [e for e in self.events if e.pod["metadata"]["uid"] == uid]

    def gone(self, uid: str) -> bool:
        return any(e.kind == "DELETED" for e in self.of(uid))

    def first(self, uid: str, what: Callable[[JSON], bool]) -> Seen | None:
        return next((e for e in self.of(uid) if what(e.pod)), None)


@pytest.fixture
def watch(cluster: Cluster, namespace: str) -> Iterator[PodWatch]:
    w = PodWatch(cluster, namespace).start()
    yield w
    w.stop()


@pytest.fixture
def fault(cluster: Cluster) -> Iterator[Callable[[str, str | None], None]]:
    touched: set[str] = set()

    def set_fault(node: str, mode: str | None) -> None:
        cluster.set_fault(node, mode)
        touched.add(node)

    yield set_fault
    for node in touched:
        cluster.set_fault(node, None)


def conditions(pod: JSON) -> dict[str, JSON]:
    return {c["type"]: c for c in pod.get("status", {}).get("conditions", [])}


def phase(pod: JSON) -> str:
    return str(pod.get("status", {}).get("phase", ""))


def container(pod: JSON) -> JSON:
    statuses: list[JSON] = pod.get("status", {}).get("containerStatuses") or [{}]
    return statuses[0]


def graceful_delete(cluster: Cluster, namespace: str, name: str) -> None:
    """What ``kubectl delete pod`` sends: no grace period (the pod's own, 30 s, applies)."""
    cluster.rest.request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/{name}",
        body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
    )


def assert_terminal_before_gone(events: list[Seen]) -> JSON:
    """The pod's last update before DELETED is terminal, and no update after the first
    terminal one goes back; returns that first terminal update."""
    assert events and events[-1].kind == "DELETED", [e.kind for e in events]
    updates = [e.pod for e in events[:-1]]
    terminal = [i for i, p in enumerate(updates) if phase(p) in ("Failed", "Succeeded")]
    assert terminal, [phase(p) for p in updates]
    assert all(phase(p) == phase(updates[terminal[0]]) for p in updates[terminal[0] :])
    first: JSON = updates[terminal[0]]
    assert first["metadata"].get("deletionTimestamp"), "terminal because it was deleted"
    return first


def one_ready_pod(cluster: Cluster, kube: k8s.ApiClient, namespace: str) -> JSON:
    """A Deployment of one replica, and its pod once Ready."""
    labels = {"app": "web"}
    k8s.AppsV1Api(kube).create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "app", "image": IMAGE}]},
                },
            },
        },
    )
    pod: JSON = wait_for(
        "a ready pod",
        lambda: next(
            (
                p
                for p in cluster.rest.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
                if conditions(p).get("Ready", {}).get("status") == "True"
            ),
            None,
        ),
    )
    return pod


def test_a_deleted_deployment_pod_is_stopped_and_fails_before_it_goes(
    cluster: Cluster, kube: k8s.ApiClient, namespace: str, watch: PodWatch
) -> None:
    pod = one_ready_pod(cluster, kube, namespace)
    uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
    running = container(pod)
    deleted_at = time.monotonic()
    graceful_delete(cluster, namespace, name)
    wait_for("the pod to be gone", lambda: watch.gone(uid), timeout=15)

    failed = assert_terminal_before_gone(watch.of(uid))
    assert phase(failed) == "Failed"
    # Killed by SIGTERM: exit 143, same container, started when it started, finished now.
    cs = container(failed)
    terminated = cs["state"]["terminated"]
    assert terminated["exitCode"] == 143
    assert terminated["reason"] == "Error"
    assert terminated["startedAt"] == running["state"]["running"]["startedAt"]
    assert terminated["finishedAt"] >= terminated["startedAt"]
    assert terminated["containerID"] == running["containerID"] == cs["containerID"]
    assert cs["ready"] is False and cs["started"] is False
    conds = conditions(failed)
    for ctype in ("Ready", "ContainersReady"):
        assert conds[ctype]["status"] == "False"
        assert conds[ctype]["reason"] == "PodFailed"
    assert conds["PodReadyToStartContainers"]["status"] == "False"
    assert conds["PodScheduled"]["status"] == "True"
    # Well under the pod's 30 s grace period: the simulated process dies of SIGTERM at once.
    gone = next(e.at for e in watch.of(uid) if e.kind == "DELETED")
    assert gone - deleted_at < 5.0, gone - deleted_at


def test_a_deleted_pod_stays_terminal_while_a_finalizer_holds_it(
    cluster: Cluster,
    namespace: str,
    watch: PodWatch,
    fault: Callable[[str, str | None], None],
) -> None:
    fault("node-2", "crashloop")
    pod = cluster.rest.post(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "held", "finalizers": ["example.com/hold"]},
            "spec": {"nodeName": "node-2", "containers": [{"name": "app", "image": IMAGE}]},
        },
    )
    uid = pod["metadata"]["uid"]
    path = f"/api/v1/namespaces/{namespace}/pods/held"
    backing_off = wait_for(
        "a crash loop back-off",
        lambda: (
            (p := cluster.rest.get(path))
            and container(p).get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"
            and p
        ),
    )
    last_crash = container(backing_off)["lastState"]["terminated"]
    graceful_delete(cluster, namespace, "held")

    held = wait_for(
        "the pod to be terminal",
        lambda: (p := cluster.rest.get(path)) and phase(p) == "Failed" and p,
        timeout=15,
    )
    # Not restarted once deleted: its last crash is its final state.
    cs = container(held)
    assert cs["state"]["terminated"]["finishedAt"] == last_crash["finishedAt"]
    assert cs["state"]["terminated"]["exitCode"] == 1
    assert cs["restartCount"] == container(backing_off)["restartCount"]
    # The kubelet's delete (grace period 0) was made; the finalizer holds the pod.
    wait_for(
        "the kubelet's final delete",
        lambda: cluster.rest.get(path)["metadata"].get("deletionGracePeriodSeconds") == 0,
    )
    # The finalizer holds it, Failed, however long.
    e2e.holds(
        "held by the finalizer, Failed",
        lambda: (
            (still := cluster.rest.get(path))["metadata"]["uid"] == uid and phase(still) == "Failed"
        ),
        1.0,
    )

    cluster.rest.patch(path, {"metadata": {"finalizers": None}})
    wait_for("the pod to be gone", lambda: watch.gone(uid), timeout=15)
    assert_terminal_before_gone(watch.of(uid))


def test_an_evicted_job_pod_is_failed_released_and_replaced_without_counting(
    cluster: Cluster,
    kube: k8s.ApiClient,
    namespace: str,
    watch: PodWatch,
    fault: Callable[[str, str | None], None],
) -> None:
    batch = k8s.BatchV1Api(kube)
    fault("node-3", "imagepull")
    batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "report"},
            "spec": {
                "backoffLimit": 0,
                "podFailurePolicy": {
                    "rules": [
                        {
                            "action": "Ignore",
                            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                        }
                    ]
                },
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": {"kubernetes.io/hostname": "node-3"},
                        "containers": [{"name": "app", "image": IMAGE}],
                    }
                },
            },
        },
    )
    pods_path = f"/api/v1/namespaces/{namespace}/pods"

    def job_pods() -> list[JSON]:
        items: list[JSON] = cluster.rest.get(pods_path, {"labelSelector": "job-name=report"})[
            "items"
        ]
        return items

    pod = wait_for(
        "the Job's pod to fail pulling its image",
        lambda: next(
            (
                p
                for p in job_pods()
                if container(p).get("state", {}).get("waiting", {}).get("reason")
                == "ImagePullBackOff"
            ),
            None,
        ),
    )
    uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
    assert JOB_TRACKING in pod["metadata"]["finalizers"]
    ready_since = conditions(pod)["Ready"]["lastTransitionTime"]
    # The node heals: the replacement, bound to it like the first pod, runs and completes.
    fault("node-3", None)

    evicted_at, evicted_wall = time.monotonic(), time.time()
    cluster.rest.post(
        f"{pods_path}/{name}/eviction",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}},
    )
    wait_for("the evicted pod to be gone", lambda: watch.gone(uid), timeout=30)
    failed = assert_terminal_before_gone(watch.of(uid))
    assert phase(failed) == "Failed"
    conds = conditions(failed)
    assert conds["DisruptionTarget"]["status"] == "True"
    assert conds["DisruptionTarget"]["reason"] == "EvictionByEvictionAPI"
    # Its container never ran: unknown, exit 137, no times; Ready stays False since the pull
    # failed (the Job controller's back-off reads that time).
    terminated = container(failed)["state"]["terminated"]
    assert terminated["reason"] == "ContainerStatusUnknown" and terminated["exitCode"] == 137
    assert not terminated.get("finishedAt")
    assert conds["Ready"]["status"] == "False"
    assert conds["Ready"]["lastTransitionTime"] == ready_since
    # Terminal while the Job controller's finalizer still held it: gone means released (the
    # API server removes it in the very update that drops the finalizer, its grace period
    # being 0 since the kubelet's delete; the DELETED event shows the object before that).
    assert JOB_TRACKING in failed["metadata"]["finalizers"]

    def replacement() -> Seen | None:
        with watch.lock:
            return next(
                (
                    e
                    for e in watch.events
                    if e.kind == "ADDED"
                    and e.pod["metadata"]["uid"] != uid
                    and e.pod["metadata"].get("labels", {}).get("job-name") == "report"
                ),
                None,
            )

    added = wait_for("a replacement pod", replacement, timeout=60)
    seconds = added.at - evicted_at
    terminal = watch.first(uid, lambda p: phase(p) == "Failed")
    assert terminal is not None and terminal.at - evicted_at < 3.0, "stopped at once"
    # The Job controller's pod-failure back-off (10 s after a first failure, an ignored one
    # too) runs from the failed pod's finish time: for a container that never ran, its
    # Ready=False transition, here when the pull first failed. Whatever is left of it delays
    # the replacement; past it, only the kubelet's stop and the Job controller's batching.
    failed_since = datetime.strptime(ready_since, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    backoff_left = max(0.0, failed_since + JOB_BACKOFF - evicted_wall)
    print(
        f"\nterminal {terminal.at - evicted_at:.2f} s, replacement {seconds:.2f} s after the "
        f"eviction ({backoff_left:.1f} s of the Job's back-off were left)"
    )
    assert seconds < backoff_left + 3.0, (seconds, backoff_left)

    def finished() -> Any:
        job = batch.read_namespaced_job("report", namespace)
        return job.status.succeeded == 1 and job.status

    status = wait_for("the Job to complete", finished, timeout=60)
    assert not status.failed, status  # the eviction was not counted against backoffLimit 0
