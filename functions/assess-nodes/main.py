"""assess-nodes: pod failure reports in, node health records and suspect marks out.

The entry point only; the logic is shared.nodes.assess_nodes (decide, and handler: the I/O).
Its Trigger sends it io.kn-rescheduler.pod.failing, .rescheduled and .exhausted; its
PingSource a tick that expires old suspicions. Replies io.kn-rescheduler.node.suspected when a
node turns suspect (a type no Trigger of ours sends back here).
"""

from __future__ import annotations

import os

import flask
import functions_framework

from shared.nodes.assess_nodes.handler import Assessor
from shared.platform import events, logs
from shared.platform.bodies import EVENT_MAX_BODY, BodyLimit
from shared.platform.config import Config, describe
from shared.platform.kube import Kube
from shared.platform.senders import Senders

FUNCTION = "assess-nodes"
logs.configure(FUNCTION)
CONFIG = Config.for_function(FUNCTION, os.environ)
BODY_LIMIT = BodyLimit.from_env(os.environ, EVENT_MAX_BODY)

# Who may post events here (KN_RESCHEDULER_SENDER_AUTH, shared.platform.senders).
SENDERS = Senders.from_config(FUNCTION, CONFIG)
events.log.info("configuration", extra={"config": describe(CONFIG, FUNCTION)})

_assessor: Assessor | None = None


def assessor() -> Assessor:
    """Built on first use, so that importing the module needs no cluster credentials."""
    global _assessor  # noqa: PLW0603 - one client per process, like a connection pool
    if _assessor is None:
        _assessor = Assessor(Kube.from_environment(dry_run=CONFIG.dry_run, timeout=5.0), CONFIG)
    return _assessor


def handler(event: events.Event) -> events.Reply | None:
    return assessor().handle(event)


@functions_framework.http
def handle(request: flask.Request) -> flask.Response:
    return events.serve(request, handler, function=FUNCTION, limit=BODY_LIMIT, senders=SENDERS)
