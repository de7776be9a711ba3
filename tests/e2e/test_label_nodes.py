"""label-nodes on the real control plane, reading the real local Prometheus.

The function runs in-process exactly as functions-framework serves it (its own module, its
own settings from the environment), with a real API client and the real Prometheus HTTP API;
each evaluation is one PingSource event posted to it. The rules are the local stack's
(dev/stack/pressure-rules.yaml: CPU over 70 % labels, under 60 % clears). Usage is set on a Node's
simulated node-exporter (localcluster.nodeexporter), scraped every second.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import flask.testing
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from dev.localcluster import Cluster
from dev.localcluster.keys import (
    SIM_CPU_USAGE_ANNOTATION,
    SIM_MEMORY_USAGE_ANNOTATION,
)
from dev.stack.functions import ROOT, command
from shared.api.keys import (
    PING_EVENT_TYPE,
    PRESSURE_ANNOTATION,
    PRESSURE_LABEL_KEY,
    PRESSURE_LABEL_VALUE,
)
from shared.nodes.label_nodes.handler import Labeler
from shared.nodes.label_nodes.rules import load_rules
from shared.platform import kube as kubeapi
from shared.platform.config import Config
from shared.platform.kube import Kube
from shared.platform.prometheus import Prometheus
from tests.e2e.conftest import let_time_pass, wait_for
from tests.handlers.conftest import ON_DEMAND_TICKS, ClientFactory, cloudevent

pytestmark = pytest.mark.e2e

RULES = ROOT / "dev" / "stack" / "pressure-rules.yaml"
CPU_RULE = '100 * (1 - avg by (node) (rate(node_cpu_seconds_total{mode="idle"}[10s])))'
STALE_AFTER = 8.0


def cpu_by_node(url: str) -> dict[str, float]:
    """The CPU usage (percent) the rules read, straight from Prometheus."""
    session = requests.Session()
    session.trust_env = False
    body = session.get(f"{url}/api/v1/query", params={"query": CPU_RULE}, timeout=5).json()
    return {r["metric"]["node"]: float(r["value"][1]) for r in body["data"]["result"]}


def reads(cluster: Cluster, node: str, low: float, high: float) -> Callable[[], Any]:
    """A check that Prometheus reads the node's CPU between low and high (percent)."""

    def check() -> Any:
        value = cpu_by_node(cluster.prometheus_url).get(node)
        return value is not None and low < value < high and value

    return check


def labelled(cluster: Cluster) -> set[str]:
    selector = f"{PRESSURE_LABEL_KEY}={PRESSURE_LABEL_VALUE}"
    items = cluster.rest.get(f"/api/v1/nodes?labelSelector={selector}")["items"]
    return {n["metadata"]["name"] for n in items}


def record_of(cluster: Cluster, node: str) -> dict[str, Any] | None:
    annotations = cluster.rest.get(f"/api/v1/nodes/{node}")["metadata"].get("annotations") or {}
    raw = annotations.get(PRESSURE_ANNOTATION)
    return json.loads(raw) if raw else None


def ping(client: flask.testing.FlaskClient) -> None:
    headers, body = cloudevent(PING_EVENT_TYPE, {"message": "evaluate"}, source="/pingsource")
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 202, response.get_data(as_text=True)


def writes(client: flask.testing.FlaskClient) -> dict[str, float]:
    """knr_pressure_node_writes_total by action, from the function's own /metrics."""
    text = client.get("/metrics").get_data(as_text=True)
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "knr_pressure_node_writes":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["action"]] = sample.value
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


@pytest.fixture
def quiet_nodes(cluster: Cluster) -> Iterator[list[str]]:
    """Every node reads quiet before the test; afterwards usage, labels and records are gone
    (other tests share the nodes)."""
    nodes = cluster.nodes
    wait_for(
        "every node to read quiet",
        lambda: (
            (v := cpu_by_node(cluster.prometheus_url)).keys() >= set(nodes)
            and all(v[n] < 60 for n in nodes)
        ),
    )
    yield nodes
    for node in nodes:
        cluster.rest.patch(
            f"/api/v1/nodes/{node}",
            {
                "metadata": {
                    "labels": {PRESSURE_LABEL_KEY: None},
                    "annotations": {
                        PRESSURE_ANNOTATION: None,
                        SIM_CPU_USAGE_ANNOTATION: None,
                        SIM_MEMORY_USAGE_ANNOTATION: None,
                    },
                }
            },
        )


@pytest.fixture
def label_nodes(
    cluster: Cluster, function_client: ClientFactory, quiet_nodes: list[str]
) -> flask.testing.FlaskClient:
    return function_client(
        "label-nodes",
        KUBECONFIG=str(cluster.kubeconfig),
        **ON_DEMAND_TICKS,
        KN_RESCHEDULER_PROMETHEUS_URL=cluster.prometheus_url,
        KN_RESCHEDULER_PRESSURE_RULES_FILE=str(RULES),
        # Two of the four nodes may be labelled; labels go 8 s after their last confirmation.
        KN_RESCHEDULER_PRESSURE_MAX_SHARE="0.5",
        KN_RESCHEDULER_PRESSURE_STALE_AFTER=f"{STALE_AFTER:g}s",
    )


def test_a_node_over_the_threshold_is_labelled_at_the_first_evaluation_that_sees_it(
    cluster: Cluster, label_nodes: flask.testing.FlaskClient
) -> None:
    busy, *others = cluster.nodes
    ping(label_nodes)
    assert labelled(cluster) == set()

    cluster.set_node_usage(busy, cpu=0.95)
    # Prometheus needs a few scrapes (1 s each) for the 10 s rate to pass 70 %; the PingSource
    # evaluates every 30 s, so the next evaluation after the climb sees it.
    value = wait_for("Prometheus to read the node busy", reads(cluster, busy, 70, 101))
    ping(label_nodes)

    assert labelled(cluster) == {busy}
    record = record_of(cluster, busy)
    assert record is not None
    assert record["rule"] == "cpu-usage" and record["value"] > 70
    assert record["since"] == record["seen"]
    assert value > 70
    assert all(record_of(cluster, n) is None for n in others)

    # /nodes: the labelled nodes from the API server, with the rule, value and since when.
    nodes = label_nodes.get("/nodes").get_json()
    assert nodes["label"] == "status=presure"
    assert [(n["name"], n["rule"], n["since"]) for n in nodes["nodes"]] == [
        (busy, "cpu-usage", record["since"])
    ]
    # /status: the last evaluation succeeded with Prometheus reachable.
    status = label_nodes.get("/status").get_json()
    assert status["prometheus_reachable"] is True
    assert status["last_success"] == status["last_evaluation"]
    assert status["labelled"] == 1 and status["cap"] == 2
    assert status["last_error"] == ""

    # Nothing changed: another evaluation writes no Node.
    before = writes(label_nodes)
    ping(label_nodes)
    assert delta(before, writes(label_nodes)) == {}
    assert labelled(cluster) == {busy}


def test_a_value_oscillating_around_the_threshold_does_not_flap_the_label(
    cluster: Cluster, label_nodes: flask.testing.FlaskClient
) -> None:
    node = cluster.nodes[1]
    before = writes(label_nodes)
    cluster.set_node_usage(node, cpu=0.8)
    wait_for("Prometheus to read the node over 70 %", reads(cluster, node, 72, 101))
    ping(label_nodes)
    assert labelled(cluster) == {node}

    # Down under the threshold but above the clear threshold, up over it, down again: kept.
    for usage, low, high in ((0.65, 61, 69), (0.78, 72, 90), (0.64, 61, 69)):
        cluster.set_node_usage(node, cpu=usage)
        wait_for(f"Prometheus to read {low}-{high} %", reads(cluster, node, low, high))
        ping(label_nodes)
        assert labelled(cluster) == {node}, f"label lost at {usage:.0%}"

    # Back under the clear threshold: cleared.
    cluster.set_node_usage(node, cpu=0.3)
    wait_for("Prometheus to read the node quiet", reads(cluster, node, 0, 59))
    ping(label_nodes)
    assert labelled(cluster) == set()
    assert record_of(cluster, node) is None
    # One label, one removal, and no more than the renewals of its record in between.
    changes = delta(before, writes(label_nodes))
    assert changes.get("label") == 1 and changes.get("unlabel") == 1
    assert set(changes) <= {"label", "unlabel", "keep"}


def status_of(cluster: Cluster, node: str) -> str | None:
    labels = cluster.rest.get(f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}
    value = labels.get(PRESSURE_LABEL_KEY)
    return None if value is None else str(value)


def operator_labels(cluster: Cluster, node: str, value: str) -> None:
    """What `kubectl label node NODE status=VALUE --overwrite` sends: a merge patch."""
    cluster.rest.patch(
        f"/api/v1/nodes/{node}", {"metadata": {"labels": {PRESSURE_LABEL_KEY: value}}}
    )


def test_an_operators_status_is_never_overwritten_nor_cleared_and_gets_no_record(
    cluster: Cluster, label_nodes: flask.testing.FlaskClient
) -> None:
    theirs, by_hand, *_ = cluster.nodes
    operator_labels(cluster, theirs, "maintenance")
    # Our value written by hand: nothing says label-nodes put it there.
    operator_labels(cluster, by_hand, PRESSURE_LABEL_VALUE)
    cluster.set_node_usage(theirs, cpu=0.95)
    wait_for("Prometheus to read the node busy", reads(cluster, theirs, 72, 101))
    before = writes(label_nodes)
    ping(label_nodes)
    ping(label_nodes)

    assert status_of(cluster, theirs) == "maintenance"
    # The quiet node keeps the label the operator wrote: we remove only what we put there.
    assert status_of(cluster, by_hand) == PRESSURE_LABEL_VALUE
    assert record_of(cluster, theirs) is None and record_of(cluster, by_hand) is None
    assert delta(before, writes(label_nodes)) == {}


def test_an_operator_writing_status_between_our_read_and_our_write_wins(
    cluster: Cluster, quiet_nodes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = quiet_nodes[3]
    cluster.set_node_usage(node, cpu=0.95)
    wait_for("Prometheus to read the node busy", reads(cluster, node, 72, 101))
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    kube = Kube.from_environment()
    listed = kube.list_all

    def list_then_the_operator_writes(kind: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        items = list(listed(kind, *args, **kwargs))
        operator_labels(cluster, node, "maintenance")
        return iter(items)

    monkeypatch.setattr(kube, "list_all", list_then_the_operator_writes)
    labeler = Labeler(
        kube,
        Prometheus(cluster.prometheus_url),
        load_rules(RULES),
        Config(pressure_max_share=0.5),
    )
    # The label patch carried the resourceVersion we read: the API server refuses it (409),
    # and the ping is answered 503 so that the PingSource's retry decides again.
    with pytest.raises(kubeapi.Transient, match="409"):
        labeler.evaluate()
    assert status_of(cluster, node) == "maintenance"
    assert record_of(cluster, node) is None


@pytest.fixture
def prometheus_back(cluster: Cluster) -> Iterator[None]:
    """Prometheus runs again after the test, whatever happened in it."""
    yield
    cluster.start_prometheus()


def test_with_prometheus_killed_labels_stay_until_stale_then_go_and_status_says_why(
    cluster: Cluster, label_nodes: flask.testing.FlaskClient, prometheus_back: None
) -> None:
    node = cluster.nodes[2]
    cluster.set_node_usage(node, cpu=0.95)
    wait_for("Prometheus to read the node busy", reads(cluster, node, 72, 101))
    ping(label_nodes)
    assert labelled(cluster) == {node}
    seen = time.monotonic()

    cluster.stop_prometheus(kill=True)
    ping(label_nodes)  # 202: a redelivery within seconds cannot end an outage
    assert labelled(cluster) == {node}, "a label must survive the start of an outage"
    status = label_nodes.get("/status").get_json()
    assert status["prometheus_reachable"] is False
    assert "Prometheus unreachable" in status["last_error"]
    assert status["last_success"] != status["last_evaluation"]
    (shown,) = label_nodes.get("/nodes").get_json()["nodes"]
    assert shown["name"] == node and shown["stale_at"] is not None

    # Past the staleness limit after the last confirmation (and the record's second precision).
    let_time_pass(seen + STALE_AFTER + 1.5 - time.monotonic(), "the confirmation goes stale")
    ping(label_nodes)
    assert labelled(cluster) == set()
    assert record_of(cluster, node) is None


def test_malformed_rules_stop_the_function_at_start_up_naming_the_rule_and_field(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad-rules.yaml"
    bad.write_text("rules:\n  - name: cpu-usage\n    expr: up\n    threshold: high\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "HOST": "127.0.0.1",
        "PORT": "0",
        "KN_RESCHEDULER_PROMETHEUS_URL": "http://127.0.0.1:9",
        "KN_RESCHEDULER_PRESSURE_RULES_FILE": str(bad),
    }
    # The container's own command: gunicorn loading the function, which refuses the rules.
    done = subprocess.run(
        command("label-nodes"),
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert (
        "RulesError: pressure rules bad-rules.yaml: rule 'cpu-usage', field threshold: "
        "expected a number such as 70 or a quantity such as 512Mi, got 'high'"
    ) in output
