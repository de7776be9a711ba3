"""The pressure record label-nodes keeps on a Node: which rule holds the label, since when.

label-nodes is stateless and an evaluation must still know how long a value has been over a
threshold (a rule's ``for``) and when a label was last confirmed, so both live on the Node in
the JSON annotation ``kn-rescheduler.io/pressure`` (``shared.nodes.label_nodes.decide`` says
why there and how they are used). A labelled node's record names the rule, its value, since
when the node is labelled and when an evaluation last saw it under pressure (``seen``); a node
whose rules have not fired for their ``for`` yet carries only ``pending``::

    {"v":1,"rule":"memory-pressure","value":93.257,"since":"...","seen":"..."}
    {"v":1,"pending":{"cpu-pressure":"2026-11-20T09:42:00Z"}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from shared.api import records
from shared.api.records import RecordError
from shared.api.times import format_time, parse_time

RECORD_VERSION: Final = 1

FORMAT: Final = records.Format(name="pressure record", version_key="v", version=RECORD_VERSION)


@dataclass(frozen=True)
class Record:
    """What the pressure annotation on a Node says."""

    rule: str = ""
    value: float | None = None
    since: datetime | None = None
    seen: datetime | None = None
    pending: Mapping[str, datetime] = field(default_factory=dict)

    def to_json(self) -> str:
        out: dict[str, Any] = {}
        if self.rule:
            out["rule"] = self.rule
        if self.value is not None:
            out["value"] = self.value
        if self.since is not None:
            out["since"] = format_time(self.since)
        if self.seen is not None:
            out["seen"] = format_time(self.seen)
        if self.pending:
            out["pending"] = {rule: format_time(at) for rule, at in sorted(self.pending.items())}
        return records.dump(out, FORMAT)

    @classmethod
    def from_json(cls, text: str) -> Record:
        """The record in the annotation; RecordError when it is not one we can read."""
        _, data = records.load(text, FORMAT)
        try:
            value = data.get("value")
            pending = data.get("pending") or {}
            if not isinstance(pending, dict):
                raise TypeError("pending is not a mapping")
            return cls(
                rule=str(data.get("rule") or ""),
                value=None if value is None else float(value),
                since=_time(data.get("since")),
                seen=_time(data.get("seen")),
                pending={str(rule): parse_time(at) for rule, at in pending.items()},
            )
        except (TypeError, ValueError) as err:
            raise RecordError(f"unreadable pressure record: {err}") from err


def _time(raw: object) -> datetime | None:
    return None if raw is None else parse_time(raw)
