"""A tick-driven function starts at most one full run per KN_RESCHEDULER_MIN_TICK_INTERVAL.

Through functions-framework's test client, the API server unreachable (a real refused
connection): the first tick runs (and fails on the API, or reports the outage), a second one
posted right after is answered 202 without a run and says why in the log; with the bound
turned off (``0s``) the second tick runs too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.api.keys import PING_EVENT_TYPE
from tests.handlers.conftest import ClientFactory, cloudevent, settings

TICKED = ("sweep-failures", "assess-nodes", "label-nodes", "annotate-usage", "rebalance-nodes")
NOT_RUN = "tick not run"


def tick(client: object) -> int:
    headers, body = cloudevent(PING_EVENT_TYPE, {})
    return int(client.post("/", headers=headers, data=body).status_code)  # type: ignore[attr-defined]


def skipped(caplog: pytest.LogCaptureFixture) -> list[str]:
    # Each record once: it may reach caplog's handler both here and through the root logger.
    records = {id(r): r for r in caplog.records}.values()
    return [r.getMessage() for r in records if r.getMessage().startswith(NOT_RUN)]


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog on the gate's own logger: a function's first start in the process replaces the
    root logger's handlers with its JSON lines (shared.platform.logs), caplog's among them."""
    ticks = logging.getLogger("shared.platform.ticks")
    ticks.addHandler(caplog.handler)
    yield caplog
    ticks.removeHandler(caplog.handler)


@pytest.mark.parametrize("name", TICKED)
def test_a_second_tick_right_after_the_first_starts_no_run(
    name: str,
    function_client: ClientFactory,
    unreachable_kubeconfig: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = function_client(name, **settings(name, unreachable_kubeconfig))
    with caplog.at_level(logging.INFO):
        tick(client)
        assert not skipped(caplog)
        assert tick(client) == 202
    (why,) = skipped(caplog)
    assert "at most one per 10s" in why and "KN_RESCHEDULER_MIN_TICK_INTERVAL" in why


@pytest.mark.parametrize("name", TICKED)
def test_with_the_bound_off_every_tick_runs(
    name: str,
    function_client: ClientFactory,
    unreachable_kubeconfig: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = settings(name, unreachable_kubeconfig, KN_RESCHEDULER_MIN_TICK_INTERVAL="0s")
    client = function_client(name, **env)
    with caplog.at_level(logging.INFO):
        first, second = tick(client), tick(client)
    assert not skipped(caplog)
    # The same answer twice: both ran into the same unreachable API server.
    assert first == second
