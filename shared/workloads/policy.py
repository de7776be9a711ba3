"""Parsing the values users write: the retry policy and API timestamps.

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
from datetime import timedelta
from enum import StrEnum
from typing import Final

from shared.api.keys import POLICY_ANNOTATION, RESET_AFTER_ANNOTATION
from shared.api.times import format_duration, parse_duration
from shared.platform.config import MAX_RETRIES

DEFAULT_RESET_AFTER: Final = timedelta(minutes=30)

_DIGITS = re.compile(r"[0-9]+")


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
