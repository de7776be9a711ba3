"""Every page of docs/ links to headings that exist, and the pages split by task stay short.

docs/install.md and docs/local-cluster.md once held the reference, the how-to and the
explanation in one page each (about 100,000 and 67,000 characters); they are split into pages a
reader finds by what they want to do. A section that moves to another page, or a heading that
is renamed, leaves every `page.md#heading` link to it pointing at the top of a page, and GitHub
says nothing: so every link of every page is checked here, anchors the way GitHub makes them
(the helpers of tests/unit/test_readme.py). The split pages are held under a size that one
sitting can read; past it, a page is split again by task rather than grown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

from tests.unit.test_readme import DOCS, broken, relative_links

PAGES: Final = sorted(DOCS.glob("*.md"))
PAGE_LIMIT: Final = 20_000
# The entry pages and the pages split from them.
SPLIT_PAGES: Final = (
    "install.md",
    "install-helm.md",
    "install-step-by-step.md",
    "install-without-serving.md",
    "install-opt-in.md",
    "install-hardening.md",
    "install-load-aware-scheduling.md",
    "install-choices.md",
    "install-upgrade.md",
    "install-reference.md",
    "install-observability.md",
    "install-troubleshooting.md",
    "local-cluster.md",
    "local-cluster-faults.md",
    "local-cluster-metrics.md",
    "local-cluster-real-nodes.md",
    "local-cluster-networking.md",
    "local-cluster-production.md",
    "local-cluster-internals.md",
    "load-aware.md",
    "load-aware-internals.md",
    "plugin.md",
)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_link_to_a_heading_reaches_it(page: Path) -> None:
    anchored = [target for target in relative_links(page) if "#" in target]
    assert [problem for target in anchored if (problem := broken(page, target))] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_to_a_file(page: Path) -> None:
    assert [problem for target in relative_links(page) if (problem := broken(page, target))] == []


@pytest.mark.parametrize("name", SPLIT_PAGES)
def test_a_split_page_stays_under_the_limit(name: str) -> None:
    assert len((DOCS / name).read_text(encoding="utf-8")) < PAGE_LIMIT


def test_every_page_of_the_split_guides_is_named() -> None:
    pages = {page.name for page in PAGES if page.name.startswith(("install", "local-cluster"))}
    assert sorted(pages - set(SPLIT_PAGES)) == []
