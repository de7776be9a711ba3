"""label-nodes: a PingSource tick in, Nodes under pressure labelled (dynamicScheduler's
``status=presure``); ``GET /status`` and ``GET /nodes`` as the seed offers.

The entry point only; the logic is shared.nodes.label_nodes. The settings and the rule file are read
at start-up: a missing Prometheus address or a rule file we cannot use stops the function with
a message naming the setting, the rule and the field.
"""

from __future__ import annotations

import json
import os

import flask
import functions_framework

from shared.api.keys import PING_EVENT_TYPE
from shared.nodes.label_nodes.handler import Labeler
from shared.nodes.label_nodes.rules import load_rules
from shared.platform import events, logs
from shared.platform.bodies import EVENT_MAX_BODY, BodyLimit
from shared.platform.config import Config, ConfigError, describe
from shared.platform.kube import Kube, KubeError
from shared.platform.prometheus import Prometheus
from shared.platform.senders import Senders
from shared.platform.ticks import TickGate

FUNCTION = "label-nodes"
logs.configure(FUNCTION)
CONFIG = Config.for_function(FUNCTION, os.environ)
BODY_LIMIT = BodyLimit.from_env(os.environ, EVENT_MAX_BODY)

# Who may post events here (KN_RESCHEDULER_SENDER_AUTH, shared.platform.senders).
SENDERS = Senders.from_config(FUNCTION, CONFIG)


# A tick is only a CloudEvent anyone who reaches the Service can post: at most one full run
# per KN_RESCHEDULER_MIN_TICK_INTERVAL in this process (shared.platform.ticks).
TICKS = TickGate(CONFIG.min_tick_interval)


if not CONFIG.prometheus_url:
    raise ConfigError(
        "KN_RESCHEDULER_PROMETHEUS_URL",
        "label-nodes needs the address of Prometheus's HTTP API, e.g. "
        "http://prometheus.monitoring:9090",
    )
RULES = load_rules(CONFIG.pressure_rules_file)
events.log.info(
    "configuration",
    extra={"config": describe(CONFIG, FUNCTION), "rules": [rule.describe() for rule in RULES]},
)
PROMETHEUS = Prometheus(CONFIG.prometheus_url)

_labeler: Labeler | None = None


def labeler() -> Labeler:
    global _labeler  # noqa: PLW0603 - one client per process, like a connection pool
    if _labeler is None:
        _labeler = Labeler(Kube.from_environment(dry_run=CONFIG.dry_run), PROMETHEUS, RULES, CONFIG)
    return _labeler


def handler(event: events.Event) -> events.Reply | None:
    if event.type != PING_EVENT_TYPE:
        events.log.info("not a ping (%s); nothing to evaluate", event.type)
        return None
    TICKS.run(lambda: labeler().evaluate())
    return None


def _json(body: object, status: int = 200) -> flask.Response:
    return flask.Response(json.dumps(body), status=status, mimetype="application/json")


@functions_framework.http
def handle(request: flask.Request) -> flask.Response:
    path = request.path.rstrip("/")
    if request.method == "GET" and path == "/status":
        # Always 200: this is the seed's health view, not a readiness probe; an outage of
        # Prometheus must not take label-nodes out of service (it is what clears stale labels).
        return _json(labeler().status.to_json())
    if request.method == "GET" and path == "/nodes":
        try:
            return _json(labeler().labelled_nodes())
        except KubeError as err:
            # The API path and address in the log only: anyone who reaches the Service reads
            # the answer.
            events.log.warning("GET /nodes: cannot list the labelled nodes: %s", err)
            return _json({"error": "cannot list the labelled nodes: see the function's log"}, 503)
    return events.serve(request, handler, function=FUNCTION, limit=BODY_LIMIT, senders=SENDERS)
