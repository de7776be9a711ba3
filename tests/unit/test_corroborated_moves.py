"""Corroborated moves: a pod failing below its thresholds moves when what is beside it says its
node is why (shared/workloads/fastpath.py, update-annotations' `decide.corroborate`).

Pods are shaped as the kubelet writes them (tests/unit/pods.py): a crash loop's waiting
CrashLoopBackOff with the back-off message, a failed pull's waiting ErrImagePull. A
Deployment's ReplicaSet is named <deployment>-<pod-template-hash>, as the deployment
controller names it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.api import nodehealth
from shared.api.keys import NODE_HEALTH_ANNOTATION, SUSPECT_LABEL
from shared.platform.config import Config
from shared.platform.events import Event
from shared.pods.detect_failures.decide import detect
from shared.pods.failing import FailingPod
from shared.pods.update_annotations import decide
from shared.workloads.classify import FailureKind
from shared.workloads.fastpath import (
    corroborated_config,
    corroborated_failure,
    family_of,
    other_workloads_failing,
    ready_elsewhere,
)
from shared.workloads.owners import holder_of
from tests.unit import nodes, pods
from tests.unit.test_owners import replicaset

CFG = Config()
NODE = "node-b"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "real-kubelet"


def web(name: str = "web-7d9c8b6f4-x2x9z", **kwargs: Any) -> Any:
    """A pod of Deployment web (ReplicaSet web-7d9c8b6f4), by default on node-b."""
    return pods.pod(name, **kwargs)


def api_pod(
    name: str = "api-5f6b9c7d8-q4w7e", *, template: str = "5f6b9c7d8", **kwargs: Any
) -> Any:
    """A pod of another Deployment, api, by default on node-b."""
    kwargs.setdefault("owner", ("ReplicaSet", f"api-{template}"))
    kwargs.setdefault("labels", {"app": "api", "pod-template-hash": template})
    return pods.pod(name, **kwargs)


def evicted_days_ago() -> dict[str, Any]:
    """What the eviction manager left three days ago: phase Failed, reason Evicted, its
    container's status unknown (the shape of tests/unit/pods.py's ``evicted``)."""
    days_ago = pods.NOW - timedelta(days=3)
    return {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory. ",
        "containers": [pods.terminated("ContainerStatusUnknown", 137, finished=days_ago)],
        "started": days_ago - timedelta(hours=1),
    }


def shut_down() -> dict[str, Any]:
    """What the kubelet's node shutdown manager writes on the pods it stops
    (pkg/kubelet/nodeshutdown: reason Terminated)."""
    return {
        "phase": "Failed",
        "reason": "Terminated",
        "message": "Pod was terminated in response to imminent node shutdown.",
        "containers": [pods.terminated("Error", 137)],
        "started": pods.NOW - timedelta(hours=20),
    }


def recorded_eviction_on(node: str) -> Any:
    """The evicted pod recorded from kubelet v1.36.3
    (tests/fixtures/real-kubelet/evicted-disk-pressure.json), of its own bare workload, on
    ``node``."""
    left = json.loads((FIXTURES / "evicted-disk-pressure.json").read_text())["pod"]
    left["spec"]["nodeName"] = node
    left["metadata"]["namespace"] = "shop"
    return left


def crashing(restarts: int, **kwargs: Any) -> list[Any]:
    return [pods.crash_looping(restarts=restarts, **kwargs)]


def early_report(pod: Any) -> FailingPod:
    """detect-failures' report of ``pod``, read as update-annotations reads it."""
    reply = detect(Event("1", "s", "dev.knative.apiserver.resource.update", {}, pod), CFG, pods.NOW)
    assert reply is not None and reply.data["kind"] == "early"
    return FailingPod.from_data(reply.data)


def pulling_since(pod: Any, delta: timedelta) -> Any:
    return pods.sandbox_ready_since(pod, pods.NOW - delta)


# -- the thresholds -----------------------------------------------------------------------------


def test_the_corroborated_rules_lower_only_the_two_thresholds_and_never_raise_them() -> None:
    rules = corroborated_config(Config(reset_after=timedelta(minutes=5)))
    assert (rules.crashloop_restart_threshold, rules.waiting_failure_after) == (
        1,
        timedelta(seconds=10),
    )
    assert rules.reset_after == timedelta(minutes=5)
    strict = corroborated_config(
        Config(crashloop_restart_threshold=1, waiting_failure_after=timedelta(seconds=5))
    )
    assert (strict.crashloop_restart_threshold, strict.waiting_failure_after) == (
        1,
        timedelta(seconds=5),
    )


@pytest.mark.parametrize(
    ("pod", "counts"),
    [
        # Its first exit, before the kubelet's immediate restart: one crash is no failure.
        (web(containers=[pods.terminated("Error", 1)]), False),
        # Crashed, restarted at once, crashed again (back-off 10s): corroborated.
        (web(containers=crashing(1)), True),
        (web(containers=crashing(2)), True),
        # Killed at its own memory limit twice: the application's doing on any node.
        (web(containers=crashing(2, last_reason="OOMKilled", exit_code=137)), False),
        # A pull the node's network failed, 4 s and then 12 s after the first attempt.
        (
            pulling_since(
                web(
                    phase="Pending",
                    containers=[pods.waiting("ErrImagePull", "dial tcp 10.0.0.5:443: i/o timeout")],
                ),
                timedelta(seconds=4),
            ),
            False,
        ),
        (
            pulling_since(
                web(
                    phase="Pending",
                    containers=[pods.waiting("ErrImagePull", "dial tcp 10.0.0.5:443: i/o timeout")],
                ),
                timedelta(seconds=12),
            ),
            True,
        ),
        # An image that does not exist fails on every node, however long.
        (
            pulling_since(
                web(
                    phase="Pending",
                    containers=[
                        pods.waiting("ErrImagePull", "registry.example.com/shop/web:9: not found")
                    ],
                ),
                timedelta(seconds=40),
            ),
            False,
        ),
    ],
    ids=[
        "first-exit",
        "1-restart",
        "2-restarts",
        "own-limit-oom",
        "pull-4s",
        "pull-12s",
        "image-not-found",
    ],
)
def test_a_failure_is_corroborated_from_its_second_in_a_row_or_ten_seconds_of_a_failed_pull(
    pod: Any, counts: bool
) -> None:
    assert (corroborated_failure(pod, CFG, pods.NOW) is not None) is counts


# -- another workload failing on the same node -------------------------------------------------


def test_a_deployments_pods_are_one_workload_across_its_replicasets() -> None:
    old = web()
    new = pods.pod(
        "web-6b8f9d5c7-k2j4h",
        owner=("ReplicaSet", "web-6b8f9d5c7"),
        labels={"app": "web", "pod-template-hash": "6b8f9d5c7"},
    )
    assert family_of(old) == family_of(new) == "shop/web"
    assert family_of(pods.pod("report-29371554-x7k2p", owner=("Job", "report-29371554"))) == (
        "shop/report"
    )
    assert family_of(pods.pod("debug", owner=None)) == "shop/debug"


@pytest.mark.parametrize(
    ("neighbours", "found"),
    [
        # Another Deployment crash-looping beside it, from its first crash in a row.
        ([api_pod(containers=crashing(1))], ["shop/api"]),
        # Two of its pods: one workload.
        (
            [
                api_pod("api-5f6b9c7d8-aaaaa", containers=crashing(1)),
                api_pod("api-5f6b9c7d8-bbbbb", containers=crashing(4)),
            ],
            ["shop/api"],
        ),
        # A bare pod failing there is a workload of its own.
        ([pods.pod("debug", owner=None, containers=crashing(2))], ["shop/debug"]),
        # The same Deployment's other ReplicaSet (a rollout in progress): the same workload.
        (
            [
                pods.pod(
                    "web-6b8f9d5c7-k2j4h",
                    owner=("ReplicaSet", "web-6b8f9d5c7"),
                    labels={"app": "web", "pod-template-hash": "6b8f9d5c7"},
                    containers=crashing(2),
                )
            ],
            [],
        ),
        # Healthy, on another node, being deleted, killed at its own limit, or failing in a
        # way no node fixes: none says anything about this node.
        ([api_pod(containers=[pods.running()])], []),
        ([api_pod(node="node-c", containers=crashing(2))], []),
        ([api_pod(deleting=True, containers=crashing(2))], []),
        ([api_pod(containers=crashing(1, last_reason="OOMKilled", exit_code=137))], []),
        (
            [
                api_pod(
                    phase="Pending",
                    containers=[
                        pods.waiting("CreateContainerConfigError", 'secret "api-token" not found')
                    ],
                )
            ],
            [],
        ),
        # Terminal pods left on the node (Kubernetes keeps them until the pod garbage
        # collector's threshold): history, not a failure now.
        ([api_pod(**evicted_days_ago())], []),
        ([api_pod(**shut_down())], []),
        ([recorded_eviction_on(NODE)], []),
    ],
    ids=[
        "other-deployment",
        "two-pods-one-workload",
        "bare-pod",
        "own-rollout",
        "healthy",
        "other-node",
        "deleting",
        "own-limit-oom",
        "missing-secret",
        "evicted-days-ago",
        "terminated-by-a-node-shutdown",
        "recorded-eviction",
    ],
)
def test_another_workload_counts_only_when_it_fails_on_this_node_for_a_node_fixable_reason(
    neighbours: list[Any], found: list[str]
) -> None:
    failing = web(containers=crashing(2))
    on_node = [failing, *neighbours]
    assert list(other_workloads_failing(failing, on_node, CFG, pods.NOW)) == found


# -- the same template running elsewhere --------------------------------------------------------


@pytest.mark.parametrize(
    ("twin", "found"),
    [
        (web("web-7d9c8b6f4-r8t2m", node="node-c"), ["web-7d9c8b6f4-r8t2m on node-c"]),
        # On the same node: says nothing about the node.
        (web("web-7d9c8b6f4-r8t2m", node=NODE), []),
        # Ready between two crashes (no readiness probe): not proven.
        (
            web("web-7d9c8b6f4-r8t2m", node="node-c", containers=[pods.running(restarts=2)]),
            [],
        ),
        # Not yet Ready: not proven either.
        (
            web(
                "web-7d9c8b6f4-r8t2m",
                node="node-c",
                containers=[pods.running(ready=False)],
                conditions=[{"type": "Ready", "status": "False"}],
            ),
            [],
        ),
        # Another ReplicaSet's pod (an older template): not a twin.
        (
            pods.pod(
                "web-6b8f9d5c7-k2j4h",
                node="node-c",
                owner=("ReplicaSet", "web-6b8f9d5c7"),
                labels={"app": "web", "pod-template-hash": "6b8f9d5c7"},
            ),
            [],
        ),
    ],
    ids=["ready-elsewhere", "same-node", "ready-between-crashes", "not-ready", "other-template"],
)
def test_a_twin_counts_when_it_is_ready_and_proven_on_another_node(
    twin: Any, found: list[str]
) -> None:
    failing = web(containers=crashing(2))
    assert list(ready_elsewhere(failing, [failing, twin], CFG, pods.NOW)) == found


def test_a_statefulset_pod_has_no_twins() -> None:
    failing = pods.pod("db-0", owner=("StatefulSet", "db"), labels={"app": "db"})
    twin = pods.pod("db-1", node="node-c", owner=("StatefulSet", "db"), labels={"app": "db"})
    assert ready_elsewhere(failing, [twin], CFG, pods.NOW) == ()


# -- update-annotations' decision, read by read -------------------------------------------------


def test_a_suspect_node_moves_a_pod_at_its_first_failure_without_looking_further() -> None:
    report = early_report(web(containers=crashing(1)))
    early = decide.early_on_node(report, CFG, nodes.node(NODE, labels={SUSPECT_LABEL: "true"}))
    assert early is not None and early.acted_on
    assert early.evidence is decide.Evidence.SUSPECT_NODE and not early.counts_against_node


@pytest.mark.parametrize(
    ("cfg", "node", "looks_further"),
    [
        (CFG, nodes.node(NODE), True),
        (Config(corroborated_fast_path=False), nodes.node(NODE), False),
        (Config(suspect_fast_path=False, corroborated_fast_path=False), nodes.node(NODE), False),
        (CFG, None, False),
    ],
    ids=["not-suspect", "corroboration-off", "both-off", "node-gone"],
)
def test_on_a_node_that_is_not_suspect_only_corroboration_can_move_a_pod_early(
    cfg: Config, node: Any, looks_further: bool
) -> None:
    report = early_report(web(containers=crashing(2)))
    early = decide.early_on_node(report, cfg, node)
    assert (early is None) is looks_further
    assert early is None or not early.acted_on


def test_a_pod_below_the_corroborated_threshold_waits_and_costs_no_list() -> None:
    live = web(containers=crashing(1))
    stricter = Config(corroborated_restart_threshold=2)
    step = decide.corroborate(early_report(live), live, stricter, pods.NOW)
    assert isinstance(step, decide.Early) and not step.acted_on
    assert "restarted 2 time(s) in a row" in step.why


def test_another_workload_failing_beside_it_moves_a_pod_at_its_second_failure_in_a_row() -> None:
    live = web(containers=crashing(1))
    report = early_report(live)
    step = decide.corroborate(report, live, CFG, pods.NOW)
    assert step == decide.ListNodePods(NODE, step.why) and isinstance(step, decide.ListNodePods)
    on_node = [live, api_pod(containers=crashing(1))]
    early = decide.corroborate(report, live, CFG, pods.NOW, on_node=on_node)
    assert isinstance(early, decide.Early) and early.acted_on
    assert early.evidence is decide.Evidence.OTHER_WORKLOADS and early.counts_against_node
    assert "shop/api" in early.why


def test_its_replicaset_ready_elsewhere_moves_a_pod_when_nothing_fails_beside_it() -> None:
    live = web(containers=crashing(2))
    report = early_report(live)
    asked = decide.corroborate(report, live, CFG, pods.NOW, on_node=[live])
    assert isinstance(asked, decide.ListTwins)
    assert (asked.namespace, asked.selector) == ("shop", "pod-template-hash=7d9c8b6f4")
    twin = web("web-7d9c8b6f4-r8t2m", node="node-c")
    early = decide.corroborate(report, live, CFG, pods.NOW, on_node=[live], twins=[live, twin])
    assert isinstance(early, decide.Early) and early.acted_on
    assert early.evidence is decide.Evidence.READY_ELSEWHERE and early.counts_against_node


def test_a_replicaset_failing_on_another_node_too_waits_for_the_thresholds() -> None:
    # Ready on one node, failing on two: the template itself may be why.
    live = web(containers=crashing(2))
    twins = [
        live,
        web("web-7d9c8b6f4-r8t2m", node="node-c"),
        web("web-7d9c8b6f4-p9w3v", node="node-d", containers=crashing(1)),
    ]
    early = decide.corroborate(early_report(live), live, CFG, pods.NOW, on_node=[live], twins=twins)
    assert isinstance(early, decide.Early) and not early.acted_on
    assert "node-d" in early.why


def test_a_statefulset_pod_with_nothing_failing_beside_it_waits_without_listing_its_set() -> None:
    live = pods.pod(
        "db-0", owner=("StatefulSet", "db"), labels={"app": "db"}, containers=crashing(2)
    )
    early = decide.corroborate(early_report(live), live, CFG, pods.NOW, on_node=[live])
    assert isinstance(early, decide.Early) and not early.acted_on


def test_a_corroborated_move_is_judged_by_the_corroborated_rules_and_says_why() -> None:
    live = web(containers=crashing(2))
    early = decide.Early(
        True,
        "corroborated: 1 other workload(s) fail on node node-b now",
        decide.Evidence.OTHER_WORKLOADS,
    )
    report = early_report(live)
    counted = replace(report, failure=replace(report.failure, kind=FailureKind.NODE_FIXABLE))
    holder = holder_of("ReplicaSet", replicaset())
    failure, why_not = decide.current_failure(live, counted, holder, CFG, pods.NOW, early)
    assert failure is not None and why_not == ""
    assert failure.kind is FailureKind.NODE_FIXABLE and "corroborated" in failure.why
    # Without the evidence the same pod is not failing yet by the full rules.
    assert decide.current_failure(live, counted, holder, CFG, pods.NOW)[0] is None


# -- the node's health record: what failed there a moment ago ----------------------------------


def node_with_record(*seen: tuple[str, timedelta]) -> Any:
    """node-b carrying assess-nodes' record of ``(workload, how long ago)`` failures."""
    record = nodehealth.NodeHealth(
        failures=tuple(
            sorted(
                nodehealth.Seen(pods.NOW - ago, workload, f"uid-{i}", "CrashLoopBackOff")
                for i, (workload, ago) in enumerate(seen)
            )
        )
    )
    return nodes.node(NODE, annotations={NODE_HEALTH_ANNOTATION: record.to_json()})


@pytest.mark.parametrize(
    ("node", "acted_on"),
    [
        # Another workload moved off this node a minute ago (a corroborated move, counted):
        # the first of a burst to fail twice no longer finds it beside it, the record does.
        (node_with_record(("Deployment shop/api", timedelta(minutes=1))), True),
        # Its own workload, named by a report as its ReplicaSet: the same family.
        (node_with_record(("ReplicaSet shop/web-7d9c8b6f4", timedelta(minutes=1))), False),
        # Older than the window (10 minutes): forgotten.
        (node_with_record(("Deployment shop/api", timedelta(minutes=11))), False),
        # A record nobody can read is no evidence.
        (nodes.node(NODE, annotations={NODE_HEALTH_ANNOTATION: "{not json"}), False),
    ],
    ids=["other-workload-recently", "own-workload", "too-old", "unreadable"],
)
def test_another_workload_in_the_nodes_record_corroborates_without_a_list(
    node: Any, acted_on: bool
) -> None:
    live = web(containers=crashing(1))
    step = decide.corroborate(early_report(live), live, CFG, pods.NOW, node=node)
    if acted_on:
        assert isinstance(step, decide.Early) and step.acted_on
        assert step.evidence is decide.Evidence.OTHER_WORKLOADS
        assert "Deployment shop/api" in step.why and "health record" in step.why
    else:
        assert isinstance(step, decide.ListNodePods)


def test_a_twin_ready_for_seconds_does_not_corroborate_an_image_that_crashes_after_twenty() -> None:
    """The demo's lookalike: a pod at its second crash moved because a rollout pod 7 s into
    its first run was Ready. The twin proves its template runs only once it outlived the
    failing pod's runs (twice its 20 s)."""
    looping = pods.crash_looping(restarts=1)
    looping["lastState"]["terminated"] = pods.last_terminated(ran_for=timedelta(seconds=20))
    failing = web(containers=[looping])

    def twin(ready_for: timedelta) -> Any:
        return web(
            "web-7d9c8b6f4-zksvb",
            node="node-d",
            started=pods.NOW - ready_for - timedelta(seconds=1),
            containers=[pods.running(started=pods.NOW - ready_for)],
        )

    assert ready_elsewhere(failing, [failing, twin(timedelta(seconds=7))], CFG, pods.NOW) == ()
    proven = ready_elsewhere(failing, [failing, twin(timedelta(seconds=45))], CFG, pods.NOW)
    assert proven == ("web-7d9c8b6f4-zksvb on node-d",)
