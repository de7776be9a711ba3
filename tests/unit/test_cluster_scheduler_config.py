"""How the local cluster starts a kube-scheduler: its stock flags without a configuration, and
with a KubeSchedulerConfiguration a file that carries what --config makes the scheduler ignore
on its command line (the kubeconfig, the lease name), so that the process signs in and leads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.localcluster.cluster import Cluster

EXTENDER = {
    "urlPrefix": "http://127.0.0.1:8080",
    "filterVerb": "filter",
    "prioritizeVerb": "prioritize",
    "weight": 3,
    "nodeCacheCapable": False,
    "ignorable": True,
}


def test_without_a_configuration_the_scheduler_keeps_its_flags(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, prometheus=False)
    argv = cluster._scheduler_argv(tmp_path / "bins", "kube-scheduler", 10259, None, "x")
    assert f"--kubeconfig={tmp_path / 'scheduler.kubeconfig'}" in argv
    assert "--leader-elect=true" in argv
    assert not any(arg.startswith("--config=") for arg in argv)


def test_a_configuration_file_carries_the_kubeconfig_and_the_lease(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, prometheus=False)
    config = {"profiles": [{"schedulerName": "load-aware"}], "extenders": [EXTENDER]}
    argv = cluster._scheduler_argv(tmp_path / "bins", "second", 10260, config, "load-aware")
    # --kubeconfig would be ignored beside --config: it is not passed at all.
    assert not any(arg.startswith("--kubeconfig=") for arg in argv)
    assert "--secure-port=10260" in argv
    path = tmp_path / "second.config.yaml"
    assert f"--config={path}" in argv
    written = yaml.safe_load(path.read_text())
    assert written["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert written["kind"] == "KubeSchedulerConfiguration"
    assert written["clientConnection"] == {"kubeconfig": str(tmp_path / "scheduler.kubeconfig")}
    assert written["leaderElection"] == {
        "leaderElect": True,
        "resourceNamespace": "kube-system",
        "resourceName": "load-aware",
    }
    assert written["profiles"] == config["profiles"]
    assert written["extenders"] == [EXTENDER]


def test_what_the_configuration_says_wins_over_the_defaults(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, prometheus=False)
    config = {
        "clientConnection": {"qps": 100},
        "leaderElection": {"leaderElect": False},
        "enableProfiling": True,
    }
    cluster._scheduler_argv(tmp_path / "bins", "s", 1, config, "lease")
    written = yaml.safe_load((tmp_path / "s.config.yaml").read_text())
    assert written["clientConnection"]["qps"] == 100
    assert written["leaderElection"]["leaderElect"] is False
    assert written["enableProfiling"] is True


@pytest.mark.parametrize(
    "election",
    [
        {"resourceNamespace": "kn-rescheduler"},
        {"resourceName": "another"},
        {"leaderElect": False},
    ],
)
def test_a_second_scheduler_keeps_the_local_lease(tmp_path: Path, election: dict[str, Any]) -> None:
    cluster = Cluster(tmp_path, prometheus=False)
    with pytest.raises(ValueError, match="drop leaderElection"):
        cluster.start_scheduler("load-aware", {"leaderElection": election})
