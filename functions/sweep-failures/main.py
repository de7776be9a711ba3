"""sweep-failures: a PingSource tick in, failing-pod events out to the Broker (K_SINK).

The entry point only; the logic is shared.pods.sweep_failures.handler.
"""

from __future__ import annotations

import os

import flask
import functions_framework

from shared.api.keys import PING_EVENT_TYPE
from shared.platform import events, logs
from shared.platform.bodies import EVENT_MAX_BODY, BodyLimit
from shared.platform.config import Config, describe
from shared.platform.kube import Kube
from shared.platform.senders import Senders, sink_token
from shared.platform.ticks import TickGate
from shared.pods.sweep_failures.handler import Sweeper

FUNCTION = "sweep-failures"
logs.configure(FUNCTION)
CONFIG = Config.for_function(FUNCTION, os.environ)
BODY_LIMIT = BodyLimit.from_env(os.environ, EVENT_MAX_BODY)

# Who may post events here (KN_RESCHEDULER_SENDER_AUTH, shared.platform.senders).
SENDERS = Senders.from_config(FUNCTION, CONFIG)


# A tick is only a CloudEvent anyone who reaches the Service can post: at most one full run
# per KN_RESCHEDULER_MIN_TICK_INTERVAL in this process (shared.platform.ticks).
TICKS = TickGate(CONFIG.min_tick_interval)


events.log.info("configuration", extra={"config": describe(CONFIG, FUNCTION)})

_sweeper: Sweeper | None = None


def sweeper() -> Sweeper:
    global _sweeper  # noqa: PLW0603 - one client per process, like a connection pool
    if _sweeper is None:
        sink = os.environ.get("K_SINK")
        if not sink:
            raise RuntimeError("K_SINK is not set: where should failing-pod events go?")
        _sweeper = Sweeper(
            Kube.from_environment(dry_run=CONFIG.dry_run), CONFIG, sink, token=sink_token()
        )
    return _sweeper


def handler(event: events.Event) -> events.Reply | None:
    # A sweep lists every pod of the cluster: only the PingSource's tick starts one, not any
    # event anyone posts to the Service.
    if event.type != PING_EVENT_TYPE:
        events.log.info("not a ping (%s); nothing to sweep", event.type)
        return None
    TICKS.run(lambda: sweeper().sweep())
    return None


@functions_framework.http
def handle(request: flask.Request) -> flask.Response:
    return events.serve(request, handler, function=FUNCTION, limit=BODY_LIMIT, senders=SENDERS)
