"""The ``make up`` hook: ``python -m localcluster up --with stack.up:components``."""

from __future__ import annotations

import sys

from localcluster.cluster import Cluster
from localcluster.procs import Component
from stack.functions import ROOT
from stack.run import STACK_FILE


def components(cluster: Cluster) -> list[Component]:
    ready_file = cluster.workdir / STACK_FILE
    return [
        Component(
            name="stack",
            argv=[
                sys.executable,
                "-m",
                "stack.run",
                "--dir",
                str(cluster.workdir),
                *(
                    ["--prometheus-url", cluster.prometheus_url]
                    if cluster.prometheus is not None
                    else []
                ),
            ],
            env={"PYTHONPATH": str(ROOT)},
            cwd=ROOT,
            ready=ready_file.exists,
            ready_timeout=120.0,
        )
    ]
