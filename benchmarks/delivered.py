"""The gain training gets: after a search, ``orchestrator.train`` with best.yaml and with the
baseline, in turns, beside the verdict's ratio.

The verdict claims a ratio measured in the search's own windows. What a user gets is a
training run of the kept configuration, so this runs both for real, the same steps each,
``--rounds`` pairs (baseline then best, then best then baseline, ...: a slow drift cancels as in
the verdict), each training run a fresh ``python -m orchestrator.train`` in its own folder. A
run's throughput is its samples over its steps' seconds after ``--skip`` (the first steps build
buckets and caches): what training pays, a slow step included, as in the race's mean windows.
It prints each pair, the delivered ratio with its 95% interval (Student's t on the pairs' log
ratios, ``orchestrator.paired``) and the verdict's line; a verdict ratio outside the delivered
interval is a defect to find.

    python -m benchmarks.delivered runs/cpu-demo                  # 3 pairs of 30 steps
    python -m benchmarks.delivered runs/cpu-demo --rounds 4 --steps 40
    python -m benchmarks.delivered --quick                         # a smoke search first
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from orchestrator.inputs import TUNED_KNOBS
from orchestrator.paired import PairedRatio, pair_order
from orchestrator.runfiles import BEST_YAML, PROGRESS_CSV, REMEASURE_CSV, TRIALS_CSV
from orchestrator.verdict import Verdict, verdict_from_rows

ROOT = Path(__file__).resolve().parents[1]


def configs(run: Path, into: Path) -> tuple[Path, Path]:
    """best.yaml as written, and the baseline: the same config with trial 0's knobs (its
    strategy and the values its columns in trials.csv hold) and no searched variables."""
    best = yaml.safe_load((run / BEST_YAML).read_text())
    with (run / TRIALS_CSV).open() as f:
        trial0 = next(r for r in csv.DictReader(f) if r["number"] == "0")
    knobs = {k: yaml.safe_load(v) for k, v in trial0.items()
             if k in TUNED_KNOBS and k != "strategy" and v != ""}  # fmt: skip
    baseline = {
        **best,
        "strategy": trial0.get("strategy") or best["strategy"],
        "tuned": knobs,
        "env": {k: v for k, v in (best.get("env") or {}).items() if k not in trial0},
    }
    paths = into / "kept-config.yaml", into / "baseline-config.yaml"
    paths[0].write_text(yaml.safe_dump(best))
    paths[1].write_text(yaml.safe_dump(baseline))
    return paths


def train(config: Path, out: Path, steps: int, skip: int) -> float:
    """One training run; its samples/s after ``skip`` steps (the harmonic mean of the steps'
    figures: their samples over their seconds, every step the same global batch)."""
    cmd = [sys.executable, "-m", "orchestrator.train", "--config", str(config), "--steps",
           str(steps), "--checkpoint-every", str(steps), "--out", str(out)]  # fmt: skip
    _run(cmd)
    with (out / PROGRESS_CSV).open() as f:
        rows = [r for r in csv.DictReader(f) if int(r["step"]) > skip]
    return statistics.harmonic_mean([float(r["samples_per_s"]) for r in rows])


def quick_search(out: Path) -> None:
    """The smoke search of ``--quick``: 2 trials, a 3-pair race, no pruning (a pruned trial 1
    would leave no finalist, so no verdict to check)."""
    search = [sys.executable, "-m", "orchestrator.search", "--preset", "smoke", "--trials", "2",
              "--out", str(out), "--set", "search.verdict_pairs=3", "--set", "search.prune=false",
              "--set", "search.scaling_baseline=false"]  # fmt: skip
    _run(search)


def _run(cmd: list[str]) -> None:
    """Run a command of the project's; its output is shown only if it fails."""
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}"
                         f"{done.stderr[-3000:]}")  # fmt: skip


def read_verdict(run: Path) -> Verdict:
    """The verdict the search wrote, read from its remeasure.csv as the search read it; a run
    without one (no finalist, or the time budget spent before the race) has nothing to check,
    and says so before any training run is spent."""
    path = run / REMEASURE_CSV
    if not path.is_file():
        raise SystemExit(f"{path} is missing: that search re-measured no finalist (its output "
                         "says why: every other trial failed or was pruned, or its time budget "
                         "was spent), so it has no verdict to check against training")  # fmt: skip
    with path.open() as f:
        return verdict_from_rows(list(csv.DictReader(f)))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", help=f"a search's run folder ({BEST_YAML}, {TRIALS_CSV})")
    ap.add_argument("--rounds", type=int, default=3, help="baseline/best pairs")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per training run")
    ap.add_argument("--skip", type=int, default=5, help="first steps left out of a run's figure")
    quick = "a smoke search (2 trials, a 3-pair race), then 2 pairs of 12 steps (the tests')"
    ap.add_argument("--quick", action="store_true", help=quick)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="commtune-delivered-") as tmp:
        work = Path(tmp)
        if args.quick:
            args.run, args.rounds, args.steps, args.skip = str(work / "search"), 2, 12, 3
            quick_search(Path(args.run))
        if not args.run:
            ap.error("name a search's run folder (or --quick)")
        run = Path(args.run)
        verdict = read_verdict(run)
        best, baseline = configs(run, work)
        ratios = []
        for k in range(args.rounds):
            got = {}
            for role in pair_order(k):
                path = baseline if role == "baseline" else best
                got[role] = train(path, work / f"{role}{k}", args.steps, args.skip)
            ratios.append(got["finalist"] / got["baseline"])
            print(f"pair {k + 1}: best {got['finalist']:.2f} vs baseline {got['baseline']:.2f} "
                  f"samples/s = {ratios[-1]:.3f}", flush=True)  # fmt: skip
        paired = PairedRatio(tuple(ratios))
    print(f"delivered: {paired.ratio:.3f}x (interval {paired.low:.3f}-{paired.high:.3f} from "
          f"{paired.pairs} pairs of {args.steps}-step training runs)")  # fmt: skip
    print(f"verdict:   {verdict.line()}")
    claimed = verdict.chosen.ratio if verdict.chosen else 1.0
    inside = paired.low <= claimed <= paired.high
    print(f"the verdict's ratio {claimed:.3f} is {'inside' if inside else 'OUTSIDE'} the "
          "delivered interval" + ("" if inside else ": a defect to find"))


if __name__ == "__main__":
    main()
