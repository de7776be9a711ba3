"""CloudEvents in and out of the functions, with Knative's delivery rules in mind.

A Broker treats the HTTP answer of a Trigger subscriber as follows: 2xx with a CloudEvent is a
reply it routes again; 2xx with an empty body is plain success; a non-empty body that is not a
CloudEvent counts as a failed delivery; 404, 408, 409, 429 and 5xx are retried; other 4xx are
not. So every function here is an HTTP function (functions-framework's CloudEvent signature
always answers "OK", which the Broker would count as a failure) that answers:

- ``202`` and an empty body when there is nothing to emit (including "the object is gone");
- ``200`` with a binary-mode reply CloudEvent (always with ``datacontenttype``);
- ``400`` for a malformed event (not retried: it will never parse);
- ``503`` for transient trouble (API unreachable, throttled, optimistic-concurrency retries
  used up), which Knative redelivers;
- ``500`` for what a person must fix (RBAC, a corrupt state annotation), so the event ends in
  the dead-letter sink instead of being lost.

Every received event gets one compact JSON log line (id, type, subject, namespace/name,
resourceVersion, outcome, status, duration, API writes). The event itself, in structured mode
and redacted (``shared.platform.logs.redact``), is added to that line only when the event led to
something: a reply, an API write, a 4xx or 5xx. Those are the events the replay tool needs, and
logging every pod of the cluster in full would put every pod's spec (literal env values
included) in the log store. ``KN_RESCHEDULER_LOG_EVENTS=all`` or log level DEBUG logs every
event in full, before it is handled.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import unquote

import flask
from cloudevents import exceptions as ce_exceptions
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent, from_http

from shared.api.keys import EVENT_SOURCE_PREFIX
from shared.platform import kube, logs, metrics
from shared.platform.bodies import BodyLimit, unread
from shared.platform.senders import Senders, SenderVerdict

log = logging.getLogger(__name__)

CORE_ATTRIBUTES = ("id", "source", "type", "specversion", "subject", "time", "datacontenttype")
# An event carrying this extension with the value "true" is handled with every Kubernetes write
# turned into a server-side dry run: the replay tool's --dry-run against running functions. It
# can only make a function do less, never more.
DRY_RUN_EXTENSION = "knrdryrun"


class BadEvent(ValueError):
    """The request is not a CloudEvent we can act on; answered with 400."""


class MustNotAct(RuntimeError):
    """Acting would risk data (a corrupt state annotation, say); a person must look.

    Answered with 500 so the Broker retries and finally dead-letters the event: kept, not lost.
    """


@dataclass(frozen=True)
class Event:
    """An incoming CloudEvent: its attributes (core and extensions) and its JSON data."""

    id: str
    source: str
    type: str
    attributes: Mapping[str, str]
    data: Any

    @property
    def subject(self) -> str:
        return self.attributes.get("subject", "")

    def structured(self) -> dict[str, Any]:
        """The event as a structured-mode JSON object (what the archive stores)."""
        out: dict[str, Any] = dict(self.attributes)
        out["data"] = self.data
        return out


@dataclass(frozen=True)
class Reply:
    """A follow-up event a function answers with; the Broker routes it to the next Trigger."""

    type: str
    subject: str
    data: Mapping[str, Any]
    source: str = ""
    extensions: Mapping[str, str] = field(default_factory=dict)
    # Empty: a fresh id per answer. A reply that says a fact once (a pod's move) sets one
    # derived from that fact (``stable_id``): a second delivery of the same report (the Broker
    # delivers at least once, two reports of one pod race) then answers the same event, which a
    # consumer may drop as a duplicate (CloudEvents: same source and id).
    id: str = ""


def stable_id(*parts: str) -> str:
    """An event id that is the same whenever it is derived from the same ``parts``."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "kn-rescheduler:" + "/".join(parts)))


def parse(headers: Mapping[str, str], body: bytes) -> Event:
    """A CloudEvent from an HTTP request, binary or structured mode, data as JSON."""
    lowered = {k.lower(): v for k, v in headers.items()}
    if "ce-specversion" in lowered:
        return _parse_binary(lowered, body)
    return _parse_with_sdk(lowered, body)


def _parse_binary(headers: Mapping[str, str], body: bytes) -> Event:
    """Binary mode, read straight off the headers (the CloudEvents HTTP binding: every
    attribute a ``ce-`` header, percent-encoded; ``content-type`` is ``datacontenttype``).

    This is every event a Broker or ApiServerSource sends, on the hottest path of the project
    (every pod update in the cluster): the SDK's generic unmarshalling cost more than twice
    the JSON parse itself, this costs the JSON parse and a dict.
    """
    if headers["ce-specversion"] != "1.0":
        raise BadEvent(f"unsupported CloudEvents specversion {headers['ce-specversion']!r}")
    attributes = {
        key[3:]: unquote(value) if "%" in value else value
        for key, value in headers.items()
        if key.startswith("ce-")
    }
    content_type = headers.get("content-type")
    if content_type:
        attributes["datacontenttype"] = content_type
    for required in ("id", "source", "type"):
        if not attributes.get(required):
            raise BadEvent(f"CloudEvent without {required}")
    data: Any = None
    if body:
        if content_type and "json" not in content_type:
            raise BadEvent(f"CloudEvent data must be JSON, not {content_type}")
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:
            # RecursionError: nested deeper than any Kubernetes object (about 1,000 levels).
            raise BadEvent(f"CloudEvent data is not JSON we can read: {exc}") from exc
    return Event(attributes["id"], attributes["source"], attributes["type"], attributes, data)


def _parse_with_sdk(headers: Mapping[str, str], body: bytes) -> Event:
    """Structured mode (and anything else): the SDK's full unmarshalling."""
    try:
        ce = from_http(dict(headers), body)
    except (ce_exceptions.GenericException, ValueError, TypeError, RecursionError) as exc:
        raise BadEvent(f"not a CloudEvent: {exc}") from exc
    attributes = {k: str(v) for k, v in ce.get_attributes().items() if v is not None}
    for required in ("id", "source", "type"):
        if not attributes.get(required):
            raise BadEvent(f"CloudEvent without {required}")
    data = ce.get_data()
    if isinstance(data, (bytes, str)):
        # The SDK hands back undecodable JSON as a string rather than failing.
        try:
            data = json.loads(data) if data else None
        except (ValueError, RecursionError) as exc:
            raise BadEvent(f"CloudEvent data is not JSON: {exc}") from exc
    return Event(
        id=attributes["id"],
        source=attributes["source"],
        type=attributes["type"],
        attributes=attributes,
        data=data,
    )


def reply_response(reply: Reply, function: str) -> flask.Response:
    attributes: dict[str, Any] = {
        "id": reply.id or str(uuid.uuid4()),
        "type": reply.type,
        "source": reply.source or EVENT_SOURCE_PREFIX + function,
        "subject": reply.subject,
        "time": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "datacontenttype": "application/json",
        **reply.extensions,
    }
    headers, body = to_binary(CloudEvent(attributes, dict(reply.data)))
    return flask.Response(body, status=200, headers=headers)


def refused_sender(verdict: SenderVerdict, function: str, request: flask.Request) -> flask.Response:
    """401, 403 or 503 for a sender shared.platform.senders did not let in; nothing read."""
    log.warning(
        "sender refused: %s",
        verdict.why,
        extra={
            "outcome": OUTCOMES.get(verdict.status, "refused"),
            "status": verdict.status,
            "remote": request.remote_addr,
        },
    )
    metrics.EVENTS.labels(
        function=function, type="unauthenticated", outcome=str(verdict.status)
    ).inc()
    # The reason is in the log line above; the answer says no more than the status, and the
    # body stays unread.
    challenge = {"WWW-Authenticate": 'Bearer realm="kn-rescheduler"'}
    return unread(
        verdict.status,
        _REFUSED[verdict.status],
        challenge if verdict.status == 401 else None,
    )


_REFUSED: Final = {
    401: "a bearer token for this function's audience is required",
    403: "this sender may not post events here",
    503: "retry later",
}


def accepted() -> flask.Response:
    return flask.Response(b"", status=202)


def failure(status: int, reason: str) -> flask.Response:
    # A Broker ignores the body of a failed delivery, but people reading logs of a direct
    # POST (curl, replay) want the reason.
    return flask.Response(json.dumps({"error": reason}), status=status, mimetype="application/json")


Handler = Callable[[Event], Reply | None]


def serve(
    request: flask.Request,
    handler: Handler,
    *,
    function: str,
    limit: BodyLimit,
    senders: Senders | None = None,
) -> flask.Response:
    """Parse, log, dispatch, and map the outcome onto Knative's delivery semantics. A body
    over ``limit`` is refused with 413 before it is read (``shared.platform.bodies``)."""
    if request.path.rstrip("/") == "/metrics" and request.method == "GET":
        return metrics.response()
    if request.path.rstrip("/") == "/healthz" and request.method == "GET":
        # For the kubelet's readiness and liveness probes: answered by a request thread, so
        # a worker whose threads are all stuck stops answering and is restarted.
        return flask.Response("ok", mimetype="text/plain")
    if request.method != "POST":
        return failure(405, "POST a CloudEvent")
    started = time.perf_counter()
    if senders is not None and not limit.declared_too_large(request):
        verdict = senders.check(dict(request.headers.items()))
        if not verdict.allowed:
            return refused_sender(verdict, function, request)
    body = limit.read(request)
    if body is None:
        metrics.EVENTS.labels(function=function, type="too-large", outcome="413").inc()
        return limit.too_large(request, function)
    try:
        event = parse(dict(request.headers.items()), body)
    except BadEvent as exc:
        # Nothing to replay: the body is not an event. Its size says more than its content
        # would, and the content may be anything.
        log.warning(
            "malformed event: %s",
            exc,
            extra={
                "outcome": OUTCOMES[400],
                "status": 400,
                "bytes": request.content_length,
                "duration_ms": _millis(started),
            },
        )
        metrics.EVENTS.labels(function=function, type="malformed", outcome="400").inc()
        return failure(400, str(exc))
    with logs.event_context(event.id, event.type, event.subject):
        every = logs.log_every_event()
        logged_in_full = every or log.isEnabledFor(logging.DEBUG)
        if logged_in_full:
            # Before handling, so that an event that crashes the process is still on record.
            log.log(
                logging.INFO if every else logging.DEBUG,
                "event received",
                extra={"cloudevent": logs.redact(event.structured())},
            )
        with (
            kube.recording() as calls,
            kube.forced_dry_run(event.attributes.get(DRY_RUN_EXTENSION) == "true"),
        ):
            response = dispatch(event, handler, function=function)
        writes = sum(1 for call in calls if call.method != "GET")
        line = handled_line(event, response, started, writes)
        if not logged_in_full and (response.status_code != 202 or writes):
            line["cloudevent"] = logs.redact(event.structured())
        log.info("event handled", extra=line)
        metrics.EVENTS.labels(
            function=function, type=event.type, outcome=str(response.status_code)
        ).inc()
        metrics.LATENCY.labels(function=function).observe(time.perf_counter() - started)
        return response


# The answer of a function as a word, for people reading the compact line.
OUTCOMES: dict[int, str] = {
    200: "replied",
    202: "accepted",
    400: "rejected",
    500: "needs a person",
    503: "redeliver",
}
_POD_SUBJECT = re.compile(r"(?:^|/)namespaces/([^/]+)/pods/([^/]+)$")


def handled_line(
    event: Event, response: flask.Response, started: float, writes: int
) -> dict[str, Any]:
    """The compact line's fields (id, type and subject come from the event context)."""
    status = response.status_code
    line: dict[str, Any] = {
        "outcome": OUTCOMES.get(status, "failed"),
        "status": status,
        "duration_ms": _millis(started),
        "writes": writes,
    }
    matched = _POD_SUBJECT.search(event.subject)
    namespace, name = (
        matched.groups()
        if matched
        else (event.attributes.get("namespace", ""), event.attributes.get("name", ""))
    )
    if namespace or name:
        line["object"] = f"{namespace}/{name}"
    meta = event.data.get("metadata") if isinstance(event.data, dict) else None
    if isinstance(meta, dict) and meta.get("resourceVersion"):
        line["resourceVersion"] = str(meta["resourceVersion"])
    reply_type = response.headers.get("ce-type")
    if reply_type:
        line["reply_type"] = reply_type
        line["reply_id"] = response.headers.get("ce-id", "")
    return line


def _millis(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


def _see_log(what: str, event: Event) -> str:
    """A 5xx answer's reason: what kind of failure, and where the details are. The details
    (API paths, object names, RBAC messages) go to the log only: anything that reaches the
    Service can post an event and read the answer. A dead letter carries this text in its
    knativeerrordata extension, and the event id leads to the log line."""
    return f"{what}: see the function's log for event {event.id!r}"


def dispatch(event: Event, handler: Handler, *, function: str) -> flask.Response:
    """Run the handler for one parsed event and turn its outcome into an HTTP answer."""
    try:
        reply = handler(event)
    except BadEvent as exc:
        log.warning("event rejected: %s", exc)
        return failure(400, str(exc))
    except kube.NotFound as exc:
        log.info("nothing to do, object gone: %s", exc)
        return accepted()
    except (kube.Transient, kube.Conflict) as exc:
        log.warning("transient failure, asking for redelivery: %s", exc)
        return failure(503, _see_log("a transient failure, worth a redelivery", event))
    except (kube.Forbidden, kube.Invalid, kube.Unconfigured, MustNotAct) as exc:
        log.error("cannot act, needs a person: %s", exc)
        return failure(500, _see_log("cannot act, needs a person", event))
    except Exception:
        log.exception("handler failed")
        return failure(500, _see_log("the handler failed", event))
    if reply is None:
        return accepted()
    return reply_response(reply, function)
