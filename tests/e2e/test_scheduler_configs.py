"""The shipped KubeSchedulerConfigurations, loaded by the real kube-scheduler.

kube-scheduler decodes its --config strictly (its scheme's codec factory is built with
serializer.EnableStrict, cmd/kube-scheduler/app/options/configfile.go), validates it and
builds its profiles and extenders from it before it serves anything. So each shipped file, with
only the kubeconfig and the extender's address substituted for the local control plane, is
handed to the locally built kube-scheduler:

- with --write-config-to, which exits after building the scheduler and writes back the
  configuration as kube-scheduler understood it: every extender field we ship comes back with
  the value we wrote (a field it ignored would come back as its default);
- for real: it comes up healthy. The default scheduler's configuration runs with the control
  plane's own scheduler credentials (and stays a follower of the stock lease); the second
  scheduler's runs as the component's own ServiceAccount, with only the RBAC the component
  ships, takes its own lease and binds a pod that names it, with the extender unreachable
  (ignorable: an extender that is down never blocks scheduling);
- a misspelt field makes kube-scheduler refuse to start, which is what makes the first two
  meaningful.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from dev.localcluster.bins import ensure_bins
from dev.localcluster.procs import Proc
from dev.localcluster.rest import ApiError
from dev.stack.functions import free_port
from shared.api.keys import LOAD_AWARE_SCHEDULER_NAME
from tests.e2e.conftest import holds, wait_for
from tests.e2e.knative_manifests import (
    KNATIVE_DIR,
    NAMESPACE,
    Obj,
    apply,
    kubeconfig_for,
    kubectl,
    of_kind,
    service_account_token,
)

pytestmark = pytest.mark.e2e

DEFAULT_CONFIG = KNATIVE_DIR / "scheduler" / "kube-scheduler-config.yaml"
COMPONENT = KNATIVE_DIR / "components" / "load-aware-scheduler"
SECOND_CONFIG = COMPONENT / "kube-scheduler-config.yaml"
SCHEDULER_ACCOUNT = "load-aware-scheduler"
SHIPPED = {"default scheduler": DEFAULT_CONFIG, "second scheduler": SECOND_CONFIG}


def closed_url() -> str:
    """An address where nothing listens: every extender call fails at once."""
    return f"http://127.0.0.1:{free_port()}"


def for_local_cluster(shipped: Path, kubeconfig: Path, url: str) -> Obj:
    """The shipped configuration with the local kubeconfig and extender address; every other
    field, misspelt ones included, as shipped."""
    config: Obj = yaml.safe_load(shipped.read_text())
    config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
    (extender,) = config["extenders"]
    extender["urlPrefix"] = url
    return config


def write(config: Obj, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def scheduler_argv(config: Path, kubeconfig: Path, workdir: Path, port: int) -> list[str]:
    return [
        str(ensure_bins() / "kube-scheduler"),
        f"--config={config}",
        # Its secure port (health, metrics) authenticates and authorizes callers through the
        # API server, with these credentials (in a pod: its ServiceAccount's).
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'certs'}",
    ]


def load(config: Path, kubeconfig: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    """kube-scheduler decodes, validates and builds the configuration, writes it back as it
    understood it to workdir/effective.yaml, and exits."""
    argv = scheduler_argv(config, kubeconfig, workdir, free_port())
    argv.append(f"--write-config-to={workdir / 'effective.yaml'}")
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def healthy(port: int, proc: Proc) -> bool:
    """/livez and /readyz answer ok: what the component's probes ask (readyz: its informers
    synced, which needs every list and watch its account must be allowed)."""
    assert proc.alive(), f"kube-scheduler exited:\n{proc.log_tail(40)}"
    # Its serving certificate is self-signed; these paths need no credentials.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    for path in ("/livez", "/readyz"):
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}{path}", context=context, timeout=2
            ) as answer:
                if answer.status != 200 or answer.read() != b"ok":
                    return False
        except OSError:
            return False
    return True


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Any]:
    """A factory: kube-scheduler started with a configuration, healthy; stopped afterwards."""
    started: list[Proc] = []

    def start(config: Path, kubeconfig: Path) -> Proc:
        port = free_port()
        argv = scheduler_argv(config, kubeconfig, tmp_path, port)
        proc = Proc("kube-scheduler-under-test", argv, tmp_path / "kube-scheduler.log")
        started.append(proc)
        wait_for("kube-scheduler to be live and ready", lambda: healthy(port, proc), timeout=60)
        return proc

    yield start
    for proc in started:
        proc.stop(grace=10)


def _render_component(workdir: Path) -> list[Obj]:
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


@pytest.fixture(scope="module")
def scheduler_kubeconfig(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig of the second scheduler's ServiceAccount, with the component's RBAC (and
    nothing else) created for real."""
    workdir = tmp_path_factory.mktemp("second-scheduler")
    rendered = _render_component(workdir)
    namespace = [o for o in of_kind(rendered, "Namespace") if o["metadata"]["name"] == NAMESPACE]
    rbac = [
        o
        for o in of_kind(rendered, "ServiceAccount", "Role", "RoleBinding", "ClusterRoleBinding")
        if o["metadata"]["labels"].get("app.kubernetes.io/name") == SCHEDULER_ACCOUNT
    ]
    done = apply(cluster.kubeconfig, namespace + rbac, "--server-side", "--force-conflicts")
    assert done.returncode == 0, done.stderr
    token = service_account_token(cluster.api_client(), SCHEDULER_ACCOUNT)
    return kubeconfig_for(cluster.server, cluster.ca_file, token, workdir / "kubeconfig")


def _control_plane_kubeconfig(cluster: Any) -> Path:
    """The credentials the local control plane's own kube-scheduler runs with."""
    path = Path(cluster.workdir) / "scheduler.kubeconfig"
    assert path.is_file(), path
    return path


@pytest.fixture
def second_lease(cluster: Any) -> Iterator[str]:
    """The second scheduler's lease path; removed afterwards, so that a later scheduler of the
    session does not wait out a lease nobody renews."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LOAD_AWARE_SCHEDULER_NAME}"
    yield path
    try:
        cluster.rest.delete(path)
    except ApiError as err:
        if err.status != 404:
            raise


# -- what kube-scheduler understands of each file -----------------------------------------------


@pytest.mark.parametrize("which", SHIPPED)
def test_kube_scheduler_reads_every_extender_field_as_shipped(
    cluster: Any, tmp_path: Path, which: str
) -> None:
    shipped = SHIPPED[which]
    kubeconfig = _control_plane_kubeconfig(cluster)
    url = closed_url()
    config = write(for_local_cluster(shipped, kubeconfig, url), tmp_path / "config.yaml")
    done = load(config, kubeconfig, tmp_path)
    assert done.returncode == 0, f"kube-scheduler refused {shipped.name}:\n{done.stderr[-3000:]}"
    effective = yaml.safe_load((tmp_path / "effective.yaml").read_text())
    wanted = yaml.safe_load(shipped.read_text())
    assert [p["schedulerName"] for p in effective["profiles"]] == [
        p["schedulerName"] for p in wanted["profiles"]
    ]
    (extender,) = effective["extenders"]
    (shipped_extender,) = wanted["extenders"]
    assert extender["urlPrefix"] == url
    for field, value in shipped_extender.items():
        if field != "urlPrefix":
            assert extender.get(field, False) == value, f"{field}: {extender.get(field)!r}"
    # What every configuration we ship must say.
    assert extender["ignorable"] is True
    # Names only: score-nodes looks them up in its node cache (functions/score-nodes).
    assert extender["nodeCacheCapable"] is True
    assert (extender["filterVerb"], extender["prioritizeVerb"]) == ("filter", "prioritize")
    assert extender["weight"] >= 1
    for field in ("resourceName", "resourceNamespace"):
        if field in wanted["leaderElection"]:
            assert effective["leaderElection"][field] == wanted["leaderElection"][field]


@pytest.mark.parametrize("which", SHIPPED)
@pytest.mark.parametrize(
    ("where", "right", "wrong"),
    [
        ("extenders", "nodeCacheCapable", "nodeCacheCapabel"),
        ("extenders", "httpTimeout", "httpTimout"),
        ("profiles", "schedulerName", "schedulername"),
    ],
)
def test_kube_scheduler_refuses_a_misspelt_field(
    cluster: Any, tmp_path: Path, which: str, where: str, right: str, wrong: str
) -> None:
    kubeconfig = _control_plane_kubeconfig(cluster)
    config = for_local_cluster(SHIPPED[which], kubeconfig, closed_url())
    entry = config[where][0]
    entry[wrong] = entry.pop(right)
    done = load(write(config, tmp_path / "config.yaml"), kubeconfig, tmp_path)
    assert done.returncode != 0, f"kube-scheduler accepted {wrong}"
    assert "unknown field" in done.stderr and wrong in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "effective.yaml").exists()


# -- running ------------------------------------------------------------------------------------


def test_the_default_schedulers_configuration_comes_up_healthy(
    cluster: Any, tmp_path: Path, running: Any
) -> None:
    kubeconfig = _control_plane_kubeconfig(cluster)
    config = write(for_local_cluster(DEFAULT_CONFIG, kubeconfig, closed_url()), tmp_path / "c.yaml")
    proc = running(config, kubeconfig)
    # It keeps running (a candidate for the stock lease the cluster's scheduler holds, so it
    # schedules nothing here) and has nothing to complain about.
    holds("the scheduler running", proc.alive, 2, seen=lambda: proc.log_tail(40))
    log = proc.log_path.read_text()
    assert "forbidden" not in log.lower(), log[-3000:]


def test_the_second_scheduler_runs_as_its_own_account_and_places_pods_with_the_extender_down(
    cluster: Any,
    tmp_path: Path,
    running: Any,
    scheduler_kubeconfig: Path,
    second_lease: str,
    namespace: str,
) -> None:
    url = closed_url()
    config = for_local_cluster(SECOND_CONFIG, scheduler_kubeconfig, url)
    proc = running(write(config, tmp_path / "c.yaml"), scheduler_kubeconfig)

    # It leads on its own lease (the Role of the component lets it renew only that one).
    def holder() -> str:
        try:
            lease = cluster.rest.get(second_lease)
        except ApiError:
            return ""
        return str(lease.get("spec", {}).get("holderIdentity") or "")

    wait_for("the second scheduler to take its lease", holder, timeout=60)

    # A pod that names it is placed by it, though no extender answers (ignorable).
    pods = k8s.CoreV1Api(cluster.api_client())
    pods.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "placed-by-load-aware"},
            "spec": {
                "schedulerName": LOAD_AWARE_SCHEDULER_NAME,
                "containers": [{"name": "c", "image": "registry.example/app:1"}],
            },
        },
    )

    def bound() -> str:
        pod = pods.read_namespaced_pod("placed-by-load-aware", namespace)
        return str(pod.spec.node_name or "")

    node = wait_for("the pod to be bound by the second scheduler", bound, timeout=60)
    assert node
    # The binding is the second scheduler's: only it runs a profile of that name, and its
    # Scheduled Event says so (Events are sent in batches: wait for it).
    events_api = k8s.EventsV1Api(cluster.api_client())

    def scheduled_by() -> list[str]:
        events = events_api.list_namespaced_event(namespace).items
        return [e.reporting_controller for e in events if e.reason == "Scheduled"]

    assert wait_for("the Scheduled Event", scheduled_by, timeout=30) == [LOAD_AWARE_SCHEDULER_NAME]
    # It called the extender's filter, which failed, and went on without it.
    log = proc.log_path.read_text()
    assert "Skipping extender as it returned error and has ignorable flag set" in log, log[-3000:]
    assert f"{url}/filter" in log
    # Its account sufficed for all of it (informers, lease, binding, Events, authentication).
    assert "forbidden" not in log.lower(), log[-3000:]
