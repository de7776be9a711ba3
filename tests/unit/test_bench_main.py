"""``python -m bench``'s partial runs: a re-measurement of some systems never takes the full
run's results file (nor an earlier re-measurement's), and ``--systems`` is refused where it
would silently measure something else."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.__main__ import NAMES, main, results_name

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
    ],
)
def test_systems_is_refused_before_anything_runs(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "--systems" in capsys.readouterr().err
