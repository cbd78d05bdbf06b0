"""The gain training gets: after a search, ``orchestrator.train`` with the verdict's finalist and
with the baseline, in turns, beside the verdict's ratio.

The verdict claims a ratio measured in the search's own windows. What a user gets is a
training run of the kept configuration, so this runs both for real, the same steps each,
``--rounds`` pairs (baseline then finalist, then finalist then baseline, ...: a slow drift
cancels as in the verdict), each training run a fresh ``python -m orchestrator.train`` in its
own folder, all joining one Ray (the config's cluster, else a local one started once). The
finalist is the verdict's leader (the highest lower end; ``--trial`` names another):
best.yaml as written where the verdict kept it, else the trial as the search ran it
(best.yaml's workload and cluster, the trial's knobs and variables from trials.csv), so a "no
gain" or "too noisy" verdict is checked against training too. A run's throughput is its
samples over its steps' seconds after ``--skip`` (the first steps build buckets and caches):
what training pays, a slow step included, as in the race's mean windows. It prints each pair,
the delivered ratio with its 95% interval (Student's t on the pairs' log ratios,
``orchestrator.verdict.paired``) and the verdict's line; a verdict ratio outside the delivered
interval
is a defect to find.

    python -m benchmarks.delivered runs/cpu-demo                  # 3 pairs of 30 steps
    python -m benchmarks.delivered runs/cpu-demo --rounds 4 --steps 40 --trial 3
    python -m benchmarks.delivered --quick                         # a smoke search first
    python -m benchmarks.delivered runs/smoke --quick              # 1 pair of 12 steps on it

One pair gives a ratio and no interval (``--rounds 2`` or more give one): the quick mode is a
check that the benchmark runs, not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from benchmarks._commands import QUICK_SEARCH, run_module
from benchmarks._record import add_results_option, recording
from orchestrator.cluster.session import ray_address
from orchestrator.config.schema import ConfigError, load_config
from orchestrator.runfiles import BEST_YAML, PROGRESS_CSV, REMEASURE_CSV, TRIALS_CSV, collect
from orchestrator.train.run import start_ray_for
from orchestrator.train.runlog import wall_samples_per_s
from orchestrator.verdict.decide import Verdict, verdict_from_rows
from orchestrator.verdict.paired import PairedRatio, pair_order
from search_spaces import is_env_name
from search_spaces.knobs import PLAN_KNOBS
from train_fns.metrics import SAMPLES_PER_S, STEP_TIME_S, WALL_TIME

ROOT = Path(__file__).resolve().parents[1]


def searched(row: dict[str, str]) -> dict[str, str]:
    """A trials.csv row's searched cells as written, those the trial set: its knobs and its
    variables (not its figures or its reason)."""
    return {k: v for k, v in row.items() if isinstance(k, str) and isinstance(v, str)
            and v != "" and (k in PLAN_KNOBS or is_env_name(k))}  # fmt: skip


def started_from(best: dict[str, Any], kept: dict[str, str], base: dict[str, str]) -> dict:
    """The config the search started from: best.yaml less what its trial (``kept``, trials.csv
    row) searched. A variable at the baseline's value (trial 0: every searched variable at its
    default, none exported) was the user's own, not the search's; ``sizes`` (a world-sizes
    search's entries) go: they hold best.yaml's configurations, not another trial's."""
    mine, theirs = searched(kept), searched(base)
    tuned = {k: v for k, v in (best.get("tuned") or {}).items() if k not in mine}
    env = {k: v for k, v in (best.get("env") or {}).items()
           if k not in mine or mine[k] == theirs.get(k)}  # fmt: skip
    return {**best, "tuned": tuned, "env": env, "sizes": {}}


def trial_config(start: dict[str, Any], row: dict[str, str], base: dict[str, str]) -> dict:
    """A complete config that runs one trial as the search ran it (``derive_plan``): the
    config it started from (``started_from``) with the trial's strategy and knobs, and the
    variables it set away from the baseline's (``base``, trial 0's row) as strings."""
    mine, theirs = searched(row), searched(base)
    knobs = {k: yaml.safe_load(v) for k, v in mine.items() if k in PLAN_KNOBS}
    strategy = knobs.pop("strategy", start["strategy"])
    env = {**(start.get("env") or {}),
           **{k: v for k, v in mine.items() if is_env_name(k) and v != theirs.get(k)}}
    return {**start, "strategy": strategy, "tuned": {**(start.get("tuned") or {}), **knobs},
            "env": env}  # fmt: skip


def configs(run: Path, verdict: Verdict, trial: int | None, into: Path) -> tuple[Path, Path, int]:
    """The finalist's config and the baseline's (trial 0's), written into ``into``, and the
    finalist's trial number: ``trial``, else the verdict's leader. The kept one runs from
    best.yaml as written, any other from its trials.csv row."""
    number = verdict.comparisons[0].number if trial is None else trial
    best = yaml.safe_load((run / BEST_YAML).read_text())
    with (run / TRIALS_CSV).open() as f:
        rows = {r["number"]: r for r in csv.DictReader(f)}
    mine, base = (complete_row(rows, n, run / TRIALS_CSV) for n in (number, 0))
    written = collect([run]).best_number
    start = started_from(best, rows.get(str(written)) or base, base)
    kept = verdict.chosen is not None and verdict.chosen.number == number == written
    paths = into / f"trial{number}-config.yaml", into / "baseline-config.yaml"
    paths[0].write_text(yaml.safe_dump(best if kept else trial_config(start, mine, base)))
    paths[1].write_text(yaml.safe_dump(trial_config(start, base, base)))
    return paths[0], paths[1], number


def complete_row(rows: dict[str, dict[str, str]], number: int, path: Path) -> dict[str, str]:
    """Trial ``number``'s row, refused before any training run unless it completed: one that
    failed or was pruned has no figure to compare, and a trial that never ran has no knobs."""
    row = rows.get(str(number))
    if row is None:
        raise SystemExit(f"{path} has no row for trial {number}: name one it holds with --trial")
    if row.get("state") != "complete":
        raise SystemExit(f"trial {number} in {path} is {row.get('state') or 'without a state'}"
                         f" ({row.get('reason') or 'no reason given'}), not complete: name a "
                         "complete trial with --trial")  # fmt: skip
    return row


@contextlib.contextmanager
def one_ray(config: Path) -> Iterator[str | None]:
    """The Ray every training run joins: ``config``'s cluster (None: each run joins it by its
    config), else the local Ray its runs would each start, started once here (its address;
    stopped at the end), so that no run pays a Ray start of its own: both roles alike, and the
    figures leave out the first steps either way."""
    import ray

    try:
        loaded = load_config(str(config))
    except ConfigError as e:
        raise SystemExit(f"{config}: {e}") from None
    if ray_address(loaded):  # each run joins it as its config says, and names it so on error
        yield None
        return
    start_ray_for(loaded, verbose=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def train(
    config: Path, out: Path, steps: int, skip: int, address: str | None
) -> tuple[float, float | None]:  # fmt: skip
    """One training run, on the Ray at ``address`` (None: its config's); its samples/s after
    ``skip`` steps: over the steps' seconds (the harmonic mean of the steps' figures, every
    step the same global batch), and over the wall-clock those steps spanned
    (``wall_samples_per_s``: what lies between steps too)."""
    args = ["--config", str(config), "--steps", str(steps), "--checkpoint-every", str(steps),
            *(["--address", address] if address else [])]  # fmt: skip
    run_module("orchestrator.train", [*args, "--out", str(out)])
    with (out / PROGRESS_CSV).open() as f:
        rows = [r for r in csv.DictReader(f) if int(r["step"]) > skip]
    figures = [{k: float(r[k]) for k in (WALL_TIME, STEP_TIME_S, SAMPLES_PER_S)} for r in rows]
    steps = statistics.harmonic_mean([r[SAMPLES_PER_S] for r in figures])
    return steps, wall_samples_per_s(figures)


def trained_pairs(
    paths: dict[str, Path], number: int, args: argparse.Namespace, work: Path
) -> tuple[list[float], list[float | None]]:  # fmt: skip
    """``args.rounds`` pairs of training runs (``paths``: each role's config) in alternating
    order on one Ray: each pair's ratio by step and by wall-clock, printed as it comes."""
    ratios: list[float] = []
    walls: list[float | None] = []
    with one_ray(paths["baseline"]) as address:
        for k in range(args.rounds):
            got = {role: train(paths[role], work / f"{role}{k}", args.steps, args.skip, address)
                   for role in pair_order(k)}  # fmt: skip
            (mine, mine_wall), (base, base_wall) = got["finalist"], got["baseline"]
            ratios.append(mine / base)
            walls.append(mine_wall / base_wall if mine_wall and base_wall else None)
            print(f"pair {k + 1}: trial {number} {mine:.2f} vs baseline {base:.2f} samples/s "
                  f"= {ratios[-1]:.3f}; over the wall-clock {walls[-1] or float('nan'):.3f}",
                  flush=True)  # fmt: skip
    return ratios, walls


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


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, before any training run is spent, what would fail or mean nothing after one: no
    pair, a run with no step left to measure, a run folder that is not one."""
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: at least 1 pair (2 or more give an interval)")
    if args.skip < 0 or args.steps <= args.skip:
        ap.error(f"--steps {args.steps} --skip {args.skip}: a run measures the steps after "
                 "the skipped ones, so --steps must exceed --skip (and --skip be 0 or more)")
    if args.run and not (Path(args.run) / BEST_YAML).is_file():
        what = "is not a folder" if not Path(args.run).is_dir() else f"holds no {BEST_YAML}"
        ap.error(f"{args.run} {what}: name a search's run folder (its --out)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", help=f"a search's run folder ({BEST_YAML}, {TRIALS_CSV})")
    ap.add_argument("--rounds", type=int, default=3, help="baseline/finalist pairs")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per training run")
    ap.add_argument("--skip", type=int, default=5, help="first steps left out of a run's figure")
    ap.add_argument("--trial", type=int, help="the trial to train beside the baseline (default: "
                    "the verdict's leader, kept or not)")  # fmt: skip
    quick = (
        "1 pair of 12 steps (a ratio, no interval); without a run folder a smoke search (2 "
        "trials, a 3-pair race) first (the tests give it the run that "
        "benchmarks.calibration.verdicts kept)"
    )
    ap.add_argument("--quick", action="store_true", help=quick)
    add_results_option(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.skip = 1, 12, 3
    check_args(ap, args)
    with (recording(__spec__.name, argv, args.results, args.quick) as figures,
          tempfile.TemporaryDirectory(prefix="commtune-delivered-") as tmp):  # fmt: skip
        work = Path(tmp)
        if args.quick and not args.run:
            args.run = str(work / "search")
            run_module("orchestrator.search", [*QUICK_SEARCH, "--out", args.run])
        if not args.run:
            ap.error("name a search's run folder (or --quick)")
        run = Path(args.run)
        verdict = read_verdict(run)  # before any training run: a run without one says so
        if not verdict.comparisons and args.trial is None:
            raise SystemExit(f"{run / REMEASURE_CSV} holds no finalist's comparison: name a "
                             "trial to train beside the baseline with --trial")  # fmt: skip
        finalist, baseline, number = configs(run, verdict, args.trial, work)
        ratios, walls = trained_pairs({"finalist": finalist, "baseline": baseline}, number,
                                      args, work)  # fmt: skip
        paired = PairedRatio(tuple(ratios))
        print(f"delivered: {described(paired)} of {args.steps}-step training runs")
        wall = PairedRatio(tuple(walls)) if None not in walls else None
        if wall:
            print(f"delivered over the wall-clock: {described(wall)}: reports, checkpoints and "
                  "references between steps included")  # fmt: skip
        print(f"verdict:   {verdict.line()}")
        print(judged(verdict, number, paired))
        interval = paired.pairs > 1
        figures.update(trial=number, steps=args.steps, pair_ratios=ratios, ratio=paired.ratio,
                       low=paired.low if interval else None,
                       high=paired.high if interval else None, wall_pair_ratios=walls,
                       wall_ratio=wall.ratio if wall else None, verdict=verdict.line())  # fmt: skip


def described(paired: PairedRatio) -> str:
    """The delivered ratio with its interval and pairs; from one pair, the ratio alone (a
    t-interval from one pair has no spread: it would run from 0 to infinity)."""
    if paired.pairs < 2:
        return f"{paired.ratio:.3f}x from 1 pair (an interval needs two: --rounds 2 or more)"
    return (f"{paired.ratio:.3f}x (interval {paired.low:.3f}-{paired.high:.3f} from "
            f"{paired.pairs} pairs)")  # fmt: skip


def judged(verdict: Verdict, number: int, paired: PairedRatio) -> str:
    """The verdict's ratio for trial ``number`` against the delivered interval."""
    claimed = next((c.ratio for c in verdict.comparisons if c.number == number), None)
    if claimed is None:
        return f"the verdict compared no trial {number} with the baseline: nothing to check"
    if paired.pairs < 2:
        return (f"the verdict's ratio {claimed:.3f} for trial {number} is not checked: one pair "
                "gives no interval (--rounds 2 or more)")  # fmt: skip
    inside = paired.low <= claimed <= paired.high
    return (f"the verdict's ratio {claimed:.3f} for trial {number} is "
            f"{'inside' if inside else 'OUTSIDE'} the delivered interval"
            + ("" if inside else ": a defect to find"))  # fmt: skip


if __name__ == "__main__":
    main()
