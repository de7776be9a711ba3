"""The project's local Kubernetes control plane for tests and the demo.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler; kwok keeps N fake nodes
alive; a fake kubelet writes pod statuses, including the failures a real kubelet reports on a
node labelled ``sim.kn-rescheduler.io/fault=<mode>``. See docs/local-cluster.md and
docs/local-cluster-faults.md.
"""

from dev.localcluster.cluster import Cluster, ClusterError
from dev.localcluster.kubelet import FAULT_ANNOTATION, Timing
from dev.localcluster.podstatus import FAULT_MODES
from dev.localcluster.procs import Component

__all__ = ["FAULT_ANNOTATION", "FAULT_MODES", "Cluster", "ClusterError", "Component", "Timing"]
