"""Triggers and the Broker read from the manifests in ``knative/``, as Knative would see them.

Only what replay and the local Broker need: which broker a Trigger hangs on, its filter, its
subscriber and its delivery spec. The checks are the ones Knative's admission webhook makes (so
a manifest they accept is one the cluster accepts too); anything else in the files (Services,
kustomizations, RBAC) is ignored.

Delivery semantics (knative.dev/eventing v0.50 ``pkg/kncloudevents/retries.go`` and
``pkg/reconciler/broker/trigger/trigger.go``):

- The Trigger's ``spec.delivery`` applies as a whole when present, else the Broker's: fields
  are not merged, and the dead-letter sink comes from the spec that applies.
- ``retry`` extra attempts after the first. Before retry ``n + 1`` (``n`` retries done so far,
  counting from 0) the dispatcher waits ``backoffDelay * 2**n`` (exponential) or
  ``backoffDelay * n`` (linear: the first retry is immediate). Without both ``backoffPolicy``
  and ``backoffDelay`` retries are immediate.
- ``timeout`` bounds each attempt. ``retryAfterMax`` (alpha) makes a ``Retry-After`` header of a
  429 or 503 count, capped at that value, when it is longer than the backoff.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kubectl_kn_rescheduler.routing import filters

log = logging.getLogger(__name__)

EVENTING_V1 = "eventing.knative.dev/v1"

# rickb777/date/period (what Knative parses durations with) converts years and months with
# these approximations.
_YEAR_SECONDS = 365.2425 * 86400
_MONTH_SECONDS = _YEAR_SECONDS / 12
_PERIOD = re.compile(
    r"^(?P<sign>[-+])?P"
    r"(?:(?P<years>\d+(?:[.,]\d+)?)Y)?"
    r"(?:(?P<months>\d+(?:[.,]\d+)?)M)?"
    r"(?:(?P<weeks>\d+(?:[.,]\d+)?)W)?"
    r"(?:(?P<days>\d+(?:[.,]\d+)?)D)?"
    r"(?:T"
    r"(?:(?P<hours>\d+(?:[.,]\d+)?)H)?"
    r"(?:(?P<minutes>\d+(?:[.,]\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:[.,]\d+)?)S)?"
    r")?$"
)
_UNIT_SECONDS = {
    "years": _YEAR_SECONDS,
    "months": _MONTH_SECONDS,
    "weeks": 7 * 86400.0,
    "days": 86400.0,
    "hours": 3600.0,
    "minutes": 60.0,
    "seconds": 1.0,
}


class InvalidManifest(ValueError):
    """A Trigger or Broker Knative would reject (or replay cannot honour)."""


def parse_duration(value: str) -> float:
    """An ISO 8601 duration (``PT0.5S``, ``PT1M30S``, ``P1D``) in seconds."""
    match = _PERIOD.match(value.strip()) if isinstance(value, str) else None
    if not match or value.strip() in ("P", "PT", "-P", "+P") or value.strip().endswith("T"):
        raise ValueError(f"not an ISO 8601 duration: {value!r}")
    total = 0.0
    for unit, seconds in _UNIT_SECONDS.items():
        amount = match.group(unit)
        if amount:
            total += float(amount.replace(",", ".")) * seconds
    return -total if match.group("sign") == "-" else total


@dataclass(frozen=True)
class Delivery:
    retry: int = 0
    backoff_policy: str | None = None
    backoff_delay: float | None = None
    timeout: float | None = None
    retry_after_max: float | None = None
    dead_letter_sink: str | None = None
    format: str | None = None

    def backoff(self, retries_done: int) -> float:
        """Seconds to wait before the next retry, ``retries_done`` retries having been made.

        go-retryablehttp calls Knative's backoff with the 0-based number of the attempt that
        just failed, hence ``2**n`` and ``n`` with ``n`` counting from 0.
        """
        if self.backoff_policy is None or self.backoff_delay is None:
            return 0.0
        if self.backoff_policy == "exponential":
            return float(self.backoff_delay * (2**retries_done))
        return float(self.backoff_delay * retries_done)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None, where: str) -> Delivery | None:
        if spec is None:
            return None
        if not isinstance(spec, Mapping):
            raise InvalidManifest(f"{where}: delivery must be an object")
        retry = spec.get("retry")
        if retry is not None and (not isinstance(retry, int) or retry < 0):
            raise InvalidManifest(f"{where}.retry: invalid value {retry!r}")
        policy = spec.get("backoffPolicy")
        if policy is not None and policy not in ("linear", "exponential"):
            raise InvalidManifest(f"{where}.backoffPolicy: invalid value {policy!r}")
        fmt = spec.get("format")
        if fmt is not None and fmt not in ("json", "binary"):
            raise InvalidManifest(f"{where}.format: invalid value {fmt!r}")
        durations: dict[str, float | None] = {}
        for key in ("backoffDelay", "timeout", "retryAfterMax"):
            raw = spec.get(key)
            if raw is None:
                durations[key] = None
                continue
            try:
                durations[key] = parse_duration(str(raw))
            except ValueError as exc:
                raise InvalidManifest(f"{where}.{key}: {exc}") from exc
        timeout = durations["timeout"]
        if timeout is not None and timeout <= 0:
            raise InvalidManifest(f"{where}.timeout: must be a positive duration")
        retry_after_max = durations["retryAfterMax"]
        if retry_after_max is not None and retry_after_max < 0:
            raise InvalidManifest(f"{where}.retryAfterMax: must not be negative")
        sink = spec.get("deadLetterSink")
        return cls(
            retry=retry or 0,
            backoff_policy=policy,
            backoff_delay=durations["backoffDelay"],
            timeout=timeout,
            retry_after_max=retry_after_max,
            dead_letter_sink=_describe_destination(sink, f"{where}.deadLetterSink")
            if sink is not None
            else None,
            format=fmt,
        )


def _describe_destination(dest: Any, where: str) -> str:
    if not isinstance(dest, Mapping) or not (dest.get("ref") or dest.get("uri")):
        raise InvalidManifest(f"{where}: needs a ref or a uri")
    ref = dest.get("ref")
    parts = []
    if ref:
        if not isinstance(ref, Mapping) or not all(
            ref.get(k) for k in ("apiVersion", "kind", "name")
        ):
            raise InvalidManifest(f"{where}.ref: needs apiVersion, kind and name")
        parts.append(f"{ref['apiVersion']} {ref['kind']} {ref['name']}")
    if dest.get("uri"):
        parts.append(str(dest["uri"]))
    return " ".join(parts)


@dataclass(frozen=True)
class Subscriber:
    """A Trigger's ``spec.subscriber``: a Knative Service reference and/or a URI."""

    service: str | None
    uri: str | None

    def resolve(self, services: Mapping[str, str]) -> str | None:
        """The URL to POST to, or None when the referenced Service is not known here.

        As in Knative's Destination: with both a ref and a uri, the uri is resolved relative
        to the ref's address.
        """
        if self.service is None:
            return self.uri
        base = services.get(self.service)
        if base is None:
            return None
        if not self.uri:
            return base
        return base.rstrip("/") + "/" + self.uri.lstrip("/")


@dataclass(frozen=True)
class Trigger:
    name: str
    namespace: str
    broker: str
    subscriber: Subscriber
    filter: filters.Filter = field(compare=False)
    delivery: Delivery | None
    source: str = ""


@dataclass(frozen=True)
class Broker:
    name: str
    namespace: str
    delivery: Delivery | None
    source: str = ""


def _documents(directory: Path) -> Iterable[tuple[str, Mapping[str, Any]]]:
    for path in sorted(directory.iterdir()):
        if path.suffix not in (".yaml", ".yml") or not path.is_file():
            continue
        try:
            docs = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError as exc:
            raise InvalidManifest(f"{path.name}: not YAML: {exc}") from exc
        for i, doc in enumerate(docs):
            if isinstance(doc, Mapping):
                yield f"{path.name}#{i}", doc


def _subscriber(spec: Mapping[str, Any], where: str) -> Subscriber:
    sub = spec.get("subscriber")
    if not isinstance(sub, Mapping) or not (sub.get("ref") or sub.get("uri")):
        raise InvalidManifest(f"{where}.subscriber: needs a ref or a uri")
    ref = sub.get("ref")
    service = None
    if ref:
        if not isinstance(ref, Mapping) or not ref.get("name"):
            raise InvalidManifest(f"{where}.subscriber.ref: needs a name")
        # Resolved locally by name through the caller's mapping (a Knative Service's URL).
        service = str(ref["name"])
    uri = sub.get("uri")
    return Subscriber(service=service, uri=str(uri) if uri else None)


def trigger_from(doc: Mapping[str, Any], default_namespace: str, where: str = "") -> Trigger:
    meta = doc.get("metadata") or {}
    name = meta.get("name")
    where = f"{where or 'Trigger'} {name or '?'}"
    if not name:
        raise InvalidManifest(f"{where}: metadata.name is required")
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidManifest(f"{where}: spec is required")
    broker = spec.get("broker")
    broker_ref = spec.get("brokerRef")
    if broker and broker_ref:
        raise InvalidManifest(f"{where}: expected exactly one of broker, brokerRef")
    if broker_ref:
        if not isinstance(broker_ref, Mapping) or not broker_ref.get("name"):
            raise InvalidManifest(f"{where}.brokerRef: needs a name")
        broker = broker_ref["name"]
    if not broker:
        raise InvalidManifest(f"{where}: spec.broker is required")
    try:
        trigger_filter = filters.for_trigger(spec)
    except filters.InvalidFilter as exc:
        raise type(exc)(f"{where}: {exc}") from exc
    return Trigger(
        name=str(name),
        namespace=str(meta.get("namespace") or default_namespace),
        broker=str(broker),
        subscriber=_subscriber(spec, where),
        filter=trigger_filter,
        delivery=Delivery.from_spec(spec.get("delivery"), f"{where}.spec.delivery"),
        source=where,
    )


def broker_from(doc: Mapping[str, Any], default_namespace: str, where: str = "") -> Broker:
    meta = doc.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise InvalidManifest(f"{where}: Broker metadata.name is required")
    spec = doc.get("spec") or {}
    return Broker(
        name=str(name),
        namespace=str(meta.get("namespace") or default_namespace),
        delivery=Delivery.from_spec(spec.get("delivery"), f"{where} Broker {name}.spec.delivery"),
        source=where,
    )


def load(directory: Path, *, namespace: str, broker: str) -> tuple[list[Trigger], Broker | None]:
    """The Triggers of ``broker`` in ``namespace`` and the Broker itself, from every YAML file.

    Objects without a namespace land in ``namespace`` (as ``kubectl apply -n`` would place
    them). Triggers of other brokers or namespaces are left out.
    """
    triggers: list[Trigger] = []
    found_broker: Broker | None = None
    seen: set[str] = set()
    for where, doc in _documents(directory):
        if doc.get("apiVersion") != EVENTING_V1:
            continue
        if doc.get("kind") == "Trigger":
            trigger = trigger_from(doc, namespace, where)
            if trigger.namespace != namespace or trigger.broker != broker:
                log.info(
                    "trigger %s is for broker %s/%s, not ours",
                    trigger.name,
                    trigger.namespace,
                    trigger.broker,
                )
                continue
            if trigger.name in seen:
                raise InvalidManifest(f"{where}: Trigger {trigger.name} is defined twice")
            seen.add(trigger.name)
            triggers.append(trigger)
        elif doc.get("kind") == "Broker":
            candidate = broker_from(doc, namespace, where)
            if candidate.name == broker and candidate.namespace == namespace:
                found_broker = candidate
    return triggers, found_broker
