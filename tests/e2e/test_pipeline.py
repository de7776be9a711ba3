"""The whole loop, as Knative would run it, on the real control plane.

Pod events come from Knative's own ApiServerSource adapter, Knative's Broker applies the Triggers
in knative/ with Knative's retry rules, each function runs as its own gunicorn process with the
image's command line, replies go back through the Broker, and the API server itself calls the
webhook on every pod CREATE. Nothing is called by hand: each test makes a node faulty, creates
a workload and watches where its pods end up and what the workload's state and Events say.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.stack.stack import Stack
from kubectl_kn_rescheduler import replay
from shared.api.keys import (
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    POLICY_ANNOTATION,
    STATE_ANNOTATION,
)
from shared.platform.kube import Kube
from tests.e2e.conftest import (
    break_every_node_differently,
    holds,
    pod_template,
    state_of,
    wait_for,
)
from tests.e2e.test_rescheduling import events_for, only, pods, ready

pytestmark = pytest.mark.e2e

SETTLE = 90.0


@pytest.fixture(scope="module")
def stack(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The pipeline for this module only: it acts on every namespace, so no other test module
    may run beside it."""
    workdir = tmp_path_factory.mktemp("stack")
    with Stack(
        cluster.kubeconfig, cluster.api_client(), workdir, cluster.log_dir, sweep_every=None
    ) as running:
        yield running


def healthy_nodes(cluster: Any, faulty: set[str]) -> set[str]:
    return set(cluster.nodes) - faulty


def settled(
    api: Kube, namespace: str, expected: int, good: set[str], what: str, timeout: float = SETTLE
) -> list[dict[str, Any]]:
    """Wait until exactly ``expected`` live pods are Ready, all on ``good`` nodes."""

    def check() -> list[dict[str, Any]] | None:
        live = [p for p in pods(api, namespace) if not p["metadata"].get("deletionTimestamp")]
        if len(live) == expected and all(
            ready(p) and p["spec"].get("nodeName") in good for p in live
        ):
            return live
        return None

    result: list[dict[str, Any]] = wait_for(what, check, timeout=timeout, every=0.5)
    return result


def replies_for(stack: Stack, namespace: str, event_type: str) -> list[dict[str, Any]]:
    """The archived replies of ``event_type`` about ``namespace``, each event once: two
    deliveries that say the same move (a redelivery, two reports of one pod racing) answer
    the same event id, and CloudEvents consumers drop the second as a duplicate."""
    once: dict[str, dict[str, Any]] = {}
    for e in stack.archived():
        if e["type"] == event_type and (e.get("data") or {}).get("namespace") == namespace:
            once.setdefault(e["id"], e)
    return list(once.values())


def workload(kind: str, name: str, template: dict[str, Any], **spec: Any) -> dict[str, Any]:
    api_version = "batch/v1" if kind == "Job" else "apps/v1"
    body: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "annotations": {POLICY_ANNOTATION: spec.pop("retries", "3")}},
        "spec": {"template": template, **spec},
    }
    if kind != "Job":
        body["spec"]["selector"] = {"matchLabels": template["metadata"]["labels"]}
    return body


def test_a_deployment_with_one_faulty_node_moves_and_settles_on_healthy_nodes(
    cluster: Any, namespace: str, api: Kube, stack: Stack, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[0]
    faults("crashloop", bad)
    template = pod_template({"app": "web"}, bad)
    api.create("Deployment", namespace, workload("Deployment", "web", template, replicas=3))
    settled(api, namespace, 3, healthy_nodes(cluster, {bad}), "3 web pods Ready on good nodes")

    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]
    state = state_of(api, "ReplicaSet", namespace, rs)
    assert state.excluded_nodes == (bad,)
    # The state and the Event are written before the reply leaves for the Broker.
    assert stack.wait_idle(10)
    moved = replies_for(stack, namespace, EVENT_POD_RESCHEDULED)
    assert state.moves == len(moved) >= 1
    assert all(r["data"]["node"] == bad for r in moved)
    assert len(events_for(api, namespace, rs, "Rescheduled")) == state.moves
    assert stack.dead_letters.exists() is False or not stack.dead_letters.read_text().strip()


def test_statefulset_pods_keep_separate_exclusions(
    cluster: Any, namespace: str, api: Kube, stack: Stack, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[1]
    faults("oom", bad)
    template = pod_template({"app": "db"}, bad)
    api.create(
        "StatefulSet",
        namespace,
        workload("StatefulSet", "db", template, replicas=2, serviceName="db"),
    )
    live = settled(api, namespace, 2, healthy_nodes(cluster, {bad}), "db-0 and db-1 Ready")
    assert sorted(p["metadata"]["name"] for p in live) == ["db-0", "db-1"]
    state = state_of(api, "StatefulSet", namespace, "db")
    assert stack.wait_idle(10)
    moved_names = {r["data"]["name"] for r in replies_for(stack, namespace, EVENT_POD_RESCHEDULED)}
    assert moved_names, "at least one StatefulSet pod was placed on the faulty node and moved"
    for name in moved_names:
        assert state.entry(name).excluded_nodes == (bad,)
        assert state.entry(name).moves >= 1
    assert state.excluded_nodes == ()
    assert state.moves == sum(state.entry(n).moves for n in ("db-0", "db-1"))


def test_a_job_pod_moves_without_the_job_being_recreated(
    cluster: Any, namespace: str, api: Kube, stack: Stack, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[2]
    faults("imagepull", bad)
    template = pod_template({"app": "report"}, bad, restartPolicy="OnFailure")
    job = api.create("Job", namespace, workload("Job", "report", template, backoffLimit=6))

    def succeeded() -> bool:
        status = api.get("Job", namespace, "report").get("status", {})
        return bool(status.get("succeeded"))

    wait_for("the Job to succeed on a good node", succeeded, timeout=SETTLE)
    assert api.get("Job", namespace, "report")["metadata"]["uid"] == job["metadata"]["uid"]
    state = state_of(api, "Job", namespace, "report")
    assert state.excluded_nodes == (bad,) and state.moves >= 1


def test_a_bare_pod_is_recreated_off_the_faulty_node(
    cluster: Any, namespace: str, api: Kube, stack: Stack, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[3]
    faults("crashloop", bad)
    template = pod_template({"app": "solo"}, bad)
    api.create(
        "Pod",
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "solo", "annotations": {POLICY_ANNOTATION: "3"}, "labels": {}},
            "spec": template["spec"],
        },
    )
    (new,) = settled(api, namespace, 1, healthy_nodes(cluster, {bad}), "the solo pod recreated")
    assert new["metadata"]["name"].startswith("solo-")
    state = json.loads(new["metadata"]["annotations"][STATE_ANNOTATION])
    assert state["excludedNodes"] == [bad] and state["moves"] == 1


def test_an_exhausted_budget_stops_moving(
    cluster: Any, namespace: str, api: Kube, stack: Stack, faults: Callable[..., None]
) -> None:
    faults("imagepull", *cluster.nodes)
    template = pod_template({"app": "web"}, cluster.nodes[0])
    api.create("Deployment", namespace, workload("Deployment", "web", template, retries="2"))
    rs = wait_for("the ReplicaSet", lambda: list(api.list_all("ReplicaSet", namespace)))
    name = rs[0]["metadata"]["name"]
    wait_for(
        "RetriesExhausted", lambda: events_for(api, namespace, name, "RetriesExhausted"), SETTLE
    )
    # More failure events keep arriving; none may move anything.
    holds("two moves, no more", lambda: state_of(api, "ReplicaSet", namespace, name).moves == 2, 3)
    assert len(events_for(api, namespace, name, "RetriesExhausted")) == 1
    assert len(events_for(api, namespace, name, "Rescheduled")) == 2


def test_all_nodes_faulty_clears_exclusions_once_the_pod_is_unschedulable(
    cluster: Any, namespace: str, api: Kube, stack: Stack, faults: Callable[..., None]
) -> None:
    break_every_node_differently(faults, cluster.nodes)
    template = pod_template({"app": "web"}, cluster.nodes[0])
    api.create("Deployment", namespace, workload("Deployment", "web", template, retries="10"))
    rs = wait_for("the ReplicaSet", lambda: list(api.list_all("ReplicaSet", namespace)))
    name = rs[0]["metadata"]["name"]
    wait_for(
        "exclusions cleared",
        lambda: events_for(api, namespace, name, "ExclusionsCleared"),
        SETTLE,
    )

    def actions() -> list[tuple[str, int]]:
        return [
            (r["data"]["action"], r["data"]["moves"])
            for r in replies_for(stack, namespace, EVENT_POD_RESCHEDULED)
        ]

    # The Event is recorded before the function answers; its reply reaches the archive through
    # the Broker a moment later.
    clearing = ("clear-and-move", len(cluster.nodes))
    done = wait_for("the clearing move's reply", lambda: clearing in actions() and actions(), 30)
    cleared_at = done.index(clearing)
    # Every node was tried once, then the clearing step left the count where it was.
    assert done[:cleared_at] == [("move", i + 1) for i in range(len(cluster.nodes))]


def test_daemonsets_and_workloads_without_the_policy_are_left_alone(
    cluster: Any, namespace: str, api: Kube, stack: Stack, faults: Callable[..., None]
) -> None:
    bad = cluster.nodes[0]
    faults("crashloop", bad)
    agent = pod_template({"app": "agent"}, bad)
    api.create("DaemonSet", namespace, workload("DaemonSet", "agent", agent))
    plain = workload("Deployment", "plain", pod_template({"app": "plain"}, bad))
    del plain["metadata"]["annotations"]
    api.create("Deployment", namespace, plain)

    def crash_looping_on_bad() -> list[dict[str, Any]] | None:
        looping = [
            p
            for p in pods(api, namespace)
            if p["spec"].get("nodeName") == bad
            and any(s.get("restartCount", 0) >= 4 for s in p["status"].get("containerStatuses", []))
        ]
        return looping if len(looping) == 2 else None

    before = {p["metadata"]["uid"] for p in wait_for("both crash-looping", crash_looping_on_bad)}
    assert stack.wait_idle(10)
    after = {p["metadata"]["uid"] for p in pods(api, namespace) if p["spec"].get("nodeName") == bad}
    assert before <= after
    failing = [e for e in stack.archived() if e["type"] == EVENT_POD_FAILING]
    assert not [e for e in failing if e["data"]["namespace"] == namespace]


def test_a_pod_that_failed_while_no_event_was_watching_is_found_by_the_sweep(
    cluster: Any, namespace: str, api: Kube, stack: Stack, faults: Callable[..., None]
) -> None:
    assert stack.source is not None
    stack.source.stop()  # a watch gap: ApiServerSource sends nothing for what happens now
    bad = cluster.nodes[1]
    try:
        faults("imagepull", bad)
        template = pod_template({"app": "web"}, bad)
        api.create("Deployment", namespace, workload("Deployment", "web", template))

        def failing_on_bad() -> bool:
            return any(
                p["spec"].get("nodeName") == bad
                and (p["status"].get("containerStatuses") or [{}])[0]
                .get("state", {})
                .get("waiting", {})
                .get("reason")
                # Not the first ErrImagePull: a failed pull counts once the kubelet kept failing
                # for a while (1s locally); its back-off comes 2s after the first attempt.
                == "ImagePullBackOff"
                for p in pods(api, namespace)
            )

        wait_for("the pod failing unseen", failing_on_bad)
        assert stack.sweep_now() == 202
        settled(api, namespace, 1, healthy_nodes(cluster, {bad}), "the swept pod moved")
        swept = [
            e
            for e in stack.archived()
            if e["type"] == EVENT_POD_FAILING and e["source"].endswith("sweep-failures")
        ]
        assert any(e["data"]["namespace"] == namespace for e in swept)
    finally:
        stack.source.start()


def test_replaying_a_scenario_with_dry_run_decides_the_same_and_changes_nothing(
    cluster: Any,
    namespace: str,
    api: Kube,
    stack: Stack,
    faults: Callable[..., None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bad = cluster.nodes[2]
    faults("crashloop", bad)
    api.create(
        "Deployment",
        namespace,
        workload("Deployment", "web", pod_template({"app": "web"}, bad), replicas=2),
    )
    settled(api, namespace, 2, healthy_nodes(cluster, {bad}), "the scenario to settle")
    assert stack.wait_idle(10)
    archive = tmp_path / "scenario.jsonl"
    recorded = [e for e in stack.archived() if namespace in e.get("subject", "")]
    archive.write_text("".join(json.dumps(e) + "\n" for e in recorded))
    rs = only(api, "ReplicaSet", namespace)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))

    def run(*args: str) -> list[dict[str, Any]]:
        out = tmp_path / "out.jsonl"
        with out.open("w") as sink:
            assert replay.main([str(archive), "--json", *args], out=sink) == 0
        return [json.loads(line) for line in out.read_text().splitlines()]

    outcomes = run("--dry-run")
    # detect-failures is pure: the replay finds the same failing pods as the live run did.
    live_failing = sorted(e["subject"] for e in recorded if e["type"] == EVENT_POD_FAILING)
    replayed_failing = sorted(
        o["reply"]["subject"] for o in outcomes if o["function"] == "detect-failures" and o["reply"]
    )
    assert replayed_failing == live_failing
    # update-annotations writes nothing: every write it would make is a server-side dry run.
    writes = [c for o in outcomes for c in o["calls"] if not c.startswith("GET")]
    assert all("(dry run)" in c for c in writes)
    # What a write of ours would change (the controller's own status writes change the
    # resourceVersion at any time, so that is not compared).
    after = api.get("ReplicaSet", namespace, rs["metadata"]["name"])
    for part in ("annotations", "labels"):
        assert after["metadata"].get(part) == rs["metadata"].get(part), part
    assert after["spec"] == rs["spec"]

    # Replayed for real, once and then twice: the same end state, since each event is
    # idempotent (the moves it asks for are already recorded and done).
    before = state_of(api, "ReplicaSet", namespace, rs["metadata"]["name"])
    run()
    once = state_of(api, "ReplicaSet", namespace, rs["metadata"]["name"])
    run()
    twice = state_of(api, "ReplicaSet", namespace, rs["metadata"]["name"])
    assert before == once == twice
    assert once.excluded_nodes == (bad,)
