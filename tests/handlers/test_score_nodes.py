"""score-nodes through functions-framework: the extender wire format as kube-scheduler speaks
it, malformed requests, nodes it cannot read, health and metrics.

extender_args.json is a request body captured from the real kube-scheduler (v1.36.3, the
cluster's binary) calling an extender with ``nodeCacheCapable: false``: Go field names without
JSON tags ("Pod", "Nodes", "NodeNames"), whole Node objects with their managedFields, nodes in
the scheduler's order. Each test writes the usage annotations it needs onto those nodes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import flask.testing
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.api.keys import LOAD_AWARE_SCHEDULER_NAME, MAINTENANCE_LABEL, USAGE_ANNOTATION
from shared.api.usage import Reading, UsageRecord
from shared.platform.config import ConfigError
from tests.handlers.conftest import ClientFactory

CAPTURED: dict[str, Any] = json.loads(
    (Path(__file__).with_name("extender_args.json")).read_text(encoding="utf-8")
)


def usage(cpu: float, memory: float = 20.0, age: timedelta = timedelta(seconds=10)) -> str:
    return UsageRecord(
        sampled_at=datetime.now(UTC) - age,
        source="prometheus",
        cpu=Reading(now=cpu),
        memory=Reading(now=memory),
    ).to_json()


def args(**annotations: str | None) -> dict[str, Any]:
    """The captured ExtenderArgs with node name -> usage annotation (None: none)."""
    body = copy.deepcopy(CAPTURED)
    for item in body["Nodes"]["items"]:
        found = item["metadata"].setdefault("annotations", {})
        found.pop(USAGE_ANNOTATION, None)
        value = annotations.get(item["metadata"]["name"].replace("-", "_"))
        if value is not None:
            found[USAGE_ANNOTATION] = value
    return body


def post(client: flask.testing.FlaskClient, verb: str, body: object) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    # The scheduler's own request line: urlPrefix + "/" + verb, JSON, nothing else.
    return client.post(
        f"/scheduler/{verb}", data=data, headers={"Content-Type": "application/json"}
    )


@pytest.fixture
def client(function_client: ClientFactory) -> flask.testing.FlaskClient:
    # The node cache off: these tests send whole Nodes (nodeCacheCapable: false) or test what
    # names alone get without a cache; the cache itself is tested against the real API server
    # (tests/e2e/test_node_cache.py, test_score_nodes.py).
    return function_client("score-nodes", KN_RESCHEDULER_EXTENDER_NODE_CACHE="false")


def node_named(body: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in body["Nodes"]["items"] if n["metadata"]["name"] == name)


def test_filter_answers_in_the_schedulers_own_field_names_with_the_nodes_it_sent(
    client: flask.testing.FlaskClient,
) -> None:
    body = args(node_0=usage(92), node_1=usage(20))
    response = post(client, "filter", body)
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    answer = response.get_json()
    assert set(answer) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes"}
    # nodeCacheCapable false: the scheduler rebuilds its list from Nodes, so they come back
    # exactly as sent.
    assert answer["Nodes"]["items"] == [node_named(body, "node-1")]
    assert answer["NodeNames"] == ["node-1"]
    assert answer["FailedNodes"] == {}
    assert answer["FailedAndUnresolvableNodes"] == {"node-0": "node CPU usage over 80 percent"}


def test_prioritize_answers_a_host_priority_list_in_the_order_sent(
    client: flask.testing.FlaskClient,
) -> None:
    response = post(client, "prioritize", args(node_0=usage(50, 50), node_1=usage(10, 10)))
    assert response.status_code == 200
    # The captured request lists node-1 first.
    assert response.get_json() == [{"Host": "node-1", "Score": 9}, {"Host": "node-0", "Score": 5}]


def test_the_verb_is_the_last_path_segment_whatever_the_url_prefix(
    client: flask.testing.FlaskClient,
) -> None:
    body = json.dumps(args(node_0=usage(92))).encode()
    for path in ("/filter", "/scheduler/filter", "/a/b/filter/"):
        response = client.post(path, data=body)
        assert response.status_code == 200, path
        assert response.get_json()["NodeNames"] == ["node-1"]


def test_names_only_as_nodeCacheCapable_sends_them_pass_and_score_alike(  # noqa: N802
    client: flask.testing.FlaskClient,
) -> None:
    body = {"Pod": CAPTURED["Pod"], "Nodes": None, "NodeNames": ["node-1", "node-0"]}
    answer = post(client, "filter", body).get_json()
    assert answer["NodeNames"] == ["node-1", "node-0"]
    assert "Nodes" not in answer
    assert answer["FailedAndUnresolvableNodes"] == {}
    scores = post(client, "prioritize", body).get_json()
    assert scores == [{"Host": "node-1", "Score": 5}, {"Host": "node-0", "Score": 5}]


def test_lowercase_keys_are_read_as_go_reads_them(client: flask.testing.FlaskClient) -> None:
    body = args(node_0=usage(92))
    lower = {"pod": body["Pod"], "nodes": body["Nodes"], "nodenames": None}
    answer = post(client, "filter", lower).get_json()
    assert answer["NodeNames"] == ["node-1"]


def test_a_node_in_maintenance_is_failed_with_its_reason(client: flask.testing.FlaskClient) -> None:
    body = args(node_0=usage(10), node_1=usage(10))
    node_named(body, "node-0")["metadata"]["labels"][MAINTENANCE_LABEL] = "true"
    answer = post(client, "filter", body).get_json()
    assert answer["FailedAndUnresolvableNodes"] == {"node-0": "node in maintenance"}


def test_labels_that_are_not_a_map_are_no_maintenance_and_usage_still_counts(
    client: flask.testing.FlaskClient,
) -> None:
    body = args(node_0=usage(92), node_1=usage(20))
    node_named(body, "node-1")["metadata"]["labels"] = "x"
    answer = post(client, "filter", body)
    assert answer.status_code == 200
    assert answer.get_json()["NodeNames"] == ["node-1"]


def breaks(change: str) -> dict[str, Any]:
    """The captured request with node-0 damaged as ``change`` says; node-1 is quiet."""
    body = args(node_0=usage(92), node_1=usage(20))
    node = node_named(body, "node-0")
    if change == "annotation not JSON":
        node["metadata"]["annotations"][USAGE_ANNOTATION] = "{not json"
    elif change == "annotation a number":
        node["metadata"]["annotations"][USAGE_ANNOTATION] = 42
    elif change == "annotations a list":
        node["metadata"]["annotations"] = ["x"]
    elif change == "no status":
        del node["status"]
    elif change == "status a list":
        node["status"] = []
    elif change == "allocatable not quantities":
        node["status"]["allocatable"] = {"cpu": "many", "memory": "lots"}
    elif change == "stale usage":
        node["metadata"]["annotations"][USAGE_ANNOTATION] = usage(99, age=timedelta(hours=1))
    return body


@pytest.mark.parametrize(
    "change",
    [
        "annotation not JSON",
        "annotation a number",
        "annotations a list",
        "no status",
        "status a list",
        "allocatable not quantities",
        "stale usage",
    ],
)
def test_a_node_we_cannot_read_passes_and_scores_neutral_never_a_5xx(
    client: flask.testing.FlaskClient, change: str
) -> None:
    body = breaks(change)
    filtered = post(client, "filter", body)
    assert filtered.status_code == 200
    assert sorted(filtered.get_json()["NodeNames"]) == ["node-0", "node-1"]
    scored = post(client, "prioritize", body)
    assert scored.status_code == 200
    # node-1 at 20 % scores 8; the unreadable node-0 gets the mean of the scored ones.
    assert scored.get_json() == [{"Host": "node-1", "Score": 8}, {"Host": "node-0", "Score": 8}]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"", "not JSON"),
        (b"{nope", "not JSON"),
        (b"[]", "expected ExtenderArgs"),
        (json.dumps({"Nodes": CAPTURED["Nodes"]}).encode(), "Pod must be a Pod object"),
        (json.dumps({"Pod": "web", "Nodes": CAPTURED["Nodes"]}).encode(), "Pod must be"),
        (json.dumps({"Pod": CAPTURED["Pod"]}).encode(), "neither Nodes nor NodeNames"),
        (json.dumps({"Pod": CAPTURED["Pod"], "Nodes": []}).encode(), "NodeList object"),
        (
            json.dumps({"Pod": CAPTURED["Pod"], "Nodes": {"items": {"a": 1}}}).encode(),
            "items must be a list",
        ),
        (
            json.dumps({"Pod": CAPTURED["Pod"], "Nodes": {"items": [{"metadata": {}}]}}).encode(),
            "items[0] is not a Node with a name",
        ),
        (
            json.dumps({"Pod": CAPTURED["Pod"], "Nodes": {"items": ["node-1"]}}).encode(),
            "items[0] is not a Node with a name",
        ),
        (
            json.dumps({"Pod": CAPTURED["Pod"], "Nodes": None, "NodeNames": [1]}).encode(),
            "NodeNames must be a list of node names",
        ),
    ],
)
def test_a_malformed_request_gets_400_with_the_reason_and_a_log_line(
    client: flask.testing.FlaskClient,
    caplog: pytest.LogCaptureFixture,
    body: bytes,
    error: str,
) -> None:
    with caplog.at_level("INFO", logger="score-nodes"):
        for verb in ("filter", "prioritize"):
            response = post(client, verb, body)
            assert response.status_code == 400
            assert error in response.get_json()["error"]
    warnings = [r for r in caplog.records if r.getMessage().startswith("malformed extender")]
    assert [
        (r.levelname, getattr(r, "verb", None), getattr(r, "status", None)) for r in warnings
    ] == [
        ("WARNING", "filter", 400),
        ("WARNING", "prioritize", 400),
    ]
    assert error in warnings[0].getMessage()


def test_an_empty_node_list_as_go_writes_it_is_answered(client: flask.testing.FlaskClient) -> None:
    body = {"Pod": CAPTURED["Pod"], "Nodes": {"metadata": {}, "items": None}, "NodeNames": None}
    answer = post(client, "filter", body).get_json()
    assert answer["Nodes"] == {"metadata": {}, "items": []}
    assert post(client, "prioritize", body).get_json() == []


def test_health_methods_and_unknown_paths(client: flask.testing.FlaskClient) -> None:
    health = client.get("/healthz")
    assert (health.status_code, health.get_data(as_text=True)) == (200, "ok")
    assert client.get("/scheduler/filter").status_code == 405
    assert client.post("/scheduler/bind", data=b"{}").status_code == 404


def test_metrics_count_calls_and_decisions_by_reason(client: flask.testing.FlaskClient) -> None:
    def sample(name: str, **labels: str) -> float:
        text = client.get("/metrics").get_data(as_text=True)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and s.labels == labels:
                    return float(s.value)
        return 0.0

    before = (
        sample("knr_extender_requests_total", verb="filter", code="200"),
        sample("knr_extender_node_decisions_total", verb="filter", reason="cpu-over-threshold"),
        sample("knr_extender_requests_total", verb="prioritize", code="400"),
    )
    post(client, "filter", args(node_0=usage(92), node_1=usage(20)))
    post(client, "prioritize", b"{")
    after = (
        sample("knr_extender_requests_total", verb="filter", code="200"),
        sample("knr_extender_node_decisions_total", verb="filter", reason="cpu-over-threshold"),
        sample("knr_extender_requests_total", verb="prioritize", code="400"),
    )
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1]
    assert sample("knr_extender_seconds_count", verb="filter") >= 1


def test_a_setting_it_cannot_use_stops_it_at_start_up(function_client: ClientFactory) -> None:
    with pytest.raises(ConfigError, match="KN_RESCHEDULER_CPU_THRESHOLD"):
        function_client("score-nodes", KN_RESCHEDULER_CPU_THRESHOLD="hot")


def test_the_thresholds_come_from_the_environment(function_client: ClientFactory) -> None:
    client = function_client(
        "score-nodes",
        KN_RESCHEDULER_CPU_THRESHOLD="90",
        KN_RESCHEDULER_MEMORY_THRESHOLD="90",
        KN_RESCHEDULER_EXTENDER_NODE_CACHE="false",
    )
    answer = post(client, "filter", args(node_0=usage(85), node_1=usage(95))).get_json()
    assert answer["FailedAndUnresolvableNodes"] == {"node-1": "node CPU usage over 90 percent"}


def test_when_every_node_is_hot_the_default_schedulers_pod_gets_them_all_with_a_warning(
    client: flask.testing.FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The captured pod is the default scheduler's (schedulerName default-scheduler, as the API
    server defaults it): no FailedScheduling for it, the score ranks the hot nodes."""
    body = args(node_0=usage(92), node_1=usage(81, 10))
    assert body["Pod"]["spec"]["schedulerName"] == "default-scheduler"
    with caplog.at_level("INFO", logger="score-nodes"):
        answer = post(client, "filter", body).get_json()
    assert answer["NodeNames"] == ["node-1", "node-0"]
    assert answer["FailedAndUnresolvableNodes"] == {}
    assert [r.levelname for r in caplog.records if "every node over" in r.getMessage()] == [
        "WARNING"
    ]
    scores = post(client, "prioritize", body).get_json()
    assert scores == [{"Host": "node-1", "Score": 5}, {"Host": "node-0", "Score": 4}]


def test_a_kube_system_pod_passes_hot_nodes_for_the_load_aware_scheduler_too(
    client: flask.testing.FlaskClient,
) -> None:
    body = args(node_0=usage(92), node_1=usage(85))
    body["Pod"]["spec"]["schedulerName"] = LOAD_AWARE_SCHEDULER_NAME
    assert post(client, "filter", body).get_json()["FailedAndUnresolvableNodes"] == {
        "node-0": "node CPU usage over 80 percent",
        "node-1": "node CPU usage over 80 percent",
    }
    body["Pod"]["metadata"]["namespace"] = "kube-system"
    answer = post(client, "filter", body).get_json()
    assert (answer["NodeNames"], answer["FailedAndUnresolvableNodes"]) == (["node-1", "node-0"], {})


@pytest.fixture
def with_node_cache(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> Iterator[flask.testing.FlaskClient]:
    """score-nodes with its node cache on, against an API server that refuses every
    connection; the cache's thread is stopped afterwards (by function_client)."""
    yield function_client("score-nodes", KUBECONFIG=str(unreachable_kubeconfig))


def test_names_only_while_the_node_cache_cannot_list_pass_every_node_and_score_them_alike(
    with_node_cache: flask.testing.FlaskClient,
) -> None:
    """The cache is on but the API server refuses every connection (a real refused port): it
    never lists, so it is not ready, and the extender steps aside instead of deciding on
    nothing. The scheduler's call is answered at once, not after an API timeout."""
    client = with_node_cache
    body = {"Pod": CAPTURED["Pod"], "Nodes": None, "NodeNames": ["node-1", "node-0"]}
    answer = post(client, "filter", body).get_json()
    assert answer["NodeNames"] == ["node-1", "node-0"]
    assert answer["FailedAndUnresolvableNodes"] == {}
    scores = post(client, "prioritize", body).get_json()
    assert scores == [{"Host": "node-1", "Score": 5}, {"Host": "node-0", "Score": 5}]
    cache = client.get("/debug/node-cache").get_json()
    assert cache == {"enabled": True, "ready": False, "resourceVersion": "", "nodes": {}}
    text = client.get("/metrics").get_data(as_text=True)
    ready = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "knr_extender_node_cache_ready"
    }
    assert ready == {"knr_extender_node_cache_ready": 0.0}


def test_whole_nodes_are_decided_on_as_sent_even_with_the_node_cache_on(
    with_node_cache: flask.testing.FlaskClient,
) -> None:
    """A scheduler still configured with nodeCacheCapable: false gets the same answers."""
    answer = post(with_node_cache, "filter", args(node_0=usage(92), node_1=usage(20))).get_json()
    assert answer["FailedAndUnresolvableNodes"] == {"node-0": "node CPU usage over 80 percent"}


def test_a_filter_that_fails_nodes_logs_them_by_reason_and_each_node_only_at_debug(
    client: flask.testing.FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    body = args(node_0=usage(92), node_1=usage(20))
    with caplog.at_level("INFO", logger="score-nodes"):
        post(client, "filter", body)
    (line,) = [r for r in caplog.records if r.getMessage().startswith("filter:")]
    assert (line.levelname, line.getMessage()) == ("INFO", "filter: 1 of 2 nodes pass")
    assert line.reasons == {"cpu-over-threshold": 1, "fits": 1}  # type: ignore[attr-defined]
    assert not hasattr(line, "failed")
    caplog.clear()
    with caplog.at_level("DEBUG", logger="score-nodes"):
        post(client, "filter", body)
    (line,) = [r for r in caplog.records if r.getMessage().startswith("filter:")]
    assert line.failed == {"node-0": "node CPU usage over 80 percent"}  # type: ignore[attr-defined]
