"""The descheduler peer: built by hack/build-descheduler.sh, run against the local API server.

The policy is a DeschedulerPolicy v1alpha2 with one profile: ``RemovePodsHavingTooManyRestarts``
(podRestartThreshold 3, states [CrashLoopBackOff]: a pod whose containers restarted at least
three times in total and that has a container waiting in CrashLoopBackOff) and
``RemoveFailedPods`` (pods in phase Failed), both deschedule plugins, with the ``DefaultEvictor``
as filter and pre-eviction filter at its shipped defaults. Those defaults matter here and are
kept as shipped:

- ``nodeFit`` is false: the descheduler does not check that the pod fits another node before it
  evicts (with it on, every pod here would still pass: all nodes are Ready, untainted and have
  room; the preferred node affinity is not a filter);
- pods with local storage (emptyDir), DaemonSet pods, system-critical pods and failed bare pods
  are protected; none of the benchmark's pods is any of these;
- eviction goes through the Eviction API (``pods/eviction``), which honours
  PodDisruptionBudgets (there are none here).

It runs as its own user (``bench-descheduler``, cluster-admin; RBAC is not what is measured) so
that its API requests are counted apart from everything else (see ``bench.common``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Final

import yaml

from dev.bench.common import DESCHEDULER_USER, JSON, ROOT, identity_kubeconfig
from dev.localcluster.cluster import Cluster
from dev.localcluster.procs import Proc

BUILD_SCRIPT: Final = ROOT / "hack" / "build-descheduler.sh"


def binary() -> Path:
    """Builds (or finds cached) the descheduler; its path."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True, timeout=1800
    )
    return Path(out.stdout.strip().splitlines()[-1])


def version() -> str:
    for line in (ROOT / "hack" / "descheduler" / "go.mod").read_text().splitlines():
        parts = line.split()
        if parts[:2] == ["require", "sigs.k8s.io/descheduler"]:
            return parts[2]
    return "unknown"


def policy(restart_threshold: int = 3) -> JSON:
    return {
        "apiVersion": "descheduler/v1alpha2",
        "kind": "DeschedulerPolicy",
        "profiles": [
            {
                "name": "kn-rescheduler-bench",
                "pluginConfig": [
                    {"name": "DefaultEvictor", "args": {}},
                    {
                        "name": "RemovePodsHavingTooManyRestarts",
                        "args": {
                            "podRestartThreshold": restart_threshold,
                            "states": ["CrashLoopBackOff"],
                        },
                    },
                    {"name": "RemoveFailedPods", "args": {}},
                ],
                "plugins": {
                    "filter": {"enabled": ["DefaultEvictor"]},
                    "preEvictionFilter": {"enabled": ["DefaultEvictor"]},
                    "deschedule": {
                        "enabled": ["RemovePodsHavingTooManyRestarts", "RemoveFailedPods"]
                    },
                },
            }
        ],
    }


def start(cluster: Cluster, interval: str, workdir: Path, bin_path: Path) -> Proc:
    """The descheduler running in a loop every ``interval`` (a Go duration: 2m, 10s)."""
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = identity_kubeconfig(cluster, DESCHEDULER_USER, workdir)
    policy_file = workdir / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy()))
    return Proc(
        f"descheduler-{interval}",
        [
            str(bin_path),
            f"--kubeconfig={kubeconfig}",
            f"--policy-config-file={policy_file}",
            f"--descheduling-interval={interval}",
            # No HTTPS endpoint (metrics, healthz): nothing here scrapes it, and its default
            # port is a fixed one.
            "--secure-port=0",
            "--v=2",
        ],
        workdir / f"descheduler-{interval}.log",
        cwd=workdir,
    )
