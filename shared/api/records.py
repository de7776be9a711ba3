"""How every versioned JSON record we keep on a Kubernetes object is read and written.

Functions are stateless, so what they must remember lives on the objects themselves, as JSON in
an annotation: a workload's state, a Node's health, pressure, usage and hot streak. Each record
has its own fields and its own rules (``shared.api.state``, ``nodehealth``, ``pressure``,
``usage``, ``rebalance``); what they share is here, once: a size cap, the version check and a
compact, deterministic rendering.

The version key is a parameter, not a convention: live objects carry ``"version"`` on some
records and ``"v"`` on others, and must keep doing so. So are the words of the errors: they
reach logs, Events and the extender's answers, where people have learnt to read them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class RecordError(ValueError):
    """An annotation holds something that is not a record we can read (or a record we would
    write could not be read back)."""


@dataclass(frozen=True)
class Format:
    """One record's wire format: the versions it reads, the one it writes, its cap, its words.

    The messages are ``str.format`` templates and may use ``{name}``, ``{version}`` (the version
    written), ``{found}`` (the version found), ``{readable}`` (the versions read, ``1, 2``),
    ``{error}`` (the JSON parser's complaint), ``{size}`` and ``{limit}`` (bytes).
    """

    # How messages name the record: "pressure record".
    name: str
    # The key the version is written under: "version" or "v".
    version_key: str
    # The version ``dump`` writes.
    version: int
    # Every version ``load`` reads; the written one when empty.
    readable: frozenset[int] = frozenset()
    # The most bytes of UTF-8 the record may take, read or written; None for no cap of its own
    # (the API server refuses an object whose annotations add up to more than 256 KiB).
    max_bytes: int | None = None
    # Keys sorted (the same record always gives the same text), or in the order given.
    sort_keys: bool = False
    # The error raised: RecordError, or a record's own subclass of it that callers catch.
    raises: type[RecordError] = RecordError
    too_large: str = "the {name} is {size} bytes, over {limit}"
    not_json: str = "not JSON: {error}"
    not_object: str = "not a version {version} {name}"
    no_version: str = "not a version {version} {name}"
    unknown_version: str = "not a version {version} {name}"

    @property
    def versions(self) -> frozenset[int]:
        return self.readable or frozenset({self.version})

    def error(self, template: str, **details: object) -> RecordError:
        readable = ", ".join(str(v) for v in sorted(self.versions))
        return self.raises(
            template.format(name=self.name, version=self.version, readable=readable, **details)
        )


def load(text: str, fmt: Format) -> tuple[int, dict[str, Any]]:
    """The version and the JSON object of a record; RecordError when it is over the cap, not
    JSON, not an object, or of a version this release does not read (a newer release's record,
    acted on, could undo its bookkeeping)."""
    _check_size(text, fmt)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        # RecursionError: a few thousand nested brackets, which only a forged object carries.
        raise fmt.error(fmt.not_json, error=err) from err
    if not isinstance(data, dict):
        raise fmt.error(fmt.not_object)
    found = data.get(fmt.version_key)
    if type(found) is not int:
        raise fmt.error(fmt.no_version, found=found)
    if found not in fmt.versions:
        raise fmt.error(fmt.unknown_version, found=found)
    return found, data


def dump(fields: Mapping[str, Any], fmt: Format) -> str:
    """The record as compact JSON, the version first (or in its sorted place); RecordError when
    it is over the cap, since the reader would refuse it."""
    out = {fmt.version_key: fmt.version, **fields}
    text = json.dumps(out, separators=(",", ":"), sort_keys=fmt.sort_keys)
    _check_size(text, fmt)
    return text


def _check_size(text: str, fmt: Format) -> None:
    if fmt.max_bytes is None:
        return
    # Bytes, as the API server counts them; our writers escape everything to ASCII, so only a
    # hand edit makes them differ from characters.
    size = len(text.encode())
    if size > fmt.max_bytes:
        raise fmt.error(fmt.too_large, size=size, limit=fmt.max_bytes)
