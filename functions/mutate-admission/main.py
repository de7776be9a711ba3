"""mutate-admission: AdmissionReview v1 for pod CREATE, always allowed, maybe patched.

The entry point only; the logic is shared.webhook. Served over TLS (the API server calls
webhooks over HTTPS only): gunicorn with --certfile/--keyfile, see knative/ and docs.
"""

from __future__ import annotations

import json
import logging
import os
import time

import flask
import functions_framework

from shared import logs, metrics
from shared.config import Config, describe
from shared.kube import Kube
from shared.webhook import Admitter

FUNCTION = "mutate-admission"
logs.configure(FUNCTION)
CONFIG = Config.from_env(os.environ)
log = logging.getLogger(FUNCTION)
log.info("configuration", extra={"config": describe(CONFIG)})

ADMITTER = Admitter(lambda: Kube.from_environment(dry_run=CONFIG.dry_run), CONFIG)


@functions_framework.http
def handle(request: flask.Request) -> flask.Response:
    if request.method == "GET":
        if request.path.rstrip("/") == "/metrics":
            return metrics.response()
        return flask.Response("ok", mimetype="text/plain")
    started = time.perf_counter()
    try:
        body = json.loads(request.get_data() or b"null")
        answer = ADMITTER.review(body)
    except ValueError as exc:
        log.warning("malformed AdmissionReview: %s", exc)
        return flask.Response(json.dumps({"error": str(exc)}), 400, mimetype="application/json")
    finally:
        metrics.LATENCY.labels(function=FUNCTION).observe(time.perf_counter() - started)
    return flask.Response(json.dumps(answer), 200, mimetype="application/json")
