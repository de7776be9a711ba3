"""What live clusters carry must read the same and be written back the same.

``fixtures/wire_formats.json`` holds records exactly as the release before the records moved
into ``shared.api`` wrote them (its ``source`` names the commit and the functions), and what
that release's readers made of them. Each is read with today's parser and written back with
today's writer: the values must be the ones the old reader saw, and the text the same bytes.
Every record round-trips byte for byte; the older versions a parser still accepts are written
back in the current version, and must give what the old code wrote back.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.api import nodehealth, records
from shared.api.nodehealth import MAX_FAILURES, MAX_RECORD_BYTES, NodeHealth, Seen
from shared.api.pressure import Record
from shared.api.rebalance import Streak
from shared.api.records import RecordError
from shared.api.state import StateError, WorkloadState, dump_state, load_state
from shared.api.usage import UsageError, UsageRecord

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "wire_formats.json").read_text())


def _dump_state(record: object) -> str:
    assert isinstance(record, WorkloadState)
    return dump_state(record)


def _dump(record: object) -> str:
    assert isinstance(record, NodeHealth | Record | UsageRecord | Streak)
    return record.to_json()


READERS: Mapping[str, tuple[Callable[[str], object], Callable[[object], str]]] = {
    "state": (load_state, _dump_state),
    "nodehealth": (nodehealth.load, _dump),
    "pressure": (Record.from_json, _dump),
    "usage": (UsageRecord.from_json, _dump),
    "rebalance": (Streak.from_json, _dump),
}


def plain(value: Any) -> Any:
    """A record's values as JSON types, the way the fixtures hold what the old reader saw."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


ENTRIES = [pytest.param(entry, id=entry["name"]) for entry in FIXTURES["records"]]


def test_the_fixtures_say_which_commit_and_functions_wrote_them() -> None:
    source = FIXTURES["source"]
    assert len(source["commit"]) == 40
    assert {entry["record"] for entry in FIXTURES["records"]} == set(READERS)
    assert all(entry["writer"] in source["writers"] for entry in FIXTURES["records"])


def added_since(value: Any, then: Any) -> list[str]:
    """The top-level fields a record's dataclass gained since the fixtures were taken (absent
    from what the old reader made), each holding its default: what the old record did not say
    must not be made to say something. AssertionError for one that holds something else."""
    if not (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        return []
    if not isinstance(then, dict):
        return []
    added = []
    for f in dataclasses.fields(value):
        if f.name in then:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert getattr(value, f.name) == default, f"{f.name}: an old record gained a value"
        added.append(f.name)
    return added


def as_then(value: Any, then: Any) -> Any:
    """``plain(value)`` without the fields added since (added_since checks their defaults)."""
    out = plain(value)
    for name in added_since(value, then):
        del out[name]
    return out


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_record_the_previous_release_wrote_reads_as_it_did_then(entry: dict[str, Any]) -> None:
    read, _ = READERS[entry["record"]]
    assert as_then(read(entry["text"]), entry["parsed"]) == entry["parsed"]


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_record_read_and_written_back_is_the_same_bytes_the_previous_release_wrote(
    entry: dict[str, Any],
) -> None:
    read, write = READERS[entry["record"]]
    expected = entry["rewritten"] if entry.get("older") else entry["text"]
    assert write(read(entry["text"])) == expected


@pytest.mark.parametrize(
    ("read", "text"),
    [
        pytest.param(load_state, '{"v":2,"moves":1}', id="state under v"),
        pytest.param(nodehealth.load, '{"v":1,"failures":[]}', id="node health under v"),
        pytest.param(Record.from_json, '{"version":1,"rule":"cpu"}', id="pressure under version"),
        pytest.param(
            UsageRecord.from_json,
            '{"version":1,"sampledAt":"2026-11-20T09:50:00Z","cpu":{"now":1},"memory":{"now":1}}',
            id="usage under version",
        ),
    ],
)
def test_a_record_with_its_version_under_the_other_key_is_refused(
    read: Callable[[str], object], text: str
) -> None:
    with pytest.raises(RecordError):
        read(text)


def test_a_streak_with_its_version_under_the_other_key_counts_as_none() -> None:
    assert Streak.from_json('{"version":2,"hot":3}') == Streak()


# What people have learnt to read in logs, Events and the extender's answers, word for word as
# the previous release said it.
MESSAGES = [
    (load_state, "[1", "state annotation is not valid JSON: "),
    (load_state, "[1]", "state annotation must be a JSON object"),
    (load_state, '{"version":"2"}', "state annotation has no integer version"),
    (
        load_state,
        '{"version":3}',
        "state version 3 is not supported (this release reads 1, 2)",
    ),
    (nodehealth.load, "{", "the node-health record is not JSON: "),
    (nodehealth.load, '{"version":2}', "not a version 1 node-health record"),
    (nodehealth.load, "[]", "not a version 1 node-health record"),
    (
        nodehealth.load,
        " " * (MAX_RECORD_BYTES + 1),
        f"the node-health record is {MAX_RECORD_BYTES + 1} bytes, over {MAX_RECORD_BYTES}",
    ),
    (Record.from_json, "{", "not JSON: "),
    (Record.from_json, '{"v":2}', "not a version 1 pressure record"),
    (Record.from_json, '{"v":1,"pending":["cpu"]}', "unreadable pressure record: "),
    (UsageRecord.from_json, "nope", "not JSON: "),
    (UsageRecord.from_json, '{"v":2}', "not a version 1 usage record"),
    (UsageRecord.from_json, '{"v":1}', "unreadable usage record: "),
]


@pytest.mark.parametrize(
    ("read", "text", "message"), [pytest.param(*m, id=m[2].strip(": ")) for m in MESSAGES]
)
def test_an_unreadable_record_is_refused_in_the_words_it_always_was(
    read: Callable[[str], object], text: str, message: str
) -> None:
    with pytest.raises(RecordError) as refused:
        read(text)
    said = str(refused.value)
    assert said == message if not message.endswith(": ") else said.startswith(message)


def test_the_state_and_usage_errors_are_record_errors_their_callers_still_catch_by_name() -> None:
    with pytest.raises(StateError):
        load_state("{")
    with pytest.raises(UsageError):
        UsageRecord.from_json("{")
    assert issubclass(StateError, RecordError) and issubclass(UsageError, RecordError)
    assert issubclass(RecordError, ValueError)


def test_a_state_over_its_cap_is_still_read_and_written_since_clearing_may_write_one() -> None:
    # plan writes a state over MAX_STATE_BYTES only to clear exclusions; it must read back.
    state = WorkloadState(moves=1, handled=tuple(f"{n:064d}" for n in range(1200)))
    assert load_state(dump_state(state)) == state


def test_a_node_health_record_too_large_for_its_cap_drops_its_oldest_failures_when_written() -> (
    None
):
    # The reasons and names come from events; at the previous release, 32 long ones made a
    # record its own reader refused, and every later event about the node went to the
    # dead-letter sink. Refusing the write would fail every later event the same way.
    at = datetime(2026, 11, 20, tzinfo=UTC)
    failures = tuple(
        Seen(at + timedelta(seconds=n), f"Deployment shop/web-{n}", f"uid-{n}", "x" * 600)
        for n in range(MAX_FAILURES)
    )
    written = NodeHealth(failures, suspect_since=at).to_json()
    read = nodehealth.load(written)
    assert len(written.encode()) <= MAX_RECORD_BYTES
    assert 0 < len(read.failures) < MAX_FAILURES
    assert read.failures == failures[-len(read.failures) :]
    assert read.suspect_since == at


def test_the_helper_writes_the_version_first_or_sorted_and_compact() -> None:
    fmt = records.Format(name="test record", version_key="v", version=3)
    assert records.dump({"b": 1, "a": [1, 2]}, fmt) == '{"v":3,"b":1,"a":[1,2]}'
    sorted_fmt = dataclasses.replace(fmt, version_key="version", sort_keys=True)
    assert records.dump({"z": 1, "a": 2}, sorted_fmt) == '{"a":2,"version":3,"z":1}'
    assert records.load('{"v":3,"b":1}', fmt) == (3, {"v": 3, "b": 1})


def test_the_helper_refuses_a_version_that_is_not_an_integer() -> None:
    fmt = records.Format(name="test record", version_key="v", version=1)
    for text in ('{"v":true}', '{"v":1.0}', '{"v":"1"}', "{}"):
        with pytest.raises(RecordError, match="not a version 1 test record"):
            records.load(text, fmt)


def test_the_helper_caps_what_it_reads_and_writes_in_bytes() -> None:
    fmt = records.Format(name="test record", version_key="v", version=1, max_bytes=16)
    assert records.dump({"a": "12"}, fmt) == '{"v":1,"a":"12"}'
    with pytest.raises(RecordError, match="the test record is 17 bytes, over 16"):
        records.dump({"a": "123"}, fmt)
    # Sixteen characters, eighteen bytes: the API server counts bytes.
    with pytest.raises(RecordError, match="the test record is 18 bytes, over 16"):
        records.load('{"v":1,"a":"éé"}', fmt)
