"""Real nodes in the local cluster: a real kubelet and containerd each, broken for real.

Each fault is a real cause on one node, the other node healthy beside it, and each test reads
what the real kubelet writes: the pod's status, its Events, the Node's conditions and taints.
The last tests stop clusters, cleanly and by SIGKILL, and check the machine is as it was.

Needs root and Debian's containerd, runc and CNI plugins (hack/install-packages.sh).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dev.localcluster import hostchanges, realnode
from dev.localcluster.cluster import Cluster
from dev.localcluster.nodeimages import BUSYBOX_IMAGE
from dev.localcluster.procs import pid_alive
from dev.localcluster.rest import ApiError
from tests.e2e.conftest import holds, needs_real_nodes, wait_for

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, needs_real_nodes, pytest.mark.real_nodes]

BROKEN, HEALTHY = "real-0", "real-1"
PODS = "/api/v1/namespaces/default/pods"


# -- nothing left behind (first: before the module's cluster starts) -----------------------------


@dataclass(frozen=True)
class Footprint:
    """What one real-node cluster has on the machine, found by what names it."""

    processes: list[int]
    mounts: list[str]
    links: list[str]
    netns: list[str]
    routes: list[str]
    cgroups: list[str]
    cni_results: list[str]
    shim_sockets: list[str]
    records: list[str]
    base_exists: bool

    def empty(self) -> bool:
        return not any(
            (
                self.processes,
                self.mounts,
                self.links,
                self.netns,
                self.routes,
                self.cgroups,
                self.cni_results,
                self.shim_sockets,
                self.records,
                self.base_exists,
            )
        )


@dataclass
class Tracker:
    """Collects a running cluster's sandbox ids and shim sockets (gone from its directory once
    it is cleaned), to look for them afterwards."""

    base: Path
    network: str
    sandboxes: set[str] = field(default_factory=set)
    sockets: set[Path] = field(default_factory=set)

    def note(self) -> None:
        self.sandboxes |= hostchanges.sandbox_ids(str(self.base))
        self.sockets |= hostchanges.shim_sockets(str(self.base))

    def footprint(self) -> Footprint:
        links = subprocess.run(
            ["ip", "-o", "link"], capture_output=True, text=True, check=True
        ).stdout
        results = (
            [p.name for p in hostchanges.CNI_RESULTS.iterdir()]
            if hostchanges.CNI_RESULTS.is_dir()
            else []
        )
        octet = self.network.removeprefix("knr")
        namespaces = subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=True
        ).stdout.split()
        routes = subprocess.run(
            ["ip", "-4", "route", "show"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        return Footprint(
            processes=runtime_processes(self.base),
            mounts=hostchanges.mounts_under(str(self.base)),
            links=[
                name
                for line in links.splitlines()
                if (name := line.split(":")[1].strip().split("@")[0]).startswith(self.network)
            ],
            netns=[n for n in namespaces if n.startswith(self.network)],
            routes=[r for r in routes if r.startswith(f"10.{octet}.")],
            cgroups=[str(d) for d in hostchanges.cgroup_dirs(f"/{realnode.CGROUP_PREFIX}-{octet}")],
            cni_results=[
                r
                for r in results
                if r.startswith(f"{self.network}-") or any(f"-{s}-" in r for s in self.sandboxes)
            ],
            shim_sockets=[str(s) for s in self.sockets if s.exists()],
            records=[r.workdir for r in hostchanges.records() if r.workdir == str(self.base)],
            base_exists=self.base.exists(),
        )


def runtime_processes(base: Path) -> list[int]:
    """containerd, its shims and kubelets whose command line names ``base`` (the nodes'
    directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(base) in args and pid_alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def iptables() -> list[str]:
    """The rules (no counters, no comments): real nodes must not add or remove one."""
    if shutil.which("iptables-save") is None:
        return []
    out = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    return [x for x in out.splitlines() if not x.startswith(("#", ":"))]


def no_other_real_cluster() -> bool:
    return not any(hostchanges.owner_alive(r) for r in hostchanges.records())


def test_a_stopped_cluster_leaves_the_machine_as_it_was(tmp_path: Path) -> None:
    alone = no_other_real_cluster()
    sysctls, rules = hostchanges.read_sysctls(), iptables()
    c = Cluster(tmp_path / "c", nodes=0, real_nodes=1, prometheus=False, quiet=True)
    c.start()
    assert c.realnodes is not None
    tracker = Tracker(c.realnodes.base, c.realnodes.network)
    try:
        run_pod(c, "tenant", "real-0")
        eventually(lambda: running(c, "tenant"), "the pod to run")
        tracker.note()
        during = tracker.footprint()
        # Everything the check looks for is there while the cluster runs.
        assert during.processes and during.mounts and during.links and during.cgroups
        assert during.netns and during.routes
        assert during.cni_results and during.shim_sockets and during.records
    finally:
        c.stop()
    assert tracker.footprint() == Footprint([], [], [], [], [], [], [], [], [], False)
    assert iptables() == rules
    if alone:  # the last real-node cluster out restores the kubelet's sysctls
        assert hostchanges.read_sysctls() == sysctls


CRASHING_OWNER = textwrap.dedent(
    """
    import sys, time
    from dev.localcluster.cluster import Cluster
    from tests.e2e.test_real_nodes import run_pod, running, eventually
    c = Cluster(sys.argv[1], nodes=0, real_nodes=1, prometheus=False, quiet=True)
    c.start()
    run_pod(c, "tenant", "real-0")
    eventually(lambda: running(c, "tenant"), "the pod to run")
    print("running", c.realnodes.base, c.realnodes.network, flush=True)
    time.sleep(600)
    """
)


def test_a_crashed_run_is_cleaned_at_the_next_start(tmp_path: Path) -> None:
    alone = no_other_real_cluster()
    sysctls, rules = hostchanges.read_sysctls(), iptables()
    owner = subprocess.Popen(
        [sys.executable, "-c", CRASHING_OWNER, str(tmp_path / "crashed")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert owner.stdout is not None
        said, base, network = owner.stdout.readline().split()
        assert said == "running"
        tracker = Tracker(Path(base), network)
        tracker.note()
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)

    # Its kubelet and containerd died with it (they die with their parent); the shims, which
    # daemonize, and the containers under them did not.
    def only_shims_left() -> bool:
        left = runtime_processes(Path(base))
        return bool(left) and all(
            "containerd-shim" in Path(f"/proc/{p}/cmdline").read_text() for p in left
        )

    eventually(only_shims_left, "the shims to be all that is left", timeout=30)
    left = tracker.footprint()
    assert left.mounts and left.links and left.cgroups and left.shim_sockets and left.records
    assert base in hostchanges.clean_stale()
    assert tracker.footprint() == Footprint([], [], [], [], [], [], [], [], [], False)
    assert iptables() == rules
    if alone:
        assert hostchanges.read_sysctls() == sysctls


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("real-cluster"),
        nodes=1,
        real_nodes=2,
        prometheus=False,
        keep_workdir=True,
        quiet=True,
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def broken(real: Cluster) -> Iterator[Callable[[str], None]]:
    """Breaks BROKEN with a fault; heals every node and deletes the test's pods afterwards."""
    yield lambda fault: real.set_fault(BROKEN, fault)
    for node in real.real_nodes:
        real.set_fault(node, None)
    for pod in real.rest.get(PODS)["items"]:
        try:
            real.rest.delete(f"{PODS}/{pod['metadata']['name']}?gracePeriodSeconds=0")
        except ApiError as e:
            if e.status != 404:
                raise


def run_pod(c: Cluster, name: str, node: str, **container: Any) -> None:
    spec = {
        "name": "app",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Always",
        "command": ["sleep", "3600"],
        **container,
    }
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [spec]},
    }
    c.rest.post(PODS, body)


def eventually(
    check: Callable[[], Any],
    what: str,
    timeout: float = 60.0,
    seen: Callable[[], Any] | None = None,
) -> Any:
    """``wait_for`` as this file waits: every half second, a minute by default."""
    return wait_for(what, check, timeout, every=0.5, seen=seen)


def pod(c: Cluster, name: str) -> dict[str, Any]:
    body: dict[str, Any] = c.rest.get(f"{PODS}/{name}")
    return body


def waiting_reason(c: Cluster, name: str) -> str:
    statuses = pod(c, name)["status"].get("containerStatuses") or [{}]
    return str(statuses[0].get("state", {}).get("waiting", {}).get("reason", ""))


def crash_looping(c: Cluster, name: str) -> bool:
    """Restarted at least twice, and the kubelet said it is backing off."""
    statuses = pod(c, name)["status"].get("containerStatuses") or [{}]
    restarts = int(statuses[0].get("restartCount", 0))
    return restarts >= 2 and "BackOff" in dict(events(c, name))


def running(c: Cluster, name: str) -> bool:
    statuses = pod(c, name)["status"].get("containerStatuses") or [{}]
    return "running" in statuses[0].get("state", {})


def events(c: Cluster, name: str) -> list[tuple[str, str]]:
    items = c.rest.get(
        "/api/v1/namespaces/default/events",
        params={"fieldSelector": f"involvedObject.name={name}"},
    )["items"]
    return [(e["reason"], e["message"]) for e in items]


def condition(c: Cluster, node: str, kind: str) -> str:
    conditions = c.rest.get(f"/api/v1/nodes/{node}")["status"].get("conditions", [])
    return next((x["status"] for x in conditions if x["type"] == kind), "")


def taints(c: Cluster, node: str) -> set[str]:
    spec = c.rest.get(f"/api/v1/nodes/{node}")["spec"]
    return {t["key"] for t in spec.get("taints") or []}


def node_seen(c: Cluster, node: str) -> dict[str, Any]:
    """A node's conditions and taints, for a wait's failure message."""
    found = c.rest.get(f"/api/v1/nodes/{node}")
    return {
        "conditions": {x["type"]: x["status"] for x in found["status"].get("conditions", [])},
        "taints": found["spec"].get("taints") or [],
    }


def tainted(c: Cluster, node: str, key: str) -> None:
    """Wait for the node lifecycle controller's taint: it writes it on its own watch, a moment
    after the kubelet's condition, so reading it right after the condition races."""
    eventually(
        lambda: key in taints(c, node),
        f"the {key} taint on {node}",
        timeout=30,
        seen=lambda: node_seen(c, node),
    )


# -- a healthy real node -------------------------------------------------------------------------


def test_a_pod_on_a_real_node_runs_in_a_real_container(real: Cluster, broken: Any) -> None:
    run_pod(real, "plain", HEALTHY)
    eventually(lambda: running(real, "plain"), "the pod to run")
    status = pod(real, "plain")["status"]
    container = status["containerStatuses"][0]
    assert container["containerID"].startswith("containerd://")
    assert container["imageID"].startswith("kn-rescheduler.local/busybox@sha256:")
    subnet = real.state()["real_nodes"][HEALTHY]["subnet"]
    assert status["podIP"].startswith(subnet.rsplit(".", 1)[0] + ".")
    # The kubelet's Events go through its event broadcaster, apart from the status it writes.
    eventually(
        lambda: (
            ("Pulled", f'Successfully pulled image "{BUSYBOX_IMAGE}"')
            in [(reason, message.split(" in ")[0]) for reason, message in events(real, "plain")]
        ),
        "the Pulled Event",
        seen=lambda: events(real, "plain"),
    )


def test_kwok_leaves_real_nodes_to_their_kubelets(real: Cluster) -> None:
    node = real.rest.get(f"/api/v1/nodes/{HEALTHY}")
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.")
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    assert (
        node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        == (real.state()["real_nodes"][HEALTHY]["kubelet_port"])
    )


# -- faults --------------------------------------------------------------------------------------


def test_a_refused_mirror_fails_the_pull_on_its_node_only(real: Cluster, broken: Any) -> None:
    broken("mirror-refused")
    run_pod(real, "refused", BROKEN)
    run_pod(real, "elsewhere", HEALTHY)
    eventually(
        lambda: waiting_reason(real, "refused") in ("ErrImagePull", "ImagePullBackOff"),
        "the pull to fail",
    )
    message = pod(real, "refused")["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    assert "connection refused" in message
    eventually(lambda: running(real, "elsewhere"), "the same image to run on the healthy node")


@pytest.mark.real_nodes_full
def test_a_hanging_mirror_leaves_a_pull_that_never_ends(real: Cluster, broken: Any) -> None:
    broken("mirror-hangs")
    run_pod(real, "hangs", BROKEN)
    eventually(lambda: "Pulling" in dict(events(real, "hangs")), "the pull to start")
    holds(
        "a pull that neither ends nor fails",
        lambda: (
            waiting_reason(real, "hangs") == "ContainerCreating"
            and {reason for reason, _ in events(real, "hangs")} & {"Pulled", "Failed"} == set()
        ),
        10,
        every=1.0,
    )


def test_an_app_missing_its_node_file_crash_loops_on_that_node_only(
    real: Cluster, broken: Any
) -> None:
    broken("app-crash")
    run_pod(real, "needy", BROKEN, command=list(realnode.NODE_DEPENDENT_APP))
    run_pod(real, "needy-elsewhere", HEALTHY, command=list(realnode.NODE_DEPENDENT_APP))
    # Since 1.36 the kubelet re-syncs a pod exactly when its back-off ends, so the API shows
    # `waiting: CrashLoopBackOff` only for the instant before each restart and `terminated` for
    # the rest of the back-off (CI once polled through 40 s of it without seeing the waiting
    # reason). A crash loop, as the kubelet writes it, is restarts plus its BackOff Event.
    try:
        eventually(lambda: crash_looping(real, "needy"), "a crash loop", 120)
    except AssertionError as e:
        seen = pod(real, "needy")["status"], events(real, "needy")
        raise AssertionError(f"{e}; the pod's status and Events: {seen}") from e
    status = pod(real, "needy")["status"]["containerStatuses"][0]
    last = status["state"].get("terminated") or status["lastState"]["terminated"]
    assert (last["reason"], last["exitCode"]) == ("Error", 1)
    eventually(lambda: running(real, "needy-elsewhere"), "the same app to run on the other node")


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        ("cni-broken", 'failed to find plugin "kn-rescheduler-missing-plugin"'),
        ("runtime-broken", "OCI runtime create failed"),
    ],
)
def test_a_broken_sandbox_shows_only_in_events(
    real: Cluster, broken: Any, fault: str, cause: str
) -> None:
    broken(fault)
    name = f"nosandbox-{fault}"  # Events outlive their pod: one name per case
    run_pod(real, name, BROKEN)
    eventually(
        lambda: any(r == "FailedCreatePodSandBox" for r, _ in events(real, name)),
        "FailedCreatePodSandBox",
    )
    assert any(cause in m for r, m in events(real, name) if r == "FailedCreatePodSandBox")
    # The status says no more than "still creating" (the kubelet's status manager writes it
    # on its own schedule, so the Event may come first).
    eventually(
        lambda: waiting_reason(real, name) == "ContainerCreating",
        "the status to say ContainerCreating",
        seen=lambda: pod(real, name)["status"],
    )
    assert pod(real, name)["status"]["phase"] == "Pending"


def evicted(status: dict[str, Any]) -> bool:
    return status.get("reason") == "Evicted" and status.get("phase") == "Failed"


def test_disk_pressure_taints_the_node_and_evicts_its_pods(real: Cluster, broken: Any) -> None:
    run_pod(real, "victim", BROKEN)
    eventually(lambda: running(real, "victim"), "the pod to run")
    broken("disk-pressure")
    eventually(
        lambda: condition(real, BROKEN, "DiskPressure") == "True",
        "DiskPressure",
        seen=lambda: node_seen(real, BROKEN),
    )
    tainted(real, BROKEN, "node.kubernetes.io/disk-pressure")
    eventually(
        lambda: evicted(pod(real, "victim")["status"]),
        "the eviction: reason Evicted, phase Failed",
        seen=lambda: pod(real, "victim")["status"],
    )
    real.set_fault(BROKEN, None)
    eventually(lambda: condition(real, BROKEN, "DiskPressure") == "False", "the node to recover")


@pytest.mark.real_nodes_full
def test_memory_pressure_is_reported_by_the_kubelet(real: Cluster, broken: Any) -> None:
    broken("memory-pressure")
    eventually(
        lambda: condition(real, BROKEN, "MemoryPressure") == "True",
        "MemoryPressure",
        seen=lambda: node_seen(real, BROKEN),
    )
    tainted(real, BROKEN, "node.kubernetes.io/memory-pressure")


def test_a_stopped_runtime_turns_the_node_not_ready_while_its_pod_looks_fine(
    real: Cluster, broken: Any
) -> None:
    run_pod(real, "stranded", BROKEN)
    eventually(lambda: running(real, "stranded"), "the pod to run")
    broken("runtime-stopped")
    eventually(lambda: condition(real, BROKEN, "Ready") != "True", "NotReady", timeout=90)
    # The API still shows the pod running: only the taint manager will act, later.
    assert running(real, "stranded")
    # The node lifecycle controller taints it a moment after the kubelet's condition.
    eventually(
        lambda: (
            {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
            & taints(real, BROKEN)
        ),
        "the not-ready taint",
        timeout=30,
    )
    real.set_fault(BROKEN, None)
    eventually(lambda: condition(real, BROKEN, "Ready") == "True", "Ready again", timeout=90)
