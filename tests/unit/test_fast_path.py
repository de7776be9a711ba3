"""The fast path: detect-failures reports a pod's first failure early; only a suspect node acts.

detect-failures cannot read Nodes, so it reports the first node-fixable failure of an opted-in
pod as ``kind: early`` whenever the full rules do not call it failing yet; update-annotations
then reads the Node (tests/e2e/test_node_health.py). These tables pin what counts as a first
failure, with pods shaped as the kubelet writes them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from shared.api.keys import SUSPECT_LABEL
from shared.platform.config import Config
from shared.platform.events import Event
from shared.pods.detect_failures.decide import detect
from shared.workloads.fastpath import early_config, is_suspect
from tests.unit import nodes, pods
from tests.unit.test_node_blame import reply_after_move

CFG = Config()


def reported(pod: Any, cfg: Config = CFG) -> dict[str, Any] | None:
    reply = detect(Event("1", "s", "dev.knative.apiserver.resource.update", {}, pod), cfg, pods.NOW)
    return None if reply is None else dict(reply.data)


def pulling_since(delta: timedelta) -> Any:
    pod = pods.pod(
        phase="Pending",
        containers=[pods.waiting("ErrImagePull", "dial tcp 10.0.0.5:443: i/o timeout")],
    )
    return pods.sandbox_ready_since(pod, pods.NOW - delta)


@pytest.mark.parametrize(
    ("pod", "kind"),
    [
        # One crash in a row (kubelet back-off 10s): early.
        (pods.pod(containers=[pods.crash_looping(restarts=1)]), "early"),
        (pods.pod(containers=[pods.crash_looping(restarts=2)]), "early"),
        # At the threshold the full rules speak: node-fixable, not early.
        (pods.pod(containers=[pods.crash_looping(restarts=3)]), "node-fixable"),
        # A pull the node's network failed, seen 2 s after the kubelet's first attempt (the
        # full rules wait 30 s), and the same pull 40 s on.
        (pulling_since(timedelta(seconds=2)), "early"),
        (pulling_since(timedelta(seconds=40)), "node-fixable"),
    ],
    ids=["one-crash", "two-crashes", "threshold", "pull-timeout-at-once", "pull-timeout-40s"],
)
def test_a_first_failure_is_reported_early_and_the_threshold_as_before(pod: Any, kind: str) -> None:
    data = reported(pod)
    assert data is not None and data["kind"] == kind


@pytest.mark.parametrize(
    "pod",
    [
        # Killed at its own memory limit: the application's doing, never early.
        pods.pod(
            containers=[pods.crash_looping(restarts=1, last_reason="OOMKilled", exit_code=137)]
        ),
        # Failures no node can fix stay unreported.
        pods.pod(
            phase="Pending",
            containers=[pods.waiting("ErrImagePull", "registry.example.com/shop/web:9: not found")],
        ),
        pods.pod(containers=[pods.running()]),
        # One crash: its first exit, before the kubelet restarts it at once, and the same
        # container running again after it. Neither is ever reported.
        pods.pod(containers=[pods.terminated("Error", 1)]),
        pods.pod(
            containers=[pods.running(restarts=1, last=pods.last_terminated("Error", 1, attempt=0))]
        ),
    ],
    ids=["oom-at-own-limit", "image-not-found", "running", "first-exit", "running-after-a-crash"],
)
def test_what_is_not_a_node_fixable_failure_is_not_reported_early(pod: Any) -> None:
    assert reported(pod) is None


def test_with_both_fast_paths_off_a_first_failure_is_not_reported() -> None:
    pod = pods.pod(containers=[pods.crash_looping(restarts=1)])
    assert reported(pod, Config(suspect_fast_path=False)) is not None  # corroboration reads it
    off = Config(suspect_fast_path=False, corroborated_fast_path=False)
    assert reported(pod, off) is None


def test_the_rules_at_first_sight_change_only_the_two_thresholds() -> None:
    early = early_config(Config(reset_after=timedelta(minutes=5)))
    assert (early.crashloop_restart_threshold, early.waiting_failure_after) == (1, timedelta(0))
    assert early.reset_after == timedelta(minutes=5)


@pytest.mark.parametrize(
    ("labels", "suspect"),
    [({SUSPECT_LABEL: "true"}, True), ({SUSPECT_LABEL: "false"}, False), ({}, False)],
)
def test_a_node_is_suspect_when_it_carries_the_label_assess_nodes_sets(
    labels: dict[str, str], suspect: bool
) -> None:
    assert is_suspect(nodes.node(labels=labels)) is suspect


@pytest.mark.parametrize(
    ("restarts", "kind"), [(1, "early"), (3, "node-fixable")], ids=["fast-path", "threshold"]
)
def test_the_reply_after_a_move_says_whether_it_was_a_fast_path_move(
    restarts: int, kind: str
) -> None:
    # assess-nodes reads it: a fast-path move is no evidence against the node (test_node_blame).
    pod = pods.pod(containers=[pods.crash_looping(restarts=restarts)])
    _, data = reply_after_move(pod)
    assert data["kind"] == kind
