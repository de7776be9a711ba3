"""Parsing the values users write: the retry policy, durations, and API timestamps.

Users type these into annotations by hand, so parsing is strict and never guesses: a value we
cannot read is reported with a reason (the caller records an InvalidPolicy Warning Event and
leaves the pod alone) instead of being coerced into something the user did not mean. "1e9",
"-1" or "3 " are all mistakes worth telling the user about.

`Policy` is the resolved policy of one workload: the retries the user asked for, the kind of
owner (which decides whether the budget is shared by the workload or kept per pod), the
replica count (a ReplicaSet's budget scales with it, as in the original kse-rescheduler) and
how long a pod must have run before its failure clears the exclusions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Final

from shared.constants import POLICY_ANNOTATION, RESET_AFTER_ANNOTATION

# A bound on what a user can ask for: enough for any sane workload, small enough that a typo
# ("30000") cannot turn the rescheduler into a pod-deleting loop.
MAX_RETRIES: Final = 100

DEFAULT_RESET_AFTER: Final = timedelta(minutes=30)

_DIGITS = re.compile(r"[0-9]+")

# Go's time.ParseDuration units. Both micro signs are accepted, as Go does.
_UNIT_MICROSECONDS: Final[dict[str, Decimal]] = {
    "ns": Decimal("0.001"),
    "us": Decimal(1),
    "\u00b5s": Decimal(1),
    "\u03bcs": Decimal(1),
    "ms": Decimal(1_000),
    "s": Decimal(1_000_000),
    "m": Decimal(60_000_000),
    "h": Decimal(3_600_000_000),
}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


@dataclass(frozen=True)
class InvalidPolicy:
    """A `scheduling-retries` value we refuse to act on, and why (shown to the user)."""

    value: str
    reason: str


def parse_retries(value: str | None, max_retries: int = MAX_RETRIES) -> int | InvalidPolicy | None:
    """Read a `scheduling-retries` value.

    None means the annotation is absent (the workload did not opt in), 0 means the user turned
    the rescheduler off, a positive int is the number of moves allowed (per pod or per replica,
    see `Policy.budget`). Anything else is an `InvalidPolicy`.
    """
    if value is None:
        return None
    if not _DIGITS.fullmatch(value):
        return InvalidPolicy(
            value,
            f"{POLICY_ANNOTATION} must be a whole number from 0 to {max_retries} "
            f"written with digits only, got {value!r}",
        )
    # Checking the length first keeps int() away from absurdly long digit strings; leading
    # zeros ("003") do not make a number larger.
    if len(value.lstrip("0")) > 6 or int(value) > max_retries:
        return InvalidPolicy(
            value, f"{POLICY_ANNOTATION}={value} is more than the maximum of {max_retries}"
        )
    return int(value)


def parse_duration(value: str) -> timedelta:
    """Parse a Go-style duration ("90s", "30m", "1h30m", "1.5h"); raise ValueError if invalid.

    The same syntax as Kubernetes and Knative use everywhere, so users need not learn another.
    Negative durations are rejected: nothing we configure can be negative.
    """
    if value == "0":
        return timedelta(0)
    position = 0
    total = Decimal(0)
    for match in _DURATION_PART.finditer(value):
        if match.start() != position:
            break
        try:
            total += Decimal(match.group(1)) * _UNIT_MICROSECONDS[match.group(2)]
        except InvalidOperation as err:  # pragma: no cover - the regex only lets numbers through
            raise ValueError(f"invalid duration {value!r}") from err
        position = match.end()
    if position == 0 or position != len(value):
        raise ValueError(
            f"invalid duration {value!r}: expected a Go-style duration such as 90s, 30m or 1h30m"
        )
    try:
        return timedelta(microseconds=int(total))
    except OverflowError as err:
        raise ValueError(f"duration {value!r} is too long") from err


def format_duration(delta: timedelta) -> str:
    """Render a timedelta the way Go prints durations ("1h30m0s"), for messages."""
    total = int(delta.total_seconds())
    sign = "-" if total < 0 else ""
    total = abs(total)
    hours, rest = divmod(total, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{sign}{minutes}m{seconds}s"
    return f"{sign}{seconds}s"


@dataclass(frozen=True)
class ResetAfter:
    """The reset-after duration in force and, when the user's value was unusable, why not."""

    duration: timedelta
    fallback_reason: str | None = None


def parse_reset_after(value: str | None, default: timedelta = DEFAULT_RESET_AFTER) -> ResetAfter:
    """Read `kn-rescheduler.io/reset-after`; an unusable value falls back to the default.

    Unlike the retries, a bad reset-after is not a reason to do nothing: the user opted in,
    and the default is a safe reading. The reason lets the caller warn about it.
    """
    if value is None:
        return ResetAfter(default)
    try:
        duration = parse_duration(value)
    except ValueError as err:
        return ResetAfter(
            default, f"{RESET_AFTER_ANNOTATION}: {err}; using {format_duration(default)}"
        )
    if duration <= timedelta(0):
        return ResetAfter(
            default,
            f"{RESET_AFTER_ANNOTATION} must be positive, got {value!r}; "
            f"using {format_duration(default)}",
        )
    return ResetAfter(duration)


def parse_kube_time(value: str | None) -> datetime | None:
    """Parse an API server timestamp ("2024-05-01T12:00:00Z") into an aware UTC datetime.

    The API server always writes RFC 3339 in UTC with a Z; anything unreadable gives None so
    a bad field degrades one decision instead of failing the whole handler.
    """
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        # OverflowError: a valid offset that takes the moment out of datetime's range in UTC
        # ("0001-01-01T00:00:00+00:01"); no API server writes it, a forged event can.
        return None


def format_kube_time(value: datetime) -> str:
    """Format an aware datetime the way the API server does (second precision, Z)."""
    if value.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    # Four-digit years whatever the platform's strftime does with years before 1000, so
    # that what we write parses back.
    moment = value.astimezone(UTC)
    return f"{moment.year:04d}-" + moment.strftime("%m-%dT%H:%M:%SZ")


class OwnerKind(StrEnum):
    """Who owns the failing pod, which decides where the state lives and how it is counted."""

    REPLICA_SET = "ReplicaSet"
    STATEFUL_SET = "StatefulSet"
    JOB = "Job"
    # A pod without a controller: its state lives in its own annotations.
    POD = "Pod"


class BudgetScope(StrEnum):
    """Whether the moves are counted for the whole workload or for each pod name."""

    WORKLOAD = "workload"
    # StatefulSet pods are not interchangeable: web-0 failing says nothing about web-1.
    PER_POD = "per-pod"


@dataclass(frozen=True)
class Policy:
    """The policy in force for one failing pod's workload."""

    retries: int
    owner_kind: OwnerKind
    replicas: int = 1
    reset_after: timedelta = DEFAULT_RESET_AFTER

    def __post_init__(self) -> None:
        # Accept the plain kind strings owner resolution works with ("ReplicaSet", ...).
        object.__setattr__(self, "owner_kind", OwnerKind(self.owner_kind))
        if self.retries < 0:
            raise ValueError(f"retries must not be negative, got {self.retries}")
        if self.replicas < 0:
            raise ValueError(f"replicas must not be negative, got {self.replicas}")

    @property
    def scope(self) -> BudgetScope:
        if self.owner_kind is OwnerKind.STATEFUL_SET:
            return BudgetScope.PER_POD
        return BudgetScope.WORKLOAD

    @property
    def budget(self) -> int:
        """How many moves are allowed in the scope: exactly this many, no more.

        A ReplicaSet shares retries x replicas among its interchangeable pods (the seed's
        rule); a StatefulSet pod, a Job and a bare pod each get `retries`. A ReplicaSet
        scaled to zero still counts as one replica, so a pod failing while it scales down is
        treated like any other.
        """
        if self.owner_kind is OwnerKind.REPLICA_SET:
            return self.retries * max(self.replicas, 1)
        return self.retries

    @property
    def disabled(self) -> bool:
        return self.retries == 0
