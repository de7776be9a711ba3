"""The fake kubelet's pod-level behaviours (dev/localcluster/kubelet.py, podstatus.py): what a
pod's own annotations ask for, whatever its node: a container that runs a while before each
exit, an exit code its ``restartPolicyRules`` restart in place, a slow first pull of its image,
a sandbox its Multus network attachment keeps from being created, and a terminal status left
long ago. Driven step by step against an in-memory API (no threads, no server): each step is the
timer the fake kubelet scheduled, run at once."""

from __future__ import annotations

import copy
import datetime
import heapq
import itertools
import re
import time
from typing import Any

import pytest

from dev.localcluster.keys import SIM_FAULT_LABEL
from dev.localcluster.kubelet import FakeKubelet, Timing, _Shard
from dev.localcluster.podstatus import (
    MULTUS_NETWORKS_ANNOTATION,
    SIM_EXIT_CODE_ANNOTATION,
    SIM_PULL_TAKES_ANNOTATION,
    SIM_RUNS_FOR_ANNOTATION,
    SIM_TERMINAL_ANNOTATION,
    go_duration_ms,
    multus_networks,
    should_restart,
)
from dev.localcluster.rest import ApiError

JSON = dict[str, Any]
NODE = "node-1"
IMAGE = "registry.example.com/shop/web:1.4.2"


class FakeApi:
    """Pods, one Node and Events in memory, patched the way the fake kubelet patches them (the
    status merge is shallow: enough to read the statuses back)."""

    def __init__(self) -> None:
        self.pods: dict[str, JSON] = {}
        self.events: dict[str, JSON] = {}
        self.rv = itertools.count(10)
        self.node: JSON = {
            "metadata": {"name": NODE, "resourceVersion": "1", "labels": {}},
            "spec": {"podCIDR": "10.244.1.0/24"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.11"}]},
        }

    def add(self, pod: JSON) -> JSON:
        pod["metadata"]["resourceVersion"] = str(next(self.rv))
        self.pods[pod["metadata"]["name"]] = pod
        return copy.deepcopy(pod)

    def get(self, path: str, params: Any = None) -> JSON:
        if path == f"/api/v1/nodes/{NODE}":
            return copy.deepcopy(self.node)
        raise ApiError(404, path)

    def post(self, path: str, body: JSON) -> JSON:
        assert path.endswith("/events"), path
        name = body["metadata"]["name"]
        if name in self.events:
            raise ApiError(409, f"events {name} already exists")
        self.events[name] = copy.deepcopy(body)
        return body

    def patch(self, path: str, body: JSON, content_type: str = "") -> JSON:
        parts = path.split("/")
        if "events" in parts:
            name = parts[-1]
            if name not in self.events:
                raise ApiError(404, name)
            self.events[name].update(body)
            return self.events[name]
        pod = self.pods[parts[6]]
        if path.endswith("/status"):
            status = {k: v for k, v in body["status"].items() if not k.startswith("$")}
            pod["status"] = {**pod.get("status", {}), **status}
        else:
            pod["metadata"].setdefault("annotations", {}).update(
                body["metadata"].get("annotations") or {}
            )
        pod["metadata"]["resourceVersion"] = str(next(self.rv))
        return copy.deepcopy(pod)


def a_pod(
    name: str = "web-1", *, labels: JSON | None = None, annotations: JSON | None = None
) -> JSON:
    return {
        "metadata": {
            "name": name,
            "namespace": "shop",
            "uid": f"uid-{name}",
            "generation": 1,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "app", "image": IMAGE}],
        },
        "status": {},
    }


class Driven:
    """One shard of a fake kubelet whose timers are run by hand."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.kubelet = FakeKubelet(rest=api, nodes=frozenset({NODE}), timing=Timing(), shards=1)  # type: ignore[arg-type]
        self.shard: _Shard = self.kubelet._shards[0]

    def bind(self, pod: JSON) -> str:
        self.shard._on_event("ADDED", self.api.add(pod))
        return str(pod["metadata"]["uid"])

    def _live(self) -> list[tuple[float, int, str, int]]:
        out = []
        for entry in sorted(self.shard.timers):
            tracked = self.shard.pods.get(entry[2])
            if tracked is not None and not tracked.done and entry[3] == tracked.token:
                out.append(entry)
        return out

    def step(self) -> JSON:
        """Runs the next live timer; the pod's status as written."""
        live = self._live()
        assert live, "nothing scheduled"
        _, _, uid, token = live[0]
        self.shard.timers.remove(live[0])
        heapq.heapify(self.shard.timers)
        self.shard._on_timer(uid, token)
        return self.status(uid)

    def status(self, uid: str) -> JSON:
        pod = next(p for p in self.api.pods.values() if p["metadata"]["uid"] == uid)
        status: JSON = pod.get("status", {})
        return status


def container(status: JSON) -> JSON:
    found: JSON = status["containerStatuses"][0]
    return found


def condition(status: JSON, kind: str) -> JSON:
    return next(c for c in status["conditions"] if c["type"] == kind)


def delays(d: Driven) -> list[float]:
    """The delays of the live timers, from their due times (whole seconds from now)."""
    now = time.monotonic()
    return [round(due - now) for due, *_ in d._live()]


# -- a container that runs a while before each exit ----------------------------------------------


def test_an_image_that_crashes_20_s_after_start_runs_ready_then_backs_off_and_restarts() -> None:
    api = FakeApi()
    d = Driven(api)
    uid = d.bind(
        a_pod(labels={SIM_FAULT_LABEL: "crashloop"}, annotations={SIM_RUNS_FOR_ANNOTATION: "20"})
    )
    assert container(d.step())["state"]["waiting"]["reason"] == "ContainerCreating"
    running = d.step()
    assert running["phase"] == "Running"
    assert condition(running, "Ready")["status"] == "True"
    assert container(running)["restartCount"] == 0
    assert delays(d) == [20]  # it runs 20 s
    crashed = container(d.step())
    assert crashed["state"]["terminated"]["exitCode"] == 1
    assert crashed["restartCount"] == 0
    again = d.step()  # restarted at once after a first exit
    assert container(again)["restartCount"] == 1
    assert "running" in container(again)["state"]
    assert container(again)["lastState"]["terminated"]["exitCode"] == 1
    assert condition(again, "Ready")["status"] == "True"
    assert delays(d) == [20]
    backoff = container(d.step())
    assert backoff["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert backoff["state"]["waiting"]["message"].startswith("back-off 10s restarting failed")
    assert backoff["restartCount"] == 1
    assert container(d.step())["restartCount"] == 2
    later = container(d.step())
    assert later["state"]["waiting"]["message"].startswith("back-off 20s restarting failed")
    assert api.pods["web-1"]["metadata"]["annotations"][SIM_FAULT_LABEL] == "crashloop"
    assert uid


# -- restartPolicyRules -------------------------------------------------------------------------

RULES = [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]


def trainer(exit_code: int) -> JSON:
    pod = a_pod(
        "trainer-0",
        labels={SIM_FAULT_LABEL: "crashloop"},
        annotations={SIM_RUNS_FOR_ANNOTATION: "10", SIM_EXIT_CODE_ANNOTATION: str(exit_code)},
    )
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "trainer",
            "uid": "job-uid",
            "controller": True,
        }
    ]
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["containers"][0].update({"restartPolicy": "Never", "restartPolicyRules": RULES})
    return pod


def test_an_exit_code_its_restart_rule_names_restarts_the_container_in_place() -> None:
    d = Driven(FakeApi())
    d.bind(trainer(42))
    d.step()  # creating
    assert d.step()["phase"] == "Running"
    exited = d.step()
    assert exited["phase"] == "Running"  # not Failed: the rule restarts it
    assert container(exited)["state"]["terminated"]["exitCode"] == 42
    restarted = d.step()
    assert container(restarted)["restartCount"] == 1
    assert container(restarted)["lastState"]["terminated"]["exitCode"] == 42
    d.step()
    assert container(d.step())["restartCount"] == 2


def test_an_exit_code_no_rule_names_ends_the_pod_under_restart_policy_never() -> None:
    d = Driven(FakeApi())
    d.bind(trainer(1))
    d.step()
    d.step()
    failed = d.step()
    assert failed["phase"] == "Failed"
    assert container(failed)["state"]["terminated"]["exitCode"] == 1
    assert delays(d) == []


@pytest.mark.parametrize(
    ("own", "rules", "pod_policy", "code", "restarts"),
    [
        (None, None, "Always", 1, True),
        (None, None, "OnFailure", 0, False),
        (None, None, "Never", 1, False),
        ("Never", RULES, "Never", 42, True),
        ("Never", RULES, "Always", 1, False),
        (
            "Always",
            [{"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0]}}],
            "Never",
            0,
            True,
        ),
        (
            "Never",
            [{"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0]}}],
            "Always",
            3,
            True,
        ),
    ],
)
def test_the_restart_decision_is_podutils_with_the_containers_rules_first(
    own: str | None, rules: list[JSON] | None, pod_policy: str, code: int, restarts: bool
) -> None:
    c: JSON = {"name": "app"}
    if own:
        c["restartPolicy"] = own
    if rules:
        c["restartPolicyRules"] = rules
    pod = {"spec": {"restartPolicy": pod_policy, "containers": [c]}}
    assert should_restart(c, pod, code) is restarts


# -- a slow first pull --------------------------------------------------------------------------


def events_of(api: FakeApi, reason: str) -> list[JSON]:
    return [e for e in api.events.values() if e["reason"] == reason]


def test_a_nodes_first_pull_of_a_big_image_takes_its_time_with_the_sandbox_up() -> None:
    api = FakeApi()
    d = Driven(api)
    d.bind(a_pod("big-1", annotations={SIM_PULL_TAKES_ANNOTATION: "300"}))
    first = d.step()
    assert condition(first, "PodReadyToStartContainers")["status"] == "True"
    pulling = d.step()  # the pull began: nothing new written, one Pulling Event
    assert container(pulling)["state"]["waiting"]["reason"] == "ContainerCreating"
    assert [e["message"] for e in events_of(api, "Pulling")] == [f'Pulling image "{IMAGE}"']
    assert delays(d) == [300]
    assert events_of(api, "Pulled") == []
    done = d.step()
    assert done["phase"] == "Running"
    [pulled] = events_of(api, "Pulled")
    assert re.match(
        rf'Successfully pulled image "{re.escape(IMAGE)}" in \d+ms \(\d+ms including waiting\)\. '
        r"Image size: \d+ bytes\.",
        pulled["message"],
    ), pulled["message"]


def test_a_node_that_has_the_image_starts_the_pod_at_once_and_says_no_pull() -> None:
    api = FakeApi()
    d = Driven(api)
    d.kubelet.first_pull(NODE, IMAGE)  # another pod started it here earlier
    d.bind(a_pod("big-2", annotations={SIM_PULL_TAKES_ANNOTATION: "300"}))
    d.step()
    assert d.step()["phase"] == "Running"
    assert events_of(api, "Pulled") == events_of(api, "Pulling") == []


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.5, "500ms"), (1.2345, "1.234s"), (40.5, "40.5s"), (150.0, "2m30s"), (3725.25, "1h2m5.25s")],
)
def test_pull_times_read_as_go_prints_a_duration(seconds: float, text: str) -> None:
    assert go_duration_ms(seconds) == text


# -- a Multus attachment that does not exist ------------------------------------------------------


def test_a_pod_naming_a_network_attachment_never_gets_its_sandbox() -> None:
    api = FakeApi()
    d = Driven(api)
    d.bind(a_pod("net-1", annotations={MULTUS_NETWORKS_ANNOTATION: "macvlan-conf"}))
    status = d.step()
    assert status["phase"] == "Pending"
    assert condition(status, "PodReadyToStartContainers")["status"] == "False"
    assert condition(status, "Ready")["reason"] == "ContainersNotReady"
    assert container(status)["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert "podIP" not in status
    [event] = events_of(api, "FailedCreatePodSandBox")
    assert event["type"] == "Warning" and event["source"]["host"] == NODE
    assert (
        "cannot find a network-attachment-definition (macvlan-conf) in namespace (shop)"
        in (event["message"])
    )
    assert (
        'network-attachment-definitions.k8s.cni.cncf.io "macvlan-conf" not found'
        in (event["message"])
    )
    assert "[shop/net-1/uid-net-1]" in event["message"]
    d.step()  # tried again: the same Event, counted
    [again] = events_of(api, "FailedCreatePodSandBox")
    assert again["count"] == 2
    assert api.pods["net-1"]["metadata"]["annotations"][SIM_FAULT_LABEL] == "multus"


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ("macvlan-conf", ["macvlan-conf"]),
        ("other/macvlan-conf@eth1, sriov", ["other/macvlan-conf", "sriov"]),
        ('[{"name": "macvlan-conf", "interface": "eth1"}]', ["macvlan-conf"]),
        ("", []),
    ],
)
def test_multus_annotation_forms(raw: str, names: list[str]) -> None:
    pod = {"metadata": {"annotations": {MULTUS_NETWORKS_ANNOTATION: raw}}}
    assert multus_networks(pod) == names


# -- pods left terminal long ago ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "message", "disruption"),
    [
        ("Evicted", "The node was low on resource: memory.", True),
        ("Terminated", "Pod was terminated in response to imminent node shutdown.", True),
        ("OutOfcpu", "Pod was rejected: Node didn't have enough resource: cpu, requested: ", False),
    ],
)
def test_a_pod_left_terminal_long_ago_is_written_so_once(
    kind: str, message: str, disruption: bool
) -> None:
    api = FakeApi()
    d = Driven(api)
    pod = a_pod("old-1", annotations={SIM_TERMINAL_ANNOTATION: kind})
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "500m"}}
    uid = d.bind(pod)
    status = d.step()
    assert status["phase"] == "Failed"
    assert status["reason"] == kind
    assert status["message"].startswith(message)
    started = datetime.datetime.fromisoformat(status["startTime"].replace("Z", "+00:00"))
    assert time.time() - started.timestamp() > 2 * 24 * 3600  # days ago
    types = [c["type"] for c in status.get("conditions", [])]
    assert ("DisruptionTarget" in types) is disruption
    if kind == "OutOfcpu":
        assert "containerStatuses" not in status and "podIP" not in status
    else:
        assert container(status)["state"]["terminated"]["exitCode"] in (137, 143)
    assert delays(d) == []
    assert api.pods["old-1"]["metadata"]["annotations"][SIM_FAULT_LABEL] == "terminal"
    assert uid
