"""knative/annotate-usage.yaml and knative/score-nodes.yaml, rendered as ``kubectl apply -k
knative/`` renders them, and the second scheduler of knative/components/load-aware-scheduler.

annotate-usage is one pod always up, ticked every 30 s, with the Prometheus it reads and the
settings it starts with; score-nodes, on the scheduling path, never scales to zero, answers
within what the schedulers wait, and is reachable without cluster DNS through a plain ClusterIP
Service on the pods' own port. The component mounts the shipped scheduler configuration where
its command reads it and runs the kube-scheduler of the cluster's version. Knative's own CRDs
and the core API accept every object (server-side dry run, strict field validation). What each
account may do is checked in test_rbac.py; that kube-scheduler accepts the configurations, in
test_scheduler_configs.py.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from shared.api.keys import LOAD_AWARE_SCHEDULER_NAME
from shared.api.times import parse_duration
from shared.platform.config import USAGE_SOURCE_PROMETHEUS, Config
from tests.e2e.knative_manifests import (
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
    kubectl,
    pod_spec,
    render,
)
from tests.e2e.test_manifests import knative_crds  # noqa: F401 - the shared fixture

pytestmark = pytest.mark.e2e

ANNOTATE = "annotate-usage"
SCORE = "score-nodes"
SCHEDULER = "load-aware-scheduler"
COMPONENT = KNATIVE_DIR / "components" / SCHEDULER
DEFAULT_SCHEDULER_CONFIG = KNATIVE_DIR / "scheduler" / "kube-scheduler-config.yaml"
SECOND_SCHEDULER_CONFIG = COMPONENT / "kube-scheduler-config.yaml"


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return render()


@pytest.fixture(scope="module")
def with_scheduler(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    """The base plus the component, through an overlay as a user writes one."""
    workdir = tmp_path_factory.mktemp("overlay-las")
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(KNATIVE_DIR, workdir)],
        "components": [os.path.relpath(COMPONENT, workdir)],
    }
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    done = subprocess.run(
        [str(kubectl()), "kustomize", str(workdir)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def named(objs: list[Obj], name: str) -> list[Obj]:
    return [
        o for o in objs if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == name
    ]


def annotations(ksvc: Obj) -> dict[str, str]:
    found: dict[str, str] = ksvc["spec"]["template"]["metadata"]["annotations"]
    return found


def shipped_timeouts() -> list[float]:
    """The extender httpTimeout of every shipped scheduler configuration, in seconds."""
    timeouts = []
    for path in (DEFAULT_SCHEDULER_CONFIG, SECOND_SCHEDULER_CONFIG):
        (extender,) = yaml.safe_load(path.read_text())["extenders"]
        timeouts.append(parse_duration(extender["httpTimeout"]).total_seconds())
    return timeouts


# -- annotate-usage -----------------------------------------------------------------------------


def test_annotate_usage_is_one_pod_always_up(base: list[Obj]) -> None:
    ksvc = knative_service(base, ANNOTATE)
    # One evaluator (its patches assume it), never scaled to zero (/status is its memory).
    assert annotations(ksvc)["autoscaling.knative.dev/min-scale"] == "1"
    assert annotations(ksvc)["autoscaling.knative.dev/max-scale"] == "1"
    env = environment(base, ksvc)
    assert pod_spec(ksvc)["containerConcurrency"] == int(env["THREADS"])
    config = Config.from_env(env)
    # Prometheus by default, at the address the manifest names.
    assert config.usage_source == USAGE_SOURCE_PROMETHEUS
    assert config.prometheus_url.startswith("http://")
    # An evaluation must end before the next Ping is due to start one more.
    assert pod_spec(ksvc)["timeoutSeconds"] <= 60


def test_a_ping_every_30_seconds_goes_to_annotate_usage(base: list[Obj]) -> None:
    source = find(base, "PingSource", ANNOTATE)
    # Six fields: seconds first (Knative parses schedules with cron.SecondOptional).
    assert source["spec"]["schedule"] == "*/30 * * * * *"
    assert source["spec"]["sink"]["ref"] == {
        "apiVersion": KSVC,
        "kind": "Service",
        "name": ANNOTATE,
    }


def test_annotate_usages_objects_are_all_in_the_base_and_bound_to_its_own_account(
    base: list[Obj],
) -> None:
    assert sorted(o["kind"] for o in named(base, ANNOTATE)) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "PingSource",
        "Service",
        "ServiceAccount",
    ]
    binding = find(base, "ClusterRoleBinding", "kn-rescheduler-annotate-usage")
    assert binding["roleRef"]["name"] == "kn-rescheduler-annotate-usage"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": ANNOTATE, "namespace": NAMESPACE}
    ]


# -- score-nodes --------------------------------------------------------------------------------


def test_score_nodes_never_scales_to_zero_and_keeps_a_second_pod(base: list[Obj]) -> None:
    ksvc = knative_service(base, SCORE)
    assert int(annotations(ksvc)["autoscaling.knative.dev/min-scale"]) >= 2
    assert int(annotations(ksvc)["autoscaling.knative.dev/max-scale"]) >= 2
    assert pod_spec(ksvc)["containerConcurrency"] == int(environment(base, ksvc)["THREADS"])


def test_score_nodes_lets_the_scheduler_give_up_first(base: list[Obj]) -> None:
    ksvc = knative_service(base, SCORE)
    timeouts = shipped_timeouts()
    # The schedulers wait at most a couple of seconds per call; Knative's own limit is longer,
    # so a slow call ends on the scheduler's side (skipped: ignorable), never as a 504 first.
    assert all(0 < t <= 2 for t in timeouts)
    assert pod_spec(ksvc)["timeoutSeconds"] > max(timeouts)


def test_the_extender_service_reaches_the_function_pods_on_their_own_port(base: list[Obj]) -> None:
    service = find(base, "Service", "score-nodes-extender", "v1")
    assert service["spec"]["type"] == "ClusterIP"
    # The label Knative puts on every pod of every Revision of the Service.
    assert service["spec"]["selector"] == {"serving.knative.dev/service": SCORE}
    (port,) = service["spec"]["ports"]
    assert port["port"] == 80
    assert (
        port["targetPort"] == container(knative_service(base, SCORE))["ports"][0]["containerPort"]
    )
    # Not part of a per-function deploy (which applies component=function objects only).
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] != "function"


def test_the_shipped_default_scheduler_configuration_names_the_extender_service() -> None:
    text = DEFAULT_SCHEDULER_CONFIG.read_text()
    # The comment tells how to find the address the placeholder stands for.
    assert "get service score-nodes-extender -o jsonpath='{.spec.clusterIP}'" in text
    (extender,) = yaml.safe_load(text)["extenders"]
    assert re.fullmatch(r"http://[A-Z-]+", extender["urlPrefix"]), "a placeholder, not an address"


# -- the second scheduler -----------------------------------------------------------------------


def _cluster_version() -> str:
    """The Kubernetes version the local control plane is built from (hack/bins/go.mod)."""
    go_mod = (REPO_ROOT / "hack" / "bins" / "go.mod").read_text()
    match = re.search(r"^require k8s\.io/kubernetes (v[0-9.]+)$", go_mod, re.MULTILINE)
    assert match, "hack/bins/go.mod pins no k8s.io/kubernetes"
    return match.group(1)


def test_the_second_scheduler_runs_the_shipped_configuration_with_its_own_account(
    with_scheduler: list[Obj],
) -> None:
    deployment = find(with_scheduler, "Deployment", SCHEDULER)
    spec = pod_spec(deployment)
    assert spec["serviceAccountName"] == SCHEDULER
    assert find(with_scheduler, "ServiceAccount", SCHEDULER)["metadata"]["namespace"] == NAMESPACE
    c = container(deployment)
    # The cluster's version, pinned by digest (docs/security.md: every image we name by digest).
    name, _, digest = c["image"].partition("@")
    assert name == f"registry.k8s.io/kube-scheduler:{_cluster_version()}"
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), c["image"]
    (config_flag,) = [a for a in c["command"] if a.startswith("--config=")]
    config_path = PurePosixPath(config_flag.removeprefix("--config="))
    (mount,) = c["volumeMounts"]
    assert str(config_path.parent) == mount["mountPath"] and mount["readOnly"] is True
    (volume,) = spec["volumes"]
    assert volume["name"] == mount["name"]
    # The generated, content-named ConfigMap holds the file of the repository, byte for byte.
    config_map = find(with_scheduler, "ConfigMap", volume["configMap"]["name"])
    assert config_map["data"][config_path.name] == SECOND_SCHEDULER_CONFIG.read_text()
    config = yaml.safe_load(SECOND_SCHEDULER_CONFIG.read_text())
    assert [p["schedulerName"] for p in config["profiles"]] == [LOAD_AWARE_SCHEDULER_NAME]
    assert config["leaderElection"]["resourceNamespace"] == NAMESPACE
    assert config["leaderElection"]["resourceName"] == LOAD_AWARE_SCHEDULER_NAME
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == f"http://{SCORE}.{NAMESPACE}.svc.cluster.local"
    # Its health endpoints, on the port it serves them on.
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] == c["ports"][0]["containerPort"] == 10259
        assert c[probe]["httpGet"]["scheme"] == "HTTPS"


def test_the_component_adds_only_the_second_scheduler(
    base: list[Obj], with_scheduler: list[Obj]
) -> None:
    def key(o: Obj) -> tuple[str, str, str]:
        return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])

    added = {key(o) for o in with_scheduler} - {key(o) for o in base}
    assert added == {key(o) for o in named(with_scheduler, SCHEDULER)}
    for o in named(with_scheduler, SCHEDULER):
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "kn-rescheduler"
    assert len(with_scheduler) == len(base) + len(added)


# -- a real API server with Knative's CRDs accepts all of it -----------------------------------


def _accepted(cluster: Any, objs: list[Obj]) -> None:
    done = apply(cluster.kubeconfig, objs, "--dry-run=server", "--validate=strict")
    assert done.returncode == 0, f"the API server refused:\n{done.stderr}"
    lines = done.stdout.splitlines()
    assert len(lines) == len(objs) and all(line.endswith("(server dry run)") for line in lines)


@pytest.mark.usefixtures("knative_crds")
def test_knatives_crds_and_the_core_api_accept_the_new_functions_and_the_scheduler(
    cluster: Any, base: list[Obj], with_scheduler: list[Obj]
) -> None:
    namespace = find(base, "Namespace", NAMESPACE)
    assert apply(cluster.kubeconfig, [namespace]).returncode == 0
    objs = named(base, ANNOTATE) + named(base, SCORE) + named(with_scheduler, SCHEDULER)
    assert {o["kind"] for o in objs} >= {"Service", "PingSource", "Deployment", "RoleBinding"}
    _accepted(cluster, objs)


@pytest.mark.usefixtures("knative_crds")
def test_the_dry_run_does_refuse_a_misspelt_field_of_the_new_objects(
    cluster: Any, base: list[Obj], with_scheduler: list[Obj], tmp_path: Path
) -> None:
    ksvc = knative_service(base, SCORE)
    broken = yaml.safe_load(yaml.safe_dump(ksvc))
    pod_spec(broken)["automountServiceAccountTokn"] = False
    deployment = yaml.safe_load(yaml.safe_dump(find(with_scheduler, "Deployment", SCHEDULER)))
    container(deployment)["readinesProbe"] = container(deployment).pop("readinessProbe")
    for obj, field in ((broken, "automountServiceAccountTokn"), (deployment, "readinesProbe")):
        done = apply(cluster.kubeconfig, [obj], "--dry-run=server", "--validate=strict")
        assert done.returncode != 0, f"{field} was accepted"
        assert field in done.stderr
