"""What the functions log, captured as the JSON lines they write in production.

``logs.configure`` keeps a handler with a JsonFormatter as the process's own, so a handler
added here before a function is loaded receives every line it logs, at INFO.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Iterator

from shared.platform import logs


@contextlib.contextmanager
def log_lines(function: str = "test") -> Iterator[Callable[[], list[str]]]:
    """The JSON lines logged from here on, one string each, for the block."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter(function))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield lambda: stream.getvalue().splitlines()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
