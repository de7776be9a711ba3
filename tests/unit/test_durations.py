"""dev/tools/durations.py: a run's time per file, from JUnit XML as pytest 9 writes it (the
elements and attributes below are copied from a `--junitxml` run of this repository)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.tools import durations

RECORDED = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">\
<testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4" time="130.500" \
timestamp="2026-11-29T09:55:42.990448+00:00" hostname="vm">\
<testcase classname="tests.e2e.test_moves" name="test_a_deployment_moves" time="100.250" />\
<testcase classname="tests.e2e.test_moves" name="test_a_job_moves" time="20.000">\
<failure message="AssertionError">boom</failure></testcase>\
<testcase classname="tests.e2e.test_moves.TestNested" name="test_in_a_class" time="0.250" />\
<testcase classname="tests.unit.test_quantity" name="test_cpu[250m-250]" time="10.000">\
<skipped type="pytest.skip" message="no">skip</skipped></testcase>\
</testsuite></testsuites>"""


@pytest.fixture
def results(tmp_path: Path) -> Path:
    path = tmp_path / "results.xml"
    path.write_text(RECORDED)
    return path


def test_a_class_inside_a_module_counts_for_its_file() -> None:
    assert durations.file_of("tests.e2e.test_moves.TestNested") == "tests/e2e/test_moves.py"
    assert durations.file_of("tests.e2e.test_moves") == "tests/e2e/test_moves.py"


def test_each_file_sums_its_tests_setup_included_and_counts_what_did_not_pass(
    results: Path,
) -> None:
    run = durations.read(results)
    moves = run.files["tests/e2e/test_moves.py"]
    assert (moves.tests, moves.failed, moves.skipped) == (3, 1, 0)
    assert moves.seconds == pytest.approx(120.5)
    assert moves.slowest == (100.25, "test_a_deployment_moves")
    assert run.files["tests/unit/test_quantity.py"].skipped == 1
    assert run.seconds == pytest.approx(130.5)


def test_the_table_ranks_files_by_time_and_ends_with_the_layers(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert durations.main([str(results), "--top", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("tests/e2e/test_moves.py") and "2:00" in out[1]
    assert "3, 1 failed" in out[1]
    assert out[2] == "... 1 more files, 0:10 together"
    assert out[3] == (
        "4 tests, 2:10 from start to end, 2:10 of tests' own time: "
        "e2e 3 tests 2:00, unit 1 tests 0:10"
    )


def test_two_runs_side_by_side_per_file(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert durations.main([str(results), "--compare", str(results), "--markdown"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "| `tests/e2e/test_moves.py` | 2:00 | 2:00 | 3 -> 3 |"
    assert out[-1] == "| the run, start to end | 2:10 | 2:10 | 4 -> 4 |"


def test_a_file_that_is_not_junit_xml_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text("<html/>")
    with pytest.raises(durations.ResultsError, match="holds no <testsuite>"):
        durations.read(bad)
    with pytest.raises(durations.ResultsError, match="cannot read"):
        durations.read(tmp_path / "missing.xml")
    assert durations.main([str(bad)]) == 2
    assert "holds no <testsuite>: not pytest's JUnit XML" in capsys.readouterr().err


def test_runs_made_one_after_the_other_add_up(results: Path, tmp_path: Path) -> None:
    alone = tmp_path / "alone.xml"
    alone.write_text(RECORDED.replace("tests.unit.test_quantity", "tests.e2e.test_soak_quick"))
    run = durations.read(results, alone)
    assert run.seconds == pytest.approx(261.0)
    assert run.files["tests/e2e/test_moves.py"].tests == 6
    assert run.files["tests/e2e/test_soak_quick.py"].skipped == 1
