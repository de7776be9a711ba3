"""The router's chaos faults over real HTTP: each fault happens where Knative has it, with the
consequence Knative gives it, and never unless switched on.

The subscribers and the harness are the delivery tests' own (loopback werkzeug servers).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.router import Chaos
from tests.handlers.test_router_delivery import (
    FAST,
    Harness,
    always,
    event_headers,
    no_threads_left,  # noqa: F401 - autouse: no thread may outlive a test
    reply,
    send,
    trigger,
)

SOURCE_TYPE = "dev.knative.apiserver.resource.update"
OFF = {"ingress_drop": 0.0, "attempt_drop": 0.0, "answer_loss": 0.0, "duplicate": 0.0}


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    for r in harness.routers:
        r.stop()
    for s in harness.subscribers:
        s.close()


def only(**faults: float) -> Chaos:
    """Chaos with exactly the given faults (everything else off)."""
    return Chaos(seed=11, **{**OFF, "reorder": 0.0, **faults})


def test_without_chaos_nothing_is_dropped_duplicated_or_held(h: Harness) -> None:
    sub = h.subscriber(always(202))
    r = h.router([trigger("t", SOURCE_TYPE, "svc", FAST)], {"svc": sub})
    for _ in range(20):
        assert send(r, event_headers(SOURCE_TYPE)).status_code == 202
    assert r.wait_idle(10)
    assert len(sub.calls) == 20 and len(h.archive) == 20
    assert r.chaos is None
    assert set(r.chaos_stats().values()) == {0}
    assert r.stats()["retries"] == 0


def test_an_ingress_drop_loses_an_apiserversource_event_for_good(h: Harness) -> None:
    sub = h.subscriber(always(202))
    r = h.router(
        [trigger("t", SOURCE_TYPE, "svc", FAST), trigger("f", "io.test.failing", "svc", FAST)],
        {"svc": sub},
        chaos=only(ingress_drop=1.0),
    )
    # The source is told "accepted", as when its send was lost further on: nobody resends it.
    assert send(r, event_headers(SOURCE_TYPE)).status_code == 202
    # Events of other senders (the sweep) are never lost at the ingress.
    assert send(r, event_headers("io.test.failing")).status_code == 202
    assert r.wait_idle(10)
    assert [e["type"] for e in h.archive] == ["io.test.failing"]
    assert len(sub.calls) == 1 and sub.calls[0].headers["ce-type"] == "io.test.failing"
    assert r.chaos_stats()["ingress_dropped"] == 1
    assert h.dead == []


def test_a_reply_is_never_dropped_at_the_ingress(h: Harness) -> None:
    detect = h.subscriber(lambda _req, _n: reply(SOURCE_TYPE, {"echo": True}))
    sink = h.subscriber(always(202))
    r = h.router(
        [trigger("first", "io.test.start", "detect", FAST), trigger("sink", SOURCE_TYPE, "sink")],
        {"detect": detect, "sink": sink},
        chaos=only(ingress_drop=1.0),
    )
    send(r, event_headers("io.test.start"))
    assert r.wait_idle(10)
    assert [e["type"] for e in h.archive] == ["io.test.start", SOURCE_TYPE]
    assert len(sink.calls) == 1
    assert r.chaos_stats()["ingress_dropped"] == 0


def test_a_dropped_attempt_is_retried_and_the_last_attempt_is_never_dropped(h: Harness) -> None:
    sub = h.subscriber(always(202))
    r = h.router([trigger("t", SOURCE_TYPE, "svc", FAST)], {"svc": sub}, chaos=only(attempt_drop=1))
    send(r, event_headers(SOURCE_TYPE))
    assert r.wait_idle(10)
    # retry: 2 -> two attempts dropped before reaching the subscriber, the third gets through.
    assert len(sub.calls) == 1
    assert r.stats()["retries"] == 2 and r.stats()["delivered"] == 1
    assert r.chaos_stats()["attempts_dropped"] == 2
    assert h.dead == []


def test_a_lost_answer_makes_the_subscriber_see_the_event_again(h: Harness) -> None:
    sub = h.subscriber(lambda _req, n: reply("io.test.reply", {"n": n}))
    sink = h.subscriber(always(202))
    r = h.router(
        [trigger("t", SOURCE_TYPE, "svc", FAST), trigger("s", "io.test.reply", "sink")],
        {"svc": sub, "sink": sink},
        chaos=only(answer_loss=1.0),
    )
    headers = event_headers(SOURCE_TYPE)
    send(r, headers)
    assert r.wait_idle(10)
    # The subscriber acted three times on one event; only the answer that arrived counts.
    assert [c.headers["ce-id"] for c in sub.calls] == [headers["ce-id"]] * 3
    assert r.chaos_stats()["answers_lost"] == 2
    replies = [e for e in h.archive if e["type"] == "io.test.reply"]
    assert [e["data"] for e in replies] == [{"n": 3}]
    assert h.dead == []


def test_what_is_dead_lettered_is_the_subscribers_own_last_answer(h: Harness) -> None:
    broken = h.subscriber(always(500, "boom"))
    r = h.router(
        [trigger("t", SOURCE_TYPE, "svc", FAST)], {"svc": broken}, chaos=only(attempt_drop=1.0)
    )
    send(r, event_headers(SOURCE_TYPE))
    assert r.wait_idle(10)
    [dead] = h.dead
    assert dead["status"] == 500 and dead["attempts"] == 3
    assert len(broken.calls) == 1


def test_a_duplicate_is_the_same_event_delivered_once_more(h: Harness) -> None:
    sub = h.subscriber(always(202))
    r = h.router(
        [trigger("t", SOURCE_TYPE, "svc", FAST)],
        {"svc": sub},
        chaos=only(duplicate=1.0, max_delay=0.2),
    )
    headers = event_headers(SOURCE_TYPE)
    send(r, headers)
    assert r.wait_idle(10)
    # Copies are never copied again: exactly two deliveries of one id.
    assert [c.headers["ce-id"] for c in sub.calls] == [headers["ce-id"]] * 2
    assert r.chaos_stats()["duplicated"] == 1
    assert len(h.archive) == 1


def test_a_held_back_delivery_is_overtaken_by_a_later_event(h: Harness) -> None:
    sub = h.subscriber(always(202))
    r = h.router(
        [trigger("t", SOURCE_TYPE, "svc", FAST)],
        {"svc": sub},
        chaos=only(reorder=1.0, max_delay=2.0),
    )
    first = event_headers(SOURCE_TYPE)
    send(r, first)
    r.set_chaos(None)
    second = event_headers(SOURCE_TYPE)
    send(r, second)
    assert r.wait_idle(10)
    assert [c.headers["ce-id"] for c in sub.calls] == [second["ce-id"], first["ce-id"]]
    assert r.chaos_stats()["reordered"] == 1


def test_the_same_seed_rolls_the_same_faults(h: Harness) -> None:
    sub = h.subscriber(always(202))

    def survivors(seed: int) -> list[int]:
        r = h.router(
            [trigger("t", SOURCE_TYPE, "svc", FAST)],
            {"svc": sub},
            chaos=Chaos(seed=seed, **{**OFF, "reorder": 0.0, "ingress_drop": 0.5}),
        )
        before = len(h.archive)
        kept = []
        for i in range(24):
            send(r, event_headers(SOURCE_TYPE, seq=str(i)))
            if len(h.archive) > before + len(kept):
                kept.append(i)
        assert r.wait_idle(10)
        r.stop()
        return kept

    first, again, other = survivors(21), survivors(21), survivors(22)
    assert first == again
    assert 0 < len(first) < 24
    assert first != other


def test_switching_chaos_off_stops_the_faults(h: Harness) -> None:
    sub = h.subscriber(always(202))
    r = h.router([trigger("t", SOURCE_TYPE, "svc", FAST)], {"svc": sub}, chaos=only(ingress_drop=1))
    send(r, event_headers(SOURCE_TYPE))
    r.set_chaos(None)
    send(r, event_headers(SOURCE_TYPE))
    assert r.wait_idle(10)
    assert len(sub.calls) == 1
    assert r.chaos_stats()["ingress_dropped"] == 1


@pytest.mark.parametrize(
    "bad",
    [{"duplicate": 1.5}, {"attempt_drop": -0.1}, {"max_delay": -1.0}],
)
def test_a_chaos_setting_out_of_range_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="chaos"):
        Chaos(seed=1, **bad)


def test_chaos_faults_are_logged_with_the_event_id(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    sub = h.subscriber(always(202))
    r = h.router([trigger("t", SOURCE_TYPE, "svc", FAST)], {"svc": sub}, chaos=only(ingress_drop=1))
    headers = event_headers(SOURCE_TYPE)
    with caplog.at_level("INFO", logger="pipeline.router"):
        send(r, headers)
        time.sleep(0.05)
    lost = [rec for rec in caplog.records if rec.getMessage() == "chaos: event lost at the ingress"]
    assert [getattr(rec, "ce_id", None) for rec in lost] == [headers["ce-id"]]
