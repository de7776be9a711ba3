"""The one module that talks to Prometheus: instant queries over its HTTP API.

``POST /api/v1/query`` with the expression form-encoded (the API takes GET or POST; POST keeps
long expressions out of URL length limits), no ``time`` (Prometheus evaluates at its own now).
The answer's envelope is ``{"status": "success"|"error", "data": {"resultType", "result"},
"errorType", "error", "warnings"}``; the API answers 400 for a malformed expression, 422 for one
it cannot execute and 503 when the query timed out or was aborted (prometheus.io, "HTTP API").

Errors map onto three exceptions, so callers decide on meaning, not on HTTP codes:

- `Unreachable`: no answer (refused, timed out) or an answer saying Prometheus cannot serve
  now (5xx, a query that timed out): an outage, which says nothing about any rule;
- `BadAnswer`: something answered that is not the Prometheus API (a wrong URL, a proxy's HTML
  page): as much an outage for the caller, but a person must fix the address;
- `QueryFailed`: Prometheus refused this one expression (bad_data, execution) or it yields no
  vector: the rule is wrong, the other rules still count.

Matching a series to a Node (`node_values`): the series' ``node`` label is the Node's name, when
it has one (kube-prometheus and many scrape configs add it); otherwise the host part of its
``instance`` label (port and IPv6 brackets removed) is the Node's name (what Prometheus's
kubernetes_sd ``role: node`` sets ``instance`` to) or its InternalIP (a node-exporter scraped
as ``10.0.0.7:9100``). Series that match no Node are left out; NaN values are no value.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import requests

log = logging.getLogger(__name__)

QUERY_PATH: Final = "/api/v1/query"
# errorType values the API uses when the query, not the expression, failed.
_OUTAGE_ERROR_TYPES: Final = frozenset({"timeout", "canceled", "unavailable", "internal"})


class PrometheusError(Exception):
    """A query gave no usable answer."""


class Unreachable(PrometheusError):
    """No answer, or Prometheus says it cannot answer now."""


class BadAnswer(PrometheusError):
    """Something answered, but not the Prometheus HTTP API."""


class QueryFailed(PrometheusError):
    """Prometheus refused this expression, or it does not yield one value per series."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector: its labels and its value."""

    labels: Mapping[str, str]
    value: float


class Prometheus:
    """A Prometheus server's HTTP API at ``url`` (e.g. http://prometheus.monitoring:9090)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        session: requests.Session | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._session = session or requests.Session()

    def query(self, expr: str) -> list[Sample]:
        """Evaluate ``expr`` now; its instant vector as samples."""
        # Prometheus gives up on the query a little before we give up on the answer, so a slow
        # query comes back as its own 503 (timeout) rather than as a dropped connection.
        form = {"query": expr, "timeout": f"{max(1.0, self.timeout - 1):g}s"}
        try:
            response = self._session.post(
                self.url + QUERY_PATH, data=form, timeout=(min(3.05, self.timeout), self.timeout)
            )
        except requests.RequestException as err:
            raise Unreachable(f"{self.url}: {type(err).__name__}: {err}") from err
        body = _json(response)
        if body is None or body.get("status") not in ("success", "error"):
            if response.status_code >= 500:
                raise Unreachable(f"{self.url}: HTTP {response.status_code}")
            raise BadAnswer(
                f"{self.url}{QUERY_PATH} answered HTTP {response.status_code} with no Prometheus "
                f"API response: is this the Prometheus server's address?"
            )
        if body["status"] == "error":
            kind = str(body.get("errorType", ""))
            message = f"{kind}: {body.get('error', '')}"
            if response.status_code >= 500 or kind in _OUTAGE_ERROR_TYPES:
                raise Unreachable(f"{self.url}: HTTP {response.status_code} {message}")
            raise QueryFailed(message)
        for warning in body.get("warnings") or ():
            log.warning("Prometheus warns about %r: %s", expr, warning)
        return _vector(body.get("data"))


def _json(response: requests.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _vector(data: object) -> list[Sample]:
    if not isinstance(data, dict):
        raise BadAnswer("a success answer without data")
    kind = data.get("resultType")
    if kind != "vector":
        raise QueryFailed(f"the expression yields a {kind}, not one value per node (a vector)")
    samples = []
    for item in data.get("result") or ():
        try:
            labels = {str(k): str(v) for k, v in item["metric"].items()}
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
            raise BadAnswer(f"a vector sample we cannot read: {item!r}") from err
        samples.append(Sample(labels, value))
    return samples


def instance_host(instance: str) -> str:
    """The host part of an ``instance`` label: ``10.0.0.7:9100`` -> ``10.0.0.7``,
    ``[fd00::7]:9100`` -> ``fd00::7``, ``node-a`` -> ``node-a``."""
    if instance.startswith("["):
        end = instance.find("]")
        return instance[1:end] if end > 0 else instance
    host, sep, port = instance.rpartition(":")
    # A bare IPv6 address has several colons and no port.
    if sep and port.isdigit() and ":" not in host:
        return host
    return instance


def node_values(
    samples: Iterable[Sample], internal_ips: Mapping[str, Iterable[str]]
) -> dict[str, list[float]]:
    """Each Node's values among ``samples`` (usually one; several when several jobs scrape it),
    by Node name. ``internal_ips`` maps every Node's name to its InternalIP addresses. See the
    module docstring for the matching."""
    by_ip: dict[str, str] = {}
    for name, addresses in internal_ips.items():
        for address in addresses:
            by_ip.setdefault(address, name)
    values: dict[str, list[float]] = {}
    for sample in samples:
        if math.isnan(sample.value):
            continue
        node = sample.labels.get("node", "")
        if node not in internal_ips:
            host = instance_host(sample.labels.get("instance", ""))
            node = host if host in internal_ips else by_ip.get(host, "")
        if node:
            values.setdefault(node, []).append(sample.value)
    return values
