"""mutate-admission: AdmissionReview v1 for pod CREATE, always allowed, maybe patched.

The entry point only; the logic is shared.admission.handler. Served over TLS (the API server calls
webhooks over HTTPS only): gunicorn with --certfile/--keyfile, see knative/ and docs. With
TLS_CLIENT_CA_FILE set, gunicorn also requires a client certificate signed by that CA, so only
an API server configured with one (its AdmissionConfiguration) gets an answer
(functions/gunicorn.conf.py, docs/install.md "Hardening the webhook").

The webhook port is reachable by anything that can reach the pod, so a request body is never
trusted to be small: a body over KN_RESCHEDULER_WEBHOOK_MAX_BODY_BYTES (default 3 MiB) is
refused with 413 before it is read. The API server never sends that much for a pod: it refuses
request bodies over 3 MiB itself (--max-request-body-bytes), and etcd stores objects of at most
1.5 MiB (--max-request-bytes).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping

import flask
import functions_framework

from shared.admission.handler import Admitter
from shared.platform import logs, metrics
from shared.platform.config import Config, describe
from shared.platform.kube import Kube

FUNCTION = "mutate-admission"
logs.configure(FUNCTION)
CONFIG = Config.from_env(os.environ)
log = logging.getLogger(FUNCTION)
log.info("configuration", extra={"config": describe(CONFIG)})

ADMITTER = Admitter(lambda: Kube.from_environment(dry_run=CONFIG.dry_run), CONFIG)

MAX_BODY_ENV = "KN_RESCHEDULER_WEBHOOK_MAX_BODY_BYTES"
DEFAULT_MAX_BODY = 3 * 1024 * 1024


def max_body_bytes(environ: Mapping[str, str]) -> int:
    """The request size limit; a value that is not a positive whole number stops the function
    at start-up, like any other setting."""
    raw = environ.get(MAX_BODY_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BODY
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise ValueError(f"{MAX_BODY_ENV}: expected a positive number of bytes, got {raw!r}")
    return int(raw)


MAX_BODY = max_body_bytes(os.environ)
log.info("request size limit", extra={"max_body_bytes": MAX_BODY})


def too_large(length: int | None) -> flask.Response:
    """413, said in the log and in the answer. The API server admits the pod unchanged
    (failurePolicy Ignore), so a person must learn why from the log."""
    declared = "a chunked body" if length is None else f"{length} bytes"
    message = f"request body too large: {declared}, the limit is {MAX_BODY} bytes ({MAX_BODY_ENV})"
    log.warning(message, extra={"bytes": length, "max_body_bytes": MAX_BODY})
    metrics.WEBHOOK.labels(result="too-large").inc()
    payload = json.dumps({"error": message}).encode()
    # An iterator body makes the response "streamed", and functions-framework's after-request
    # hook reads the whole request body only for responses that are not: reading it is what
    # the limit is there to prevent. Content-Length keeps it a plain, unchunked answer.
    return flask.Response(
        iter([payload]),
        413,
        mimetype="application/json",
        headers={"Content-Length": str(len(payload))},
    )


def read_at_most(request: flask.Request, limit: int) -> bytes | None:
    """The body, or None once it is longer than ``limit``. Read here in bounded pieces rather
    than with Flask's max_content_length, whose stream stops quietly at the limit (the caller
    would parse a truncated body) instead of failing."""
    pieces: list[bytes] = []
    total = 0
    while True:
        piece = request.stream.read(min(64 * 1024, limit + 1 - total))
        if not piece:
            return b"".join(pieces)
        pieces.append(piece)
        total += len(piece)
        if total > limit:
            return None


@functions_framework.http
def handle(request: flask.Request) -> flask.Response:
    if request.method == "GET":
        if request.path.rstrip("/") == "/metrics":
            return metrics.response()
        return flask.Response("ok", mimetype="text/plain")
    started = time.perf_counter()
    # Refused on the declared length, before a byte of the body is read; a chunked body (no
    # Content-Length) is refused as soon as more than the limit has arrived.
    if request.content_length is not None and request.content_length > MAX_BODY:
        return too_large(request.content_length)
    raw = read_at_most(request, MAX_BODY)
    if raw is None:
        return too_large(request.content_length)
    try:
        body = json.loads(raw or b"null")
        answer = ADMITTER.review(body)
    except (ValueError, RecursionError) as exc:
        # RecursionError: JSON nested deeper than json.loads follows (no pod is).
        log.warning("malformed AdmissionReview: %s", exc)
        return flask.Response(json.dumps({"error": str(exc)}), 400, mimetype="application/json")
    finally:
        metrics.LATENCY.labels(function=FUNCTION).observe(time.perf_counter() - started)
    return flask.Response(json.dumps(answer), 200, mimetype="application/json")
