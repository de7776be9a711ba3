"""The README is the project's front door, and docs/README.md the map behind it.

A newcomer's first minutes go: the two commands at the top, then the links. A command that no
longer exists, a link to a page that moved or a heading that was renamed, a path in backticks
that is gone, or a page of docs/ that the index forgets each sends that reader nowhere, and
nothing else would notice. Anchors are checked the way GitHub makes them from headings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]
README: Final = ROOT / "README.md"
DOCS: Final = ROOT / "docs"
DOCS_INDEX: Final = DOCS / "README.md"
# The bound: past it the README turns back into reference, which lives in docs/.
README_LIMIT: Final = 12_000

FENCE: Final = re.compile(r"^\s*(```|~~~)")
LINK: Final = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN: Final = re.compile(r"(`+)(.+?)\1")
HEADING: Final = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
TARGET: Final = re.compile(r"^([A-Za-z0-9_.-]+)\s*:(?!=)")


def prose_lines(text: str) -> Iterator[str]:
    """The lines of a markdown text outside fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield line


def code_blocks(text: str) -> list[tuple[str, list[str]]]:
    """Each fenced code block: its info string and its lines."""
    blocks: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if FENCE.match(line):
            if current is None:
                current = []
                blocks.append((line.strip().strip("`~").strip(), current))
            else:
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text, lower-cased, punctuation dropped
    (letters, digits, `_`, `-` and spaces stay), each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a markdown page; a repeated heading gets -1, -2... as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose_lines(page.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    """The targets of the page's links and images that point inside the repository."""
    targets: list[str] = []
    for line in prose_lines(page.read_text()):
        for target in LINK.findall(CODE_SPAN.sub("``", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                targets.append(target)
    return targets


def broken(page: Path, target: str) -> str | None:
    """Why a relative link of ``page`` leads nowhere, or None when it resolves."""
    path, _, anchor = target.partition("#")
    resolved = (page.parent / path).resolve() if path else page
    if not resolved.exists():
        return f"{target}: no such file"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{target}: no heading #{anchor} in {path or page.name}"
    return None


def test_the_slugs_follow_githubs_rules() -> None:
    assert github_slug("Deployments, rollouts and `kubectl rollout undo`") == (
        "deployments-rollouts-and-kubectl-rollout-undo"
    )
    assert github_slug("Webhook reachability: the choice and its limits") == (
        "webhook-reachability-the-choice-and-its-limits"
    )
    assert github_slug("Moves that have to wait (`MoveDeferred`)") == (
        "moves-that-have-to-wait-movedeferred"
    )
    assert github_slug("`KN_RESCHEDULER_PROFILE` and [the seed](x.md)") == (
        "kn_rescheduler_profile-and-the-seed"
    )


def test_the_readme_opens_with_make_demo_and_make_test() -> None:
    info, lines = code_blocks(README.read_text())[0]
    assert info == "sh"
    commands = [line.split("#", 1)[0].strip() for line in lines]
    assert commands == ["make demo", "make test"]
    assert all("#" in line and line.split("#", 1)[1].strip() for line in lines), (
        "each command says in a comment what it does"
    )


@pytest.mark.parametrize("target", ["demo", "test"])
def test_the_commands_at_the_top_are_make_targets(target: str) -> None:
    targets = {
        match.group(1)
        for line in (ROOT / "Makefile").read_text().splitlines()
        if (match := TARGET.match(line))
    }
    assert target in targets


@pytest.mark.parametrize("page", [README, DOCS_INDEX], ids=["README.md", "docs/README.md"])
def test_every_relative_link_leads_to_a_file_and_heading(page: Path) -> None:
    links = relative_links(page)
    assert links, "the page links to the rest of the project"
    problems = [problem for target in links if (problem := broken(page, target))]
    assert problems == []


def test_every_repository_path_in_backticks_in_the_readme_exists() -> None:
    top_level = {entry.name for entry in ROOT.iterdir() if not entry.name.startswith(".")}
    paths = [
        code
        for line in prose_lines(README.read_text())
        for _, code in CODE_SPAN.findall(line)
        if "/" in code
        and code.split("/", 1)[0] in top_level
        and not re.search(r"[\s<>*=$]|\.\.\.", code)
    ]
    assert paths, "the README names files of the repository"
    assert [path for path in paths if not (ROOT / path).exists()] == []


def test_the_readme_is_short_enough_to_read_as_a_front_door() -> None:
    assert len(README.read_text()) < README_LIMIT


def test_the_docs_index_lists_every_page() -> None:
    listed = {
        (DOCS / target.partition("#")[0]).resolve()
        for target in relative_links(DOCS_INDEX)
        if target.partition("#")[0]
    }
    pages = {page.resolve() for page in DOCS.glob("*.md") if page != DOCS_INDEX}
    assert sorted(p.name for p in pages - listed) == []


def test_a_link_to_a_missing_heading_is_caught(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title\n\n## Same\n\n## Same\n\n```sh\n# not a heading\n```\n")
    page = tmp_path / "index.md"
    page.write_text("[ok](a.md#same-1) [gone](a.md#not-a-heading) [none](b.md)\n")
    assert [broken(page, target) for target in relative_links(page)] == [
        None,
        "a.md#not-a-heading: no heading #not-a-heading in a.md",
        "b.md: no such file",
    ]
