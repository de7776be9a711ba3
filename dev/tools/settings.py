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
complete).

The same table is what the functions run with: ``shared/platform/reads.py``, generated here,
is what ``Config.for_function`` reads for each function, so a setting the code starts reading
is read once this is run again, and the tests fail until it is. ``python -m dev.tools.settings``
writes both files; ``--check`` exits 1 when either is not what the code says
(tests/unit/test_settings_table.py runs it).
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

from dev.tools import config_env
from shared.api.times import format_duration
from shared.platform.config import ENV_PREFIX, Config

ROOT: Final = Path(__file__).resolve().parents[2]
PAGE: Final = ROOT / "docs" / "settings.md"
TABLE: Final = ROOT / "shared" / "platform" / "reads.py"
# Read by every function, whatever its code reads: the profile presets others; a missed read of
# the namespace, the excluded namespaces or the dry run would act where the operator said not to.
ALWAYS: Final = frozenset({"profile", "namespace", "excluded_namespaces", "dry_run"})
# The names the code gives a Config, as a variable or as the last attribute of a chain.
CONFIG_NAMES: Final = frozenset({"cfg", "config", "CONFIG", "CFG"})

HEADER: Final = """# Settings: which function reads which

Generated from the code by `python -m dev.tools.settings` (`tests/unit/test_settings_table.py`
fails when it is out of date); do not edit by hand. What each setting means:
`knative/config.env` (the settings of a kustomize install, grouped as below) and
[install-reference.md](install-reference.md#configuration-reference). In the Helm chart each
is `config.<group>.<name>` ([install-helm.md](install-helm.md#values)).

Every Service loads the whole settings ConfigMap, but each function reads, checks and logs
only its own settings (`Config.for_function` in `shared/platform/config.py`, from the table
`shared/platform/reads.py` generated with this page): a bad value stops the functions that
read it and no other, and a function's `configuration` log line at start-up shows just what it
runs with. A function's settings are the ones its code may read: its `main.py` and every module
of `shared/` it imports, directly or through another, in which the setting is read from a
config (a module imported for one helper counts whole, so a function may read a setting it
never uses on its way; it never misses one it uses). Every function also reads the profile
(which presets others), the namespace, the excluded namespaces and the dry run: a missed read
of one of those would act where the operator said not to.
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


def _annotated_config(node: ast.AST) -> set[str]:
    """The names ``node`` gives a Config by annotation (``rules: Config``), whatever they are."""
    names: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.arg) and _is_config(n.annotation):
            names.add(n.arg)
        elif (
            isinstance(n, ast.AnnAssign)
            and isinstance(n.target, ast.Name)
            and _is_config(n.annotation)
        ):
            names.add(n.target.id)
    return names


def _is_config(annotation: ast.expr | None) -> bool:
    if isinstance(annotation, ast.Name):
        return annotation.id == "Config"
    if isinstance(annotation, ast.Constant):
        return annotation.value == "Config"
    return isinstance(annotation, ast.Attribute) and annotation.attr == "Config"


def settings_read(path: Path, fields: Iterable[str], methods: dict[str, set[str]]) -> set[str]:
    """The fields of ``fields`` that ``path`` reads from a config, directly or through one of
    Config's own properties and methods (``config_methods``). A config is a name of
    ``CONFIG_NAMES``, or any name the module annotates as a ``Config``."""
    wanted = set(fields)
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    also = _annotated_config(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (
            _names_a_config(node.value)
            or (isinstance(node.value, ast.Name) and node.value.id in also)
        ):
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


def reads(found: dict[str, set[str]] | None = None) -> dict[str, frozenset[str]]:
    """For each function, the settings it reads: what its code may read, and ``ALWAYS``."""
    found = readers() if found is None else found
    functions = sorted({f for who in found.values() for f in who})
    return {
        function: frozenset({n for n, who in found.items() if function in who} | ALWAYS)
        for function in functions
    }


def table_module(table: dict[str, frozenset[str]]) -> str:
    """shared/platform/reads.py: ``table`` as the functions read it, formatted as ruff would."""
    lines = [
        '"""Which settings each function reads: generated from the code by',
        "`python -m dev.tools.settings` (tests/unit/test_settings_table.py fails when it is out of",
        "date); do not edit by hand.",
        "",
        "A function reads, checks and logs these and no other (`Config.for_function`): the",
        "settings its code (its main.py and the modules of shared/ it imports) reads from a",
        "config, and the ones every function reads whatever its code does (the profile, which",
        "presets others; the namespace, the excluded namespaces and the dry run, which a missed",
        'read would turn into acting where the operator said not to)."""',
        "",
        "from collections.abc import Mapping",
        "from types import MappingProxyType",
        "from typing import Final",
        "",
        "READS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(",
        "    {",
    ]
    for function, names in sorted(table.items()):
        lines += [f'        "{function}": frozenset(', "            {"]
        lines += [f'                "{name}",' for name in sorted(names)]
        lines += ["            }", "        ),"]
    lines += ["    }", ")"]
    return "\n".join(lines) + "\n"


# Read by each function's log set-up (shared/platform/logs.py), not by Config.
LOG_SETTINGS: Final = ("KN_RESCHEDULER_LOG_LEVEL", "KN_RESCHEDULER_LOG_EVENTS")


def page() -> str:
    read = readers()
    table = reads(read)
    defaults = Config()
    in_file = config_env.settings()
    order = {s.env: i for i, s in enumerate(in_file)}
    group_of = {s.env: s.group for s in in_file}
    everyone = len(table)

    def who(names: list[str]) -> str:
        return "every function" if len(names) == everyone else ", ".join(names)

    rows: list[tuple[int, str]] = []
    for field in dataclasses.fields(Config):
        variable = f"{ENV_PREFIX}{field.name.upper()}"
        readers_of = sorted(f for f, names in table.items() if field.name in names)
        default = _default(getattr(defaults, field.name)).replace("|", "\\|")
        group = f"`{group_of[variable]}`" if variable in group_of else "(a Service's own env)"
        line = f"| `{variable}` | {default} | {group} | {who(readers_of)} |"
        rows.append((order.get(variable, len(order)), line))
    for s in in_file:
        if s.env in LOG_SETTINGS:
            line = f"| `{s.env}` | {s.value} | `{s.group}` | every function (its log set-up) |"
            rows.append((order[s.env], line))
    groups_of = {
        function: [
            g.key
            for g in config_env.groups()
            if any(
                s.env.removeprefix(ENV_PREFIX).lower() in names or s.env in LOG_SETTINGS
                for s in g.settings
            )
        ]
        for function, names in table.items()
    }
    per_function = [
        "| function | settings | groups |",
        "| --- | --- | --- |",
        *(
            f"| {f} | {len(table[f])} | {', '.join(f'`{g}`' for g in groups_of[f])} |"
            for f in sorted(table)
        ),
    ]
    summary = (
        f"\n{len(read)} settings of `Config`, and the log level and the events logged. What each"
        " function reads, and from which groups:\n\n" + "\n".join(per_function) + "\n"
    )
    head = ["| setting | default | group | read by |", "| --- | --- | --- | --- |"]
    body = [line for _, line in sorted(rows, key=lambda r: r[0])]
    return (
        HEADER
        + summary
        + "\nEvery setting, in the order of config.env:\n\n"
        + "\n".join(head + body)
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.tools.settings", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if docs/settings.md or reads.py is stale"
    )
    args = parser.parse_args(argv)
    wanted = {PAGE: page(), TABLE: table_module(reads())}
    stale = [
        path for path, text in wanted.items() if not path.is_file() or path.read_text() != text
    ]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run python -m dev.tools.settings")
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
