"""Which nodes carry the pressure label after one evaluation: a pure decision, with reasons.

Input: every Node as it is now (the label, our record, opt-out, cordon), the rules, what
Prometheus answered for each rule this time (a value per node, or the rule's query failed),
the time and the settings. Output: per node, whether it is labelled afterwards, the record it
carries and why; only nodes whose label or record changes are written.

Where the memory lives. Functions are stateless and an evaluation must still know how long a
value has been over the threshold (``for``) and when a label was last confirmed (staleness).
Both live on the Node itself, in the JSON annotation ``kn-rescheduler.io/pressure``:

- a labelled node's record says which rule holds the label, its value, since when the node is
  labelled and when an evaluation last saw it under pressure (``seen``);
- a node over a rule's threshold that has not been over it for the rule's ``for`` yet carries
  only ``pending``: since when each such rule has been firing.

Why on each Node rather than in one place (a ConfigMap, a Lease): the node is the unit whose
data can go missing (one node-exporter down while Prometheus answers for the others), so
"last confirmed" is per node; the label and its evidence travel together, so ``kubectl get
node -o yaml`` shows both and the webhook, which already has the Node, needs nothing else; and
the function needs no write access beyond Nodes. The price is a write to keep ``seen`` fresh,
which is bounded: ``seen`` is renewed only once it is older than a quarter of
``pressure_stale_after`` (one write per labelled node per that time, none for a node whose
state is unchanged and recently confirmed), so a label outlives the last evaluation that saw
its node under pressure by between three quarters of ``pressure_stale_after`` and all of it.

The rules of the decision:

- a node is labelled when one rule is past its threshold and has been for the rule's ``for``;
- a labelled node keeps the label while any rule's value is still past that rule's clear
  threshold (hysteresis), and loses it once every rule answered and none is (a rule that
  answered for other nodes but has no series for this one says nothing about it);
- without data (Prometheus down or answering errors, a rule's query failing, the node's series
  missing) nothing new is labelled and nothing is cleared on the data's say-so: labels stay
  until ``seen`` is older than ``pressure_stale_after`` (soft affinity never blocks scheduling,
  so a stale label costs little for a while; a label nobody can confirm must not stay forever),
  and a ``for`` timer is neither advanced to a label nor reset;
- at most ``pressure_max_share`` of the schedulable (not cordoned) nodes are labelled, rounded
  down: nodes that have the label and are still past a threshold keep it (hysteresis at the
  cap: among nodes that all qualify, the worst changes with every reading), then the worst
  other nodes (furthest past a threshold, relative to it) get it, and last labels that only a
  clear threshold holds;
- a node with the opt-out label is never labelled, and loses a label it has;
- the label's key is a common word (``status``), so the label is ours only when the node
  carries our value *and* our record says we put it there (a record with ``since``). Any other
  value of the key (an operator's ``status=maintenance``), and our value without such a record
  (written by hand, by a dynamicScheduler still running, or our record deleted), is left
  alone: never overwritten, never removed, whatever the rules say; only our own annotation is
  dropped from such a node, since it no longer describes a label of ours. Our value there still
  steers pods away (the webhook cannot tell who wrote it), so it counts against the cap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Final

from shared.api.pressure import Record
from shared.api.times import format_time
from shared.nodes.label_nodes.rules import Fires, Rule
from shared.platform.config import Config

# `seen` is renewed once it is older than this share of pressure_stale_after.
REFRESH_SHARE: Final = 0.25


@dataclass(frozen=True)
class NodeView:
    """A Node as the decision sees it."""

    name: str
    # Carries the label's value (ours or not: see `foreign` and `record` for whose it is).
    labelled: bool
    record: Record | None = None
    # The annotation is there; with `record` None it could not be read (and will be replaced).
    annotated: bool = False
    opted_out: bool = False
    schedulable: bool = True
    # The label key's value when it is not our value (someone else's); None: absent or ours.
    foreign: str | None = None


@dataclass(frozen=True)
class Observations:
    """What Prometheus answered this evaluation: per rule, each node's value; or the failure."""

    values: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)


class Action(StrEnum):
    LABEL = "label"
    UNLABEL = "unlabel"
    KEEP = "keep"
    NONE = "none"
    # The label key is not ours on this node: never written (our own record may be dropped).
    HANDS_OFF = "hands-off"


@dataclass(frozen=True)
class NodeDecision:
    node: str
    action: Action
    reason: str
    labelled: bool
    # The record the node carries afterwards; None: no annotation.
    record: Record | None
    # Whether the Node must be written (label or record differ from what it has).
    changed: bool
    # Qualifies for the label, but worse nodes hold every label the cap allows.
    capped: bool = False


@dataclass(frozen=True)
class Decision:
    nodes: tuple[NodeDecision, ...]
    # How many nodes may carry the label at once.
    cap: int

    @property
    def changes(self) -> tuple[NodeDecision, ...]:
        return tuple(d for d in self.nodes if d.changed)

    @property
    def labelled(self) -> tuple[NodeDecision, ...]:
        return tuple(d for d in self.nodes if d.labelled)

    @property
    def capped(self) -> tuple[NodeDecision, ...]:
        return tuple(d for d in self.nodes if d.capped)

    @property
    def hands_off(self) -> tuple[NodeDecision, ...]:
        return tuple(d for d in self.nodes if d.action is Action.HANDS_OFF)


@dataclass(frozen=True)
class _Wish:
    """A node's outcome before the cap: labelled or not, why, and how it ranks."""

    view: NodeView
    label: bool
    reason: str
    record: Record | None
    severity: float = -math.inf
    capped: bool = False


def decide(
    nodes: Sequence[NodeView],
    rules: Sequence[Rule],
    seen: Observations,
    now: datetime,
    config: Config,
) -> Decision:
    """The label and record of every node after this evaluation (see the module docstring)."""
    # Records keep second precision (format_time); deciding at the same precision keeps a
    # record read back equal to the one written.
    now = now.astimezone(UTC).replace(microsecond=0)
    cap = math.floor(config.pressure_max_share * sum(1 for n in nodes if n.schedulable) + 1e-9)
    not_ours = {view.name: why for view in nodes if (why := hands_off(view))}
    # Our value put there by someone else steers pods away as much as ours: it takes a place.
    taken = sum(1 for view in nodes if view.name in not_ours and view.labelled)
    wishes = [_wish(view, rules, seen, now, config) for view in nodes if view.name not in not_ours]
    ranked = sorted((w for w in wishes if w.label), key=_rank)
    over_cap = {w.view.name for w in ranked[max(cap - taken, 0) :]}
    outcomes = {}
    for wish in wishes:
        outcome = _capped(wish, cap, rules, seen, now) if wish.view.name in over_cap else wish
        outcomes[wish.view.name] = _decision(outcome)
    decisions = [
        outcomes[view.name] if view.name not in not_ours else _left_alone(view, not_ours[view.name])
        for view in nodes
    ]
    return Decision(tuple(decisions), cap)


def hands_off(view: NodeView) -> str:
    """Why the label's key on this node is not ours to write; empty when it is."""
    if view.foreign is not None:
        return f"its label key has someone else's value {view.foreign!r}"
    if view.labelled and (view.record is None or view.record.since is None):
        return "it carries the label, but no record of ours says we put it there"
    return ""


def _left_alone(view: NodeView, why: str) -> NodeDecision:
    """A node whose label key is not ours: the label as it is; our annotation, if any, goes (it
    describes no label of ours there)."""
    return NodeDecision(
        view.name,
        Action.HANDS_OFF,
        f"left alone: {why}",
        view.labelled,
        None,
        changed=view.annotated,
    )


def _rank(wish: _Wish) -> tuple[int, float, str]:
    """The order in which the cap hands out labels: first the nodes that have the label and are
    still past a threshold (hysteresis: nodes that all qualify would otherwise pass the label
    around with every small change in who is worst, two writes each time), then the other nodes
    past a threshold, then labels only a clear threshold still holds; the worst first within
    each."""
    past = wish.severity > 0
    tier = 0 if wish.view.labelled and past else 1 if past else 2
    return tier, -wish.severity, wish.view.name


def _wish(
    view: NodeView, rules: Sequence[Rule], seen: Observations, now: datetime, config: Config
) -> _Wish:
    if view.opted_out:
        return _Wish(view, False, "the node opted out of pressure labels", None)
    evidence = {
        rule.name: seen.values[rule.name][view.name]
        for rule in rules
        if view.name in seen.values.get(rule.name, {})
    }
    by_name = {rule.name: rule for rule in rules}
    unknown = bool(seen.failed) or not evidence
    record = view.record
    if view.labelled:
        holding = [(by_name[r], v) for r, v in evidence.items() if by_name[r].holding(v)]
        if holding:
            rule, value = _worst(holding, prefer=record.rule if record else "")
            return _Wish(
                view,
                True,
                f"{rule.name} = {value:g}, not back past its clear threshold {rule.clear:g}",
                _confirmed(record, rule, value, now, config),
                max(r.severity(v) for r, v in holding),
            )
        if not unknown:
            return _Wish(
                view,
                False,
                "every rule is back past its clear threshold",
                _pending_record(view, rules, seen, evidence, now),
            )
        last = record.seen if record else None
        if last is not None and now - last <= config.pressure_stale_after:
            stored = by_name.get(record.rule) if record else None
            severity = (
                stored.severity(record.value)
                if stored and record and record.value is not None
                else -math.inf
            )
            return _Wish(
                view,
                True,
                f"no data ({_why_unknown(seen, evidence)}); kept until "
                f"{format_time(last + config.pressure_stale_after)}",
                record,
                severity,
            )
        when = f"since {format_time(last)}" if last else "ever"
        return _Wish(
            view,
            False,
            f"stale: not confirmed {when} ({_why_unknown(seen, evidence)})",
            _pending_record(view, rules, seen, evidence, now),
        )
    # Not labelled: label once a rule has fired for its `for`.
    pending = _pending(view, rules, seen, evidence, now)
    due = [
        (rule, evidence[rule.name])
        for rule in rules
        if rule.name in evidence
        and rule.firing(evidence[rule.name])
        and now - pending.get(rule.name, now) >= rule.for_
    ]
    if due:
        rule, value = _worst(due)
        sign = ">" if rule.fires is Fires.ABOVE else "<"
        return _Wish(
            view,
            True,
            f"{rule.name} = {value:g} {sign} {rule.threshold:g}"
            + (f" since {format_time(pending[rule.name])}" if rule.for_ else ""),
            Record(rule=rule.name, value=_rounded(value), since=now, seen=now),
            max(r.severity(v) for r, v in due),
        )
    if pending:
        names = ", ".join(sorted(pending))
        return _Wish(
            view,
            False,
            f"pending: {names} firing, not yet for long enough",
            Record(pending=pending),
        )
    return _Wish(view, False, "under every threshold", None)


def _capped(
    wish: _Wish, cap: int, rules: Sequence[Rule], seen: Observations, now: datetime
) -> _Wish:
    view = wish.view
    evidence = {
        rule.name: seen.values[rule.name][view.name]
        for rule in rules
        if view.name in seen.values.get(rule.name, {})
    }
    pending = _pending(view, rules, seen, evidence, now) if not view.labelled else {}
    return _Wish(
        view,
        False,
        f"{wish.reason}; but at most {cap} node(s) may be labelled and the label stays on "
        "nodes that have it while they are past a threshold, then goes to the worst",
        Record(pending=pending) if pending else None,
        capped=True,
    )


def _decision(wish: _Wish) -> NodeDecision:
    view = wish.view
    if wish.label and not view.labelled:
        action = Action.LABEL
    elif not wish.label and view.labelled:
        action = Action.UNLABEL
    elif wish.label:
        action = Action.KEEP
    else:
        action = Action.NONE
    before = view.record if (view.record is not None or not view.annotated) else _UNREADABLE
    changed = wish.label != view.labelled or wish.record != before
    return NodeDecision(
        view.name, action, wish.reason, wish.label, wish.record, changed, wish.capped
    )


# A stand-in that equals no record: an unreadable annotation is always rewritten or removed.
_UNREADABLE: Final = Record(rule="\x00unreadable")


def _confirmed(
    record: Record | None, rule: Rule, value: float, now: datetime, config: Config
) -> Record:
    """The record of a label a rule still holds: renewed only once `seen` is getting old."""
    refresh = config.pressure_stale_after * REFRESH_SHARE
    if (
        record is not None
        and record.seen is not None
        and record.since is not None
        and record.rule == rule.name
        and not record.pending
        and now - record.seen < refresh
    ):
        return record
    since = record.since if record is not None and record.since is not None else now
    return Record(rule=rule.name, value=_rounded(value), since=since, seen=now)


def _pending(
    view: NodeView,
    rules: Sequence[Rule],
    seen: Observations,
    evidence: Mapping[str, float],
    now: datetime,
) -> dict[str, datetime]:
    """Since when each rule with a ``for`` has been firing on a node that is not labelled.

    A rule firing now keeps its start (or starts now); a rule with an answer that is not
    firing drops it; a rule without an answer for this node (failed, or no series) keeps it
    unchanged: a gap in the data neither advances nor resets a `for` timer. Rules without a
    ``for`` need no timer (and no write).
    """
    before = view.record.pending if view.record is not None else {}
    pending: dict[str, datetime] = {}
    for rule in rules:
        if not rule.for_:
            continue
        if rule.name in evidence:
            if rule.firing(evidence[rule.name]):
                pending[rule.name] = before.get(rule.name, now)
        elif rule.name in before:
            pending[rule.name] = before[rule.name]
    return pending


def _pending_record(
    view: NodeView,
    rules: Sequence[Rule],
    seen: Observations,
    evidence: Mapping[str, float],
    now: datetime,
) -> Record | None:
    """The record of a node losing its label: the rules firing now start their `for` anew."""
    unlabelled = replace(view, record=None)
    pending = _pending(unlabelled, rules, seen, evidence, now)
    return Record(pending=pending) if pending else None


def _worst(candidates: Sequence[tuple[Rule, float]], prefer: str = "") -> tuple[Rule, float]:
    """The rule furthest past its threshold; the one that already holds the label if it still
    does (so the record does not change hands, and a write, every time two rules swap)."""
    for rule, value in candidates:
        if rule.name == prefer:
            return rule, value
    return max(candidates, key=lambda c: (c[0].severity(c[1]), c[0].name))


def _why_unknown(seen: Observations, evidence: Mapping[str, float]) -> str:
    if seen.failed:
        return "; ".join(f"{rule}: {error}" for rule, error in sorted(seen.failed.items()))
    if not evidence:
        return "no rule has a value for this node"
    return "incomplete answers"


def _rounded(value: float) -> float:
    """Values in records: enough digits to read, not so many that every evaluation differs."""
    if not math.isfinite(value) or value == 0:
        return value
    digits = 4 - math.floor(math.log10(abs(value)))
    return round(value, max(digits, 0))


def stale_limit(record: Record | None, config: Config) -> datetime | None:
    """When a label with this record goes stale without new data."""
    if record is None or record.seen is None:
        return None
    return record.seen + config.pressure_stale_after
