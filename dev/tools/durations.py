"""Where a test run's time went, per file: the table docs/testing.md keeps.

``make test`` writes JUnit XML (``.local/test-results.xml``); pytest records each test's time
there as its setup, call and teardown together, so a module fixture that starts a cluster or
installs Knative is counted in its file's first test. Summed per file, that is what a file
costs the suite, fixtures included, which is what decides where the time goes. A session
fixture (the shared control plane) lands in whichever file asks for it first: the table says
which file that was by its first test's time.

    python -m dev.tools.durations .local/test-results*.xml             the 15 slowest files
    python -m dev.tools.durations before.xml --compare after*.xml      side by side, per file
    python -m dev.tools.durations results.xml --all --markdown         every file, for the docs
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

DEFAULT_TOP: Final = 15


@dataclass
class FileTime:
    """One test file's share of a run."""

    path: str
    seconds: float = 0.0
    tests: int = 0
    skipped: int = 0
    failed: int = 0
    slowest: tuple[float, str] = (0.0, "")

    @property
    def ran(self) -> int:
        return self.tests - self.skipped


@dataclass(frozen=True)
class Run:
    files: dict[str, FileTime]
    seconds: float  # the suite's own figure (the testsuite element), session teardown included

    @property
    def tests(self) -> int:
        return sum(f.tests for f in self.files.values())


class ResultsError(Exception):
    """The file is not a run's JUnit XML, or cannot be read."""


def file_of(classname: str) -> str:
    """``tests.e2e.test_moves.TestX`` -> ``tests/e2e/test_moves.py``: the module is the last
    dotted part that names a test module (pytest's own test discovery: ``test_*``)."""
    parts = classname.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].startswith("test_") or parts[i].endswith("_test"):
            return "/".join(parts[: i + 1]) + ".py"
    return "/".join(parts) + ".py"


def read(*paths: Path) -> Run:
    """A run from pytest's JUnit XML (any ``junit_family``), or from the files of runs made one
    after the other (make test's parallel part and what runs alone): their times add up. A
    clear error for anything else."""
    files: dict[str, FileTime] = {}
    total = 0.0
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as exc:
            raise ResultsError(f"cannot read {path}: {exc}") from exc
        suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
        if not suites:
            raise ResultsError(f"{path} holds no <testsuite>: not pytest's JUnit XML")
        for suite in suites:
            total += float(suite.get("time", "0") or 0)
            for case in suite.iter("testcase"):
                name = case.get("file") or file_of(case.get("classname", ""))
                entry = files.setdefault(name, FileTime(name))
                seconds = float(case.get("time", "0") or 0)
                entry.seconds += seconds
                entry.tests += 1
                entry.skipped += case.find("skipped") is not None
                entry.failed += case.find("failure") is not None or case.find("error") is not None
                if seconds > entry.slowest[0]:
                    entry.slowest = (seconds, case.get("name", ""))
    return Run(files, total)


def minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def layer(path: str) -> str:
    parts = path.split("/")
    return parts[1] if len(parts) > 2 else parts[0]


def by_layer(run: Run) -> dict[str, tuple[int, float]]:
    layers: dict[str, tuple[int, float]] = {}
    for f in run.files.values():
        n, s = layers.get(layer(f.path), (0, 0.0))
        layers[layer(f.path)] = (n + f.tests, s + f.seconds)
    return layers


def table(run: Run, top: int | None, markdown: bool) -> list[str]:
    ranked = sorted(run.files.values(), key=lambda f: -f.seconds)
    # With pytest-xdist the files' times add up to more than the run took: shares are of
    # the tests' own time, and the last line gives both.
    summed = sum(f.seconds for f in ranked)
    shown = ranked if top is None else ranked[:top]
    rows = [
        (
            f.path,
            str(f.ran)
            + (f" (+{f.skipped} skipped)" if f.skipped else "")
            + (f", {f.failed} failed" if f.failed else ""),
            minutes(f.seconds),
            f"{100 * f.seconds / summed:.1f}%" if summed else "-",
            f"{f.slowest[0]:.0f} s {f.slowest[1]}",
        )
        for f in shown
    ]
    head = ("file", "tests", "m:ss", "share", "slowest test (setup included)")
    lines = render([head, *rows], markdown)
    rest = ranked[len(shown) :]
    if rest:
        lines.append(
            f"... {len(rest)} more files, {minutes(sum(f.seconds for f in rest))} together"
        )
    layers = ", ".join(
        f"{name} {n} tests {minutes(s)}" for name, (n, s) in sorted(by_layer(run).items())
    )
    lines.append(
        f"{run.tests} tests, {minutes(run.seconds)} from start to end, {minutes(summed)} of "
        f"tests' own time: {layers}"
    )
    return lines


def compare(before: Run, after: Run, markdown: bool) -> list[str]:
    names = sorted(
        set(before.files) | set(after.files),
        key=lambda n: (
            -max(before.files.get(n, FileTime(n)).seconds, after.files.get(n, FileTime(n)).seconds)
        ),
    )
    rows = []
    for n in names:
        b, a = before.files.get(n), after.files.get(n)
        rows.append(
            (
                n,
                minutes(b.seconds) if b else "-",
                minutes(a.seconds) if a else "-",
                f"{b.ran if b else 0} -> {a.ran if a else 0}",
            )
        )
    total = (
        "the run, start to end",
        minutes(before.seconds),
        minutes(after.seconds),
        f"{before.tests} -> {after.tests}",
    )
    return render([("file", "before", "after", "tests run"), *rows, total], markdown)


def render(rows: Sequence[Sequence[str]], markdown: bool) -> list[str]:
    if markdown:
        out = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
        for r in rows[1:]:
            first = f"`{r[0]}`" if "/" in r[0] else r[0]
            out.append("| " + " | ".join([first, *r[1:]]) + " |")
        return out
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.tools.durations", description=__doc__)
    parser.add_argument(
        "results", type=Path, nargs="+", help="pytest's JUnit XML (--junitxml), one run's files"
    )
    parser.add_argument(
        "--compare", type=Path, nargs="+", metavar="AFTER", help="a later run's files, per file"
    )
    parser.add_argument("--top", type=int, default=DEFAULT_TOP, help="files shown (default 15)")
    parser.add_argument("--all", action="store_true", help="every file")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        before = read(*args.results)
        if args.compare is not None:
            lines = compare(before, read(*args.compare), args.markdown)
        else:
            lines = table(before, None if args.all else args.top, args.markdown)
    except ResultsError as exc:
        sys.stderr.write(f"durations: {exc}\n")
        return 2
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
