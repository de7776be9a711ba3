"""Trigger filter rules as replay evaluates them, each row tied to the Knative source it encodes.

References are to knative.dev/eventing v0.50.0:
  [attr]    pkg/eventfilter/attributes/filter.go        (spec.filter.attributes, LookupAttribute)
  [exact]   pkg/eventfilter/subscriptionsapi/exact_filter.go   (and prefix_/suffix_filter.go)
  [all]     pkg/eventfilter/subscriptionsapi/all_filter.go
  [any]     pkg/eventfilter/subscriptionsapi/any_filter.go
  [not]     pkg/eventfilter/subscriptionsapi/not_filter.go
  [create]  pkg/eventfilter/subscriptionsapi/create.go   (materializing, skipping bad entries)
  [handler] pkg/broker/filter/filter_handler.go          (filters before filter; only FAIL drops)
  [webhook] pkg/apis/eventing/v1/trigger_validation.go   (names, one dialect per entry)
  [retries] pkg/kncloudevents/retries.go + go-retryablehttp Client.Do (0-based attempt number)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubectl_kn_rescheduler.routing import filters, triggers
from kubectl_kn_rescheduler.routing.filters import Result

ROOT = Path(__file__).resolve().parents[2]

POD_ADD = {
    "specversion": "1.0",
    "id": "1",
    "source": "https://127.0.0.1:6443",
    "type": "dev.knative.apiserver.resource.add",
    "subject": "/apis/v1/namespaces/demo/pods/web-0",
    "datacontenttype": "application/json",
    "kind": "Pod",
    "apiversion": "v1",
    "name": "web-0",
    "namespace": "demo",
}
POD_UPDATE = {**POD_ADD, "type": "dev.knative.apiserver.resource.update"}
POD_DELETE = {**POD_ADD, "type": "dev.knative.apiserver.resource.delete"}
DEPLOYMENT_ADD = {**POD_ADD, "kind": "Deployment", "apiversion": "apps/v1"}
NO_SUBJECT = {k: v for k, v in POD_ADD.items() if k != "subject"}
EMPTY_NAME = {**POD_ADD, "name": ""}

A, U = "dev.knative.apiserver.resource.add", "dev.knative.apiserver.resource.update"

# (case, trigger spec, event attributes, expected result)
CASES: list[tuple[str, dict[str, Any], dict[str, str], Result]] = [
    # --- no filter at all [handler] ---------------------------------------------------------
    ("no filter delivers everything", {}, POD_ADD, Result.NO_FILTER),
    ("filter without attributes is no filter [attr]", {"filter": {}}, POD_ADD, Result.NO_FILTER),
    (
        "empty attributes map passes [attr]",
        {"filter": {"attributes": {}}},
        POD_ADD,
        Result.PASS,
    ),
    # --- spec.filter.attributes [attr] ------------------------------------------------------
    ("attributes: exact type", {"filter": {"attributes": {"type": A}}}, POD_ADD, Result.PASS),
    ("attributes: other type", {"filter": {"attributes": {"type": A}}}, POD_UPDATE, Result.FAIL),
    (
        "attributes: every listed attribute must match",
        {"filter": {"attributes": {"type": A, "kind": "Pod"}}},
        DEPLOYMENT_ADD,
        Result.FAIL,
    ),
    (
        "attributes: extension matches",
        {"filter": {"attributes": {"kind": "Pod", "namespace": "demo"}}},
        POD_ADD,
        Result.PASS,
    ),
    (
        "attributes: missing extension never matches",
        {"filter": {"attributes": {"owner": "web"}}},
        POD_ADD,
        Result.FAIL,
    ),
    (
        "attributes: empty value means any value, but present",
        {"filter": {"attributes": {"kind": ""}}},
        POD_ADD,
        Result.PASS,
    ),
    (
        "attributes: empty value, extension absent",
        {"filter": {"attributes": {"owner": ""}}},
        POD_ADD,
        Result.FAIL,
    ),
    (
        "attributes: empty value, extension present but empty",
        {"filter": {"attributes": {"name": ""}}},
        EMPTY_NAME,
        Result.FAIL,
    ),
    (
        "attributes: unset core attribute reads as empty string",
        {"filter": {"attributes": {"subject": ""}}},
        NO_SUBJECT,
        Result.FAIL,
    ),
    (
        "attributes: values are case sensitive",
        {"filter": {"attributes": {"kind": "pod"}}},
        POD_ADD,
        Result.FAIL,
    ),
    (
        "attributes: datamediatype drops parameters",
        {"filter": {"attributes": {"datamediatype": "application/json"}}},
        {**POD_ADD, "datacontenttype": "application/json; charset=utf-8"},
        Result.PASS,
    ),
    (
        "attributes: schemaurl reads dataschema",
        {"filter": {"attributes": {"schemaurl": "https://x/s"}}},
        {**POD_ADD, "dataschema": "https://x/s"},
        Result.PASS,
    ),
    (
        "attributes: time compares in Go's RFC 3339 rendering",
        {"filter": {"attributes": {"time": "2026-01-02T03:04:05.5Z"}}},
        {**POD_ADD, "time": "2026-01-02T03:04:05.500000+00:00"},
        Result.PASS,
    ),
    # --- spec.filters: exact / prefix / suffix [exact] --------------------------------------
    ("exact: equal", {"filters": [{"exact": {"type": A}}]}, POD_ADD, Result.PASS),
    ("exact: different", {"filters": [{"exact": {"type": A}}]}, POD_UPDATE, Result.FAIL),
    ("exact: missing extension", {"filters": [{"exact": {"owner": "x"}}]}, POD_ADD, Result.FAIL),
    (
        "prefix: matches",
        {"filters": [{"prefix": {"type": "dev.knative.apiserver."}}]},
        POD_DELETE,
        Result.PASS,
    ),
    (
        "prefix: no match",
        {"filters": [{"prefix": {"type": "io.kn-rescheduler."}}]},
        POD_ADD,
        Result.FAIL,
    ),
    ("suffix: matches", {"filters": [{"suffix": {"type": ".update"}}]}, POD_UPDATE, Result.PASS),
    ("suffix: no match", {"filters": [{"suffix": {"type": ".update"}}]}, POD_ADD, Result.FAIL),
    (
        "suffix: missing extension",
        {"filters": [{"suffix": {"owner": "x"}}]},
        POD_ADD,
        Result.FAIL,
    ),
    (
        "exact: several entries in one map must all hold",
        {"filters": [{"exact": {"type": A, "kind": "Deployment"}}]},
        POD_ADD,
        Result.FAIL,
    ),
    # --- the list is ANDed; all / any / not [all] [any] [not] -------------------------------
    (
        "filters list is ANDed",
        {"filters": [{"exact": {"type": A}}, {"exact": {"kind": "Pod"}}]},
        DEPLOYMENT_ADD,
        Result.FAIL,
    ),
    (
        "any: one member passes",
        {"filters": [{"any": [{"exact": {"type": A}}, {"exact": {"type": U}}]}]},
        POD_UPDATE,
        Result.PASS,
    ),
    (
        "any: no member passes",
        {"filters": [{"any": [{"exact": {"type": A}}, {"exact": {"type": U}}]}]},
        POD_DELETE,
        Result.FAIL,
    ),
    (
        "all: one member fails",
        {"filters": [{"all": [{"exact": {"type": A}}, {"exact": {"kind": "Pod"}}]}]},
        DEPLOYMENT_ADD,
        Result.FAIL,
    ),
    (
        "all: every member passes",
        {"filters": [{"all": [{"exact": {"type": A}}, {"prefix": {"subject": "/apis/v1/"}}]}]},
        POD_ADD,
        Result.PASS,
    ),
    (
        "not: negates a pass",
        {"filters": [{"not": {"exact": {"namespace": "demo"}}}]},
        POD_ADD,
        Result.FAIL,
    ),
    (
        "not: negates a fail (missing attribute)",
        {"filters": [{"not": {"exact": {"owner": "x"}}}]},
        POD_ADD,
        Result.PASS,
    ),
    # --- filters wins over filter [handler] --------------------------------------------------
    (
        "filters set: filter.attributes is ignored (would fail)",
        {"filters": [{"exact": {"kind": "Pod"}}], "filter": {"attributes": {"type": "nope"}}},
        POD_ADD,
        Result.PASS,
    ),
    (
        "filters set: filter.attributes is ignored (would pass)",
        {"filters": [{"exact": {"kind": "Node"}}], "filter": {"attributes": {"kind": "Pod"}}},
        POD_ADD,
        Result.FAIL,
    ),
    (
        "empty filters list: filter.attributes applies",
        {"filters": [], "filter": {"attributes": {"kind": "Node"}}},
        POD_ADD,
        Result.FAIL,
    ),
    # --- entries Knative skips instead of rejecting [create] -------------------------------
    (
        "exact with an empty value is skipped (filters nothing)",
        {"filters": [{"exact": {"type": ""}}]},
        POD_ADD,
        Result.NO_FILTER,
    ),
    (
        "skipped entry leaves the others in force",
        {"filters": [{"exact": {"type": ""}}, {"exact": {"kind": "Node"}}]},
        POD_ADD,
        Result.FAIL,
    ),
    ("entry naming no dialect is skipped", {"filters": [{}]}, POD_ADD, Result.NO_FILTER),
    (
        "all whose members were all skipped is no filter",
        {"filters": [{"all": [{"prefix": {"type": ""}}]}]},
        POD_ADD,
        Result.NO_FILTER,
    ),
    (
        "not of a skipped entry is no filter",
        {"filters": [{"not": {}}]},
        POD_ADD,
        Result.NO_FILTER,
    ),
    (
        "any answers its last member when none passes: FAIL then NO_FILTER",
        {"filters": [{"any": [{"exact": {"type": U}}, {"all": [{"exact": {"type": ""}}]}]}]},
        POD_ADD,
        Result.NO_FILTER,
    ),
    (
        "all answers its last member when none fails: PASS then NO_FILTER",
        {"filters": [{"all": [{"exact": {"type": A}}, {"not": {}}]}]},
        POD_ADD,
        Result.NO_FILTER,
    ),
]


@pytest.mark.parametrize(
    ("spec", "attributes", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_filter_rules(spec: dict[str, Any], attributes: dict[str, str], expected: Result) -> None:
    assert filters.for_trigger(spec)(attributes) is expected


def test_only_fail_drops_an_event() -> None:
    # [handler]: `if filterResult == eventfilter.FailFilter { return }`.
    assert Result.PASS.delivers and Result.NO_FILTER.delivers and not Result.FAIL.delivers


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"filter": {"attributes": {"Type": "x"}}}, "invalid attribute name"),  # [webhook]
        ({"filter": {"attributes": {"ce-type": "x"}}}, "invalid attribute name"),
        ({"filters": [{"exact": {"9type": "x"}}]}, "invalid attribute name"),
        ({"filters": [{"exact": {"type": "a"}, "prefix": {"type": "b"}}]}, "multiple dialects"),
        ({"filters": [{"any": [{"exact": {"type": "a"}, "not": {}}]}]}, "multiple dialects"),
        ({"filters": [{"regex": {"type": "a"}}]}, "unknown filter dialect"),
        ({"filter": {"attributes": {"retry": 5}}}, "must be a string"),
    ],
)
def test_webhook_rejections(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(filters.InvalidFilter, match=message):
        filters.for_trigger(spec)


def test_cesql_is_refused_clearly() -> None:
    with pytest.raises(filters.UnsupportedFilter, match="CESQL"):
        filters.for_trigger({"filters": [{"cesql": "type = 'a'"}]})
    with pytest.raises(filters.UnsupportedFilter, match="CESQL"):
        filters.for_trigger({"filters": [{"not": {"cesql": "type = 'a'"}}]})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-01-02T03:04:05Z", "2026-01-02T03:04:05Z"),
        ("2026-01-02T03:04:05.120000Z", "2026-01-02T03:04:05.12Z"),
        ("2026-01-02T03:04:05.000Z", "2026-01-02T03:04:05Z"),
        ("2026-01-02T03:04:05.123456789+02:00", "2026-01-02T03:04:05.123456789+02:00"),
        ("2026-01-02T03:04:05-00:00", "2026-01-02T03:04:05Z"),
        ("", "0001-01-01T00:00:00Z"),  # unset time: Go's zero time
    ],
)
def test_time_is_compared_as_go_renders_it(value: str, expected: str) -> None:
    assert filters.go_time_text(value) == expected


# --- the project's own Triggers --------------------------------------------------------------


@pytest.fixture(scope="module")
def project_triggers() -> dict[str, triggers.Trigger]:
    loaded, broker = triggers.load(ROOT / "knative", namespace="kn-rescheduler", broker="default")
    assert broker is not None and broker.delivery is not None
    return {t.name: t for t in loaded}


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        (POD_ADD, {"detect-failures"}),
        (POD_UPDATE, {"detect-failures"}),
        (POD_DELETE, set()),
        (DEPLOYMENT_ADD, set()),
        (
            {**POD_ADD, "type": "io.kn-rescheduler.pod.failing", "source": "/kn-rescheduler/x"},
            {"update-annotations", "assess-nodes"},
        ),
        ({**POD_ADD, "type": "io.kn-rescheduler.pod.rescheduled"}, {"assess-nodes"}),
        ({**POD_ADD, "type": "io.kn-rescheduler.pod.exhausted"}, {"assess-nodes"}),
        ({**POD_ADD, "type": "io.kn-rescheduler.node.suspected"}, set()),
    ],
    ids=[
        "add",
        "update",
        "delete",
        "deployment",
        "failing",
        "rescheduled",
        "exhausted",
        "node-suspected",
    ],
)
def test_project_triggers_route(
    project_triggers: dict[str, triggers.Trigger], attributes: dict[str, str], expected: set[str]
) -> None:
    matched = {n for n, t in project_triggers.items() if t.filter(attributes).delivers}
    assert matched == expected


# What a PingSource sends (the adapter's CloudEvent attributes).
PING = {
    "specversion": "1.0",
    "type": "dev.knative.sources.ping",
    "source": "/apis/v1/namespaces/kn-rescheduler/pingsources/rebalance-nodes",
    "id": "1",
}


def test_project_triggers_delivery(project_triggers: dict[str, triggers.Trigger]) -> None:
    for trigger in project_triggers.values():
        assert trigger.subscriber.service == trigger.name
        d = trigger.delivery
        assert d is not None
        if trigger.filter(PING) is filters.Result.PASS:
            # A PingSource routed through the Broker (so that its function's reply lands
            # there): a missed tick is replaced by the next, a retry would evaluate twice.
            assert d.retry == 0
            continue
        assert (d.retry, d.backoff_policy, d.backoff_delay) == (5, "exponential", 0.5)
        assert d.dead_letter_sink


# --- delivery spec ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("PT0.5S", 0.5),
        ("PT2S", 2.0),
        ("PT1M30S", 90.0),
        ("PT1H", 3600.0),
        ("P1D", 86400.0),
        ("P1DT1S", 86401.0),
        ("PT0,25S", 0.25),
        ("P1W", 604800.0),
    ],
)
def test_iso8601_durations(text: str, seconds: float) -> None:
    assert triggers.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0.5s", "PT", "P", "PT1S1M", "1", "PTS", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        triggers.parse_duration(text)


@pytest.mark.parametrize(
    ("policy", "waits"),
    [
        # [retries]: the backoff function gets the 0-based number of the failed attempt.
        ("exponential", [0.5, 1.0, 2.0, 4.0, 8.0]),
        ("linear", [0.0, 0.5, 1.0, 1.5, 2.0]),
    ],
)
def test_backoff_formula(policy: str, waits: list[float]) -> None:
    spec = triggers.Delivery.from_spec(
        {"retry": 5, "backoffPolicy": policy, "backoffDelay": "PT0.5S"}, "t"
    )
    assert spec is not None
    assert [spec.backoff(n) for n in range(5)] == waits


def test_backoff_needs_policy_and_delay() -> None:
    # [retries]: without both, the no-retries backoff (0) stays in place.
    for raw in ({"retry": 3, "backoffDelay": "PT1S"}, {"retry": 3, "backoffPolicy": "linear"}):
        spec = triggers.Delivery.from_spec(raw, "t")
        assert spec is not None and spec.backoff(2) == 0.0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"retry": -1}, "retry"),
        ({"backoffPolicy": "fibonacci"}, "backoffPolicy"),
        ({"backoffDelay": "500ms"}, "backoffDelay"),
        ({"timeout": "PT0S"}, "timeout"),
        ({"format": "xml"}, "format"),
        ({"deadLetterSink": {}}, "deadLetterSink"),
    ],
)
def test_delivery_rejections(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(triggers.InvalidManifest, match=message):
        triggers.Delivery.from_spec(raw, "t")


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "t.yaml").write_text(text)
    return tmp_path


TRIGGER = """
apiVersion: eventing.knative.dev/v1
kind: Trigger
metadata: {{name: {name}{ns}}}
spec:
  broker: {broker}
  subscriber: {{ref: {{apiVersion: serving.knative.dev/v1, kind: Service, name: s}}}}
"""


def test_load_keeps_only_our_broker_and_namespace(tmp_path: Path) -> None:
    docs = [
        TRIGGER.format(name="mine", ns="", broker="default"),
        TRIGGER.format(name="explicit", ns=", namespace: kn-rescheduler", broker="default"),
        TRIGGER.format(name="other-broker", ns="", broker="other"),
        TRIGGER.format(name="other-ns", ns=", namespace: elsewhere", broker="default"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ignored}\n",
    ]
    _write(tmp_path, "---".join(docs))
    loaded, broker = triggers.load(tmp_path, namespace="kn-rescheduler", broker="default")
    assert [t.name for t in loaded] == ["mine", "explicit"]
    assert broker is None


def test_load_rejects_trigger_without_broker(tmp_path: Path) -> None:
    _write(tmp_path, TRIGGER.format(name="x", ns="", broker="''"))
    with pytest.raises(triggers.InvalidManifest, match="broker"):
        triggers.load(tmp_path, namespace="kn-rescheduler", broker="default")


def test_subscriber_uri_resolves_relative_to_ref() -> None:
    sub = triggers.Subscriber(service="svc", uri="/hook")
    assert sub.resolve({"svc": "http://127.0.0.1:9/"}) == "http://127.0.0.1:9/hook"
    assert sub.resolve({}) is None
    assert triggers.Subscriber(None, "http://x/").resolve({}) == "http://x/"
