"""annotate-usage's PreBind-style warning: which bindings it says got past the predicted limit.

Pods as the scheduler's binding leaves them (a PodScheduled=True condition with its transition
time, tests/unit/test_usage_record.py's ``bound_at``), records as annotate-usage writes them.
The lookalikes: a pod bound before the last evaluation, a node hot by its measured usage
alone (the pod made no difference but was still placed there), a DaemonSet's or a
system-critical pod, a finished or terminating pod, another node's pod, and a node just under
the limit.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from shared.api.usage import Estimate, Reading, UsageRecord
from shared.nodes.annotate_usage.decide import bindings_over_limit
from shared.platform.config import Config
from tests.unit.test_usage_record import SAMPLED, bound_at

CFG = Config()  # predicted_usage_limit 95
SINCE = SAMPLED - timedelta(seconds=30)  # the previous evaluation


def record(cpu: float, memory: float = 40.0, estimate_cpu: float = 0.0) -> UsageRecord:
    return UsageRecord(
        SAMPLED,
        "prometheus",
        Reading(now=cpu),
        Reading(now=memory),
        Estimate(cpu=estimate_cpu, pods=1 if estimate_cpu else 0),
    )


def fresh(**kwargs: Any) -> Any:
    return bound_at(SAMPLED - timedelta(seconds=10), **kwargs)


def test_a_pod_bound_since_the_last_evaluation_to_a_node_over_the_limit_is_said() -> None:
    # 90 % measured, 7 % the pods bound lately (this one among them): 97 % predicted.
    (said,) = bindings_over_limit("node-b", record(90.0, estimate_cpu=7.0), [fresh()], SINCE, CFG)
    assert (said.namespace, said.name, said.node) == ("shop", "web-7d9c8b6f4-x2x9z", "node-b")
    assert said.over == (("CPU", 97.0),)
    assert "(measured, plus the requests of the pods bound there lately) is CPU 97.0%" in (
        said.message
    )
    assert "over the limit of 95% (predicted_usage_limit)" in said.message


def test_both_resources_over_are_both_said() -> None:
    (said,) = bindings_over_limit("node-b", record(96.0, memory=99.0), [fresh()], SINCE, CFG)
    assert [resource for resource, _ in said.over] == ["CPU", "memory"]


@pytest.mark.parametrize(
    ("usage", "pod"),
    [
        pytest.param(record(90.0, estimate_cpu=5.0), fresh(), id="exactly at the limit"),
        pytest.param(record(60.0), fresh(), id="a cool node"),
        pytest.param(
            record(99.0),
            bound_at(SINCE - timedelta(seconds=1)),
            id="bound before the last evaluation: judged then",
        ),
        pytest.param(record(99.0), bound_at(None), id="no PodScheduled condition"),
        pytest.param(
            record(99.0),
            bound_at(SAMPLED + timedelta(days=1)),
            id="a binding time someone wrote in the future",
        ),
        pytest.param(record(99.0), fresh(phase="Succeeded"), id="finished"),
        pytest.param(record(99.0), fresh(deleting=True), id="terminating"),
        pytest.param(record(99.0), fresh(node="node-c"), id="another node's pod"),
        pytest.param(
            record(99.0), fresh(owner=("DaemonSet", "agents")), id="a DaemonSet's pod belongs there"
        ),
        pytest.param(
            record(99.0), fresh(namespace="kube-system"), id="an excluded namespace's pod"
        ),
        pytest.param(
            record(99.0),
            fresh(labels={"kn-rescheduler.io/ignore": ""}),
            id="an opted-out pod",
        ),
    ],
)
def test_what_is_not_said(usage: UsageRecord, pod: Any) -> None:
    assert bindings_over_limit("node-b", usage, [pod], SINCE, CFG) == ()


def test_a_system_critical_pod_is_not_said() -> None:
    pod = fresh()
    pod["spec"]["priorityClassName"] = "system-node-critical"
    assert bindings_over_limit("node-b", record(99.0), [pod], SINCE, CFG) == ()


def test_the_limit_is_the_installed_one() -> None:
    strict = Config.from_env({"KN_RESCHEDULER_PREDICTED_USAGE_LIMIT": "90"})
    assert bindings_over_limit("node-b", record(91.0), [fresh()], SINCE, strict)
    assert not bindings_over_limit("node-b", record(91.0), [fresh()], SINCE, CFG)


def test_a_pod_bound_in_the_same_second_as_the_last_evaluation_is_not_lost() -> None:
    # The evaluation ran at 10:00:00.700; the binding's time says 10:00:00 (whole seconds).
    since = SAMPLED.replace(microsecond=700_000)
    pod = bound_at(SAMPLED)
    assert bindings_over_limit("node-b", record(99.0), [pod], since, CFG)
