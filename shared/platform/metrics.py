"""Prometheus metrics every function exposes on GET /metrics.

Names follow Prometheus conventions (``_total`` counters, seconds). The families are declared
once here so that dashboards and alerts have one reference; each function fills the ones that
concern it.
"""

from __future__ import annotations

import flask
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

EVENTS = Counter(
    "knr_events_received_total",
    "CloudEvents received, by function, event type and HTTP answer.",
    ["function", "type", "outcome"],
)
LATENCY = Histogram(
    "knr_handler_seconds",
    "Time to handle one event or admission request.",
    ["function"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
FAILURES = Counter(
    "knr_failures_detected_total",
    "Pods classified as failing in a way another node could fix, by reason.",
    ["reason"],
)
DECISIONS = Counter(
    "knr_decisions_total",
    "Plans carried out by update-annotations, by action (move, clear_and_move, exhausted...).",
    ["action"],
)
WEBHOOK = Counter(
    "knr_webhook_admissions_total",
    "Pod admissions answered by the webhook, by result (patched, unchanged, error).",
    ["result"],
)


def response() -> flask.Response:
    return flask.Response(generate_latest(), mimetype=CONTENT_TYPE_LATEST)
