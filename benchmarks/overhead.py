"""Where a search's wall-clock goes, with warm evaluation on and off, side by side in one run.

For each preset (``smoke``, ``cpu-demo`` by default) it runs the real search twice, cold
(``search.warm=false``: fresh workers for every configuration) and warm (configurations that
share environment variables share a worker group), with the same seed, no re-measurement and no
scaling baseline, and prints the measured share of the trials' wall-clock (measured steps over
the time from the first trial's start to the last one's end) and its largest overheads, read
from each run's ``trials.csv`` and ``run_info.json``; then whether warm and cold evaluation
order the configurations both completed alike (pairwise), since a warm group is only worth
its saving if it ranks as fresh workers do.

    python -m benchmarks.overhead                     # both presets (about 15 min on 2 cores)
    python -m benchmarks.overhead --presets smoke     # one
    python -m benchmarks.overhead --quick             # the quick smoke search, cold and warm
    python -m benchmarks.overhead runs/smoke --quick  # its cold twin beside that warm run

With a run folder (``--quick`` only), that folder is the warm search, read, not run: a search
run as ``benchmarks._commands.QUICK_SEARCH`` (the tests give it the one
``calibration.verdicts --quick`` kept), so only its cold twin runs. Its race, after the trials,
is outside the trials' wall-clock this compares.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from benchmarks._commands import QUICK_ARGS, QUICK_PRESET, run_module
from benchmarks._record import add_results_option, recording
from orchestrator.config.inputs import parse_set
from orchestrator.runfiles import BEST_YAML, RUN_INFO, TRIALS_CSV, read_csv, read_run_info
from orchestrator.search.results import TIMING_PARTS

QUIET = ["--set", "search.remeasure_top=0", "--set", "search.scaling_baseline=false"]


def run_search(preset: str, warm: bool, out: Path, extra: list[str]) -> dict[str, float]:
    """One real search; returns its totals (seconds) and the command's wall-clock."""
    args = ["--preset", preset, "--out", str(out), "--set", f"search.warm={warm}", *QUIET, *extra]
    ran = run_module("orchestrator.search", args)
    try:
        return {**totals(out), "command_s": ran.seconds}
    except ValueError as e:  # the search exited 0 and left no trials: said, not a traceback
        raise SystemExit(str(e)) from None


def totals(out: Path) -> dict[str, float]:
    """A finished search's time parts summed over its trials, its trial count and its trials'
    wall-clock (run_info.json); ValueError for a folder without them, naming what is missing."""
    rows = read_csv(out / TRIALS_CSV) if (out / TRIALS_CSV).is_file() else []
    wall_s = read_run_info(out).search_wall_s
    if not rows or not wall_s:
        raise ValueError(f"{out} holds no finished search ({TRIALS_CSV} with trials, and "
                         f"search_wall_s in {RUN_INFO}): name a folder a search wrote")
    found = {k: sum(float(r[k] or 0) for r in rows) for k in TIMING_PARTS}
    return {**found, "trials": len(rows), "search_wall_s": wall_s}


def samples_per_s_by_config(out: Path) -> dict[tuple, float]:
    """Completed trials' samples/s, keyed by their params (the columns between ``state`` and
    ``samples_per_s`` in trials.csv)."""
    rows = read_csv(out / TRIALS_CSV)
    if not rows:
        return {}
    header = list(rows[0])
    names = header[header.index("state") + 1 : header.index("samples_per_s")]
    return {tuple(r[n] for n in names): float(r["samples_per_s"])
            for r in rows if r["state"] == "complete"}  # fmt: skip


def ranking_line(preset: str, cold: dict[tuple, float], warm: dict[tuple, float]) -> str:
    """Do warm and cold evaluation order the configurations both measured alike? Pairwise."""
    common = [k for k in cold if k in warm]
    pairs = list(itertools.combinations(common, 2))
    if not pairs:
        return f"{preset}: fewer than 2 configurations completed both warm and cold"
    agree = sum((cold[a] > cold[b]) == (warm[a] > warm[b]) for a, b in pairs)
    return (f"{preset}: warm and cold order {agree}/{len(pairs)} pairs of the {len(common)} "
            "configurations both completed alike")  # fmt: skip


def table(results: dict[tuple[str, str], dict[str, float]]) -> list[str]:
    parts = [p for p in TIMING_PARTS if p != "measured_s"]
    head = f"{'preset':10} {'evaluation':10} {'trials':>6} {'command':>8} {'trials wall':>11} "
    head += f"{'measured':>9} {'share':>6}  " + " ".join(
        f"{p.removesuffix('_s'):>8}" for p in parts
    )
    lines = [head, "-" * len(head)]
    for (preset, mode), t in results.items():
        wall = t["search_wall_s"]
        unaccounted = wall - sum(t[k] for k in TIMING_PARTS)  # scheduling, group teardown
        shown = " ".join(f"{t[p] + (unaccounted if p == 'other_s' else 0):8.1f}" for p in parts)
        command = f"{t['command_s']:7.0f}s" if "command_s" in t else f"{'(read)':>8}"
        lines.append(
            f"{preset:10} {mode:10} {int(t['trials']):6d} {command} {wall:10.0f}s "
            f"{t['measured_s']:8.0f}s {t['measured_s'] / wall:6.0%}  {shown}"
        )
    return lines


def measure(
    presets: list[str], extra: list[str], read: tuple[Path, dict[str, float]] | None = None
) -> tuple[dict[tuple[str, str], dict[str, float]], list[str]]:  # fmt: skip
    """Each preset's search cold, then warm (``read``: a run folder and its ``totals``, read
    as the warm search, not run): their totals, and whether they rank alike."""
    results: dict[tuple[str, str], dict[str, float]] = {}
    rankings = []
    with tempfile.TemporaryDirectory(prefix="commtune-overhead-") as tmp:
        for preset in presets:
            cold_out = Path(tmp) / f"{preset}-cold"
            warm_out = read[0] if read else Path(tmp) / f"{preset}-warm"
            for mode, out in (("cold", cold_out), ("warm", warm_out)):
                if read and mode == "warm":
                    print(f"reading {preset} ({mode}) from {out}", flush=True)
                    results[preset, mode] = read[1]
                    continue
                print(f"running {preset} ({mode})...", flush=True)
                results[preset, mode] = run_search(preset, mode == "warm", out, extra)
            rankings.append(ranking_line(preset, samples_per_s_by_config(cold_out),
                                         samples_per_s_by_config(warm_out)))  # fmt: skip
    return results, rankings


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The arguments, every refusal made before any search runs: a RUN only with ``--quick``,
    and then one made as QUICK_SEARCH, with nothing its cold twin would run differently."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", nargs="?", type=Path,
                   help="with --quick: a finished QUICK_SEARCH run, read as the warm search")
    p.add_argument("--presets", nargs="+", help="default: smoke cpu-demo")
    p.add_argument("--set", action="append", default=[], help="extra KEY=VALUE for both runs")
    p.add_argument("--quick", action="store_true",
                   help="the quick smoke search (benchmarks._commands.QUICK_SEARCH: 2 trials) "
                   "cold and warm, or cold beside RUN (what the tests run)")  # fmt: skip
    add_results_option(p)
    args = p.parse_args(argv)
    if args.run and not args.quick:
        p.error(f"{args.run}: a run folder is read with --quick only (it must be a QUICK_SEARCH "
                "run, so that its cold twin runs alike); without --quick both searches run")
    if args.quick and args.presets:
        p.error(f"--presets {' '.join(map(str, args.presets))}: --quick runs the {QUICK_PRESET} "
                "preset; drop one of them (a run folder goes before the options)")
    if args.run and args.set:
        p.error(f"--set {args.set[0]}: {args.run} was searched without it, so its cold twin "
                "runs without it too; drop --set, or RUN to run both searches")
    args.read = None
    if args.run:
        try:
            args.read = args.run, check_quick_run(args.run)
        except ValueError as e:
            p.error(str(e))
    args.presets = [QUICK_PRESET] if args.quick else args.presets or ["smoke", "cpu-demo"]
    return args


def quick_settings() -> dict[str, Any]:
    """What QUICK_SEARCH sets (its preset's name, ``--trials``, each ``--set``), by dotted key,
    with warm evaluation on: what a run read as its warm search must have been run with."""
    found: dict[str, Any] = {"name": QUICK_PRESET, "search.warm": True}
    args = iter(QUICK_ARGS)
    for flag, value in zip(args, args, strict=True):
        if flag == "--trials":
            found["search.trials"] = int(value)
        else:
            parts, setting = parse_set(value)  # read as the search reads its --set
            found[".".join(parts)] = setting
    return found


def check_quick_run(run: Path) -> dict[str, float]:
    """``run``'s ``totals``; ValueError unless it is a finished search whose best.yaml holds
    every setting of ``quick_settings`` (the message names the first that differs)."""
    path = run / BEST_YAML
    if not path.is_file():
        raise ValueError(f"{run}: no {BEST_YAML}: name the folder a finished quick search wrote "
                         "(calibration.verdicts --quick --keep DIR writes DIR/run0)")  # fmt: skip
    config = yaml.safe_load(path.read_text()) or {}
    for key, want in quick_settings().items():
        got: Any = config
        for part in key.split("."):
            got = got.get(part) if isinstance(got, dict) else None
        if got != want:
            raise ValueError(f"{run}: {key} is {got!r} in its {BEST_YAML}, the quick search's "
                             f"is {want!r}: its cold twin would not run alike; name a run made "
                             "as benchmarks._commands.QUICK_SEARCH, or drop RUN")  # fmt: skip
    return totals(run)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    extra = [item for kv in args.set for item in ("--set", kv)]
    if args.quick:
        extra = [*QUICK_ARGS, *extra]
    with recording(__spec__.name, argv, args.results, args.quick) as figures:
        results, rankings = measure(args.presets, extra, args.read)
        print("\nseconds summed over the trials ('other' includes scheduling and group teardown)")
        print("\n".join(table(results)))
        for preset in args.presets:
            cold, warm = results[preset, "cold"], results[preset, "warm"]
            ratio = warm["search_wall_s"] / cold["search_wall_s"]
            print(
                f"{preset}: warm/cold trials wall-clock {ratio:.2f}x, "
                f"measured share {cold['measured_s'] / cold['search_wall_s']:.0%} -> "
                f"{warm['measured_s'] / warm['search_wall_s']:.0%}"
            )
        print("\n".join(rankings))
        figures.update(seconds={f"{p} {m}": t for (p, m), t in results.items()},
                       rankings=rankings)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
