"""``make archive``: the functions' logs, as ``kubectl logs -l`` prints them, become one archive."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from dev.stack.stack import read_archive
from kubectl_kn_rescheduler import archive, replay
from shared.api.keys import APISERVER_UPDATE, EVENT_POD_FAILING
from shared.platform import logs
from tests.unit import pods

POD = pods.pod(containers=[pods.crash_looping(restarts=4)])
API = "https://10.1.255.1:6443"
DETECT = "/kn-rescheduler/detect-failures"


def cloudevent(event_id: str, source: str, event_type: str, data: Any) -> dict[str, Any]:
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": source,
        "type": event_type,
        "subject": "/apis/v1/namespaces/shop/pods/web-7d9c8b6f4-x2x9z",
        "datacontenttype": "application/json",
        "data": data,
    }


def handled(function: str, time: str, event: dict[str, Any]) -> str:
    """A function's "event handled" line, shaped as shared/platform/events.py logs it."""
    return json.dumps(
        {
            "time": time,
            "level": "info",
            "function": function,
            "logger": "kn-rescheduler.events",
            "msg": "event handled",
            "version": "v1",
            "ce_id": event["id"],
            "status": 200,
            "cloudevent": logs.redact(event),
        }
    )


UPDATE = cloudevent("u-1", API, APISERVER_UPDATE, POD)
FAILING = cloudevent("f-1", DETECT, EVENT_POD_FAILING, {"pod": "web-7d9c8b6f4-x2x9z"})
LATER_UPDATE = cloudevent("u-2", API, APISERVER_UPDATE, POD)

# `kubectl logs -l ...` prints one pod's lines after the other's, not interleaved by time.
LOGS = [
    '{"time":"2026-11-27T10:00:00.000+00:00","level":"info","msg":"configuration"}',
    handled("detect-failures", "2026-11-27T10:00:01.000+00:00", UPDATE),
    handled("detect-failures", "2026-11-27T10:00:09.000+00:00", LATER_UPDATE),
    "[2026-11-27 10:00:00 +0000] [1] [INFO] Starting gunicorn 23.0.0",
    handled("update-annotations", "2026-11-27T10:00:02.000+00:00", FAILING),
    # The same pod update, acted on by assess-nodes as well (two Triggers matched it).
    handled("assess-nodes", "2026-11-27T10:00:01.500+00:00", UPDATE),
]


def test_each_event_is_kept_once_in_the_order_the_functions_received_them() -> None:
    collected = archive.collect(LOGS)
    assert [r.event.id for r in collected.events] == ["u-1", "f-1", "u-2"]
    assert collected.duplicates == 1
    assert collected.not_events == 2


def test_the_earliest_record_of_an_event_is_the_one_kept() -> None:
    (first, *_) = archive.collect(LOGS).events
    assert first.time is not None and first.time.isoformat() == "2026-11-27T10:00:01+00:00"


def test_the_same_id_from_another_source_is_another_event() -> None:
    other = cloudevent("u-1", "https://other-cluster:6443", APISERVER_UPDATE, POD)
    lines = [LOGS[1], handled("detect-failures", "2026-11-27T10:00:03.000+00:00", other)]
    assert len(archive.collect(lines).events) == 2


def test_the_archive_reads_back_as_the_same_events_at_the_same_times() -> None:
    collected = archive.collect(LOGS)
    again, skipped = replay.read(collected.lines())
    assert skipped == 0
    assert [(r.event, r.time) for r in again] == [(r.event, r.time) for r in collected.events]


def test_an_archive_is_its_own_archive() -> None:
    once = archive.collect(LOGS).lines()
    assert archive.collect(once).lines() == once


def test_the_command_writes_the_archive_and_says_what_it_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logged = tmp_path / "functions.log"
    logged.write_text("\n".join(LOGS) + "\n")
    out = io.StringIO()
    assert archive.main([str(logged)], out=out) == 0
    assert [json.loads(line)["id"] for line in out.getvalue().splitlines()] == ["u-1", "f-1", "u-2"]
    said = capsys.readouterr().err
    assert "3 event(s); 1 logged again by another function, 2 line(s) without an event" in said


def test_a_stacks_archive_read_while_a_long_line_is_half_written_gives_the_complete_events(
    tmp_path: Path,
) -> None:
    # The local Broker's receiver appends each event as one line, but a pod event longer than
    # the file buffer reaches the file in two writes: a test reading in between saw half a line
    # (JSONDecodeError in a full-suite run).
    path = tmp_path / "archive.jsonl"
    first = {"id": "1", "data": pods.pod()}
    second = json.dumps({"id": "2", "data": pods.pod()}, separators=(",", ":"))
    half = len(second) // 2
    path.write_text(json.dumps(first) + "\n" + second[:half])
    assert [e["id"] for e in read_archive(path)] == ["1"]
    with path.open("a") as f:
        f.write(second[half:] + "\n")
    assert [e["id"] for e in read_archive(path)] == ["1", "2"]
    assert read_archive(tmp_path / "none.jsonl") == []
