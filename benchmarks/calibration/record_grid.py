"""Record the landscape of a real search space: every grid point measured on this machine.

Runs ``python -m orchestrator.search`` with the grid sampler over the whole space of a preset
(warm evaluation, no pruning, no cost-model seeds, no re-measurement) and writes one row per
grid point: the params under their real names (empty where inactive), ``samples_per_s``,
``cv`` (the trial's window spread) and ``state``. ``search_efficiency.py`` beside it replays
it. The stored ``data/cpu_demo_grid.csv`` beside it came from:

    python -m benchmarks.calibration.record_grid --preset cpu-demo \
        --csv benchmarks/calibration/data/cpu_demo_grid.csv

(about 25 minutes on the 2-core CI machine; nothing else should run meanwhile). ``--quick``
records the smoke preset's accumulation space alone (what the tests run).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._commands import run_module
from benchmarks._record import add_results_option, recording
from orchestrator.runfiles import TRIALS_CSV

FIXED = [
    "search.sampler=grid", "search.trials=10000", "search.prune=false", "search.remeasure_top=0",
    "search.scaling_baseline=false", "search.cost_model_seeds=0", "search.group_size=10000",
]  # fmt: skip


def record(preset: str, out: Path, extra: list[str]) -> Path:
    """Run the grid search into ``out`` (its progress shown as it goes); returns its
    trials.csv."""
    sets = [item for kv in [*FIXED, *extra] for item in ("--set", kv)]
    run_module("orchestrator.search", ["--preset", preset, "--out", str(out), *sets],
               on_line=print)  # fmt: skip
    return out / TRIALS_CSV


def convert(trials_csv: Path, dest: Path) -> int:
    """trials.csv -> the landscape format; returns the number of rows."""
    rows = list(csv.DictReader(trials_csv.open()))
    header = list(rows[0])
    names = header[header.index("state") + 1 : header.index("samples_per_s")]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with dest.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*names, "samples_per_s", "cv", "state"])
        for r in rows:
            writer.writerow([*(r[n] for n in names), r["samples_per_s"], r["throughput_cv"],
                             r["state"]])  # fmt: skip
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu-demo")
    p.add_argument("--csv", type=Path, help="where the landscape goes (required but --quick)")
    p.add_argument("--set", action="append", default=[], help="extra KEY=VALUE")
    p.add_argument("--quick", action="store_true",
                   help="the smoke preset's accumulation space alone, into a temporary file "
                   "unless --csv (what the tests run)")  # fmt: skip
    add_results_option(p)
    args = p.parse_args(argv)
    if args.quick:
        args.preset, args.set = "smoke", [*args.set, "search.spaces=[accumulation]", "strategy=ddp"]
    elif args.csv is None:
        p.error("--csv is required (where the landscape goes)")
    started = time.monotonic()
    with (recording(__spec__.name, argv, args.results, args.quick) as figures,
          tempfile.TemporaryDirectory(prefix="commtune-grid-") as tmp):  # fmt: skip
        dest = args.csv or Path(tmp) / "landscape.csv"  # --quick without --csv: shown, not kept
        trials = record(args.preset, Path(tmp) / "grid", args.set)
        count = convert(trials, dest)
        print(dest.read_text(), end="")
        print(f"{count} grid points written to {dest} in {time.monotonic() - started:.0f}s")
        figures.update(preset=args.preset, grid_points=count, csv=str(args.csv or ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
