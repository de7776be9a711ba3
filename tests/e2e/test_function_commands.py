"""Each function started as its image starts it, configured as its Knative Service configures it.

The command line is ``stack.functions.command()`` (the test first checks it is the Dockerfile's
CMD), the environment is the Service's from knative/ (its env, and the ConfigMap it loads with
envFrom), with only what a pod gets from elsewhere supplied locally: PORT (Knative sets it),
the API credentials (here a token of the function's own ServiceAccount, with the RBAC of
knative/ installed in the real control plane), the webhook's certificate files (made by the
self-signed step, hack/webhook-cert.sh) and, for sweep-failures, a K_SINK that points at a
small local receiver instead of the Broker.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import http.server
import json
import re
import shlex
import shutil
import socket
import ssl
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from kubernetes import client as k8s

from dev.localcluster.procs import Proc
from dev.stack.functions import FUNCTIONS, command, free_port
from shared.api.keys import (
    APISERVER_UPDATE,
    EVENT_POD_FAILING,
    POLICY_ANNOTATION,
    POLICY_STAMP_ANNOTATION,
)
from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.workloads.classify import classify
from tests.e2e.conftest import wait_for
from tests.e2e.knative_manifests import (
    NAMESPACE,
    REPO_ROOT,
    Obj,
    container,
    environment,
    find,
    install_rbac,
    knative_service,
    kubeconfig_for,
    render,
    service_account_token,
)

pytestmark = pytest.mark.e2e

WEBHOOK_HOST = f"mutate-admission-webhook.{NAMESPACE}.svc"


# -- the image's command ------------------------------------------------------------------------


def image_command(function: str) -> list[str]:
    """The Dockerfile's CMD for ``function``, as the shell in it runs it."""
    lines = (REPO_ROOT / "Dockerfile").read_text().splitlines()
    (cmd,) = [line for line in lines if line.startswith("CMD ")]
    words = shlex.split(cmd.removeprefix("CMD ").replace("${FUNCTION}", function))
    assert words[0] == "exec", "gunicorn must replace the shell as PID 1"
    return words[1:]


@pytest.mark.parametrize("function", FUNCTIONS)
def test_the_image_starts_the_function_with_the_command_the_local_stack_uses(
    function: str,
) -> None:
    assert image_command(function) == ["python", *command(function)[1:]]


def test_the_image_holds_the_function_its_settings_and_shared_code_only() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    copies = re.findall(r"^COPY (\S+) (\S+)$", text, flags=re.MULTILINE)
    assert copies == [
        ("requirements.lock", "./"),
        ("shared/", "shared/"),
        ("functions/gunicorn.conf.py", "functions/gunicorn.conf.py"),
        ("functions/${FUNCTION}/", "functions/${FUNCTION}/"),
    ]
    # Every package pinned and hashed (tests/unit/test_lock.py checks the lock itself).
    assert "pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock" in text
    (user,) = re.findall(r"^USER (\S+)$", text, flags=re.MULTILINE)
    assert user.split(":")[0].isdigit() and user.split(":")[0] != "0", "a numeric non-root user"


# -- running a function as its Service would ----------------------------------------------------


@dataclass
class Running:
    function: str
    port: int
    proc: Proc
    tls_ca: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def request(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> tuple[int, Mapping[str, str], bytes]:
        if self.tls_ca is None:
            conn: http.client.HTTPConnection = http.client.HTTPConnection(
                "127.0.0.1", self.port, timeout=30
            )
        else:
            # Verified as the API server verifies it: against the CA, for the Service's name.
            context = ssl.create_default_context(cafile=str(self.tls_ca))
            conn = http.client.HTTPSConnection(WEBHOOK_HOST, self.port, context=context, timeout=30)
            port = self.port
            conn._create_connection = (  # type: ignore[attr-defined]
                lambda _address, timeout=None, source_address=None: socket.create_connection(
                    ("127.0.0.1", port), timeout
                )
            )
        try:
            conn.request(method, path, body=body, headers=dict(headers or {}))
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def metrics(self) -> str:
        status, _, body = self.request("GET", "/metrics")
        assert status == 200
        return body.decode()


@pytest.fixture(scope="module")
def manifests() -> list[Obj]:
    return render()


@pytest.fixture(scope="module")
def rbac(cluster: Any, manifests: list[Obj]) -> None:
    install_rbac(cluster.kubeconfig, manifests)


@pytest.fixture(scope="module")
def credentials(
    cluster: Any, rbac: None, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """A kubeconfig holding a token of the named ServiceAccount of knative/."""
    directory = tmp_path_factory.mktemp("credentials")
    api = cluster.api_client()

    def kubeconfig(account: str) -> Path:
        token = service_account_token(api, account)
        return kubeconfig_for(cluster.server, cluster.ca_file, token, directory / account)

    return kubeconfig


@pytest.fixture(scope="module")
def webhook_tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The webhook's certificate files, made by the self-signed step."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed by hack/webhook-cert.sh")
    out = tmp_path_factory.mktemp("webhook-cert") / "tls"
    subprocess.run(
        ["bash", str(REPO_ROOT / "hack" / "webhook-cert.sh"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    return out


@dataclass
class Launcher:
    """Starts a function of ``manifests`` with its own ServiceAccount's credentials."""

    manifests: list[Obj]
    credentials: Callable[[str], Path]
    log_dir: Path

    def __call__(
        self,
        function: str,
        *,
        overrides: Mapping[str, str] | None = None,
        tls_dir: Path | None = None,
    ) -> contextlib.AbstractContextManager[Running]:
        return running(
            self.manifests,
            function,
            self.log_dir,
            kubeconfig=self.credentials(function),
            overrides=overrides,
            tls_dir=tls_dir,
        )


@pytest.fixture
def launch(manifests: list[Obj], credentials: Callable[[str], Path], tmp_path: Path) -> Launcher:
    return Launcher(manifests, credentials, tmp_path)


@contextlib.contextmanager
def running(
    manifests: list[Obj],
    function: str,
    log_dir: Path,
    *,
    kubeconfig: Path,
    overrides: Mapping[str, str] | None = None,
    tls_dir: Path | None = None,
) -> Iterator[Running]:
    ksvc = knative_service(manifests, function)
    env = environment(manifests, ksvc)
    mounts = container(ksvc).get("volumeMounts") or []
    for mount in mounts:
        named = [v for v in env.values() if v.startswith(mount["mountPath"] + "/")]
        if not named:
            # Read at a fixed path, not a setting (sweep-failures' projected token for the
            # Broker): absent from a process, which then posts without it, as with OIDC off.
            continue
        # The Secret's files, where the pod would have them mounted.
        assert tls_dir is not None, f"{function} mounts {mount['name']}"
        for key, value in env.items():
            if value.startswith(mount["mountPath"] + "/"):
                env[key] = str(tls_dir / value.removeprefix(mount["mountPath"] + "/"))
    port = free_port()
    env.update(
        {
            # What the pod gets from elsewhere: Knative sets PORT, the image sets PYTHONPATH.
            "PORT": str(port),
            "PYTHONPATH": str(REPO_ROOT),
            # The container listens on 0.0.0.0; on a shared machine, loopback is enough.
            "HOST": "127.0.0.1",
            "KUBECONFIG": str(kubeconfig),
            **(overrides or {}),
        }
    )
    proc = Proc(function, command(function), log_dir / f"{function}.log", env=env, cwd=REPO_ROOT)
    tls_ca = tls_dir / "ca.crt" if mounts and tls_dir is not None else None
    server = Running(function, port, proc, tls_ca, env)
    try:

        def answers() -> bool:
            assert proc.alive(), f"{function} exited:\n{proc.log_tail()}"
            try:
                return server.request("GET", "/metrics")[0] == 200
            except OSError:
                return False

        wait_for(f"{function} to answer", answers, 60, every=0.2, seen=proc.log_tail)
        yield server
    finally:
        proc.stop(grace=5.0)


def cloudevent(event_type: str, data: Any, **extensions: str) -> tuple[dict[str, str], bytes]:
    """A binary-mode CloudEvent, as the Broker delivers it."""
    headers = {
        "ce-specversion": "1.0",
        "ce-id": str(uuid.uuid4()),
        "ce-source": "https://kube-apiserver.example",
        "ce-type": event_type,
        "content-type": "application/json",
        **{f"ce-{k}": v for k, v in extensions.items()},
    }
    return headers, json.dumps(data).encode()


def a_pod(name: str, *, oom_killed: bool, owner: Mapping[str, Any] | None = None) -> Obj:
    """A pod as a pod event carries it: opted in, on a node, healthy or OOM-killed."""
    state: Obj = (
        {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
        if oom_killed
        else {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    )
    meta: Obj = {
        "name": name,
        "namespace": "shop",
        "uid": str(uuid.uuid4()),
        "annotations": {POLICY_ANNOTATION: "3"},
    }
    if owner:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": "node-7", "containers": [{"name": "app", "image": "shop/web:1"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "app", "ready": not oom_killed, "restartCount": 1, "state": state}
            ],
        },
    }


def pod_event(pod: Obj) -> tuple[dict[str, str], bytes]:
    meta = pod["metadata"]
    return cloudevent(
        APISERVER_UPDATE,
        pod,
        subject=f"/apis/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
        kind="Pod",
        apiversion="v1",
        name=meta["name"],
        namespace=meta["namespace"],
    )


# -- detect-failures ----------------------------------------------------------------------------


def test_detect_failures_needs_no_credentials_and_answers_pod_events_as_a_subscriber(
    manifests: list[Obj], tmp_path: Path
) -> None:
    nowhere = tmp_path / "no-such-kubeconfig"
    with running(manifests, "detect-failures", tmp_path, kubeconfig=nowhere) as fn:
        # A healthy pod: nothing to say, plain success.
        headers, body = pod_event(a_pod("web-1", oom_killed=False))
        status, _, answer = fn.request("POST", "/", body, headers)
        assert (status, answer) == (202, b"")
        # An OOM-killed pod: the reply is the failing-pod event, for the Broker to route.
        failing = a_pod("web-2", oom_killed=True)
        headers, body = pod_event(failing)
        status, reply_headers, reply = fn.request("POST", "/", body, headers)
        assert status == 200
        assert reply_headers["ce-type"] == EVENT_POD_FAILING
        assert reply_headers["ce-subject"] == "namespaces/shop/pods/web-2"
        data = json.loads(reply)
        assert (data["node"], data["reason"], data["uid"]) == (
            "node-7",
            "OOMKilled",
            failing["metadata"]["uid"],
        )
        assert 'knr_events_received_total{function="detect-failures"' in fn.metrics()


# -- update-annotations -------------------------------------------------------------------------


def test_update_annotations_refuses_a_malformed_event_and_shrugs_at_a_pod_that_is_gone(
    launch: Launcher,
) -> None:
    with launch("update-annotations") as fn:
        # Not a CloudEvent at all: 400, which the Broker does not retry.
        status, _, _ = fn.request("POST", "/", b"{}", {"content-type": "application/json"})
        assert status == 400
        # A CloudEvent whose data is not a failing pod: 400 as well.
        headers, body = cloudevent(EVENT_POD_FAILING, {"hello": "world"})
        status, _, _ = fn.request("POST", "/", body, headers)
        assert status == 400
        # A failing pod that no longer exists: its ServiceAccount may read pods, finds none,
        # and answers plain success (RBAC refusing the read would be a 500).
        pod = a_pod(f"gone-{uuid.uuid4().hex[:6]}", oom_killed=True)
        failure = classify(pod, Config())  # type: ignore[arg-type]
        assert failure is not None
        data = FailingPod.from_pod(pod, failure).to_data()  # type: ignore[arg-type]
        headers, body = cloudevent(EVENT_POD_FAILING, data, subject="namespaces/shop/pods/gone")
        status, _, answer = fn.request("POST", "/", body, headers)
        assert (status, answer) == (202, b"")


# -- sweep-failures -----------------------------------------------------------------------------


class Receiver(http.server.ThreadingHTTPServer):
    """A stand-in for the Broker's ingress: keeps what it is sent, answers 202."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                receiver.received.append(
                    ({k.lower(): v for k, v in self.headers.items()}, self.rfile.read(length))
                )
                self.send_response(202)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/{NAMESPACE}/default"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_sweep_failures_sends_every_failing_pod_it_lists_to_k_sink(
    cluster: Any,
    launch: Launcher,
    receiver: Receiver,
    faults: Callable[..., None],
    namespace: str,
) -> None:
    # A pod that the node OOM-kills, as the webhook would have stamped it.
    node = cluster.nodes[-1]
    faults("oom", node)
    core = k8s.CoreV1Api(cluster.api_client())
    name = "sweep-me"
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "annotations": {POLICY_ANNOTATION: "2"}},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "app", "image": "registry.example.com/shop/web:1"}],
            },
        },
    )
    wait_for(
        f"pod {name} to fail on {node}",
        lambda: classify(
            core.api_client.sanitize_for_serialization(core.read_namespaced_pod(name, namespace)),
            Config(),
        ),
    )
    # The tick the PingSource sends (its data from knative/sources.yaml).
    ping = find(launch.manifests, "PingSource", "sweep-failures")["spec"]
    with launch("sweep-failures", overrides={"K_SINK": receiver.url}) as fn:
        headers, _ = cloudevent("dev.knative.sources.ping", None)
        headers["content-type"] = ping["contentType"]
        status, _, _ = fn.request("POST", "/", ping["data"].encode(), headers)
        assert status == 202
    sent = [
        (h, json.loads(body))
        for h, body in receiver.received
        if h.get("ce-subject") == f"namespaces/{namespace}/pods/{name}"
    ]
    assert len(sent) == 1, f"expected one event for {name}: {receiver.received}"
    headers, data = sent[0]
    assert headers["ce-type"] == EVENT_POD_FAILING
    assert (data["node"], data["reason"]) == (node, "OOMKilled")


# -- mutate-admission ---------------------------------------------------------------------------


def admission_review(pod: Obj, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "object": pod,
        },
    }


def test_mutate_admission_serves_tls_for_its_service_name_and_stamps_the_owners_policy(
    cluster: Any, launch: Launcher, webhook_tls: Path, namespace: str
) -> None:
    # An owner with a policy, in the cluster: the webhook must read it with its own account.
    apps = k8s.AppsV1Api(cluster.api_client())
    labels = {"app": "web"}
    owner = apps.create_namespaced_replica_set(
        namespace,
        {
            "metadata": {"name": "web-5d8f", "annotations": {POLICY_ANNOTATION: "3"}},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "app", "image": "shop/web:1"}]},
                },
            },
        },
    )
    owned = {
        "metadata": {
            "generateName": "web-5d8f-",
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": owner.metadata.name,
                    "uid": owner.metadata.uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "app", "image": "shop/web:1"}]},
    }
    unowned = {
        "metadata": {"name": "scratch", "namespace": namespace},
        "spec": {"containers": [{"name": "app", "image": "shop/web:1"}]},
    }
    with launch("mutate-admission", tls_dir=webhook_tls) as fn:
        results = {}
        for what, pod in (("owned", owned), ("unowned", unowned)):
            review = admission_review(pod, namespace)
            status, _, body = fn.request(
                "POST", "/", json.dumps(review).encode(), {"content-type": "application/json"}
            )
            assert status == 200
            answer = json.loads(body)
            assert answer["response"]["uid"] == review["request"]["uid"]
            assert answer["response"]["allowed"] is True
            results[what] = answer["response"]
        exported = fn.metrics()

    # The owner's policy is stamped on the pod (read through the webhook's own account).
    assert results["owned"]["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(results["owned"]["patch"]))
    stamped = jsonpatch.apply_patch(owned, patch)
    assert stamped["metadata"]["annotations"][POLICY_STAMP_ANNOTATION] == "3"
    assert "patch" not in results["unowned"]
    assert 'knr_webhook_admissions_total{result="patched"} 1.0' in exported
    assert 'result="error"' not in exported
