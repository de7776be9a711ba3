"""One opt-out rule for Nodes, whichever function reads it.

`kn-rescheduler.io/ignore` on a Node opts it out by its presence, whatever its value, exactly as
on a pod (the webhook's objectSelector is `DoesNotExist` on the key). Before this rule was one
helper, node blame and pressure labels read presence while annotate-usage and rebalance-nodes
honoured only the value "true": a Node labelled `kn-rescheduler.io/ignore=` or `=yes` was left
alone by two functions and annotated and rebalanced by the other two.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shared.api.keys import LOAD_LABEL, NODE_OPT_OUT_LABEL, USAGE_ANNOTATION, opted_out
from shared.api.usage import Estimate, Reading, UsageRecord
from shared.nodes.annotate_usage.decide import Measured, decide_node
from shared.nodes.assess_nodes.decide import NodeFacts
from shared.nodes.rebalance_nodes.decide import assess
from shared.nodes.usage import allocatable
from shared.platform.config import Config
from tests.unit.nodes import node

NOW = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
CFG = Config()
VALUES = ["", "true", "yes", "false"]


def usage(cpu: float) -> str:
    reading = Reading(now=cpu, avg5m=cpu, max1h=cpu)
    return UsageRecord(NOW, "prometheus", reading, reading, Estimate()).to_json()


@pytest.mark.parametrize("value", VALUES)
def test_the_label_opts_a_node_out_whatever_its_value(value: str) -> None:
    assert opted_out({NODE_OPT_OUT_LABEL: value})
    assert not opted_out({"app": "x"})
    assert not opted_out(None)


@pytest.mark.parametrize("value", VALUES)
def test_annotate_usage_leaves_an_opted_out_node_without_a_record(value: str) -> None:
    n = node("node-1", labels={NODE_OPT_OUT_LABEL: value})
    measured = Measured(cpu_cores=2.0, memory_bytes=1024**3)
    decision = decide_node(n, measured, allocatable(n), Estimate(), "prometheus", CFG, NOW)
    assert not decision.write
    assert decision.bucket is None


@pytest.mark.parametrize("value", VALUES)
def test_rebalance_never_acts_on_nor_averages_an_opted_out_node(value: str) -> None:
    hot = node(
        "node-a",
        labels={NODE_OPT_OUT_LABEL: value, LOAD_LABEL: "overloaded"},
        annotations={USAGE_ANNOTATION: usage(95.0)},
    )
    cool = node("node-b", annotations={USAGE_ANNOTATION: usage(20.0)})
    states, bounds = assess([hot, cool], CFG, NOW)
    assert bounds.mean_cpu == 20.0
    assert [s.name for s in states if s.opted_out] == ["node-a"]


@pytest.mark.parametrize("value", VALUES)
def test_node_blame_reads_the_same_rule(value: str) -> None:
    assert NodeFacts.from_node(node("node-1", labels={NODE_OPT_OUT_LABEL: value})).opted_out
