"""The installed functions' logs as one event archive, for ``make replay``.

Locally the stack's archive Trigger records every event the Broker accepted. On a cluster the
record is the functions' own logs: a function logs in full every event that led to an action
(every event it receives with ``KN_RESCHEDULER_LOG_EVENTS=all``; shared/platform/logs.py).
``make archive`` reads them with ``kubectl logs`` and pipes them here, which writes them as the
local archive is written: one structured CloudEvent per line, in the order the functions
received them, each event once though several functions logged it (one pod update goes to
every Trigger that matches it, and each function that acted on it logs it).

The file outlives the pods, whose logs go with them (a rollout, a rescheduled function pod): a
log store keeps them longer, and its export (JSON lines as the functions wrote them) pipes in
here the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from kubectl_kn_rescheduler import replay

# An event whose line carries no time sorts first: it cannot be placed, and first is where a
# reader looks.
_UNKNOWN: Final = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Archive:
    """The events of the logs, deduplicated and in order, and what was left out."""

    events: tuple[replay.Recorded, ...]
    duplicates: int
    not_events: int

    def lines(self) -> list[str]:
        """One structured CloudEvent per line, as the local archive stores them; ``_received``
        is when the function logged it, which replay orders by."""
        out = []
        for item in self.events:
            record: dict[str, Any] = item.event.structured()
            if item.time is not None:
                record["_received"] = item.time.isoformat()
            out.append(json.dumps(record, separators=(",", ":")))
        return out


def collect(lines: Iterable[str]) -> Archive:
    """The archive of ``lines``: function log lines, archive lines, or both, in any order.

    An event is the same event when its ``source`` and ``id`` are (the CloudEvents spec's
    identity); the earliest record of it is kept.
    """
    found, not_events = replay.read(lines)
    ordered = sorted(found, key=lambda r: (r.time or _UNKNOWN, r.line))
    seen: set[tuple[str, str]] = set()
    kept: list[replay.Recorded] = []
    for item in ordered:
        key = (item.event.source, item.event.id)
        if key not in seen:
            seen.add(key)
            kept.append(item)
    return Archive(tuple(kept), len(found) - len(kept), not_events)


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(
        prog="archive",
        description="Turn the functions' JSON logs into an event archive that replay reads.",
    )
    parser.add_argument("file", nargs="?", default="-", help="log lines (- for stdin)")
    args = parser.parse_args(argv)
    try:
        stream = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        parser.error(f"cannot read {args.file}: {exc.strerror}")
    with stream:
        archive = collect(stream)
    for line in archive.lines():
        print(line, file=out)
    print(
        f"archive: {len(archive.events)} event(s); {archive.duplicates} logged again by another "
        f"function, {archive.not_events} line(s) without an event (a function logs the whole "
        "event only when it led to an action, unless KN_RESCHEDULER_LOG_EVENTS=all)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
