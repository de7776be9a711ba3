"""Which nodes carry the pressure label after an evaluation, and which Nodes are written.

Each test runs the pure decision over nodes shaped as label-nodes reads them (label, record,
opt-out, cordon), feeding each decision's outcome back in as the next evaluation's input,
exactly as the Node objects would carry it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from shared.api.keys import PRESSURE_ANNOTATION
from shared.api.pressure import Record
from shared.api.records import RecordError
from shared.nodes.label_nodes.decide import (
    Action,
    Decision,
    NodeView,
    Observations,
    decide,
    hands_off,
)
from shared.nodes.label_nodes.handler import node_patch, node_view
from shared.nodes.label_nodes.rules import Fires, Rule
from shared.platform.config import Config
from tests.unit.nodes import node

NOW = datetime(2026, 11, 23, 15, 0, 0, tzinfo=UTC)
CPU = Rule(
    "cpu-usage",
    '100 * (1 - avg by (node, instance) (rate(node_cpu_seconds_total{mode="idle"}[2m])))',
    threshold=70,
    clear=60,
)
MEMORY_LEFT = Rule(
    "memory-available",
    "node_memory_MemAvailable_bytes",
    threshold=512 * 2**20,
    clear=768 * 2**20,
    fires=Fires.BELOW,
)
SUSTAINED = Rule("cpu-sustained", CPU.expr, threshold=70, clear=60, for_=timedelta(minutes=1))
# Every node may be labelled, so that the cap stays out of the way unless a test wants it.
ROOMY = Config(pressure_max_share=1.0, pressure_stale_after=timedelta(minutes=5))
NODES = ("node-a", "node-b", "node-c", "node-d")


def fresh(*names: str) -> list[NodeView]:
    return [NodeView(name, labelled=False) for name in names or NODES]


def observed(rule: Rule = CPU, **values: float) -> Observations:
    """One rule answered with these values (node_a -> node-a)."""
    return Observations({rule.name: {k.replace("_", "-"): v for k, v in values.items()}})


def down(*rules: Rule, error: str = "Prometheus unreachable: refused") -> Observations:
    return Observations({}, {rule.name: error for rule in rules})


def after(views: Sequence[NodeView], decision: Decision) -> list[NodeView]:
    """The nodes as the next evaluation reads them: with what this decision wrote."""
    out = {d.node: d for d in decision.nodes}
    return [
        replace(
            v,
            labelled=out[v.name].labelled,
            record=out[v.name].record,
            annotated=out[v.name].record is not None,
        )
        for v in views
    ]


def run(
    views: list[NodeView],
    series: Iterable[tuple[datetime, Observations]],
    rules: Sequence[Rule] = (CPU,),
    config: Config = ROOMY,
) -> list[Decision]:
    decisions = []
    for at, seen in series:
        decision = decide(views, rules, seen, at, config)
        decisions.append(decision)
        views = after(views, decision)
    return decisions


def labelled(decision: Decision) -> set[str]:
    return {d.node for d in decision.labelled}


def by_node(decision: Decision) -> Mapping[str, object]:
    return {d.node: d for d in decision.nodes}


def test_a_node_over_a_threshold_is_labelled_with_the_rule_value_and_time() -> None:
    decision = decide(fresh(), [CPU], observed(node_a=93.4, node_b=20, node_c=40), NOW, ROOMY)
    (change,) = decision.changes
    assert change.node == "node-a"
    assert change.action is Action.LABEL
    assert change.record == Record(rule="cpu-usage", value=93.4, since=NOW, seen=NOW)
    assert "cpu-usage = 93.4 > 70" in change.reason


def test_nothing_over_any_threshold_writes_nothing() -> None:
    decision = decide(fresh(), [CPU], observed(node_a=69.9, node_b=20), NOW, ROOMY)
    assert decision.changes == ()
    assert {d.action for d in decision.nodes} == {Action.NONE}


def test_a_rule_that_fires_below_labels_a_node_with_too_little_memory_left() -> None:
    decision = decide(
        fresh(),
        [CPU, MEMORY_LEFT],
        Observations(
            {
                "cpu-usage": {"node-a": 10, "node-b": 10},
                "memory-available": {"node-a": 200 * 2**20, "node-b": 3 * 2**30},
            }
        ),
        NOW,
        ROOMY,
    )
    assert labelled(decision) == {"node-a"}
    assert decision.changes[0].record is not None
    assert decision.changes[0].record.rule == "memory-available"


# A value oscillating around the threshold (70), every 30 s.
OSCILLATING = (75, 68, 72, 66, 71, 64, 73, 59, 65, 69, 71)


@pytest.mark.parametrize(
    ("rule", "expected", "label_changes"),
    [
        # Clears at 60: labelled at 75, kept through every dip above 60, cleared at 59,
        # labelled again only when the threshold is crossed again (71).
        (CPU, [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1], 3),
        # No hysteresis (clear = threshold): the label follows every swing.
        (replace(CPU, clear=70), [1, 0, 1, 0, 1, 0, 1, 0, 0, 0, 1], 9),
    ],
)
def test_hysteresis_keeps_a_value_oscillating_around_the_threshold_from_flapping_the_label(
    rule: Rule, expected: list[int], label_changes: int
) -> None:
    series = [
        (NOW + timedelta(seconds=30 * i), observed(rule, node_a=v))
        for i, v in enumerate(OSCILLATING)
    ]
    decisions = run(fresh(), series, [rule])
    assert [int("node-a" in labelled(d)) for d in decisions] == expected
    flips = sum(
        1 for d in decisions for c in d.changes if c.action in (Action.LABEL, Action.UNLABEL)
    )
    assert flips == label_changes


def test_a_kept_label_says_which_rule_still_holds_it() -> None:
    views = after(fresh(), decide(fresh(), [CPU], observed(node_a=80), NOW, ROOMY))
    decision = decide(views, [CPU], observed(node_a=65), NOW + timedelta(seconds=30), ROOMY)
    kept = by_node(decision)["node-a"]
    assert kept.action is Action.KEEP  # type: ignore[attr-defined]
    assert "cpu-usage = 65, not back past its clear threshold 60" in kept.reason  # type: ignore[attr-defined]


def test_with_for_a_node_is_labelled_only_once_over_the_threshold_that_long() -> None:
    at = [NOW + timedelta(seconds=s) for s in (0, 30, 60, 90)]
    decisions = run(fresh("node-a"), [(t, observed(SUSTAINED, node_a=85)) for t in at], [SUSTAINED])
    assert [labelled(d) for d in decisions] == [set(), set(), {"node-a"}, {"node-a"}]
    # The first evaluation wrote the start of the timer; the second had nothing to write.
    first, second, third, fourth = (by_node(d)["node-a"] for d in decisions)
    assert first.record == Record(pending={"cpu-sustained": NOW})  # type: ignore[attr-defined]
    assert first.changed and not second.changed  # type: ignore[attr-defined]
    assert third.action is Action.LABEL and "since 2026-11-23T15:00:00Z" in third.reason  # type: ignore[attr-defined]
    assert not fourth.changed  # type: ignore[attr-defined]


def test_with_for_a_dip_under_the_threshold_restarts_the_timer() -> None:
    values = (85, 85, 50, 85, 85, 85)
    series = [
        (NOW + timedelta(seconds=30 * i), observed(SUSTAINED, node_a=v))
        for i, v in enumerate(values)
    ]
    decisions = run(fresh("node-a"), series, [SUSTAINED])
    assert [int(bool(labelled(d))) for d in decisions] == [0, 0, 0, 0, 0, 1]
    assert by_node(decisions[2])["node-a"].record is None  # type: ignore[attr-defined]


def test_with_for_a_gap_in_the_data_neither_labels_nor_resets_the_timer() -> None:
    series = [
        (NOW, observed(SUSTAINED, node_a=85)),
        (NOW + timedelta(seconds=30), down(SUSTAINED)),
        (NOW + timedelta(seconds=60), down(SUSTAINED)),
        (NOW + timedelta(seconds=90), observed(SUSTAINED, node_a=85)),
    ]
    decisions = run(fresh("node-a"), series, [SUSTAINED])
    assert [bool(labelled(d)) for d in decisions] == [False, False, False, True]
    assert [bool(d.changes) for d in decisions] == [True, False, False, True]


@pytest.mark.parametrize(
    ("share", "nodes", "cap"),
    [(0.3, 4, 1), (0.3, 10, 3), (0.5, 4, 2), (0.3, 3, 0), (1.0, 4, 4)],
)
def test_the_cap_is_the_share_of_schedulable_nodes_rounded_down(
    share: float, nodes: int, cap: int
) -> None:
    views = fresh(*(f"n{i}" for i in range(nodes)))
    seen = observed(**{f"n{i}": 99.0 for i in range(nodes)})
    decision = decide(views, [CPU], seen, NOW, Config(pressure_max_share=share))
    assert decision.cap == cap
    assert len(decision.labelled) == cap


def test_over_the_cap_only_the_worst_nodes_are_labelled_and_the_others_say_why() -> None:
    config = Config(pressure_max_share=0.3)
    decision = decide(
        fresh(), [CPU], observed(node_a=75, node_b=98, node_c=85, node_d=10), NOW, config
    )
    assert labelled(decision) == {"node-b"}
    assert {d.node for d in decision.capped} == {"node-a", "node-c"}
    capped = by_node(decision)["node-c"]
    assert "at most 1 node(s) may be labelled" in capped.reason  # type: ignore[attr-defined]
    assert not capped.changed  # type: ignore[attr-defined]


def test_at_the_cap_a_labelled_node_still_past_its_threshold_keeps_the_label() -> None:
    config = Config(pressure_max_share=0.3)
    decisions = run(
        fresh(),
        [(NOW, observed(node_a=80)), (NOW + timedelta(seconds=30), observed(node_a=80, node_b=99))],
        config=config,
    )
    assert labelled(decisions[0]) == {"node-a"}
    # node-b is worse, but node-a is still over 70: moving the label would be a write now and
    # another when they swap back; node-b waits, and says why.
    assert labelled(decisions[1]) == {"node-a"}
    assert decisions[1].changes == ()
    waiting = by_node(decisions[1])["node-b"]
    assert waiting.capped  # type: ignore[attr-defined]
    assert "at most 1 node(s) may be labelled" in waiting.reason  # type: ignore[attr-defined]


def test_at_the_cap_a_label_only_hysteresis_holds_gives_way_to_a_node_past_its_threshold() -> None:
    config = Config(pressure_max_share=0.3)
    decisions = run(
        fresh(),
        [(NOW, observed(node_a=80)), (NOW + timedelta(seconds=30), observed(node_a=65, node_b=99))],
        config=config,
    )
    assert labelled(decisions[1]) == {"node-b"}
    assert by_node(decisions[1])["node-a"].action is Action.UNLABEL  # type: ignore[attr-defined]


def writes_at_the_cap(share: float) -> tuple[list[Decision], int]:
    """Eight evaluations 30 s apart of four nodes at 80-83 % CPU, the worst a different node
    each time (each node's reading moves by a point or two between scrapes)."""
    series = [
        (
            NOW + timedelta(seconds=30 * i),
            observed(
                **{name.replace("-", "_"): 80.0 + (i + j) % 4 for j, name in enumerate(NODES)}
            ),
        )
        for i in range(8)
    ]
    decisions = run(fresh(), series, config=Config(pressure_max_share=share))
    return decisions, sum(len(d.changes) for d in decisions)


@pytest.mark.parametrize("share", [0.3, 0.5, 0.75])
def test_at_the_cap_nodes_that_all_qualify_do_not_pass_the_label_around(share: float) -> None:
    decisions, writes = writes_at_the_cap(share)
    cap = decisions[0].cap
    assert 0 < cap < len(NODES)
    # The same nodes hold the label from the first evaluation to the last.
    assert len({frozenset(labelled(d)) for d in decisions}) == 1
    assert len(labelled(decisions[0])) == cap
    actions = [c.action for d in decisions for c in d.changes]
    # One label per slot; every other write renews a record (once `seen` is 75 s old).
    assert actions.count(Action.LABEL) == cap
    assert set(actions) <= {Action.LABEL, Action.KEEP}
    assert writes <= 3 * cap


def test_cordoned_nodes_do_not_count_as_schedulable_for_the_cap() -> None:
    views = fresh("a", "b", "c", "d", "e", "f", "g")
    views = [replace(v, schedulable=v.name not in ("e", "f", "g")) for v in views]
    decision = decide(views, [CPU], observed(a=99, b=98, c=97), NOW, Config(pressure_max_share=0.5))
    assert decision.cap == 2
    assert labelled(decision) == {"a", "b"}


def test_an_opted_out_node_is_never_labelled_and_loses_a_label_it_had() -> None:
    views = [
        NodeView("node-a", labelled=False, opted_out=True),
        NodeView(
            "node-b",
            labelled=True,
            opted_out=True,
            annotated=True,
            record=Record(rule="cpu-usage", value=90, since=NOW, seen=NOW),
        ),
    ]
    decision = decide(views, [CPU], observed(node_a=99, node_b=99), NOW, ROOMY)
    assert labelled(decision) == set()
    a, b = decision.nodes
    assert not a.changed and "opted out" in a.reason
    assert b.action is Action.UNLABEL and b.record is None and b.changed


def labelled_at(seen: datetime, value: float = 90.0) -> NodeView:
    return NodeView(
        "node-a",
        labelled=True,
        annotated=True,
        record=Record(rule="cpu-usage", value=value, since=seen, seen=seen),
    )


@pytest.mark.parametrize(
    ("last_confirmed", "kept"),
    [
        (timedelta(seconds=30), True),
        (timedelta(minutes=4, seconds=59), True),
        (timedelta(minutes=5), True),
        (timedelta(minutes=5, seconds=1), False),
        (timedelta(hours=2), False),
    ],
)
def test_with_prometheus_down_labels_stay_until_stale_then_go(
    last_confirmed: timedelta, kept: bool
) -> None:
    decision = decide([labelled_at(NOW - last_confirmed)], [CPU], down(CPU), NOW, ROOMY)
    (outcome,) = decision.nodes
    assert outcome.labelled is kept
    # Kept through an outage costs no write; removal writes label and record away.
    assert outcome.changed is not kept
    if kept:
        assert "no data (cpu-usage: Prometheus unreachable: refused); kept until" in outcome.reason
    else:
        assert outcome.reason.startswith("stale: not confirmed since")
        assert outcome.record is None


def test_with_prometheus_down_nothing_new_is_labelled() -> None:
    decision = decide(fresh(), [CPU], down(CPU), NOW, ROOMY)
    assert decision.changes == ()


def test_a_node_whose_series_vanished_keeps_its_label_until_stale_while_others_clear() -> None:
    views = [
        labelled_at(NOW - timedelta(minutes=1)),
        replace(labelled_at(NOW - timedelta(minutes=1)), name="node-b"),
    ]
    # Prometheus answers, node-b is back to normal, node-a's exporter is gone.
    decision = decide(views, [CPU], observed(node_b=20), NOW, ROOMY)
    a, b = decision.nodes
    assert a.labelled and not a.changed and "no rule has a value for this node" in a.reason
    assert b.action is Action.UNLABEL and "every rule is back past its clear threshold" in b.reason
    later = decide(views[:1], [CPU], observed(node_b=20), NOW + timedelta(minutes=5), ROOMY)
    assert later.nodes[0].action is Action.UNLABEL


def test_one_rule_failing_keeps_a_label_the_others_no_longer_hold_until_stale() -> None:
    seen = Observations({"cpu-usage": {"node-a": 20}}, {"memory-available": "query failed: x"})
    decision = decide(
        [labelled_at(NOW - timedelta(minutes=1))], [CPU, MEMORY_LEFT], seen, NOW, ROOMY
    )
    assert decision.nodes[0].labelled and not decision.nodes[0].changed


def test_an_unchanged_node_is_not_written_and_its_record_is_renewed_only_when_getting_old() -> None:
    # pressure_stale_after 5m: `seen` is renewed once older than 1m15s.
    recent = decide(
        [labelled_at(NOW - timedelta(minutes=1))], [CPU], observed(node_a=91), NOW, ROOMY
    )
    assert not recent.nodes[0].changed
    old = decide([labelled_at(NOW - timedelta(minutes=2))], [CPU], observed(node_a=91), NOW, ROOMY)
    (renewed,) = old.changes
    assert renewed.action is Action.KEEP
    assert renewed.record == Record(
        rule="cpu-usage", value=91, since=NOW - timedelta(minutes=2), seen=NOW
    )


# --- the label key when the value is not ours ---------------------------------------------------
# The key `status` is a common word: an operator's `status=maintenance` on a node, or our value
# written by hand (or by a dynamicScheduler still running), is not ours to overwrite or delete.


def foreign(value: str, record: Record | None = None) -> NodeView:
    return NodeView(
        "node-a", labelled=False, foreign=value, record=record, annotated=record is not None
    )


OUR_RECORD = Record(rule="cpu-usage", value=90, since=NOW, seen=NOW)


@pytest.mark.parametrize("value", [93.0, 65.0, 20.0])
def test_a_node_whose_status_is_someone_elses_is_left_alone_whatever_its_usage(
    value: float,
) -> None:
    (outcome,) = decide([foreign("maintenance")], [CPU], observed(node_a=value), NOW, ROOMY).nodes
    assert outcome.action is Action.HANDS_OFF
    assert not outcome.changed and not outcome.labelled
    assert "someone else's value 'maintenance'" in outcome.reason


def test_with_a_for_rule_a_node_whose_status_is_someone_elses_gets_no_timer() -> None:
    (outcome,) = decide(
        [foreign("maintenance")], [SUSTAINED], observed(SUSTAINED, node_a=95), NOW, ROOMY
    ).nodes
    assert outcome.action is Action.HANDS_OFF and not outcome.changed


def test_our_record_on_a_node_whose_status_someone_changed_is_dropped_and_the_label_kept() -> None:
    # We labelled it; an operator has since written status=maintenance over our value.
    (outcome,) = decide(
        [foreign("maintenance", OUR_RECORD)], [CPU], observed(node_a=20), NOW, ROOMY
    ).nodes
    assert outcome.action is Action.HANDS_OFF
    assert outcome.changed and outcome.record is None


def test_our_value_without_our_record_is_neither_taken_over_nor_removed() -> None:
    # status=presure written by hand (or by dynamicScheduler), or our record deleted: nothing
    # says we put it there, so we do not take it away.
    by_hand = NodeView("node-a", labelled=True)
    for seen in (observed(node_a=95), observed(node_a=65), observed(node_a=20), down(CPU)):
        (outcome,) = decide([by_hand], [CPU], seen, NOW, ROOMY).nodes
        assert outcome.action is Action.HANDS_OFF
        assert outcome.labelled and not outcome.changed and outcome.record is None
        assert "no record of ours" in outcome.reason


def test_our_value_with_only_a_pending_record_is_not_ours_either() -> None:
    pending = Record(pending={"cpu-sustained": NOW})
    view = NodeView("node-a", labelled=True, record=pending, annotated=True)
    (outcome,) = decide([view], [SUSTAINED], observed(SUSTAINED, node_a=20), NOW, ROOMY).nodes
    assert outcome.action is Action.HANDS_OFF
    # Our annotation goes (it is ours); the label stays.
    assert outcome.changed and outcome.record is None and outcome.labelled


def test_an_opted_out_node_whose_status_is_someone_elses_is_left_alone() -> None:
    view = replace(foreign("maintenance"), opted_out=True)
    (outcome,) = decide([view], [CPU], observed(node_a=95), NOW, ROOMY).nodes
    assert outcome.action is Action.HANDS_OFF and not outcome.changed


def test_our_value_put_there_by_someone_else_counts_against_the_cap() -> None:
    # The webhook steers pods away from every node with status=presure, ours or not.
    views = [NodeView("node-a", labelled=True), *fresh("node-b", "node-c", "node-d")]
    decision = decide(
        views, [CPU], observed(node_b=99, node_c=20, node_d=20), NOW, Config(pressure_max_share=0.3)
    )
    assert decision.cap == 1
    assert labelled(decision) == {"node-a"}
    assert by_node(decision)["node-b"].capped  # type: ignore[attr-defined]


def test_an_unreadable_record_is_replaced() -> None:
    broken = NodeView("node-a", labelled=False, annotated=True, record=None)
    (change,) = decide([broken], [CPU], observed(node_a=20), NOW, ROOMY).changes
    assert change.record is None and change.action is Action.NONE


@pytest.mark.parametrize(
    "record",
    [
        Record(rule="cpu-usage", value=93.4, since=NOW, seen=NOW + timedelta(seconds=45)),
        Record(pending={"cpu-sustained": NOW, "memory-available": NOW}),
        Record(rule="memory-available", value=5.36870912e8, since=NOW, seen=NOW),
    ],
)
def test_a_record_reads_back_as_written(record: Record) -> None:
    assert Record.from_json(record.to_json()) == record


def test_a_record_looks_like_what_people_read_on_the_node() -> None:
    record = Record(rule="cpu-usage", value=93.4, since=NOW, seen=NOW)
    assert record.to_json() == (
        '{"v":1,"rule":"cpu-usage","value":93.4,"since":"2026-11-23T15:00:00Z",'
        '"seen":"2026-11-23T15:00:00Z"}'
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "nope",
        "[]",
        '{"v":2}',
        '{"v":1,"since":"yesterday"}',
        '{"v":1,"pending":[1]}',
        '{"v":1,"seen":"2026-11-23T15:00:00"}',
        '{"v":1,"value":"lots"}',
    ],
)
def test_a_record_we_cannot_read_is_refused(text: str) -> None:
    with pytest.raises(RecordError):
        Record.from_json(text)


# --- what label-nodes reads from a Node and the patch it sends -------------------------------


def test_a_node_is_read_as_ours_free_or_someone_elses_by_its_status_value() -> None:
    ours = node_view(
        node(labels={"status": "presure"}, annotations={PRESSURE_ANNOTATION: OUR_RECORD.to_json()})
    )
    assert ours.labelled and ours.foreign is None and ours.record == OUR_RECORD
    assert not hands_off(ours)
    free = node_view(node())
    assert not free.labelled and free.foreign is None and not hands_off(free)
    theirs = node_view(node(labels={"status": "maintenance"}))
    assert not theirs.labelled and theirs.foreign == "maintenance"
    # An empty value is a value too (`kubectl label node x status=` writes one).
    assert node_view(node(labels={"status": ""})).foreign == ""


def decision_for(view: NodeView, seen: Observations, rules: Sequence[Rule] = (CPU,)) -> Decision:
    return decide([view], rules, seen, NOW, ROOMY)


def test_a_label_write_sets_or_removes_the_key_only_if_the_node_is_unchanged_since_read() -> None:
    (label,) = decision_for(NodeView("node-a", labelled=False), observed(node_a=95)).changes
    body = node_patch(label, "status", "presure", "48211")
    assert body == {
        "metadata": {
            # A precondition: the API server answers 409 if anyone wrote the Node since.
            "resourceVersion": "48211",
            "labels": {"status": "presure"},
            "annotations": {PRESSURE_ANNOTATION: label.record.to_json()},  # type: ignore[union-attr]
        }
    }
    ours = NodeView("node-a", labelled=True, record=OUR_RECORD, annotated=True)
    (unlabel,) = decision_for(ours, observed(node_a=20)).changes
    assert node_patch(unlabel, "status", "presure", "48212") == {
        "metadata": {
            "resourceVersion": "48212",
            "labels": {"status": None},
            "annotations": {PRESSURE_ANNOTATION: None},
        }
    }


def test_a_record_write_never_names_the_label_key() -> None:
    # A `for` timer starting, a record renewed, our record dropped from a node not ours: the
    # label key is not in the patch at all (a `status: null` would delete someone's value).
    timer = decision_for(
        NodeView("node-a", labelled=False), observed(SUSTAINED, node_a=95), [SUSTAINED]
    )
    old = replace(OUR_RECORD, since=NOW - timedelta(minutes=5), seen=NOW - timedelta(minutes=2))
    renewal = decision_for(
        NodeView("node-a", labelled=True, record=old, annotated=True), observed(node_a=95)
    )
    dropped = decision_for(foreign("maintenance", OUR_RECORD), observed(node_a=95))
    for decision, action in (
        (timer, Action.NONE),
        (renewal, Action.KEEP),
        (dropped, Action.HANDS_OFF),
    ):
        (change,) = decision.changes
        assert change.action is action
        body = node_patch(change, "status", "presure", "48211")
        assert set(body["metadata"]) == {"annotations"}, body
