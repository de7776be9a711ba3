"""knative/config.env, the settings of an install, against Config and against the code.

The file is documentation as much as configuration: a setting it shows commented out must be a
real setting with the default the code has, and one it sets must start a function. Since a
setting given explicitly wins over a profile's preset, the file must not set any setting a
profile presets, or choosing a profile there would change nothing. And it is grouped by who
reads what: each group's "Read by" line must name exactly the functions whose code reads one
of its settings (shared/platform/reads.py, generated from the code), so that a reader tuning
label-nodes finds its settings, and the chart's values (grouped the same way) say the truth.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Final

import pytest
import yaml

from dev.tools import config_env
from dev.tools.config_env import ConfigEnvError
from shared.platform import config as config_module
from shared.platform.config import ENV_PREFIX, Config
from shared.platform.profiles import PROFILES
from shared.platform.reads import READS

KNATIVE: Final = Path(__file__).resolve().parents[2] / "knative"
# Read by the functions' entry points (shared/platform/logs.py), not by Config: every function.
_NOT_CONFIG: Final = {"KN_RESCHEDULER_LOG_LEVEL", "KN_RESCHEDULER_LOG_EVENTS"}
# What the install sets on purpose away from the code's default: the code knows no Prometheus.
_INSTALL_CHOICES: Final = {
    "prometheus_url": "http://prometheus-k8s.monitoring.svc.cluster.local:9090"
}


def given() -> dict[str, str]:
    return {s.env: s.value for s in config_env.settings() if s.set}


def shown() -> dict[str, str]:
    return {s.env: s.value for s in config_env.settings() if not s.set}


def field(variable: str) -> str:
    return variable.removeprefix(ENV_PREFIX).lower()


def service_env() -> set[str]:
    """The KN_RESCHEDULER_* variables a manifest of knative/ sets in a container's own env."""
    found: set[str] = set()
    for path in KNATIVE.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            for node in _walk(doc):
                if isinstance(node, dict) and isinstance(node.get("env"), list):
                    found.update(
                        str(e.get("name"))
                        for e in node["env"]
                        if isinstance(e, dict) and str(e.get("name", "")).startswith(ENV_PREFIX)
                    )
    return found


def _walk(node: object) -> list[object]:
    out = [node]
    if isinstance(node, dict):
        for value in node.values():
            out += _walk(value)
    elif isinstance(node, list):
        for value in node:
            out += _walk(value)
    return out


def test_the_settings_the_file_gives_are_the_defaults_of_the_code_but_the_install_s_choices() -> (
    None
):
    assert Config.from_env(given()) == Config(**_INSTALL_CHOICES)


@pytest.mark.parametrize("variable", sorted(shown()))
def test_a_setting_shown_commented_out_is_a_real_setting_with_its_default(variable: str) -> None:
    name = field(variable)
    assert name in config_module._FIELDS, f"{variable} is no setting of Config"
    value = config_module._convert(name, shown()[variable], variable)
    assert value == getattr(Config(), name), f"{variable}: the file says {shown()[variable]}"


@pytest.mark.parametrize("variable", sorted(given()))
def test_every_setting_the_file_gives_is_one_a_function_reads(variable: str) -> None:
    assert variable in _NOT_CONFIG or field(variable) in config_module._FIELDS


def test_every_setting_is_in_the_file_or_set_by_a_service_of_its_own() -> None:
    in_file = set(given()) | set(shown())
    missing = [
        f"{ENV_PREFIX}{f.name.upper()}"
        for f in dataclasses.fields(Config)
        if f"{ENV_PREFIX}{f.name.upper()}" not in in_file | service_env()
    ]
    assert missing == [], "show them in knative/config.env with their defaults"


def readers_of(variable: str) -> set[str]:
    if variable in _NOT_CONFIG:
        return set(READS)
    return {function for function, names in READS.items() if field(variable) in names}


@pytest.mark.parametrize("group", config_env.groups(), ids=lambda g: g.key)
def test_a_group_says_exactly_which_functions_read_its_settings(group: config_env.Group) -> None:
    readers = set().union(*(readers_of(s.env) for s in group.settings))
    said = set(READS) if group.read_by == (config_env.EVERY_FUNCTION,) else set(group.read_by)
    assert said == readers, f"[{group.key}] Read by: {', '.join(sorted(readers))}"


def test_a_setting_outside_any_group_or_given_twice_is_refused() -> None:
    with pytest.raises(ConfigEnvError, match="in no group"):
        config_env.groups("KN_RESCHEDULER_DRY_RUN=false\n")
    twice = "# [a] A\n# Read by: x\nKN_RESCHEDULER_DRY_RUN=false\n# KN_RESCHEDULER_DRY_RUN=true\n"
    with pytest.raises(ConfigEnvError, match="KN_RESCHEDULER_DRY_RUN appear more than once"):
        config_env.groups(twice)


def test_a_setting_s_comment_is_the_lines_right_above_it_not_its_group_s_title() -> None:
    text = (
        "# ----\n# [common] Every function\n# Read by: every function\n# ----\n"
        "# The namespace.\nKN_RESCHEDULER_NAMESPACE=x\n\n# [b] B\n# Read by: a, b\n"
        "# KN_RESCHEDULER_DRY_RUN=false\n"
    )
    first, second = config_env.groups(text)
    assert (first.key, first.read_by) == ("common", ("every function",))
    assert first.settings[0].comment == ("The namespace.",)
    assert (second.read_by, second.settings[0].comment, second.settings[0].set) == (
        ("a", "b"),
        (),
        False,
    )


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_profile_chosen_in_the_file_takes_effect(profile: str) -> None:
    env = {**given(), "KN_RESCHEDULER_PROFILE": profile}
    config = Config.from_env(env)
    for name, value in PROFILES[profile].values.items():
        assert getattr(config, name) == value, f"{name} is pinned in config.env"


def test_the_file_chooses_the_default_profile_and_the_prometheus_source() -> None:
    assert given()["KN_RESCHEDULER_PROFILE"] == "default"
    assert given()["KN_RESCHEDULER_USAGE_SOURCE"] == "prometheus"
