"""The failure storm: its sizes, its workloads, the namespaces and the identity the pipeline runs
as.

Every workload prefers one faulty node (preferred node affinity, weight 100), so every first pod
fails; its replacements are free to land on any node the exclusions leave, another faulty one
included. Budgets are large enough to recover: a replica can land on each faulty node once
before that node is excluded, so a workload gets one move per faulty node per pod plus slack.
Exhausting a budget is not what this suite looks for (tests/e2e covers it).

Jobs run one pod at a time: the Job controller counts every pod deleted before it succeeded as
a failed pod (``isPodFailed`` in pkg/controller/job), and delays the next pod by its failure
back-off (10 s doubling, capped at 6 minutes). Each move of a Job's pod is one such failure, so
a Job whose pods were moved n times waits 10 s x 2^(n-1) for its next pod; the fewer pods per
Job, the fewer failures each Job collects in the storm.

The pipeline runs with the install's own RBAC (knative/rbac.yaml, applied for real), as the
ServiceAccount update-annotations; the namespace of the bare pods opts in to their replacement
with knative/bare-pod-replacement, as docs/install-opt-in.md tells users to. The local Stack runs
every component with one kubeconfig, so that account is also bound, for this run, to the
ApiServerSource adapter's own ClusterRole (watching pods), to assess-nodes's (marking
Nodes) and to the Roles of Knative's Broker data plane (Knative's own, from its module: reading
its ConfigMaps, TLS secrets, Brokers, Triggers and channels): a little more than
update-annotations has in a cluster, nothing it uses to move a pod.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from dev.localcluster.bins import ensure_bins
from dev.localcluster.cluster import Cluster
from dev.localcluster.rest import ApiError, Rest
from dev.pipeline.broker import SYSTEM_NAMESPACE
from dev.pipeline.faults import FaultSpec
from dev.pipeline.source import knative_dir
from shared.api.keys import DEFAULT_NAMESPACE, POLICY_ANNOTATION

JSON = dict[str, Any]
ROOT: Final = Path(__file__).resolve().parents[3]
KNATIVE_DIR: Final = ROOT / "knative"
IMAGE: Final = "registry.example.com/shop/web:1.4.2"
LABEL: Final = "chaos.kn-rescheduler.io/run"
SERVICE_ACCOUNT: Final = "update-annotations"
SOURCE_ROLE: Final = "kn-rescheduler-pod-events-source"
ASSESS_ROLE: Final = "kn-rescheduler-assess-nodes"
NAMESPACES: Final = {
    "Deployment": "chaos-deployments",
    "StatefulSet": "chaos-statefulsets",
    "Job": "chaos-jobs",
    "Pod": "chaos-bare-pods",
}


@dataclass(frozen=True)
class Scales:
    """Sizes and rates of one run; ``QUICK`` is CI's, ``FULL`` is ``make chaos``."""

    nodes: int
    # One faulty node per mode (localcluster fault modes).
    fault_modes: tuple[str, ...]
    deployments: int
    deployment_replicas: int
    statefulsets: int
    statefulset_replicas: int
    jobs: int
    job_parallelism: int
    bare_pods: int
    # Faults are injected for this long from the storm's creation, then the run waits up to
    # settle_s for every replica to be healthy.
    chaos_s: float
    settle_s: float
    sweep_every: float
    # update-annotations kills: on a state write (with this probability), and at random
    # moments (exponential gaps of this mean); never a process up for less than min_uptime s.
    kill_on_write: float
    random_kill_every: float
    min_uptime: float
    # The storm arrives in this many waves, spread over the first 60 % of the fault window,
    # so that there are moves to disturb while every fault happens.
    waves: int
    # Control-plane restarts (SIGKILL, then started again), spread over the fault window.
    apiserver_restarts: int
    etcd_restarts: int
    # The faults in Knative's data plane (dev/pipeline/faults.py; seeded from the run's seed).
    data_plane: JSON = field(default_factory=dict)
    # A run in which fewer kills than this landed between a state write and the removal it
    # was for (read from the function's log) gets one more wave and half a window more, at
    # most max_extra_waves times: the moment is a race, and a run that never hit it proves
    # nothing about it.
    min_kills_in_window: int = 1
    max_extra_waves: int = 2

    @property
    def pods(self) -> int:
        return (
            self.deployments * self.deployment_replicas
            + self.statefulsets * self.statefulset_replicas
            + self.jobs * self.job_parallelism
            + self.bare_pods
        )

    def data_plane_faults(self, seed: int) -> FaultSpec:
        return FaultSpec(seed=seed, **self.data_plane)


DATA_PLANE_FAULTS: Final = {
    "ingress_drop": 0.05,
    "attempt_drop": 0.1,
    "answer_loss": 0.05,
    "duplicate": 0.1,
    "reorder": 0.1,
    "max_delay": 2.0,
    # Below every Trigger's retry (5): see dev/pipeline/faults.py.
    "max_failures": 2,
}
QUICK: Final = Scales(
    nodes=6,
    fault_modes=("crashloop", "imagepull"),
    deployments=3,
    deployment_replicas=3,
    statefulsets=2,
    statefulset_replicas=2,
    jobs=3,
    job_parallelism=1,
    bare_pods=5,
    chaos_s=50.0,
    settle_s=80.0,
    sweep_every=8.0,
    kill_on_write=1.0,
    random_kill_every=20.0,
    min_uptime=2.0,
    waves=2,
    apiserver_restarts=1,
    etcd_restarts=1,
    data_plane=dict(DATA_PLANE_FAULTS),
)
FULL: Final = Scales(
    nodes=12,
    fault_modes=("crashloop", "imagepull", "oom", "createcontainer"),
    deployments=10,
    deployment_replicas=4,
    statefulsets=5,
    statefulset_replicas=4,
    jobs=16,
    job_parallelism=1,
    bare_pods=24,
    chaos_s=240.0,
    settle_s=300.0,
    sweep_every=15.0,
    kill_on_write=0.5,
    random_kill_every=15.0,
    min_uptime=5.0,
    waves=3,
    apiserver_restarts=3,
    etcd_restarts=3,
    data_plane=dict(DATA_PLANE_FAULTS),
)


def _affinity(prefer: str) -> JSON:
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [prefer]}
                        ]
                    },
                }
            ]
        }
    }


def _pod_spec(prefer: str, **extra: Any) -> JSON:
    return {
        "affinity": _affinity(prefer),
        "containers": [{"name": "app", "image": IMAGE}],
        # kwok pods end at once; a grace period would only slow the run down.
        "terminationGracePeriodSeconds": 0,
        **extra,
    }


def _template(name: str, prefer: str, **extra: Any) -> JSON:
    return {"metadata": {"labels": {"app": name}}, "spec": _pod_spec(prefer, **extra)}


def _meta(name: str, retries: int) -> JSON:
    return {
        "name": name,
        "labels": {LABEL: "storm"},
        "annotations": {POLICY_ANNOTATION: str(retries)},
    }


@dataclass(frozen=True)
class Workload:
    kind: str
    namespace: str
    name: str
    prefer: str
    retries: int
    body: JSON

    @property
    def pods(self) -> int:
        spec = self.body.get("spec") or {}
        if self.kind == "Pod":
            return 1
        return int(spec.get("parallelism" if self.kind == "Job" else "replicas", 1))

    @property
    def path(self) -> str:
        group = {
            "Deployment": "apis/apps/v1",
            "StatefulSet": "apis/apps/v1",
            "Job": "apis/batch/v1",
        }
        plural = {
            "Deployment": "deployments",
            "StatefulSet": "statefulsets",
            "Job": "jobs",
            "Pod": "pods",
        }
        base = group.get(self.kind, "api/v1")
        return f"/{base}/namespaces/{self.namespace}/{plural[self.kind]}"


def storm(scales: Scales, faulty: list[str], generation: int = 0) -> list[Workload]:
    """The workloads, each preferring one faulty node (round robin), with budgets to recover.
    A later ``generation`` (an extra wave) has names of its own."""
    f = len(faulty)
    g = f"g{generation}-" if generation else ""
    out: list[Workload] = []
    k = 0

    def prefer() -> str:
        nonlocal k
        k += 1
        return faulty[(k - 1) % f]

    for i in range(scales.deployments):
        name, node = f"web-{g}{i}", prefer()
        # A ReplicaSet's budget is retries x replicas, shared: a move per faulty node per pod.
        retries = f + 1
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(name, retries),
            "spec": {
                "replicas": scales.deployment_replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": _template(name, node),
            },
        }
        out.append(Workload("Deployment", NAMESPACES["Deployment"], name, node, retries, body))
    for i in range(scales.statefulsets):
        name, node = f"db-{g}{i}", prefer()
        retries = f + 2  # per pod
        body = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": _meta(name, retries),
            "spec": {
                "replicas": scales.statefulset_replicas,
                "serviceName": name,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app": name}},
                "template": _template(name, node),
            },
        }
        out.append(Workload("StatefulSet", NAMESPACES["StatefulSet"], name, node, retries, body))
    for i in range(scales.jobs):
        name, node = f"report-{g}{i}", prefer()
        retries = scales.job_parallelism * f + 2  # one budget for the whole Job
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": _meta(name, retries),
            "spec": {
                "parallelism": scales.job_parallelism,
                "completions": scales.job_parallelism,
                # Container restarts of active pods count against it (restartPolicy OnFailure):
                # crash loops must not fail the Job before its pods are moved.
                "backoffLimit": 1000,
                "template": _template(name, node, restartPolicy="OnFailure"),
            },
        }
        out.append(Workload("Job", NAMESPACES["Job"], name, node, retries, body))
    for i in range(scales.bare_pods):
        name, node = f"solo-{g}{i}", prefer()
        retries = f + 2
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**_meta(name, retries), "labels": {LABEL: "storm", "app": name}},
            "spec": _pod_spec(node),
        }
        out.append(Workload("Pod", NAMESPACES["Pod"], name, node, retries, body))
    return out


def create_namespaces(cluster: Cluster, workdir: Path) -> list[str]:
    """The chaos namespaces (their default ServiceAccount present); the bare pods' one opted in
    to bare-pod replacement with knative/bare-pod-replacement, as a user's overlay does it."""
    from dev.bench.common import create_namespace  # noqa: PLC0415 - bench.common imports a lot

    for ns in NAMESPACES.values():
        create_namespace(cluster.rest, ns)
    overlay = workdir / "opt-in"
    overlay.mkdir(parents=True, exist_ok=True)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": NAMESPACES["Pod"],
                "resources": [os.path.relpath(KNATIVE_DIR / "bare-pod-replacement", overlay)],
            }
        )
    )
    _apply(cluster, _kustomize(overlay))
    return list(NAMESPACES.values())


def data_plane_roles() -> list[JSON]:
    """The ClusterRoles and Roles Knative binds its Broker filter, ingress and channel
    dispatcher to, from the module the binaries were built from (hack/build-adapter.sh)."""
    return [
        d
        for path in sorted((knative_dir() / "config" / "roles").glob("*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if d and d.get("kind") in ("ClusterRole", "Role")
    ]


def install_identity(cluster: Cluster, workdir: Path) -> Path:
    """The install's RBAC from knative/ (namespace, ServiceAccounts, ClusterRoles and their
    bindings), for real, and a kubeconfig with a token of the ServiceAccount update-annotations
    (see the module docstring for the two extra bindings)."""
    rbac = [
        o
        for o in _kustomize(KNATIVE_DIR)
        if o.get("kind") in ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    knative = data_plane_roles()
    # Knative's Roles live in its system namespace, which the Broker's start creates too.
    system = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}}
    _apply(cluster, [*rbac, system, *knative])
    for r in knative:
        if r["kind"] != "Role":
            continue
        _create(
            cluster.rest,
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/rolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"kn-rescheduler-chaos-local-{r['metadata']['name']}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": r["metadata"]["name"],
                },
                "subjects": [
                    {
                        "kind": "ServiceAccount",
                        "name": SERVICE_ACCOUNT,
                        "namespace": DEFAULT_NAMESPACE,
                    }
                ],
            },
        )
    for role, binding in (
        (SOURCE_ROLE, "kn-rescheduler-chaos-local-source"),
        (ASSESS_ROLE, "kn-rescheduler-chaos-local-assess-nodes"),
        *(
            (r["metadata"]["name"], f"kn-rescheduler-chaos-local-{r['metadata']['name']}")
            for r in knative
            if r["kind"] == "ClusterRole"
        ),
    ):
        _create(
            cluster.rest,
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": binding},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {
                        "kind": "ServiceAccount",
                        "name": SERVICE_ACCOUNT,
                        "namespace": DEFAULT_NAMESPACE,
                    }
                ],
            },
        )
    # A TokenRequest, as the kubelet gets a projected token (an hour outlasts any run).
    answer = cluster.rest.post(
        f"/api/v1/namespaces/{DEFAULT_NAMESPACE}/serviceaccounts/{SERVICE_ACCOUNT}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": [], "expirationSeconds": 3600},
        },
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority": str(cluster.ca_file),
                },
            }
        ],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": answer["status"]["token"]}}],
        "contexts": [{"name": "chaos", "context": {"cluster": "local", "user": SERVICE_ACCOUNT}}],
        "current-context": "chaos",
    }
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{SERVICE_ACCOUNT}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def _kubectl() -> str:
    return str(ensure_bins() / "kubectl")


def _kustomize(target: Path) -> list[JSON]:
    done = subprocess.run(
        [_kubectl(), "kustomize", str(target)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {target} failed:\n{done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _apply(cluster: Cluster, objs: Iterable[JSON]) -> None:
    done = subprocess.run(
        [_kubectl(), "--kubeconfig", str(cluster.kubeconfig), "apply", "--server-side", "-f", "-"],
        input=yaml.safe_dump_all(list(objs)),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl apply failed:\n{done.stderr}")


def _create(rest: Rest, collection: str, body: JSON) -> None:
    try:
        rest.post(collection, body)
    except ApiError as e:
        if e.status != 409:
            raise
