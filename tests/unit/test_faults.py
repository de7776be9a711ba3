"""The chaos suite's fault policy (dev/pipeline/faults.py), decision by decision: which request gets
which fault, the budget that leaves Knative's last retries to the function, and the counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dev.bench.chaos import scenario
from dev.pipeline.faults import SOURCE, Faults, FaultSpec, event_id, retriable
from dev.pipeline.netns import Action, Message
from dev.stack.stack import TRIGGERED_FUNCTIONS
from kubectl_kn_rescheduler.routing import triggers

ROOT = Path(__file__).resolve().parents[2]
NONE = {
    "ingress_drop": 0.0,
    "attempt_drop": 0.0,
    "answer_loss": 0.0,
    "duplicate": 0.0,
    "reorder": 0.0,
}


def request(ce_id: str | None = "e1", *, structured: bool = False) -> Message:
    if structured:
        body = json.dumps({"specversion": "1.0", "id": ce_id, "type": "t", "source": "s"})
        headers = {"content-type": "application/cloudevents+json"}
        return Message("POST / HTTP/1.1", headers, body.encode(), b"")
    headers = {"ce-id": ce_id} if ce_id else {}
    return Message("POST / HTTP/1.1", headers, b"{}", b"")


def answer(status: int) -> Message:
    return Message(f"HTTP/1.1 {status} X", {}, b"", b"")


def policy(**spec: float) -> Faults:
    faults = Faults(FaultSpec(seed=3, **{**NONE, **spec}))  # type: ignore[arg-type]
    faults.watch("source", SOURCE)
    faults.watch("out-9001", "update-annotations")
    faults.watch("out-9002", "detect-failures")
    return faults


def test_an_event_is_failed_no_more_often_than_the_budget_then_always_passes() -> None:
    faults = policy(attempt_drop=1.0)
    actions = [faults.decide("out-9001", request("e1")).action for _ in range(5)]
    assert actions == [Action.RESET_BEFORE] * 2 + [Action.PASS] * 3
    # Another event, and the same event at another function, have budgets of their own.
    assert faults.decide("out-9001", request("e2")).action is Action.RESET_BEFORE
    assert faults.decide("out-9002", request("e1")).action is Action.RESET_BEFORE
    stats = faults.stats()
    assert stats["attempts_dropped"] == 4
    assert (stats["deliveries"], stats["retries"]) == (7, 4)


def test_drops_and_answer_losses_share_one_budget() -> None:
    faults = policy(answer_loss=1.0)
    actions = [faults.decide("out-9001", request("e1")).action for _ in range(3)]
    assert actions == [Action.RESET_AFTER, Action.RESET_AFTER, Action.PASS]
    assert faults.stats()["answers_lost"] == 2


def test_the_budget_leaves_knatives_last_retries_to_every_faulted_function() -> None:
    budget = max(s.data_plane_faults(0).max_failures for s in (scenario.QUICK, scenario.FULL))
    found, broker = triggers.load(ROOT / "knative", namespace="kn-rescheduler", broker="default")
    retries = {
        t.subscriber.service: (t.delivery or (broker.delivery if broker else None)).retry  # type: ignore[union-attr]
        for t in found
        if t.subscriber.service in TRIGGERED_FUNCTIONS
    }
    assert set(retries) == set(TRIGGERED_FUNCTIONS)
    for function, retry in retries.items():
        assert budget < retry, f"every attempt {function}'s Trigger allows could be one of ours"


def test_ingress_drops_happen_only_on_the_source_forward() -> None:
    faults = policy(ingress_drop=1.0)
    assert faults.decide("source", request()).action is Action.ACCEPT_AND_DROP
    assert faults.decide("out-9001", request()).action is Action.PASS
    assert faults.decide("broker", request()).action is Action.PASS
    assert faults.stats()["ingress_dropped"] == 1


def test_a_forward_nobody_watches_gets_no_fault() -> None:
    faults = policy(attempt_drop=1.0, answer_loss=1.0, reorder=1.0, duplicate=1.0)
    decision = faults.decide("out-9999", request())
    assert (decision.action, decision.hold) == (Action.PASS, 0.0)
    assert faults.answered("out-9999", request(), answer(200)) is None


def test_only_an_events_first_request_is_held_back_within_max_delay() -> None:
    faults = policy(reorder=1.0, max_delay=2.0)
    first = faults.decide("out-9001", request("e1"))
    again = faults.decide("out-9001", request("e1"))
    assert 1.0 <= first.hold <= 2.0 and first.action is Action.PASS
    assert again.hold == 0.0
    assert faults.stats()["reordered"] == 1


def test_a_successful_answer_is_duplicated_once_per_event_and_function() -> None:
    faults = policy(duplicate=1.0, max_delay=1.5)
    after = faults.answered("out-9001", request("e1"), answer(202))
    assert after is not None and 0.0 <= after <= 1.5
    assert faults.answered("out-9001", request("e1"), answer(200)) is None
    assert faults.answered("out-9002", request("e1"), answer(200)) is not None
    assert faults.stats()["duplicated"] == 2


def test_a_failed_answer_or_a_source_event_is_never_duplicated() -> None:
    faults = policy(duplicate=1.0)
    assert faults.answered("out-9001", request("e1"), answer(500)) is None
    assert faults.answered("source", request("e2"), answer(202)) is None
    assert faults.stats()["duplicated"] == 0


def test_structured_events_are_known_by_their_id_and_non_events_get_no_fault() -> None:
    assert event_id(request("abc", structured=True)) == "abc"
    assert event_id(request(None)) is None
    faults = policy(attempt_drop=1.0)
    assert faults.decide("out-9001", request(None)).action is Action.PASS
    assert faults.decide("out-9001", request("s1", structured=True)).action is Action.RESET_BEFORE


def test_stopped_faults_inject_nothing_but_keep_counting_deliveries() -> None:
    faults = policy(attempt_drop=1.0, duplicate=1.0, ingress_drop=1.0)
    faults.stop()
    assert faults.decide("out-9001", request("e1")).action is Action.PASS
    assert faults.decide("out-9001", request("e1")).action is Action.PASS
    assert faults.decide("source", request("e1")).action is Action.PASS
    assert faults.answered("out-9001", request("e1"), answer(200)) is None
    stats = faults.stats()
    assert (stats["deliveries"], stats["retries"], stats["attempts_dropped"]) == (2, 1, 0)


def test_the_same_seed_rolls_the_same_faults() -> None:
    def run() -> list[Action]:
        faults = policy(attempt_drop=0.3, answer_loss=0.3)
        return [faults.decide("out-9001", request(f"e{n}")).action for n in range(40)]

    assert run() == run()
    assert len(set(run())) == 3


@pytest.mark.parametrize("bad", [{"attempt_drop": 1.5}, {"max_delay": -1}, {"max_failures": -1}])
def test_a_spec_out_of_range_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FaultSpec(seed=0, **bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (None, True),
        (404, True),
        (408, True),
        (409, True),
        (429, True),
        (500, True),
        (503, True),
        (400, False),
        (401, False),
        (403, False),
        (410, False),
        (200, False),
    ],
)
def test_retriable_is_knatives_selective_retry(status: int | None, expected: bool) -> None:
    assert retriable(status) is expected
