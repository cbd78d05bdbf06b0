"""How far the final verdict can be trusted: the README's default search, run again and again.

Runs ``python -m orchestrator.search`` (the cpu-demo default, each run in its own folder with
the same seed) ``--clean`` times on a quiet machine, then ``--hogged`` times with a CPU hog
(one busy process per core) started when the re-measurement begins and stopped after
``--hog-s`` seconds, as a neighbour job would. For each run it prints the final verdict line and
the measurements behind it (``remeasure.csv``: window pairs' ratios, or paired runs and
those flagged disturbed). A verdict a user can bet on is the
same finalist (or the same "keep the baseline") on the clean runs, and the hogged run either
agrees, measures the disturbed runs again, or says it is too noisy to decide.

    python -m benchmarks.calibration.verdicts             # 3 clean + 1 hogged (about 30 min)
    python -m benchmarks.calibration.verdicts --clean 1 --hogged 0
    python -m benchmarks.calibration.verdicts --quick     # one smoke search (the tests')
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

from benchmarks._commands import QUICK_SEARCH, run_module
from benchmarks._record import add_results_option, recording
from orchestrator.runfiles import REMEASURE_CSV, read_csv
from orchestrator.runfiles.remeasure import BASELINE, FINALIST, WINDOW, Remeasured, read_rows

REMEASURE_MARK = "finalists:"
"""The search's line naming its finalists, before they are measured again: the hog starts."""


def _burn(stop_at: float) -> None:
    """One busy core until ``stop_at`` (a neighbour's training step, as the OS sees it)."""
    while time.monotonic() < stop_at:
        pass


def _hog(seconds: float) -> list[multiprocessing.Process]:
    stop_at = time.monotonic() + seconds
    cores = os.cpu_count() or 1
    procs = [multiprocessing.Process(target=_burn, args=(stop_at,)) for _ in range(cores)]
    for p in procs:
        p.start()
    return procs


def run_once(out: Path, hog_s: float | None, extra: list[str]) -> dict[str, str]:
    """One default search; with ``hog_s``, a hog starts at its first re-measurement line."""
    hogs: list[multiprocessing.Process] = []

    def hog_at_the_race(line: str) -> None:
        if hog_s is not None and not hogs and line.startswith(REMEASURE_MARK):
            hogs.extend(_hog(hog_s))
            print(f"  hog: {len(hogs)} busy process(es) for {hog_s:.0f} s", flush=True)

    try:
        ran = run_module("orchestrator.search", ["--out", str(out), *extra],
                         on_line=hog_at_the_race)  # fmt: skip
    finally:
        for p in hogs:
            p.join()
    lines = ran.stdout.splitlines()
    verdict = next((x.strip() for x in reversed(lines) if x.startswith(_VERDICT)), "(no verdict)")
    wall_s = f"{ran.seconds:.0f}"
    path = out / REMEASURE_CSV
    return {"wall_s": wall_s, "verdict": verdict, "disturbed": _disturbed(path),
            "sequence": _sequence(path)}  # fmt: skip


_VERDICT = "verdict: "
"""How the search's summary introduces the verdict (orchestrator.search.results)."""


def _rows(path: Path) -> list[Remeasured]:
    """remeasure.csv's rows as the search's own reader reads them."""
    return read_rows(read_csv(path))


def _disturbed(path: Path) -> str:
    """Which re-measured runs were flagged disturbed (and repeated)."""
    if not path.exists():
        return f"no {REMEASURE_CSV}"
    rows = _rows(path)
    bad = [f"trial {r.trial} run {r.position}.{r.repeat}" for r in rows if r.disturbed]
    return f"{len(bad)}/{len(rows)} disturbed" + (f" ({', '.join(bad)})" if bad else "")


def _sequence(path: Path) -> str:
    """The measurements in order: paired runs as ``B 22.14 (13.2%) | t5 ...`` (a repeat after
    a disturbed run marked ``again``), window pairs as each finalist's ratios
    (``t5: 1.08 1.11 1.07``)."""
    if not path.exists():
        return ""
    parts, pairs = [], {}
    for r in _rows(path):
        if r.pairing == WINDOW:
            if r.pair is not None:
                key = r.trial if r.role == FINALIST else r.against
                pairs.setdefault(key, {})[(r.role, r.pair)] = r.samples_per_s
            continue
        who = "B" if r.role == BASELINE else f"t{r.trial}"
        if r.samples_per_s is None:
            parts.append(f"{who} {r.state}")
            continue
        figure = f"{r.samples_per_s:.2f} ({r.throughput_cv or 0:.1%})"
        mark = (" again" if r.repeat else "") + (" disturbed" if r.disturbed else "")
        parts.append(f"{who}{mark} {figure}")
    for trial, got in pairs.items():
        ratios = [mine / got[(BASELINE, pair)] for (role, pair), mine in got.items()
                  if role == FINALIST and mine and got.get((BASELINE, pair))]  # fmt: skip
        parts.append(f"t{trial}: " + " ".join(f"{x:.3f}" for x in ratios))
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clean", type=int, default=3, help="runs on a quiet machine")
    ap.add_argument("--hogged", type=int, default=1, help="runs with a hog during re-measurement")
    ap.add_argument("--hog-s", type=float, default=60.0, help="how long the hog runs")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="passed on to the search")  # fmt: skip
    ap.add_argument("--keep", metavar="DIR",
                    help="keep each run's folder under DIR (for benchmarks.delivered, and with "
                         "--quick for benchmarks.overhead)")
    ap.add_argument("--quick", action="store_true",
                    help="one clean smoke search (benchmarks._commands.QUICK_SEARCH: 2 trials, "
                         "a race of 3 pairs; what the tests run)")  # fmt: skip
    add_results_option(ap)
    args = ap.parse_args(argv)
    extra = [x for kv in args.set for x in ("--set", kv)]
    if args.quick:
        args.clean, args.hogged = 1, 0
        extra = [*QUICK_SEARCH, *extra]
    plan = [None] * args.clean + [args.hog_s] * args.hogged
    with (recording(__spec__.name, argv, args.results, args.quick) as figures,
          tempfile.TemporaryDirectory(prefix="commtune-verdicts-") as tmp):  # fmt: skip
        where = Path(args.keep or tmp)
        figures["runs"] = []
        for i, hog_s in enumerate(plan):
            print(f"run {i + 1}/{len(plan)}{' (hogged)' if hog_s else ''} ...", flush=True)
            row = run_once(where / f"run{i}", hog_s, extra)
            figures["runs"].append({"hog_s": hog_s, **row})
            print(f"  {row['wall_s']} s; {row['disturbed']}\n  {row['sequence']}\n"
                  f"  {row['verdict']}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
