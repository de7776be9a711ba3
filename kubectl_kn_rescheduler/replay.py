"""Replay recorded CloudEvents into a function, and show what it decided.

Input: the local Broker's archive (one structured CloudEvent per line) or the functions' own
logs (``kubectl logs`` of a Knative Service: JSON lines whose ``cloudevent`` field holds the
event received), from a file or stdin. Other lines are skipped and counted.

By default a function logs the full event only for events that led to something (a reply, an
API write, a 4xx or 5xx), redacted (literal env values and managedFields dropped, which no
decision reads); other events get a compact line without the event, which is skipped here. So
the logs replay every event that led to an action; ``KN_RESCHEDULER_LOG_EVENTS=all`` on the
function logs (and so replays) every event.

Events are sent in their recorded order, optionally at their recorded pace, either

- to a running function (``--to URL``), in binary mode like a Broker; or
- to the functions loaded in this process (``--in-process``, the default): each event goes
  to the function whose Trigger in ``knative/`` matches it, exactly as the Broker would route
  it. No server is needed and a debugger works.

``--dry-run`` turns every Kubernetes write into a server-side dry run (the API server
validates and admits, nothing is stored); sent to a running function it travels as the
``knrdryrun`` event extension. The output is a decision trace per event: the classification,
the plan, each API call made (or that would be made) and the reply.

Only some functions need a cluster. ``detect-failures`` judges a pod event from the event
alone, so an archive's pod events replay anywhere, also after the cluster that produced them
is gone (a finished ``make demo``). ``update-annotations`` and ``assess-nodes`` read and write
the cluster: before the first event that goes to one of them, replay checks once that there is
one (the kubeconfig of ``$KUBECONFIG`` or ``~/.kube/config``, then one ``GET /version``). When
there is none it says so once, with how to get one (``make up``, or ``KUBECONFIG`` pointing at
a cluster), skips the events that go to them and replays the others: one clear sentence rather
than a client error per event. ``--to`` checks nothing here: the running function has its own
cluster.

Exit status: 0 when every event chosen was replayed and handled (a 2xx answer); 1 when an
event replayed was not handled; 3 when events were skipped for want of a cluster (all of them
or only some; 1 wins when both happen); 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TextIO

import requests
import urllib3
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent

from kubectl_kn_rescheduler.routing import triggers as trigger_manifests
from kubectl_kn_rescheduler.routing.triggers import Trigger
from shared.api.times import parse_kube_time
from shared.nodes.assess_nodes.handler import Assessor
from shared.platform import events, kube
from shared.platform.config import Config
from shared.pods.detect_failures.decide import detect
from shared.pods.update_annotations.handler import Rescheduler, last_trace

# knative/ of a checkout, whose Triggers route events by default; an installed package has none
# (the plugin's replay reads the cluster's Triggers instead).
KNATIVE: Final = Path(__file__).resolve().parents[1] / "knative"

# The functions replayed here that read or write the cluster (the pod and its owner, the node's
# health record). detect-failures needs none: it judges a pod event from the event alone.
NEEDS_CLUSTER: Final = frozenset({"update-annotations", "assess-nodes"})

HANDLED: Final = 0
FAILED: Final = 1
NO_CLUSTER: Final = 3


@dataclass(frozen=True)
class Recorded:
    event: events.Event
    time: datetime | None
    line: int


def _event_from(raw: Any) -> events.Event | None:
    if not isinstance(raw, dict):
        return None
    if isinstance(raw.get("cloudevent"), dict):  # a function's "event received" log line
        raw = raw["cloudevent"]
    if not all(isinstance(raw.get(k), str) and raw.get(k) for k in ("id", "source", "type")):
        return None
    attributes = {k: str(v) for k, v in raw.items() if k != "data" and not k.startswith("_")}
    return events.Event(raw["id"], raw["source"], raw["type"], attributes, raw.get("data"))


def read(lines: Iterable[str]) -> tuple[list[Recorded], int]:
    """The events in ``lines`` and how many lines were not events."""
    found: list[Recorded] = []
    skipped = 0
    for number, text in enumerate(lines, 1):
        line = text.strip()
        if not line:
            continue
        try:
            raw = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        event = _event_from(raw)
        if event is None:
            skipped += 1
            continue
        stamp = raw.get("time") if "cloudevent" in raw else raw.get("_received")
        when = _parse_time(stamp or event.attributes.get("time"))
        found.append(Recorded(event, when, number))
    return found, skipped


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return parse_kube_time(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Selection:
    types: Sequence[str] = ()
    subjects: Sequence[str] = ()
    ids: Sequence[str] = ()
    since: datetime | None = None
    until: datetime | None = None

    def __call__(self, item: Recorded) -> bool:
        e = item.event
        if self.types and e.type not in self.types:
            return False
        if self.subjects and not any(s in e.subject for s in self.subjects):
            return False
        if self.ids and e.id not in self.ids:
            return False
        if self.since and (item.time is None or item.time < self.since):
            return False
        return not (self.until and (item.time is None or item.time > self.until))


@dataclass
class Outcome:
    """What one replayed event led to."""

    event: events.Event
    function: str
    status: int
    reply: dict[str, Any] | None = None
    decision: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.event.id,
            "type": self.event.type,
            "subject": self.event.subject,
            "function": self.function,
            "status": self.status,
            "decision": self.decision,
            "calls": self.calls,
            "reply": self.reply,
            "error": self.error,
        }

    def as_text(self, index: int, total: int) -> str:
        out = [f"[{index}/{total}] {self.event.type} {self.event.subject} (id {self.event.id})"]
        out.append(
            f"  -> {self.function}: HTTP {self.status}" + (f" {self.error}" if self.error else "")
        )
        out += [f"     decision: {d}" for d in self.decision]
        out += [f"     api: {c}" for c in self.calls]
        if self.reply:
            out.append(f"     reply: {self.reply['type']} {self.reply.get('subject', '')}")
        return "\n".join(out)


def _reply_of(response: Any) -> dict[str, Any] | None:
    headers = {k.lower(): v for k, v in response.headers.items()}
    if "ce-type" not in headers:
        return None
    body = response.data if hasattr(response, "data") else response.content
    return {
        "type": headers["ce-type"],
        "subject": headers.get("ce-subject", ""),
        "data": json.loads(body) if body else None,
    }


class InProcess:
    """The functions loaded here, routed by ``triggers`` (those of knative/, or those installed
    in the cluster)."""

    def __init__(
        self, cfg: Config, api: Callable[[], kube.Kube], triggers: Sequence[Trigger]
    ) -> None:
        self.cfg = cfg
        self._api = api
        self._rescheduler: Rescheduler | None = None
        self._assessor: Assessor | None = None
        self.triggers = list(triggers)

    def functions_for(self, event: events.Event) -> list[str]:
        return [
            t.subscriber.service or t.name
            for t in self.triggers
            if t.filter(event.attributes).delivers
        ]

    def rescheduler(self) -> Rescheduler:
        if self._rescheduler is None:
            self._rescheduler = Rescheduler(self._api(), self.cfg)
        return self._rescheduler

    def assessor(self) -> Assessor:
        if self._assessor is None:
            self._assessor = Assessor(self._api(), self.cfg)
        return self._assessor

    def use(self, api: kube.Kube) -> None:
        """Use this connection, already checked, for every function that needs a cluster."""
        self._api = lambda: api

    def needing_a_cluster(self, items: Iterable[Recorded]) -> list[str]:
        """The functions that ``items`` go to and that need a cluster, sorted."""
        routed = {f for item in items for f in self.functions_for(item.event)}
        return sorted(routed & NEEDS_CLUSTER)

    def partition(self, items: Iterable[Recorded]) -> tuple[list[Recorded], list[Recorded]]:
        """``items`` that need no cluster, and those that go to a function that needs one."""
        offline: list[Recorded] = []
        online: list[Recorded] = []
        for item in items:
            needs = NEEDS_CLUSTER.intersection(self.functions_for(item.event))
            (online if needs else offline).append(item)
        return offline, online

    def send(self, event: events.Event, dry_run: bool) -> list[Outcome]:
        outcomes = []
        for function in self.functions_for(event) or ["(no trigger matches)"]:
            outcomes.append(self._one(function, event, dry_run))
        return outcomes

    def _one(self, function: str, event: events.Event, dry_run: bool) -> Outcome:
        decision: list[str] = []

        def handler(e: events.Event) -> events.Reply | None:
            if function == "detect-failures":
                reply = detect(e, self.cfg)
                decision.append(
                    f"failing: {reply.data['reason']} on {reply.data['node']}: {reply.data['why']}"
                    if reply
                    else "not failing, not opted in, or not a pod add/update"
                )
                return reply
            if function == "update-annotations":
                try:
                    return self.rescheduler().handle(e)
                finally:
                    trace = last_trace()
                    if trace is not None:
                        decision.extend(trace.steps)
            if function == "assess-nodes":
                reply = self.assessor().handle(e)
                decision.append(
                    f"node {reply.data['node']} turns suspect" if reply else "no node turns suspect"
                )
                return reply
            decision.append("no in-process handler for this function")
            return None

        with kube.recording() as calls, kube.forced_dry_run(dry_run):
            response = events.dispatch(event, handler, function=function)
        error = ""
        if response.status_code >= 300:
            error = json.loads(response.data or b"{}").get("error", "")
        return Outcome(
            event,
            function,
            response.status_code,
            _reply_of(response),
            decision,
            [c.describe() for c in calls],
            error,
        )


class Remote:
    """A running function, reached over HTTP(S) like a Broker reaches it."""

    def __init__(self, url: str, verify: str | bool = True) -> None:
        self.url = url
        self.verify = verify

    def send(self, event: events.Event, dry_run: bool) -> list[Outcome]:
        attributes = dict(event.attributes)
        if dry_run:
            attributes[events.DRY_RUN_EXTENSION] = "true"
        headers, body = to_binary(CloudEvent(attributes, event.data))
        try:
            response = requests.post(
                self.url, data=body, headers=headers, timeout=30, verify=self.verify
            )
        except requests.RequestException as exc:
            return [Outcome(event, self.url, 0, error=str(exc))]
        error = "" if response.ok else response.text[:300]
        return [Outcome(event, self.url, response.status_code, _reply_of(response), error=error)]


def replay(
    items: Sequence[Recorded],
    target: InProcess | Remote,
    *,
    dry_run: bool,
    recorded_speed: bool,
    out: TextIO,
    as_json: bool,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    previous: datetime | None = None
    for index, item in enumerate(items, 1):
        if recorded_speed and previous and item.time and item.time > previous:
            sleep((item.time - previous).total_seconds())
        previous = item.time or previous
        for outcome in target.send(item.event, dry_run):
            outcomes.append(outcome)
            if as_json:
                out.write(json.dumps(outcome.as_json(), default=str) + "\n")
            else:
                out.write(outcome.as_text(index, len(items)) + "\n")
    return outcomes


@dataclass(frozen=True)
class NoCluster:
    """Why the functions that need a cluster cannot be replayed here."""

    why: str


def _kubeconfig_named() -> str:
    value = os.environ.get("KUBECONFIG")
    return f"KUBECONFIG={value}" if value else "~/.kube/config"


def _missing_kubeconfig() -> str:
    """Why no kubeconfig can be read, or "" when a file is there to read."""
    value = os.environ.get("KUBECONFIG")
    if value:
        paths = [Path(p).expanduser() for p in value.split(os.pathsep) if p]
        return "" if any(p.is_file() for p in paths) else f"KUBECONFIG={value}: no such file"
    if Path("~/.kube/config").expanduser().is_file():
        return ""
    return "KUBECONFIG is not set and there is no ~/.kube/config"


def _unanswered(exc: kube.KubeError) -> str:
    """A failed call in a few words: for a connection, the server and what the socket said."""
    cause = exc.__cause__
    if isinstance(cause, urllib3.exceptions.MaxRetryError) and cause.pool is not None:
        pool = cause.pool
        said = str(cause.reason).rsplit("): ", 1)[-1] if cause.reason else str(cause)
        return f"({pool.scheme}://{pool.host}:{pool.port}) does not answer: {said}"
    text = str(exc).strip()
    said = text.splitlines()[0] if text else type(exc).__name__
    if isinstance(exc, kube.Forbidden):
        return f"refuses its credentials: {said}"
    return f"does not answer as a Kubernetes API server: {said}"


def connect(timeout: float = 3.0) -> kube.Kube | NoCluster:
    """The cluster the functions replayed here use, or why there is none.

    Checked once, before the first event: the kubeconfig is read, then one cheap call
    (``GET /version``) tells a server that is there from one that is gone, such as the local
    cluster of a demo that has ended. In a pod the in-cluster credentials are used instead.
    """
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    missing = "" if in_cluster else _missing_kubeconfig()
    if missing:
        return NoCluster(missing)
    named = "the in-cluster credentials" if in_cluster else _kubeconfig_named()
    try:
        probe = kube.Kube.from_environment(timeout=timeout, attempts=1)
    except Exception as exc:  # the client's reader raises its own, YAML, OS and type errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        what = "cannot be loaded" if in_cluster else "is not a kubeconfig the client can use"
        return NoCluster(f"{named} {what}: {first}")
    try:
        probe.request("GET", "/version")
    except kube.KubeError as exc:
        server = "the in-cluster API server" if in_cluster else f"the server in {named}"
        return NoCluster(f"{server} {_unanswered(exc)}")
    return kube.Kube.from_environment()


def no_cluster_message(
    cluster: NoCluster, functions: Sequence[str], skipped: int, kept: int
) -> str:
    """What replay says, once, when the events for ``functions`` need a cluster it lacks."""
    return "\n".join(
        [
            f"replay: {' and '.join(functions)} read and write a Kubernetes cluster, and there "
            f"is none: {cluster.why}",
            f"  skipped: the {skipped} event(s) that go to them; "
            + (
                f"the {kept} other(s) are replayed (detect-failures judges a pod event from "
                "the event alone)"
                if kept
                else "no other event was chosen"
            ),
            "  to replay them, start the local cluster with `make up` and run again with "
            "KUBECONFIG=.local/kubeconfig (`make down` stops it),",
            "  or set KUBECONFIG to a cluster's kubeconfig (--dry-run: the API server "
            "validates every write and stores none)",
        ]
    )


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(
        prog="replay",
        description=__doc__.split("\n\n")[0],
        epilog="exit status: 0 every event chosen was replayed and handled; 1 an event was not "
        "handled; 3 events were skipped: they go to functions that need a cluster and none is "
        "reachable (make up starts one; or set KUBECONFIG); 2 a bad command line",
    )
    parser.add_argument("file", nargs="?", default="-", help="archive or log file (- for stdin)")
    parser.add_argument("--type", action="append", default=[], help="only this event type")
    parser.add_argument("--subject", action="append", default=[], help="subject contains this")
    parser.add_argument("--id", action="append", default=[], help="only this event id")
    parser.add_argument("--since", help="only events at or after this time (ISO 8601)")
    parser.add_argument("--until", help="only events at or before this time (ISO 8601)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--to", metavar="URL", help="send to a running function")
    target.add_argument(
        "--in-process", action="store_true", help="load the functions here (the default)"
    )
    parser.add_argument("--ca-file", help="CA bundle for an https --to URL")
    parser.add_argument(
        "--triggers",
        default=str(KNATIVE) if KNATIVE.is_dir() else None,
        help="a folder of Trigger manifests (default: knative/ of the checkout)",
    )
    parser.add_argument("--dry-run", action="store_true", help="server-side dry run of writes")
    parser.add_argument("--recorded-speed", action="store_true", help="keep recorded gaps")
    parser.add_argument("--json", action="store_true", help="one JSON object per outcome")
    args = parser.parse_args(argv)

    since, until = _parse_time(args.since), _parse_time(args.until)
    for flag, raw, parsed in (("--since", args.since, since), ("--until", args.until, until)):
        if raw and parsed is None:
            parser.error(f"{flag}: not an ISO 8601 time: {raw!r}")
    try:
        stream = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        parser.error(f"cannot read {args.file}: {exc.strerror}")
    with stream:
        items, skipped = read(stream)
    chosen = [i for i in items if Selection(args.type, args.subject, args.id, since, until)(i)]
    if skipped:
        print(
            f"replay: skipped {skipped} line(s) that hold no CloudEvent (functions log the "
            "whole event only when it led to an action, unless KN_RESCHEDULER_LOG_EVENTS=all)",
            file=sys.stderr,
        )
    if not chosen:
        print("replay: no event matches", file=sys.stderr)
        return 0

    sender: InProcess | Remote
    skipped_events: list[Recorded] = []
    if args.to:
        sender = Remote(args.to, verify=args.ca_file or True)
    else:
        if not args.triggers:
            parser.error(
                "--triggers FOLDER is needed outside a checkout (or run `kubectl "
                "kn-rescheduler replay`, which routes by the cluster's Triggers)"
            )
        cfg = Config.from_env(os.environ)
        routes, _ = trigger_manifests.load(
            Path(args.triggers), namespace="kn-rescheduler", broker="default"
        )
        sender = InProcess(cfg, kube.Kube.from_environment, routes)
        needed = sender.needing_a_cluster(chosen)
        if needed:
            cluster = connect()
            if isinstance(cluster, NoCluster):
                chosen, skipped_events = sender.partition(chosen)
                said = no_cluster_message(cluster, needed, len(skipped_events), len(chosen))
                print(said, file=sys.stderr)
                if not chosen:
                    print("replay: nothing replayed (exit status 3)", file=sys.stderr)
                    return NO_CLUSTER
            else:
                sender.use(cluster)
    outcomes = replay(
        chosen,
        sender,
        dry_run=args.dry_run,
        recorded_speed=args.recorded_speed,
        out=out,
        as_json=args.json,
    )
    failed = [o for o in outcomes if not o.ok]
    if not args.json:
        print(
            f"replayed {len(chosen)} event(s): {len(outcomes) - len(failed)} handled, "
            f"{len(failed)} failed"
            + (f", {len(skipped_events)} skipped (no cluster)" if skipped_events else "")
            + (" (dry run)" if args.dry_run else ""),
            file=out,
        )
    if failed:
        return FAILED
    return NO_CLUSTER if skipped_events else HANDLED


def lines_of(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        yield from f


if __name__ == "__main__":
    sys.exit(main())
