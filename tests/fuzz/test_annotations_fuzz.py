"""Every annotation we parse, fuzzed: the policy, durations, timestamps, the state, the
excluded-nodes stamp, and the failing-pod event data. Users and hand edits write these; a value
we cannot read must give a reason (InvalidPolicy, ValueError, StateError; on a forged pod
whose annotations are not strings, MalformedPod), never a crash."""

from __future__ import annotations

import json
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from shared.api.keys import EXCLUDED_NODES_ANNOTATION, POLICY_ANNOTATION, POLICY_STAMP_ANNOTATION
from shared.api.state import (
    PodEntry,
    StateError,
    WorkloadState,
    dump_state,
    is_valid_node_name,
    load_state,
    load_state_lenient,
)
from shared.api.times import parse_duration, parse_kube_time
from shared.platform.config import MAX_RETRIES
from shared.pods.failing import FailingPod
from shared.workloads.classify import Failure, excluded_nodes_of, policy_of
from shared.workloads.policy import (
    DEFAULT_RESET_AFTER,
    InvalidPolicy,
    ResetAfter,
    parse_reset_after,
    parse_retries,
)
from tests.fuzz import strategies as s
from tests.fuzz.contract import refusing_only_malformed
from tests.unit import pods

# -- scheduling-retries ---------------------------------------------------------------------


@given(
    value=st.one_of(
        st.none(),
        s.texts,
        st.integers(0, 10**9).map(str),
        st.from_regex(r"0{1,10}[0-9]{1,3}", fullmatch=True),
    ),
    max_retries=st.integers(1, 1000) | st.just(MAX_RETRIES),
)
def test_a_policy_is_a_whole_number_within_the_maximum_or_an_invalid_policy(
    value: str | None, max_retries: int
) -> None:
    parsed = parse_retries(value, max_retries)
    if value is None:
        assert parsed is None
    elif value.isascii() and value.isdigit() and int(value) <= max_retries:
        assert parsed == int(value)
    else:
        assert isinstance(parsed, InvalidPolicy)
        assert parsed.value == value and parsed.reason


@given(
    annotations=st.dictionaries(
        st.sampled_from([POLICY_ANNOTATION, POLICY_STAMP_ANNOTATION, "other"]), s.texts
    )
)
def test_a_pods_policy_is_read_from_our_stamp_first_and_never_crashes(
    annotations: dict[str, str],
) -> None:
    pod = pods.pod(stamp=None, annotations=annotations)
    expected = annotations.get(POLICY_STAMP_ANNOTATION, annotations.get(POLICY_ANNOTATION))
    assert policy_of(pod) == parse_retries(expected)


OUR_KEYS = [POLICY_ANNOTATION, POLICY_STAMP_ANNOTATION, EXCLUDED_NODES_ANNOTATION, "other"]


@given(
    annotations=st.dictionaries(st.sampled_from(OUR_KEYS), s.texts | s.json_values) | s.json_values
)
def test_annotations_of_any_type_are_read_or_refused_as_malformed(annotations: object) -> None:
    # A forged pod can carry annotations that are not strings (or no map at all): read as
    # usual, or refused as malformed; a map of strings is always read.
    pod = pods.pod(stamp=None)
    pod["metadata"]["annotations"] = annotations
    ill_typed = not (
        isinstance(annotations, dict) and all(isinstance(v, str) for v in annotations.values())
    )
    with refusing_only_malformed(pod, ill_typed):
        policy = policy_of(pod)
        assert policy is None or isinstance(policy, int | InvalidPolicy)
    with refusing_only_malformed(pod, ill_typed):
        nodes = excluded_nodes_of(pod)
        assert all(isinstance(node, str) and node for node in nodes)


# -- durations and timestamps ---------------------------------------------------------------

UNITS_US = {"us": 1, "ms": 1_000, "s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000}


@given(parts=st.lists(st.tuples(st.integers(0, 10**12), st.sampled_from(sorted(UNITS_US)))))
def test_a_go_duration_means_the_sum_of_its_parts(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{count}{unit}" for count, unit in parts) or "0"
    micros = sum(count * UNITS_US[unit] for count, unit in parts)
    try:
        expected = timedelta(microseconds=micros)
    except OverflowError:
        expected = None
    try:
        parsed = parse_duration(text)
    except ValueError:
        assert expected is None, f"{text!r} is a valid duration"
        return
    assert parsed == expected


@given(value=s.texts | s.odd_timestamps | st.from_regex(r"[0-9.]{1,400}(ns|us|µs|ms|s|m|h)"))
def test_any_text_is_a_duration_or_a_value_error(value: str) -> None:
    try:
        parsed = parse_duration(value)
    except ValueError:
        return
    assert parsed >= timedelta(0)


@given(value=st.none() | s.texts | st.from_regex(r"-?[0-9]{1,30}(ns|s|m|h)", fullmatch=True))
def test_reset_after_always_falls_back_to_a_positive_duration(value: str | None) -> None:
    reset = parse_reset_after(value)
    assert reset.duration > timedelta(0)
    if value is None:
        assert reset == ResetAfter(DEFAULT_RESET_AFTER)
    elif reset.fallback_reason is None:
        assert parse_duration(value) == reset.duration
    else:
        assert reset.duration == DEFAULT_RESET_AFTER


@given(value=s.odd_timestamps | s.texts)
def test_an_api_timestamp_is_an_aware_utc_time_or_none(value: str) -> None:
    parsed = parse_kube_time(value)
    assert parsed is None or parsed.utcoffset() == timedelta(0)


# -- the state annotation -------------------------------------------------------------------

uids = st.uuids().map(str) | s.texts.filter(bool)
entries = st.builds(
    PodEntry,
    moves=st.integers(0, 2**40),
    excluded_nodes=st.lists(s.valid_node_names, max_size=4).map(tuple),
    exhausted_recorded=st.booleans(),
    updated_at=st.none() | s.utc_seconds(),
)
valid_states = st.builds(
    WorkloadState,
    moves=st.integers(0, 2**40),
    excluded_nodes=st.lists(s.valid_node_names, max_size=5).map(tuple),
    per_pod=st.dictionaries(s.texts, entries, max_size=4),
    handled=st.lists(uids, max_size=5).map(tuple),
    exhausted_recorded=st.booleans(),
    updated_at=st.none() | s.utc_seconds(),
    holder_uid=st.just("") | uids,
)
# What a hand edit, another release or an attacker leaves in the annotation.
state_texts = st.one_of(
    valid_states.map(dump_state),
    s.mutated(valid_states.map(lambda state: json.loads(dump_state(state)))).map(json.dumps),
    valid_states.map(lambda state: {**json.loads(dump_state(state)), "version": 1})
    .map(lambda data: {k: v for k, v in data.items() if k != "holderUid"})
    .map(json.dumps),
    s.json_values.map(json.dumps),
    s.texts,
    s.depths.map(s.nested),
    s.depths.map(lambda depth: '{"version": 2, "pods": ' + s.nested(depth, "{}") + "}"),
    st.builds(
        lambda state, when: json.dumps({**json.loads(dump_state(state)), "updatedAt": when}),
        valid_states,
        s.odd_timestamps,
    ),
    st.just('{"version": 2, "moves": 1e400}'),
)


@given(state=valid_states)
def test_a_state_we_wrote_reads_back_the_same(state: WorkloadState) -> None:
    assert load_state(dump_state(state)) == state


@given(text=state_texts)
def test_any_state_annotation_reads_or_raises_state_error_and_rewrites_stably(text: str) -> None:
    try:
        state = load_state(text)
    except StateError:
        return
    dumped = dump_state(state)
    assert dump_state(load_state(dumped)) == dumped
    # What the webhook reads of a state the handlers can read: the same, nothing skipped.
    assert load_state_lenient(text).state == state
    assert load_state_lenient(text).skipped_nodes == ()


@given(text=state_texts)
def test_the_webhooks_reading_of_a_state_keeps_only_valid_node_names(text: str) -> None:
    try:
        loaded = load_state_lenient(text)
    except StateError:
        return
    state = loaded.state
    nodes = [
        *state.excluded_nodes,
        *(n for e in state.per_pod.values() for n in e.excluded_nodes),
    ]
    assert all(is_valid_node_name(node) for node in nodes)
    assert not any(is_valid_node_name(node) for node in loaded.skipped_nodes)


# -- the excluded-nodes stamp ---------------------------------------------------------------

stamps = st.one_of(
    st.lists(s.node_names).map(json.dumps),
    s.json_values.map(json.dumps),
    s.texts,
    s.depths.map(s.nested),
)


@given(raw=stamps)
def test_the_excluded_nodes_stamp_reads_as_names_or_as_none(raw: str) -> None:
    pod = pods.pod(annotations={EXCLUDED_NODES_ANNOTATION: raw})
    nodes = excluded_nodes_of(pod)
    assert isinstance(nodes, tuple)
    assert all(isinstance(node, str) and node for node in nodes)


@given(names=st.lists(s.node_names))
def test_a_stamp_we_wrote_reads_back_as_its_names(names: list[str]) -> None:
    pod = pods.pod(annotations={EXCLUDED_NODES_ANNOTATION: json.dumps(names)})
    assert excluded_nodes_of(pod) == tuple(name for name in names if name)


# -- io.kn-rescheduler.pod.failing data -----------------------------------------------------


@given(data=s.failing_data | s.json_values)
def test_failing_pod_data_reads_or_raises_value_error_and_round_trips(data: object) -> None:
    try:
        failing = FailingPod.from_data(data)
    except ValueError:
        return
    again = FailingPod.from_data(json.loads(json.dumps(failing.to_data())))
    assert again == failing
    assert again.pod == failing.pod


@given(data=st.sampled_from(s.FAILING_DATA))
def test_what_detect_failures_sends_is_what_update_annotations_reads(
    data: dict[str, object],
) -> None:
    assert FailingPod.from_data(data).to_data() == data


@given(data=s.failing_data)
def test_a_failure_record_reads_or_raises_value_error(data: dict[str, object]) -> None:
    record = {
        "kind": data.get("kind"),
        "reason": data.get("reason"),
        "message": data.get("message"),
        "node": data.get("node"),
        "restart_count": data.get("restartCount"),
        "ran_for_seconds": data.get("ranForSeconds"),
    }
    try:
        failure = Failure.from_dict(record)
    except ValueError:
        return
    assert Failure.from_dict(failure.to_dict()) == failure
