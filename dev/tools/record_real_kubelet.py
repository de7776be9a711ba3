"""Record what real kubelets write for the failures the classifier judges, as JSON fixtures.

Starts a local cluster with two real nodes (kubelet + containerd each: ``real-0``, ``real-1``),
provokes one failure per scenario (a crash loop, OOM kills, a refused or hanging image pull,
broken sandboxes, a missing ConfigMap, an eviction under disk pressure, a stopped runtime),
waits until the kubelet has written the status of interest and writes one file per scenario::

    {"scenario": ..., "recorded": {"kubelet", "containerd", "date", "how"},
     "pod": <the Pod as the API server returns it>, "events": [<the pod's Events>],
     "node": <the Node, for node-level scenarios>}

Nothing is scrubbed; only ``metadata.managedFields`` is dropped, to keep the files small.
Pods on healthy ``real-1`` are started first and captured in the background while the faults
of ``real-0`` are provoked one at a time, so a run takes a few minutes (the crash loop's real
back-off sets the pace).

    python -m dev.tools.record_real_kubelet --out tests/fixtures/real-kubelet
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

from dev.localcluster.cluster import Cluster
from dev.localcluster.nodeimages import BUSYBOX_IMAGE
from dev.localcluster.rest import ApiError

log = logging.getLogger("record_real_kubelet")

JSON = dict[str, Any]
T = TypeVar("T")

NAMESPACE: Final = "default"
FAULTY: Final = "real-0"
HEALTHY: Final = "real-1"
POLL: Final = 0.5
# The kubelet's crash-loop back-off (10s, 20s, 40s) puts restart 3 about 70 s after the start.
CRASHLOOP_RESTARTS: Final = 3
# How long after the node turned NotReady the pod may wait for the node lifecycle controller to
# mark it not Ready.
MARK_NOT_READY_WAIT: Final = 40.0
DEPLOYMENT: Final = "crashloop-deployment"
# What the deployment scenario's pods carry, to find them.
DEPLOYMENT_LABEL: Final = "record-real-kubelet/deployment"


class RecordError(RuntimeError):
    """A scenario's status did not appear in time (the message says which)."""


Check = Callable[[JSON, list[JSON]], bool]


@dataclass
class Capture:
    """A pod (by name, or the first pod matching a label selector) to write once ``ready``."""

    scenario: str
    how: str
    ready: Check
    pod: str = ""
    selector: str = ""
    node: str | None = None


# -- pod specs ------------------------------------------------------------------------------------


def pod_spec(
    name: str,
    node: str,
    command: str,
    *,
    restart: str = "Always",
    memory_limit: str | None = None,
    volumes: list[JSON] | None = None,
    mounts: list[JSON] | None = None,
) -> JSON:
    container: JSON = {
        "name": "app",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Always",
        "command": ["sh", "-c", command],
    }
    if memory_limit is not None:
        container["resources"] = {"limits": {"memory": memory_limit, "cpu": "100m"}}
    if mounts:
        container["volumeMounts"] = mounts
    spec: JSON = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 1,
        "containers": [container],
    }
    if volumes:
        spec["volumes"] = volumes
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": name}},
        "spec": spec,
    }


def deployment_spec(name: str, node: str) -> JSON:
    template = pod_spec(name, node, "exit 1")
    template["metadata"] = {"labels": {DEPLOYMENT_LABEL: name}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {DEPLOYMENT_LABEL: name}},
            "template": template,
        },
    }


# -- what to wait for -----------------------------------------------------------------------------


def statuses(pod: JSON) -> list[JSON]:
    status = pod.get("status", {})
    return [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]


def waiting_reason(pod: JSON) -> str:
    for s in statuses(pod):
        reason = s.get("state", {}).get("waiting", {}).get("reason")
        if reason:
            return str(reason)
    return ""


def crash_looping(pod: JSON, _events: list[JSON]) -> bool:
    return any(
        s.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"
        and s.get("restartCount", 0) >= CRASHLOOP_RESTARTS
        for s in statuses(pod)
    )


def oom_killed_waiting(pod: JSON, _events: list[JSON]) -> bool:
    """OOMKilled, and not running again: terminated so, or waiting after such a run."""
    for s in statuses(pod):
        state = s.get("state", {})
        if state.get("terminated", {}).get("reason") == "OOMKilled":
            return True
        last = s.get("lastState", {}).get("terminated", {})
        if "waiting" in state and last.get("reason") == "OOMKilled":
            return True
    return False


def oom_crash_looping(pod: JSON, events: list[JSON]) -> bool:
    return crash_looping(pod, events) and any(
        s.get("lastState", {}).get("terminated", {}).get("reason") == "OOMKilled"
        for s in statuses(pod)
    )


def finished(pod: JSON, _events: list[JSON]) -> bool:
    return pod.get("status", {}).get("phase") in ("Succeeded", "Failed") and all(
        "terminated" in s.get("state", {}) for s in statuses(pod)
    )


def waiting_with(reason: str) -> Check:
    return lambda pod, _events: waiting_reason(pod) == reason


def event_with(reason: str) -> Check:
    return lambda _pod, events: any(e.get("reason") == reason for e in events)


def running(pod: JSON, _events: list[JSON]) -> bool:
    return pod.get("status", {}).get("phase") == "Running" and all(
        "running" in s.get("state", {}) for s in statuses(pod)
    )


def pod_not_ready(pod: JSON, _events: list[JSON]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") != "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def evicted(pod: JSON, _events: list[JSON]) -> bool:
    return bool(pod.get("status", {}).get("reason") == "Evicted")


# -- the recorder ---------------------------------------------------------------------------------


def strip(obj: JSON) -> JSON:
    """``obj`` without metadata.managedFields (a copy)."""
    out: JSON = json.loads(json.dumps(obj))
    out.get("metadata", {}).pop("managedFields", None)
    return out


def containerd_version() -> str:
    done = subprocess.run(["containerd", "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or done.stderr.strip()


def kubelet_version(cluster: Cluster) -> str:
    done = subprocess.run(
        [str(cluster.bins_dir / "kubelet"), "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    # "Kubernetes v1.36.3"
    return done.stdout.strip().split()[-1] if done.stdout.strip() else "unknown"


class Recorder:
    def __init__(self, cluster: Cluster, out: Path) -> None:
        self.cluster = cluster
        self.rest = cluster.rest
        self.out = out
        self.versions = {"kubelet": kubelet_version(cluster), "containerd": containerd_version()}
        self.background: list[Capture] = []
        self.written: list[str] = []

    # API helpers ---------------------------------------------------------------------------

    def create(self, obj: JSON) -> JSON:
        group = "/apis/apps/v1" if obj["kind"] == "Deployment" else "/api/v1"
        plural = obj["kind"].lower() + "s"
        return self.rest.post(f"{group}/namespaces/{NAMESPACE}/{plural}", obj)

    def find_pod(self, capture: Capture) -> JSON | None:
        try:
            if capture.pod:
                return self.rest.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{capture.pod}")
            items = self.rest.get(
                f"/api/v1/namespaces/{NAMESPACE}/pods", params={"labelSelector": capture.selector}
            ).get("items", [])
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        items = [p for p in items if not p["metadata"].get("deletionTimestamp")]
        if not items:
            return None
        # A list's items lack kind and apiVersion: the pod itself, as a GET returns it.
        return self.find_pod(
            Capture(capture.scenario, "", capture.ready, items[0]["metadata"]["name"])
        )

    def events_of(self, pod: JSON) -> list[JSON]:
        items: list[JSON] = self.rest.get(
            f"/api/v1/namespaces/{NAMESPACE}/events",
            params={"fieldSelector": f"involvedObject.uid={pod['metadata']['uid']}"},
        ).get("items", [])
        return sorted(
            items,
            key=lambda e: (
                e.get("firstTimestamp") or e.get("eventTime") or "",
                e["metadata"].get("creationTimestamp") or "",
            ),
        )

    def delete_pod(self, name: str) -> None:
        """Force-delete: a pod whose sandbox never came up may never finish a graceful delete."""
        try:
            self.rest.request(
                "DELETE",
                f"/api/v1/namespaces/{NAMESPACE}/pods/{name}",
                body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
            )
        except ApiError as e:
            if e.status != 404:
                raise

    def node_ready(self, node: str) -> str:
        conditions = self.rest.get(f"/api/v1/nodes/{node}").get("status", {}).get("conditions", [])
        for c in conditions:
            if c.get("type") == "Ready":
                return str(c.get("status"))
        return "Unknown"

    # waiting and writing -------------------------------------------------------------------

    def poll(
        self, what: str, check: Callable[[], T | None], timeout: float, every: float = POLL
    ) -> T:
        """``check()`` until it returns something; the background captures are checked too."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_background()
            found = check()
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise RecordError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(every)

    def try_capture(self, capture: Capture) -> bool:
        pod = self.find_pod(capture)
        if pod is None:
            return False
        events = self.events_of(pod)
        if not capture.ready(pod, events):
            return False
        self.write(capture, pod, events)
        return True

    def capture(self, capture: Capture, timeout: float, every: float = POLL) -> None:
        self.poll(
            capture.scenario,
            lambda: True if self.try_capture(capture) else None,
            timeout,
            every,
        )

    def check_background(self) -> None:
        for capture in list(self.background):
            pod = self.find_pod(capture)
            if pod is None:
                continue
            events = self.events_of(pod)
            if not capture.ready(pod, events):
                continue
            self.write(capture, pod, events)
            self.background.remove(capture)
            name = pod["metadata"]["name"]
            if not any(c.pod == name for c in self.background):
                self.delete_pod(name)

    def write(self, capture: Capture, pod: JSON, events: list[JSON]) -> None:
        record: JSON = {
            "scenario": capture.scenario,
            "recorded": {
                **self.versions,
                "date": datetime.now(UTC).date().isoformat(),
                "how": capture.how,
            },
            "pod": strip(pod),
            "events": [strip(e) for e in events],
        }
        if capture.node is not None:
            record["node"] = strip(self.rest.get(f"/api/v1/nodes/{capture.node}"))
        path = self.out / f"{capture.scenario}.json"
        path.write_text(json.dumps(record, indent=1) + "\n")
        self.written.append(capture.scenario)
        print(f"  wrote {path} ({summary(pod, events)})", flush=True)

    # scenarios -----------------------------------------------------------------------------

    def start_healthy_node_pods(self, with_deployment: bool) -> None:
        """Pods on the healthy node, captured whenever their status appears."""
        memory = "16Mi"
        alloc = "dd if=/dev/zero of=/dev/null bs=64M count=1"
        specs: list[tuple[JSON | None, Capture]] = [
            (
                pod_spec("crashloop", HEALTHY, "exit 1"),
                Capture(
                    "crashloop",
                    f"A container running `sh -c 'exit 1'` with restartPolicy Always on a healthy "
                    f"node, captured once it waited in CrashLoopBackOff with restartCount >= "
                    f"{CRASHLOOP_RESTARTS}.",
                    crash_looping,
                    pod="crashloop",
                ),
            ),
            (
                pod_spec("oom-killed", HEALTHY, alloc, memory_limit=memory),
                Capture(
                    "oom-killed",
                    f"A container limited to {memory} of memory running `sh -c '{alloc}'` (a "
                    "64 MiB buffer) with restartPolicy Always, captured the first time it was "
                    "not running after an OOM kill (terminated OOMKilled, or waiting with "
                    "lastState OOMKilled).",
                    oom_killed_waiting,
                    pod="oom-killed",
                ),
            ),
            (
                None,
                Capture(
                    "oom-killed-crashloop",
                    f"The same pod as oom-killed (limit {memory}, `sh -c '{alloc}'`, "
                    "restartPolicy Always), captured later, once it waited in CrashLoopBackOff "
                    f"with restartCount >= {CRASHLOOP_RESTARTS} and lastState OOMKilled.",
                    oom_crash_looping,
                    pod="oom-killed",
                ),
            ),
            (
                pod_spec(
                    "oom-killed-child-never",
                    HEALTHY,
                    f"{alloc}; exit 0",
                    restart="Never",
                    memory_limit=memory,
                ),
                Capture(
                    "oom-killed-child-never",
                    f"A container limited to {memory} running `sh -c '{alloc}; exit 0'` with "
                    "restartPolicy Never (a child is OOM-killed, the shell exits 0), captured "
                    "once the pod finished.",
                    finished,
                    pod="oom-killed-child-never",
                ),
            ),
            (
                pod_spec(
                    "missing-configmap-volume",
                    HEALTHY,
                    "sleep 3600",
                    volumes=[{"name": "config", "configMap": {"name": "does-not-exist"}}],
                    mounts=[{"name": "config", "mountPath": "/etc/app"}],
                ),
                Capture(
                    "missing-configmap-volume",
                    "A pod on a healthy node mounting a ConfigMap that does not exist, captured "
                    "once a FailedMount event existed.",
                    event_with("FailedMount"),
                    pod="missing-configmap-volume",
                ),
            ),
        ]
        if with_deployment:
            specs.append(
                (
                    deployment_spec(DEPLOYMENT, HEALTHY),
                    Capture(
                        "deployment-pod-crashloop",
                        "The pod of a one-replica Deployment whose container runs `sh -c "
                        "'exit 1'` on a healthy node, captured once it waited in "
                        f"CrashLoopBackOff with restartCount >= {CRASHLOOP_RESTARTS}.",
                        crash_looping,
                        selector=f"{DEPLOYMENT_LABEL}={DEPLOYMENT}",
                    ),
                )
            )
        for obj, capture in specs:
            if obj is not None:
                self.create(obj)
            self.background.append(capture)

    def image_pull_refused(self) -> None:
        self.cluster.set_fault(FAULTY, "mirror-refused")
        try:
            self.create(pod_spec("image-pull-refused", FAULTY, "sleep 3600"))
            for reason, scenario in (
                ("ErrImagePull", "image-pull-refused-errimagepull"),
                ("ImagePullBackOff", "image-pull-refused-imagepullbackoff"),
            ):
                self.capture(
                    Capture(
                        scenario,
                        f"A pod on a node whose registry mirror refuses connections "
                        f"(fault mirror-refused), captured at waiting reason {reason}.",
                        waiting_with(reason),
                        pod="image-pull-refused",
                    ),
                    timeout=120,
                    every=0.2,
                )
            self.delete_pod("image-pull-refused")
        finally:
            self.cluster.set_fault(FAULTY, None)

    def image_pull_hangs(self, hang_for: float = 20.0) -> None:
        self.cluster.set_fault(FAULTY, "mirror-hangs")
        try:
            self.create(pod_spec("image-pull-hangs", FAULTY, "sleep 3600"))
            capture = Capture(
                "image-pull-hangs",
                f"A pod on a node whose registry mirror accepts connections and never answers "
                f"(fault mirror-hangs), captured {hang_for:.0f} s after a Pulling event.",
                event_with("Pulling"),
                pod="image-pull-hangs",
            )
            pod = self.poll("a Pulling event", lambda: self._with_event(capture, "Pulling"), 60)
            since = time.monotonic()
            self.poll(
                "the hang", lambda: True if time.monotonic() - since >= hang_for else None, 60
            )
            pod = self.find_pod(capture) or pod
            self.write(capture, pod, self.events_of(pod))
            self.delete_pod("image-pull-hangs")
        finally:
            self.cluster.set_fault(FAULTY, None)

    def sandbox_broken(self, fault: str, scenario: str) -> None:
        self.cluster.set_fault(FAULTY, fault)
        try:
            self.create(pod_spec(scenario, FAULTY, "sleep 3600"))
            self.capture(
                Capture(
                    scenario,
                    f"A pod on a node with fault {fault}, captured once a "
                    "FailedCreatePodSandBox event existed.",
                    event_with("FailedCreatePodSandBox"),
                    pod=scenario,
                ),
                timeout=120,
            )
            self.delete_pod(scenario)
        finally:
            self.cluster.set_fault(FAULTY, None)

    def runtime_stopped(self) -> None:
        name = "runtime-stopped"
        self.create(pod_spec(name, FAULTY, "sleep 3600"))
        capture = Capture(name, "", running, pod=name)
        self.poll(
            f"{name} running", lambda: self.find_pod(capture) if self._ready(capture) else None, 120
        )
        self.cluster.set_fault(FAULTY, "runtime-stopped")
        try:
            self.poll(
                f"{FAULTY} not Ready",
                lambda: True if self.node_ready(FAULTY) != "True" else None,
                timeout=150,
                every=1.0,
            )
            capture = Capture(
                name,
                "A pod running on a node whose containerd was then stopped (fault "
                "runtime-stopped), captured once the Node's Ready condition was not True and "
                f"the pod's Ready condition False (or {MARK_NOT_READY_WAIT:.0f} s later).",
                pod_not_ready,
                pod=name,
                node=FAULTY,
            )
            try:
                self.capture(capture, timeout=MARK_NOT_READY_WAIT)
            except RecordError:
                pod = self.find_pod(capture)
                if pod is None:
                    raise
                self.write(capture, pod, self.events_of(pod))
        finally:
            self.cluster.set_fault(FAULTY, None)
        self.poll(
            f"{FAULTY} Ready again",
            lambda: True if self.node_ready(FAULTY) == "True" else None,
            150,
            1.0,
        )
        self.delete_pod(name)

    def evicted(self, node: str, fault: str, how: str, **spec: Any) -> None:
        name = f"evicted-{fault}"
        self.create(pod_spec(name, node, "sleep 3600", **spec))
        self.poll(
            f"{name} running",
            lambda: True if self._ready(Capture(name, "", running, pod=name)) else None,
            120,
        )
        self.cluster.set_fault(node, fault)
        try:
            self.capture(
                Capture(
                    name,
                    f"A {how} pod running on a node whose kubelet was then restarted with an "
                    f"eviction threshold the machine is already past (fault {fault}), captured "
                    "once the pod had status.reason Evicted.",
                    evicted,
                    pod=name,
                    node=node,
                ),
                timeout=240,
                every=1.0,
            )
        finally:
            self.cluster.set_fault(node, None)
        self.delete_pod(name)

    def _with_event(self, capture: Capture, reason: str) -> JSON | None:
        pod = self.find_pod(capture)
        if pod is None or not event_with(reason)(pod, self.events_of(pod)):
            return None
        return pod

    def _ready(self, capture: Capture) -> bool:
        pod = self.find_pod(capture)
        return pod is not None and capture.ready(pod, [])

    def wait_background(self, timeout: float) -> None:
        self.poll(
            "the healthy node's pods: " + ", ".join(c.scenario for c in self.background),
            lambda: True if not self.background else None,
            timeout,
        )
        # Its ReplicaSet replaced the pod captured; the node pressure scenarios want it gone.
        try:
            self.rest.delete(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}")
        except ApiError as e:
            if e.status != 404:
                raise


def summary(pod: JSON, events: list[JSON]) -> str:
    status = pod.get("status", {})
    parts = [f"phase {status.get('phase')}"]
    if status.get("reason"):
        parts.append(f"reason {status['reason']}")
    for s in statuses(pod):
        for key in ("state", "lastState"):
            for kind, block in s.get(key, {}).items():
                detail = block.get("reason", "")
                if "exitCode" in block:
                    detail += f" exit {block['exitCode']}"
                parts.append(f"{key}.{kind} {detail}".strip())
        parts.append(f"restarts {s.get('restartCount', 0)}")
    reasons = sorted({str(e.get("reason")) for e in events})
    parts.append("events " + ",".join(reasons))
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/real-kubelet"))
    parser.add_argument(
        "--no-deployment", action="store_true", help="skip the deployment-pod-crashloop scenario"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    cluster = Cluster(nodes=0, real_nodes=2, prometheus=False)
    rec: Recorder | None = None
    try:
        cluster.start()
        print(f"cluster up in {time.monotonic() - began:.0f}s", flush=True)
        rec = Recorder(cluster, args.out)
        rec.start_healthy_node_pods(with_deployment=not args.no_deployment)
        rec.image_pull_refused()
        rec.image_pull_hangs()
        rec.sandbox_broken("cni-broken", "sandbox-cni-broken")
        rec.sandbox_broken("runtime-broken", "sandbox-runtime-broken")
        rec.runtime_stopped()
        rec.wait_background(timeout=300)
        # A Guaranteed pod: under memory pressure the kubelet admits it again after its restart
        # (only BestEffort pods are refused), so the eviction manager evicts it.
        rec.evicted(
            FAULTY,
            "memory-pressure",
            "Guaranteed (limits: memory 32Mi, cpu 100m)",
            memory_limit="32Mi",
        )
        rec.evicted(HEALTHY, "disk-pressure", "BestEffort")
    except RecordError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
    written = len(rec.written) if rec is not None else 0
    print(f"recorded {written} scenarios in {time.monotonic() - began:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
