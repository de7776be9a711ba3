"""Trigger filters, evaluated the way Knative's broker filter evaluates them.

Ported in behaviour (not in code) from knative.dev/eventing v0.50 ``pkg/eventfilter``
(``attributes/filter.go`` and ``subscriptionsapi/*.go``) and ``pkg/broker/filter/
filter_handler.go``. The rules, each one tested in ``tests/unit/test_trigger_filters.py``:

- Every filter answers one of three results: PASS, FAIL or NO_FILTER. The broker drops an event
  for a Trigger only on FAIL; NO_FILTER delivers like PASS.
- A Trigger with a non-empty ``spec.filters`` uses those and ignores ``spec.filter``; otherwise
  ``spec.filter.attributes`` applies; with neither, everything is delivered.
- ``spec.filter.attributes``: every listed attribute must be present and equal. An extension
  missing from the event never matches. A filter value of ``""`` means "any value", but the
  attribute must then be present and non-empty.
- ``spec.filters`` is a list ANDed together (``all``); each entry uses exactly one dialect:
  ``exact``, ``prefix``, ``suffix`` (string comparisons, attribute absent fails), ``all``, ``any``,
  ``not`` or ``cesql``. An entry whose map holds an empty name or value, or that names no
  dialect, is dropped (Knative logs "Failed to parse filter. Skipping filter.") rather than
  rejected, so it filters nothing.
- ``all`` fails as soon as one member fails, else answers its last member's result; ``any``
  passes as soon as one member passes, else answers its last member's result; an empty ``all``
  or ``any`` answers NO_FILTER; ``not`` swaps PASS and FAIL and keeps NO_FILTER.
- Core attributes are always "present": an unset ``subject`` reads as ``""``, an unset ``time``
  as Go's zero time. ``time`` is compared in Go's RFC 3339 rendering (nanoseconds, trailing zeros
  dropped, ``Z`` for UTC); ``schemaurl`` reads ``dataschema``; ``datamediatype`` is the media type
  of ``datacontenttype`` without parameters.

CESQL expressions are not evaluated here: a Trigger using one is refused when loaded
(:class:`UnsupportedFilter`), never silently treated as matching.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

# Knative's webhook: "Attribute name must start with a letter and can only contain lowercase
# alphanumeric" (trigger_validation.go, validAttributeName).
ATTRIBUTE_NAME = re.compile(r"^[a-z][a-z0-9]*$")

DIALECTS = ("exact", "prefix", "suffix", "all", "any", "not", "cesql")


class Result(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    NO_FILTER = "no-filter"

    @property
    def delivers(self) -> bool:
        """The broker filter drops an event only when the result is FAIL."""
        return self is not Result.FAIL


class InvalidFilter(ValueError):
    """A filter Knative's admission webhook would reject."""


class UnsupportedFilter(InvalidFilter):
    """A valid filter replay cannot evaluate in-process (CESQL); Knative's filter can."""


_GO_ZERO_TIME = "0001-01-01T00:00:00Z"
_CORE_ATTRIBUTES = frozenset(
    {
        "specversion",
        "type",
        "source",
        "subject",
        "id",
        "time",
        "dataschema",
        "schemaurl",
        "datacontenttype",
        "datamediatype",
        "datacontentencoding",
    }
)


def go_time_text(value: str) -> str:
    """An RFC 3339 timestamp as Go's ``time.Time.MarshalText`` writes it back."""
    if not value:
        return _GO_ZERO_TIME
    match = re.fullmatch(
        r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})", value
    )
    if not match:
        return value
    day, clock, fraction, zone = match.groups()
    fraction = (fraction or "").rstrip("0")
    offset = "Z" if zone in ("Z", "z", "+00:00", "-00:00") else zone
    return f"{day}T{clock}{'.' + fraction if fraction else ''}{offset}"


def lookup(attributes: Mapping[str, str], name: str) -> tuple[str, bool]:
    """An attribute's value as the filters see it, and whether the event has it at all."""
    if name in _CORE_ATTRIBUTES:
        if name == "time":
            return go_time_text(attributes.get("time", "")), True
        if name == "schemaurl":
            return attributes.get("dataschema", ""), True
        if name == "datamediatype":
            return attributes.get("datacontenttype", "").split(";", maxsplit=1)[0].strip(), True
        if name == "datacontentencoding":
            return "", True
        return attributes.get(name, ""), True
    if name in attributes:
        return attributes[name], True
    return "", False


class Filter(Protocol):
    def __call__(self, attributes: Mapping[str, str]) -> Result: ...


@dataclass(frozen=True)
class NoFilter:
    def __call__(self, attributes: Mapping[str, str]) -> Result:
        return Result.NO_FILTER


@dataclass(frozen=True)
class AttributesFilter:
    """``spec.filter.attributes``."""

    attributes: Mapping[str, str]

    def __call__(self, attributes: Mapping[str, str]) -> Result:
        for name, wanted in self.attributes.items():
            value, found = lookup(attributes, name)
            if not found or (wanted == "" and value == ""):
                return Result.FAIL
            if wanted not in ("", value):
                return Result.FAIL
        return Result.PASS


@dataclass(frozen=True)
class CompareFilter:
    """``exact``, ``prefix`` or ``suffix``: every entry must hold."""

    dialect: str
    entries: Mapping[str, str]

    def __call__(self, attributes: Mapping[str, str]) -> Result:
        for name, wanted in self.entries.items():
            value, found = lookup(attributes, name)
            if not found:
                return Result.FAIL
            if self.dialect == "exact":
                ok = value == wanted
            elif self.dialect == "prefix":
                ok = value.startswith(wanted)
            else:
                ok = value.endswith(wanted)
            if not ok:
                return Result.FAIL
        return Result.PASS


@dataclass(frozen=True)
class AllFilter:
    members: tuple[Filter, ...]

    def __call__(self, attributes: Mapping[str, str]) -> Result:
        result = Result.NO_FILTER
        for member in self.members:
            result = member(attributes)
            if result is Result.FAIL:
                return Result.FAIL
        return result


@dataclass(frozen=True)
class AnyFilter:
    members: tuple[Filter, ...]

    def __call__(self, attributes: Mapping[str, str]) -> Result:
        # Knative answers the last member's result when none passes (any_filter.go). It also
        # reorders members by how often they pass, which can change that answer when members
        # mix FAIL and NO_FILTER; here the declared order is kept.
        result = Result.NO_FILTER
        for member in self.members:
            result = member(attributes)
            if result is Result.PASS:
                return Result.PASS
        return result


@dataclass(frozen=True)
class NotFilter:
    member: Filter | None

    def __call__(self, attributes: Mapping[str, str]) -> Result:
        if self.member is None:
            return Result.NO_FILTER
        result = self.member(attributes)
        if result is Result.PASS:
            return Result.FAIL
        if result is Result.FAIL:
            return Result.PASS
        return Result.NO_FILTER


def _all(members: Sequence[Filter]) -> Filter:
    # NewAllFilter / NewAnyFilter hand back a lone member unchanged.
    return members[0] if len(members) == 1 else AllFilter(tuple(members))


def _any(members: Sequence[Filter]) -> Filter:
    return members[0] if len(members) == 1 else AnyFilter(tuple(members))


def _string_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidFilter(f"{where}: expected a map of attribute names to strings")
    out: dict[str, str] = {}
    for name, wanted in value.items():
        if not isinstance(name, str) or not ATTRIBUTE_NAME.match(name):
            raise InvalidFilter(
                f"{where}: invalid attribute name {name!r}: it must start with a letter and "
                "contain only lowercase letters and digits"
            )
        if not isinstance(wanted, str):
            raise InvalidFilter(f"{where}.{name}: the value must be a string, got {wanted!r}")
        out[name] = wanted
    return out


def _filter_list(value: Any, where: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, Mapping) for x in value):
        raise InvalidFilter(f"{where}: expected a list of filter expressions")
    return value


def validate_expression(expression: Mapping[str, Any], where: str) -> None:
    """What Knative's webhook checks on one ``filters`` entry (one dialect, valid names)."""
    unknown = set(expression) - set(DIALECTS)
    if unknown:
        raise InvalidFilter(f"{where}: unknown filter dialect(s) {sorted(unknown)}")
    present = [
        d
        for d in DIALECTS
        if (d == "not" and expression.get(d) is not None)
        or (d == "cesql" and expression.get(d))
        or (d not in ("not", "cesql") and expression.get(d))
    ]
    if len(present) > 1:
        raise InvalidFilter(
            f"{where}: multiple dialects found ({', '.join(present)}), "
            "filters can have only one dialect set"
        )
    for dialect in ("exact", "prefix", "suffix"):
        _string_map(expression.get(dialect), f"{where}.{dialect}")
    for dialect in ("all", "any"):
        for i, member in enumerate(_filter_list(expression.get(dialect), f"{where}.{dialect}")):
            validate_expression(member, f"{where}.{dialect}[{i}]")
    negated = expression.get("not")
    if negated is not None:
        if not isinstance(negated, Mapping):
            raise InvalidFilter(f"{where}.not: expected a filter expression")
        validate_expression(negated, f"{where}.not")
    cesql = expression.get("cesql")
    if cesql:
        raise UnsupportedFilter(
            f"{where}.cesql: CESQL expressions ({cesql!r}) are not evaluated by replay "
            "(Knative's filter evaluates them); use exact/prefix/suffix/all/any/not to replay"
        )


def materialize(expression: Mapping[str, Any], where: str = "filters") -> Filter | None:
    """One ``filters`` entry as a filter, or None when Knative would skip it."""
    for dialect in ("exact", "prefix", "suffix"):
        entries = _string_map(expression.get(dialect), f"{where}.{dialect}")
        if entries:
            if any(not v for v in entries.values()):
                return None  # NewExactFilter & co. refuse empty values; the entry is skipped.
            return CompareFilter(dialect, entries)
    for dialect, combine in (("all", _all), ("any", _any)):
        members = _filter_list(expression.get(dialect), f"{where}.{dialect}")
        if members:
            materialized = _materialize_list(members, f"{where}.{dialect}")
            if not materialized:
                return AllFilter(()) if dialect == "all" else AnyFilter(())
            return combine(materialized)
    negated = expression.get("not")
    if negated is not None:
        return NotFilter(materialize(negated, f"{where}.not"))
    if expression.get("cesql"):
        raise UnsupportedFilter(f"{where}.cesql: CESQL is not evaluated by replay")
    return None


def _materialize_list(expressions: Sequence[Mapping[str, Any]], where: str) -> list[Filter]:
    out: list[Filter] = []
    for i, expression in enumerate(expressions):
        f = materialize(expression, f"{where}[{i}]")
        if f is not None:
            out.append(f)
    return out


def for_trigger(spec: Mapping[str, Any]) -> Filter:
    """The filter a Trigger's spec amounts to (``filters`` first, then ``filter``)."""
    filters = _filter_list(spec.get("filters"), "spec.filters")
    for i, expression in enumerate(filters):
        validate_expression(expression, f"spec.filters[{i}]")
    old = spec.get("filter")
    if old is not None and not isinstance(old, Mapping):
        raise InvalidFilter("spec.filter: expected an object")
    raw_attributes = (old or {}).get("attributes")
    attributes = _string_map(raw_attributes, "spec.filter.attributes")
    if filters:
        materialized = _materialize_list(filters, "spec.filters")
        if not materialized:
            return AllFilter(())
        return _all(materialized)
    if raw_attributes is not None:
        return AttributesFilter(attributes)
    return NoFilter()


def parse_time(value: str) -> datetime:
    """An RFC 3339 timestamp (the CloudEvents ``time`` attribute), or ValueError."""
    if not re.fullmatch(
        r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})", value
    ):
        raise ValueError(f"not an RFC 3339 timestamp: {value!r}")
    head, _, rest = value.partition(".")
    if rest:
        digits = re.match(r"\d+", rest)
        assert digits is not None
        zone = rest[digits.end() :]
        value = f"{head}.{digits.group()[:6]}{zone}"
    return datetime.fromisoformat(value.replace("z", "Z"))
