"""Re-measure the best configurations interleaved with the baseline (B c1 B c2 B ...).

A search compares trials measured minutes apart on a machine whose speed drifts;
the final claim compares each finalist with the baseline runs right beside it,
and says "no significant gain" when the difference is inside the noise.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from orchestrator.results import TrialRecord
from orchestrator.trial import TrialContext, derive_plan, measure_plans
from train_fns import metrics as m

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


def interleave(baseline: TrialRecord, finalists: list[TrialRecord]) -> list[TrialRecord]:
    """B c1 B c2 ... B: every finalist sits between two baseline runs."""
    order = [baseline]
    for rec in finalists:
        order += [rec, baseline]
    return order


def compare(
    number: int, config_tp: float, config_cv: float, neighbours: list[float], baselines: list[float]
) -> Comparison:
    """Ratio to the mean of the neighbouring baseline runs; spread adds the config's window
    spread and the baseline's run-to-run spread in quadrature."""
    base = statistics.fmean(neighbours)
    run_cv = statistics.pstdev(baselines) / statistics.fmean(baselines) if len(baselines) > 1 else 0
    spread = (config_cv**2 + run_cv**2) ** 0.5 * (config_tp / base)
    return Comparison(number, config_tp / base, spread, config_tp, base)


def finalists(recs: list[TrialRecord], baseline: TrialRecord, top: int) -> list[TrialRecord]:
    """The ``top`` fastest completed configs other than the baseline, one per config."""
    seen, out = [baseline.params], []
    for rec in sorted((r for r in recs if r.value is not None), key=lambda r: -r.value):
        if rec.params not in seen and len(out) < top:
            seen.append(rec.params)
            out.append(rec)
    return out


def remeasure(
    ctx: TrialContext, baseline: TrialRecord, chosen: list[TrialRecord], out: Path
) -> list[Comparison]:
    """Run the interleaved sequence for real (runs with the same environment variables share a
    worker group, as in the search); returns comparisons, best first."""
    order = interleave(baseline, chosen)

    def show(i: int, outcome: dict) -> None:
        shown = (
            f"{outcome[m.SAMPLES_PER_S]:.2f} samples/s (cv {outcome[m.THROUGHPUT_CV]:.1%})"
            if outcome[m.STATE] == m.COMPLETE
            else f"{outcome[m.STATE]}: {outcome[m.REASON]}"
        )
        who = "baseline" if order[i] is baseline else f"trial {order[i].number}"
        print(f"re-measure {i + 1}/{len(order)}: {who}: {shown}", flush=True)

    plans = [derive_plan(ctx, rec.params) for rec in order]
    results = measure_plans(ctx, plans, "remeasure", show)
    _write_csv(order, results, baseline, out / "remeasure.csv")
    return _comparisons(order, results, baseline)


def _comparisons(order: list[TrialRecord], results: list[dict], baseline: TrialRecord):
    ok = [r.get(m.STATE) == m.COMPLETE for r in results]
    baselines = [
        r[m.SAMPLES_PER_S]
        for r, rec, good in zip(results, order, ok, strict=True)
        if good and rec is baseline
    ]
    comps = []
    for i in range(1, len(order), 2):
        neighbours = [results[j][m.SAMPLES_PER_S] for j in (i - 1, i + 1) if ok[j]]
        if ok[i] and neighbours:
            res = results[i]
            comps.append(
                compare(
                    order[i].number,
                    res[m.SAMPLES_PER_S],
                    res[m.THROUGHPUT_CV],
                    neighbours,
                    baselines,
                )
            )
    return sorted(comps, key=lambda c: -c.ratio)


def _write_csv(
    order: list[TrialRecord], results: list[dict], baseline: TrialRecord, path: Path
) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["position", "trial", "role", "state", "samples_per_s", "throughput_cv"])
        for i, (rec, res) in enumerate(zip(order, results, strict=True)):
            w.writerow(
                [
                    i,
                    rec.number,
                    "baseline" if rec is baseline else "finalist",
                    res.get(m.STATE),
                    res.get(m.SAMPLES_PER_S) or "",
                    res.get(m.THROUGHPUT_CV) or "",
                ]
            )
