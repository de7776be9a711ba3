"""Request bodies read with a bound, by every function.

A function's port is reachable by anything that can reach its pod (NetworkPolicies narrow
that, they do not make it safe), so a body is never trusted to be small. Read whole, a body
costs a worker about twice its size (measured: a 64 MiB body took a worker from 54 to 186 MB
resident), and one request of about 100 MiB kills a function under its 256 Mi memory limit.
Every function therefore refuses a body over its limit with 413, said in one log line,
**before it is read** when its length is declared, and as soon as more than the limit has
arrived when it is chunked.

The limits, by default: 3 MiB for a CloudEvent or an AdmissionReview (the API server refuses
request bodies over 3 MiB itself, ``--max-request-body-bytes``, and etcd stores objects of at
most 1.5 MiB, so no pod event and no pod is larger) and 16 MiB for the scheduler extender's
ExtenderArgs (node names only in every configuration we ship; whole Node objects, when an
operator turns the node cache off, are about 5 KB each). ``KN_RESCHEDULER_MAX_BODY_BYTES``
sets another (the webhook's older ``KN_RESCHEDULER_WEBHOOK_MAX_BODY_BYTES`` too); a value that
is not a positive whole number stops the function at start-up, like any other setting.

Flask's ``max_content_length`` is not used: its stream stops quietly at the limit, and the
caller would parse a truncated body instead of failing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import flask

log = logging.getLogger(__name__)

MAX_BODY_ENV: Final = "KN_RESCHEDULER_MAX_BODY_BYTES"
EVENT_MAX_BODY: Final = 3 * 1024 * 1024
EXTENDER_MAX_BODY: Final = 16 * 1024 * 1024
_PIECE: Final = 64 * 1024


@dataclass(frozen=True)
class BodyLimit:
    """How many bytes a function reads of a request body, and the setting that says so."""

    max_bytes: int
    setting: str = MAX_BODY_ENV

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str], default: int, *, setting: str = MAX_BODY_ENV
    ) -> BodyLimit:
        raw = environ.get(setting, "").strip()
        if not raw:
            return cls(default, setting)
        if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
            raise ValueError(f"{setting}: expected a positive number of bytes, got {raw!r}")
        return cls(int(raw), setting)

    def read(self, request: flask.Request) -> bytes | None:
        """The body, or None when it is longer than the limit: refused on its declared length
        before a byte is read, or once more than the limit has arrived (a chunked body)."""
        if self.declared_too_large(request):
            return None
        pieces: list[bytes] = []
        total = 0
        while True:
            piece = request.stream.read(min(_PIECE, self.max_bytes + 1 - total))
            if not piece:
                return b"".join(pieces)
            pieces.append(piece)
            total += len(piece)
            if total > self.max_bytes:
                return None

    def too_large(self, request: flask.Request, function: str) -> flask.Response:
        """413, said in the log and in the answer (a Broker does not retry a 413, and a
        person reading a direct POST learns the limit and the setting)."""
        length = request.content_length
        declared = "a chunked body" if length is None else f"{length} bytes"
        message = (
            f"request body too large: {declared}, the limit is {self.max_bytes} bytes "
            f"({self.setting})"
        )
        log.warning(
            message,
            extra={"function": function, "bytes": length, "max_body_bytes": self.max_bytes},
        )
        return unread(413, message)

    def declared_too_large(self, request: flask.Request) -> bool:
        """Whether the declared length alone is over the limit (nothing read)."""
        return request.content_length is not None and request.content_length > self.max_bytes


def unread(status: int, message: str, headers: Mapping[str, str] | None = None) -> flask.Response:
    """An answer that leaves the request body unread: ``{"error": message}``."""
    payload = json.dumps({"error": message}).encode()
    # An iterator body makes the response "streamed", and functions-framework's after-request
    # hook reads the whole request body only for responses that are not: reading it is what
    # the limit (or the refusal) is there to prevent. Content-Length keeps it a plain,
    # unchunked answer.
    return flask.Response(
        iter([payload]),
        status,
        mimetype="application/json",
        headers={"Content-Length": str(len(payload)), **(headers or {})},
    )
