"""Where the race's pairs go when several finalists race: to the leader once each has three
(``Race._due``, the race's rule) or to every finalist still in, round after round (the rule it
replaced), side by side on simulated windows.

Each simulated race is the race's own code (``search.race.Race``: its rounds, its judging, its
stopping) with two finalists and windows drawn here instead of measured: a window's speed is
its configuration's true speed times a log-normal scatter, so that a pair's log ratio scatters
by the given spread. The verdict is read from the race's remeasure.csv rows by
``verdict.verdict_from_rows``, as a search reads it. What it prints per pair of true ratios:
how often the verdict kept a finalist, kept one whose true ratio is at or below 1 + δ (a wrong
keep), said "no gain worth having", or stayed "too noisy", and the pairs it took; and, as a
third rule, the leader's race measured on from its pairs when it ended "too noisy" (what
``--resume`` does on a finished search: the same budget again, ``--resumes`` times).

    python -m benchmarks.race_focus             # 1000 races per cell, a few minutes
    python -m benchmarks.race_focus --quick     # 40 per cell, one spread: seconds
    python -m benchmarks.race_focus --spread 0.07 --delta 0.04 --pairs 6

The spreads are a pair's log-ratio standard deviation on the 2-core machine: 4% on a calm day,
6-8% in the default runs' races (2026-12-04: 7.0% and 7.2% pair-to-pair).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
from types import SimpleNamespace

from orchestrator.runfiles.remeasure import as_text
from orchestrator.search.race import WINDOW_FIGURE, Entrant, Race
from orchestrator.search.results import TrialRecord
from orchestrator.verdict.decide import verdict_from_rows
from train_fns import metrics as m
from train_fns.plan import TrialPlan

TRUTHS = ((1.00, 1.00), (1.02, 1.02), (1.04, 1.04), (1.06, 1.06), (1.08, 1.04), (1.08, 1.08),
          (1.12, 1.12))  # fmt: skip
"""Two finalists' true ratios to the baseline: twins of it, both at a 2% δ, both at a 4% δ,
twin gains of 6% (the default run's race saw 1.04-1.09), one gain and one at 4%, twin gains
of 8% and 12%."""
PLAN = TrialPlan(model="bert-mini", task=None, seq_len=64, global_batch=32, world_size=2,
                 accumulation_steps=1, micro_batch=16)  # fmt: skip
"""Every entrant's plan (nothing is built: the windows are drawn)."""


class Simulated(Race):
    """The race, its windows drawn at the finalists' true speeds (the baseline's is 1)."""

    def __init__(
        self, truths: tuple[float, ...], spread: float, delta: float, pairs: int,
        rng: random.Random, record: list[dict[str, str]] | None = None,
    ) -> None:  # fmt: skip
        search = SimpleNamespace(verdict_delta=delta, verdict_pairs=pairs, measure_steps=3,
                                 windows=1)  # fmt: skip
        base = TrialRecord(0, m.COMPLETE, "", {}, {m.SAMPLES_PER_S: 1.0})
        finalists = [TrialRecord(k + 1, m.COMPLETE, "", {"k": k}, {}) for k in range(len(truths))]
        ctx = SimpleNamespace(config=SimpleNamespace(search=search))
        quiet = lambda line: None  # noqa: E731
        super().__init__(ctx, base, finalists, say=quiet, floor=spread)  # type: ignore[arg-type]
        self.speed = {0: 1.0, **{k + 1: t for k, t in enumerate(truths)}}
        self.window_spread, self.rng = spread / math.sqrt(2), rng
        self.record = record or []
        """remeasure.csv's rows of the races before (``--resume``), measured on from."""
        if self.record:
            self.carry(self.record)

    def _entrant(self, rec: TrialRecord, key: str) -> Entrant:
        return Entrant(rec, dataclasses.replace(PLAN, resident=key))

    def simulate(self) -> tuple[str, int]:
        """Race to the end; the verdict (keep, a wrong keep: of a finalist whose true ratio is
        at or below 1 + δ, no gain, too noisy) and the pairs it took."""
        for index, _plan in enumerate(self._schedule()):
            speed = self.speed[self.slots[index].who.record.number]
            value = speed * math.exp(self.rng.gauss(0.0, self.window_spread))
            self._take(index, {m.STATE: m.COMPLETE, WINDOW_FIGURE: value})
        verdict = verdict_from_rows(self.record + as_text(self.rows), self.delta)
        if verdict.chosen:
            wrong = self.speed[verdict.chosen.number] <= 1 + self.delta + 1e-9
            return ("wrong keep" if wrong else "keep"), self.spent()
        return ("too noisy" if verdict.too_noisy else "no gain"), self.spent()


class Split(Simulated):
    """The rule it replaced: every finalist still in gets a pair every round."""

    def _due(self) -> list[Entrant]:
        return self._alive()


def resumed(truths: tuple[float, ...], spread: float, delta: float, pairs: int,
            rng: random.Random, resumes: int) -> tuple[str, int]:  # fmt: skip
    """A race (the leader rule) that, ending "too noisy", is measured on from its pairs up to
    ``resumes`` times, a fresh budget each time (``--resume`` on a finished search): the final
    verdict and the pairs of all the races."""
    race = Simulated(truths, spread, delta, pairs, rng)
    said, spent = race.simulate()
    record = as_text(race.rows)
    for _ in range(resumes):
        if said != "too noisy":
            break
        race = Simulated(truths, spread, delta, pairs, rng, record)
        said, spent = race.simulate()
        record += as_text(race.rows)
    return said, spent


def tally(rule: type[Simulated] | int, truths: tuple[float, ...], spread: float, delta: float,
          pairs: int, races: int, seed: int) -> tuple[dict[str, float], float]:  # fmt: skip
    """The share of each verdict over ``races`` races, and the mean pairs taken (``rule``: a
    race's class, or how many times the leader rule's race may be measured on)."""
    rng, counts, took = random.Random(seed), {}, 0
    for _ in range(races):
        if isinstance(rule, int):
            said, spent = resumed(truths, spread, delta, pairs, rng, rule)
        else:
            said, spent = rule(truths, spread, delta, pairs, rng).simulate()
        counts[said] = counts.get(said, 0) + 1
        took += spent
    return {k: v / races for k, v in counts.items()}, took / races


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 races per cell, one spread")
    parser.add_argument("--spread", type=float, action="append",
                        help="a pair's log-ratio spread (repeatable; default 0.04, 0.06, 0.08)")
    parser.add_argument("--delta", type=float, default=0.04,
                        help="δ (4%%: the figures docs/measurement.md cites)")  # fmt: skip
    parser.add_argument("--pairs", type=int, default=6, help="pairs per finalist, shared")
    parser.add_argument("--races", type=int, default=1000)
    parser.add_argument("--resumes", type=int, default=1,
                        help="times a too noisy race is measured on (--resume); 0: never")
    args = parser.parse_args()
    races = 40 if args.quick else args.races
    spreads = args.spread or ([0.06] if args.quick else [0.04, 0.06, 0.08])
    print(f"race focus: {races} simulated races per cell, two finalists, δ {args.delta:.0%}, "
          f"{args.pairs} pairs per finalist shared ({2 * args.pairs} in all); pairs to the "
          "leader after three each (leader) or to every finalist every round (split)")  # fmt: skip
    print("spread | ratios | rule | keep | wrong keep | no gain | too noisy | mean pairs")
    for spread in spreads:
        for truths in TRUTHS:
            for rule in (Simulated, Split, *([args.resumes] if args.resumes else [])):
                seed = round(spread * 1e4) * 10**6 + round(truths[0] * 100) * 1000 + round(
                    truths[1] * 100)
                shares, took = tally(rule, truths, spread, args.delta, args.pairs, races, seed)
                name = {Simulated: "leader", Split: "split"}.get(rule) or f"leader, {rule} resume"
                print(f"{spread:.0%} | {truths[0]:.2f}, {truths[1]:.2f} | {name} | "
                      f"{shares.get('keep', 0):.0%} | {shares.get('wrong keep', 0):.0%} | "
                      f"{shares.get('no gain', 0):.0%} | "
                      f"{shares.get('too noisy', 0):.0%} | {took:.1f}")  # fmt: skip
    print(f"wrong keep: the kept finalist's true ratio is at or below 1 + δ = "
          f"{1 + args.delta:.2f} (a twin of the baseline, or one at the threshold)")


if __name__ == "__main__":
    main()
