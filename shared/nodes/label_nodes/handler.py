"""label-nodes' handler: one evaluation of the pressure rules, and what it tells people.

An evaluation lists the Nodes, asks Prometheus each rule's expression, lets the pure decision
(shared.nodes.label_nodes.decide) say which nodes carry the label afterwards, and writes only the
Nodes whose label or record changes, with a JSON merge patch of the label and the annotation alone.

The label's key (``status``) is not ours alone: an operator may use it for their own values. A
patch names the key only to set it on a node that had none or to remove our value we put
there (decide.hands_off says when it is ours); such a patch carries the ``resourceVersion`` the
Node was read at, and the API server refuses it (409) if anyone wrote the Node since, so a value
someone wrote between our read and our write is never overwritten or deleted. A merge patch is
otherwise blind: it would replace or delete whatever the key holds by then. The 409 makes the
ping answer 503, and the PingSource's retry evaluates afresh from a new list. A patch of our
annotation alone (a ``for`` timer, a renewed record) names no label and needs no precondition:
only we write that key, and one evaluation runs at a time (one pod, evaluations take turns).

Prometheus down or answering errors is not a failed evaluation: the decision keeps labels until
they are stale and labels nothing new, the outage is logged, counted and shown on ``/status``,
and the ping is answered 202. A 5xx would gain nothing: the PingSource adapter retries a 5xx
five times within about 1.5 s (50 ms doubling; knative.dev/eventing pkg/adapter/mtping) and
then drops the tick, and an outage does not end in 1.5 s; the next tick comes anyway. What a
retry can fix (the API server throttling or briefly unreachable) is answered 503.

``/status`` is this process's view (last evaluation, last success, whether Prometheus answered,
last error); ``/nodes`` reads the labelled Nodes from the API server, so it is true whichever
instance answers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypedDict, cast

from prometheus_client import Counter, Gauge

from shared.api.keys import (
    PRESSURE_ANNOTATION,
    PRESSURE_LABEL_KEY,
    PRESSURE_LABEL_VALUE,
    opted_out,
)
from shared.api.pressure import Record
from shared.api.records import RecordError
from shared.api.times import format_time
from shared.nodes.label_nodes.decide import (
    Action,
    Decision,
    NodeDecision,
    NodeView,
    Observations,
    decide,
    stale_limit,
)
from shared.nodes.label_nodes.rules import Rule
from shared.platform import kube as kubeapi
from shared.platform import prometheus as prom
from shared.platform.config import Config
from shared.platform.kube import Kube

log = logging.getLogger(__name__)

EVALUATIONS: Final = Counter(
    "knr_pressure_evaluations_total",
    "label-nodes evaluations, by outcome (ok; partial: some rules failed; outage: Prometheus "
    "unreachable or not answering as its API).",
    ["outcome"],
)
RULE_FAILURES: Final = Counter(
    "knr_pressure_rule_failures_total",
    "Pressure rules whose query failed, by rule and kind (unreachable, bad_answer, query).",
    ["rule", "kind"],
)
NODE_WRITES: Final = Counter(
    "knr_pressure_node_writes_total",
    "Nodes written by label-nodes, by action (label, unlabel, keep: a record renewed, none: a "
    "pending record changed, hands-off: our record dropped from a node whose label is not ours).",
    ["action"],
)
LABELLED: Final = Gauge(
    "knr_pressure_labelled_nodes", "Nodes carrying the pressure label after the last evaluation."
)
PROMETHEUS_UP: Final = Gauge(
    "knr_pressure_prometheus_up",
    "1 when the last evaluation reached Prometheus and it answered as its API, else 0.",
)


# The parts of a Node this function reads (the API's JSON).
class _NodeAddress(TypedDict, total=False):
    type: str
    address: str


class _NodeStatus(TypedDict, total=False):
    addresses: list[_NodeAddress]


class _NodeSpec(TypedDict, total=False):
    unschedulable: bool


class _NodeMeta(TypedDict, total=False):
    name: str
    resourceVersion: str
    labels: dict[str, str]
    annotations: dict[str, str]


class _Node(TypedDict, total=False):
    metadata: _NodeMeta
    spec: _NodeSpec
    status: _NodeStatus


@dataclass
class Status:
    """What ``/status`` shows: this process's last evaluations."""

    prometheus_url: str
    last_evaluation: datetime | None = None
    # The last evaluation in which every rule answered.
    last_success: datetime | None = None
    prometheus_reachable: bool | None = None
    last_error: str = ""
    labelled: int = 0
    cap: int = 0
    rules: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "prometheus_url": self.prometheus_url,
            "prometheus_reachable": self.prometheus_reachable,
            "last_evaluation": _precise(self.last_evaluation),
            "last_success": _precise(self.last_success),
            "last_error": self.last_error,
            "labelled": self.labelled,
            "cap": self.cap,
            "rules": self.rules,
        }


@dataclass(frozen=True)
class Evaluation:
    """One evaluation's outcome, for logs and tests."""

    at: datetime
    decision: Decision
    observations: Observations
    outage: str
    written: tuple[str, ...]


class Labeler:
    def __init__(
        self,
        kube: Kube,
        prometheus: prom.Prometheus,
        rules: Sequence[Rule],
        config: Config,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.prometheus = prometheus
        self.rules = tuple(rules)
        self.config = config
        self.clock = clock
        key, _, value = config.pressure_label.partition("=")
        self.label_key, self.label_value = key, value
        self.status = Status(prometheus.url, rules=[rule.describe() for rule in self.rules])
        self._lock = threading.Lock()
        # Nodes whose label key is not ours, as last told in the log: told again on a change.
        self._told: dict[str, str] = {}

    # -- one evaluation -----------------------------------------------------------------------

    def evaluate(self) -> Evaluation:
        with self._lock:
            return self._evaluate()

    def _evaluate(self) -> Evaluation:
        nodes = [cast(_Node, node) for node in self.kube.list_all("Node")]
        observations, outage = self._observe(nodes)
        now = self.clock()
        decision = decide(
            [self._view(n) for n in nodes], self.rules, observations, now, self.config
        )
        self._tell_hands_off(decision)
        versions = {
            (n.get("metadata") or {}).get("name", ""): (n.get("metadata") or {}).get(
                "resourceVersion", ""
            )
            for n in nodes
        }
        written = self._write(decision, versions)
        self._record(now, decision, observations, outage)
        return Evaluation(now, decision, observations, outage, written)

    def _observe(self, nodes: Iterable[_Node]) -> tuple[Observations, str]:
        """Each rule's value per node; the failed rules; the outage, if Prometheus is down."""
        ips = {
            (n.get("metadata") or {}).get("name", ""): [
                a.get("address", "")
                for a in (n.get("status") or {}).get("addresses") or ()
                if a.get("type") == "InternalIP"
            ]
            for n in nodes
        }
        ips.pop("", None)
        values: dict[str, dict[str, float]] = {}
        failed: dict[str, str] = {}
        outage = ""
        for rule in self.rules:
            if outage:
                failed[rule.name] = outage
                continue
            try:
                samples = self.prometheus.query(rule.expr)
            except (prom.Unreachable, prom.BadAnswer) as err:
                kind = "unreachable" if isinstance(err, prom.Unreachable) else "bad_answer"
                outage = f"Prometheus {kind.replace('_', ' ')}: {err}"
                failed[rule.name] = outage
                RULE_FAILURES.labels(rule=rule.name, kind=kind).inc()
                continue
            except prom.QueryFailed as err:
                failed[rule.name] = f"query failed: {err}"
                RULE_FAILURES.labels(rule=rule.name, kind="query").inc()
                log.error("pressure rule %s: Prometheus refused its expression: %s", rule.name, err)
                continue
            per_node = prom.node_values(samples, ips)
            values[rule.name] = {node: rule.worst(vals) for node, vals in per_node.items()}
            if samples and not per_node:
                log.warning(
                    "pressure rule %s: none of its %d series names a node (by a `node` label, "
                    "or an `instance` that is a node's name or InternalIP)",
                    rule.name,
                    len(samples),
                )
        return Observations(values, failed), outage

    def _view(self, node: _Node) -> NodeView:
        return node_view(node, self.label_key, self.label_value)

    def _tell_hands_off(self, decision: Decision) -> None:
        """One log line when a node's label key becomes (or stops being) someone else's, not one
        every 30 s. No Event: label-nodes records none (its RBAC allows Nodes only)."""
        now = {d.node: d.reason for d in decision.hands_off}
        for name, reason in sorted(now.items()):
            if self._told.get(name) != reason:
                log.warning(
                    "node %s: label %s %s",
                    name,
                    self.label_key,
                    reason,
                    extra={"node": name, "action": Action.HANDS_OFF.value},
                )
        for name in sorted(self._told.keys() - now.keys()):
            log.info("node %s: its label %s is no longer someone else's", name, self.label_key)
        self._told = now

    def _write(self, decision: Decision, versions: dict[str, str]) -> tuple[str, ...]:
        written = []
        transient: list[str] = []
        for change in decision.changes:
            body = node_patch(
                change, self.label_key, self.label_value, versions.get(change.node, "")
            )
            try:
                self.kube.merge_patch("Node", None, change.node, body)
            except kubeapi.NotFound:
                log.info("node %s is gone; nothing to write", change.node)
                continue
            except kubeapi.Conflict as err:
                # Written since the list: its label may now be someone else's. The retry of the
                # tick (503) decides again from what the Node says then.
                log.info("node %s changed since it was read; decided again on retry", change.node)
                transient.append(f"{change.node}: {err}")
                continue
            except kubeapi.Transient as err:
                # The other nodes still get their writes; the tick is retried for this one.
                transient.append(f"{change.node}: {err}")
                continue
            written.append(change.node)
            NODE_WRITES.labels(action=change.action.value).inc()
            log.info(
                "node %s: %s (%s)",
                change.node,
                change.action.value,
                change.reason,
                extra={"node": change.node, "action": change.action.value},
            )
        if transient:
            raise kubeapi.Transient("; ".join(transient))
        return tuple(written)

    def _record(
        self, now: datetime, decision: Decision, observations: Observations, outage: str
    ) -> None:
        status = self.status
        status.last_evaluation = now
        status.prometheus_reachable = not outage
        status.labelled = len(decision.labelled)
        status.cap = decision.cap
        PROMETHEUS_UP.set(0 if outage else 1)
        LABELLED.set(len(decision.labelled))
        if outage:
            outcome = "outage"
            status.last_error = outage
            log.error(
                "pressure evaluation without data: %s; labels are kept until stale (%s after "
                "they were last confirmed), none is added",
                outage,
                self.config.pressure_stale_after,
            )
        elif observations.failed:
            outcome = "partial"
            status.last_error = "; ".join(
                f"{rule}: {error}" for rule, error in sorted(observations.failed.items())
            )
        else:
            outcome = "ok"
            status.last_success = now
            status.last_error = ""
        EVALUATIONS.labels(outcome=outcome).inc()
        log.info(
            "pressure evaluation: %s, %d labelled (at most %d), %d written",
            outcome,
            len(decision.labelled),
            decision.cap,
            len(decision.changes),
            extra={
                "labelled": sorted(d.node for d in decision.labelled),
                # Qualify for the label, held back because worse nodes hold all it allows.
                "capped": sorted(d.node for d in decision.capped),
                # Their label key is not ours: never written.
                "hands_off": sorted(d.node for d in decision.hands_off),
                "outcome": outcome,
            },
        )

    # -- what /nodes shows ----------------------------------------------------------------------

    def labelled_nodes(self) -> dict[str, Any]:
        """The Nodes carrying the label now, with their records, read from the API server."""
        selector = f"{self.label_key}={self.label_value}"
        nodes = []
        for raw in self.kube.list_all("Node", label_selector=selector):
            view = self._view(cast(_Node, raw))
            record = view.record
            nodes.append(
                {
                    "name": view.name,
                    "rule": record.rule if record else None,
                    "value": record.value if record else None,
                    "since": _stamp(record.since if record else None),
                    "seen": _stamp(record.seen if record else None),
                    "stale_at": _stamp(stale_limit(record, self.config)),
                }
            )
        return {"label": selector, "count": len(nodes), "nodes": nodes}


def node_view(
    node: _Node | dict[str, Any],
    label_key: str = PRESSURE_LABEL_KEY,
    label_value: str = PRESSURE_LABEL_VALUE,
) -> NodeView:
    """A Node as the decision sees it: the label key's value (ours or someone else's), our
    record, opt-out and cordon."""
    meta = cast(_Node, node).get("metadata") or {}
    labels = meta.get("labels") or {}
    raw = (meta.get("annotations") or {}).get(PRESSURE_ANNOTATION)
    record: Record | None = None
    if raw is not None:
        try:
            record = Record.from_json(raw)
        except RecordError as err:
            log.warning("node %s: %s: %s (replaced)", meta.get("name"), PRESSURE_ANNOTATION, err)
    value = labels.get(label_key)
    return NodeView(
        name=meta.get("name", ""),
        labelled=value == label_value,
        record=record,
        annotated=raw is not None,
        opted_out=opted_out(labels),
        schedulable=not (cast(_Node, node).get("spec") or {}).get("unschedulable", False),
        foreign=value if value is not None and value != label_value else None,
    )


def node_patch(
    change: NodeDecision, label_key: str, label_value: str, resource_version: str
) -> dict[str, Any]:
    """The JSON merge patch for one changed node: our annotation always; the label's key only
    when the label is set or removed, and then with the resourceVersion the Node was read at
    (see the module docstring). A node whose key is not ours never gets the key."""
    meta: dict[str, Any] = {}
    if change.action in (Action.LABEL, Action.UNLABEL):
        if not resource_version:
            # An empty resourceVersion would make the patch unconditional.
            raise ValueError(f"node {change.node}: no resourceVersion to write the label against")
        meta["resourceVersion"] = resource_version
        meta["labels"] = {label_key: label_value if change.labelled else None}
    meta["annotations"] = {PRESSURE_ANNOTATION: change.record.to_json() if change.record else None}
    return {"metadata": meta}


def _stamp(moment: datetime | None) -> str | None:
    return format_time(moment) if moment is not None else None


def _precise(moment: datetime | None) -> str | None:
    """Evaluations may be less than a second apart: /status tells them apart."""
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
