"""The settings reference, generated from the code (docs/settings.md).

Every function reads one ``Config`` (shared/platform/config.py) of some sixty fields, each set by
``KN_RESCHEDULER_<FIELD>`` or a mounted file, and most of them matter to one or two functions
only. Which ones, nobody could say without reading the code; this reads it:

- a function's code is its ``functions/<name>/main.py`` and every module of ``shared/`` it
  imports, directly or through another module (the import closure);
- a setting is read where its name is read as an attribute of a config: ``cfg.X``,
  ``config.X``, ``CONFIG.X``, ``self.cfg.X``, ``given.cfg.X`` (the names the code gives it).

So the table says which functions *may* read a setting: a module imported for one helper
counts whole. It does not miss one: every read of a config goes through those names (a read
any other way would not be listed, and the test beside this keeps the table current, not
complete). ``python -m dev.tools.settings`` writes the page; ``--check`` exits 1 when the page
is not what the code says (tests/unit/test_settings_table.py runs it).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Final

from shared.api.times import format_duration
from shared.platform.config import ENV_PREFIX, Config

ROOT: Final = Path(__file__).resolve().parents[2]
PAGE: Final = ROOT / "docs" / "settings.md"
# The names the code gives a Config, as a variable or as the last attribute of a chain.
CONFIG_NAMES: Final = frozenset({"cfg", "config", "CONFIG", "CFG"})

HEADER: Final = """# Settings: which function reads which

Generated from the code by `python -m dev.tools.settings` (`tests/unit/test_settings_table.py`
fails when it is out of date); do not edit by hand. What each setting means, and the
`knative/config.env` that sets them:
[install-reference.md](install-reference.md#configuration-reference).

Every function reads the same `Config` (`shared/platform/config.py`) and checks every setting
at start-up. A setting is listed for the functions whose code may read it: the function's
`main.py` and every module of `shared/` it imports, directly or through another, in which the
setting is read from a config. A module imported for one helper counts whole, so a function
may be listed for a setting it never reads on its way; it is never left out of one it reads.
"""


def module_file(module: str) -> Path | None:
    """The file of a ``shared`` module (a package's ``__init__.py``), None when not ours."""
    if not module.startswith("shared"):
        return None
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_of(path: Path) -> set[str]:
    """The ``shared`` modules ``path`` imports (``from shared.x import y`` may import the
    module ``shared.x.y``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("shared"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shared"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if module_file(m) is not None}


def closure(entry: Path) -> set[Path]:
    """``entry`` and every ``shared`` file it imports, directly or not."""
    seen: set[Path] = {entry}
    todo = [entry]
    while todo:
        for module in imports_of(todo.pop()):
            path = module_file(module)
            if path is not None and path not in seen:
                seen.add(path)
                todo.append(path)
    return seen


def _names_a_config(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in CONFIG_NAMES
    return isinstance(node, ast.Attribute) and node.attr in CONFIG_NAMES


def config_methods(fields: Iterable[str]) -> dict[str, set[str]]:
    """Config's own properties and methods (``api_timeout_seconds``,
    ``is_excluded_namespace``), each with the fields it reads from ``self``: a call of one
    reads those."""
    wanted = set(fields)
    tree = ast.parse((ROOT / "shared" / "platform" / "config.py").read_text())
    config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    methods: dict[str, set[str]] = {}
    for item in config.body:
        if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
            methods[item.name] = {
                n.attr
                for n in ast.walk(item)
                if isinstance(n, ast.Attribute)
                and n.attr in wanted
                and isinstance(n.value, ast.Name)
                and n.value.id == "self"
            }
    return methods


def settings_read(path: Path, fields: Iterable[str], methods: dict[str, set[str]]) -> set[str]:
    """The fields of ``fields`` that ``path`` reads from a config, directly or through one of
    Config's own properties and methods (``config_methods``)."""
    wanted = set(fields)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and _names_a_config(node.value):
            if node.attr in wanted:
                found.add(node.attr)
            found.update(methods.get(node.attr, ()))
    return found


def readers(functions_dir: Path = ROOT / "functions") -> dict[str, set[str]]:
    """For each field of Config, the functions whose code may read it."""
    fields = [f.name for f in dataclasses.fields(Config)]
    found: dict[str, set[str]] = {name: set() for name in fields}
    methods = config_methods(fields)
    read: dict[Path, set[str]] = {}  # a module shared by several functions is parsed once
    for main in sorted(functions_dir.glob("*/main.py")):
        function = main.parent.name
        for path in closure(main):
            if path not in read:
                read[path] = settings_read(path, fields, methods)
            for name in read[path]:
                found[name].add(function)
    return found


def _default(value: object) -> str:
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, frozenset):
        return ", ".join(sorted(value)) or "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if value != "" else "(empty)"


def page() -> str:
    read = readers()
    defaults = Config()
    rows = [
        "| setting | default | read by |",
        "| --- | --- | --- |",
    ]
    for field in dataclasses.fields(Config):
        who = ", ".join(sorted(read[field.name])) or "(no function: checked at start-up only)"
        default = _default(getattr(defaults, field.name)).replace("|", "\\|")
        rows.append(f"| `{ENV_PREFIX}{field.name.upper()}` | {default} | {who} |")
    counts: dict[str, int] = {}
    for functions in read.values():
        for function in functions:
            counts[function] = counts.get(function, 0) + 1
    per = ", ".join(f"{name} {counts[name]}" for name in sorted(counts))
    total = len(read)
    summary = f"\n{total} settings. How many each function may read: {per}.\n"
    return HEADER + summary + "\n" + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.tools.settings", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/settings.md is stale")
    args = parser.parse_args(argv)
    text = page()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python -m dev.tools.settings")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
