"""The classifier on damaged pods: realistic kubelet-shaped pods with keys dropped, values of
the wrong type, huge values and odd timestamps. detect-failures runs it on every pod event and
the sweep on every pod: it returns a Failure or None, and never raises."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shared import events
from shared.classify import (
    Failure,
    FailureKind,
    classify,
    skip_reason,
    stuck_pending,
    unschedulable_due_to_exclusions,
    worth_forwarding,
)
from shared.config import Config
from shared.constants import APISERVER_UPDATE, EVENT_POD_FAILING
from shared.detect import detect
from shared.failing import FailingPod
from shared.sweep import find_failures
from tests.fuzz import strategies as s
from tests.fuzz.known import tolerating_known_bugs
from tests.unit.pods import NOW

CONFIGS = st.sampled_from(
    [
        Config(),
        Config(
            forward_unstamped=True,
            crashloop_restart_threshold=1,
            waiting_failure_after=timedelta(0),
            pending_stuck_after=timedelta(0),
            pull_stuck_after=timedelta(0),
        ),
    ]
)
# The clock: around the pods' own moment, and far from it.
clocks = st.one_of(
    st.just(NOW),
    st.integers(-3600, 30 * 86400).map(lambda seconds: NOW + timedelta(seconds=seconds)),
    st.sampled_from(
        [datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC), datetime.now(UTC)]
    ),
)
# Each pod with whether it may have a field of the wrong type (no API server sends that; the
# classifier still must not crash on it, a known bug so far: F3).
any_pods = st.one_of(
    s.well_typed_pods.map(lambda pod: (pod, False)), s.mutated_pods.map(lambda pod: (pod, True))
)
Drawn = tuple[dict[str, Any], bool]


def check_failure(failure: Failure | None) -> None:
    if failure is None:
        return
    assert isinstance(failure, Failure)
    assert failure.kind in set(FailureKind)
    assert failure.why and isinstance(failure.why, str)
    json.dumps(failure.to_dict())


@given(drawn=any_pods, cfg=CONFIGS, now=clocks)
def test_classify_returns_a_failure_or_none_for_any_pod(
    drawn: Drawn, cfg: Config, now: datetime
) -> None:
    pod, ill_typed = drawn
    with tolerating_known_bugs(ill_typed=ill_typed):
        failure = classify(pod, cfg, now)  # type: ignore[arg-type]
        check_failure(failure)
        if failure is not None and failure.kind is FailureKind.NODE_FIXABLE:
            assert failure.node == pod["spec"]["nodeName"]


@given(drawn=any_pods, cfg=CONFIGS, now=clocks)
def test_stuck_pending_returns_a_failure_or_none_for_any_pod(
    drawn: Drawn, cfg: Config, now: datetime
) -> None:
    pod, ill_typed = drawn
    with tolerating_known_bugs(ill_typed=ill_typed):
        check_failure(stuck_pending(pod, cfg, now))  # type: ignore[arg-type]


@given(drawn=any_pods, cfg=CONFIGS)
def test_the_skip_rules_never_raise(drawn: Drawn, cfg: Config) -> None:
    pod, ill_typed = drawn
    with tolerating_known_bugs(ill_typed=ill_typed):
        reason = skip_reason(pod, cfg)  # type: ignore[arg-type]
        assert reason is None or isinstance(reason, str)
        assert worth_forwarding(pod, cfg) in (True, False)  # type: ignore[arg-type]
        check_failure(unschedulable_due_to_exclusions(pod, cfg))  # type: ignore[arg-type]


@given(drawn=any_pods, cfg=CONFIGS, now=clocks)
def test_detect_answers_a_reply_nothing_or_a_bad_event_for_any_pod(
    drawn: Drawn, cfg: Config, now: datetime
) -> None:
    pod, ill_typed = drawn
    event = events.Event("1", "s", APISERVER_UPDATE, {"kind": "Pod"}, pod)
    with tolerating_known_bugs(ill_typed=ill_typed):
        try:
            reply = detect(event, cfg, now)
        except events.BadEvent:
            return
        if reply is not None:
            assert reply.type == EVENT_POD_FAILING
            json.dumps(dict(reply.data))


@given(pod=s.well_typed_pods, cfg=CONFIGS, now=clocks)
def test_what_detect_sends_about_a_well_typed_pod_update_annotations_reads(
    pod: dict[str, Any], cfg: Config, now: datetime
) -> None:
    # Every field of the type the API server gives it: then a failing-pod event detect-failures
    # sends must never be refused by update-annotations (a 400 there drops the move for good).
    event = events.Event("1", "s", APISERVER_UPDATE, {"kind": "Pod"}, pod)
    with tolerating_known_bugs():
        try:
            reply = detect(event, cfg, now)
        except events.BadEvent:
            return
        if reply is not None:
            data = json.loads(json.dumps(dict(reply.data)))
            assert FailingPod.from_data(data).to_data() == data


@given(batch=st.lists(any_pods, max_size=4), cfg=CONFIGS, now=clocks)
def test_the_sweep_finds_failures_among_any_pods_without_raising(
    batch: list[Drawn], cfg: Config, now: datetime
) -> None:
    with tolerating_known_bugs(ill_typed=any(ill_typed for _, ill_typed in batch)):
        for found in find_failures([pod for pod, _ in batch], cfg, now):
            check_failure(found.failure)
            json.dumps(found.to_data())
