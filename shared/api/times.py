"""Times and durations as they are written on the wire, read and written in one place.

Times are RFC 3339, the way the API server and CloudEvents write them and the way every record
of ours stores them. Durations are Go's syntax ("90s", "30m", "1h30m"), the way Kubernetes and
Knative users write them in settings and annotations; messages print them back the way Go does.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
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


def parse_time(raw: object) -> datetime:
    """An RFC 3339 time as the API server and CloudEvents write it, as an aware datetime in UTC.
    Raises ValueError for anything else, a time without a zone included."""
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"not a time: {raw!r}")
    value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"a time without a zone: {raw!r}")
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError(f"a time out of range in UTC: {raw!r}") from exc


def format_time(value: datetime) -> str:
    """An aware datetime the way the API server writes it (second precision, Z)."""
    if value.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    moment = value.astimezone(UTC)
    # Four-digit years whatever the platform's strftime does with years before 1000.
    return f"{moment.year:04d}-" + moment.strftime("%m-%dT%H:%M:%SZ")


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
