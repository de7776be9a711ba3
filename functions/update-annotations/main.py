"""update-annotations: io.kn-rescheduler.pod.failing in, the pod moved and its move recorded.

The entry point only; the logic is shared.pods.update_annotations.handler. Replies
io.kn-rescheduler.pod.rescheduled or .exhausted (never a type its own Trigger matches).
"""

from __future__ import annotations

import os

import flask
import functions_framework

from shared.platform import events, logs
from shared.platform.bodies import EVENT_MAX_BODY, BodyLimit
from shared.platform.config import Config, describe
from shared.platform.kube import Kube
from shared.platform.senders import Senders
from shared.pods.update_annotations.handler import Rescheduler

FUNCTION = "update-annotations"
logs.configure(FUNCTION)
CONFIG = Config.for_function(FUNCTION, os.environ)
BODY_LIMIT = BodyLimit.from_env(os.environ, EVENT_MAX_BODY)

# Who may post events here (KN_RESCHEDULER_SENDER_AUTH, shared.platform.senders).
SENDERS = Senders.from_config(FUNCTION, CONFIG)
events.log.info("configuration", extra={"config": describe(CONFIG, FUNCTION)})

_rescheduler: Rescheduler | None = None


def rescheduler() -> Rescheduler:
    """Built on first use, so that importing the module needs no cluster credentials."""
    global _rescheduler  # noqa: PLW0603 - one client per process, like a connection pool
    if _rescheduler is None:
        api = Kube.from_environment(dry_run=CONFIG.dry_run, timeout=5.0)
        _rescheduler = Rescheduler(api, CONFIG)
    return _rescheduler


def handler(event: events.Event) -> events.Reply | None:
    return rescheduler().handle(event)


@functions_framework.http
def handle(request: flask.Request) -> flask.Response:
    return events.serve(request, handler, function=FUNCTION, limit=BODY_LIMIT, senders=SENDERS)
