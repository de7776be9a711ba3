"""knative/config.env, the settings every function of an install reads, against Config.

The file is documentation as much as configuration: a setting it shows commented out must be a
real setting with the default the code has, and one it sets must start a function. And since a
setting given explicitly wins over a profile's preset, the file must not set any setting a
profile presets, or choosing a profile there would change nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import pytest

from shared.platform import config as config_module
from shared.platform.config import ENV_PREFIX, Config
from shared.platform.profiles import PROFILES

CONFIG_ENV: Final = Path(__file__).resolve().parents[2] / "knative" / "config.env"
_GIVEN: Final = re.compile(r"^(KN_RESCHEDULER_[A-Z0-9_]+)=(.*)$")
_SHOWN: Final = re.compile(r"^# (KN_RESCHEDULER_[A-Z0-9_]+)=(.*)$")
# Read by the functions' entry points, not by Config.
_NOT_CONFIG: Final = {"KN_RESCHEDULER_LOG_LEVEL", "KN_RESCHEDULER_LOG_EVENTS"}


def _lines() -> list[str]:
    return [line.strip() for line in CONFIG_ENV.read_text().splitlines()]


def given() -> dict[str, str]:
    return {m[1]: m[2] for line in _lines() if (m := _GIVEN.match(line))}


def shown() -> dict[str, str]:
    return {m[1]: m[2] for line in _lines() if (m := _SHOWN.match(line))}


def field(variable: str) -> str:
    return variable.removeprefix(ENV_PREFIX).lower()


def test_the_settings_the_file_gives_start_a_function_with_the_defaults_of_the_code() -> None:
    assert Config.from_env(given()) == Config()


@pytest.mark.parametrize("variable", sorted(shown()))
def test_a_setting_shown_commented_out_is_a_real_setting_with_its_default(variable: str) -> None:
    name = field(variable)
    assert name in config_module._FIELDS, f"{variable} is no setting of Config"
    value = config_module._convert(name, shown()[variable], variable)
    assert value == getattr(Config(), name), f"{variable}: the file says {shown()[variable]}"


@pytest.mark.parametrize("variable", sorted(given()))
def test_every_setting_the_file_gives_is_one_a_function_reads(variable: str) -> None:
    assert variable in _NOT_CONFIG or field(variable) in config_module._FIELDS


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_profile_chosen_in_the_file_takes_effect(profile: str) -> None:
    env = {**given(), "KN_RESCHEDULER_PROFILE": profile}
    config = Config.from_env(env)
    for name, value in PROFILES[profile].values.items():
        assert getattr(config, name) == value, f"{name} is pinned in config.env"


def test_the_file_chooses_the_default_profile_and_the_prometheus_source() -> None:
    assert given()["KN_RESCHEDULER_PROFILE"] == "default"
    assert given()["KN_RESCHEDULER_USAGE_SOURCE"] == "prometheus"
