"""annotate-usage: a PingSource tick in, each Node's CPU and memory usage written onto it (the
``kn-rescheduler.io/usage`` annotation and the ``kn-rescheduler.io/load`` bucket label), so that
the scheduler extender and the webhook read usage from Node objects and never call Prometheus.
``GET /status`` shows the last evaluations.

The entry point only; the logic is shared.nodes.annotate_usage. The source is chosen at start-up
(``KN_RESCHEDULER_USAGE_SOURCE``: prometheus, the default, or metrics-api); Prometheus as the
source without its address stops the function with a message naming the setting.
"""

from __future__ import annotations

import json
import os

import flask
import functions_framework

from shared.api.keys import PING_EVENT_TYPE
from shared.nodes.annotate_usage.handler import Annotator
from shared.nodes.annotate_usage.sources import MetricsApiSource, PrometheusSource, Source
from shared.platform import events, logs
from shared.platform.bodies import EVENT_MAX_BODY, BodyLimit
from shared.platform.config import USAGE_SOURCE_PROMETHEUS, Config, ConfigError, describe
from shared.platform.kube import Kube
from shared.platform.prometheus import Prometheus
from shared.platform.senders import Senders
from shared.platform.ticks import TickGate

FUNCTION = "annotate-usage"
logs.configure(FUNCTION)
CONFIG = Config.for_function(FUNCTION, os.environ)
BODY_LIMIT = BodyLimit.from_env(os.environ, EVENT_MAX_BODY)

# Who may post events here (KN_RESCHEDULER_SENDER_AUTH, shared.platform.senders).
SENDERS = Senders.from_config(FUNCTION, CONFIG)


# A tick is only a CloudEvent anyone who reaches the Service can post: at most one full run
# per KN_RESCHEDULER_MIN_TICK_INTERVAL in this process (shared.platform.ticks).
TICKS = TickGate(CONFIG.min_tick_interval)


if CONFIG.usage_source == USAGE_SOURCE_PROMETHEUS and not CONFIG.prometheus_url:
    raise ConfigError(
        "KN_RESCHEDULER_PROMETHEUS_URL",
        "annotate-usage reads usage from Prometheus (KN_RESCHEDULER_USAGE_SOURCE=prometheus) "
        "and needs the address of its HTTP API, e.g. http://prometheus.monitoring:9090; or set "
        "KN_RESCHEDULER_USAGE_SOURCE=metrics-api",
    )
events.log.info("configuration", extra={"config": describe(CONFIG, FUNCTION)})

_annotator: Annotator | None = None


def annotator() -> Annotator:
    global _annotator  # noqa: PLW0603 - one client per process, like a connection pool
    if _annotator is None:
        kube = Kube.from_environment(dry_run=CONFIG.dry_run)
        source: Source = (
            PrometheusSource(Prometheus(CONFIG.prometheus_url), CONFIG.usage_rate_window)
            if CONFIG.usage_source == USAGE_SOURCE_PROMETHEUS
            else MetricsApiSource(kube)
        )
        _annotator = Annotator(kube, source, CONFIG)
    return _annotator


def handler(event: events.Event) -> events.Reply | None:
    if event.type != PING_EVENT_TYPE:
        events.log.info("not a ping (%s); nothing to measure", event.type)
        return None
    TICKS.run(lambda: annotator().evaluate())
    return None


@functions_framework.http
def handle(request: flask.Request) -> flask.Response:
    if request.method == "GET" and request.path.rstrip("/") == "/status":
        # Always 200: a view of this process's evaluations, not a readiness probe.
        return flask.Response(
            json.dumps(annotator().status.to_json()), status=200, mimetype="application/json"
        )
    return events.serve(request, handler, function=FUNCTION, limit=BODY_LIMIT, senders=SENDERS)
