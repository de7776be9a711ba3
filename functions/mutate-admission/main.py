"""mutate-admission: AdmissionReview v1 for pod CREATE, always allowed, maybe patched.

The entry point only; the logic is shared.admission.handler. Served over TLS (the API server calls
webhooks over HTTPS only): gunicorn with --certfile/--keyfile, see knative/ and docs. With
TLS_CLIENT_CA_FILE set, gunicorn also requires a client certificate signed by that CA, so only
an API server configured with one (its AdmissionConfiguration) gets an answer
(functions/gunicorn.conf.py, docs/install-hardening.md "Hardening the webhook").

The webhook port is reachable by anything that can reach the pod, so a request body is never
trusted to be small: a body over KN_RESCHEDULER_WEBHOOK_MAX_BODY_BYTES (or the shared
KN_RESCHEDULER_MAX_BODY_BYTES; default 3 MiB) is refused with 413 before it is read
(shared.platform.bodies). The API server never sends that much for a pod: it refuses
request bodies over 3 MiB itself (--max-request-body-bytes), and etcd stores objects of at most
1.5 MiB (--max-request-bytes).
"""

from __future__ import annotations

import json
import logging
import os
import time

import flask
import functions_framework

from shared.admission.handler import Admitter
from shared.platform import logs, metrics
from shared.platform.bodies import EVENT_MAX_BODY, BodyLimit
from shared.platform.config import Config, describe
from shared.platform.kube import Kube

FUNCTION = "mutate-admission"
logs.configure(FUNCTION)
CONFIG = Config.for_function(FUNCTION, os.environ)
log = logging.getLogger(FUNCTION)
log.info("configuration", extra={"config": describe(CONFIG, FUNCTION)})

ADMITTER = Admitter(lambda: Kube.from_environment(dry_run=CONFIG.dry_run), CONFIG)

# The webhook's own setting, kept from before every function had a limit; the shared one
# (KN_RESCHEDULER_MAX_BODY_BYTES) applies when it is not set.
WEBHOOK_MAX_BODY_ENV = "KN_RESCHEDULER_WEBHOOK_MAX_BODY_BYTES"
BODY_LIMIT = (
    BodyLimit.from_env(os.environ, EVENT_MAX_BODY, setting=WEBHOOK_MAX_BODY_ENV)
    if os.environ.get(WEBHOOK_MAX_BODY_ENV, "").strip()
    else BodyLimit.from_env(os.environ, EVENT_MAX_BODY)
)
MAX_BODY = BODY_LIMIT.max_bytes
log.info("request size limit", extra={"max_body_bytes": MAX_BODY})


@functions_framework.http
def handle(request: flask.Request) -> flask.Response:
    if request.method == "GET":
        if request.path.rstrip("/") == "/metrics":
            return metrics.response()
        return flask.Response("ok", mimetype="text/plain")
    started = time.perf_counter()
    # Refused on the declared length, before a byte of the body is read; a chunked body (no
    # Content-Length) is refused as soon as more than the limit has arrived. The API server
    # admits the pod unchanged (failurePolicy Ignore), so the log says why.
    raw = BODY_LIMIT.read(request)
    if raw is None:
        metrics.WEBHOOK.labels(result="too-large").inc()
        return BODY_LIMIT.too_large(request, FUNCTION)
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
