"""Each function, started as functions-framework starts it, reads, checks and logs its own
settings and no other (shared/platform/reads.py, generated from the code).

Every Service loads the same ConfigMap: a bad value of a setting only rebalance-nodes reads
must stop rebalance-nodes, and leave the webhook and the pod functions running.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

import pytest

from shared.platform.config import ConfigError
from shared.platform.reads import READS
from tests import logcapture
from tests.handlers.conftest import ClientFactory, settings

# Settings that refuse the value beside them, for a function to read or not.
BAD: Final = {
    "rebalance_gap": "lots",
    "suspect_workloads": "many",
    "kse_compat": "maybe",
    "usage_tolerance": "lots",
    "crashloop_pace": "soon",
    "extender_node_cache": "maybe",
    "pressure_max_share": "most",
    "use_eviction": "maybe",
    "api_timeout": "never",
    "min_tick_interval": "often",
    "dry_run": "perhaps",
}


def variable(name: str) -> str:
    return "KN_RESCHEDULER_" + name.upper()


def not_read_by(function: str) -> str:
    return next(name for name in BAD if name not in READS[function])


def read_by(function: str) -> str:
    return next(name for name in BAD if name in READS[function])


@pytest.mark.parametrize("function", sorted(READS))
def test_a_bad_value_of_another_function_s_setting_does_not_stop_a_function(
    function: str, function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    other = not_read_by(function)
    env = settings(function, unreachable_kubeconfig, **{variable(other): BAD[other]})
    client = function_client(function, **env)
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("function", sorted(READS))
def test_a_bad_value_of_a_function_s_own_setting_stops_it_at_start_naming_the_variable(
    function: str, function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    own = read_by(function)
    env = settings(function, unreachable_kubeconfig, **{variable(own): BAD[own]})
    with pytest.raises(ConfigError, match=variable(own)):
        function_client(function, **env)


@pytest.mark.parametrize("function", ["detect-failures", "mutate-admission", "rebalance-nodes"])
def test_a_function_logs_the_settings_it_reads_and_no_other(
    function: str,
    function_client: ClientFactory,
    unreachable_kubeconfig: Path,
) -> None:
    with logcapture.log_lines() as logged:
        function_client(function, **settings(function, unreachable_kubeconfig))
    lines = [json.loads(line) for line in logged()]
    (shown,) = [json.loads(line["config"]) for line in lines if line["msg"] == "configuration"]
    assert set(shown) == READS[function]
    assert len(shown) < 40, "a function reads far fewer than every setting"
