"""docs/install.md's quickstart names only what the repository has.

The quickstart is the part of the docs a platform engineer copies from without reading the
reference pages it links to, so every path it applies, every setting, component, make target,
key and link it names must exist: a renamed file or setting would otherwise break the first
install silently.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Final

import pytest

from dev.tools import release
from shared.api import keys
from shared.platform.config import ENV_PREFIX, Config
from tests.unit.test_readme import broken, github_slug

REPO: Final = Path(__file__).resolve().parents[2]
DOC: Final = REPO / "docs" / "install.md"
_FENCE: Final = re.compile(r"^\s*```")
# `kubectl [flags] apply [flags] -k DIR` or `-f FILE`, in a code block or inline.
_APPLIED: Final = re.compile(r"kubectl\b[^`\n]*?\bapply\b[^`\n]*?\s-([kf])\s+([^\s`]+)")
_SETTING: Final = re.compile(r"\b(KN_RESCHEDULER_[A-Z0-9_]+)(?:=([^\s`\"]+))?")
_COMPONENTS: Final = re.compile(r"COMPONENTS=(?:\"([^\"]*)\"|([\w-]+))")
_COMPONENT: Final = re.compile(r"component `([\w-]+)`")
_MAKE: Final = re.compile(r"\bmake ([a-z][\w-]*)")
_REPO_PATH: Final = re.compile(r"`(knative/[^`\s]*)`")
_KEY: Final = re.compile(r"\bkn-rescheduler\.io/[a-z0-9-]+")
# A link to a heading, on this page (`#anchor`) or another (`page.md#anchor`).
_ANCHORED: Final = re.compile(r"\]\(([^)\s#:]*#[^)\s]+)\)")
_DOC_LINK: Final = re.compile(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)")


def prose_and_code() -> list[tuple[str, bool]]:
    """Every line of the doc, with whether it is inside a fenced code block."""
    lines: list[tuple[str, bool]] = []
    fenced = False
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            lines.append((line, True))
        else:
            lines.append((line, fenced))
    return lines


def headings() -> list[str]:
    return [line for line, fenced in prose_and_code() if not fenced and line.startswith("#")]


def quickstart_lines() -> list[tuple[str, bool]]:
    """The quickstart section, from its heading to the next heading of its level."""
    lines = prose_and_code()
    start = lines.index(("## Quickstart", False))
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if lines[i] == (lines[i][0], False) and lines[i][0].startswith("## ")
        ),
        len(lines),
    )
    return lines[start:end]


def quickstart() -> str:
    return "\n".join(line for line, _ in quickstart_lines())


def flat() -> str:
    """The quickstart with wrapped lines joined, as a reader's copy would join them."""
    return re.sub(r"\s*\n\s*", " ", quickstart())


def test_the_quickstart_is_the_first_section_after_the_intro() -> None:
    sections = [h for h in headings() if h.startswith("## ")]
    assert sections[0] == "## Quickstart"
    # The README links to it by this anchor.
    assert github_slug(sections[0].lstrip("#").strip()) == "quickstart"


# The reference the quickstart leaves out, and the page of the install guide it now lives on.
REFERENCE: Final = {
    "## Install, step by step": "install-step-by-step.md",
    "## Configuration reference": "install-reference.md",
    "## Uninstalling": "install-upgrade.md",
}


@pytest.mark.parametrize(("heading", "page"), sorted(REFERENCE.items()))
def test_the_reference_is_a_link_below_the_quickstart(heading: str, page: str) -> None:
    assert heading in (DOC.parent / page).read_text(encoding="utf-8").splitlines()
    lines = prose_and_code()
    below = lines[lines.index(("## Quickstart", False)) + len(quickstart_lines()) :]
    assert f"]({page})" in "\n".join(line for line, _ in below)


def applied() -> list[tuple[str, str]]:
    return [(m[1], m[2]) for m in _APPLIED.finditer(flat()) if m[2] != "-"]


def test_the_quickstart_applies_something_from_the_repo() -> None:
    assert applied(), "no `kubectl apply -k DIR` or `-f FILE` found: is the pattern stale?"


@pytest.mark.parametrize(("flag", "path"), applied())
def test_every_path_the_quickstart_applies_exists_in_the_repo(flag: str, path: str) -> None:
    target = REPO / path
    if flag == "f" and path in release.MANIFESTS:
        return  # a release's file, which `make release` writes (tests/e2e/test_release.py)
    if flag == "k":
        assert (target / "kustomization.yaml").is_file(), f"no kustomization in {path}"
    else:
        assert target.is_file(), f"{path} is not a file of the repository"


def named_paths() -> list[str]:
    return sorted(set(_REPO_PATH.findall(flat())))


@pytest.mark.parametrize("path", named_paths())
def test_every_file_under_knative_the_quickstart_names_exists(path: str) -> None:
    assert (REPO / path).exists(), path


def settings() -> list[tuple[str, str | None]]:
    return sorted({(m[1], m[2]) for m in _SETTING.finditer(flat())}, key=str)


def test_the_quickstart_names_settings() -> None:
    assert len({name for name, _ in settings()}) >= 5


@pytest.mark.parametrize(("variable", "value"), settings())
def test_every_setting_the_quickstart_names_is_a_setting_and_takes_the_value_shown(
    variable: str, value: str | None
) -> None:
    field = variable.removeprefix(ENV_PREFIX).lower()
    assert field in {f.name for f in dataclasses.fields(Config)}, f"{variable} is no setting"
    if value is not None:
        # Raises ConfigError when the value shown would stop the functions at start-up.
        Config.from_env({variable: value})


def components() -> list[str]:
    text = flat()
    named = {c for m in _COMPONENTS.finditer(text) for c in (m[1] or m[2]).split()}
    return sorted(named | set(_COMPONENT.findall(text)))


@pytest.mark.parametrize("component", components())
def test_every_component_the_quickstart_names_is_one_make_can_add(component: str) -> None:
    # hack/deploy.mk adds knative/monitoring, and knative/components/NAME for any other NAME.
    folder = REPO / "knative" / ("monitoring" if component == "monitoring" else "components")
    if component != "monitoring":
        folder /= component
    assert (folder / "kustomization.yaml").is_file(), f"no component {component}"


def code() -> str:
    """The quickstart's commands: its code blocks and inline code, one per line."""
    blocks = [line for line, fenced in quickstart_lines() if fenced]
    prose = " ".join(line.strip() for line, fenced in quickstart_lines() if not fenced)
    spans = re.findall(r"`([^`]+)`", prose)
    return "\n".join(blocks + spans)


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text() + (REPO / "hack" / "deploy.mk").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", text, flags=re.MULTILINE))


@pytest.mark.parametrize("target", sorted(set(_MAKE.findall(code()))))
def test_every_make_target_the_quickstart_runs_exists(target: str) -> None:
    assert target in make_targets()


def contract_keys() -> set[str]:
    return {value for value in vars(keys).values() if isinstance(value, str)}


@pytest.mark.parametrize("key", sorted(set(_KEY.findall(flat()))))
def test_every_label_and_annotation_the_quickstart_names_is_in_the_contract(key: str) -> None:
    assert key in contract_keys(), f"{key} is not in shared/api/keys.py"


def test_the_bare_pod_opt_out_deletes_the_rolebinding_the_opt_in_applies() -> None:
    rolebinding = (REPO / "knative" / "bare-pod-replacement" / "rolebinding.yaml").read_text()
    (name,) = re.findall(r"^kind: RoleBinding\nmetadata:\n  name: (\S+)", rolebinding, re.M)
    assert f"delete rolebinding {name}" in flat()


@pytest.mark.parametrize("target", sorted(set(_ANCHORED.findall(quickstart()))))
def test_every_link_to_a_heading_reaches_it(target: str) -> None:
    assert broken(DOC, target) is None


@pytest.mark.parametrize("page", sorted(set(_DOC_LINK.findall(quickstart()))))
def test_every_page_the_quickstart_links_to_exists(page: str) -> None:
    assert (DOC.parent / page).is_file()
