"""score-nodes: kube-scheduler's HTTP extender (``POST .../filter``, ``POST .../prioritize``).

The scheduler calls ``urlPrefix + "/" + verb`` with ``ExtenderArgs`` (the pod and the Node
objects left after its own filters) and waits for the answer before it binds, so this function
does no I/O at all: the decisions come from the Node objects in the request
(shared.nodes.score_nodes.decide), the wire format is shared.nodes.score_nodes.handler. Every
configuration we ship marks the extender ``ignorable``, so an answer that is not 200 (or no
answer) only means the scheduler places the pod without us.

- 200 with the result for every request we can read, whatever its nodes hold (a node whose
  usage cannot be read passes, with a neutral score; when every node is hot, a pod that did
  not name the load-aware scheduler gets them all, ranked by score, and a warning is logged);
- 400 with ``{"error": ...}`` and a log line for a body that is not ExtenderArgs;
- ``GET /healthz`` for probes, ``GET /metrics`` for Prometheus.

The settings are read at start-up: a value we cannot use stops the function with ConfigError.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import UTC, datetime

import flask
import functions_framework

from shared.nodes.score_nodes import decide as extender
from shared.nodes.score_nodes.handler import (
    LATENCY,
    NODE_DECISIONS,
    REQUESTS,
    WireError,
    filter_response,
    parse_args,
    priority_response,
)
from shared.platform import logs, metrics
from shared.platform.config import Config, describe

FUNCTION = "score-nodes"
logs.configure(FUNCTION)
log = logging.getLogger(FUNCTION)
CONFIG = Config.from_env(os.environ)
log.info("configuration", extra={"config": describe(CONFIG)})

VERBS = ("filter", "prioritize")


def _json(body: object, status: int = 200) -> flask.Response:
    return flask.Response(
        json.dumps(body, separators=(",", ":")), status=status, mimetype="application/json"
    )


def _pod_ref(args_pod: object) -> str:
    metadata = args_pod.get("metadata") if isinstance(args_pod, dict) else None
    if not isinstance(metadata, dict):
        return ""
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def _answer(verb: str, body: bytes) -> flask.Response:
    started = time.perf_counter()
    try:
        args = parse_args(body)
    except WireError as err:
        log.warning(
            "malformed extender request: %s",
            err,
            extra={"verb": verb, "status": 400, "bytes": len(body)},
        )
        REQUESTS.labels(verb=verb, code="400").inc()
        return _json({"error": str(err)}, 400)
    now = datetime.now(UTC)
    if verb == "filter":
        result = (
            extender.pass_unknown(args.names)
            if args.nodes is None
            else extender.filter_nodes(args.pod, args.nodes, CONFIG, now)
        )
        for verdict in result.verdicts:
            NODE_DECISIONS.labels(verb=verb, reason=verdict.reason).inc()
        response = _json(filter_response(args, result))
        failed = result.failed
        every_node_hot = any(v.reason == extender.EVERY_NODE_HOT for v in result.verdicts)
        log.log(
            logging.WARNING if every_node_hot else logging.INFO if failed else logging.DEBUG,
            "filter: %d of %d nodes pass%s",
            len(args.names) - len(failed),
            len(args.names),
            " (every node over its usage limits: all passed, ranked by score)"
            if every_node_hot
            else "",
            extra={
                "verb": verb,
                "pod": _pod_ref(args.pod),
                "failed": failed,
                "duration_ms": round(1000 * (time.perf_counter() - started), 2),
            },
        )
    else:
        priorities = (
            extender.unknown_nodes(args.names)
            if args.nodes is None
            else extender.prioritize(args.pod, args.nodes, CONFIG, now)
        )
        for score in priorities.scores:
            NODE_DECISIONS.labels(verb=verb, reason=score.reason).inc()
        response = _json(priority_response(priorities))
        log.debug(
            "prioritize",
            extra={
                "verb": verb,
                "pod": _pod_ref(args.pod),
                "scores": {score.node: score.score for score in priorities.scores},
            },
        )
    REQUESTS.labels(verb=verb, code="200").inc()
    LATENCY.labels(verb=verb).observe(time.perf_counter() - started)
    return response


@functions_framework.http
def handle(request: flask.Request) -> flask.Response:
    path = request.path.rstrip("/")
    verb = path.rsplit("/", 1)[-1]
    if request.method == "GET" and path == "/healthz":
        return flask.Response("ok", mimetype="text/plain")
    if request.method == "GET" and path == "/metrics":
        return metrics.response()
    if verb in VERBS:
        if request.method != "POST":
            return _json({"error": f"POST ExtenderArgs to {path}"}, 405)
        return _answer(verb, request.get_data())
    return _json({"error": f"unknown path {request.path}; POST .../filter or .../prioritize"}, 404)
