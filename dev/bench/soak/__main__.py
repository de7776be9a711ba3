"""``python -m dev.bench.soak [--quick] [--out DIR] [--keep]``: one soak.

Writes ``DIR/soak-<date>[-quick].json`` (``dev/bench/results`` for a full run, a temporary
directory for a quick one unless ``--out`` is given). Exits 1 when an invariant was violated
(the violations, with their evidence, are printed and in the JSON), 2 when the run failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from dev.bench.common import RESULTS_DIR, code_version, machine, write_json
from dev.bench.soak import run


def _log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dev.bench.soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="the short run (CI)")
    parser.add_argument("--out", type=Path, help="where the results JSON goes")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    scales = run.QUICK if args.quick else run.FULL
    out: Path = args.out or (
        Path(tempfile.mkdtemp(prefix="kn-rescheduler-soak-quick-")) if args.quick else RESULTS_DIR
    )
    workdir = Path(tempfile.mkdtemp(prefix="kn-rescheduler-soak-"))
    logging.basicConfig(
        filename=workdir / "harness.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    stamp = datetime.datetime.now(datetime.UTC)
    results: dict[str, object] = {
        "date": stamp.isoformat(timespec="seconds"),
        "quick": args.quick,
        "command": "python -m dev.bench.soak --quick" if args.quick else "make soak",
        "machine": machine(),
        "code": code_version(),
        "scales": scales.__dict__,
    }
    code = 0
    try:
        results.update(run.run(scales, workdir, _log))
    except Exception as exc:
        traceback.print_exc()
        results["error"] = f"{type(exc).__name__}: {exc}"
        code = 2
    path = out / (f"soak-{stamp.strftime('%Y-%m-%d')}" + ("-quick" if args.quick else "") + ".json")
    write_json(path, results)
    if code == 0:
        for v in results["invariants"]["violations"]:  # type: ignore[index]
            _log(f"VIOLATION {v['invariant']}: {v['subject']}: {v['message']}")
        figures = {
            k: results[k]
            for k in (
                "pods",
                "events",
                "moves",
                "moves_by_rule",
                "invariant_checks",
                "violations",
                "runtime_s",
            )
        }
        print(json.dumps(figures, indent=1), file=sys.stderr)
        if results.get("violations"):
            code = 1
    _log(f"results: {path}")
    if args.keep or code:
        _log(f"work directory kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
