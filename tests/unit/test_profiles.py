"""Profiles: one setting picks a preset of the load-aware settings; explicit settings win."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.platform.config import Config, ConfigError, _convert
from shared.platform.profiles import PROFILES

SEED_PROFILES = (
    "default",
    "production",
    "development",
    "hpc",
    "memory",
    "microservices",
    "multitenant",
)


def test_the_seeds_seven_profiles_are_offered() -> None:
    assert tuple(PROFILES) == SEED_PROFILES


@pytest.mark.parametrize("name", SEED_PROFILES)
def test_each_profile_gives_a_valid_config_with_its_values(name: str) -> None:
    profile = PROFILES[name]
    for key, value in profile.values.items():
        # Every preset value is one the setting itself would accept.
        assert _convert(key, value, key) == value
    cfg = Config.from_env({"KN_RESCHEDULER_PROFILE": name})
    assert cfg.profile == name
    for key, value in profile.values.items():
        assert getattr(cfg, key) == value
    assert profile.why


def test_the_default_profile_is_the_configs_own_defaults() -> None:
    assert Config.from_env({}) == Config()


def test_an_explicit_setting_wins_over_the_profile() -> None:
    cfg = Config.from_env(
        {"KN_RESCHEDULER_PROFILE": "production", "KN_RESCHEDULER_CPU_THRESHOLD": "72"}
    )
    assert cfg.cpu_threshold == 72.0
    assert cfg.memory_threshold == PROFILES["production"].values["memory_threshold"]


def test_a_profile_in_the_file_with_an_override_from_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("profile: memory\nmemory_threshold: 65\n")
    cfg = Config.from_env({"KN_RESCHEDULER_CPU_SCORE_WEIGHT": "0.3"}, file)
    assert (cfg.profile, cfg.memory_threshold, cfg.cpu_score_weight) == ("memory", 65.0, 0.3)
    assert cfg.memory_score_weight == 0.8


def test_an_unknown_profile_stops_the_function_with_the_list() -> None:
    with pytest.raises(ConfigError, match="unknown profile 'fast'; profiles: default, production"):
        Config.from_env({"KN_RESCHEDULER_PROFILE": "fast"})


def test_an_override_that_breaks_the_profiles_order_is_refused() -> None:
    # hpc's threshold is 85; a high-load boundary above it makes no bucket sense.
    with pytest.raises(ConfigError, match="high_load_threshold"):
        Config.from_env(
            {"KN_RESCHEDULER_PROFILE": "hpc", "KN_RESCHEDULER_HIGH_LOAD_THRESHOLD": "90"}
        )
