"""kn-rescheduler installed with sender authentication on an Eventing whose OIDC is on.

Knative Eventing from its manifests on real nodes that enforce NetworkPolicies, its
``authentication-oidc`` feature turned on as a platform team turns it on (config-features),
then kn-rescheduler from knative/ with the without-serving and sender-authentication components
(``make deploy-all``). Every delivery carries a token Eventing mints for the sender's own
ServiceAccount; the Broker's ingress checks them against the component's EventPolicy, and each
function against its audience (shared/platform/senders.py).

Needs root, the real-node packages and the functions' images, as test_knative_installed.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.localcluster import knative
from dev.localcluster.cluster import Cluster
from dev.stack import installed as installed_rescheduler
from tests.e2e.conftest import kubectl, needs_real_nodes, real_cluster
from tests.e2e.test_cluster_network import SLEEPER, start_pod
from tests.e2e.test_knative_installed import (
    BROKEN,
    HEALTHY,
    SETTLE,
    SHOP,
    SYSTEM,
    broker_ingress_ip,
    is_ready,
    needy_deployment,
    pod_in,
    pods_in,
    ready,
)
from tests.e2e.test_real_nodes import eventually

pytestmark = [pytest.mark.e2e, needs_real_nodes, pytest.mark.real_nodes, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
WORK = ".local/e2e-install-oidc"
COMPONENTS = f"{installed_rescheduler.COMPONENT} sender-authentication"


BROKER_AUDIENCE = f"eventing.knative.dev/broker/{SYSTEM}/default"


def post_to_broker(c: Cluster, pod: str, token: str | None) -> str:
    """What the Broker's ingress answers a CloudEvent posted from ``pod`` of SHOP (wget prints
    the status line of an error answer)."""
    ingress = broker_ingress_ip(c)
    headers = [
        "Ce-Id: forged-1",
        "Ce-Specversion: 1.0",
        "Ce-Source: /forged",
        "Ce-Type: dev.knative.apiserver.resource.update",
        "Content-Type: application/json",
    ]
    if token is not None:
        headers.append(f"Authorization: Bearer {token}")
    command = ["timeout", "10", "wget", "-q", "-O-"]
    for header in headers:
        command += ["--header", header]
    command += ["--post-data", "{}", f"http://{ingress}/{SYSTEM}/default"]
    done = subprocess.run(
        [
            *(str(c.bins_dir / "kubectl"), f"--kubeconfig={c.kubeconfig}"),
            *("exec", "-n", SHOP, pod, "--", *command),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout + done.stderr


def oidc_identities(c: Cluster) -> dict[str, str | None]:
    """kind/name -> the OIDC ServiceAccount Eventing gave it, for our Triggers and sources."""
    out = kubectl(
        c,
        "get",
        "triggers,apiserversources,pingsources",
        "-n",
        SYSTEM,
        "-o",
        "jsonpath={range .items[*]}{.kind}/{.metadata.name}={.status.auth.serviceAccountName}"
        "{'\\n'}{end}",
    )
    return {k: (v or None) for k, v in (line.split("=", 1) for line in out.split())}


@pytest.fixture(scope="module")
def oidc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Real nodes enforcing NetworkPolicies, Knative Eventing with its authentication-oidc
    feature on, then kn-rescheduler with the sender-authentication component, by the commands
    docs/install-without-serving.md gives."""
    with real_cluster(tmp_path_factory.mktemp("oidc") / "cluster") as c:
        c.install_network_policies()
        c.install_knative_eventing()
        features = '{"data":{"authentication-oidc":"enabled"}}'
        kubectl(c, "patch", "configmap", "config-features", "-n", knative.NAMESPACE,
                "--type", "merge", "-p", features)  # fmt: skip
        try:
            installed_rescheduler.install(c, WORK, components=COMPONENTS)
            kubectl(c, "create", "namespace", SHOP)
            yield c
        finally:
            subprocess.run(["rm", "-rf", str(REPO / WORK)], check=False)


def test_with_knatives_oidc_on_the_broker_refuses_other_namespaces_and_a_pod_still_moves(
    oidc: Cluster,
) -> None:
    """With the sender-authentication component (its EventPolicy on the Broker, each function
    requiring Knative's token for its audience): a pod of another namespace is refused by the
    Broker's ingress, without a token (401) and with its own (403), and the whole pipeline (the
    ApiServerSource and sweep-failures posting to the Broker, the Triggers and PingSources
    delivering to the functions with their tokens) still moves a crash-looping pod."""
    c = oidc
    eventually(
        lambda: (ids := oidc_identities(c)) and all(ids.values()),
        "Eventing to give every Trigger and source of ours an OIDC identity",
        120,
        seen=lambda: oidc_identities(c),
    )
    eventually(lambda: ready(c, "broker", "default", SYSTEM), "the Broker Ready with OIDC", 120)
    if not any(p["metadata"]["name"] == "stranger" for p in pods_in(c, SHOP)):
        start_pod(c, "stranger", HEALTHY, SLEEPER, {}, namespace=SHOP)
    eventually(lambda: is_ready(pod_in(c, SHOP, "stranger")), "the stranger's pod to be ready")
    eventually(
        lambda: "401" in post_to_broker(c, "stranger", None),
        "the Broker's ingress to refuse a post without a token (401)",
        60,
        seen=lambda: post_to_broker(c, "stranger", None),
    )
    own = c.rest.post(
        f"/api/v1/namespaces/{SHOP}/serviceaccounts/default/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": [BROKER_AUDIENCE], "expirationSeconds": 600},
        },
    )["status"]["token"]
    answer = post_to_broker(c, "stranger", own)
    assert "403" in answer, answer

    c.set_fault(BROKEN, "app-crash")
    try:
        c.rest.post(f"/apis/apps/v1/namespaces/{SHOP}/deployments", needy_deployment("shop3"))

        def settled() -> bool:
            live = [p for p in pods_in(c, SHOP) if p["metadata"]["name"].startswith("shop3-")]
            return len(live) == 1 and is_ready(live[0]) and live[0]["spec"]["nodeName"] == HEALTHY

        try:
            eventually(settled, f"shop3's pod Ready on {HEALTHY} with OIDC on", SETTLE)
        except AssertionError as e:
            said = {
                d: kubectl(c, "logs", "-n", ns, f"deployment/{d}", "--tail=8", check=False)
                for ns, d in (
                    (SYSTEM, "detect-failures"),
                    (SYSTEM, "update-annotations"),
                    (knative.NAMESPACE, "mt-broker-ingress"),
                    (knative.NAMESPACE, "mt-broker-filter"),
                    (knative.NAMESPACE, "imc-dispatcher"),
                )
            }
            raise AssertionError(
                f"{e}\n" + "\n".join(f"--- {k}:\n{v}" for k, v in said.items())
            ) from e
    finally:
        c.set_fault(BROKEN, None)
    # Nothing of ours was refused on the way: no event of ours reached the dead-letter sink.
    dead = kubectl(c, "logs", "-n", SYSTEM, "deployment/dead-letters", check=False)
    assert "io.kn-rescheduler" not in dead, dead[-2000:]
