"""Files the repository keeps that a tool writes: write them, or check they are current.

``python -m dev.tools.without_serving`` and ``python -m dev.tools.policies`` render a kustomize
component from the code and the manifests; each commits the result and has a unit test running
its ``--check``, so the committed files never drift from what the tool writes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]


def write_or_check(
    directory: Path,
    render: Callable[[], Mapping[str, str]],
    command: str,
    description: str,
    argv: list[str] | None = None,
) -> int:
    """Write ``render()``'s files into ``directory``, or with ``--check`` exit 1 naming those
    that differ (and ``command``, which rewrites them)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="exit 1 if the files differ")
    args = parser.parse_args(argv)
    stale = []
    for name, content in render().items():
        path = directory / name
        if args.check:
            if not path.is_file() or path.read_text() != content:
                stale.append(name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    if stale:
        shown = (
            directory.relative_to(directory.parents[2]) if len(directory.parents) > 2 else directory
        )
        print(f"{shown} is stale ({', '.join(stale)}): run {command}", file=sys.stderr)
        return 1
    return 0
