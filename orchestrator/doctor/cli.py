"""``python -m orchestrator.doctor DIR [DIR2 ...]``: walk the troubleshooting tree with a run's
own numbers (``orchestrator.findings``), over the files a run wrote (``orchestrator.runfiles``).

Exit codes: 0 findings printed (including "no problem found"), 2 a DIR holds none of the files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.findings import context_lines, diagnose, finding_lines
from orchestrator.runfiles import collect, missing_dirs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.doctor", description=__doc__)
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="run folders to examine")
    args = p.parse_args(argv)
    bad = missing_dirs(args.dirs)
    if bad:
        print(f"doctor: {bad[0]}", file=sys.stderr)
        return 2
    record = collect(args.dirs)
    print(f"commtune doctor: {' '.join(map(str, args.dirs))}")
    print("\n".join([*context_lines(record), "", *finding_lines(diagnose(record))]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

