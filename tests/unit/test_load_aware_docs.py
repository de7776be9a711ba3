"""docs/load-aware-internals.md's profile tables say what shared/platform/profiles.py presets.

The tables are how an operator chooses a profile; a value there that the code does not apply
would mislead exactly when it matters. Every profile has a row in each table, and every cell
of a setting column is that profile's value (or Config's default where the profile sets none).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

from shared.platform.config import Config, _convert
from shared.platform.profiles import PROFILES

DOC: Final = Path(__file__).resolve().parents[2] / "docs" / "load-aware-internals.md"


def profile_tables() -> list[list[dict[str, str]]]:
    """Each markdown table of the doc whose first column is "profile", as rows by header."""
    tables: list[list[dict[str, str]]] = []
    header: list[str] | None = None
    for line in [*DOC.read_text().splitlines(), ""]:
        cells = (
            [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        )
        if cells and cells[0] == "profile":
            header, rows = cells, []
            tables.append(rows)
        elif cells and header is not None and set(cells[0]) != {"-"}:
            rows.append(dict(zip(header, cells, strict=True)))
        elif not cells:
            header = None
    return tables


def test_the_doc_has_a_placement_table_and_a_rebalancing_table() -> None:
    tables = profile_tables()
    assert len(tables) == 2
    for rows in tables:
        assert [row["profile"].strip("`") for row in rows] == list(PROFILES)


@pytest.mark.parametrize("profile", list(PROFILES))
def test_each_row_shows_the_values_the_profile_applies(profile: str) -> None:
    applied = Config.from_env({"KN_RESCHEDULER_PROFILE": profile})
    shown = 0
    for rows in profile_tables():
        (row,) = [r for r in rows if r["profile"] == f"`{profile}`"]
        for column, cell in row.items():
            name = column.strip("`")
            if column == "profile" or not column.startswith("`"):
                continue
            assert _convert(name, cell, column) == getattr(applied, name), f"{profile}: {name}"
            shown += 1
    # Every setting any profile presets has a column.
    assert shown == len({key for p in PROFILES.values() for key in p.values})
