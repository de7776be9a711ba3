"""The replay tool reads archives and logs, selects, and routes events like the Broker."""

from __future__ import annotations

import io
import json
from pathlib import Path

from kubectl_kn_rescheduler import replay
from shared.api.keys import APISERVER_UPDATE, EVENT_POD_FAILING
from tests.unit import pods

POD = pods.pod(containers=[pods.crash_looping(restarts=4)])


def archived(event_type: str, data: object, event_id: str, time: str) -> str:
    return json.dumps(
        {
            "specversion": "1.0",
            "id": event_id,
            "source": "https://127.0.0.1:6443",
            "type": event_type,
            "subject": "/apis/v1/namespaces/shop/pods/web-7d9c8b6f4-x2x9z",
            "kind": "Pod",
            "time": time,
            "datacontenttype": "application/json",
            "data": data,
        }
    )


def test_archive_lines_and_function_log_lines_both_yield_events() -> None:
    log_line = json.dumps(
        {
            "level": "info",
            "msg": "event received",
            "time": "2026-11-23T04:00:02+00:00",
            "cloudevent": json.loads(archived(APISERVER_UPDATE, POD, "b", "x")),
        }
    )
    lines = [
        archived(APISERVER_UPDATE, POD, "a", "2026-11-23T04:00:01Z"),
        "[2026-11-23 04:00:01 +0000] [7] [INFO] Booting worker with pid: 7",
        log_line,
        '{"level": "info", "msg": "configuration"}',
    ]
    items, skipped = replay.read(lines)
    assert [i.event.id for i in items] == ["a", "b"]
    assert skipped == 2
    assert items[1].time is not None and items[1].time.second == 2


def test_selection_by_type_subject_id_and_time_window() -> None:
    items, _ = replay.read(
        [
            archived(APISERVER_UPDATE, POD, "a", "2026-11-23T04:00:01Z"),
            archived(EVENT_POD_FAILING, {}, "b", "2026-11-23T04:00:05Z"),
        ]
    )
    by_type = replay.Selection(types=[EVENT_POD_FAILING])
    assert [i.event.id for i in items if by_type(i)] == ["b"]
    window = replay.Selection(since=replay._parse_time("2026-11-23T04:00:02Z"))
    assert [i.event.id for i in items if window(i)] == ["b"]
    assert [i.event.id for i in items if replay.Selection(ids=["a"])(i)] == ["a"]
    assert [i.event.id for i in items if replay.Selection(subjects=["x2x9z"])(i)] == ["a", "b"]


def test_in_process_replay_routes_by_the_triggers_and_prints_a_trace(tmp_path: Path) -> None:
    archive = tmp_path / "archive.jsonl"
    archive.write_text(
        archived(APISERVER_UPDATE, POD, "a", "2026-11-23T04:00:01Z")
        + "\n"
        + archived(APISERVER_UPDATE, pods.pod(), "b", "2026-11-23T04:00:02Z")
        + "\n"
    )
    out = io.StringIO()
    status = replay.main([str(archive), "--json"], out=out)
    assert status == 0
    outcomes = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(o["id"], o["function"], o["status"]) for o in outcomes] == [
        ("a", "detect-failures", 200),
        ("b", "detect-failures", 202),
    ]
    assert outcomes[0]["reply"]["type"] == EVENT_POD_FAILING
    assert "CrashLoopBackOff on node-b" in outcomes[0]["decision"][0]


def test_an_event_that_fails_makes_the_exit_status_non_zero(tmp_path: Path) -> None:
    archive = tmp_path / "archive.jsonl"
    archive.write_text(archived(APISERVER_UPDATE, ["not", "a", "pod"], "a", "x") + "\n")
    out = io.StringIO()
    assert replay.main([str(archive)], out=out) == 1
    assert "HTTP 400" in out.getvalue()
    assert "1 failed" in out.getvalue()
