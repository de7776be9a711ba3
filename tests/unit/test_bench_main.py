"""``python -m dev.bench``'s partial runs: a re-measurement of some systems never takes the full
run's results file (nor an earlier re-measurement's), a run of another scenario or kubelet
back-off says so in its name, and ``--systems``, ``--scenario`` and ``--kubelet-backoff`` are
refused where they would silently measure something else (or rewrite RESULTS.md with it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.bench import recovery
from dev.bench.__main__ import NAMES, main, results_name, timing

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
