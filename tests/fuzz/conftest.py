"""Property-based fuzzing (hypothesis) of every entry point and every annotation we parse.

Two budgets, chosen by ``HYPOTHESIS_PROFILE``:

- ``ci`` (the default, what `make test` runs): 75 examples per property, the same ones on
  every run (``derandomize``), so a red CI is a change in the code, not a lucky draw;
- ``fuzz`` (`make fuzz`): 1,000 per property, random, with the failing examples it finds kept
  in ``.local/hypothesis`` so that the next run tries them first.

Properties that go through the functions' HTTP entry points cost a request each (and some an
API call refused by an unreachable server, about 0.6 s with the client's retries), so they take
a share of the budget (`strategies.examples`). Deadlines are off where a request or a retry
back-off makes timing meaningless, and in CI, where a shared machine makes it noise; the full
run gives pure code 2 s an example, where a slow one is a finding (a regular expression that
backtracks, a parse that explodes).

test_one_field_fuzz.py is not random: every field of every realistic pod, one at a time, with a
value of each JSON type, the same in both profiles.

Both end with one line of figures per property (`pytest_terminal_summary` below). What the
fuzzers found is kept as minimal examples in test_found_by_fuzzing.py (the bugs still open
there are strict xfails, and test_one_field_fuzz.PINNED, the one place that expects them). The
properties tolerate none of it; the one allowance they make, a pod no API server sends refused
as malformed, is contract.py.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

# The handler tests' fixtures: a functions-framework test client per function, and a
# kubeconfig whose API server refuses every connection (a real transient failure).
from tests.handlers.conftest import function_client, unreachable_kubeconfig

__all__ = ["function_client", "quiet_logs", "unreachable_kubeconfig"]

ROOT = Path(__file__).resolve().parents[2]
PROFILE_ENV = "HYPOTHESIS_PROFILE"

# Big generated pods and bodies are the point here, and the machine is shared: neither is a
# problem with the test.
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]

settings.register_profile(
    "ci",
    max_examples=75,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=_HEALTH,
    print_blob=True,
)
settings.register_profile(
    "fuzz",
    max_examples=1000,
    database=DirectoryBasedExampleDatabase(str(ROOT / ".local" / "hypothesis")),
    deadline=timedelta(seconds=2),
    suppress_health_check=_HEALTH,
    print_blob=True,
)
PROFILE = os.environ.get(PROFILE_ENV, "ci")
settings.load_profile(PROFILE)


@pytest.fixture
def quiet_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only warnings and errors from the functions while fuzzing: every request still takes
    every code path (the compact line and the redacted event are built whatever the level),
    but thousands of INFO lines would bury the one a failure needs. The variable is for a
    function configured in this test, the level for one an earlier test configured."""
    monkeypatch.setenv("KN_RESCHEDULER_LOG_LEVEL", "WARNING")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.setLevel(level)


# -- the figures ------------------------------------------------------------------------------

# What hypothesis' own statistics say about each property (its pytest plugin attaches them to
# the teardown report whether or not --hypothesis-show-statistics asked to print them).
_STATS_KEY = "_hypothesis_stats"
_CASES = re.compile(r"(\d+) passing, (\d+) failing, and (\d+) invalid")
# A test that is not a hypothesis property reports its examples and how many failed with
# record_property.
EXAMPLES = "fuzz_examples"
FAILING = "fuzz_failing"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per fuzzed property: examples run, failing ones and the time it took; then
    the totals."""
    seconds: dict[str, float] = {}
    rows: list[tuple[str, int, int, float]] = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", "") != "call":
                continue
            seconds[report.nodeid] = report.duration
            recorded = dict(getattr(report, "user_properties", ()))
            if EXAMPLES in recorded and "tests/fuzz/" in report.nodeid:
                rows.append(
                    (
                        report.nodeid.split("::")[-1],
                        int(recorded[EXAMPLES]),
                        int(recorded.get(FAILING, 0)),
                        report.duration,
                    )
                )
    for reports in terminalreporter.stats.values():
        for report in reports:
            stats = report.__dict__.get(_STATS_KEY)
            if not stats or "tests/fuzz/" not in report.nodeid:
                continue
            counts = [tuple(int(n) for n in found) for found in _CASES.findall(stats)]
            rows.append(
                (
                    report.nodeid.split("::")[-1],
                    sum(passing + failing for passing, failing, _ in counts),
                    sum(failing for _, failing, _ in counts),
                    seconds.get(report.nodeid, 0.0),
                )
            )
    if not rows:
        return
    terminalreporter.section(f"fuzzing figures (profile {PROFILE})")
    width = max(len(row[0]) for row in rows)
    write = terminalreporter.write_line
    write(f"{'property':<{width}}  examples  failing  time (s)")
    for name, examples, failing, took in sorted(rows):
        write(f"{name:<{width}}  {examples:>8}  {failing:>7}  {took:>8.1f}")
    write(
        f"{'total':<{width}}  {sum(r[1] for r in rows):>8}  {sum(r[2] for r in rows):>7}  "
        f"{sum(r[3] for r in rows):>8.1f}"
    )
