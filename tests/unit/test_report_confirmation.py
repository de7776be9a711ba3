"""A report counts against a node only once this request confirmed it against the API.

Any pod of the cluster can post a CloudEvent to assess-nodes' Service, so a report is a claim:
the tables below run the pure confirmation (``decide.confirm_*``) over pods exactly as a real
kubelet wrote them (tests/fixtures/real-kubelet, kubelet v1.36) and holders carrying the state
update-annotations writes (``dump_state``); the last tests run the handler against an
in-memory API server to show what is read, and what an error reading it answers.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from shared.api.keys import (
    EVENT_POD_EXHAUSTED,
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    NODE_HEALTH_ANNOTATION,
    POLICY_STAMP_ANNOTATION,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
    SUSPECT_VALUE,
)
from shared.api.state import PodEntry, Stopped, WorkloadState, dump_state
from shared.nodes.assess_nodes import decide
from shared.nodes.assess_nodes.decide import (
    Claim,
    Confirmed,
    NodeFacts,
    Unconfirmed,
    Verdict,
    assess,
    claim_from_event,
    confirm_exhausted,
    confirm_failing,
    confirm_rescheduled,
    record_of,
    replacement_candidates,
)
from shared.nodes.assess_nodes.handler import Assessor
from shared.platform import kube
from shared.platform.config import Config
from shared.platform.events import Event
from shared.pods.failing import FailingPod
from shared.pods.update_annotations.bodies import replacement_name
from shared.workloads.classify import Failure, FailureKind, classify
from shared.workloads.owners import holder_of
from shared.workloads.podevents import sandbox_failures, warning_events
from tests import builders
from tests.unit import nodes, pods
from tests.unit.test_real_kubelet_statuses import load, recorded_at

CFG = Config()
# The pod of a one-replica Deployment crash-looping (restartCount 4) on node real-1, as kubelet
# v1.36 wrote it; a second after the recording.
CRASHLOOP = "deployment-pod-crashloop"
NOW = recorded_at(CRASHLOOP)
NODE = "real-1"


def live(scenario: str = CRASHLOOP, *, stamp: str | None = "3") -> dict[str, Any]:
    """The recorded pod, with the webhook's policy stamp (``stamp``; None: never opted in)."""
    pod: dict[str, Any] = copy.deepcopy(load(scenario)["pod"])
    if stamp is not None:
        pod["metadata"].setdefault("annotations", {})[POLICY_STAMP_ANNOTATION] = stamp
    return pod


def failing_report(pod: dict[str, Any], **changed: Any) -> dict[str, Any]:
    """What detect-failures sends about ``pod`` at the restart threshold, with ``changed``."""
    failure = classify(pod, CFG, NOW)  # type: ignore[arg-type]
    assert failure is not None
    data = FailingPod.from_pod(pod, failure).to_data()  # type: ignore[arg-type]
    data.update(changed)
    return data


def reply(
    pod: dict[str, Any],
    holder: tuple[str, str],
    *,
    top: tuple[str, str] | None = None,
    **changed: Any,
) -> dict[str, Any]:
    """What update-annotations replies after moving ``pod`` (its state on ``holder``)."""
    meta = pod["metadata"]
    data = {
        "namespace": meta["namespace"],
        "name": meta["name"],
        "uid": meta["uid"],
        "node": pod["spec"]["nodeName"],
        "reason": "CrashLoopBackOff",
        "kind": "node-fixable",
        "action": "move",
        "workload": {"kind": holder[0], "name": holder[1]},
        "topWorkload": {"kind": (top or holder)[0], "name": (top or holder)[1]},
        "moves": 1,
        "budget": 3,
        "excludedNodes": [pod["spec"]["nodeName"]],
        "exclusionsCleared": False,
        "message": "moved",
    }
    data.update(changed)
    return data


def claim(event_type: str, data: dict[str, Any], at: datetime | None = None) -> Claim:
    time = (at or NOW - timedelta(seconds=5)).isoformat()
    return claim_from_event(event_type, data, time, NOW)


# The pod's ReplicaSet, controlled by its Deployment, as the controllers create them.
RS = "crashloop-deployment-574bb696df"
RS_UID = "56847b31-fef9-4ea3-988e-80e7b18a037f"


def replicaset(state: WorkloadState | None = None, *, raw: str | None = None) -> dict[str, Any]:
    annotations = {"deployment.kubernetes.io/revision": "1"}
    if state is not None:
        annotations[STATE_ANNOTATION] = dump_state(state)
    if raw is not None:
        annotations[STATE_ANNOTATION] = raw
    return builders.replicaset(
        RS,
        namespace="default",
        uid=RS_UID,
        resource_version="812",
        retries="3",
        annotations=annotations,
        owner=builders.owner_reference("Deployment", "crashloop-deployment"),
    )


def moved(pod: dict[str, Any], **changed: Any) -> WorkloadState:
    """The state update-annotations writes when it moves ``pod`` off its node."""
    node = pod["spec"]["nodeName"]
    state = WorkloadState(
        moves=1,
        excluded_nodes=(node,),
        handled=(pod["metadata"]["uid"],),
        updated_at=NOW - timedelta(seconds=2),
        holder_uid=RS_UID,
        failed_on={node: "CrashLoopBackOff"},
    )
    return replace(state, **changed)


def record(state: WorkloadState | None = None, **kw: Any) -> decide.Record:
    return record_of(holder_of("ReplicaSet", replicaset(state, **kw)))


def failure_of(pod: dict[str, Any]) -> Failure | None:
    return classify(pod, CFG, NOW)  # type: ignore[arg-type]


def failing(pod: dict[str, Any], data: dict[str, Any], rec: decide.Record) -> Any:
    """The pure verdict on a pod.failing report, with ``pod`` as read (None: no such pod)."""
    return confirm_failing(
        claim(EVENT_POD_FAILING, data), pod, failure_of(pod) if pod else None, rec, CFG
    )


# -- pod.failing ------------------------------------------------------------------------------


def test_a_report_of_a_pod_failing_now_counts_with_what_the_api_shows() -> None:
    pod = live()
    found = failing(pod, failing_report(pod), record())
    assert isinstance(found, Confirmed), found
    assert found.blame.node == NODE
    assert found.blame.pod == pod["metadata"]["uid"]
    assert found.blame.workload == f"ReplicaSet default/{RS}"
    assert found.blame.reason == "CrashLoopBackOff"
    assert found.blame.at == NOW - timedelta(seconds=5)


def test_the_workload_and_reason_counted_are_the_live_pods_never_the_reports() -> None:
    pod = live()
    forged = failing_report(
        pod,
        reason="KernelPanic",
        ownerReferences=[builders.owner_reference("ReplicaSet", "someone-else-5c8f9d7b6")],
    )
    found = failing(pod, forged, record())
    assert isinstance(found, Confirmed)
    assert found.blame.workload == f"ReplicaSet default/{RS}"
    assert found.blame.reason == "CrashLoopBackOff"


def pod_named(name: str, uid: str, node: str) -> dict[str, Any]:
    pod = live()
    pod["metadata"].update({"name": name, "uid": uid})
    pod["spec"]["nodeName"] = node
    return pod


@pytest.mark.parametrize(
    ("what", "read", "said", "warning"),
    [
        # Two made-up pods of made-up workloads: nothing of the kind exists.
        ("a made-up pod", None, "there is no such pod", False),
        # A namesake: a pod of that name, another uid (the report's pod is gone).
        (
            "a wrong uid",
            pod_named(load(CRASHLOOP)["pod"]["metadata"]["name"], "0000-namesake", NODE),
            "the pod of that name is another one (uid 0000-namesake)",
            True,
        ),
        (
            "another node",
            pod_named(load(CRASHLOOP)["pod"]["metadata"]["name"], "", "real-0"),
            "the pod is on node real-0",
            True,
        ),
        ("not opted in", live(stamp=None), "the pod is not opted in", True),
        ("opted out with 0", live(stamp="0"), "the pod is not opted in", True),
    ],
)
def test_a_report_the_live_pod_contradicts_is_not_counted(
    what: str, read: dict[str, Any] | None, said: str, warning: bool
) -> None:
    report = failing_report(live())
    if read is not None and not read["metadata"]["uid"]:
        read["metadata"]["uid"] = report["uid"]
    found = failing(read, report, record()) if read is not None else None
    if read is None:
        found = confirm_failing(claim(EVENT_POD_FAILING, report), None, None, record(), CFG)
    assert isinstance(found, Unconfirmed), what
    assert said in found.why and found.warning is warning, found.why


def test_a_report_of_a_pod_healthy_now_is_not_counted() -> None:
    # The same pod, running again: the kubelet's Ready status, no waiting container.
    healthy = pods.pod(
        name="web-7d9c8b6f4-x2x9z", namespace="shop", node=NODE, containers=[pods.running()]
    )
    report = failing_report(live())
    report.update(namespace="shop", name="web-7d9c8b6f4-x2x9z", uid=healthy["metadata"]["uid"])
    found = confirm_failing(claim(EVENT_POD_FAILING, report), healthy, None, record(), CFG)
    assert isinstance(found, Unconfirmed)
    assert "not failing now by the full rules" in found.why and not found.warning


def test_a_failure_now_on_no_node_or_not_node_fixable_is_not_counted() -> None:
    pod = live()
    c = claim(EVENT_POD_FAILING, failing_report(pod))
    other = Failure(FailureKind.EXCLUSIONS_UNSCHEDULABLE, "Unschedulable", "", None)
    found = confirm_failing(c, pod, other, record(), CFG)
    assert isinstance(found, Unconfirmed) and "not node-fixable" in found.why


@pytest.mark.parametrize(
    ("state", "said"),
    [
        (
            WorkloadState(
                moves=3,
                handled=("a", "b", "c"),
                holder_uid=RS_UID,
                updated_at=NOW,
                stopped=Stopped("CrashLoopBackOff", ("real-0", "real-1"), NOW),
            ),
            "was stopped (CrashLoopBackOff on every node): not new evidence",
        ),
        (
            WorkloadState(moves=3, exhausted_recorded=True, holder_uid=RS_UID, updated_at=NOW),
            "ran out of its budget: not new evidence",
        ),
    ],
    ids=["stopped", "exhausted"],
)
def test_a_report_of_a_stopped_or_exhausted_workload_is_not_new_evidence(
    state: WorkloadState, said: str
) -> None:
    pod = live()
    found = failing(pod, failing_report(pod), record(state))
    assert isinstance(found, Unconfirmed) and said in found.why, found
    assert not found.warning


def test_a_statefulset_pod_that_ran_out_of_its_own_budget_is_not_new_evidence() -> None:
    pod = live()
    name = pod["metadata"]["name"]
    state = WorkloadState(
        moves=3,
        per_pod={name: PodEntry(moves=3, exhausted_recorded=True, updated_at=NOW)},
        updated_at=NOW,
    )
    found = failing(pod, failing_report(pod), record(state))
    assert isinstance(found, Unconfirmed) and "ran out of its budget" in found.why


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("{not json", "its state cannot be read"),
        (dump_state(WorkloadState(holder_uid="another-object", updated_at=NOW)), "not its own"),
    ],
)
def test_a_state_that_cannot_be_read_confirms_nothing(raw: str, said: str) -> None:
    pod = live()
    found = failing(pod, failing_report(pod), record(raw=raw))
    assert isinstance(found, Unconfirmed) and said in found.why and found.warning


# -- pod.rescheduled ----------------------------------------------------------------------------


def rescheduled(state: WorkloadState | None, at: datetime | None = None, **changed: Any) -> Any:
    pod = live()
    data = reply(pod, ("ReplicaSet", RS), top=("Deployment", "crashloop-deployment"), **changed)
    return confirm_rescheduled(claim(EVENT_POD_RESCHEDULED, data, at), record(state))


def test_a_reply_the_holder_records_counts_for_the_holders_own_controller() -> None:
    found = rescheduled(moved(live()), topWorkload={"kind": "Deployment", "name": "forged"})
    assert isinstance(found, Confirmed), found
    # The Deployment as the ReplicaSet's ownerReference names it, not the reply's topWorkload.
    assert found.blame.workload == "Deployment default/crashloop-deployment"
    assert found.blame.node == NODE and found.blame.reason == "CrashLoopBackOff"


@pytest.mark.parametrize(
    ("state", "said"),
    [
        (None, "records no move of that pod"),
        (moved(live(), handled=("some-other-pod",)), "records no move of that pod"),
        (
            moved(live(), failed_on={"real-0": "CrashLoopBackOff"}, excluded_nodes=("real-0",)),
            "records no failure on that node",
        ),
    ],
    ids=["no state", "uid not handled", "node not failed on"],
)
def test_a_reply_the_holder_does_not_record_is_not_counted(
    state: WorkloadState | None, said: str
) -> None:
    found = rescheduled(state)
    assert isinstance(found, Unconfirmed) and said in found.why and found.warning, found


def test_a_replayed_reply_is_never_later_than_our_own_last_write() -> None:
    written = NOW - timedelta(hours=2)
    state = moved(live(), updated_at=written)
    found = rescheduled(state, at=NOW)
    assert isinstance(found, Confirmed) and found.blame.at == written
    # Two hours old: outside the window, so the node's record does not take it at all.
    node = NodeFacts.from_node(nodes.node(NODE))
    assert assess(node, found.blame, NOW, CFG).record.failures == ()
    assert assess(node, found.blame, NOW, CFG).verdict is Verdict.HEALTHY


def test_a_move_off_a_suspect_node_is_not_counted_whatever_the_reply_says_its_kind_is() -> None:
    # Our record of a move does not say whether the suspect fast path made it, and the reply's
    # kind is the sender's word: a fast-path reply re-posted as node-fixable would keep the node
    # suspect on one-off crashes.
    pod = live()
    state = moved(pod)
    rs = replicaset_with(state)
    data = reply(pod, ("ReplicaSet", RS), top=("Deployment", "crashloop-deployment"))
    assert data["kind"] == "node-fixable"
    suspect = nodes.node(NODE, labels={SUSPECT_LABEL: SUSPECT_VALUE})
    api = Api(rs, suspect)
    assert deliver(api, EVENT_POD_RESCHEDULED, data) is None
    assert api.patches == [] and node_record(api) == {}
    # The same reply about a node that is not suspect counts.
    healthy = Api(replicaset_with(state), nodes.node(NODE))
    assert deliver(healthy, EVENT_POD_RESCHEDULED, data) is None
    assert [f["workload"] for f in node_record(healthy)["failures"]] == [
        "Deployment default/crashloop-deployment"
    ]


def replicaset_with(state: WorkloadState) -> dict[str, Any]:
    rs = replicaset()
    rs["metadata"].setdefault("annotations", {})[STATE_ANNOTATION] = dump_state(state)
    return rs


def test_a_reply_for_a_statefulset_pod_counts_by_the_pods_own_exclusions() -> None:
    pod = live()
    name = pod["metadata"]["name"]
    state = WorkloadState(
        moves=1,
        handled=(pod["metadata"]["uid"],),
        per_pod={name: PodEntry(moves=1, excluded_nodes=(NODE,), updated_at=NOW)},
        updated_at=NOW,
    )
    sts = builders.statefulset("db", namespace="default", uid="sts-uid", retries="3")
    sts["metadata"]["annotations"][STATE_ANNOTATION] = dump_state(state)
    data = reply(pod, ("StatefulSet", "db"))
    found = confirm_rescheduled(
        claim(EVENT_POD_RESCHEDULED, data), record_of(holder_of("StatefulSet", sts))
    )
    assert isinstance(found, Confirmed) and found.blame.workload == "StatefulSet default/db"


def test_a_bare_pods_move_is_looked_up_where_update_annotations_recorded_it() -> None:
    # The first pod of the line, and its replacement (named after it, the origin annotated):
    # each one's replacement is among the names looked up.
    first: dict[str, Any] = {"metadata": {"name": "solo", "uid": "uid-1"}}
    second: dict[str, Any] = {
        "metadata": {
            "name": replacement_name(first),
            "uid": "uid-2",
            "annotations": {"kn-rescheduler.io/origin": "solo"},
        }
    }
    for pod in (first, second):
        name, uid = str(pod["metadata"]["name"]), str(pod["metadata"]["uid"])
        data = {**reply(live(), ("Pod", name)), "name": name, "uid": uid}
        assert replacement_name(pod) in replacement_candidates(claim(EVENT_POD_RESCHEDULED, data))


# -- pod.exhausted ------------------------------------------------------------------------------


def test_an_exhausted_reply_counts_only_when_the_holder_records_the_exhausted_budget() -> None:
    pod = live()
    data = reply(pod, ("ReplicaSet", RS), action="exhausted")
    c = claim(EVENT_POD_EXHAUSTED, data, at=NOW)
    written = NOW - timedelta(seconds=30)
    recorded = moved(pod, exhausted_recorded=True, updated_at=written)
    found = confirm_exhausted(c, pod, failure_of(pod), record(recorded), CFG)
    assert isinstance(found, Confirmed), found
    assert found.blame.at == written
    assert found.blame.workload == "Deployment default/crashloop-deployment"
    missing = confirm_exhausted(c, pod, failure_of(pod), record(moved(pod)), CFG)
    assert isinstance(missing, Unconfirmed) and "records no exhausted budget" in missing.why
    gone = confirm_exhausted(c, None, None, record(recorded), CFG)
    assert isinstance(gone, Unconfirmed) and "no such pod" in gone.why


# -- the handler: what it reads, and what an error reading it answers ---------------------------


class Api(kube.Kube):
    """An API server in memory: objects by (kind, namespace, name); ``errors`` by kind (or
    "Event" for the LIST of a pod's Events) makes that read fail."""

    def __init__(
        self, *objects: dict[str, Any], errors: dict[str, kube.KubeError] | None = None
    ) -> None:
        self.objects = {
            (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): copy.deepcopy(o)
            for o in objects
        }
        self.errors = errors or {}
        self.events: list[dict[str, Any]] = []
        self.reads: list[str] = []
        self.patches: list[dict[str, Any]] = []

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
        self.reads.append(f"get {kind} {name}")
        if kind in self.errors:
            raise self.errors[kind]
        try:
            return copy.deepcopy(self.objects[(kind, namespace if kind != "Node" else None, name)])
        except KeyError:
            raise kube.NotFound(f"{kind} {name} not found", 404, "NotFound") from None

    def list_all(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        limit: int = 500,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        self.reads.append(f"list {kind}")
        if kind in self.errors:
            raise self.errors[kind]
        if kind == "Event":
            return iter(copy.deepcopy(self.events))
        return iter(
            copy.deepcopy(o) for (k, _, _), o in self.objects.items() if k == kind and k == "Node"
        )

    def merge_patch(
        self, kind: str, namespace: str | None, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        assert kind == "Node"
        self.patches.append(copy.deepcopy(body))
        node = self.objects[("Node", None, name)]
        for key in ("labels", "annotations"):
            merged = {**(node["metadata"].get(key) or {}), **(body["metadata"].get(key) or {})}
            node["metadata"][key] = {k: v for k, v in merged.items() if v is not None}
        return copy.deepcopy(node)

    def create(self, kind: str, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        return body


def deliver(api: Api, event_type: str, data: dict[str, Any]) -> Any:
    event = Event("1", "/forged", event_type, {"time": NOW.isoformat()}, data)
    return Assessor(api, CFG, clock=lambda: NOW).handle(event)


def node_record(api: Api, name: str = NODE) -> dict[str, Any]:
    raw = (api.objects[("Node", None, name)]["metadata"].get("annotations") or {}).get(
        NODE_HEALTH_ANNOTATION
    )
    return json.loads(raw) if raw else {}


def test_a_confirmed_report_is_recorded_and_a_forged_one_leaves_the_node_alone() -> None:
    pod = live()
    api = Api(pod, replicaset(), nodes.node(NODE))
    assert deliver(api, EVENT_POD_FAILING, failing_report(pod)) is None
    assert [f["workload"] for f in node_record(api)["failures"]] == [f"ReplicaSet default/{RS}"]
    # The pod, then its ReplicaSet (the state), each once; the status alone showed the failure.
    assert api.reads[:2] == ["get Pod " + pod["metadata"]["name"], f"get ReplicaSet {RS}"]

    forged_api = Api(nodes.node(NODE))
    for name in ("web-5c8f9d7b6-abcde", "api-7d9c8b6f4-fghij"):
        data = failing_report(pod, name=name, uid=f"uid-{name}")
        assert deliver(forged_api, EVENT_POD_FAILING, data) is None
    assert forged_api.patches == [] and node_record(forged_api) == {}


def test_a_report_naming_a_running_pod_costs_one_read_of_it_and_no_list() -> None:
    pod = live()
    running = copy.deepcopy(pod)
    running["status"]["containerStatuses"] = [pods.running(name="app", started=NOW)]
    api = Api(running, replicaset(), nodes.node(NODE))
    # The report as it was sent while the pod failed; the pod runs now.
    assert deliver(api, EVENT_POD_FAILING, failing_report(pod)) is None
    assert api.reads == ["get Pod " + pod["metadata"]["name"]]
    assert node_record(api) == {}


def test_a_transient_error_reading_the_pod_is_answered_503_and_a_refusal_is_not_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pod = live()
    down = Api(nodes.node(NODE), errors={"Pod": kube.Transient("GET pods: 503", 503, "")})
    with pytest.raises(kube.Transient):
        deliver(down, EVENT_POD_FAILING, failing_report(pod))
    refused = Api(
        nodes.node(NODE), errors={"Pod": kube.Forbidden("GET pods: 403", 403, "Forbidden")}
    )
    with caplog.at_level(logging.INFO):
        assert deliver(refused, EVENT_POD_FAILING, failing_report(pod)) is None
    assert refused.patches == []
    said = [r for r in caplog.records if r.getMessage().startswith("not counted")]
    assert said and said[0].levelno == logging.WARNING and "403" in said[0].getMessage()


SANDBOX = "sandbox-cni-broken"


def sandbox_now() -> datetime:
    """When the kubelet's sandbox failures, as recorded, are the node's by the full rules."""
    pod = load(SANDBOX)["pod"]
    events = warning_events(load(SANDBOX)["events"])[pod["metadata"]["uid"]]
    failed = sandbox_failures(events, pod["spec"]["nodeName"])
    assert failed is not None
    return failed.first + CFG.waiting_failure_after


def test_a_failure_only_the_kubelets_events_show_is_read_from_them() -> None:
    # A bare pod stuck in ContainerCreating on a node whose CNI is broken: its status says
    # nothing, its Warning Events (FailedCreatePodSandBox) do.
    pod = live(SANDBOX)
    node = pod["spec"]["nodeName"]
    now = sandbox_now()
    api = Api(pod, nodes.node(node))
    api.events = load(SANDBOX)["events"]
    failure = Failure(FailureKind.NODE_FIXABLE, "FailedCreatePodSandBox", "", node)
    data = FailingPod.from_pod(pod, failure).to_data()  # type: ignore[arg-type]
    event = Event("1", "/x", EVENT_POD_FAILING, {"time": now.isoformat()}, data)
    assert Assessor(api, CFG, clock=lambda: now).handle(event) is None
    assert "list Event" in api.reads
    (seen,) = node_record(api, node)["failures"]
    assert seen["reason"] == "FailedCreatePodSandBox"
    assert seen["workload"] == f"Pod default/{pod['metadata']['name']}"

    # The Events cannot be listed for a while: 503, the Broker delivers it again.
    down = Api(pod, nodes.node(node), errors={"Event": kube.Transient("LIST events", 504, "")})
    with pytest.raises(kube.Transient):
        Assessor(down, CFG, clock=lambda: now).handle(event)
    # Not allowed to list them (RBAC): not counted, nothing written.
    refused = Api(pod, nodes.node(node), errors={"Event": kube.Forbidden("LIST events", 403, "")})
    assert Assessor(refused, CFG, clock=lambda: now).handle(event) is None
    assert refused.patches == []


def test_a_forged_reply_naming_a_workload_without_that_record_leaves_the_node_alone() -> None:
    pod = live()
    api = Api(replicaset(moved(pod, handled=("someone-else",))), nodes.node(NODE))
    for kind, name in (("ReplicaSet", RS), ("ReplicaSet", "made-up-5c8f9d7b6"), ("Secret", "x")):
        data = reply(pod, (kind, name))
        assert deliver(api, EVENT_POD_RESCHEDULED, data) is None
    assert api.patches == []
    # The holder that does record the move: counted.
    api = Api(replicaset(moved(pod)), nodes.node(NODE))
    assert deliver(api, EVENT_POD_RESCHEDULED, reply(pod, ("ReplicaSet", RS))) is None
    (seen,) = node_record(api)["failures"]
    assert seen["workload"] == "Deployment default/crashloop-deployment"


def test_a_failure_whose_workload_failed_on_another_node_moments_ago_is_not_counted() -> None:
    # An application broken everywhere, two replicas: the one on node-a was moved a moment ago
    # (its state records node-a) and is gone from the LIST; this one, admitted before the move,
    # has no stamp. Only the workload's own record says that it fails elsewhere, and no pod of
    # it runs anywhere: the failure is no evidence against this node.
    pod = live()
    state = moved(
        pod,
        failed_on={"node-a": "CrashLoopBackOff"},
        excluded_nodes=("node-a",),
        handled=("uid-of-its-twin-on-node-a",),
    )
    api = Api(pod, replicaset(state), nodes.node(NODE))
    assert deliver(api, EVENT_POD_FAILING, failing_report(pod)) is None
    assert api.patches == [] and node_record(api) == {}
