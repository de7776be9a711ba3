"""The hot streak rebalance-nodes keeps on a Node: how many samples in a row found it hot.

rebalance-nodes acts on a node only after ``rebalance_hot_samples`` hot samples in a row
(``shared.nodes.rebalance_nodes.decide`` says why samples and not evaluations). The count lives
on the Node in the JSON annotation ``kn-rescheduler.io/hot-streak``, with the ``sampledAt`` of
the usage record it last counted (``sample``)::

    {"v":2,"hot":3,"since":"2026-11-20T09:30:00Z","sample":"2026-11-20T09:50:00Z"}

Version 1 counted evaluations and stored no sample; it is read as no streak at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from shared.api import records
from shared.api.keys import HOT_STREAK_ANNOTATION
from shared.api.kubetypes import Node
from shared.api.records import RecordError
from shared.api.times import format_time, parse_time
from shared.api.usage import UsageRecord

# 2: the streak counts samples (the record's sampledAt it last counted), not evaluations.
STREAK_VERSION: Final = 2

FORMAT: Final = records.Format(name="hot streak", version_key="v", version=STREAK_VERSION)


@dataclass(frozen=True)
class Streak:
    """How many samples in a row found the node hot, since when, and the sample last counted.

    ``sample`` is the ``sampledAt`` of the usage record last counted: a record is read by every
    evaluation while it stays fresh (``usage_stale_after``), and annotate-usage rewrites it
    only when a value moved or before it would go stale, so the count advances only on a
    record sampled after this one. After acting, the count is 0 and ``sample`` holds the
    record acted on, which then counts for nothing.
    """

    hot: int = 0
    since: datetime | None = None
    sample: datetime | None = None

    def to_json(self) -> str:
        out: dict[str, Any] = {"hot": self.hot}
        if self.since is not None:
            out["since"] = format_time(self.since)
        if self.sample is not None:
            out["sample"] = format_time(self.sample)
        return records.dump(out, FORMAT)

    @classmethod
    def from_json(cls, text: str) -> Streak:
        """The streak an annotation holds; an unreadable one counts as none (it is ours, and
        only ever a count: starting again from zero costs a few samples, nothing more). So
        does a version 1 streak, which counted evaluations rather than samples."""
        try:
            _, data = records.load(text, FORMAT)
            hot = data["hot"]
            if type(hot) is not int or hot < 0:
                return cls()
            raw = data.get("since")
            since = parse_time(raw) if isinstance(raw, str) else None
            raw = data.get("sample")
            sample = parse_time(raw) if isinstance(raw, str) else None
        except (RecordError, ValueError, KeyError):
            return cls()
        return cls(hot, since, sample)

    def counted(self, record: UsageRecord, now: datetime) -> Streak:
        """The streak after a hot evaluation of ``record``: one more when the record was
        sampled after the one last counted, else unchanged."""
        if self.sample is not None and record.sampled_at <= self.sample:
            return self
        return Streak(self.hot + 1, self.since or now, record.sampled_at)

    def acted_on(self) -> Streak | None:
        """The streak once the node was acted on: no count, the sample remembered."""
        return None if self.sample is None else Streak(0, None, self.sample)


def read_streak(node: Node) -> Streak | None:
    """The streak on the Node; None when it carries none."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(HOT_STREAK_ANNOTATION)
    return None if raw is None else Streak.from_json(raw)
