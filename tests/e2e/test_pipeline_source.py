"""Knative's ApiServerSource adapter against the real local API server, into Knative's Broker.

The adapter and the Broker's data plane are Knative's own (built from knative.dev/eventing by
hack/build-adapter.sh; the adapter runs beside the Broker in its network namespace);
these tests pin down what the rest of the project relies on: the exact event shape, that objects
existing before the source starts produce no add event, that Trigger filtering of the project's
manifests lets add/update through to detect-failures and keeps delete out, that a label
selector (what knative/sources.yaml sets) is applied by the API server to the adapter's watch,
and that stopping the source leaves no process behind.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from dev.localcluster.cluster import Cluster
from dev.pipeline.broker import KnativeBroker
from dev.pipeline.source import ApiServerSource
from tests.e2e import conftest as e2e

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


# The adapter delivers within seconds: half the e2e suite's patience, polled faster.
wait_for = partial(e2e.wait_for, timeout=30.0, every=0.1)


@pytest.fixture(scope="module")
def control_plane(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The session's cluster when the suite has one, else a one-node cluster of our own."""
    try:
        existing = request.getfixturevalue("cluster")
    except pytest.FixtureLookupError:
        existing = None
    if existing is not None:
        yield existing
        return
    with Cluster(nodes=1, quiet=True) as cluster:
        yield cluster


class Recorder:
    """detect-failures stand-in: records every delivery, answers 202."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], bytes]] = []
        self._server = make_server("127.0.0.1", 0, self._app, threaded=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.port}/"

    @Request.application  # type: ignore[arg-type]
    def _app(self, request: Request) -> Response:
        self.calls.append(({k.lower(): v for k, v in request.headers}, request.data))
        return Response("", status=202)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def named(self, name: str, event_type: str) -> list[tuple[dict[str, str], bytes]]:
        return [
            c for c in self.calls if c[0].get("ce-name") == name and c[0]["ce-type"] == event_type
        ]


def _broker(control_plane: Any, tmp_path: Path, recorder: Recorder) -> KnativeBroker:
    """The project's Broker and Triggers with the recorder as detect-failures."""
    return KnativeBroker(
        control_plane.kubeconfig,
        control_plane.api_client(),
        ROOT / "knative",
        {"detect-failures": recorder.url},
        tmp_path,
        tmp_path / "logs",
        archive=tmp_path / "archive.jsonl",
        dead_letters=tmp_path / "dead.jsonl",
    ).start()


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "pipeline-source"}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/app:1"}]},
    }


def test_adapter_events_reach_the_broker_in_knative_shape(
    control_plane: Any, tmp_path: Path
) -> None:
    core = k8s.CoreV1Api(control_plane.api_client())
    ns = f"pipeline-src-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    wait_for("default service account", lambda: core.list_namespaced_service_account(ns).items)
    core.create_namespaced_pod(ns, _pod("before"))

    recorder = Recorder()
    broker = _broker(control_plane, tmp_path, recorder)
    source = ApiServerSource(
        control_plane.kubeconfig,
        broker.source_url,
        namespaces=[ns],
        log_path=tmp_path / "adapter.log",
        wrap=broker.wrap,
    )
    try:
        source.start()
        pid = source.pid
        assert pid is not None

        created = core.create_namespaced_pod(ns, _pod("after"))
        [(headers, body)] = wait_for(
            "the add event of pod after",
            lambda: recorder.named("after", "dev.knative.apiserver.resource.add"),
        )
        assert headers["ce-specversion"] == "1.0"
        assert headers["ce-source"] == control_plane.server
        assert headers["ce-subject"] == f"/apis/v1/namespaces/{ns}/pods/after"
        assert (headers["ce-kind"], headers["ce-apiversion"]) == ("Pod", "v1")
        assert (headers["ce-name"], headers["ce-namespace"]) == ("after", ns)
        assert headers["content-type"] == "application/json"
        assert uuid.UUID(headers["ce-id"]).version == 4
        assert "ce-time" in headers
        pod = json.loads(body)
        assert pod["kind"] == "Pod" and pod["metadata"]["uid"] == created.metadata.uid
        assert pod["spec"]["containers"][0]["image"] == "registry.invalid/app:1"

        # A pod that existed at start-up gets no add event, but its changes are sent.
        core.patch_namespaced_pod("before", ns, {"metadata": {"labels": {"touched": "yes"}}})
        wait_for(
            "the update event of pod before",
            lambda: recorder.named("before", "dev.knative.apiserver.resource.update"),
        )
        assert recorder.named("before", "dev.knative.apiserver.resource.add") == []

        # Deletes reach the broker (archived) but not detect-failures (its Trigger's filter).
        core.delete_namespaced_pod("after", ns, grace_period_seconds=0)

        def deleted() -> list[dict[str, Any]]:
            lines = (tmp_path / "archive.jsonl").read_text().splitlines()
            return [
                e
                for e in map(json.loads, lines)
                if e["type"] == "dev.knative.apiserver.resource.delete" and e["name"] == "after"
            ]

        wait_for("the delete event of pod after", deleted)
        assert broker.wait_idle(10)
        assert all(
            c[0]["ce-type"] != "dev.knative.apiserver.resource.delete" for c in recorder.calls
        )
        ids = [c[0]["ce-id"] for c in recorder.calls]
        assert len(ids) == len(set(ids))
        assert (tmp_path / "dead.jsonl").exists() is False
    finally:
        source.stop()
        broker.stop()
        recorder.close()
        core.delete_namespace(ns)
    assert not source.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_with_a_label_selector_only_matching_pods_are_sent_and_one_losing_its_label_leaves(
    control_plane: Any, tmp_path: Path
) -> None:
    """The adapter hands the selector to its list and watch, so the API server filters: a pod
    without the label is never sent; a pod whose label is removed leaves the watch, which the
    API server reports (and the adapter sends) as a delete, and nothing after that.

    A label of the test's own: the project's webhook (registered when other modules of the
    session run) would rightly remove `kn-rescheduler.io/opted-in` from a pod without a policy."""
    core = k8s.CoreV1Api(control_plane.api_client())
    ns = f"pipeline-sel-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    wait_for("default service account", lambda: core.list_namespaced_service_account(ns).items)

    recorder = Recorder()
    broker = _broker(control_plane, tmp_path, recorder)
    source = ApiServerSource(
        control_plane.kubeconfig,
        broker.source_url,
        wrap=broker.wrap,
        namespaces=[ns],
        label_selector="pipeline-source.test/watched=yes",
        log_path=tmp_path / "adapter.log",
    )

    def events_of(name: str) -> list[dict[str, Any]]:
        lines = (tmp_path / "archive.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if e.get("name") == name]

    def archived(name: str) -> list[str]:
        return [e["type"] for e in events_of(name)]

    try:
        source.start()
        assert json.loads(source.environment()["K_SOURCE_CONFIG"])["resources"] == [
            {
                "gvr": {"Group": "", "Version": "v1", "Resource": "pods"},
                "selector": "pipeline-source.test/watched=yes",
            }
        ]
        plain, opted = _pod("plain"), _pod("opted")
        opted["metadata"]["labels"]["pipeline-source.test/watched"] = "yes"
        core.create_namespaced_pod(ns, plain)
        core.create_namespaced_pod(ns, opted)
        for name in ("plain", "opted"):
            core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {"n": "1"}}})
        wait_for(
            "the update of the labelled pod",
            lambda: recorder.named("opted", "dev.knative.apiserver.resource.update"),
        )
        core.patch_namespaced_pod(
            "opted", ns, {"metadata": {"labels": {"pipeline-source.test/watched": None}}}
        )
        wait_for(
            "the labelled pod leaving the watch",
            lambda: "dev.knative.apiserver.resource.delete" in archived("opted"),
        )
        core.patch_namespaced_pod("opted", ns, {"metadata": {"annotations": {"n": "2"}}})
        core.patch_namespaced_pod("plain", ns, {"metadata": {"annotations": {"n": "2"}}})
        e2e.holds(
            "nothing archived for the pod never watched", lambda: archived("plain") == [], 2.0
        )
        assert broker.wait_idle(10)
        assert archived("plain") == []
        # Added, updated (the scheduler, the kubelet, our patch), then gone from the watch.
        # Knative's Broker delivers at least once and in no set order (its in-memory channel
        # dispatches each event on its own), so the archive's order and counts say nothing;
        # what each event carries does: none carries the annotation written after the pod
        # left the watch.
        opted_events = events_of("opted")
        assert set(archived("opted")) == {
            "dev.knative.apiserver.resource.add",
            "dev.knative.apiserver.resource.update",
            "dev.knative.apiserver.resource.delete",
        }
        marks = [
            ((e.get("data") or {}).get("metadata", {}).get("annotations") or {}).get("n")
            for e in opted_events
        ]
        assert "1" in marks  # the patch made while it was watched
        assert "2" not in marks  # the patch made after it left
        # The pod still exists: the delete only says it no longer matches.
        labels = core.read_namespaced_pod("opted", ns).metadata.labels
        assert "pipeline-source.test/watched" not in labels
    finally:
        source.stop()
        broker.stop()
        recorder.close()
        core.delete_namespace(ns)
