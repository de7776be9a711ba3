"""The Knative packaging in knative/: what it renders to, and that a real API server with
Knative's own CRDs accepts every object of it.

The first tests read the rendered manifests (kustomize) and check the contracts between them:
the webhook registration against the local one in dev/stack/webhook.py, the ClusterIP Service
against the webhook's container port, the config against the webhook's namespaceSelector, the
alerts and the dashboard against the metrics the functions export. The last tests install the
real Knative CRDs into the local control plane and apply everything with a server-side dry run
and strict field validation, so that a field Knative's schemas do not know is an error.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from prometheus_client import Counter, Gauge, Histogram

from dev.stack import webhook as local_webhook
from dev.stack.functions import FUNCTIONS
from shared.api.keys import OPT_OUT_LABEL, OPTED_IN_LABEL
from shared.nodes.annotate_usage import handler as annotator
from shared.nodes.rebalance_nodes import handler as rebalancer
from shared.nodes.score_nodes import handler as extender_http
from shared.platform import metrics
from shared.platform.config import Config
from shared.platform.senders import audience_of
from tests.e2e.conftest import wait_for
from tests.e2e.knative_manifests import (
    COMPONENTS,
    KNATIVE_CRDS,
    KNATIVE_DIR,
    KSVC,
    NAMESPACE,
    REPO_ROOT,
    Obj,
    apply,
    container,
    environment,
    find,
    knative_service,
    of_kind,
    pod_spec,
    render,
    render_opt_in,
    selected,
)
from tests.e2e.pod_security import restricted_violations

pytestmark = pytest.mark.e2e

WEBHOOK_SERVICE = "mutate-admission-webhook"
# The extender's address for a scheduler without cluster DNS (knative/score-nodes.yaml).
EXTENDER_SERVICE = "score-nodes-extender"
CERT_MANAGER_KINDS = ("Issuer", "Certificate")
MIN_SCALE = "autoscaling.knative.dev/min-scale"
MONITORING_KINDS = ("PodMonitor", "PrometheusRule")


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return render()


@pytest.fixture(scope="module")
def with_cert_manager(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return render("cert-manager", workdir=tmp_path_factory.mktemp("overlay-cm"))


@pytest.fixture(scope="module")
def with_webhook_deployment(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return render("webhook-deployment", workdir=tmp_path_factory.mktemp("overlay-wd"))


@pytest.fixture(scope="module")
def with_monitoring(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return render("monitoring", workdir=tmp_path_factory.mktemp("overlay-mon"))


# The order docs/install-hardening.md asks for: client-auth after what it patches.
CLIENT_AUTH_ALL = ("webhook-deployment", "monitoring", "webhook-client-auth")
API_SERVER_CIDR = "10.0.0.0/24"
SET_CIDR = {
    "target": {"kind": "NetworkPolicy", "name": "mutate-admission-from-api-server"},
    "patch": yaml.safe_dump(
        [{"op": "replace", "path": "/spec/ingress/0/from/0/ipBlock/cidr", "value": API_SERVER_CIDR}]
    ),
}


@pytest.fixture(scope="module")
def with_client_auth(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return render("webhook-client-auth", workdir=tmp_path_factory.mktemp("overlay-ca"))


@pytest.fixture(scope="module")
def with_client_auth_everywhere(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return render(*CLIENT_AUTH_ALL, workdir=tmp_path_factory.mktemp("overlay-ca-all"))


@pytest.fixture(scope="module")
def with_network_policy(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return render(
        "webhook-network-policy",
        workdir=tmp_path_factory.mktemp("overlay-np"),
        patches=[SET_CIDR],
    )


def names(objs: list[Obj], kind: str) -> set[str]:
    return {o["metadata"]["name"] for o in of_kind(objs, kind)}


# -- what the base is made of -----------------------------------------------------------------


def test_the_base_holds_everything_an_install_needs_and_nothing_that_needs_other_crds(
    base: list[Obj],
) -> None:
    assert names(base, "Namespace") == {NAMESPACE}
    assert names(base, "ServiceAccount") == {*FUNCTIONS, "pod-events-source"}
    assert {o["metadata"]["name"] for o in base if o["apiVersion"] == KSVC} == {
        *FUNCTIONS,
        "dead-letters",
    }
    assert names(base, "Broker") == {"default"}
    assert names(base, "ApiServerSource") == {"pod-events"}
    assert names(base, "PingSource") == {
        "sweep-failures",
        "assess-nodes",
        "label-nodes",
        "annotate-usage",
        "rebalance-nodes",
    }
    assert {WEBHOOK_SERVICE, EXTENDER_SERVICE} <= {
        o["metadata"]["name"] for o in base if o["apiVersion"] == "v1"
    }
    assert names(base, "MutatingWebhookConfiguration") == {local_webhook.NAME}
    # What RBAC cannot fence, the API server does by default (tests/e2e/test_node_writes.py).
    policies = {"kn-rescheduler-state-writes-only", "kn-rescheduler-node-writes"}
    assert names(base, "ValidatingAdmissionPolicy") == policies
    assert names(base, "ValidatingAdmissionPolicyBinding") == policies
    assert not of_kind(base, *CERT_MANAGER_KINDS, *MONITORING_KINDS)
    namespaced = [o for o in base if o["kind"] not in _CLUSTER_SCOPED]
    assert all(o["metadata"].get("namespace") == NAMESPACE for o in namespaced)


def test_the_node_policy_fences_the_pressure_label_label_nodes_is_configured_to_write(
    base: list[Obj],
) -> None:
    (policy,) = (
        o
        for o in of_kind(base, "ValidatingAdmissionPolicy")
        if o["metadata"]["name"] == "kn-rescheduler-node-writes"
    )
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    configured = Config.from_env(environment(base, knative_service(base, "label-nodes")))
    key = configured.pressure_label.partition("=")[0]
    assert variables["pressureLabel"] == repr(key)
    # Every account that RBAC lets patch or update Nodes is one the policy matches.
    writers = {
        rule_role["metadata"]["name"]
        for rule_role in of_kind(base, "ClusterRole")
        for rule in rule_role.get("rules", [])
        if "nodes" in rule.get("resources", []) and {"patch", "update"} & set(rule["verbs"])
    }
    accounts = {
        subject["name"]
        for binding in of_kind(base, "ClusterRoleBinding")
        if binding["roleRef"]["name"] in writers
        for subject in binding["subjects"]
    }
    assert {"assess-nodes", "label-nodes", "annotate-usage", "update-annotations"} <= accounts
    matched = policy["spec"]["matchConditions"][0]["expression"]
    for account in accounts:
        assert f"'system:serviceaccount:{NAMESPACE}:{account}'" in matched


_CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "PriorityClass",
}


@pytest.mark.parametrize("function", FUNCTIONS)
def test_every_function_is_a_cluster_local_knative_service_with_bounded_resources(
    base: list[Obj], function: str
) -> None:
    ksvc = knative_service(base, function)
    assert ksvc["metadata"]["labels"]["networking.knative.dev/visibility"] == "cluster-local"
    spec = pod_spec(ksvc)
    assert spec["serviceAccountName"] == function
    assert spec["containerConcurrency"] >= 1
    c = container(ksvc)
    assert c["image"] == f"kn-rescheduler/{function}"
    (port,) = c["ports"]
    # Probes over HTTP, answered by a request thread: a stuck worker is taken out and replaced.
    # Not the webhook as a Knative Service: queue-proxy would probe its TLS port in plain HTTP
    # (its Deployment, components/webhook-deployment, probes /healthz over HTTPS).
    if function == "mutate-admission":
        assert c["readinessProbe"]["tcpSocket"]["port"] == port["containerPort"]
    else:
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/healthz", "port": port["containerPort"]}
        liveness = c["livenessProbe"]
        assert liveness["failureThreshold"] * liveness["periodSeconds"] >= 60
    for section in ("requests", "limits"):
        assert set(c["resources"][section]) == {"cpu", "memory"}
    assert c["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    annotations = ksvc["spec"]["template"]["metadata"]["annotations"]
    assert "autoscaling.knative.dev/min-scale" in annotations
    # The settings every function reads, from the generated, content-named ConfigMap.
    env = environment(base, ksvc)
    assert Config.from_env(env).namespace == NAMESPACE
    # An explicit route to the latest Revision, so `kubectl apply` ends a rollback.
    assert ksvc["spec"]["traffic"] == [{"latestRevision": True, "percent": 100}]


def test_the_webhook_never_scales_to_zero(base: list[Obj]) -> None:
    ksvc = knative_service(base, "mutate-admission")
    annotations = ksvc["spec"]["template"]["metadata"]["annotations"]
    # Two: a drained or restarting pod leaves the other answering (knative/availability.yaml).
    assert annotations["autoscaling.knative.dev/min-scale"] == "2"


@pytest.mark.parametrize("function", ["mutate-admission", "score-nodes"])
def test_the_webhook_and_the_extender_survive_a_drain_in_every_flavour(
    base: list[Obj], tmp_path_factory: pytest.TempPathFactory, function: str
) -> None:
    (budget,) = (
        o for o in of_kind(base, "PodDisruptionBudget") if o["metadata"]["name"] == function
    )
    assert budget["spec"]["minAvailable"] == 1
    selector = budget["spec"]["selector"]["matchLabels"]
    # A Revision's pods (the default)...
    ksvc = knative_service(base, function)
    assert selector.items() <= ksvc["spec"]["template"]["metadata"]["labels"].items()
    assert int(ksvc["spec"]["template"]["metadata"]["annotations"][MIN_SCALE]) >= 2
    # ...and a Deployment's, without Serving (the webhook's from webhook-deployment, which it
    # includes): two replicas, spread over nodes, at our priority class, never preempting.
    plain = render("without-serving", workdir=tmp_path_factory.mktemp(f"overlay-ws-{function}"))
    (deployment,) = (o for o in of_kind(plain, "Deployment") if o["metadata"]["name"] == function)
    assert deployment["spec"]["replicas"] == 2
    template = deployment["spec"]["template"]
    assert selector.items() <= template["metadata"]["labels"].items()
    assert template["spec"]["priorityClassName"] == "kn-rescheduler-critical"
    (spread,) = template["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    (priority,) = of_kind(base, "PriorityClass")
    assert priority["metadata"]["name"] == "kn-rescheduler-critical"
    assert priority["preemptionPolicy"] == "Never"
    assert priority["globalDefault"] is False


# score-nodes had none either until its node cache (it lists and watches Nodes: test_rbac).
@pytest.mark.parametrize("function", ["detect-failures"])
def test_the_pure_functions_get_no_api_credentials(base: list[Obj], function: str) -> None:
    # The ServiceAccount mounts no token, and the pod does not ask for one.
    assert find(base, "ServiceAccount", function)["automountServiceAccountToken"] is False
    spec = pod_spec(knative_service(base, function))
    assert spec.get("automountServiceAccountToken", False) is False
    # ... and no role is bound to it.
    bound = {
        s["name"]
        for b in of_kind(base, "ClusterRoleBinding", "RoleBinding")
        for s in b.get("subjects") or []
    }
    assert function not in bound


def test_sweep_failures_is_called_every_five_minutes_and_sends_to_the_broker(
    base: list[Obj],
) -> None:
    ping = find(base, "PingSource", "sweep-failures")
    assert ping["spec"]["schedule"] == "*/5 * * * *"
    assert ping["spec"]["sink"]["ref"] == {
        "apiVersion": KSVC,
        "kind": "Service",
        "name": "sweep-failures",
    }
    sink = environment(base, knative_service(base, "sweep-failures"))["K_SINK"]
    assert sink.endswith(f"/{NAMESPACE}/default")


def test_assess_nodes_hears_every_failure_report_and_ticks_every_minute(base: list[Obj]) -> None:
    trigger = find(base, "Trigger", "assess-nodes")
    (types,) = trigger["spec"]["filters"]
    assert {f["exact"]["type"] for f in types["any"]} == {
        "io.kn-rescheduler.pod.failing",
        "io.kn-rescheduler.pod.rescheduled",
        "io.kn-rescheduler.pod.exhausted",
    }
    assert trigger["spec"]["subscriber"]["ref"]["name"] == "assess-nodes"
    ping = find(base, "PingSource", "assess-nodes")
    assert ping["spec"]["schedule"] == "* * * * *"
    assert ping["spec"]["sink"]["ref"]["name"] == "assess-nodes"


def test_the_pod_event_source_watches_opted_in_pods_in_every_namespace_into_the_broker(
    base: list[Obj],
) -> None:
    spec = find(base, "ApiServerSource", "pod-events")["spec"]
    assert spec["mode"] == "Resource"
    assert spec["namespaceSelector"] == {}
    assert spec["resources"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "selector": {"matchLabels": {OPTED_IN_LABEL: "true"}},
        }
    ]
    assert spec["serviceAccountName"] == "pod-events-source"
    assert spec["sink"]["ref"]["kind"] == "Broker"
    assert spec["sink"]["ref"]["name"] == find(base, "Broker", "default")["metadata"]["name"]


# -- the webhook: registration, reachability, certificate ---------------------------------------


def test_the_webhook_registration_is_the_local_one_reached_through_the_clusterip_service(
    base: list[Obj], tmp_path: Path
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("not used")
    local = local_webhook.configuration("https://127.0.0.1:1/", ca)["webhooks"]
    shipped = copy.deepcopy(find(base, "MutatingWebhookConfiguration", local_webhook.NAME))
    # Pods, then Jobs being created (the ignore-disruptions rule).
    assert [hook["name"] for hook in shipped["webhooks"]] == [
        "pods.kn-rescheduler.io",
        "jobs.kn-rescheduler.io",
    ]
    assert len(local) == len(shipped["webhooks"])
    for hook, ours in zip(shipped["webhooks"], local, strict=True):
        client = hook.pop("clientConfig")
        ours.pop("clientConfig")
        assert hook == ours
        assert client == {
            "service": {"name": WEBHOOK_SERVICE, "namespace": NAMESPACE, "port": 443, "path": "/"}
        }
        assert hook["failurePolicy"] == "Ignore"
        assert hook["objectSelector"]["matchExpressions"] == [
            {"key": OPT_OUT_LABEL, "operator": "DoesNotExist"}
        ]
    assert shipped["webhooks"][1]["rules"][0]["resources"] == ["jobs"]


def test_the_clusterip_service_targets_the_tls_port_of_the_webhook_pods(base: list[Obj]) -> None:
    service = find(base, "Service", WEBHOOK_SERVICE, "v1")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == {"serving.knative.dev/service": "mutate-admission"}
    (port,) = service["spec"]["ports"]
    ksvc = knative_service(base, "mutate-admission")
    assert port["port"] == 443
    assert port["targetPort"] == container(ksvc)["ports"][0]["containerPort"]


def test_the_webhook_serves_tls_from_the_mounted_secret(base: list[Obj]) -> None:
    ksvc = knative_service(base, "mutate-admission")
    env = environment(base, ksvc)
    (mount,) = container(ksvc)["volumeMounts"]
    assert mount["readOnly"] is True
    assert env["TLS_CERT_FILE"] == f"{mount['mountPath']}/tls.crt"
    assert env["TLS_KEY_FILE"] == f"{mount['mountPath']}/tls.key"
    (volume,) = pod_spec(ksvc)["volumes"]
    assert volume["name"] == mount["name"]
    assert volume["secret"]["secretName"] == "mutate-admission-tls"


def test_the_webhook_answers_within_its_timeout(base: list[Obj]) -> None:
    hook = find(base, "MutatingWebhookConfiguration", local_webhook.NAME)["webhooks"][0]
    config = Config.from_env(environment(base, knative_service(base, "mutate-admission")))
    # At most two owner lookups per pod, each bounded by api_timeout.
    assert 2 * config.api_timeout_seconds < hook["timeoutSeconds"] <= 10


def test_the_namespaces_the_webhook_skips_are_the_ones_the_functions_exclude(
    base: list[Obj],
) -> None:
    hook = find(base, "MutatingWebhookConfiguration", local_webhook.NAME)["webhooks"][0]
    (expression,) = hook["namespaceSelector"]["matchExpressions"]
    assert expression["operator"] == "NotIn"
    for function in FUNCTIONS:
        config = Config.from_env(environment(base, knative_service(base, function)))
        assert set(expression["values"]) == config.excluded_namespaces | {config.namespace}


def test_cert_manager_issues_the_mounted_secret_for_the_service_name_and_injects_its_ca(
    with_cert_manager: list[Obj],
) -> None:
    hook = find(with_cert_manager, "MutatingWebhookConfiguration", local_webhook.NAME)
    injected = hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    namespace, name = injected.split("/")
    certificate = find(with_cert_manager, "Certificate", name)
    assert namespace == certificate["metadata"]["namespace"] == NAMESPACE
    ksvc = knative_service(with_cert_manager, "mutate-admission")
    assert certificate["spec"]["secretName"] == pod_spec(ksvc)["volumes"][0]["secret"]["secretName"]
    assert f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    issuer = find(with_cert_manager, "Issuer", certificate["spec"]["issuerRef"]["name"])
    ca = find(with_cert_manager, "Certificate", "kn-rescheduler-webhook-ca")
    assert issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    assert ca["spec"]["isCA"] is True


def test_the_webhook_deployment_variant_runs_the_same_container_behind_the_same_service(
    base: list[Obj], with_webhook_deployment: list[Obj]
) -> None:
    variant = with_webhook_deployment
    assert "mutate-admission" not in {
        o["metadata"]["name"] for o in variant if o["apiVersion"] == KSVC
    }
    deployment = find(variant, "Deployment", "mutate-admission")
    ksvc = knative_service(base, "mutate-admission")
    knative_env = environment(base, ksvc)
    deployment_env = environment(variant, deployment)
    port = container(ksvc)["ports"][0]["containerPort"]
    assert deployment_env == {**knative_env, "PORT": str(port)}
    for field in ("image", "volumeMounts", "resources", "securityContext"):
        assert container(deployment)[field] == container(ksvc)[field]
    assert pod_spec(deployment)["volumes"] == pod_spec(ksvc)["volumes"]
    assert pod_spec(deployment)["serviceAccountName"] == "mutate-admission"
    service = find(variant, "Service", WEBHOOK_SERVICE, "v1")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert (
        service["spec"]["ports"][0]["targetPort"]
        == container(deployment)["ports"][0]["containerPort"]
    )


# -- webhook hardening: client certificates, network policy -------------------------------------


def _client_ca_file(objs: list[Obj], workload: Obj) -> str:
    """Where TLS_CLIENT_CA_FILE points, checked to be the ca.crt of the mounted client CA."""
    env = environment(objs, workload)
    mounts = {m["name"]: m for m in container(workload)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    assert mounts["client-ca"]["readOnly"] is True
    assert volumes["client-ca"]["secret"]["secretName"] == "mutate-admission-client-ca"
    assert env["TLS_CLIENT_CA_FILE"] == f"{mounts['client-ca']['mountPath']}/ca.crt"
    # The serving pair is still there: client certificates only come on top of TLS.
    assert env["TLS_CERT_FILE"] and env["TLS_KEY_FILE"]
    return env["TLS_CLIENT_CA_FILE"]


def test_the_base_does_not_require_client_certificates(base: list[Obj]) -> None:
    ksvc = knative_service(base, "mutate-admission")
    assert "TLS_CLIENT_CA_FILE" not in environment(base, ksvc)


def test_client_auth_makes_the_webhook_require_certificates_from_the_mounted_ca(
    with_client_auth: list[Obj], with_client_auth_everywhere: list[Obj]
) -> None:
    _client_ca_file(with_client_auth, knative_service(with_client_auth, "mutate-admission"))
    variant = with_client_auth_everywhere
    _client_ca_file(variant, find(variant, "Deployment", "mutate-admission"))
    # The kubelet's probes present no client certificate: TCP, not HTTPS.
    probes = container(find(variant, "Deployment", "mutate-admission"))
    assert probes["readinessProbe"]["tcpSocket"] == {"port": "user-port"}
    assert probes["livenessProbe"]["tcpSocket"] == {"port": "user-port"}
    # Prometheus presents a client certificate to scrape the webhook.
    (endpoint,) = find(variant, "PodMonitor", "kn-rescheduler-webhook")["spec"][
        "podMetricsEndpoints"
    ]
    assert endpoint["tlsConfig"]["cert"]["secret"]["name"] == "mutate-admission-metrics-client"
    assert endpoint["tlsConfig"]["keySecret"]["name"] == "mutate-admission-metrics-client"
    # The other functions are untouched.
    for function in ("detect-failures", "update-annotations", "sweep-failures"):
        ksvc = knative_service(with_client_auth, function)
        assert "TLS_CLIENT_CA_FILE" not in environment(with_client_auth, ksvc)


@pytest.mark.parametrize("later", ["webhook-deployment", "without-serving"])
def test_client_auth_listed_before_the_webhook_deployment_is_refused_not_dropped(
    later: str, tmp_path: Path
) -> None:
    # kustomize applies components in order: listed first, client-auth would patch the Knative
    # Service that webhook-deployment then deletes, and the Deployment would serve without
    # client certificates. The render fails instead of dropping it silently.
    with pytest.raises(AssertionError, match="/spec/template/spec/volumes"):
        render("webhook-client-auth", later, workdir=tmp_path / "overlay")
    # In the order docs/install-hardening.md gives, it renders and the Deployment requires
    # certificates.
    variant = render(later, "webhook-client-auth", workdir=tmp_path / "ordered")
    _client_ca_file(variant, find(variant, "Deployment", "mutate-admission"))


VARIANTS = {
    "base": (),
    "webhook-deployment": ("webhook-deployment",),
    "without-serving": ("without-serving",),
    "client-auth": CLIENT_AUTH_ALL,
    "load-aware-scheduler": ("load-aware-scheduler",),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_pod_we_install_passes_the_restricted_pod_security_profile(
    variant: str, tmp_path: Path
) -> None:
    objs = (
        render(*VARIANTS[variant], workdir=tmp_path / "overlay")
        if VARIANTS[variant]
        else (render())
    )
    (namespace,) = [o for o in of_kind(objs, "Namespace") if o["metadata"]["name"] == NAMESPACE]
    labels = namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    templates = [o for o in objs if "template" in (o.get("spec") or {})]
    templates = [o for o in templates if "spec" in o["spec"]["template"]]
    assert templates
    for obj in templates:
        if obj["metadata"].get("namespace") != NAMESPACE:
            continue
        problems = restricted_violations(pod_spec(obj))
        assert not problems, f"{obj['kind']} {obj['metadata']['name']}: {problems}"


def container_images(obj: Any) -> list[str]:
    """Every container's and init container's image anywhere in ``obj`` (pod templates of any
    kind, pods, Knative Services)."""
    found: list[str] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                found += [c["image"] for c in value if isinstance(c, dict) and "image" in c]
            else:
                found += container_images(value)
    elif isinstance(obj, list):
        for item in obj:
            found += container_images(item)
    return found


@pytest.mark.parametrize("component", [None, *COMPONENTS])
def test_every_image_not_built_here_is_named_by_its_digest(
    component: str | None, tmp_path: Path
) -> None:
    # A tag is whatever its registry serves that day; a digest is one image (docs/security.md).
    # Ours (kn-rescheduler/FN) are pinned by the deploy targets, to the digest they pushed.
    objs = render(component, workdir=tmp_path / "overlay") if component else render()
    images = container_images(objs)
    others = [i for i in images if not i.startswith("kn-rescheduler/")]
    assert len(images) > len(others) > 0  # the functions', and at least the dead-letter sink's
    unpinned = [i for i in others if not re.search(r"@sha256:[0-9a-f]{64}$", i)]
    assert not unpinned, f"named by tag only: {unpinned}"


def test_the_network_policy_admits_only_the_api_server_to_the_webhook_port(
    base: list[Obj], with_network_policy: list[Obj], with_webhook_deployment: list[Obj]
) -> None:
    policy = find(with_network_policy, "NetworkPolicy", "mutate-admission-from-api-server")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    # It selects the webhook's pods in both variants, and nothing else.
    ksvc_labels = knative_service(base, "mutate-admission")["spec"]["template"]["metadata"][
        "labels"
    ]
    deployment = find(with_webhook_deployment, "Deployment", "mutate-admission")
    assert selector.items() <= ksvc_labels.items()
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    for function in ("detect-failures", "update-annotations", "sweep-failures"):
        labels = {"app.kubernetes.io/name": function, "app.kubernetes.io/component": "function"}
        assert not selector.items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    webhook_port = container(knative_service(base, "mutate-admission"))["ports"][0]
    to_webhook, to_queue_proxy = policy["spec"]["ingress"]
    assert to_webhook["from"] == [{"ipBlock": {"cidr": API_SERVER_CIDR}}]
    assert [p["port"] for p in to_webhook["ports"]] == [webhook_port["containerPort"]]
    assert "from" not in to_queue_proxy
    assert webhook_port["containerPort"] not in {p["port"] for p in to_queue_proxy["ports"]}


def selected_by(policy: Obj, labels: dict[str, str]) -> bool:
    """Whether a NetworkPolicy's podSelector selects a pod with ``labels`` (the two forms the
    shipped policies use: matchLabels and In expressions)."""
    selector = policy["spec"]["podSelector"]
    if not (selector.get("matchLabels") or {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions") or []:
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def pod_labels(objs: list[Obj]) -> dict[str, dict[str, str]]:
    """Workload name -> its pods' labels, for every pod template in our namespace."""
    return {
        o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"]
        for o in objs
        if o["metadata"].get("namespace") == NAMESPACE
        and "spec" in ((o.get("spec") or {}).get("template") or {})
    }


def event_receivers(objs: list[Obj]) -> set[str]:
    """Every Service that Knative delivers to: Triggers' subscribers, sources' sinks, and the
    Broker's and Triggers' dead-letter sinks."""
    refs = []
    for o in objs:
        spec = o.get("spec") or {}
        refs += [spec.get("subscriber"), spec.get("sink")]
        refs.append((spec.get("delivery") or {}).get("deadLetterSink"))
    return {r["ref"]["name"] for r in refs if r and "ref" in r and r["ref"]["kind"] == "Service"}


@pytest.mark.parametrize("variant", ["knative-serving", "without-serving"])
def test_the_functions_knative_delivers_to_take_connections_from_knatives_namespaces_only(
    variant: str, base: list[Obj], tmp_path: Path
) -> None:
    objs = base if variant == "knative-serving" else render(variant, workdir=tmp_path)
    policy = find(objs, "NetworkPolicy", "event-functions-from-knative")
    pods = pod_labels(objs)
    receivers = event_receivers(objs)
    assert {"detect-failures", "update-annotations", "sweep-failures", "dead-letters"} <= receivers
    # Every pod Knative delivers to is isolated by it; the webhook and the extender, which the
    # API server and a scheduler call from addresses we cannot name, are not.
    assert {n for n, labels in pods.items() if selected_by(policy, labels)} == receivers
    assert not selected_by(policy, pods["mutate-admission"])
    assert not selected_by(policy, pods["score-nodes"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert set(source) == {"namespaceSelector"}  # whole namespaces, not pods or addresses
    (expression,) = source["namespaceSelector"]["matchExpressions"]
    # The label the API server sets from the namespace's name, which nobody can change.
    assert expression["key"] == "kubernetes.io/metadata.name"
    assert expression["operator"] == "In"
    assert NAMESPACE not in expression["values"]
    if variant == "without-serving":
        # Only Eventing delivers: a namespace named as Serving's would be let in for nothing.
        assert expression["values"] == ["knative-eventing"]
    else:
        assert {"knative-eventing", "knative-serving"} <= set(expression["values"])
    assert "ports" not in rule  # queue-proxy's ports with Serving, the function's without


def test_prometheus_may_scrape_the_isolated_functions_and_isolates_nothing_else(
    base: list[Obj], with_monitoring: list[Obj]
) -> None:
    policy = find(with_monitoring, "NetworkPolicy", "functions-metrics-from-prometheus")
    isolated = find(base, "NetworkPolicy", "event-functions-from-knative")
    pods = pod_labels(with_monitoring)
    scraped = {n for n, labels in pods.items() if selected_by(policy, labels)}
    assert scraped == {n for n, labels in pods.items() if selected_by(isolated, labels)} - {
        "dead-letters"
    }
    assert not scraped & {"mutate-admission", "score-nodes"}
    (rule,) = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [
        container(knative_service(base, "detect-failures"))["ports"][0]["containerPort"]
    ]


def test_with_sender_authentication_only_our_namespaces_identities_may_send_to_the_broker(
    base: list[Obj], tmp_path: Path
) -> None:
    objs = render("sender-authentication", workdir=tmp_path)
    policy = find(objs, "EventPolicy", "broker-senders")
    assert policy["apiVersion"] == "eventing.knative.dev/v1alpha1"
    assert policy["metadata"]["namespace"] == NAMESPACE
    (to,) = policy["spec"]["to"]
    broker = find(base, "Broker", "default")
    assert to["ref"] == {
        "apiVersion": broker["apiVersion"],
        "kind": "Broker",
        "name": broker["metadata"]["name"],
    }
    # Subjects only, and only ours: a trailing * is the one wildcard Eventing matches.
    assert policy["spec"]["from"] == [{"sub": f"system:serviceaccount:{NAMESPACE}:*"}]
    # sweep-failures, the one function posting to the Broker, sends a token for its audience.
    sweep = container(knative_service(objs, "sweep-failures"))
    (mount,) = sweep["volumeMounts"]
    assert mount["mountPath"] == "/var/run/secrets/kn-rescheduler/sink"
    assert container(knative_service(base, "sweep-failures"))["volumeMounts"] == [mount]
    assert names(base, "EventPolicy") == set()  # EventPolicy needs Eventing 1.15: opt-in


# -- bare pods: the per-namespace opt-in -------------------------------------------------------


def test_the_bare_pod_opt_in_is_one_rolebinding_in_the_namespace_that_opts_in(
    base: list[Obj], tmp_path: Path
) -> None:
    (binding,) = render_opt_in("shop", tmp_path)
    assert binding["kind"] == "RoleBinding"
    assert binding["metadata"]["namespace"] == "shop"
    role = find(base, "ClusterRole", binding["roleRef"]["name"])
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "patch"]}
    ]
    # kustomize's namespace transformer must not move the subject into the user's namespace.
    (subject,) = binding["subjects"]
    assert (subject["name"], subject["namespace"]) == ("update-annotations", NAMESPACE)
    assert find(base, "ServiceAccount", subject["name"])["metadata"]["namespace"] == NAMESPACE


# -- per-function deploys ---------------------------------------------------------------------


@pytest.mark.parametrize("function", FUNCTIONS)
def test_a_per_function_deploy_selects_that_function_and_its_config_only(
    base: list[Obj], with_webhook_deployment: list[Obj], function: str
) -> None:
    # The selectors hack/deploy.mk applies with.
    selector = {"app.kubernetes.io/name": function, "app.kubernetes.io/component": "function"}
    chosen = selected(base, selector)
    (picked,) = [o for o in chosen if o["apiVersion"] == KSVC]
    assert picked["metadata"]["name"] == function
    # Besides its Service, only a ConfigMap of its own may go with it (label-nodes' rules).
    assert all(
        o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(function)
        for o in chosen
        if o is not picked
    )
    (config,) = selected(base, {"app.kubernetes.io/component": "config"})
    assert config["kind"] == "ConfigMap"
    if function == "mutate-admission":
        (deployment,) = selected(with_webhook_deployment, selector)
        assert deployment["kind"] == "Deployment"


# -- observability ------------------------------------------------------------------------------

# Every series name the functions export, with the labels it carries: the shared families and
# those of the load-aware functions (annotate-usage, score-nodes, rebalance-nodes).
_SUFFIXES = {Counter: ("_total",), Histogram: ("_bucket", "_sum", "_count"), Gauge: ("",)}


def _exported() -> dict[str, set[str]]:
    series: dict[str, set[str]] = {}
    families = [
        metrics.EVENTS,
        metrics.LATENCY,
        metrics.FAILURES,
        metrics.DECISIONS,
        metrics.WEBHOOK,
    ]
    for module in (annotator, extender_http, rebalancer):
        families += [v for v in vars(module).values() if isinstance(v, Counter | Histogram | Gauge)]
    for family in families:
        for cls, suffixes in _SUFFIXES.items():
            if isinstance(family, cls):
                for suffix in suffixes:
                    labels = set(family._labelnames)
                    if suffix == "_bucket":
                        labels.add("le")
                    series[family._name + suffix] = labels
    return series


_SELECTOR = re.compile(r"\b(knr_[a-z_]+)(?:\{([^}]*)\})?")
_MATCHER = re.compile(r'(\w+)\s*(?:=~|!~|!=|=)\s*"')


def _check_expression(expr: str, exported: dict[str, set[str]]) -> set[str]:
    used = set()
    for name, selector in _SELECTOR.findall(expr):
        assert name in exported, f"{name} is not exported by shared/platform/metrics.py ({expr})"
        for label in _MATCHER.findall(selector or ""):
            assert label in exported[name], f"{name} has no label {label} ({expr})"
        used.add(name)
    return used


def test_the_alerts_use_only_metrics_and_labels_the_functions_export(
    with_monitoring: list[Obj],
) -> None:
    exported = _exported()
    (rule,) = of_kind(with_monitoring, "PrometheusRule")
    alerts = {}
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            alerts[r["alert"]] = _check_expression(r["expr"], exported)
            assert r["labels"]["severity"] in {"info", "warning", "critical"}
            assert r["annotations"]["summary"] and r["annotations"]["description"]
    # The three things an operator must hear about.
    assert "knr_events_received_total" in alerts["KnReschedulerDeliveriesFailing"]
    assert "knr_decisions_total" in alerts["KnReschedulerRetryBudgetExhausted"]
    assert "knr_webhook_admissions_total" in alerts["KnReschedulerWebhookErrors"]


def test_the_monitoring_scrapes_the_port_knative_names_user_port(
    with_monitoring: list[Obj],
) -> None:
    monitors = of_kind(with_monitoring, "PodMonitor")
    assert {e["port"] for m in monitors for e in m["spec"]["podMetricsEndpoints"]} == {"user-port"}
    webhook = find(with_monitoring, "PodMonitor", "kn-rescheduler-webhook")
    (endpoint,) = webhook["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["serverName"] == f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc"


def test_the_dashboard_is_grafana_json_on_exported_metrics_only() -> None:
    dashboard = json.loads((REPO_ROOT / "docs" / "grafana-dashboard.json").read_text())
    exported = _exported()
    used: set[str] = set()
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            used |= _check_expression(target["expr"], exported)
    families = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
    assert {
        "knr_events_received_total",
        "knr_decisions_total",
        "knr_webhook_admissions_total",
        "knr_failures_detected_total",
        "knr_handler_seconds",
    } <= families


# -- a real API server with Knative's CRDs accepts all of it -----------------------------------


def _crd_documents() -> list[Obj]:
    docs = []
    for path in sorted(KNATIVE_CRDS.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return [d for d in docs if d.get("kind") == "CustomResourceDefinition"]


def _established(api: k8s.ApiextensionsV1Api, name: str) -> bool:
    crd = api.read_custom_resource_definition(name)
    return any(
        c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])
    )


@pytest.fixture(scope="module")
def knative_crds(cluster: Any) -> Iterator[list[str]]:
    """Knative's real CRDs installed in the local API server (left installed: other tests of
    the session may use them too)."""
    if not KNATIVE_CRDS.is_dir():
        pytest.skip(f"the Knative CRDs are not beside the repository ({KNATIVE_CRDS} is absent)")
    api = k8s.ApiextensionsV1Api(cluster.api_client())
    installed = []
    for crd in _crd_documents():
        name = crd["metadata"]["name"]
        try:
            api.create_custom_resource_definition(crd)
        except k8s.ApiException as exc:
            if exc.status == 409:
                pass  # already there (another test of the session installed it)
            elif exc.status == 422 and "conversion" in (exc.body or ""):
                # The conversion webhook (in knative-eventing) does not exist here, and objects
                # at the storage version need no conversion.
                stripped = copy.deepcopy(crd)
                stripped["spec"]["conversion"] = {"strategy": "None"}
                api.create_custom_resource_definition(stripped)
            else:
                raise
        installed.append(name)
    wait_for(
        "every CRD Established",
        lambda: [n for n in installed if not _established(api, n)] == [],
        timeout=60,
        every=0.2,
        seen=lambda: [n for n in installed if not _established(api, n)],
    )
    yield installed


@pytest.fixture(scope="module")
def project_namespace(cluster: Any, base: list[Obj]) -> str:
    """The namespace, for real: a dry run of a namespaced object needs it to exist."""
    done = apply(cluster.kubeconfig, [find(base, "Namespace", NAMESPACE)])
    assert done.returncode == 0, done.stderr
    return NAMESPACE


def _dry_run(cluster: Any, objs: list[Obj]) -> subprocess.CompletedProcess[str]:
    return apply(cluster.kubeconfig, objs, "--dry-run=server", "--validate=strict")


def _accepted(done: subprocess.CompletedProcess[str], objs: list[Obj]) -> None:
    assert done.returncode == 0, f"the API server refused:\n{done.stderr}"
    lines = done.stdout.splitlines()
    assert len(lines) == len(objs), done.stdout
    assert all(line.endswith("(server dry run)") for line in lines), done.stdout


def test_knatives_crds_and_the_core_api_accept_every_object_of_the_base(
    cluster: Any, knative_crds: list[str], project_namespace: str, base: list[Obj]
) -> None:
    assert {"services.serving.knative.dev", "apiserversources.sources.knative.dev"} <= set(
        knative_crds
    )
    _accepted(_dry_run(cluster, base), base)


@pytest.mark.usefixtures("knative_crds", "project_namespace")
def test_the_webhook_deployment_variant_is_accepted_too(
    cluster: Any, with_webhook_deployment: list[Obj]
) -> None:
    _accepted(_dry_run(cluster, with_webhook_deployment), with_webhook_deployment)


@pytest.mark.usefixtures("knative_crds", "project_namespace")
def test_the_cert_manager_variant_is_accepted_apart_from_cert_managers_own_kinds(
    cluster: Any, with_cert_manager: list[Obj]
) -> None:
    # cert-manager's CRDs are not available here; its Issuers and Certificates are checked
    # above for what they say, the rest (the annotated webhook configuration) here.
    ours = [o for o in with_cert_manager if o["kind"] not in CERT_MANAGER_KINDS]
    _accepted(_dry_run(cluster, ours), ours)


@pytest.mark.usefixtures("knative_crds", "project_namespace")
def test_the_client_auth_variants_are_accepted_apart_from_prometheus_operator_kinds(
    cluster: Any, with_client_auth: list[Obj], with_client_auth_everywhere: list[Obj]
) -> None:
    _accepted(_dry_run(cluster, with_client_auth), with_client_auth)
    ours = [o for o in with_client_auth_everywhere if o["kind"] not in MONITORING_KINDS]
    _accepted(_dry_run(cluster, ours), ours)


@pytest.mark.usefixtures("knative_crds", "project_namespace")
def test_the_network_policy_is_accepted_once_its_cidr_is_set_and_refused_before(
    cluster: Any, with_network_policy: list[Obj], tmp_path: Path
) -> None:
    _accepted(_dry_run(cluster, with_network_policy), with_network_policy)
    unset = render("webhook-network-policy", workdir=tmp_path)
    policy = find(unset, "NetworkPolicy", "mutate-admission-from-api-server")
    done = _dry_run(cluster, [policy])
    assert done.returncode != 0, "the placeholder CIDR was accepted"
    assert "cidr" in done.stderr


def test_the_bare_pod_opt_in_is_accepted_in_an_existing_namespace(
    cluster: Any, tmp_path: Path
) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "opt-in-check"}}
    assert apply(cluster.kubeconfig, [namespace]).returncode == 0
    opt_in = render_opt_in("opt-in-check", tmp_path)
    _accepted(_dry_run(cluster, opt_in), opt_in)


@pytest.mark.parametrize(
    ("what", "path", "value"),
    [
        ("an unknown container field", ("containers", 0, "imagePullPolice"), "Always"),
        ("a concurrency that is not a number", ("containerConcurrency",), "eight"),
    ],
)
@pytest.mark.usefixtures("knative_crds", "project_namespace")
def test_the_dry_run_does_refuse_what_knatives_schema_does_not_allow(
    cluster: Any, base: list[Obj], what: str, path: tuple[Any, ...], value: Any
) -> None:
    broken = copy.deepcopy(knative_service(base, "detect-failures"))
    target: Any = pod_spec(broken)
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    done = _dry_run(cluster, [broken])
    assert done.returncode != 0, f"{what} was accepted"
    assert str(path[-1]) in done.stderr


def test_the_manifests_live_where_kubectl_apply_k_expects_them() -> None:
    assert (KNATIVE_DIR / "kustomization.yaml").is_file()
    kustomization = yaml.safe_load((KNATIVE_DIR / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (KNATIVE_DIR / resource).is_file(), resource


def test_the_dead_letter_sink_runs_without_a_service_account_token(base: list[Obj]) -> None:
    # Knative's event_display reads nothing from the API; a token in it would only be a
    # credential for whoever gets code into the pod.
    assert pod_spec(knative_service(base, "dead-letters"))["automountServiceAccountToken"] is False


def test_every_delivery_to_a_function_names_the_audience_the_function_checks(
    base: list[Obj],
) -> None:
    destinations = [(o["kind"], o["spec"]["subscriber"]) for o in of_kind(base, "Trigger")] + [
        (o["kind"], o["spec"]["sink"]) for o in of_kind(base, "PingSource")
    ]
    to_functions = [(k, d) for k, d in destinations if d["ref"]["name"] in FUNCTIONS]
    assert len(to_functions) >= 7
    for kind, destination in to_functions:
        assert destination["audience"] == audience_of(destination["ref"]["name"]), kind


def test_sender_authentication_requires_tokens_and_may_only_review_them(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    objs = render("sender-authentication", workdir=tmp_path_factory.mktemp("overlay-sa"))
    (config,) = (
        o
        for o in of_kind(objs, "ConfigMap")
        if o["metadata"]["name"].startswith("kn-rescheduler-config")
    )
    assert config["data"]["KN_RESCHEDULER_SENDER_AUTH"] == "require"
    assert Config.from_env(config["data"]).sender_auth == "require"
    (role,) = (
        o
        for o in of_kind(objs, "ClusterRole")
        if o["metadata"]["name"] == "kn-rescheduler-sender-authentication"
    )
    assert role["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    ]
    (binding,) = (
        o
        for o in of_kind(objs, "ClusterRoleBinding")
        if o["metadata"]["name"] == "kn-rescheduler-sender-authentication"
    )
    bound = {s["name"] for s in binding["subjects"]}
    assert bound == set(FUNCTIONS) - {"mutate-admission", "score-nodes"}
    # Every Knative Service that reads the settings reads the merged ConfigMap.
    for ksvc in (o for o in objs if o["apiVersion"] == KSVC and o["metadata"]["name"] in bound):
        assert Config.from_env(environment(objs, ksvc)).sender_auth == "require"
