"""One JSON object per log line, carrying the CloudEvent being handled.

Platform teams ship container stdout to a log store and search it by event id; the replay tool
reads the ``cloudevent`` field of a line back into an event. So every line is JSON, and every
line logged while an event is handled names that event.

What a line may carry is bounded on purpose. detect-failures receives every pod change in the
cluster, including pods of namespaces that never opted in, and a pod's spec can hold literal
``env`` values (passwords are often passed that way) and its ``managedFields`` (kilobytes of
field ownership). So by default (``KN_RESCHEDULER_LOG_EVENTS=actions``) each event gets one
compact line, and the full event is logged only when it led to something (a reply, a write to
the API server, a 4xx or 5xx answer): exactly the events worth replaying. With
``KN_RESCHEDULER_LOG_EVENTS=all`` every event is logged in full, the archive a replay of
everything needs; at log level DEBUG too. Either way the full event is ``redact``-ed first.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Final

_event: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "cloudevent", default=None
)

LOG_LEVEL_ENV: Final = "KN_RESCHEDULER_LOG_LEVEL"
LOG_EVENTS_ENV: Final = "KN_RESCHEDULER_LOG_EVENTS"
# The build the process runs (the image's org.opencontainers.image.version, set by the
# Dockerfile): on every line, so that the lines of two versions side by side in one log store
# (a rollout, a rollback) tell which build decided what.
VERSION_ENV: Final = "KN_RESCHEDULER_VERSION"
# actions: the full event only for events that led to something; all: every event in full.
LOG_EVENTS_CHOICES: Final = ("actions", "all")

# LogRecord attributes that are not "extra" fields.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, function: str, version: str | None = None) -> None:
        super().__init__()
        self.function = function
        self.version = version

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "function": self.function,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.version:
            line["version"] = self.version
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
    """JSON lines on stdout for the whole process (idempotent).

    Raises ValueError for a KN_RESCHEDULER_LOG_EVENTS value it does not know, so that a typo
    stops the function at start-up instead of silently logging less (or more) than asked.
    """
    log_every_event(os.environ)
    root = logging.getLogger()
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter(function, os.environ.get(VERSION_ENV) or None))
    root.handlers = [handler]
    root.setLevel(os.environ.get(LOG_LEVEL_ENV, "INFO").upper())


def log_every_event(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether every event is to be logged in full (``KN_RESCHEDULER_LOG_EVENTS=all``)."""
    mode = environ.get(LOG_EVENTS_ENV, "").strip().lower() or LOG_EVENTS_CHOICES[0]
    if mode not in LOG_EVENTS_CHOICES:
        raise ValueError(
            f"{LOG_EVENTS_ENV}: expected one of {', '.join(LOG_EVENTS_CHOICES)}, got {mode!r}"
        )
    return mode == "all"


# Pod spec fields holding lists of containers (a Pod's spec, a template's, a bare pod's snapshot
# in a failing event: wherever they appear).
_CONTAINER_LISTS: Final = frozenset({"containers", "initContainers", "ephemeralContainers"})


# Deeper than any Kubernetes object: what lies below is replaced by a placeholder, so that a
# hostile event nested just under json.loads' limit cannot overflow the stack while logging.
REDACT_MAX_DEPTH: Final = 100


def redact(value: Any, _depth: int = 0) -> Any:
    """A copy of ``value`` (an event as JSON) fit for a log line: every container's
    ``env[].value`` and every object's ``metadata.managedFields`` dropped.

    Literal env values go because they are where secrets end up in practice (a password set
    inline instead of through a Secret), and no decision of ours reads them: classification
    looks at the status, and a bare pod is recreated from the live pod read from the API
    server, never from a logged or delivered event. ``valueFrom`` stays: it only names a Secret
    or ConfigMap key (not its content) and shows what the pod depends on, which helps a person
    debugging a failure. ``managedFields`` go because they are bulk (often half the object)
    that nothing here uses. ``value`` is removed rather than masked, so a redacted pod is
    still a valid pod.
    """
    if _depth >= REDACT_MAX_DEPTH and isinstance(value, dict | list):
        return f"<nested deeper than {REDACT_MAX_DEPTH} levels: not logged>"
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            kept = item
            if key == "metadata" and isinstance(item, dict):
                kept = {k: v for k, v in item.items() if k != "managedFields"}
            elif key in _CONTAINER_LISTS and isinstance(item, list):
                kept = [_without_env_values(c) for c in item]
            out[key] = redact(kept, _depth + 1)
        return out
    if isinstance(value, list):
        return [redact(item, _depth + 1) for item in value]
    return value


def _without_env_values(container: Any) -> Any:
    if not isinstance(container, dict) or not isinstance(container.get("env"), list):
        return container
    env = [
        {k: v for k, v in var.items() if k != "value"} if isinstance(var, dict) else var
        for var in container["env"]
    ]
    return {**container, "env": env}


@contextlib.contextmanager
def event_context(event_id: str, event_type: str, subject: str) -> Iterator[None]:
    token = _event.set({"ce_id": event_id, "ce_type": event_type, "ce_subject": subject})
    try:
        yield
    finally:
        _event.reset(token)
