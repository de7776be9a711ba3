"""Bugs the fuzzers found that the product does not fix yet, so that the fuzzers keep looking
for new ones meanwhile instead of stopping at the first known one.

Each bug has a strict xfail regression test with its minimal example in
test_found_by_fuzzing.py. A fuzzer that meets a known bug counts it (hypothesis' statistics,
`make fuzz`, show "known bug ..." with how often) and goes on; anything else fails. When a fix
lands, its regression test passes, the strict xfail turns that into a failure, and both the
marker and the entry here go: from then on the fuzzers hold the product to it.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import event


@dataclass(frozen=True)
class KnownBug:
    key: str
    summary: str
    # The exceptions it raises (by name: a 500 answer only names them), and a pattern its
    # message matches when the type alone would be too broad.
    raises: frozenset[str]
    says: str = ""
    # Only when the input had fields of the wrong type (a pod no API server sends).
    ill_typed_only: bool = False


TIMESTAMP_RANGE = KnownBug(
    "F1",
    "a valid RFC 3339 timestamp out of range in UTC raises OverflowError",
    frozenset({"OverflowError"}),
    says="date value out of range",
)
DEEP_JSON = KnownBug(
    "F2",
    "deeply nested JSON raises RecursionError (json.loads, logs.redact)",
    frozenset({"RecursionError"}),
)
WRONG_TYPES = KnownBug(
    "F3",
    "a pod with a field of the wrong type crashes the classifier",
    frozenset({"AttributeError", "TypeError", "KeyError"}),
    ill_typed_only=True,
)
EARLY_YEARS = KnownBug(
    "F5",
    "a state with a year before 1000 is written back as a timestamp it cannot read",
    frozenset({"StateError"}),
    says=r"is not a timestamp: '[0-9]{1,3}-",
)
UIDLESS_POD = KnownBug(
    "F7",
    "detect-failures forwards a pod without a uid, which update-annotations refuses",
    frozenset({"ValueError"}),
    says="needs a non-empty string 'uid'",
)
KNOWN_BUGS = (TIMESTAMP_RANGE, DEEP_JSON, WRONG_TYPES, EARLY_YEARS, UIDLESS_POD)


def patch_without_pod(pod: object) -> bool:
    """F6: a review whose object is not a JSON object (null) is answered with a patch made for
    an empty pod (``add /metadata {}``), which cannot apply to what was sent. The API server
    always sends the pod, so only a forged review gets it. Counted when met."""
    if isinstance(pod, dict):
        return False
    event("known bug F6: a review without a pod object is answered with a patch")
    return True


def padded_policy(value: str, max_retries: int) -> bool:
    """F4: a policy within the maximum but written with more than six digits ("0000003") is
    refused as "more than the maximum". Counted when met."""
    if value.isascii() and value.isdigit() and len(value) > 6 and int(value) <= max_retries:
        event("known bug F4: a zero-padded policy within the maximum is refused")
        return True
    return False


def known_bug(name: str, message: str, *, ill_typed: bool = False) -> KnownBug | None:
    """The known bug an exception (its type name and message) is, counted; None if new."""
    for bug in KNOWN_BUGS:
        if name not in bug.raises or not re.search(bug.says, message):
            continue
        if bug.ill_typed_only and not ill_typed:
            continue
        event(f"known bug {bug.key}: {bug.summary}")
        return bug
    return None


@contextlib.contextmanager
def tolerating_known_bugs(*, ill_typed: bool = False) -> Iterator[None]:
    """Let a known bug end the example quietly (counted); re-raise anything else."""
    try:
        yield
    except Exception as exc:
        if known_bug(type(exc).__name__, str(exc), ill_typed=ill_typed) is None:
            raise


def known_answer(response: Any, *, ill_typed: bool = False) -> bool:
    """Whether a 500 answer is a known bug: the functions answer an unexpected exception with
    ``{"error": "<ExceptionName>: <message>"}``."""
    if response.status_code != 500:
        return False
    try:
        error = str(json.loads(response.data).get("error", ""))
    except (ValueError, AttributeError):
        return False
    name, _, message = error.partition(": ")
    return known_bug(name, message, ill_typed=ill_typed) is not None
