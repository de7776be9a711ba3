"""Configuration from the environment and a mounted file, and the errors a bad value gives."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from shared.platform.config import (
    DEFAULT_FAILED_POD_REASONS,
    Config,
    ConfigError,
    describe,
)
from shared.platform.reads import READS


def test_the_defaults_match_the_design() -> None:
    cfg = Config.from_env({})
    assert cfg == Config()
    assert cfg.crashloop_restart_threshold == 3
    assert cfg.excluded_namespaces == {"kube-system", "kn-rescheduler"}
    assert cfg.reset_after == timedelta(minutes=30)
    assert cfg.pending_stuck_after == timedelta(minutes=10)
    assert cfg.api_timeout_seconds == 2.0
    assert cfg.handled_uids_max == 64
    assert not (cfg.forward_unstamped or cfg.kse_compat or cfg.use_eviction or cfg.dry_run)
    assert "OOMKilled" in cfg.termination_reasons
    assert "Evicted" in cfg.failed_pod_reasons
    assert "ImagePullBackOff" in cfg.waiting_reasons


def test_every_setting_can_be_set_from_the_environment() -> None:
    cfg = Config.from_env(
        {
            "KN_RESCHEDULER_WAITING_REASONS": "RunContainerError, ErrImagePull",
            "KN_RESCHEDULER_TERMINATION_REASONS": "OOMKilled,StartError",
            "KN_RESCHEDULER_FAILED_POD_REASONS": "Evicted",
            "KN_RESCHEDULER_CRASHLOOP_RESTART_THRESHOLD": "5",
            "KN_RESCHEDULER_EXCLUDED_NAMESPACES": "kube-system,monitoring",
            "KN_RESCHEDULER_NAMESPACE": "rescheduler",
            "KN_RESCHEDULER_RESET_AFTER": "1h",
            "KN_RESCHEDULER_PENDING_STUCK_AFTER": "5m",
            "KN_RESCHEDULER_FORWARD_UNSTAMPED": "true",
            "KN_RESCHEDULER_KSE_COMPAT": "yes",
            "KN_RESCHEDULER_USE_EVICTION": "1",
            "KN_RESCHEDULER_DRY_RUN": "on",
            "KN_RESCHEDULER_API_TIMEOUT": "500ms",
            "KN_RESCHEDULER_HANDLED_UIDS_MAX": "128",
            "KN_RESCHEDULER_MAX_RETRIES": "20",
            "KN_RESCHEDULER_SOMETHING_A_HANDLER_USES": "ignored",
            "PATH": "/usr/bin",
        }
    )
    assert cfg.waiting_reasons == {"RunContainerError", "ErrImagePull"}
    assert cfg.termination_reasons == {"OOMKilled", "StartError"}
    assert cfg.failed_pod_reasons == {"Evicted"}
    assert cfg.crashloop_restart_threshold == 5
    assert cfg.excluded_namespaces == {"kube-system", "monitoring"}
    assert cfg.is_excluded_namespace("rescheduler")
    assert cfg.reset_after == timedelta(hours=1)
    assert cfg.pending_stuck_after == timedelta(minutes=5)
    assert cfg.forward_unstamped and cfg.kse_compat and cfg.use_eviction and cfg.dry_run
    assert cfg.api_timeout_seconds == 0.5
    assert cfg.handled_uids_max == 128
    assert cfg.max_retries == 20


def test_an_empty_namespace_list_leaves_only_the_own_namespace_excluded() -> None:
    cfg = Config.from_env({"KN_RESCHEDULER_EXCLUDED_NAMESPACES": ""})
    assert cfg.excluded_namespaces == frozenset()
    assert cfg.is_excluded_namespace("kn-rescheduler")
    assert not cfg.is_excluded_namespace("kube-system")


BAD_ENV = {
    "a threshold that is not a number": ("KN_RESCHEDULER_CRASHLOOP_RESTART_THRESHOLD", "three"),
    "a zero threshold": ("KN_RESCHEDULER_CRASHLOOP_RESTART_THRESHOLD", "0"),
    "a negative bound": ("KN_RESCHEDULER_HANDLED_UIDS_MAX", "-4"),
    "a duration without a unit": ("KN_RESCHEDULER_RESET_AFTER", "30"),
    "a zero timeout": ("KN_RESCHEDULER_API_TIMEOUT", "0s"),
    "a switch that is neither true nor false": ("KN_RESCHEDULER_DRY_RUN", "maybe"),
    "an empty namespace name": ("KN_RESCHEDULER_NAMESPACE", " "),
    "a maximum beyond reason": ("KN_RESCHEDULER_MAX_RETRIES", "100000"),
    "a reason that fails on every node": (
        "KN_RESCHEDULER_WAITING_REASONS",
        "RunContainerError,CreateContainerConfigError",
    ),
}


@pytest.mark.parametrize(("variable", "value"), BAD_ENV.values(), ids=BAD_ENV.keys())
def test_a_bad_value_names_its_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Config.from_env({variable: value})
    assert raised.value.variable == variable
    assert str(raised.value).startswith(f"{variable}: ")


def test_a_yaml_file_is_read_and_the_environment_wins(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(
        "crashloop_restart_threshold: 4\n"
        "excluded_namespaces: [kube-system, monitoring]\n"
        "reset_after: 45m\n"
        "kse_compat: true\n"
        "failed_pod_reasons: Evicted,NodeLost\n"
    )
    cfg = Config.from_env({"KN_RESCHEDULER_CRASHLOOP_RESTART_THRESHOLD": "6"}, file)
    assert cfg.crashloop_restart_threshold == 6
    assert cfg.excluded_namespaces == {"kube-system", "monitoring"}
    assert cfg.reset_after == timedelta(minutes=45)
    assert cfg.kse_compat is True
    assert cfg.failed_pod_reasons == {"Evicted", "NodeLost"}


def test_a_json_file_named_by_the_environment_is_read(tmp_path: Path) -> None:
    file = tmp_path / "config.json"
    file.write_text(json.dumps({"dry_run": True, "handled_uids_max": 16}))
    cfg = Config.from_env({"KN_RESCHEDULER_CONFIG_FILE": str(file)})
    assert cfg.dry_run is True
    assert cfg.handled_uids_max == 16


def test_an_empty_file_means_the_defaults(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("")
    assert Config.from_env({}, file) == Config()


BAD_FILES = {
    "an unknown setting (a typo)": "crashloop_treshold: 4\n",
    "a list instead of a mapping": "- a\n- b\n",
    "invalid YAML": "a: [\n",
}


@pytest.mark.parametrize("text", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_a_bad_file_is_an_error(tmp_path: Path, text: str) -> None:
    file = tmp_path / "config.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as raised:
        Config.from_env({}, file)
    assert raised.value.variable == "KN_RESCHEDULER_CONFIG_FILE"


def test_a_bad_value_in_the_file_names_the_setting_and_the_file(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("pending_stuck_after: 10\n")
    with pytest.raises(ConfigError, match=r"pending_stuck_after in config.yaml"):
        Config.from_env({}, file)


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        Config.from_env({}, tmp_path / "absent.yaml")


def test_a_config_cannot_be_built_to_move_failures_that_follow_the_pod() -> None:
    with pytest.raises(ConfigError, match="InvalidImageName"):
        Config(waiting_reasons=frozenset({"InvalidImageName"}))


def test_describe_lists_every_setting_on_one_line() -> None:
    line = describe(Config())
    shown = json.loads(line)
    assert shown["failed_pod_reasons"] == sorted(DEFAULT_FAILED_POD_REASONS)
    assert shown["reset_after"] == 1800.0
    assert "\n" not in line


@pytest.mark.parametrize(
    ("variable", "raw", "field", "expected"),
    [
        ("KN_RESCHEDULER_SUSPECT_MAX_SHARE", "30%", "suspect_max_share", 0.3),
        ("KN_RESCHEDULER_SUSPECT_MAX_SHARE", "0.5", "suspect_max_share", 0.5),
        ("KN_RESCHEDULER_SUSPECT_AFFINITY_WEIGHT", "0", "suspect_affinity_weight", 0),
        ("KN_RESCHEDULER_FAILING_AFFINITY_WEIGHT", "0", "failing_affinity_weight", 0),
        ("KN_RESCHEDULER_PRESSURE_LABEL", " status = presure ", "pressure_label", "status=presure"),
        ("KN_RESCHEDULER_SUSPECT_WINDOW", "2m", "suspect_window", timedelta(minutes=2)),
    ],
)
def test_node_level_settings_are_read_from_the_environment(
    variable: str, raw: str, field: str, expected: object
) -> None:
    assert getattr(Config.from_env({variable: raw}), field) == expected


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("KN_RESCHEDULER_SUSPECT_MAX_SHARE", "0"),
        ("KN_RESCHEDULER_SUSPECT_MAX_SHARE", "150%"),
        ("KN_RESCHEDULER_SUSPECT_MAX_SHARE", "most"),
        ("KN_RESCHEDULER_SUSPECT_AFFINITY_WEIGHT", "101"),
        ("KN_RESCHEDULER_FAILING_AFFINITY_WEIGHT", "heavy"),
        ("KN_RESCHEDULER_PRESSURE_AFFINITY_WEIGHT", "-1"),
        ("KN_RESCHEDULER_PRESSURE_LABEL", "status"),
        ("KN_RESCHEDULER_PRESSURE_LABEL", "=presure"),
    ],
)
def test_unusable_node_level_settings_stop_the_function_naming_the_variable(
    variable: str, raw: str
) -> None:
    with pytest.raises(ConfigError) as err:
        Config.from_env({variable: raw})
    assert err.value.variable == variable


@pytest.mark.parametrize(
    ("variable", "raw", "message"),
    [
        ("KN_RESCHEDULER_CPU_THRESHOLD", "120", "percentage from 0 to 100"),
        ("KN_RESCHEDULER_CPU_THRESHOLD", "hot", "percentage from 0 to 100"),
        ("KN_RESCHEDULER_MEMORY_THRESHOLD", "nan", "percentage"),
        ("KN_RESCHEDULER_CPU_SCORE_WEIGHT", "-1", "number from 0 to 10"),
        ("KN_RESCHEDULER_USAGE_SOURCE", "datadog", "prometheus, metrics-api"),
        ("KN_RESCHEDULER_LOW_LOAD_THRESHOLD", "70", "low_load_threshold < high_load_threshold"),
        ("KN_RESCHEDULER_LOAD_AFFINITY_WEIGHT", "101", "weight from 0 to 100"),
    ],
)
def test_a_bad_load_aware_setting_names_itself(variable: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        Config.from_env({variable: raw})
    assert variable in str(caught.value) or "THRESHOLD" in str(caught.value)


def test_both_score_weights_at_zero_are_refused() -> None:
    with pytest.raises(ConfigError, match="cannot both be 0"):
        Config.from_env(
            {"KN_RESCHEDULER_CPU_SCORE_WEIGHT": "0", "KN_RESCHEDULER_MEMORY_SCORE_WEIGHT": "0"}
        )


def test_load_aware_settings_read_percent_signs_and_durations() -> None:
    cfg = Config.from_env(
        {
            "KN_RESCHEDULER_CPU_THRESHOLD": "75%",
            "KN_RESCHEDULER_USAGE_STALE_AFTER": "90s",
            "KN_RESCHEDULER_USAGE_SOURCE": "metrics-api",
        }
    )
    assert (cfg.cpu_threshold, cfg.usage_stale_after.total_seconds(), cfg.usage_source) == (
        75.0,
        90.0,
        "metrics-api",
    )


# --- each function reads its own settings (Config.for_function, shared/platform/reads.py) -------


def test_a_function_takes_its_own_settings_from_the_environment() -> None:
    cfg = Config.for_function("rebalance-nodes", {"KN_RESCHEDULER_REBALANCE_MAX_PER_RUN": "9"})
    assert cfg.rebalance_max_per_run == 9


def test_a_setting_a_function_does_not_read_keeps_its_default_good_or_bad() -> None:
    given = {"KN_RESCHEDULER_REBALANCE_MAX_PER_RUN": "9", "KN_RESCHEDULER_REBALANCE_GAP": "lots"}
    cfg = Config.for_function("detect-failures", given)
    assert cfg.rebalance_max_per_run == Config().rebalance_max_per_run
    with pytest.raises(ConfigError, match="KN_RESCHEDULER_REBALANCE_GAP"):
        Config.for_function("rebalance-nodes", given)


@pytest.mark.parametrize("function", sorted(READS))
def test_every_function_reads_the_dry_run_and_the_namespaces_whatever_its_code_says(
    function: str,
) -> None:
    given = {
        "KN_RESCHEDULER_DRY_RUN": "true",
        "KN_RESCHEDULER_NAMESPACE": "ops",
        "KN_RESCHEDULER_EXCLUDED_NAMESPACES": "payments",
    }
    cfg = Config.for_function(function, given)
    assert (cfg.dry_run, cfg.namespace, cfg.excluded_namespaces) == (
        True,
        "ops",
        frozenset({"payments"}),
    )


def test_a_profile_presets_only_what_a_function_reads() -> None:
    given = {"KN_RESCHEDULER_PROFILE": "hpc"}
    assert Config.for_function("score-nodes", given).cpu_threshold == (
        Config.from_env(given).cpu_threshold
    )
    assert Config.for_function("detect-failures", given).cpu_threshold == Config().cpu_threshold


def test_settings_checked_together_are_checked_where_a_function_reads_them_all() -> None:
    # A CPU threshold under the default high-load boundary: annotate-usage, which draws the
    # load buckets from both, refuses it; rebalance-nodes reads the threshold alone and runs.
    given = {"KN_RESCHEDULER_CPU_THRESHOLD": "50"}
    with pytest.raises(ConfigError, match="KN_RESCHEDULER_HIGH_LOAD_THRESHOLD"):
        Config.for_function("annotate-usage", given)
    assert Config.for_function("rebalance-nodes", given).cpu_threshold == 50.0


def test_a_file_s_setting_of_another_function_is_left_unread_but_a_typo_is_still_refused(
    tmp_path: Path,
) -> None:
    file = tmp_path / "settings.yaml"
    file.write_text("rebalance_gap: lots\ncrashloop_restart_threshold: 6\n")
    assert Config.for_function("detect-failures", {}, file).crashloop_restart_threshold == 6
    file.write_text("rebalance_gapp: 10\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        Config.for_function("detect-failures", {}, file)


def test_an_unknown_function_is_refused() -> None:
    with pytest.raises(ConfigError, match="no function 'detect-failure'"):
        Config.for_function("detect-failure", {})


def test_describe_for_a_function_shows_what_it_reads_and_no_more() -> None:
    shown = json.loads(describe(Config(), "label-nodes"))
    assert set(shown) == READS["label-nodes"]
    assert "rebalance_gap" not in shown and "pressure_max_share" in shown
