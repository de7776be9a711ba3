"""The manifests of ``knative/`` as kustomize renders them, for the packaging tests.

Rendering uses the kubectl of the cached control-plane binaries (``kubectl kustomize``), the
same kustomize a user runs with ``kubectl apply -k knative/``. Components are added through an
overlay written next to the test (kustomize refuses overlays inside their base and absolute
paths, hence the relative path back to the repository). ``render_opt_in`` renders the
per-namespace bare-pod opt-in (knative/bare-pod-replacement) as a user's overlay does.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import yaml
from kubernetes import client as k8s

from dev.localcluster.bins import ensure_bins
from shared.api.keys import DEFAULT_NAMESPACE

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
KNATIVE_DIR: Final = REPO_ROOT / "knative"
# The real Knative CRDs, in a folder beside the repository.
KNATIVE_CRDS: Final = REPO_ROOT.parent / "shared" / "knative-crds"
NAMESPACE: Final = DEFAULT_NAMESPACE
COMPONENTS: Final = {
    "cert-manager": KNATIVE_DIR / "components" / "cert-manager",
    "webhook-deployment": KNATIVE_DIR / "components" / "webhook-deployment",
    "monitoring": KNATIVE_DIR / "monitoring",
    "webhook-client-auth": KNATIVE_DIR / "components" / "webhook-client-auth",
    "webhook-network-policy": KNATIVE_DIR / "components" / "webhook-network-policy",
    "state-writes-only": KNATIVE_DIR / "components" / "state-writes-only",
    "without-serving": KNATIVE_DIR / "components" / "without-serving",
    "load-aware-scheduler": KNATIVE_DIR / "components" / "load-aware-scheduler",
    "sender-authentication": KNATIVE_DIR / "components" / "sender-authentication",
}
BARE_POD_OPT_IN: Final = KNATIVE_DIR / "bare-pod-replacement"
KSVC: Final = "serving.knative.dev/v1"

Obj = dict[str, Any]


@functools.cache
def kubectl() -> Path:
    return ensure_bins() / "kubectl"


def render(
    *components: str, workdir: Path | None = None, patches: list[Obj] | None = None
) -> list[Obj]:
    """``kubectl kustomize knative/`` (plus the named components, in that order, and the
    overlay's own ``patches``, through an overlay)."""
    target = KNATIVE_DIR
    if components or patches:
        if workdir is None:
            raise ValueError("components need a workdir for the overlay")
        workdir.mkdir(parents=True, exist_ok=True)
        overlay: Obj = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(KNATIVE_DIR, workdir)],
            "components": [os.path.relpath(COMPONENTS[c], workdir) for c in components],
        }
        if patches:
            overlay["patches"] = patches
        (workdir / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
        target = workdir
    return _kustomize(target)


def render_opt_in(namespace: str, workdir: Path) -> list[Obj]:
    """The bare-pod opt-in of one namespace, as docs/install-opt-in.md tells a user to write it."""
    workdir.mkdir(parents=True, exist_ok=True)
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": namespace,
        "resources": [os.path.relpath(BARE_POD_OPT_IN, workdir)],
    }
    (workdir / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    return _kustomize(workdir)


def _kustomize(target: Path) -> list[Obj]:
    done = subprocess.run(
        [str(kubectl()), "kustomize", str(target)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"kustomize failed on {target}:\n{done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def dump(objs: Iterable[Obj]) -> str:
    return yaml.safe_dump_all(list(objs), sort_keys=False)


def find(objs: Iterable[Obj], kind: str, name: str, api_version: str | None = None) -> Obj:
    matches = [
        o
        for o in objs
        if o["kind"] == kind
        and o["metadata"]["name"] == name
        and (api_version is None or o["apiVersion"] == api_version)
    ]
    if len(matches) != 1:
        raise AssertionError(f"expected one {kind} {name}, found {len(matches)}")
    return matches[0]


def of_kind(objs: Iterable[Obj], *kinds: str) -> list[Obj]:
    return [o for o in objs if o["kind"] in kinds]


def knative_service(objs: Iterable[Obj], name: str) -> Obj:
    return find(objs, "Service", name, KSVC)


def pod_spec(obj: Obj) -> Obj:
    """The pod spec of a Knative Service or a Deployment."""
    spec: Obj = obj["spec"]["template"]["spec"]
    return spec


def container(obj: Obj) -> Obj:
    containers = pod_spec(obj)["containers"]
    assert len(containers) == 1, "one container per function"
    only: Obj = containers[0]
    return only


def environment(objs: list[Obj], obj: Obj) -> dict[str, str]:
    """The container's environment as Kubernetes builds it: envFrom ConfigMaps first, then
    env (which wins)."""
    env: dict[str, str] = {}
    c = container(obj)
    for source in c.get("envFrom") or []:
        ref = source["configMapRef"]["name"]
        env.update(find(objs, "ConfigMap", ref)["data"])
    for var in c.get("env") or []:
        env[var["name"]] = var["value"]
    return env


def selected(objs: Iterable[Obj], selector: Mapping[str, str]) -> list[Obj]:
    """The objects ``kubectl apply -l k=v,...`` picks from a rendered file."""
    return [
        o
        for o in objs
        if all((o["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
    ]


def apply(kubeconfig: Path, objs: Iterable[Obj], *extra: str) -> subprocess.CompletedProcess[str]:
    """``kubectl apply`` the objects (``extra``: e.g. --dry-run=server)."""
    return subprocess.run(
        [str(kubectl()), "--kubeconfig", str(kubeconfig), "apply", *extra, "-f", "-"],
        input=dump(objs),
        capture_output=True,
        text=True,
        check=False,
    )


def install_rbac(kubeconfig: Path, objs: list[Obj]) -> None:
    """The namespace, ServiceAccounts, ClusterRoles and bindings of the manifests, for real.
    Idempotent (several test modules share the session's cluster)."""
    wanted = of_kind(objs, "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    done = apply(kubeconfig, wanted, "--server-side", "--force-conflicts")
    if done.returncode != 0:
        raise AssertionError(f"installing RBAC failed:\n{done.stderr}")


def service_account_token(api_client: k8s.ApiClient, name: str, namespace: str = NAMESPACE) -> str:
    """A short-lived token of the ServiceAccount (the TokenRequest API, as the kubelet gets it)."""
    body = k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(audiences=[]))
    body.spec.expiration_seconds = 3600
    answer = k8s.CoreV1Api(api_client).create_namespaced_service_account_token(
        name, namespace, body
    )
    token: str = answer.status.token
    return token


def kubeconfig_for(server: str, ca_file: Path, token: str, path: Path) -> Path:
    """A kubeconfig that authenticates with a bearer token only."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa"}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path
