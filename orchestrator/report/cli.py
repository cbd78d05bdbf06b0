"""``python -m orchestrator.report DIR [--train DIR2] [--out FILE]``: write report.html.

Exit codes: 0 written, 2 DIR holds none of the run files (one line naming it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.config.inputs import ConfigError, check_report_path
from orchestrator.report.page import render
from orchestrator.runfiles import REPORT_HTML, collect, missing_dirs, write_atomic


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.report", description=__doc__)
    p.add_argument("dir", type=Path, metavar="DIR", help="search output folder (runs/<name>)")
    p.add_argument("--train", type=Path, metavar="DIR2", help="training run folder")
    p.add_argument("--out", type=Path, metavar="FILE", help=f"default: DIR/{REPORT_HTML}")
    args = p.parse_args(argv)
    bad = missing_dirs([args.dir] + ([args.train] if args.train else []))
    if bad:
        print(f"report: {bad[0]}", file=sys.stderr)
        return 2
    # the training folder first: its summary/grad norms win over a stale DIR/train
    record = collect(([args.train] if args.train else []) + [args.dir])
    out = args.out or args.dir / REPORT_HTML
    try:
        check_report_path(out)
    except ConfigError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    write_atomic(out, render(record, args.dir))  # a page open in a browser is never half one
    print(f"report: wrote {out}")
    return 0
