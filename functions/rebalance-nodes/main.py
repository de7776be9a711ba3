"""rebalance-nodes: a PingSource tick in, pods evicted off hot nodes and nodes in maintenance
(the Eviction API, PodDisruptionBudgets respected), a ``Rebalanced`` Event on each pod and its
workload, and one reply ``io.kn-rescheduler.pod.rebalanced`` per evaluation that evicted.
``GET /status`` shows the last evaluations.

The entry point only; the logic is shared.nodes.rebalance_nodes (decide, and handler: the
I/O). Usage comes from the annotation annotate-usage writes on each Node: no Prometheus here.
"""

from __future__ import annotations

import json
import os

import flask
import functions_framework

from shared.api.keys import PING_EVENT_TYPE
from shared.nodes.rebalance_nodes.handler import Rebalancer
from shared.platform import events, logs
from shared.platform.bodies import EVENT_MAX_BODY, BodyLimit
from shared.platform.config import Config, describe
from shared.platform.kube import Kube
from shared.platform.senders import Senders
from shared.platform.ticks import TickGate

FUNCTION = "rebalance-nodes"
logs.configure(FUNCTION)
CONFIG = Config.for_function(FUNCTION, os.environ)
BODY_LIMIT = BodyLimit.from_env(os.environ, EVENT_MAX_BODY)

# Who may post events here (KN_RESCHEDULER_SENDER_AUTH, shared.platform.senders).
SENDERS = Senders.from_config(FUNCTION, CONFIG)


# A tick is only a CloudEvent anyone who reaches the Service can post: at most one full run
# per KN_RESCHEDULER_MIN_TICK_INTERVAL in this process (shared.platform.ticks).
TICKS = TickGate(CONFIG.min_tick_interval)


events.log.info("configuration", extra={"config": describe(CONFIG, FUNCTION)})

_rebalancer: Rebalancer | None = None


def rebalancer() -> Rebalancer:
    """Built on first use, so that importing the module needs no cluster credentials."""
    global _rebalancer  # noqa: PLW0603 - one client per process, like a connection pool
    if _rebalancer is None:
        _rebalancer = Rebalancer(Kube.from_environment(dry_run=CONFIG.dry_run), CONFIG)
    return _rebalancer


def handler(event: events.Event) -> events.Reply | None:
    if event.type != PING_EVENT_TYPE:
        events.log.info("not a ping (%s); nothing to evaluate", event.type)
        return None
    return TICKS.run(lambda: rebalancer().evaluate().reply())


@functions_framework.http
def handle(request: flask.Request) -> flask.Response:
    if request.method == "GET" and request.path.rstrip("/") == "/status":
        # Always 200: a view of this process's evaluations, not a readiness probe.
        return flask.Response(
            json.dumps(rebalancer().status.to_json()), status=200, mimetype="application/json"
        )
    return events.serve(request, handler, function=FUNCTION, limit=BODY_LIMIT, senders=SENDERS)
