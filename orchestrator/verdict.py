"""The verdict against the baseline: each finalist's ratio to the baseline runs beside it.

A search compares trials measured minutes apart on a machine whose speed drifts; the final
claim compares each finalist with the baseline runs measured right before and after it (B c1 B
c2 B ...), and says "no significant gain" when the difference is inside the noise. The search
(``search.finalists``) and the report (from remeasure.csv) both judge through here.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

SIGNIFICANCE = 2.0
"""A gain is claimed only when the ratio is this many spreads away from 1."""


@dataclass(frozen=True)
class Comparison:
    """One finalist against the baseline runs measured right beside it."""

    number: int
    ratio: float
    spread: float
    """Relative noise of the ratio: config window spread and baseline run-to-run spread."""
    samples_per_s: float
    baseline_samples_per_s: float

    @property
    def significant(self) -> bool:
        return abs(self.ratio - 1.0) > SIGNIFICANCE * self.spread

    def line(self) -> str:
        verdict = (
            ("significant gain" if self.ratio > 1 else "significantly slower")
            if self.significant
            else "no significant gain"
        )
        return (
            f"trial {self.number} = {self.ratio:.2f}x baseline (spread +/-{self.spread:.2f}; "
            f"{self.samples_per_s:.2f} vs {self.baseline_samples_per_s:.2f} samples/s): {verdict}"
        )


@dataclass(frozen=True)
class Run:
    """One run of the interleaved sequence, as measured (or not)."""

    number: int
    """The Optuna trial number of the configuration it ran."""
    is_baseline: bool
    samples_per_s: float | None
    """None: the run did not complete."""
    cv: float = 0.0
    """Window spread (coefficient of variation) of the run."""


def comparisons(runs: list[Run]) -> list[Comparison]:
    """Every completed finalist against its completed neighbouring baseline runs, best first."""
    baselines = [r.samples_per_s for r in runs if r.is_baseline and r.samples_per_s]
    comps = []
    for i, run in enumerate(runs):
        near = [
            runs[j].samples_per_s
            for j in (i - 1, i + 1)
            if 0 <= j < len(runs) and runs[j].is_baseline and runs[j].samples_per_s
        ]
        if run.is_baseline or not run.samples_per_s or not near:
            continue
        comps.append(compare(run.number, run.samples_per_s, run.cv, near, baselines))
    return sorted(comps, key=lambda c: -c.ratio)


def compare(
    number: int, config_tp: float, config_cv: float, neighbours: list[float], baselines: list[float]
) -> Comparison:
    """Ratio to the mean of the neighbouring baseline runs; spread adds the config's window
    spread and the baseline's run-to-run spread in quadrature."""
    base = statistics.fmean(neighbours)
    run_cv = statistics.pstdev(baselines) / statistics.fmean(baselines) if len(baselines) > 1 else 0
    spread = (config_cv**2 + run_cv**2) ** 0.5 * (config_tp / base)
    return Comparison(number, config_tp / base, spread, config_tp, base)
