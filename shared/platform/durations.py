"""Durations as Kubernetes and Knative users write them: Go's syntax ("90s", "30m", "1h30m").

Settings and annotations both take durations, so reading them belongs to no one domain: the
settings (`config`) and the rescheduling domain's annotations share this one reader, and
messages print durations back the way Go does.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Final

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
