"""The ``make up`` hook: ``python -m dev.localcluster up --with dev.stack.up:components``.

Besides the pipeline (``stack.run``), it starts the load-aware scheduler as a cluster would run
it: the real kube-scheduler with the shipped configuration
(knative/components/load-aware-scheduler/kube-scheduler-config.yaml), its extender address
pointed at the local score-nodes, whose port is chosen here so that the scheduler and the
function agree. The extender is ignorable: the scheduler is up before score-nodes and places
pods without it until it answers.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Final

import yaml

from dev.localcluster.cluster import Cluster
from dev.localcluster.procs import Component
from dev.stack.functions import ROOT, free_port
from dev.stack.run import STACK_FILE
from shared.api.keys import LOAD_AWARE_SCHEDULER_NAME

SHIPPED_SCHEDULER_CONFIG: Final = (
    ROOT / "knative" / "components" / "load-aware-scheduler" / "kube-scheduler-config.yaml"
)


def load_aware_scheduler_config(
    extender_url: str, path: Path = SHIPPED_SCHEDULER_CONFIG
) -> dict[str, Any]:
    """The shipped second scheduler's configuration with the extender at ``extender_url``
    (the local cluster supplies its own connection and lease settings)."""
    config = yaml.safe_load(path.read_text())
    extenders = config.get("extenders") or []
    if len(extenders) != 1:
        raise ValueError(f"{path}: expected one extender, found {len(extenders)}")
    extenders[0]["urlPrefix"] = extender_url
    # The lease and the credentials are the local cluster's (kube-system, its scheduler's
    # kubeconfig): there is no kn-rescheduler namespace or ServiceAccount token here.
    config.pop("leaderElection", None)
    config.pop("clientConnection", None)
    return dict(config)


def components(cluster: Cluster) -> list[Component]:
    ready_file = cluster.workdir / STACK_FILE
    score_nodes_port = free_port()
    cluster.start_scheduler(
        LOAD_AWARE_SCHEDULER_NAME,
        load_aware_scheduler_config(f"http://127.0.0.1:{score_nodes_port}"),
    )
    return [
        Component(
            name="stack",
            argv=[
                sys.executable,
                "-m",
                "dev.stack.run",
                "--dir",
                str(cluster.workdir),
                "--score-nodes-port",
                str(score_nodes_port),
                *(
                    ["--prometheus-url", cluster.prometheus_url]
                    if cluster.prometheus is not None
                    else []
                ),
                # Real nodes only: thresholds for a real kubelet's back-off. A mixed cluster
                # keeps the fake kubelet's compressed ones.
                *(["--real-kubelets"] if cluster.real_nodes and not cluster.kwok_nodes else []),
            ],
            env={"PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            ready=ready_file.exists,
            ready_timeout=120.0,
        )
    ]
