"""Reading what users write: retries, durations, timestamps; and the budget a policy gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.api.times import format_duration, format_time, parse_duration, parse_kube_time
from shared.workloads.policy import (
    DEFAULT_RESET_AFTER,
    BudgetScope,
    InvalidPolicy,
    OwnerKind,
    Policy,
    parse_reset_after,
    parse_retries,
)

VALID_RETRIES = {
    "a small number": ("3", 3),
    "zero, which turns the rescheduler off": ("0", 0),
    "the maximum": ("100", 100),
    "leading zeros": ("007", 7),
}


@pytest.mark.parametrize(("value", "expected"), VALID_RETRIES.values(), ids=VALID_RETRIES.keys())
def test_valid_retries_are_read_as_integers(value: str, expected: int) -> None:
    assert parse_retries(value) == expected


def test_a_missing_policy_is_none_not_an_error() -> None:
    assert parse_retries(None) is None


INVALID_RETRIES = {
    "a word": "abc",
    "a negative number": "-1",
    "scientific notation": "1e9",
    "an empty string": "",
    "a fraction": "2.5",
    "a plus sign": "+3",
    "surrounding spaces": " 3 ",
    "a value above the maximum": "101",
    "an enormous value": "9" * 5000,
    "non-ASCII digits": "\u0663",
}


@pytest.mark.parametrize("value", INVALID_RETRIES.values(), ids=INVALID_RETRIES.keys())
def test_invalid_retries_give_a_reason_instead_of_a_number(value: str) -> None:
    result = parse_retries(value)
    assert isinstance(result, InvalidPolicy)
    assert result.value == value
    assert "scheduling-retries" in result.reason


def test_the_maximum_can_be_configured() -> None:
    assert parse_retries("500", max_retries=1000) == 500
    assert isinstance(parse_retries("11", max_retries=10), InvalidPolicy)


DURATIONS = {
    "seconds": ("90s", timedelta(seconds=90)),
    "minutes": ("30m", timedelta(minutes=30)),
    "hours and minutes": ("1h30m", timedelta(hours=1, minutes=30)),
    "a fraction of an hour": ("1.5h", timedelta(hours=1, minutes=30)),
    "milliseconds": ("1500ms", timedelta(seconds=1.5)),
    "every unit at once": ("1h2m3s4ms5us6ns", timedelta(hours=1, minutes=2, seconds=3.004005)),
    "a bare zero, as Go allows": ("0", timedelta(0)),
    "the micro sign": ("7\u00b5s", timedelta(microseconds=7)),
}


@pytest.mark.parametrize(("value", "expected"), DURATIONS.values(), ids=DURATIONS.keys())
def test_go_durations_are_parsed(value: str, expected: timedelta) -> None:
    assert parse_duration(value) == expected


BAD_DURATIONS = {
    "no unit": "30",
    "an unknown unit": "3d",
    "a negative duration": "-5m",
    "an empty string": "",
    "trailing garbage": "5mx",
    "spaces inside": "1h 30m",
    "a unit without a number": "h",
    "a value too large for any clock": "99999999999999999h",
}


@pytest.mark.parametrize("value", BAD_DURATIONS.values(), ids=BAD_DURATIONS.keys())
def test_malformed_durations_are_rejected(value: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


def test_durations_print_the_way_go_prints_them() -> None:
    assert format_duration(timedelta(hours=1, minutes=30)) == "1h30m0s"
    assert format_duration(timedelta(minutes=10)) == "10m0s"
    assert format_duration(timedelta(seconds=42)) == "42s"


RESET_AFTER = {
    "no annotation uses the default": (None, DEFAULT_RESET_AFTER, False),
    "a valid annotation is used": ("2h", timedelta(hours=2), False),
    "garbage falls back to the default with a reason": ("soon", DEFAULT_RESET_AFTER, True),
    "zero falls back to the default with a reason": ("0s", DEFAULT_RESET_AFTER, True),
}


@pytest.mark.parametrize(
    ("value", "expected", "warned"), RESET_AFTER.values(), ids=RESET_AFTER.keys()
)
def test_reset_after_falls_back_to_the_default_when_unusable(
    value: str | None, expected: timedelta, warned: bool
) -> None:
    result = parse_reset_after(value)
    assert result.duration == expected
    assert (result.fallback_reason is not None) is warned
    if result.fallback_reason:
        assert "kn-rescheduler.io/reset-after" in result.fallback_reason
        assert "30m0s" in result.fallback_reason


def test_reset_after_uses_the_configured_default() -> None:
    assert parse_reset_after(None, timedelta(hours=1)).duration == timedelta(hours=1)


def test_api_timestamps_round_trip() -> None:
    moment = datetime(2026, 3, 14, 9, 26, 53, tzinfo=UTC)
    assert format_time(moment) == "2026-03-14T09:26:53Z"
    assert parse_kube_time("2026-03-14T09:26:53Z") == moment


@pytest.mark.parametrize("value", [None, "", "yesterday", "2026-13-01T00:00:00Z"])
def test_unreadable_timestamps_are_none(value: str | None) -> None:
    assert parse_kube_time(value) is None


def test_naive_datetimes_cannot_be_formatted() -> None:
    with pytest.raises(ValueError, match="timezone"):
        format_time(datetime(2026, 3, 14))


BUDGETS = {
    "a ReplicaSet shares retries times replicas": (OwnerKind.REPLICA_SET, 3, 4, 12),
    "a ReplicaSet scaled to zero counts as one replica": (OwnerKind.REPLICA_SET, 3, 0, 3),
    "a StatefulSet pod gets its own retries": (OwnerKind.STATEFUL_SET, 3, 5, 3),
    "a Job gets its retries": (OwnerKind.JOB, 2, 1, 2),
    "a bare pod gets its retries": (OwnerKind.POD, 4, 1, 4),
    "a disabled policy has no budget": (OwnerKind.REPLICA_SET, 0, 5, 0),
}


@pytest.mark.parametrize(
    ("kind", "retries", "replicas", "budget"), BUDGETS.values(), ids=BUDGETS.keys()
)
def test_the_budget_depends_on_the_owner(
    kind: OwnerKind, retries: int, replicas: int, budget: int
) -> None:
    assert Policy(retries, kind, replicas).budget == budget


def test_only_statefulsets_count_per_pod() -> None:
    assert Policy(3, OwnerKind.STATEFUL_SET).scope is BudgetScope.PER_POD
    for kind in (OwnerKind.REPLICA_SET, OwnerKind.JOB, OwnerKind.POD):
        assert Policy(3, kind).scope is BudgetScope.WORKLOAD


def test_a_policy_accepts_the_plain_kind_strings_of_owner_resolution() -> None:
    assert Policy(3, "StatefulSet").owner_kind is OwnerKind.STATEFUL_SET  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="DaemonSet"):
        Policy(3, "DaemonSet")  # type: ignore[arg-type]


def test_a_negative_policy_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="negative"):
        Policy(-1, OwnerKind.JOB)
