"""The classifier on damaged pods: realistic kubelet-shaped pods with keys dropped, values of
the wrong type, huge values and odd timestamps. detect-failures runs it on every pod event and
the sweep on every pod.

The contract: on a pod the API server could have sent (every field of its type, contents
anything) every decision returns its answer and never raises. On a pod with a field of the
wrong type (a forged or corrupted event) it returns its answer or raises MalformedPod, and only
when `shared.workloads.podshape.malformed` names the field; never another exception.
detect-failures turns MalformedPod into a malformed event (400), the sweep skips the pod and judges
the others.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st

from shared.api.keys import APISERVER_UPDATE, EVENT_POD_FAILING
from shared.platform import events
from shared.platform.config import Config
from shared.pods.detect_failures.decide import detect
from shared.pods.failing import FailingPod
from shared.pods.sweep_failures.handler import find_failures
from shared.workloads.classify import (
    Failure,
    FailureKind,
    classify,
    skip_reason,
    stuck_pending,
    unschedulable_due_to_exclusions,
    worth_forwarding,
)
from shared.workloads.podshape import malformed
from tests.fuzz import strategies as s
from tests.fuzz.contract import refused_as_malformed, refusing_only_malformed
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
# Each pod with whether it may have a field of the wrong type (no API server sends that).
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


@given(pod=s.well_typed_pods)
def test_every_pod_of_the_api_servers_types_passes_the_shape_check(pod: dict[str, Any]) -> None:
    # Else a bug of ours on a real pod would pass for malformed input and hide behind a 400.
    assert malformed(pod) is None


@given(drawn=any_pods, cfg=CONFIGS, now=clocks)
def test_classify_returns_a_failure_or_none_for_any_pod(
    drawn: Drawn, cfg: Config, now: datetime
) -> None:
    pod, ill_typed = drawn
    with refusing_only_malformed(pod, ill_typed):
        failure = classify(pod, cfg, now)  # type: ignore[arg-type]
        check_failure(failure)
        if failure is not None and failure.kind is FailureKind.NODE_FIXABLE:
            assert failure.node == pod["spec"]["nodeName"]


@given(drawn=any_pods, cfg=CONFIGS, now=clocks)
def test_stuck_pending_returns_a_failure_or_none_for_any_pod(
    drawn: Drawn, cfg: Config, now: datetime
) -> None:
    pod, ill_typed = drawn
    with refusing_only_malformed(pod, ill_typed):
        check_failure(stuck_pending(pod, cfg, now))  # type: ignore[arg-type]


@given(drawn=any_pods, cfg=CONFIGS)
def test_the_skip_rules_answer_for_any_pod(drawn: Drawn, cfg: Config) -> None:
    pod, ill_typed = drawn
    with refusing_only_malformed(pod, ill_typed):
        reason = skip_reason(pod, cfg)  # type: ignore[arg-type]
        assert reason is None or isinstance(reason, str)
    with refusing_only_malformed(pod, ill_typed):
        assert worth_forwarding(pod, cfg) in (True, False)  # type: ignore[arg-type]
    with refusing_only_malformed(pod, ill_typed):
        check_failure(unschedulable_due_to_exclusions(pod, cfg))  # type: ignore[arg-type]


@given(drawn=any_pods, cfg=CONFIGS, now=clocks)
def test_detect_answers_a_reply_nothing_or_a_bad_event_for_any_pod(
    drawn: Drawn, cfg: Config, now: datetime
) -> None:
    pod, ill_typed = drawn
    pod_event = events.Event("1", "s", APISERVER_UPDATE, {"kind": "Pod"}, pod)
    try:
        reply = detect(pod_event, cfg, now)
    except events.BadEvent as error:
        event("malformed" if refused_as_malformed(error, pod, ill_typed) else "bad event")
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
    pod_event = events.Event("1", "s", APISERVER_UPDATE, {"kind": "Pod"}, pod)
    try:
        reply = detect(pod_event, cfg, now)
    except events.BadEvent as error:
        refused_as_malformed(error, pod, ill_typed=False)
        return
    if reply is not None:
        data = json.loads(json.dumps(dict(reply.data)))
        assert FailingPod.from_data(data).to_data() == data


@given(batch=st.lists(any_pods, max_size=4), cfg=CONFIGS, now=clocks)
def test_the_sweep_judges_each_pod_on_its_own_and_never_raises(
    batch: list[Drawn], cfg: Config, now: datetime
) -> None:
    # A malformed pod in the list is skipped; it changes nothing about the others.
    pods = [pod for pod, _ in batch]
    found = find_failures(pods, cfg, now)
    assert found == [one for pod in pods for one in find_failures([pod], cfg, now)]
    for failing in found:
        check_failure(failing.failure)
        json.dumps(failing.to_data())
