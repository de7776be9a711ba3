"""Only opted-in pods reach detect-failures: the webhook labels them, the ApiServerSource selects.

On the real control plane: the webhook registered with the API server (it labels every pod it
stamps with a policy), Knative's own ApiServerSource adapter configured from knative/sources.yaml
(its label selector included), Knative's Broker with the project's Triggers, the real
detect-failures and sweep-failures processes. update-annotations is a recorder: these tests look
at which events reach detect-failures and which failing-pod events come out, never at moves.

What the label must not lose: a pod our exclusions keep Pending (it carries the label, since
exclusions are only stamped with a policy), and a pod that opted in while the webhook was not
there to label it (the sweep lists every pod, label or not).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from dev.pipeline.broker import KnativeBroker
from dev.pipeline.source import ApiServerSource
from dev.stack import webhook as webhook_setup
from dev.stack.functions import ROOT, FunctionServer, environment
from dev.stack.stack import PING_TYPE
from shared.api.keys import (
    APISERVER_UPDATE,
    EVENT_POD_FAILING,
    EXCLUDED_NODES_ANNOTATION,
    OPTED_IN_LABEL,
    POLICY_STAMP_ANNOTATION,
    STATE_ANNOTATION,
)
from shared.platform.kube import Kube
from tests import builders
from tests.e2e.conftest import Webhook, pod_template, wait_for

pytestmark = pytest.mark.e2e


class Recorder:
    """Records every delivery; forwards it to ``upstream`` and answers as upstream did, or
    answers 202 itself (a stand-in)."""

    def __init__(self, upstream: str | None = None) -> None:
        self.upstream = upstream
        self.calls: list[tuple[dict[str, str], bytes]] = []
        self._lock = threading.Lock()
        self._server = make_server("127.0.0.1", 0, self._app, threaded=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.port}/"

    @Request.application  # type: ignore[arg-type]
    def _app(self, request: Request) -> Response:
        headers = {k.lower(): v for k, v in request.headers}
        with self._lock:
            self.calls.append((headers, request.data))
        if self.upstream is None:
            return Response("", status=202)
        # A CloudEvent in binary mode is its ce-* headers, its content type and its body.
        cloudevent = ("ce-", "content-type")
        answer = requests.post(
            self.upstream,
            data=request.data,
            headers={k: v for k, v in headers.items() if k.startswith(cloudevent)},
            timeout=30,
        )
        reply = {k: v for k, v in answer.headers.items() if k.lower().startswith(cloudevent)}
        return Response(answer.content, status=answer.status_code, headers=reply)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def events_of(self, namespace: str, name: str) -> list[tuple[str, dict[str, Any]]]:
        """(type, pod) of every pod event about ``namespace/name`` delivered so far."""
        with self._lock:
            calls = list(self.calls)
        return [
            (h["ce-type"], json.loads(body))
            for h, body in calls
            if h.get("ce-namespace") == namespace and h.get("ce-name") == name
        ]

    def failing(self, namespace: str) -> list[dict[str, Any]]:
        """The data of every failing-pod event about a pod of ``namespace``."""
        with self._lock:
            calls = list(self.calls)
        out = []
        for headers, body in calls:
            data = json.loads(body)
            if headers.get("ce-type") == EVENT_POD_FAILING and data.get("namespace") == namespace:
                out.append(data)
        return out


@dataclass
class Pipeline:
    broker: KnativeBroker
    source: ApiServerSource
    detect: Recorder  # in front of the real detect-failures
    updates: Recorder  # stands in for update-annotations
    sweep: FunctionServer

    def sweep_now(self) -> int:
        headers = {
            "ce-specversion": "1.0",
            "ce-id": "sweep-1",
            "ce-source": "/apis/v1/namespaces/kn-rescheduler/pingsources/sweep-failures",
            "ce-type": PING_TYPE,
        }
        response = requests.post(self.sweep.url, json={}, headers=headers, timeout=60)
        return response.status_code


@pytest.fixture(scope="module")
def pipeline(
    cluster: Any, webhook: Webhook, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    workdir = tmp_path_factory.mktemp("source-selector")
    env = environment(cluster.kubeconfig)
    detect = FunctionServer("detect-failures", cluster.log_dir, env=env).start()
    front, updates = Recorder(detect.url), Recorder()
    broker = KnativeBroker(
        cluster.kubeconfig,
        cluster.api_client(),
        ROOT / "knative",
        {"detect-failures": front.url, "update-annotations": updates.url},
        workdir,
        workdir / "logs",
    ).start()
    sweep = FunctionServer(
        "sweep-failures", cluster.log_dir, env={**env, "K_SINK": broker.url}
    ).start()
    source = ApiServerSource.from_manifest(
        cluster.kubeconfig,
        broker.source_url,
        log_path=workdir / "apiserversource.log",
        wrap=broker.wrap,
    )
    try:
        source.start()
        yield Pipeline(broker, source, front, updates, sweep)
    finally:
        source.stop()
        broker.stop()
        for closing in (front, updates):
            closing.close()
        for server in (sweep, detect):
            server.stop()


def app(name: str, node: str, **labels: str) -> dict[str, Any]:
    """The pod template of the app ``name`` (labelled ``app: name``), preferring ``node``."""
    return pod_template({"app": name, **labels}, node)


def running_pod_of(api: Kube, namespace: str, app: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for pod in api.list_all("Pod", namespace, label_selector=f"app={app}"):
            if pod.get("status", {}).get("phase") == "Running":
                return pod
        return None

    found: dict[str, Any] = wait_for(f"a running pod of {app}", find)
    return found


def test_updates_of_pods_that_never_opted_in_never_reach_detect_failures(
    cluster: Any, namespace: str, api: Kube, pipeline: Pipeline
) -> None:
    node = cluster.nodes[0]
    api.create("Deployment", namespace, builders.deployment("plain", template=app("plain", node)))
    # A template copied from an opted-in pod, label and all: the webhook removes the copy.
    copied_label = app("copied", node, **{OPTED_IN_LABEL: "true"})
    api.create("Deployment", namespace, builders.deployment("copied", template=copied_label))
    api.create("Deployment", namespace, builders.deployment(retries="3", template=app("web", node)))
    plain, copied, web = (running_pod_of(api, namespace, app) for app in ("plain", "copied", "web"))
    assert OPTED_IN_LABEL not in plain["metadata"]["labels"]
    assert OPTED_IN_LABEL not in copied["metadata"]["labels"]
    assert web["metadata"]["labels"][OPTED_IN_LABEL] == "true"

    # The others' changes first: the adapter sends in watch order, so once the opted-in pod's
    # last update is in, theirs would have been too.
    for round_ in range(1, 4):
        for pod in (plain, copied, web):
            api.merge_patch(
                "Pod",
                namespace,
                pod["metadata"]["name"],
                {"metadata": {"annotations": {"touched": str(round_)}}},
            )

    def last_update_of_web() -> bool:
        return any(
            kind == APISERVER_UPDATE
            and pod["metadata"].get("annotations", {}).get("touched") == "3"
            for kind, pod in pipeline.detect.events_of(namespace, web["metadata"]["name"])
        )

    wait_for("the opted-in pod's last update at detect-failures", last_update_of_web)
    assert pipeline.broker.wait_idle(10)
    web_events = pipeline.detect.events_of(namespace, web["metadata"]["name"])
    assert len([k for k, _ in web_events if k == APISERVER_UPDATE]) >= 3
    assert pipeline.detect.events_of(namespace, plain["metadata"]["name"]) == []
    assert pipeline.detect.events_of(namespace, copied["metadata"]["name"]) == []


def test_a_pod_our_exclusions_keep_pending_still_reaches_detect_failures(
    cluster: Any, namespace: str, api: Kube, pipeline: Pipeline
) -> None:
    # A bare pod whose own state excludes every node (as after moves off each of them): the
    # webhook stamps the exclusions, and the label with them, so the scheduler's verdict
    # reaches detect-failures, which asks for the exclusions to be cleared.
    state = {"version": 2, "moves": len(cluster.nodes), "excludedNodes": list(cluster.nodes)}
    api.create(
        "Pod",
        namespace,
        builders.bare_pod(
            "fenced",
            retries="10",
            annotations={STATE_ANNOTATION: json.dumps(state)},
            template=app("fenced", cluster.nodes[0]),
        ),
    )
    failing = wait_for(
        "the failing-pod event for the pod our exclusions keep Pending",
        lambda: pipeline.updates.failing(namespace),
    )[0]
    assert failing["name"] == "fenced"
    assert failing["kind"] == "exclusions-unschedulable"
    assert sorted(failing["excludedNodes"]) == sorted(cluster.nodes)
    pod = api.get("Pod", namespace, "fenced")
    assert pod["metadata"]["labels"][OPTED_IN_LABEL] == "true"
    assert json.loads(pod["metadata"]["annotations"][EXCLUDED_NODES_ANNOTATION])
    scheduled = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled[0]["reason"] == "Unschedulable"
    assert any(
        kind == APISERVER_UPDATE for kind, _ in pipeline.detect.events_of(namespace, "fenced")
    )


@pytest.fixture
def webhook_down(cluster: Any, api: Kube, webhook: Webhook, namespace: str) -> Iterator[None]:
    """No webhook registration until the test ends (as before the install, or while it is
    down: failurePolicy Ignore admits the pod unchanged); registered again afterwards."""
    probe = api.with_options(dry_run=True)

    def admitted_labelled(expected: bool) -> Callable[[], bool]:
        def check() -> bool:
            body = builders.bare_pod("probe", retries="1", template=app("probe", cluster.nodes[0]))
            created = probe.create("Pod", namespace, body)
            return (OPTED_IN_LABEL in created["metadata"].get("labels", {})) == expected

        return check

    webhook_setup.unregister(webhook.api_client, webhook.name)
    try:
        # The API server's admission configuration follows the registration with a short lag.
        wait_for("pods admitted without the webhook", admitted_labelled(False))
        yield
    finally:
        webhook.register()
        wait_for("pods admitted by the webhook again", admitted_labelled(True))


def test_a_pod_that_opted_in_without_the_webhook_is_found_by_the_sweep(
    cluster: Any,
    namespace: str,
    api: Kube,
    pipeline: Pipeline,
    faults: Callable[..., None],
    webhook_down: None,
) -> None:
    bad = cluster.nodes[1]
    faults("imagepull", bad)
    api.create(
        "Pod", namespace, builders.bare_pod("early", retries="3", template=app("early", bad))
    )

    def failing_on_bad() -> dict[str, Any] | None:
        pod = api.get("Pod", namespace, "early")
        statuses = pod.get("status", {}).get("containerStatuses") or [{}]
        reason = statuses[0].get("state", {}).get("waiting", {}).get("reason")
        if pod["spec"].get("nodeName") == bad and reason in ("ErrImagePull", "ImagePullBackOff"):
            return pod
        return None

    pod = wait_for("the unlabelled pod failing on the bad node", failing_on_bad)
    assert OPTED_IN_LABEL not in pod["metadata"].get("labels", {})
    assert POLICY_STAMP_ANNOTATION not in pod["metadata"].get("annotations", {})

    def swept() -> list[dict[str, Any]]:
        assert pipeline.sweep_now() == 202
        return pipeline.updates.failing(namespace)

    failing = wait_for("the sweep to report the pod", swept, timeout=90, every=3)[0]
    assert (failing["name"], failing["node"]) == ("early", bad)
    # Its own events never came: no label, nothing selected.
    assert pipeline.detect.events_of(namespace, "early") == []
