"""Every function's image, built without a daemon, started as its Knative Service starts it and
asked a real request.

The image is the OCI archive ``make images`` writes (hack/build-image.sh, run here first: it
rebuilds what changed), loaded into podman's store and run with the Service's environment from
knative/ (its env and the ConfigMap it loads), as the Service's securityContext says: the
image's own numeric non-root user, a read-only root filesystem with no tmpfs but /dev/shm
(gunicorn's worker tmp dir), every capability dropped, no privilege escalation; its volumes
(the webhook's TLS Secret, label-nodes' rule ConfigMap) mounted read-only where the Service
mounts them. Each function is then asked something it answers from the request alone (no API
server): the answer's status and body show the function's own code ran, not just gunicorn.
sweep-failures and update-annotations are also run against the local control plane as a pod
reaches it: their own ServiceAccount's token and the cluster's CA where the kubelet mounts
them, KUBERNETES_SERVICE_HOST/PORT, knative/'s RBAC installed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from dev.bench import images
from dev.stack.functions import FUNCTIONS, free_port
from dev.stack.webhook import make_tls
from shared.api.keys import EVENT_POD_FAILING, POLICY_ANNOTATION
from shared.platform import logs
from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.workloads.classify import classify
from tests.builders import jwt
from tests.e2e.conftest import wait_for
from tests.e2e.knative_manifests import (
    NAMESPACE,
    Obj,
    container,
    environment,
    find,
    install_rbac,
    knative_service,
    pod_spec,
    render,
    service_account_token,
)
from tests.e2e.test_function_commands import Receiver, receiver  # noqa: F401 - shared fixture
from tests.handlers.test_score_nodes import args, usage

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        bool(images.missing_tools()),
        reason=f"images need {', '.join(images.missing_tools())} (hack/install-packages.sh)",
    ),
]


@pytest.fixture(scope="module")
def built() -> None:
    # Always through the build: an archive left from older code would test that code. With
    # nothing changed, buildah's layer cache and the unchanged archives make this quick.
    images.build(list(FUNCTIONS))


@pytest.fixture(scope="module")
def manifests() -> list[Obj]:
    return render()


@pytest.fixture(scope="module")
def webhook_secret(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files of the Secret mutate-admission-tls, as a Secret volume shows them: tls.crt,
    tls.key and ca.crt, readable by the container's user (a Secret's defaultMode is 0644)."""
    made = tmp_path_factory.mktemp("tls-made")
    ca, crt, key = make_tls(made)
    secret = tmp_path_factory.mktemp("tls-secret")
    for source, name in ((ca, "ca.crt"), (crt, "tls.crt"), (key, "tls.key")):
        shutil.copyfile(source, secret / name)
        (secret / name).chmod(0o644)
    secret.chmod(0o755)
    return secret


@dataclass
class Started:
    function: str
    port: int
    container: images.Container
    ca: Path | None

    def request(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        if self.ca is None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        else:
            # The certificate is for 127.0.0.1, verified against the Secret's CA.
            context = ssl.create_default_context(cafile=str(self.ca))
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=30)
        try:
            conn.request(method, path, body=body, headers=dict(headers or {}))
            response = conn.getresponse()
            return (
                response.status,
                {k.lower(): v for k, v in response.getheaders()},
                response.read(),
            )
        finally:
            conn.close()


def volume_files(manifests: list[Obj], volume: Obj, webhook_secret: Path, directory: Path) -> Path:
    """The files a volume of a function's pod shows: the webhook's Secret, a ConfigMap of
    knative/ written out key by key (a ConfigMap volume's files are world-readable too), or a
    projected ServiceAccount token, here a JWT of that shape for its audience (only the Broker
    it is sent to would check it)."""
    if "secret" in volume:
        assert volume["secret"]["secretName"] == "mutate-admission-tls", volume
        return webhook_secret
    if "projected" in volume:
        directory.mkdir(mode=0o755)
        for source in volume["projected"]["sources"]:
            token = source["serviceAccountToken"]
            minted = jwt(aud=[token["audience"]], exp=time.time() + token["expirationSeconds"])
            (directory / token["path"]).write_text(minted)
            (directory / token["path"]).chmod(0o644)
        return directory
    config_map = find(manifests, "ConfigMap", volume["configMap"]["name"])
    directory.mkdir(mode=0o755)
    for key, value in config_map["data"].items():
        (directory / key).write_text(value)
        (directory / key).chmod(0o644)
    return directory


# Where the kubelet mounts a pod's ServiceAccount token, and the client library looks for it.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass
class InCluster:
    """What a pod of the function gets to reach the API server: its ServiceAccount's token,
    the cluster's CA and its namespace as files, and KUBERNETES_SERVICE_HOST/PORT (here the
    local API server on loopback: the container shares the host's network)."""

    files: Path
    env: dict[str, str]


class Starter:
    def __init__(
        self,
        stack: contextlib.ExitStack,
        manifests: list[Obj],
        webhook_secret: Path,
        tmp_path: Path,
    ) -> None:
        self.stack = stack
        self.manifests = manifests
        self.webhook_secret = webhook_secret
        self.tmp_path = tmp_path

    def __call__(
        self,
        function: str,
        *,
        in_cluster: InCluster | None = None,
        overrides: Mapping[str, str] | None = None,
    ) -> Started:
        manifests, webhook_secret, tmp_path = self.manifests, self.webhook_secret, self.tmp_path
        ksvc = knative_service(manifests, function)
        spec, c = pod_spec(ksvc), container(ksvc)
        context = {**(spec.get("securityContext") or {}), **(c.get("securityContext") or {})}
        image = images.load(function)
        if context.get("runAsNonRoot"):
            # The kubelet refuses to start a root user, and needs a number to tell.
            user = context.get("runAsUser") or images.image_user(image).split(":")[0]
            assert str(user).isdigit() and int(user) != 0, f"{function}: user {user!r}"
        port = free_port()
        env = {
            **environment(manifests, ksvc),
            "PORT": str(port),
            "HOST": "127.0.0.1",
            **(overrides or {}),
        }
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts: dict[Path, str] = {}
        for mount in c.get("volumeMounts") or []:
            files = volume_files(
                manifests, volumes[mount["name"]], webhook_secret, tmp_path / mount["name"]
            )
            mounts[files] = mount["mountPath"]
        if in_cluster is not None:
            mounts[in_cluster.files] = SERVICE_ACCOUNT_DIR
            env.update(in_cluster.env)
        running = self.stack.enter_context(
            images.run_image(image, env, security_context=context, mounts=mounts)
        )
        ca = webhook_secret / "ca.crt" if webhook_secret in mounts else None
        started = Started(function, port, running, ca)

        def answers() -> bool:
            try:
                if started.request("GET", "/metrics")[0] == 200:
                    return True
            except OSError:
                pass
            assert running.running(), f"{function} exited:\n{running.logs()}"
            return False

        wait_for(f"{function} to answer", answers, 60, every=0.1, seen=running.logs)
        return started


@pytest.fixture
def start(
    built: None, manifests: list[Obj], webhook_secret: Path, tmp_path: Path
) -> Iterator[Starter]:
    with contextlib.ExitStack() as stack:
        yield Starter(stack, manifests, webhook_secret, tmp_path)


@pytest.fixture(scope="module")
def service_account(
    cluster: Any, manifests: list[Obj], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], InCluster]:
    """The in-cluster credentials of the function's own ServiceAccount, with knative/'s RBAC
    installed in the local control plane."""
    install_rbac(cluster.kubeconfig, manifests)
    api = cluster.api_client()
    host, port = cluster.server.removeprefix("https://").rsplit(":", 1)

    def credentials(account: str) -> InCluster:
        files = tmp_path_factory.mktemp(f"sa-{account}")
        (files / "token").write_text(service_account_token(api, account))
        shutil.copyfile(cluster.ca_file, files / "ca.crt")
        (files / "namespace").write_text(NAMESPACE)
        # A projected token volume's files are readable by the container's user.
        for f in files.iterdir():
            f.chmod(0o644)
        files.chmod(0o755)
        return InCluster(files, {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port})

    return credentials


def cloudevent(event_type: str, data: Any) -> tuple[dict[str, str], bytes]:
    return {
        "ce-specversion": "1.0",
        "ce-id": str(uuid.uuid4()),
        "ce-source": "https://kube-apiserver.example",
        "ce-type": event_type,
        "content-type": "application/json",
    }, json.dumps(data).encode()


def metric_samples(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` carrying ``labels`` in a /metrics page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_detect_failures_image_replies_to_an_oom_killed_pods_event_with_a_failing_pod_event(
    start: Starter,
) -> None:
    fn = start("detect-failures")
    headers, body = images.pod_event(oom_killed=True)
    status, reply_headers, reply = fn.request("POST", "/", body, headers)
    assert status == 200, reply
    assert reply_headers["ce-type"] == EVENT_POD_FAILING
    sent = json.loads(body)
    data = json.loads(reply)
    assert (data["uid"], data["node"], data["reason"]) == (
        sent["metadata"]["uid"],
        "node-7",
        "OOMKilled",
    )


def test_mutate_admission_image_answers_an_admission_review_over_tls_from_its_secret(
    start: Starter,
) -> None:
    fn = start("mutate-admission")
    uid = str(uuid.uuid4())
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            # A bare pod with no owner and no policy: nothing to read, nothing to stamp.
            "object": {
                "metadata": {"name": "scratch", "namespace": "shop"},
                "spec": {"containers": [{"name": "app", "image": "shop/web:1"}]},
            },
        },
    }
    status, _, body = fn.request(
        "POST", "/", json.dumps(review).encode(), {"content-type": "application/json"}
    )
    assert status == 200, body
    answer = json.loads(body)
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == uid
    assert answer["response"]["allowed"] is True
    assert "patch" not in answer["response"]
    assert (
        metric_samples(fn.request("GET", "/metrics")[2].decode(), "knr_webhook_admissions_total")
        == 1
    )


def test_score_nodes_image_filters_the_nodes_of_a_schedulers_request_by_their_usage(
    start: Starter,
) -> None:
    fn = start("score-nodes")
    body = json.dumps(args(node_0=usage(92), node_1=usage(20))).encode()
    status, _, answer = fn.request(
        "POST", "/scheduler/filter", body, {"content-type": "application/json"}
    )
    assert status == 200, answer
    result = json.loads(answer)
    assert result["NodeNames"] == ["node-1"]
    assert result["FailedAndUnresolvableNodes"] == {"node-0": "node CPU usage over 80 percent"}


# The functions whose every answer needs the API server (or Prometheus) behind it: here they
# are asked what they answer from the request alone, a POST that is not a CloudEvent. The 400
# and the event counted under the function's own name come from the function's module (its
# FUNCTION, events.serve), loaded with its settings from the Service's environment.
NEEDS_THE_CLUSTER = (
    "update-annotations",
    "sweep-failures",
    "assess-nodes",
    "label-nodes",
    "annotate-usage",
    "rebalance-nodes",
)


@pytest.mark.parametrize("function", NEEDS_THE_CLUSTER)
def test_image_refuses_a_post_that_is_not_a_cloudevent_as_its_function(
    start: Starter, function: str
) -> None:
    fn = start(function)
    status, _, body = fn.request("POST", "/", b"{}", {"content-type": "application/json"})
    assert status == 400, body
    assert "error" in json.loads(body)
    page = fn.request("GET", "/metrics")[2].decode()
    counted = metric_samples(
        page, "knr_events_received_total", function=function, type="malformed", outcome="400"
    )
    assert counted == 1, page


@pytest.mark.usefixtures("built")
def test_each_image_says_the_version_it_was_built_as_in_its_label_and_its_environment() -> None:
    # hack/build-image.sh's default tag, which make's TAG (git describe) replaces.
    image = images.load("detect-failures")
    out = subprocess.run(
        [
            *("podman", "image", "inspect", "--format"),
            '{{index .Labels "org.opencontainers.image.version"}} {{.Config.Env}}',
            image,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    label, env = out.split(" ", 1)
    assert label == image.rsplit(":", 1)[1] == "dev"
    assert f"{logs.VERSION_ENV}=dev" in env


def test_every_function_has_an_image_test() -> None:
    covered = {"detect-failures", "mutate-admission", "score-nodes", *NEEDS_THE_CLUSTER}
    assert covered == set(FUNCTIONS)


# -- on the local control plane, with the function's own ServiceAccount -------------------------


def test_sweep_failures_image_sends_the_failing_pod_it_lists_to_k_sink_on_a_ping(
    cluster: Any,
    start: Starter,
    service_account: Callable[[str], InCluster],
    receiver: Receiver,  # noqa: F811 - the fixture imported above
    faults: Callable[..., None],
    namespace: str,
) -> None:
    # A pod that its node OOM-kills, as the webhook would have stamped it.
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
    fn = start(
        "sweep-failures",
        in_cluster=service_account("sweep-failures"),
        overrides={"K_SINK": receiver.url},
    )
    # The PingSource's tick, with the data and content type of knative/sources.yaml.
    ping = find(start.manifests, "PingSource", "sweep-failures")["spec"]
    headers, _ = cloudevent("dev.knative.sources.ping", None)
    headers["content-type"] = ping["contentType"]
    status, _, body = fn.request("POST", "/", ping["data"].encode(), headers)
    assert status == 202, body
    sent = [
        (h, json.loads(b))
        for h, b in receiver.received
        if h.get("ce-subject") == f"namespaces/{namespace}/pods/{name}"
    ]
    assert len(sent) == 1, f"expected one event for {name}: {receiver.received}"
    headers, data = sent[0]
    assert headers["ce-type"] == EVENT_POD_FAILING
    assert (data["node"], data["reason"]) == (node, "OOMKilled")
    # Its own token for the Broker, read where the manifest mounts it in the image.
    token = (start.tmp_path / "sink-token" / "token").read_text()
    assert headers["authorization"] == f"Bearer {token}"


def test_update_annotations_image_reads_the_failing_pod_through_its_own_service_account(
    start: Starter, service_account: Callable[[str], InCluster]
) -> None:
    fn = start("update-annotations", in_cluster=service_account("update-annotations"))
    # A failing pod that does not exist: its ServiceAccount may read pods, finds none, and the
    # answer is plain success (RBAC refusing the read, or no credentials, would be a 500).
    # An OOM-killed pod of a namespace that does not exist in the cluster.
    pod = json.loads(images.pod_event(oom_killed=True)[1])
    failure = classify(pod, Config())  # type: ignore[arg-type]
    assert failure is not None
    data = FailingPod.from_pod(pod, failure).to_data()  # type: ignore[arg-type]
    headers, body = cloudevent(EVENT_POD_FAILING, data)
    headers["ce-subject"] = f"namespaces/shop/pods/{pod['metadata']['name']}"
    status, _, answer = fn.request("POST", "/", body, headers)
    assert (status, answer) == (202, b"")
    page = fn.request("GET", "/metrics")[2].decode()
    assert (
        metric_samples(
            page, "knr_events_received_total", function="update-annotations", outcome="202"
        )
        == 1
    ), page
