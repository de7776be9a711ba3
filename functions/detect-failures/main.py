"""detect-failures: ApiServerSource pod events in, io.kn-rescheduler.pod.failing out.

The entry point only; the decision is shared.pods.detect_failures.decide (pure, no API access).
"""

from __future__ import annotations

import os

import flask
import functions_framework

from shared.platform import events, logs
from shared.platform.bodies import EVENT_MAX_BODY, BodyLimit
from shared.platform.config import Config, describe
from shared.platform.senders import Senders
from shared.pods.detect_failures.decide import detect

FUNCTION = "detect-failures"
logs.configure(FUNCTION)
CONFIG = Config.for_function(FUNCTION, os.environ)
BODY_LIMIT = BodyLimit.from_env(os.environ, EVENT_MAX_BODY)

# Who may post events here (KN_RESCHEDULER_SENDER_AUTH, shared.platform.senders).
SENDERS = Senders.from_config(FUNCTION, CONFIG)
events.log.info("configuration", extra={"config": describe(CONFIG, FUNCTION)})


def handler(event: events.Event) -> events.Reply | None:
    return detect(event, CONFIG)


@functions_framework.http
def handle(request: flask.Request) -> flask.Response:
    return events.serve(request, handler, function=FUNCTION, limit=BODY_LIMIT, senders=SENDERS)
