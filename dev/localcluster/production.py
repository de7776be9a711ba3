"""What a production cluster has and a bare local cluster lacks, laid onto a running Cluster.

A rescheduler that behaves on an empty test cluster can still do harm on a real one, where it
shares the Nodes with an operator, the add-ons and workloads it was never meant to touch. This
fixture gives the local cluster those neighbours, so that the e2e tests, the demo and the benches
(dev/bench/soak) can check we leave them alone:

- **operator labels and taints** on every Node: topology (``topology.kubernetes.io/zone``,
  ``region``), an instance type, a node pool (``cloud.google.com/gke-nodepool``, as GKE names
  it), an inventory ``status=active`` on some (the same key label-nodes writes its pressure
  value under), a ``dedicated=batch:NoSchedule`` taint on the batch pool, and the
  ``kn-rescheduler.io/ignore`` opt-out on one node. Every write is returned as an
  :class:`~bench.soak.invariants.OperatorWrite`-shaped dict with the resourceVersion it
  answered with, so that a checker can tell what came after;
- **kube-system add-ons** with the built-in priority classes, shaped after kubeadm's manifests
  (cmd/kubeadm/app/phases/addons): CoreDNS (a Deployment, ``system-cluster-critical``,
  tolerating ``CriticalAddonsOnly`` and the control-plane taint) and kube-proxy (a DaemonSet,
  ``system-node-critical``, host network, tolerating every taint), plus a metrics add-on pinned
  to the system pool by a ``nodeSelector``, as clusters with a system pool pin theirs;
- **a StatefulSet on local PersistentVolumes**: a ``kubernetes.io/no-provisioner`` StorageClass
  with ``WaitForFirstConsumer`` binding and static PVs, each with the required node affinity a
  local volume has (the scheduler's VolumeBinding plugin then keeps each pod on its volume's
  node for good);
- **CronJobs every minute** (``*/1 * * * *``): each run is a new Job of the same workload;
- **a second Prometheus scrape job** on the same node-exporter endpoints
  (:func:`second_scrape_job`: kube-prometheus' job beside a Helm chart's, every node series
  twice, differing only in ``job``; :mod:`localcluster.prometheus`);
- **nodes added, cordoned and drained, removed** while things run (:func:`add_node`,
  :func:`drain`, :func:`remove_node`), as an autoscaler or an operator does;
- **pods left terminal from days ago** (:func:`left_terminal_pod`): ``Failed`` pods a
  ReplicaSet keeps until the pod garbage collector's threshold (12,500 by default), evicted
  (``Evicted``), stopped by a graceful node shutdown (``Terminated``) or rejected at admission
  (``OutOfcpu``), bound to the nodes they were on, written once by the fake kubelet as the
  kubelet left them (``sim.kn-rescheduler.io/terminal``, dev/localcluster/podstatus.py);
- **an image pre-puller** (:func:`image_prepuller`): a DaemonSet that starts an image on some
  nodes so that their later pods find it there, as clusters pre-pull their big images.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from dev.localcluster.cluster import Cluster
from dev.localcluster.podstatus import (
    SIM_TERMINAL_AGE_ANNOTATION,
    SIM_TERMINAL_ANNOTATION,
    TERMINAL_KINDS,
)
from dev.localcluster.prometheus import config as prometheus_config
from dev.localcluster.rest import ApiError
from shared.api.keys import NODE_OPT_OUT_LABEL

JSON = dict[str, Any]

ADDONS_NAMESPACE: Final = "kube-system"
POOL_LABEL: Final = "cloud.google.com/gke-nodepool"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
REGION_LABEL: Final = "topology.kubernetes.io/region"
INSTANCE_TYPE_LABEL: Final = "node.kubernetes.io/instance-type"
INVENTORY_LABEL: Final = "status"
INVENTORY_VALUE: Final = "active"
BATCH_TAINT: Final = {"key": "dedicated", "value": "batch", "effect": "NoSchedule"}
BATCH_TOLERATION: Final = {
    "key": "dedicated",
    "operator": "Equal",
    "value": "batch",
    "effect": "NoSchedule",
}
STORAGE_CLASS: Final = "local-storage"
IMAGE_PAUSE: Final = "registry.k8s.io/pause:3.10"


@dataclass(frozen=True)
class Layout:
    """Which node plays which part. ``system`` is the system pool (the metrics add-on lives
    there), ``batch`` the tainted pool, ``inventory`` the nodes with the operator's ``status``
    label, ``opted_out`` the node labelled ``kn-rescheduler.io/ignore``, ``volumes`` the nodes
    with a local PV each (a node named twice has two)."""

    system: tuple[str, ...]
    batch: tuple[str, ...]
    inventory: tuple[str, ...]
    opted_out: tuple[str, ...]
    volumes: tuple[str, ...]


@dataclass
class Production:
    cluster: Cluster
    layout: Layout
    # Every operator write: {"node", "rv", "labels", "taints", "unschedulable"}.
    writes: list[JSON] = field(default_factory=list)

    # -- nodes ----------------------------------------------------------------------------------

    def operator_labels(self, node: str, index: int) -> dict[str, str]:
        zone = "abc"[index % 3]
        labels = {
            REGION_LABEL: "europe-west1",
            ZONE_LABEL: f"europe-west1-{zone}",
            INSTANCE_TYPE_LABEL: "e2-standard-8",
            POOL_LABEL: "system"
            if node in self.layout.system
            else ("batch" if node in self.layout.batch else "general"),
        }
        if node in self.layout.inventory:
            labels[INVENTORY_LABEL] = INVENTORY_VALUE
        if node in self.layout.opted_out:
            labels[NODE_OPT_OUT_LABEL] = "true"
        return labels

    def write(
        self,
        node: str,
        labels: Mapping[str, str | None] | None = None,
        taints: Sequence[JSON] | None = None,
        unschedulable: bool | None = None,
    ) -> JSON:
        """One operator write (a JSON merge patch, as ``kubectl label``/``cordon`` send);
        recorded with the resourceVersion of the answer."""
        patch: JSON = {}
        if labels:
            patch["metadata"] = {"labels": dict(labels)}
        spec: JSON = {}
        if taints is not None:
            current = self.cluster.rest.get(f"/api/v1/nodes/{node}")
            kept = [
                t
                for t in (current.get("spec") or {}).get("taints") or []
                if t.get("key") not in {x["key"] for x in taints}
            ]
            spec["taints"] = kept + [dict(t) for t in taints]
        if unschedulable is not None:
            spec["unschedulable"] = unschedulable
        if spec:
            patch["spec"] = spec
        answer = self.cluster.rest.patch(f"/api/v1/nodes/{node}", patch)
        entry = {
            "node": node,
            "rv": int(answer["metadata"]["resourceVersion"]),
            "labels": dict(labels or {}),
            "taints": [dict(t) for t in taints] if taints is not None else None,
            "unschedulable": unschedulable,
        }
        self.writes.append(entry)
        return entry

    def label_nodes(self, names: Sequence[str]) -> None:
        for name in names:
            index = int(name.rsplit("-", 1)[1]) if name.rsplit("-", 1)[1].isdigit() else 0
            taints = [BATCH_TAINT] if name in self.layout.batch else None
            self.write(name, self.operator_labels(name, index), taints)

    # -- add-ons --------------------------------------------------------------------------------

    def addons(self) -> list[JSON]:
        coredns_tolerations = [
            {"key": "CriticalAddonsOnly", "operator": "Exists"},
            {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},
        ]
        coredns = _deployment(
            "coredns",
            2,
            {"k8s-app": "kube-dns"},
            {
                "priorityClassName": "system-cluster-critical",
                "tolerations": coredns_tolerations,
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "containers": [_container("coredns", "100m", "70Mi")],
            },
        )
        metrics = _deployment(
            "metrics-agent",
            1,
            {"k8s-app": "metrics-agent"},
            {
                "priorityClassName": "system-cluster-critical",
                "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
                "nodeSelector": {POOL_LABEL: "system"},
                "containers": [_container("metrics-agent", "100m", "200Mi")],
            },
        )
        proxy = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "kube-proxy", "labels": {"k8s-app": "kube-proxy"}},
            "spec": {
                "selector": {"matchLabels": {"k8s-app": "kube-proxy"}},
                "updateStrategy": {"type": "RollingUpdate"},
                "template": {
                    "metadata": {"labels": {"k8s-app": "kube-proxy"}},
                    "spec": {
                        "priorityClassName": "system-node-critical",
                        "hostNetwork": True,
                        "tolerations": [{"operator": "Exists"}],
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                        "terminationGracePeriodSeconds": 0,
                        "containers": [_container("kube-proxy", "10m", "20Mi")],
                    },
                },
            },
        }
        return [coredns, metrics, proxy]

    def restart_addon(self, name: str) -> None:
        """``kubectl rollout restart``: the annotation kubectl writes on the pod template."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.cluster.rest.patch(
            f"/apis/apps/v1/namespaces/{ADDONS_NAMESPACE}/deployments/{name}",
            {
                "spec": {
                    "template": {
                        "metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": stamp}}
                    }
                }
            },
        )

    # -- local volumes --------------------------------------------------------------------------

    def storage(self) -> list[tuple[str, JSON]]:
        objs: list[tuple[str, JSON]] = [
            (
                "/apis/storage.k8s.io/v1/storageclasses",
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "StorageClass",
                    "metadata": {"name": STORAGE_CLASS},
                    "provisioner": "kubernetes.io/no-provisioner",
                    "volumeBindingMode": "WaitForFirstConsumer",
                    "reclaimPolicy": "Retain",
                },
            )
        ]
        for i, node in enumerate(self.layout.volumes):
            objs.append(
                (
                    "/api/v1/persistentvolumes",
                    local_volume(f"local-pv-{node}-{i}", node, STORAGE_CLASS, f"/mnt/disks/ssd{i}"),
                )
            )
        return objs

    # -- applying -------------------------------------------------------------------------------

    def apply(self) -> Production:
        """Labels every node, creates the add-ons, the StorageClass and the local PVs."""
        self.label_nodes(self.cluster.nodes)
        for obj in self.addons():
            plural = "daemonsets" if obj["kind"] == "DaemonSet" else "deployments"
            _create(self.cluster, f"/apis/apps/v1/namespaces/{ADDONS_NAMESPACE}/{plural}", obj)
        for path, obj in self.storage():
            _create(self.cluster, path, obj)
        return self

    # -- nodes coming and going -----------------------------------------------------------------

    def add_node(self, name: str) -> None:
        """A node joins (as an autoscaler adds one), with the operator's labels. The local
        Cluster registers it as a kubelet would and its fake kubelet takes its pods."""
        index = len(self.cluster.nodes)
        # The Cluster has no public way to add a node: its registration and the fake kubelet's
        # node set are what `Cluster.start` uses for its own nodes.
        self.cluster._register_node(index, name)
        self.cluster.nodes.append(name)
        if self.cluster.kubelet is not None:
            self.cluster.kubelet.nodes = frozenset(self.cluster.nodes)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            node = self.cluster.rest.get(f"/api/v1/nodes/{name}")
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            if conds.get("Ready") == "True":
                break
            time.sleep(0.2)
        self.label_nodes([name])

    def drain(self, name: str, timeout: float = 60.0) -> int:
        """``kubectl drain``: cordon, then evict every pod but DaemonSet and mirror pods
        through the Eviction API (a 429 is a PodDisruptionBudget saying not yet: try again).
        Returns the pods evicted."""
        self.write(name, unschedulable=True)
        evicted = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = [
                p
                for p in self.cluster.rest.get(
                    "/api/v1/pods", {"fieldSelector": f"spec.nodeName={name}"}
                ).get("items", [])
                if not _daemon_or_mirror(p) and not p["metadata"].get("deletionTimestamp")
            ]
            if not left:
                return evicted
            for p in left:
                ns, pod = p["metadata"]["namespace"], p["metadata"]["name"]
                try:
                    self.cluster.rest.post(
                        f"/api/v1/namespaces/{ns}/pods/{pod}/eviction",
                        {
                            "apiVersion": "policy/v1",
                            "kind": "Eviction",
                            "metadata": {"name": pod, "namespace": ns},
                        },
                    )
                    evicted += 1
                except ApiError as e:
                    if e.status not in (404, 429):
                        raise
            time.sleep(1.0)
        return evicted

    def remove_node(self, name: str) -> None:
        """A node leaves (drained, then its Node deleted, as an autoscaler scales down); the
        pod garbage collector removes what was left bound to it."""
        self.drain(name)
        self.cluster.rest.delete(f"/api/v1/nodes/{name}")


def second_scrape_job(cluster: Cluster) -> None:
    """Has the cluster's Prometheus scrape every node-exporter endpoint a second time, as
    kube-prometheus' job (``localcluster.prometheus.SECOND_JOB``), beside the first: its
    configuration rewritten, then Prometheus restarted on the same port and data (call it from
    the thread that started the cluster). Returns once both jobs scraped every node."""
    prom = cluster.prometheus
    if prom is None:
        raise ValueError("the cluster runs no Prometheus")
    prom.second_job = True
    prom.config_file.write_text(
        yaml.safe_dump(prometheus_config(prom.targets_file, second_job=True), sort_keys=False)
    )
    cluster.stop_prometheus()
    cluster.start_prometheus()


def local_volume(name: str, node: str, storage_class: str, path: str, size: str = "10Gi") -> JSON:
    """A static local PersistentVolume, as the Kubernetes docs show one: a path on one node,
    and the required node affinity (by ``kubernetes.io/hostname``) that binds every pod using it
    to that node."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": storage_class,
            "local": {"path": path},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


def _container(name: str, cpu: str, memory: str) -> JSON:
    return {
        "name": name,
        "image": IMAGE_PAUSE,
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
    }


def _deployment(name: str, replicas: int, labels: JSON, spec: JSON) -> JSON:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {"terminationGracePeriodSeconds": 0, **spec},
            },
        },
    }


def _daemon_or_mirror(pod: JSON) -> bool:
    meta = pod.get("metadata") or {}
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return True
    return any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or [])


def _create(cluster: Cluster, path: str, body: JSON) -> None:
    try:
        cluster.rest.post(path, body)
    except ApiError as e:
        if e.status != 409:
            raise


def local_volume_statefulset(
    name: str, replicas: int, annotations: Mapping[str, str], cpu: str = "1"
) -> JSON:
    """A StatefulSet whose every pod claims a local volume of the fixture's StorageClass."""
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "annotations": dict(annotations)},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            **_container("app", cpu, "256Mi"),
                            "image": "registry.example.com/shop/cache:2.0",
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        }
                    ],
                },
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": STORAGE_CLASS,
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ],
        },
    }


def cronjob(name: str, annotations: Mapping[str, str], pod_spec: JSON) -> JSON:
    """A CronJob running every minute; ``annotations`` go onto each run's Job."""
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name},
        "spec": {
            "schedule": "*/1 * * * *",
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 1,
            "jobTemplate": {
                "metadata": {"annotations": dict(annotations)},
                "spec": {
                    "backoffLimit": 1000,
                    "template": {"spec": {"restartPolicy": "OnFailure", **pod_spec}},
                },
            },
        },
    }


def left_terminal_pod(
    name: str,
    node: str,
    kind: str,
    owner: Mapping[str, Any] | None,
    labels: Mapping[str, str],
    image: str,
    *,
    cpu: str = "200m",
    age_s: float = 3 * 24 * 3600.0,
) -> JSON:
    """A pod left ``kind`` (``Evicted``, ``Terminated``, ``OutOfcpu``) on ``node`` ``age_s``
    seconds ago, owned by ``owner`` (its controller as read, with ``kind`` and ``apiVersion``;
    None for a bare pod): bound to the node at its creation (the scheduler placed it long ago),
    its status written once by the fake kubelet as the kubelet left it. It stays until the pod
    garbage collector's threshold.

    Give it a finished Job as owner (the Job controller leaves a finished Job's pods alone), not
    a ReplicaSet: a ReplicaSet sees the new pod while it is still Pending, an active pod, and
    deletes it as a surplus replica or, if its labels do not match, releases it (its
    ownerReference removed) before the fake kubelet has written it terminal."""
    if kind not in TERMINAL_KINDS:
        raise ValueError(f"unknown terminal kind {kind!r}; kinds are {TERMINAL_KINDS}")
    meta: JSON = {
        "name": name,
        "labels": dict(labels),
        "annotations": {SIM_TERMINAL_ANNOTATION: kind, SIM_TERMINAL_AGE_ANNOTATION: str(age_s)},
    }
    if owner is not None:
        owner_meta = owner["metadata"]
        meta["ownerReferences"] = [
            {
                "apiVersion": owner.get("apiVersion", "batch/v1"),
                "kind": owner.get("kind", "Job"),
                "name": owner_meta["name"],
                "uid": owner_meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "app", "image": image, "resources": {"requests": {"cpu": cpu}}}
            ],
        },
    }


def image_prepuller(name: str, image: str, nodes: Sequence[str]) -> JSON:
    """A DaemonSet that starts ``image`` on ``nodes`` (and sleeps), so that pods started there
    later find it present: no pull, no ``Pulled`` Event, as on a node that ran it before."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/hostname",
                                                "operator": "In",
                                                "values": list(nodes),
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                    "containers": [
                        {
                            "name": "prepull",
                            "image": image,
                            "command": ["sleep", "infinity"],
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                        }
                    ],
                },
            },
        },
    }
