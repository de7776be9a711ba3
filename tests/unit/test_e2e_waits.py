"""The end-to-end tests wait in one of three ways (tests/e2e/conftest.py): ``wait_for`` a write,
``holds`` over a quiet period, ``let_time_pass`` where a rule counts time. A bare sleep in a
test is either a wait for a write that may come later than the sleep (a flake) or a quiet
period checked once at the end; this refuses it, with where it is and what to use instead.
Code in strings (a script a test runs as a subprocess) is not code here."""

from __future__ import annotations

import ast
from pathlib import Path

E2E = Path(__file__).resolve().parents[1] / "e2e"
# The helpers themselves.
ALLOWED = {"conftest.py"}


def sleeps(tree: ast.AST) -> list[int]:
    """Lines that call ``time.sleep`` or a ``sleep`` imported from ``time``."""
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "time"
        for alias in node.names
        if alias.name == "sleep"
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "sleep"
            and isinstance(func.value, ast.Name)
            and func.value.id == "time"
        ) or (isinstance(func, ast.Name) and func.id in imported):
            found.append(node.lineno)
    return sorted(found)


def test_the_check_finds_both_spellings_of_a_sleep_and_none_in_a_string() -> None:
    source = (
        "import time\nfrom time import sleep as nap\n"
        "time.sleep(1)\nnap(2)\nSCRIPT = 'time.sleep(600)'\n"
    )
    assert sleeps(ast.parse(source)) == [3, 4]


def test_no_end_to_end_test_sleeps_outside_the_wait_helpers() -> None:
    files = sorted(p for p in E2E.glob("*.py") if p.name not in ALLOWED)
    assert files, E2E
    found = [
        f"tests/e2e/{path.name}:{line}"
        for path in files
        for line in sleeps(ast.parse(path.read_text(), str(path)))
    ]
    assert not found, (
        "a bare sleep in an end-to-end test: use wait_for (a write), holds (a quiet period) or "
        f"let_time_pass (a rule counting time) from tests/e2e/conftest.py: {found}"
    )
