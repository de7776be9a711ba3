"""What the scale measurement reads of the API server's own metrics: the webhook's calls and
each function's requests.

The fixtures are the API server's /metrics as recorded (their headers say where from).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.bench.common import api_requests, delta, parse_metrics, webhook_calls

FIXTURES = Path(__file__).parents[1] / "fixtures" / "apiserver-metrics"
FIXTURE = FIXTURES / "webhook-during-rollout.txt"
PER_SCHEMA = FIXTURES / "requests-per-flow-schema.txt"


def recorded() -> str:
    return FIXTURE.read_text()


def test_the_webhooks_calls_are_read_as_the_api_server_timed_them() -> None:
    calls = webhook_calls(parse_metrics(recorded()))
    # 1,969 creates; 509 answered within 100 ms, all of them within 500 ms; one failed open.
    assert calls == {"calls": 1969, "failed_open": 1, "p50_s_at_most": 0.5, "p99_s_at_most": 0.5}


def test_the_requests_are_still_counted() -> None:
    assert parse_metrics(recorded())["total"] > 0


def test_another_webhook_is_not_ours() -> None:
    other = recorded().replace('name="pods.kn-rescheduler.io"', 'name="pods.example.com"')
    assert webhook_calls(parse_metrics(other)) == {
        "calls": 0,
        "failed_open": 0,
        "p50_s_at_most": None,
        "p99_s_at_most": None,
    }


def test_a_window_counts_only_the_calls_made_in_it() -> None:
    before = parse_metrics(recorded())
    after = dict(before)
    # 100 more calls: 98 within 25 ms, 2 past the last bound (25 s), both failed open.
    for bound in ("0.025", "0.1", "0.5", "1", "2.5", "10", "25"):
        after[f"webhook_le:{bound}"] += 98
    after["webhook_le:+Inf"] += 100
    after["webhook_fail_open"] += 2
    window = webhook_calls(delta(before, after))
    assert window == {"calls": 100, "failed_open": 2, "p50_s_at_most": 0.025, "p99_s_at_most": None}


@pytest.mark.parametrize(
    ("schema", "requests"),
    [
        # A function's own identity and FlowSchema: its 80 lists, each within 5 ms.
        ("bench-fn-detect-failures", 80),
        # The controller-manager's 60 watches took up to 20 ms to start: not requests with a
        # latency (counted, there would be 198 and p99 would be 20 ms).
        ("kube-controller-manager", 138),
    ],
)
def test_a_schemas_requests_are_read_without_its_watches(schema: str, requests: int) -> None:
    counters = parse_metrics(PER_SCHEMA.read_text())
    assert api_requests(counters, schema) == {
        "requests": requests,
        "p50_s_at_most": 0.005,
        "p99_s_at_most": 0.005,
    }


def test_a_function_that_made_no_request_in_a_window_has_no_latency() -> None:
    counters = parse_metrics(PER_SCHEMA.read_text())
    assert api_requests(delta(counters, counters), "bench-fn-detect-failures") == {
        "requests": 0,
        "p50_s_at_most": None,
        "p99_s_at_most": None,
    }
    assert api_requests(counters, "bench-fn-rebalance-nodes")["requests"] == 0
