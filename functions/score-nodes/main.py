"""score-nodes: kube-scheduler's HTTP extender (``POST .../filter``, ``POST .../prioritize``).

The scheduler calls ``urlPrefix + "/" + verb`` with ``ExtenderArgs`` (the pod and the nodes left
after its own filters) and waits for the answer before it binds, so this function does no I/O
on the request path: the decisions (shared.nodes.score_nodes.decide) come from Node objects it
already holds, the wire format is shared.nodes.score_nodes.handler. Every configuration we ship
marks the extender ``ignorable``, so an answer that is not 200 (or no answer) only means the
scheduler places the pod without us.

Where the Nodes come from. The shipped scheduler configurations say ``nodeCacheCapable: true``:
the scheduler sends node names only, and the function looks them up in its node cache, a LIST
and WATCH of Nodes it keeps in a background thread (shared.platform.informer; only the fields
the decisions read). Measured in dev/bench/RESULTS.md: with whole Node objects in every
request (``nodeCacheCapable: false``, still answered), parsing and encoding them was most of
the time of a call and the scheduler's throughput fell to a quarter. While the cache has not
listed yet, or has lost the API server for longer than ``usage_stale_after``, every named node
passes with a neutral score: the extender steps aside, it never blocks. A name the cache does
not hold (a node that registered a moment ago) passes with a neutral score.

- 200 with the result for every request we can read, whatever its nodes hold (a node whose
  usage cannot be read passes, with a neutral score; when every node is hot, a pod that did
  not name the load-aware scheduler gets them all, ranked by score, and a warning is logged);
- 400 with ``{"error": ...}`` and a log line for a body that is not ExtenderArgs; 413 for a
  body over ``KN_RESCHEDULER_MAX_BODY_BYTES`` (16 MiB by default), refused before it is read
  (shared.platform.bodies);
- ``GET /healthz`` for probes, ``GET /metrics`` for Prometheus, ``GET /debug/node-cache`` for
  the cache as the decisions see it (whether it is ready, its resourceVersion, every node).

The settings are read at start-up: a value we cannot use stops the function with ConfigError.
``extender_node_cache: false`` turns the cache off (no API access needed; names-only requests
then all pass).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from datetime import UTC, datetime
from typing import cast

import flask
import functions_framework
import orjson

from shared.api.kubetypes import Node
from shared.nodes.score_nodes import decide as extender
from shared.nodes.score_nodes.handler import (
    CACHE_MISSES,
    CACHE_NODES,
    CACHE_READY,
    LATENCY,
    NODE_DECISIONS,
    REQUESTS,
    WireError,
    filter_response,
    parse_args,
    priority_response,
)
from shared.platform import informer, logs, metrics
from shared.platform.bodies import EXTENDER_MAX_BODY, BodyLimit
from shared.platform.config import Config, describe
from shared.platform.kube import JSON, Kube

FUNCTION = "score-nodes"
logs.configure(FUNCTION)
log = logging.getLogger(FUNCTION)
CONFIG = Config.for_function(FUNCTION, os.environ)
BODY_LIMIT = BodyLimit.from_env(os.environ, EXTENDER_MAX_BODY)
log.info("configuration", extra={"config": describe(CONFIG, FUNCTION)})

VERBS = ("filter", "prioritize")


# The node cache: listed and watched from start-up, so that it is warm before the scheduler's
# first names-only call. Trusted until the watch has been failing for as long as a usage record
# stays fresh: past that, the picture could be older than anything the decisions would accept.
def _keep(obj: JSON) -> extender.NodeView:
    """What the cache keeps of a Node from the watch: the Node parsed for the decisions."""
    return extender.view_of(cast(Node, obj), CONFIG)


NODES = informer.Cache(_keep, max_outage=CONFIG.usage_stale_after.total_seconds())
# Set to stop the cache's thread (tests that load this module more than once).
NODE_CACHE_STOP = None
if CONFIG.extender_node_cache:
    _, NODE_CACHE_STOP = informer.start(
        lambda: Kube.from_environment(timeout=CONFIG.api_timeout_seconds),
        "Node",
        NODES,
        name="node-cache",
    )
    # Read at each scrape, whether or not the scheduler calls.
    CACHE_READY.set_function(lambda: 1.0 if NODES.ready(time.monotonic()) else 0.0)
    CACHE_NODES.set_function(lambda: float(NODES.status().objects))


def _nodes_for(names: tuple[str, ...]) -> tuple[extender.NodeView, ...] | extender.Unknown:
    """The Nodes to decide on for a names-only request, or why there are none."""
    if not CONFIG.extender_node_cache:
        return extender.CACHE_OFF
    if not NODES.ready(time.monotonic()):
        return extender.COLD_CACHE
    nodes, missing = extender.named(names, NODES.get)
    if missing:
        CACHE_MISSES.inc(missing)
    return nodes


def _json(body: object, status: int = 200) -> flask.Response:
    # orjson: a thousand nodes' answer in a tenth of the standard library's time.
    return flask.Response(orjson.dumps(body), status=status, mimetype="application/json")


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
    nodes = (
        tuple(extender.view_of(node, CONFIG) for node in args.nodes)
        if args.nodes is not None
        else _nodes_for(args.names)
    )
    if verb == "filter":
        result = (
            extender.pass_unknown(args.names, nodes)
            if isinstance(nodes, extender.Unknown)
            else extender.filter_views(args.pod, nodes, CONFIG, now)
        )
        reasons = Counter(v.reason for v in result.verdicts)
        for reason, count in reasons.items():
            NODE_DECISIONS.labels(verb=verb, reason=reason).inc(count)
        response = _json(filter_response(args, result))
        every_node_hot = extender.EVERY_NODE_HOT in reasons
        passed = sum(1 for verdict in result.verdicts if verdict.passed)
        level = (
            logging.WARNING
            if every_node_hot
            else logging.INFO
            if passed < len(args.names)
            else logging.DEBUG
        )
        if log.isEnabledFor(level):
            # The failed nodes by reason; each node's own reason only at DEBUG (a thousand
            # nodes would make every scheduling call a line of kilobytes).
            extra: dict[str, object] = {
                "verb": verb,
                "pod": _pod_ref(args.pod),
                "reasons": dict(reasons),
                "duration_ms": round(1000 * (time.perf_counter() - started), 2),
            }
            if log.isEnabledFor(logging.DEBUG):
                extra["failed"] = result.failed
            log.log(
                level,
                "filter: %d of %d nodes pass%s",
                passed,
                len(args.names),
                " (every node over its usage limits: all passed, ranked by score)"
                if every_node_hot
                else "",
                extra=extra,
            )
    else:
        priorities = (
            extender.unknown_nodes(args.names, nodes)
            if isinstance(nodes, extender.Unknown)
            else extender.prioritize_views(args.pod, nodes, CONFIG, now)
        )
        for reason, count in Counter(score.reason for score in priorities.scores).items():
            NODE_DECISIONS.labels(verb=verb, reason=reason).inc(count)
        response = _json(priority_response(priorities))
        if log.isEnabledFor(logging.DEBUG):
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
    if request.method == "GET" and path == "/debug/node-cache":
        # What the extender decides on: the cache's state and each node as it keeps it.
        status = NODES.status()
        return _json(
            {
                "enabled": CONFIG.extender_node_cache,
                "ready": NODES.ready(time.monotonic()),
                "resourceVersion": status.resource_version,
                "nodes": {name: extender.describe(view) for name, view in NODES.snapshot().items()},
            }
        )
    if verb in VERBS:
        if request.method != "POST":
            return _json({"error": f"POST ExtenderArgs to {path}"}, 405)
        body = BODY_LIMIT.read(request)
        if body is None:
            return BODY_LIMIT.too_large(request, FUNCTION)
        return _answer(verb, body)
    return _json({"error": f"unknown path {request.path}; POST .../filter or .../prioritize"}, 404)
