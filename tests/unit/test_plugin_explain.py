"""``kubectl kn-rescheduler explain`` gives the functions' verdicts on pods real kubelets wrote.

The pods and Events of tests/fixtures/real-kubelet/ (kubelet v1.36.3, containerd 1.6, recorded
by ``python -m dev.tools.record_real_kubelet``) are judged by the plugin at the four moments of
tests/unit/test_real_kubelet_statuses.py, whose table pins what detect-failures and the sweep
decide there: the plugin must give that table. Each pod is stamped opted in as admission stamps
it (the recordings are of pods nobody opted in), and the sweep's Events are the recorded ones
renewed as the kubelet renews them while a pod keeps failing, as that table's sweep reads them.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest

from kubectl_kn_rescheduler import explain
from shared.api.keys import OPTED_IN_LABEL, OPTED_IN_VALUE, POLICY_STAMP_ANNOTATION
from shared.api.kubetypes import Pod
from shared.api.times import format_time, parse_kube_time
from shared.workloads.classify import FailureKind
from tests.unit.test_real_kubelet_statuses import (
    CFG,
    EXPECTED,
    HOUR_LATER,
    LATER,
    Expected,
    Outcome,
    load,
    pod_of,
    recorded_at,
)


def stamped(scenario: str) -> Pod:
    """The recorded pod as admission stamps an opted-in one: the policy and the label the
    ApiServerSource selects on."""
    pod = pod_of(scenario)
    pod["metadata"].setdefault("annotations", {})[POLICY_STAMP_ANNOTATION] = "3"  # type: ignore[typeddict-item]
    pod["metadata"].setdefault("labels", {})[OPTED_IN_LABEL] = OPTED_IN_VALUE  # type: ignore[typeddict-item]
    return pod


def renewed(scenario: str, now: Any) -> list[dict[str, Any]]:
    """The recorded Events, each Warning's last time brought to a minute before ``now``."""
    out = []
    for event in copy.deepcopy(load(scenario)["events"]):
        if event.get("type") == "Warning":
            last = parse_kube_time(event.get("lastTimestamp")) or parse_kube_time(
                event.get("eventTime")
            )
            if last is not None:
                event["lastTimestamp"] = format_time(max(last, now - timedelta(minutes=1)))
        out.append(event)
    return out


def full(verdict: explain.Verdict) -> Outcome:
    """The verdict as the table states it: a full failure, or none (an early report of a first
    failure is acted on only with evidence beside the pod, which the table does not judge)."""
    if verdict.failing is None or verdict.failing.failure.kind is FailureKind.EARLY:
        return None
    return (verdict.failing.failure.kind, verdict.failing.failure.reason)


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_explain_gives_the_functions_verdicts_on_a_real_kubelets_pod(scenario: str) -> None:
    start = recorded_at(scenario)

    def at(moment: Any) -> tuple[explain.Verdict, explain.Verdict]:
        return explain.judge(
            stamped(scenario), CFG, moment, kubelet_events=renewed(scenario, moment)
        )

    now, later, hour = at(start), at(start + LATER), at(start + HOUR_LATER)
    said = Expected(full(now[0]), full(later[0]), full(later[1]), full(hour[1]))
    assert said == EXPECTED[scenario]
    for verdict in (*now, *later, *hour):
        assert verdict.function in ("detect-failures", "sweep-failures")
        assert verdict.why
        assert verdict.rule in explain.HEADINGS


def test_a_crash_loop_is_reported_with_the_waiting_rule_and_the_kubelets_words() -> None:
    detected, swept = explain.judge(stamped("crashloop"), CFG, recorded_at("crashloop"))
    assert detected.reason == swept.reason == "CrashLoopBackOff"
    assert detected.rule == explain.WAITING
    assert "CrashLoopBackOff after" in detected.why


def test_an_eviction_is_reported_with_the_pod_failed_rule() -> None:
    detected, _ = explain.judge(
        stamped("evicted-disk-pressure"), CFG, recorded_at("evicted-disk-pressure")
    )
    assert (detected.reason, detected.rule) == ("Evicted", explain.POD_FAILED)


def test_a_pod_nobody_opted_in_is_said_so_by_both() -> None:
    pod = pod_of("crashloop")
    verdicts = explain.judge(pod, CFG, recorded_at("crashloop"))
    for verdict in verdicts:
        assert verdict.failing is None
        assert verdict.why.startswith("not opted in")
        assert verdict.rule == explain.NEVER_MOVED


def test_a_pod_with_moves_turned_off_is_said_so() -> None:
    pod = stamped("crashloop")
    pod["metadata"]["annotations"][POLICY_STAMP_ANNOTATION] = "0"  # type: ignore[typeddict-item]
    detected, _ = explain.judge(pod, CFG, recorded_at("crashloop"))
    assert detected.failing is None and "moves turned off" in detected.why


def test_a_healthy_pod_says_what_it_shows() -> None:
    pod = stamped("runtime-stopped")
    detected, swept = explain.judge(pod, CFG, recorded_at("runtime-stopped"))
    assert detected.failing is None and swept.failing is None
    assert detected.why.startswith("no failure the rules count yet: phase Running")
    assert detected.rule == explain.REPEATED


def test_a_stuck_sandbox_is_the_sweeps_and_names_the_stuck_rule() -> None:
    start = recorded_at("sandbox-cni-broken") + HOUR_LATER
    _, swept = explain.judge(
        stamped("sandbox-cni-broken"),
        CFG,
        start,
        kubelet_events=renewed("sandbox-cni-broken", start),
    )
    assert swept.failing is not None and swept.rule == explain.STUCK


def test_a_stamped_pod_without_the_opted_in_label_is_left_to_the_sweep() -> None:
    # Created before admission stamped the label, or the label taken off: the ApiServerSource
    # selects on it, so detect-failures never hears of the pod; the sweep lists every pod.
    pod = stamped("crashloop")
    del pod["metadata"]["labels"][OPTED_IN_LABEL]  # type: ignore[typeddict-item]
    detected, swept = explain.judge(pod, CFG, recorded_at("crashloop"))
    assert detected.failing is None and detected.why.startswith("no event of this pod reaches it")
    assert (detected.doc, detected.rule) == (explain.OPT_IN, explain.OPTED_IN_SECTION)
    assert swept.reason == "CrashLoopBackOff"


def test_a_neighbour_on_the_node_is_given_to_the_sweep_once() -> None:
    pod = stamped("crashloop")
    twice = explain.judge(pod, CFG, recorded_at("crashloop"), siblings=[pod], neighbours=[pod])
    assert twice[1].reason == "CrashLoopBackOff"
