"""docs/settings.md, which function may read which setting, is generated from the code
(dev/tools/settings.py) and must say what the code says now."""

from __future__ import annotations

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
