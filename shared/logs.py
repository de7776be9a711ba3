"""One JSON object per log line, carrying the CloudEvent being handled.

Platform teams ship container stdout to a log store and search it by event id; the replay tool
reads the ``cloudevent`` field of "event received" lines back into events. So every line is
JSON, and every line logged while an event is handled names that event.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

_event: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "cloudevent", default=None
)

# LogRecord attributes that are not "extra" fields.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, function: str) -> None:
        super().__init__()
        self.function = function

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "function": self.function,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        current = _event.get()
        if current:
            line.update(current)
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, separators=(",", ":"))


def configure(function: str) -> None:
    """JSON lines on stdout for the whole process (idempotent)."""
    root = logging.getLogger()
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter(function))
    root.handlers = [handler]
    root.setLevel(os.environ.get("KN_RESCHEDULER_LOG_LEVEL", "INFO").upper())


@contextlib.contextmanager
def event_context(event_id: str, event_type: str, subject: str) -> Iterator[None]:
    token = _event.set({"ce_id": event_id, "ce_type": event_type, "ce_subject": subject})
    try:
        yield
    finally:
        _event.reset(token)
