"""How often the verdict's sequential rule decides, and how often it decides wrongly, on pairs
drawn at a given noise: the race's "no gain" bound (``paired.FUTILITY_CONFIDENCE``, one-sided)
side by side with the 95% interval's upper end it replaced.

Each simulated race is one finalist: pair after pair, its log ratio to the baseline drawn from
a normal law around the true ratio with the given spread, judged after every pair from
``MIN_PAIRS`` on by the race's own code (``PairedRatio`` with the search's noise floor, then
``verdict.decide``), until it decides or ``pairs`` are spent ("undecided": too noisy). What it
prints per true ratio: how often it kept, said "no gain", stayed undecided, and the pairs it
took on average. A keep of a ratio at or below 1 + δ is a false keep; a "no gain" of a ratio
well above it is a missed gain.

    python -m benchmarks.futility               # 4000 races per cell, about a minute
    python -m benchmarks.futility --quick       # 200 per cell, seconds
    python -m benchmarks.futility --spread 0.05 --delta 0.04 --pairs 12

The spreads are a pair's log-ratio standard deviation measured on the 2-core machine: 4% on a
calm day (the A/A benchmark's pairs), 8% on a loaded one (2026-12-03: steps of one idle bert-mini
process scattered by 5%, of two gloo ranks by 8%, so windows of three steps paired by 7.8%).
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass

from orchestrator.verdict.decide import KEEP, NO_GAIN, SLOWER, UNDECIDED, decide
from orchestrator.verdict.paired import FUTILITY_CONFIDENCE, MIN_PAIRS, PairedRatio

RATIOS = (1.00, 1.02, 1.06, 1.10, 1.15)
"""True ratios to the baseline: none, below δ, just above a 4% δ, clear gains."""


@dataclass
class Tally:
    """What the races of one cell decided."""

    counts: dict[str, int]
    pairs: int = 0
    races: int = 0

    def share(self, decision: str) -> float:
        return self.counts.get(decision, 0) / max(1, self.races)


def race(true_ratio: float, spread: float, floor: float, delta: float, pairs: int,
         futility: bool, rng: random.Random) -> tuple[str, int]:  # fmt: skip
    """One simulated race of one finalist: its decision and the pairs it took."""
    ratios: list[float] = []
    for n in range(1, pairs + 1):
        ratios.append(math.exp(rng.gauss(math.log(true_ratio), spread)))
        if n < MIN_PAIRS:
            continue
        paired = PairedRatio(tuple(ratios), floor)
        decision = decide(paired.low, paired.high, delta, paired.bound if futility else None)
        if decision != UNDECIDED:
            return decision, n
    return UNDECIDED, pairs


def tally(true_ratio: float, spread: float, floor: float, delta: float, pairs: int,
          futility: bool, races: int, seed: int) -> Tally:  # fmt: skip
    rng, out = random.Random(seed), Tally({})
    for _ in range(races):
        decision, took = race(true_ratio, spread, floor, delta, pairs, futility, rng)
        out.counts[decision] = out.counts.get(decision, 0) + 1
        out.pairs += took
        out.races += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 races per cell")
    parser.add_argument(
        "--spread",
        type=float,
        action="append",
        help="a pair's log-ratio spread (repeatable; default 0.04 and 0.08)",
    )
    parser.add_argument("--delta", type=float, default=0.04,
                        help="δ (4%%: the figures docs/measurement.md cites)")  # fmt: skip
    parser.add_argument("--pairs", type=int, default=12, help="pairs before 'too noisy'")
    parser.add_argument("--races", type=int, default=4000)
    args = parser.parse_args()
    races = 200 if args.quick else args.races
    spreads = args.spread or [0.04, 0.08]
    bound = f"{FUTILITY_CONFIDENCE:.0%} one-sided bound"
    print(
        f"futility: {races} simulated races per cell, δ {args.delta:.0%}, at most {args.pairs} "
        f"pairs; 'no gain' on the {bound} (new) or the 95% interval's upper end (old)"
    )
    print("spread | ratio | rule | keep | no gain | slower | undecided | mean pairs")
    for spread in spreads:
        for ratio in RATIOS:
            for futility in (True, False):
                found = tally(ratio, spread, spread, args.delta, args.pairs, futility, races,
                              seed=round(spread * 1e4) * 1000 + round(ratio * 100))  # fmt: skip
                print(
                    f"{spread:.0%} | {ratio:.2f} | {'new' if futility else 'old'} | "
                    f"{found.share(KEEP):.0%} | {found.share(NO_GAIN):.0%} | "
                    f"{found.share(SLOWER):.0%} | "
                    f"{found.share(UNDECIDED):.0%} | {found.pairs / found.races:.1f}"
                )
    print(
        "false keep: 'keep' at a ratio at or below 1 + δ; missed gain: 'no gain' at 1.10 or above"
    )


if __name__ == "__main__":
    main()
