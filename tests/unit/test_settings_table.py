"""docs/settings.md, which function may read which setting, is generated from the code
(dev/tools/settings.py) and must say what the code says now."""

from __future__ import annotations

import ast
from pathlib import Path

from dev.tools import settings


def test_the_settings_page_is_what_the_code_says() -> None:
    assert settings.main(["--check"]) == 0, "run: python -m dev.tools.settings"


def test_the_node_pressure_settings_are_read_by_the_node_functions_not_by_the_pod_ones() -> None:
    read = settings.readers()
    assert read["prometheus_url"] == {"annotate-usage", "label-nodes"}
    assert "detect-failures" not in read["suspect_max_share"]
    assert "assess-nodes" in read["suspect_max_share"]
    # Through Config's own property, api_timeout_seconds.
    assert "mutate-admission" in read["api_timeout"]


def test_a_read_through_any_of_the_names_a_config_goes_by_is_found(tmp_path: Path) -> None:
    function = tmp_path / "probe"
    function.mkdir()
    (function / "main.py").write_text(
        "def handle(cfg, self, given):\n"
        "    return (cfg.dry_run, self.cfg.kse_compat, given.config.use_eviction,\n"
        "            cfg.api_timeout_seconds, self.namespace)\n"
    )
    read = settings.readers(tmp_path)
    found = {name for name, functions in read.items() if "probe" in functions}
    # self.namespace is not a config: a class's own attribute of that name says nothing.
    assert found == {"dry_run", "kse_compat", "use_eviction", "api_timeout"}


def test_a_read_through_a_name_annotated_as_a_config_is_found(tmp_path: Path) -> None:
    function = tmp_path / "probe"
    function.mkdir()
    (function / "main.py").write_text(
        "from shared.platform.config import Config\n"
        "def judge(rules: Config, evidence: 'Config') -> object:\n"
        "    other: Config = rules\n"
        "    return rules.kse_compat, evidence.use_eviction, other.dry_run\n"
    )
    found = {name for name, who in settings.readers(tmp_path).items() if "probe" in who}
    assert {"kse_compat", "use_eviction", "dry_run"} <= found


def _reflective_reads(path: Path) -> list[str]:
    """Reads of a config the table cannot see: getattr, vars, asdict or __dict__ of one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and node.args:
            callee = node.func
            name = callee.id if isinstance(callee, ast.Name) else getattr(callee, "attr", "")
            first = node.args[0]
            said = first.id if isinstance(first, ast.Name) else getattr(first, "attr", "")
            if name in {"getattr", "vars", "asdict", "astuple", "fields"} and said in (
                settings.CONFIG_NAMES
            ):
                found.append(f"{path.name}:{node.lineno}: {name}({said})")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "__dict__"
            and isinstance(node.value, ast.Name)
            and node.value.id in settings.CONFIG_NAMES
        ):
            found.append(f"{path.name}:{node.lineno}: __dict__")
    return found


def test_no_function_reads_a_config_by_reflection_where_the_table_cannot_see_it() -> None:
    # A setting read by name at run time (getattr(cfg, name)) is not in the table: the function
    # would be given its default whatever the operator set. Config's own module describes and
    # converts every field, and is no function's reader of them.
    own = settings.ROOT / "shared" / "platform" / "config.py"
    paths = [
        *(settings.ROOT / "shared").rglob("*.py"),
        *(settings.ROOT / "functions").glob("*/main.py"),
    ]
    found = [line for path in paths if path != own for line in _reflective_reads(path)]
    assert found == []


def test_a_read_by_reflection_is_seen(tmp_path: Path) -> None:
    probe = tmp_path / "main.py"
    probe.write_text("def f(cfg, name):\n    return getattr(cfg, name), vars(config)\n")
    assert _reflective_reads(probe) == ["main.py:2: getattr(cfg)", "main.py:2: vars(config)"]
