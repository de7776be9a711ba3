"""``python -m dev.bench``'s partial runs: a re-measurement of some systems never takes the full
run's results file (nor an earlier re-measurement's), a run of another scenario, kubelet
back-off or on real nodes says so in its name, and ``--systems``, ``--scenario``,
``--kubelet-backoff`` and ``--real-nodes`` are refused where they would silently measure
something else (or rewrite RESULTS.md with it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.bench import recovery
from dev.bench.__main__ import (
    NAMES,
    REAL_BACKOFF_MIN_BOUND,
    main,
    real_node_scales,
    results_name,
    timing,
    variant_of,
)
from dev.bench.common import FULL, QUICK
from dev.localcluster.cluster import Cluster
from dev.localcluster.nodeimages import BUSYBOX_IMAGE
from dev.localcluster.realnode import NODE_DEPENDENT_APP

DAY = "2026-11-23"


@pytest.mark.parametrize(
    ("only", "names", "systems", "quick", "expected"),
    [
        (None, list(NAMES), None, False, DAY),
        (None, list(NAMES), None, True, f"{DAY}-quick"),
        (["recovery"], ["recovery"], None, False, f"{DAY}-recovery"),
        (
            ["recovery"],
            ["recovery"],
            ["kn-rescheduler"],
            False,
            f"{DAY}-recovery-kn-rescheduler",
        ),
        (
            ["recovery"],
            ["recovery"],
            ["vanilla", "kn-rescheduler"],
            True,
            f"{DAY}-recovery-vanilla-kn-rescheduler-quick",
        ),
    ],
)
def test_a_results_file_names_what_the_run_measured(
    tmp_path: Path,
    only: list[str] | None,
    names: list[str],
    systems: list[str] | None,
    quick: bool,
    expected: str,
) -> None:
    assert results_name(tmp_path, DAY, names, only, systems, quick) == expected


def test_a_run_of_another_scenario_or_back_off_says_so_and_never_takes_the_committed_ones(
    tmp_path: Path,
) -> None:
    (tmp_path / f"{DAY}-recovery.json").write_text("{}")
    args = (DAY, ["recovery"], ["recovery"], None, False)
    assert results_name(tmp_path, *args, ["spread"]) == f"{DAY}-recovery-spread"
    both = results_name(tmp_path, *args, ["spread", "real-backoff"])
    assert both == f"{DAY}-recovery-spread-real-backoff"
    named = results_name(
        tmp_path, DAY, ["recovery"], ["recovery"], ["kn-rescheduler"], False, ["real-backoff"]
    )
    assert named == f"{DAY}-recovery-real-backoff-kn-rescheduler"


def test_the_kubelet_backoff_option_picks_the_fake_kubelets_clock() -> None:
    assert timing("compressed").backoff == "compressed"
    assert timing("real").backoff == "kubelet"
    with pytest.raises(ValueError, match="unknown back-off"):
        timing("slow")


def test_a_second_re_measurement_the_same_day_is_numbered_and_leaves_the_first(
    tmp_path: Path,
) -> None:
    (tmp_path / f"{DAY}.json").write_text("{}")
    args = (DAY, ["recovery"], ["recovery"], ["kn-rescheduler"], False)
    first = results_name(tmp_path, *args)
    assert first == f"{DAY}-recovery-kn-rescheduler"
    (tmp_path / f"{first}.json").write_text("{}")
    assert results_name(tmp_path, *args) == f"{DAY}-recovery-kn-rescheduler-2"
    (tmp_path / f"{DAY}-recovery-kn-rescheduler-2.json").write_text("{}")
    assert results_name(tmp_path, *args) == f"{DAY}-recovery-kn-rescheduler-3"


def test_a_full_run_still_replaces_the_days_full_run(tmp_path: Path) -> None:
    (tmp_path / f"{DAY}.json").write_text("{}")
    assert results_name(tmp_path, DAY, list(NAMES), None, None, False) == DAY


@pytest.mark.parametrize(
    "argv",
    [
        ["--systems", "kn-rescheduler"],  # would be a full run: RESULTS.md rewritten
        ["--only", "detect", "--systems", "kn-rescheduler"],  # nothing to select
        ["--only", "recovery", "--systems", "kube-descheduler"],  # unknown name
        ["--scenario", "spread"],  # a full run: RESULTS.md rewritten with another scenario
        ["--only", "scale", "--scenario", "spread"],  # the scale run has its own placement
        ["--only", "recovery", "--scenario", "anywhere"],  # unknown scenario
        ["--kubelet-backoff", "real"],  # a full run: RESULTS.md rewritten with another clock
        ["--only", "recovery", "--kubelet-backoff", "kubelet"],  # spelled "real"
        ["--real-nodes", "3"],  # a full run: everything else runs on kwok nodes
        ["--only", "scale", "--real-nodes", "3"],  # the scale run starts its own kwok cluster
        ["--only", "recovery", "--only", "webhook", "--real-nodes", "3"],  # recovery alone
        ["--only", "recovery", "--real-nodes", "1"],  # no healthy node left
    ],
)
def test_a_misplaced_option_is_refused_before_anything_runs(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert f"{argv[-2]}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("prefer-faulty", ["node-0", "node-1", "node-2", "node-0"]),
        ("spread", [None, None, None, None]),
    ],
)
def test_each_scenario_gives_the_deployments_their_node_preference(
    scenario: str, expected: list[str | None]
) -> None:
    faulty = ["node-0", "node-1", "node-2"]
    assert [recovery.preferred_node(scenario, i, faulty) for i in range(4)] == expected
    body = recovery.deployment("web-0", 2, expected[0], [])
    affinity = body["spec"]["template"]["spec"]["affinity"]
    assert ("nodeAffinity" in affinity) == (scenario == "prefer-faulty")


def test_an_unknown_scenario_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        recovery.preferred_node("anywhere", 0, ["node-0"])


@pytest.mark.parametrize(
    ("scenario", "backoff", "real_nodes", "expected"),
    [
        ("prefer-faulty", "compressed", 0, []),
        ("prefer-faulty", "real", 0, ["real-backoff"]),
        ("prefer-faulty", "compressed", 3, ["3-real-nodes"]),
        # Real nodes back off as kubelets do: not named twice.
        ("prefer-faulty", "real", 3, ["3-real-nodes"]),
        ("spread", "real", 6, ["spread", "6-real-nodes"]),
    ],
)
def test_a_real_node_run_names_its_nodes(
    scenario: str, backoff: str, real_nodes: int, expected: list[str]
) -> None:
    assert variant_of(scenario, backoff, real_nodes) == expected


def test_a_real_node_run_never_takes_a_kwok_runs_file(tmp_path: Path) -> None:
    (tmp_path / f"{DAY}-recovery-vanilla-kn-rescheduler.json").write_text("{}")
    args = (DAY, ["recovery"], ["recovery"], ["vanilla", "kn-rescheduler"], False)
    name = results_name(tmp_path, *args, variant_of("prefer-faulty", "compressed", 3))
    assert name == f"{DAY}-recovery-3-real-nodes-vanilla-kn-rescheduler"


def test_real_nodes_get_scales_two_cores_hold_and_the_real_back_offs_window() -> None:
    three = real_node_scales(FULL, 3)
    assert (three.nodes, three.faulty, three.deployments, three.replicas) == (3, 1, 2, 2)
    assert three.healthy_pods == 4 and three.recovery_bound == FULL.recovery_bound == 300.0
    assert real_node_scales(QUICK, 3).recovery_bound == REAL_BACKOFF_MIN_BOUND
    six = real_node_scales(FULL, 6)
    assert (six.faulty, six.deployments) == (2, 4)
    assert real_node_scales(FULL, 2).faulty == 1  # one healthy node left
    with pytest.raises(ValueError, match="at least 2"):
        real_node_scales(FULL, 1)


def test_real_nodes_run_busybox_with_the_node_dependent_app_and_a_short_grace_period() -> None:
    spec = recovery.deployment("web-0", 2, "real-0", [], real=True)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["image"] == BUSYBOX_IMAGE
    assert container["command"] == list(NODE_DEPENDENT_APP)
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert 0 < spec["terminationGracePeriodSeconds"] <= 5
    kwok = recovery.deployment("web-0", 2, "node-0", [])["spec"]["template"]["spec"]
    assert kwok["containers"] == [{"name": "app", "image": recovery.IMAGE}]
    assert kwok["terminationGracePeriodSeconds"] == 0


def test_the_nodes_and_back_off_a_recovery_run_reports_follow_its_cluster(tmp_path: Path) -> None:
    # Clusters are not started: what they would be is enough.
    real = Cluster(tmp_path / "real", nodes=0, real_nodes=3)
    assert recovery.node_kind(real) == "real"
    assert recovery.kubelet_backoff(real) == "real"
    kwok = Cluster(tmp_path / "kwok", nodes=3)
    assert (recovery.node_kind(kwok), recovery.kubelet_backoff(kwok)) == ("kwok", "compressed")
    assert recovery.FAULTS == {"kwok": "crashloop", "real": "app-crash"}


def test_a_cluster_mixing_kwok_and_real_nodes_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    mixed = Cluster(tmp_path, nodes=2, real_nodes=1)
    with pytest.raises(ValueError, match="nodes of one kind"):
        recovery.measure(mixed, FULL, tmp_path / "recovery", save_events=False, log=print)
