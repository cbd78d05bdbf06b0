"""How often the verdict claims a gain where there is none: the A/A check.

The decision procedure of the search's verdict (``orchestrator.search.race``: paired windows in
one worker group, sequential stopping at δ) runs with a finalist that *is* the baseline, built a
second time, decision after decision in the same worker group. Every "keep" is a false keep,
every "slower" a false alarm; "no gain" is right and "undecided" is the budget running out.
A decision may take as many pairs as the search's race gives its leader (``verdict_pairs`` for
each finalist, less the first three each of the others take): every pair is one more look.
Every ``--busy-every``-th decision runs beside a neighbour: one process per core that is busy
and idle in turns of random length (1 to 8 s), the disturbance that pairing must survive.

    python -m benchmarks.calibration.aa_verdict           # cpu-demo, 20 decisions, every 2nd busy
    python -m benchmarks.calibration.aa_verdict --decisions 40 --busy-every 0
    python -m benchmarks.calibration.aa_verdict --quick   # smoke, 3 decisions (the tests')
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from benchmarks._record import add_results_option, recording
from orchestrator.cluster.session import resolve_gpu, start_ray
from orchestrator.config.schema import load_config
from orchestrator.planning.from_config import resolve_task
from orchestrator.runfiles import storage_dir
from orchestrator.search.context import space_of
from orchestrator.search.pipeline import search_context
from orchestrator.search.race import SWITCH_STEPS, Race
from orchestrator.search.results import TrialRecord
from orchestrator.search.trial import TrialContext, derive_plan, measure_plans
from orchestrator.verdict.decide import KEEP, decide
from orchestrator.verdict.paired import MIN_PAIRS, noise_floor
from train_fns import metrics as m
from train_fns.plan import TrialPlan


def _neighbour(stop_at: float, seed: int) -> None:
    """Busy, then idle, in turns of 1 to 8 s, until ``stop_at``."""
    rng = random.Random(seed)
    while time.monotonic() < stop_at:
        until = min(stop_at, time.monotonic() + rng.uniform(1.0, 8.0))
        if rng.random() < 0.5:
            while time.monotonic() < until:
                pass
        else:
            time.sleep(max(0.0, until - time.monotonic()))


class Neighbours:
    """One ``_neighbour`` per core while the block runs."""

    def __init__(self, seed: int) -> None:
        self.seed, self.procs = seed, []

    def __enter__(self) -> None:
        stop_at = time.monotonic() + 3600
        self.procs = [
            # spawned, not forked: a fork of this Ray driver would print Ray's SIGTERM trace
            multiprocessing.get_context("spawn").Process(
                target=_neighbour, args=(stop_at, self.seed + i), daemon=True
            )
            for i in range(os.cpu_count() or 1)
        ]
        for p in self.procs:
            p.start()

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.terminate()
            p.join()


class Repeated(Race):
    """The race with the baseline's twin as its one finalist, decided ``decisions`` times."""

    def __init__(
        self, ctx: TrialContext, base: TrialRecord, decisions: int, busy_every: int, floor: float,
        switch_steps: int,
    ) -> None:  # fmt: skip
        twin = TrialRecord(1, m.COMPLETE, "", dict(base.params), {})
        super().__init__(ctx, base, [twin], say=lambda line: None, floor=floor,
                         switch_steps=switch_steps)  # fmt: skip
        self.decisions, self.busy_every = decisions, busy_every
        # as many pairs as the search's race can give its leader: the other finalists take
        # their first MIN_PAIRS each, the leader the rest (more looks, more chances to keep)
        search = ctx.config.search
        others = MIN_PAIRS * (search.remeasure_top - 1)
        self.max_pairs = search.verdict_pairs * search.remeasure_top - others
        self.results: list[tuple[bool, str, int, float, float, float]] = []

    def _schedule(self) -> Iterator[TrialPlan]:
        yield from self.warm_ups()
        (twin,) = self.entrants
        for k in range(self.decisions):
            twin.windows.clear()
            twin.baseline.clear()
            twin.out, self.next_pair = None, 0
            busy = bool(self.busy_every) and k % self.busy_every == self.busy_every - 1
            started = time.monotonic()
            if busy:
                with Neighbours(seed=k):
                    yield from self.rounds()
            else:
                yield from self.rounds()
            paired = twin.paired
            decision = decide(paired.low, paired.high, self.delta, paired.bound)
            if twin.measured < self.max_pairs and decision == "undecided":
                decision = "ended early"
            self.results.append((busy, decision, paired.pairs, paired.ratio, paired.low,
                                 paired.high))  # fmt: skip
            took = time.monotonic() - started
            out = f" ({len(paired.disturbed)} disturbed left out)" if paired.disturbed else ""
            print(f"decision {k + 1:2d}{' (busy)' if busy else '       '}: {decision:9s} after "
                  f"{paired.pairs:2d} pairs{out}: {paired.ratio:.3f}x (interval {paired.low:.3f}-"
                  f"{paired.high:.3f}) [{took:.0f} s]; pairs "
                  + " ".join(f"{r:.3f}" for r in paired.ratios) + "; baseline windows "
                  + " ".join(f"{b:.1f}" for b in paired.baseline), flush=True)  # fmt: skip
        self.finished = True


def calibrate(ctx: TrialContext, base: TrialRecord, trials: int) -> tuple[TrialRecord, float]:
    """The baseline as a search would hand it to the race: its search figure (the first of
    ``trials`` trials of it, which its slow race windows are judged by) and the noise floor
    (``paired.noise_floor`` of their window cvs). As many trials as a search completes: the
    floor is a median of cvs, and one of two cvs of two windows each (the cpu-demo's) came out
    10.6% where five default searches' floors (medians over seven trials) were 2.2-8.9%."""
    plan = derive_plan(ctx, base.params)
    found = measure_plans(ctx, [plan] * trials, "calibration")
    if any(o.get(m.STATE) != m.COMPLETE for o in found):
        raise SystemExit(f"the calibration trials did not complete: {found}")
    figures = {k: found[0][k] for k in (m.SAMPLES_PER_S, m.MEAN_SAMPLES_PER_S)}
    measured = TrialRecord(base.number, m.COMPLETE, "", base.params, figures)
    return measured, noise_floor([o[m.THROUGHPUT_CV] for o in found], ctx.config.search.windows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu-demo")
    ap.add_argument("--decisions", type=int, default=20)
    ap.add_argument("--busy-every", type=int, default=2, help="0: never busy")
    ap.add_argument("--switch-steps", type=int, default=SWITCH_STEPS,
                    help="unmeasured steps before each window, taken from its steps: a visit "
                         "stays the search's window and one step (what the race runs: "
                         "%(default)s)")
    ap.add_argument("--calibration-trials", type=int, default=8,
                    help="trials of the baseline the noise floor is measured from, as a search's "
                         "completed trials (default %(default)s; at least 2)")
    ap.add_argument("--quick", action="store_true", help="smoke, 3 decisions, never busy")
    add_results_option(ap)
    args = ap.parse_args(argv)
    if args.calibration_trials < 2:
        ap.error(f"--calibration-trials {args.calibration_trials}: a noise floor needs at least 2")
    if args.quick:
        args.preset, args.decisions, args.busy_every = "smoke", 3, 0
        args.calibration_trials = 2
    with recording(__spec__.name, argv, args.results, args.quick) as figures:
        race = decide_again_and_again(args)
        figures.update(preset=args.preset, delta=race.delta, steps=race.steps,
                       switch_steps=race.switch_steps, max_pairs=race.max_pairs, floor=race.floor,
                       baseline=race.base.record.value, false_keeps=summary(race),
                       decisions=[dict(zip(DECISION, r, strict=True)) for r in race.results])
        if race.ended:
            raise SystemExit(f"the race ended early: {race.ended}")
        if len(race.results) < args.decisions:
            raise SystemExit(f"only {len(race.results)} of {args.decisions} decisions were taken")


DECISION = ("busy", "decision", "pairs", "ratio", "low", "high")
"""A decision's figures, as ``Repeated.results`` holds them."""


def decide_again_and_again(args: argparse.Namespace) -> Repeated:
    """Calibrate the baseline, then race it against its twin ``args.decisions`` times."""
    config = load_config(None, args.preset, [])
    start_ray(config, verbose=False)
    use_gpu = resolve_gpu(config)
    space = space_of(config, search_context(config, use_gpu))
    base = TrialRecord(0, m.COMPLETE, "", space.baseline(), {})
    with tempfile.TemporaryDirectory(prefix="commtune-aa-") as tmp:
        ctx = TrialContext(config, space, use_gpu, storage_dir(Path(tmp)), resolve_task(config))
        base, floor = calibrate(ctx, base, args.calibration_trials)
        race = Repeated(ctx, base, args.decisions, args.busy_every, floor, args.switch_steps)
        print(f"A/A: {args.preset}, the baseline against its twin, {args.decisions} decisions "
              f"(δ {race.delta * 100:g}%, {race.steps} steps a window, at most {race.max_pairs} "
              f"pairs a decision, noise floor {floor:.1%} as a search would measure it, "
              f"baseline {base.value:.2f} samples/s in its search trial)", flush=True)  # fmt: skip
        race.run()
    return race


def summary(race: Repeated) -> int:
    """Print the decisions' tally, quiet and busy apart; returns the false keeps."""
    counts = Counter(r[1] for r in race.results)
    for busy in (False, True):
        part = [r for r in race.results if r[0] == busy]
        if part:
            tally = Counter(r[1] for r in part)
            print(f"{'busy' if busy else 'quiet'}: {len(part)} decisions: "
                  + ", ".join(f"{n} {d}" for d, n in sorted(tally.items())))
    keeps = counts.get(KEEP, 0)
    print(f"false keeps: {keeps} of {len(race.results)} decisions "
          f"({keeps / max(1, len(race.results)):.0%}) at δ {race.delta * 100:g}%")
    return keeps


if __name__ == "__main__":
    main()
