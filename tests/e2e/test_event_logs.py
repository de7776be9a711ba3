"""What the functions log by default is enough to replay every event that led to an action, on
the real control plane, and no pod's literal env values reach those logs.

By default a function logs one compact line per event and the whole (redacted) event only when
it led to a reply, an API write, a 4xx or a 5xx (shared/platform/events.py). These tests take the
lines the functions really wrote and feed them to the replay (kubectl_kn_rescheduler/replay.py).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.stack.stack import Stack
from kubectl_kn_rescheduler import replay
from shared.api.keys import (
    EVENT_POD_EXHAUSTED,
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    POLICY_ANNOTATION,
)
from shared.platform import logs
from shared.platform.kube import Kube
from tests import logcapture
from tests.e2e.conftest import Loop, pod_template, state_of, wait_for
from tests.e2e.test_rescheduling import failing_pod, only, pods, ready
from tests.handlers.conftest import ClientFactory, cloudevent, reply_of

pytestmark = pytest.mark.e2e

PASSWORD = "hunter2-s3cr3t-db-pa55"


def with_password(template: dict[str, Any]) -> dict[str, Any]:
    template["spec"]["containers"][0]["env"] = [{"name": "DB_PASSWORD", "value": PASSWORD}]
    return template


@pytest.fixture
def log_lines(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], list[str]]]:
    """The JSON lines the in-process functions log from here on, at the default settings."""
    monkeypatch.delenv(logs.LOG_EVENTS_ENV, raising=False)
    with logcapture.log_lines() as lines:
        yield lines


def replayed(lines: list[str], tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    log_file = tmp_path / "function.log"
    log_file.write_text("".join(line + "\n" for line in lines))
    out = io.StringIO()
    assert replay.main([str(log_file), "--json", *args], out=out) == 0, out.getvalue()
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_decision_logged_by_update_annotations_replays_to_the_same_decision(
    cluster: Any,
    namespace: str,
    api: Kube,
    loop: Loop,
    faults: Callable[..., None],
    function_client: ClientFactory,
    log_lines: Callable[[], list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every node is bad and the budget is one move: the first failure moves the pod, the
    # second exhausts the budget. That second decision (a state write, an Event, a reply, and
    # no pod removed) is delivered through the function as a dry run, logged, and replayed.
    faults("crashloop", *cluster.nodes)
    api.create(
        "ReplicaSet",
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "web", "annotations": {POLICY_ANNOTATION: "1"}},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": with_password(pod_template({"app": "web"}, cluster.nodes[0])),
            },
        },
    )
    first = wait_for("a failing pod", lambda: failing_pod(api, loop, namespace))
    moved = loop.failing_event(first)
    assert moved is not None
    loop.deliver(moved)

    def second_failure() -> dict[str, Any] | None:
        pod = failing_pod(api, loop, namespace)
        return pod if pod and pod["metadata"]["uid"] != first["metadata"]["uid"] else None

    event = loop.failing_event(wait_for("the replacement failing", second_failure, timeout=90))
    assert event is not None
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    client = function_client("update-annotations")
    headers, body = cloudevent(
        EVENT_POD_FAILING, event.data, subject=event.subject, id="decision-1", knrdryrun="true"
    )
    response = client.post("/", headers=headers, data=body)
    assert response.status_code == 200
    live_attrs, live_reply = reply_of(response)
    assert live_attrs["type"] == EVENT_POD_EXHAUSTED

    lines = log_lines()
    handled = [json.loads(x) for x in lines if '"event handled"' in x]
    (line,) = [x for x in handled if x.get("ce_id") == "decision-1"]
    assert (line["status"], line["reply_type"]) == (200, EVENT_POD_EXHAUSTED)
    assert line["cloudevent"]["data"]["uid"] == event.data["uid"]
    assert PASSWORD not in "\n".join(lines)

    # The Triggers send a failing-pod event to update-annotations and to assess-nodes.
    outcomes = replayed(lines, tmp_path, "--dry-run")
    assert sorted(o["function"] for o in outcomes) == ["assess-nodes", "update-annotations"]
    (outcome,) = [o for o in outcomes if o["function"] == "update-annotations"]
    assert (outcome["id"], outcome["function"], outcome["status"]) == (
        "decision-1",
        "update-annotations",
        200,
    )
    assert outcome["reply"]["type"] == live_attrs["type"]
    for key in ("action", "moves", "budget", "excludedNodes", "node", "reason", "uid"):
        assert outcome["reply"]["data"][key] == live_reply[key], key


def test_the_pipelines_function_logs_replay_every_event_that_led_to_an_action(
    cluster: Any,
    namespace: str,
    api: Kube,
    faults: Callable[..., None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    bad = cluster.nodes[2]
    faults("crashloop", bad)
    # The whole pipeline (Knative's Broker, Knative's ApiServerSource adapter, each function its own
    # gunicorn) at its default log settings, for this test only: it acts on every namespace.
    with Stack(
        cluster.kubeconfig, cluster.api_client(), tmp_path / "stack", log_dir, sweep_every=None
    ) as stack:
        template = with_password(pod_template({"app": "web"}, bad))
        api.create(
            "Deployment",
            namespace,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web", "annotations": {POLICY_ANNOTATION: "3"}},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": template,
                },
            },
        )

        def settled() -> bool:
            live = [p for p in pods(api, namespace) if not p["metadata"].get("deletionTimestamp")]
            return len(live) == 2 and all(ready(p) and p["spec"]["nodeName"] != bad for p in live)

        wait_for("2 web pods Ready off the faulty node", settled, timeout=90, every=0.5)
        assert stack.wait_idle(10)
        archive = [e for e in stack.archived() if namespace in e.get("subject", "")]

    detect_log = (log_dir / "detect-failures.log").read_text().splitlines()
    update_log = (log_dir / "update-annotations.log").read_text().splitlines()
    # The Broker's archive Trigger keeps events as sent; the functions'
    # own logs keep no literal env value, and no whole pod that led to nothing.
    assert any(PASSWORD in json.dumps(e) for e in archive)
    assert PASSWORD not in "\n".join(detect_log + update_log)
    detect_items, _ = replay.read(detect_log)
    update_items, _ = replay.read(update_log)
    pod_events = [e for e in archive if e["type"].startswith("dev.knative.apiserver.")]
    assert 0 < len([i for i in detect_items if namespace in i.event.subject]) < len(pod_events)

    # Every failing-pod event detect-failures emitted came from a pod event it logged in full,
    # and replaying those logged events finds the same failing pods.
    failing = [e for e in archive if e["type"] == EVENT_POD_FAILING]
    assert failing
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    outcomes = replayed([x for x in detect_log if namespace in x], tmp_path, "--subject", namespace)
    found = sorted(o["reply"]["subject"] for o in outcomes if o["reply"])
    assert found == sorted(e["subject"] for e in failing)

    # Every failing-pod event that update-annotations acted on is in its log in full: the
    # reports at the threshold, and the early reports that moved their pod (a first failure
    # corroborated by another workload failing on the node, which earlier tests of the same
    # cluster may have left in its record); an early report that leads to nothing is not...
    moved_ids = {i.event.id for i in update_items}
    moved = {e["subject"] for e in archive if e["type"] == EVENT_POD_RESCHEDULED}
    at_threshold = [e for e in failing if e["data"]["kind"] != "early"]
    assert moved and {e["id"] for e in at_threshold} <= moved_ids
    for subject in moved:
        assert any(e["id"] in moved_ids for e in failing if e["subject"] == subject), subject
    # ...and replaying them is idempotent: the moves are recorded once, whatever is replayed.
    rs = only(api, "ReplicaSet", namespace)["metadata"]["name"]
    before = state_of(api, "ReplicaSet", namespace, rs)
    replayed([x for x in update_log if namespace in x], tmp_path)
    assert state_of(api, "ReplicaSet", namespace, rs) == before
    assert before.excluded_nodes == (bad,)
