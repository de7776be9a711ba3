"""Every field of every realistic pod, one at a time, replaced by a value of each JSON type.

The random properties (test_classify_fuzz.py) damage a few fields at a time anywhere in a pod:
they reach odd combinations, but any one field only now and then, and 1,000 examples of them
missed F8 and F9 (test_found_by_fuzzing.py). This sweep is exhaustive for one field at a time
and the same on every run, whatever the profile: about 3,000 fields of the pods of
strategies.POD_BUILDERS, 7 values each, 2 configurations, judged by detect-failures and by the
sweep. Each may refuse a pod as malformed (contract.py), never crash.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from shared.api.keys import APISERVER_UPDATE
from shared.platform import events
from shared.platform.config import Config
from shared.pods.detect_failures.decide import detect
from shared.pods.sweep_failures.handler import find_failures
from shared.workloads.podshape import MalformedPod, malformed
from tests.fuzz.conftest import EXAMPLES, FAILING
from tests.fuzz.strategies import POD_BUILDERS, parent_of, paths_in
from tests.unit.pods import NOW

# One value of each JSON type; only one of them has the type the field had.
VALUES: tuple[object, ...] = (None, True, 7, 1.5, "x", ["x"], {"x": "x"})
CONFIGS = (
    Config(),
    Config(
        forward_unstamped=True,
        crashloop_restart_threshold=1,
        waiting_failure_after=timedelta(0),
        pending_stuck_after=timedelta(0),
        pull_stuck_after=timedelta(0),
    ),
)


@dataclass(frozen=True)
class Crash:
    judge: str
    field: str
    value: str
    error: str

    def __str__(self) -> str:
        return f"{self.judge} crashed on {self.field} = {self.value}: {self.error}"


# Found by this sweep and pinned as strict xfails in test_found_by_fuzzing.py, where each has
# its minimal example and the proposed fix. This test fails when one is no longer met (it was
# fixed: remove it here and its marker there) as well as on any crash not listed.
# Crashes found here and not fixed yet, by a predicate on the crash; each also has a strict
# xfail with its minimal example in test_found_by_fuzzing.py. F8 and F9 were found here.
PINNED: dict[str, Callable[[Any], bool]] = {}


def one_field_changed() -> Iterator[tuple[str, Any, str]]:
    """Every realistic pod with one field replaced: the pod, the field, the value's JSON."""
    for build in POD_BUILDERS:
        base = build()
        for path in paths_in(base):
            for value in VALUES:
                pod = copy.deepcopy(base)
                parent_of(pod, path)[path[-1]] = copy.deepcopy(value)
                field = ".".join(str(step) for step in path)
                yield field, pod, "null" if value is None else type(value).__name__


def crashes_judging(pod: dict[str, Any], cfg: Config, field: str, value: str) -> Iterator[Crash]:
    event = events.Event("1", "s", APISERVER_UPDATE, {"kind": "Pod"}, pod)
    try:
        detect(event, cfg, NOW)
    except events.BadEvent as error:
        # Refused for its shape only when the shape check agrees.
        assert not isinstance(error.__cause__, MalformedPod) or malformed(pod), error
    except Exception as error:
        yield Crash("detect", field, value, f"{type(error).__name__}: {error}")
    try:
        find_failures([pod], cfg, NOW)
    except Exception as error:
        yield Crash("sweep", field, value, f"{type(error).__name__}: {error}")


@pytest.fixture
def no_skip_warnings() -> Iterator[None]:
    """The sweep logs a warning per malformed pod it skips: thousands here, none of interest."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.usefixtures("no_skip_warnings")
def test_detect_failures_and_the_sweep_judge_any_one_field_of_any_type(
    record_property: Callable[[str, object], None],
) -> None:
    crashes: list[Crash] = []
    judged = 0
    for field, pod, value in one_field_changed():
        for cfg in CONFIGS:
            crashes.extend(crashes_judging(pod, cfg, field, value))
            judged += 1
    met = {key for key, matches in PINNED.items() if any(matches(c) for c in crashes)}
    unexpected = sorted(
        {str(c) for c in crashes if not any(m(c) for m in PINNED.values())}, key=len
    )
    # For the figures (conftest.py).
    record_property(EXAMPLES, judged)
    record_property(FAILING, len(unexpected))
    assert not unexpected, f"{len(unexpected)} crash(es), e.g.:\n" + "\n".join(unexpected[:10])
    assert met == set(PINNED), f"no longer met, fixed? {sorted(set(PINNED) - met)}"
