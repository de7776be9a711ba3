"""The pressure rules: PromQL expressions, one value per node, and when a value means pressure.

A rule file is YAML, in the spirit of dynamicScheduler's rule.yaml (a name, a PromQL query, a
threshold), with what the seed lacked: a clear threshold and a ``for`` duration, so that a value
oscillating around the threshold does not flap the label, and a direction, so that a rule can
fire on a value that is too low (memory left) as well as too high (usage)::

    rules:
      - name: memory-usage       # letters, digits, '-', '_' and '.'; unique
        expr: 100 * (1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes)
        threshold: 70            # a number, or a quantity such as 512Mi
        clear: 60                # optional, default: the threshold (no hysteresis)
        for: 1m                  # optional, default 0: over the threshold this long first
        fires: above             # optional, default above; below for "too little left"

The seed's own shape (``Rulename: {NAME: {Promsql: ..., Threshold: ...}}``) is read too, as
rules that fire above their threshold, so an existing rule.yaml keeps working.

A file we cannot use stops the function at start-up with a `RulesError` naming the rule and the
field, like a bad setting (shared.platform.config): a labeller running on rules other than the
ones its operator wrote would label the wrong nodes, or none, silently.

Each expression must yield one value per node, and the series must say which node: see
shared.platform.prometheus for how a series is matched to a Node (the ``node`` label, else the
``instance`` label's host as the Node's name or InternalIP).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

import yaml

from shared.api.times import format_duration, parse_duration
from shared.platform.config import ConfigError

# Kubernetes' binary and decimal quantity suffixes, for thresholds in bytes (memory left).
_QUANTITY_SUFFIXES: Final[Mapping[str, int]] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}
_QUANTITY: Final = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_FIELDS: Final = frozenset({"name", "expr", "threshold", "clear", "for", "fires"})


class RulesError(ConfigError):
    """A rule file we cannot use; the message names the file, the rule and the field."""


class Fires(StrEnum):
    """Which side of the threshold is pressure."""

    ABOVE = "above"
    BELOW = "below"


@dataclass(frozen=True)
class Rule:
    name: str
    expr: str
    threshold: float
    # The value must come back past this (the other side from `fires`) to clear the label.
    clear: float
    # The value must stay past the threshold this long before the node is labelled.
    for_: timedelta = timedelta(0)
    fires: Fires = Fires.ABOVE

    def firing(self, value: float) -> bool:
        """Past the threshold: reason to label the node."""
        return value > self.threshold if self.fires is Fires.ABOVE else value < self.threshold

    def holding(self, value: float) -> bool:
        """Not yet back past the clear threshold: reason to keep a label already there."""
        return value > self.clear if self.fires is Fires.ABOVE else value < self.clear

    def worst(self, values: Iterable[float]) -> float:
        """Of several series for one node (two scrape jobs, say), the one nearest pressure."""
        return max(values) if self.fires is Fires.ABOVE else min(values)

    def severity(self, value: float) -> float:
        """How far past the threshold, relative to it, so that rules in different units
        (percent, bytes) can be compared when only the worst nodes may be labelled. Negative
        when the value is not past the threshold (a label kept by hysteresis ranks last)."""
        past = value - self.threshold if self.fires is Fires.ABOVE else self.threshold - value
        return past / abs(self.threshold) if self.threshold else past

    def describe(self) -> str:
        sign = ">" if self.fires is Fires.ABOVE else "<"
        text = f"{self.name}: {sign} {self.threshold:g}"
        if self.clear != self.threshold:
            text += f" (clears at {self.clear:g})"
        if self.for_:
            text += f" for {format_duration(self.for_)}"
        return text


# --- the built-in rules -------------------------------------------------------------------------
# All three read node-exporter's metrics only, and group by (node, instance) so the series keep
# whichever label says which node they are (see shared.platform.prometheus).

# CPU in use, percent: 100 minus the node's idle CPU time over all its CPU time, both over the
# last two minutes (the seed's ratio, over two minutes so that a 60 s scrape interval still gives
# two samples). Not idle time over the window's length: rate() divides what it extrapolates by
# the whole window, so a series younger than the window reads as less idle than it is. A node
# at 10 % whose series began 30 s ago (a node just added, a Prometheus that lost its data)
# would read 72 %, over the threshold, at a 15 s scrape interval (tests/unit/
# test_pressure_rules.py, on Prometheus' own engine). Both sides of the ratio are short by the
# same factor, so it holds from the second sample on.
CPU_USAGE: Final = Rule(
    name="cpu-usage",
    expr=(
        '100 * (1 - sum by (node, instance) (rate(node_cpu_seconds_total{mode="idle"}[2m]))'
        " / sum by (node, instance) (rate(node_cpu_seconds_total[2m])))"
    ),
    threshold=70,
    clear=60,
)
# Memory in use, percent, as the seed computes it: what the kernel does not count as available.
MEMORY_USAGE: Final = Rule(
    name="memory-usage",
    expr="100 * (1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes)",
    threshold=70,
    clear=65,
)
# The kubelet's memory.available eviction signal, in bytes: capacity minus the working set,
# where the working set is the root cgroup's usage minus its inactive file pages
# (kubernetes.io's memory-available.sh). From node-exporter that is MemFree + Inactive(file):
# the root cgroup's usage is everything not free. Where those two series are not exported the
# expression falls back (`or`) to MemAvailable, the kernel's estimate, which also counts
# reclaimable caches as available and so reads a little higher. It fires below 512 MiB, well
# before the kubelet's default hard eviction threshold (memory.available<100Mi): pods are
# steered away while there is still room to avoid evicting them.
MEMORY_AVAILABLE: Final = Rule(
    name="memory-available",
    expr=(
        "(node_memory_MemFree_bytes + node_memory_Inactive_file_bytes)"
        " or node_memory_MemAvailable_bytes"
    ),
    threshold=512 * 2**20,
    clear=768 * 2**20,
    fires=Fires.BELOW,
)
DEFAULT_RULES: Final = (CPU_USAGE, MEMORY_USAGE, MEMORY_AVAILABLE)


# --- reading a rule file ------------------------------------------------------------------------


def load_rules(path: str | Path | None) -> tuple[Rule, ...]:
    """The rules in the file at ``path``; the built-in rules when no file is named."""
    if not path:
        return DEFAULT_RULES
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise RulesError(f"pressure rules {file}", f"cannot read it: {err.strerror}") from err
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RulesError(f"pressure rules {file.name}", f"not valid YAML: {err}") from err
    return parse_rules(document, file.name)


def parse_rules(document: object, source: str = "pressure rules") -> tuple[Rule, ...]:
    """Validate a parsed rule file; ``source`` names it in errors."""
    where = f"pressure rules {source}"
    if not isinstance(document, dict):
        raise RulesError(where, "expected a mapping with a list of `rules`")
    if "rules" in document:
        unknown = sorted(str(key) for key in document if key != "rules")
        if unknown:
            raise RulesError(where, f"unknown key(s) {', '.join(unknown)}; expected `rules`")
        entries = document["rules"]
        if not isinstance(entries, list):
            raise RulesError(f"{where}: rules", "expected a list of rules")
        rules = [_rule(entry, index, where) for index, entry in enumerate(entries)]
    elif "Rulename" in document:
        rules = _seed_rules(document["Rulename"], where)
    else:
        raise RulesError(where, "expected a list of `rules` (or the seed's `Rulename` mapping)")
    if not rules:
        raise RulesError(where, "no rules: with none, no node would ever be labelled")
    seen: set[str] = set()
    for rule in rules:
        if rule.name in seen:
            raise RulesError(f"{where}: rule {rule.name!r}", "the name is used twice")
        seen.add(rule.name)
    return tuple(rules)


def _rule(entry: object, index: int, where: str) -> Rule:
    if not isinstance(entry, dict):
        raise RulesError(f"{where}: rule #{index + 1}", "expected a mapping of fields")
    raw_name = entry.get("name")
    if not isinstance(raw_name, str) or not _NAME.match(raw_name):
        raise RulesError(
            f"{where}: rule #{index + 1}, field name",
            f"expected a name of letters, digits, '-', '_' or '.' (at most 63), got {raw_name!r}",
        )
    at = f"{where}: rule {raw_name!r}"
    unknown = sorted(str(key) for key in entry if key not in _FIELDS)
    if unknown:
        raise RulesError(
            at, f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_FIELDS))}"
        )
    expr = entry.get("expr")
    if not isinstance(expr, str) or not expr.strip():
        raise RulesError(f"{at}, field expr", f"expected a PromQL expression, got {expr!r}")
    if "threshold" not in entry:
        raise RulesError(f"{at}, field threshold", "missing: when is a node under pressure?")
    threshold = _number(entry["threshold"], f"{at}, field threshold")
    fires_raw = entry.get("fires", Fires.ABOVE.value)
    try:
        fires = Fires(fires_raw)
    except ValueError:
        raise RulesError(
            f"{at}, field fires", f"expected above or below, got {fires_raw!r}"
        ) from None
    clear = _number(entry["clear"], f"{at}, field clear") if "clear" in entry else threshold
    if (fires is Fires.ABOVE and clear > threshold) or (fires is Fires.BELOW and clear < threshold):
        side = "at or below" if fires is Fires.ABOVE else "at or above"
        raise RulesError(
            f"{at}, field clear",
            f"a rule that fires {fires.value} its threshold ({threshold:g}) clears {side} it, "
            f"got {clear:g}",
        )
    for_ = timedelta(0)
    if "for" in entry:
        raw_for = entry["for"]
        if not isinstance(raw_for, str):
            raise RulesError(
                f"{at}, field for", f"expected a duration such as 30s or 2m, got {raw_for!r}"
            )
        try:
            for_ = parse_duration(raw_for.strip())
        except ValueError as err:
            raise RulesError(f"{at}, field for", str(err)) from None
    return Rule(raw_name, expr.strip(), threshold, clear, for_, fires)


def _seed_rules(mapping: object, where: str) -> list[Rule]:
    """dynamicScheduler's rule.yaml: ``Rulename: {NAME: {Promsql: ..., Threshold: ...}}``."""
    if not isinstance(mapping, dict):
        raise RulesError(f"{where}: Rulename", "expected a mapping of rule names")
    rules = []
    for index, (name, body) in enumerate(mapping.items()):
        if not isinstance(body, dict):
            raise RulesError(f"{where}: rule {name!r}", "expected Promsql and Threshold")
        entry: dict[str, Any] = {"name": name}
        for seed_key, key in (("Promsql", "expr"), ("Threshold", "threshold")):
            if seed_key in body:
                entry[key] = body[seed_key]
        rules.append(_rule(entry, index, where))
    return rules


def _number(raw: object, where: str) -> float:
    value: float | None = None
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str):
        matched = _QUANTITY.match(raw.strip())
        if matched:
            value = float(matched.group(1)) * _QUANTITY_SUFFIXES.get(matched.group(2) or "", 1)
    if value is None or not math.isfinite(value):
        raise RulesError(
            where, f"expected a number such as 70 or a quantity such as 512Mi, got {raw!r}"
        )
    return value
