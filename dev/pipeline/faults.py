"""Seeded faults in Knative's data plane, for the chaos suite (``dev/bench/chaos``).

The local Broker is Knative's own (dev/pipeline/broker.py); its binaries run in a network namespace
and reach the ApiServerSource's sink and the functions through :class:`pipeline.netns.Forward`
s. The faults sit in those forwards, where a real cluster's network and pods have them, so
that Knative meets them as it would and does the retrying itself:

- *ingress drop* (``ingress_drop``, per request on the ``source`` forward: the adapter's way
  to the ingress): answered ``202`` by the forward, relayed nowhere. The adapter believes the
  event delivered; it is neither archived nor delivered. This stands for the loss nothing
  retries (the adapter giving up a send after its own retries, an in-memory channel restarting
  with what it held): only the periodic sweep finds the pod again. Replies and the sweep's
  events take the ``broker`` forward and are never dropped.
- *attempt drop* (``attempt_drop``, per request on a function's forward): the connection is
  reset before the request reaches the function, as from a pod that just died. The filter
  answers the channel dispatcher 500, and the dispatcher retries with the Trigger's backoff.
- *answer loss* (``answer_loss``): the request goes through, the function acts and answers, and
  the connection is reset instead of that answer being relayed. The dispatcher retries: the
  function sees the same event again, having acted; a reply in the lost answer is lost.
- *duplicate* (``duplicate``): after a 2xx answer, the same request bytes go to the function
  once more, up to ``max_delay`` s later, on a new connection, the answer dropped (at-least-once
  redelivery, as after a lost acknowledgement). At most once per event and function.
- *reorder* (``reorder``): an event's first request to a function is held back between half of
  and all of ``max_delay`` s, so events sent later overtake it.

Which attempt is the last is Knative's to know, not ours: the dispatcher retries without
telling the subscriber the attempt's number. What keeps the dead-letter invariant meaningful
(dev/bench/chaos/invariants.py: nothing dead-lettered with an answer a retry could change) is a
budget: at most ``max_failures`` injected failures (drops and losses together) per event id
and function, fewer than any Trigger's ``retry`` (5 in knative/): at least ``retry + 1 -
max_failures`` attempts of every delivery are the function's own, so a dead letter is the
function's own doing, not ours. ``tests/unit/test_faults.py`` holds the budget below every
Trigger's retry count.

Knative's SelectiveRetry (``retriable``) is here too: what the invariant calls a retriable
answer. The dice are one seeded ``random.Random`` for every forward: the same seed rolls the same
sequence, though which request gets which roll depends on timing. ``stats()`` counts what was
injected, and what the forwards saw of Knative's own behaviour: requests to the functions
(``deliveries``) and repeated ones of the same event id (``retries``: the dispatcher's).
"""

from __future__ import annotations

import json
import random
import threading
import urllib.parse
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Final

from dev.pipeline.netns import PASS, Action, Decision, Message

if TYPE_CHECKING:
    from dev.pipeline.broker import KnativeBroker

# Knative's SelectiveRetry (kncloudevents): no answer, 404, 408, 409, 429 and every 5xx.
RETRIABLE: Final = frozenset({404, 408, 409, 429})
COUNTERS: Final = (
    "ingress_dropped",
    "attempts_dropped",
    "answers_lost",
    "duplicated",
    "reordered",
)
SOURCE: Final = "source"


def retriable(status: int | None) -> bool:
    """Whether Knative retries a delivery that got this answer (None: no answer at all)."""
    return status is None or status >= 500 or status in RETRIABLE


@dataclass(frozen=True)
class FaultSpec:
    """How often each fault strikes (probabilities per request; see the module docstring)."""

    seed: int
    ingress_drop: float = 0.05
    attempt_drop: float = 0.1
    answer_loss: float = 0.05
    duplicate: float = 0.1
    reorder: float = 0.1
    max_delay: float = 2.0
    # Injected failures per event id and function, at most: below every Trigger's retry.
    max_failures: int = 2

    def __post_init__(self) -> None:
        for name in ("ingress_drop", "attempt_drop", "answer_loss", "duplicate", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"fault {name} must be a probability, got {value!r}")
        if self.max_delay < 0:
            raise ValueError(f"max_delay must be >= 0, got {self.max_delay!r}")
        if self.max_failures < 0:
            raise ValueError(f"max_failures must be >= 0, got {self.max_failures!r}")


def event_id(request: Message) -> str | None:
    """The CloudEvent id of a request: binary mode's ``ce-id``, or structured mode's ``id``."""
    if "ce-id" in request.headers:
        return request.headers["ce-id"]
    if "cloudevents+json" in request.headers.get("content-type", ""):
        try:
            doc = json.loads(request.body)
        except ValueError:
            return None
        ident = doc.get("id") if isinstance(doc, dict) else None
        if isinstance(ident, str):
            return ident
    return None


class Faults:
    """The policy every faulted forward consults (:class:`pipeline.netns.FaultPolicy`).

    A forward plays a role: :data:`SOURCE` (ingress drops) or a function's name (the rest).
    ``stop()`` ends the faults; the counting goes on for as long as the forwards ask.
    """

    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self.enabled = True
        self._random = random.Random(spec.seed)
        self._lock = threading.Lock()
        self._roles: dict[str, str] = {}
        self._counts: Counter[str] = Counter(dict.fromkeys(COUNTERS, 0))
        self._requests: Counter[tuple[str, str]] = Counter()
        self._failed: Counter[tuple[str, str]] = Counter()
        self._repeated: set[tuple[str, str]] = set()

    def watch(self, forward: str, role: str) -> None:
        with self._lock:
            self._roles[forward] = role

    def stop(self) -> None:
        with self._lock:
            self.enabled = False

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {name: self._counts[name] for name in (*COUNTERS, "deliveries", "retries")}

    def _roll(self, probability: float) -> bool:
        # Under self._lock.
        return self.enabled and probability > 0.0 and self._random.random() < probability

    def decide(self, forward: str, request: Message) -> Decision:
        spec = self.spec
        with self._lock:
            role = self._roles.get(forward)
            if role is None:
                return PASS
            if role == SOURCE:
                if self._roll(spec.ingress_drop):
                    self._counts["ingress_dropped"] += 1
                    return Decision(Action.ACCEPT_AND_DROP)
                return PASS
            ce = event_id(request)
            if ce is None:
                return PASS
            key = (role, ce)
            first = self._requests[key] == 0
            self._requests[key] += 1
            self._counts["deliveries"] += 1
            if not first:
                self._counts["retries"] += 1
            may_fail = self._failed[key] < spec.max_failures
            if may_fail and self._roll(spec.attempt_drop):
                self._failed[key] += 1
                self._counts["attempts_dropped"] += 1
                return Decision(Action.RESET_BEFORE)
            hold = 0.0
            if first and self._roll(spec.reorder):
                self._counts["reordered"] += 1
                hold = self._random.uniform(spec.max_delay / 2, spec.max_delay)
            if may_fail and self._roll(spec.answer_loss):
                self._failed[key] += 1
                self._counts["answers_lost"] += 1
                return Decision(Action.RESET_AFTER, hold)
            return Decision(Action.PASS, hold)

    def answered(self, forward: str, request: Message, answer: Message) -> float | None:
        with self._lock:
            role = self._roles.get(forward)
            ce = event_id(request)
            if role in (None, SOURCE) or ce is None or not 200 <= answer.status < 300:
                return None
            key = (str(role), ce)
            if key in self._repeated or not self._roll(self.spec.duplicate):
                return None
            self._repeated.add(key)
            self._counts["duplicated"] += 1
            return self._random.uniform(0.0, self.spec.max_delay)

    def describe(self) -> dict[str, object]:
        return {**asdict(self.spec), "forwards": dict(self._roles)}


def function_forward(url: str) -> str:
    """The name of the broker's forward to a function serving at ``url`` (``out-PORT``)."""
    return f"out-{urllib.parse.urlsplit(url).port or 80}"


def attach(broker: KnativeBroker, faults: Faults, functions: Mapping[str, str]) -> None:
    """Put ``faults`` on the broker's ``source`` forward and on the forward to each function
    (name -> URL). Never on the API server's, the archive's or the dead-letter sink's."""
    faults.watch(SOURCE, SOURCE)
    broker.forward(SOURCE).set_faults(faults)
    for name, url in functions.items():
        forward = function_forward(url)
        faults.watch(forward, name)
        broker.forward(forward).set_faults(faults)
