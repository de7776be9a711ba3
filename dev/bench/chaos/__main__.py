"""``python -m dev.bench.chaos [--quick] [--seed N] [--out DIR] [--keep]``: one chaos run.

Writes ``DIR/chaos-<date>[-quick].json`` (``dev/bench/results`` for a full run; a quick run writes
to a temporary directory unless ``--out`` is given); a full run also rewrites the figures table
of docs/reliability.md. Exits 1 when an invariant was violated (the violations, with their
evidence, are printed and in the JSON), 2 when the run itself failed.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from dev.bench.chaos import report, run, scenario
from dev.bench.common import RESULTS_DIR, ROOT, code_version, machine, write_json

DEFAULT_SEED = 11


def _log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dev.bench.chaos", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="the short run (CI)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="the fault schedule's seed")
    parser.add_argument("--out", type=Path, help="where the results JSON goes")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    scales = scenario.QUICK if args.quick else scenario.FULL
    out: Path = args.out or (
        Path(tempfile.mkdtemp(prefix="kn-rescheduler-chaos-quick-")) if args.quick else RESULTS_DIR
    )
    workdir = Path(tempfile.mkdtemp(prefix="kn-rescheduler-chaos-"))
    # The pipeline's own logs (the stack's, the faults') go to a file; stderr is the story.
    logging.basicConfig(
        filename=workdir / "harness.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    stamp = datetime.datetime.now(datetime.UTC)
    command = "make chaos" if not args.quick else "python -m dev.bench.chaos --quick"
    if args.seed != DEFAULT_SEED:
        command += f" SEED={args.seed}" if not args.quick else f" --seed {args.seed}"
    results: dict[str, object] = {
        "date": stamp.isoformat(timespec="seconds"),
        "quick": args.quick,
        "command": command,
        "machine": machine(),
        "code": code_version(),
        "scales": scales.__dict__,
    }
    code = 0
    try:
        results.update(run.run(scales, args.seed, workdir, _log))
    except Exception as exc:
        traceback.print_exc()
        results["error"] = f"{type(exc).__name__}: {exc}"
        code = 2
    name = f"chaos-{stamp.strftime('%Y-%m-%d')}" + ("-quick" if args.quick else "")
    path = out / f"{name}.json"
    write_json(path, results)
    if code == 0:
        print(report.summary(results), file=sys.stderr)
        if results.get("violations"):
            code = 1
        if not args.quick:
            report.write_doc(results, path, ROOT / "docs" / "reliability.md")
    _log(f"results: {path}")
    if args.keep or code:
        _log(f"work directory kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
