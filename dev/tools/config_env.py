"""knative/config.env read as what it is: settings in groups, each group naming its readers.

The file is the settings ConfigMap of a kustomize install and the source of the chart's
``config`` values (dev/tools/chart.py), so both are grouped the same way: a group opens with

    # [key] Title
    # Read by: function, function (or: every function)

and holds the settings below it, up to the next group. A setting is a line
``KN_RESCHEDULER_X=value`` (set) or ``# KN_RESCHEDULER_X=value`` (its default, shown), with the
comment lines right above it. ``Read by`` is checked against the code
(tests/unit/test_config_env.py): the functions that read at least one setting of the group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
CONFIG_ENV: Final = ROOT / "knative" / "config.env"
EVERY_FUNCTION: Final = "every function"

ASSIGNMENT: Final = re.compile(r"^(#\s*)?(KN_RESCHEDULER_[A-Z0-9_]+)=(.*)$")
GROUP: Final = re.compile(r"^# \[([a-z][A-Za-z]*)\] (.+)$")
READ_BY: Final = re.compile(r"^# Read by: (.+)$")


@dataclass(frozen=True)
class Setting:
    env: str
    value: str
    set: bool
    comment: tuple[str, ...]
    group: str

    @property
    def key(self) -> str:
        """The name of its value in the chart: KN_RESCHEDULER_DRY_RUN is dryRun."""
        words = self.env.removeprefix("KN_RESCHEDULER_").lower().split("_")
        return words[0] + "".join(w.capitalize() for w in words[1:])


@dataclass(frozen=True)
class Group:
    key: str
    title: str
    # The functions it says read it; EVERY_FUNCTION alone for all of them.
    read_by: tuple[str, ...]
    settings: tuple[Setting, ...]


class ConfigEnvError(ValueError):
    """knative/config.env is not in the shape above."""


def groups(text: str | None = None) -> list[Group]:
    """The groups of knative/config.env (or of ``text``), in the file's order."""
    found: list[Group] = []
    key = title = ""
    read_by: tuple[str, ...] = ()
    settings: list[Setting] = []
    comment: list[str] = []
    lines = (text if text is not None else CONFIG_ENV.read_text()).splitlines()

    def close() -> None:
        if key:
            found.append(Group(key, title, read_by, tuple(settings)))

    for number, line in enumerate(lines, start=1):
        if match := GROUP.match(line):
            close()
            key, title, read_by, settings, comment = match[1], match[2], (), [], []
        elif match := READ_BY.match(line):
            read_by = tuple(name.strip() for name in match[1].split(","))
            comment = []
        elif match := ASSIGNMENT.match(line):
            if not key:
                raise ConfigEnvError(f"config.env:{number}: {match[2]} is in no group")
            settings.append(Setting(match[2], match[3], match[1] is None, tuple(comment), key))
            comment = []
        elif line.startswith("#") and key:
            text_of = line[1:].strip()
            # A rule line of dashes frames a group's title; it says nothing of a setting.
            comment = [] if set(text_of) <= {"-"} else [*comment, text_of]
        else:
            comment = []
    close()
    keys = [g.key for g in found]
    if len(set(keys)) != len(keys):
        raise ConfigEnvError(f"config.env: a group key is used twice: {keys}")
    variables = [s.env for g in found for s in g.settings]
    twice = sorted({v for v in variables if variables.count(v) > 1})
    if twice:
        raise ConfigEnvError(f"config.env: {', '.join(twice)} appear more than once")
    return found


def settings(text: str | None = None) -> list[Setting]:
    """Every setting of knative/config.env, in the file's order."""
    return [s for g in groups(text) for s in g.settings]
