"""The verdict against the baseline: each finalist's ratio to the baseline runs beside it.

A search compares trials measured minutes apart on a machine whose speed drifts; the final
claim compares each finalist with the baseline runs measured right before and after it (B c1 B
c2 B ...). One disturbed run (a neighbour process busy for a minute) must not decide it, so:

- a measurement whose window cv is far above the sequence's typical cv, or whose figure is far
  from the other measurements of the same configuration (every baseline run repeats the
  baseline), is *disturbed*: the search measures it again and the verdict leaves it out;
- a finalist's ratio is the median of its paired ratios (finalist / neighbouring baseline), its
  noise adds the finalist's window noise and the baseline's run-to-run spread taken from the
  median absolute deviation, which one outlier cannot blow up;
- the winner is the finalist whose interval has the highest lower end, and only when that end
  is above 1; when an interval reaches both 1 and a gain worth having, the machine was too noisy
  to decide, which is said with the numbers instead of "no significant gain".

The search (``search.finalists``), the report and the doctor (from remeasure.csv) all judge here.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from orchestrator.runfiles import BEST_YAML

SIGNIFICANCE = 2.0
"""A gain is claimed only when the ratio is this many spreads away from 1 (the interval's half
width)."""
MIN_GAIN = 0.05
"""A gain worth keeping: an interval that reaches 1 + MIN_GAIN and 1 leaves the question open."""
DISTURBED_CV_FACTOR = 2.0
"""A window cv this many times the sequence's median cv marks a disturbed measurement ..."""
DISTURBED_CV_FLOOR = 0.02
"""... provided it is above this (on a quiet GPU 0.4% against 0.2% is no disturbance)."""
OUTLIER_SPREADS = 3.0
"""A figure this many robust spreads from its configuration's median is disturbed too."""
OUTLIER_SPREAD_FLOOR = 0.01
"""The least relative spread the outlier test assumes (identical runs would make any
difference an outlier)."""
MAD_SCALE = 1.4826
"""MAD x this estimates the standard deviation of normal noise."""
HELPS = (
    "what helps: more windows per run (search.windows), a quieter machine, more repeats of "
    "disturbed runs (search.remeasure_repeats) or fewer finalists (search.remeasure_top)"
)


@dataclass(frozen=True)
class Measure:
    """One measurement of a run: the original or a repeat."""

    samples_per_s: float | None
    """None: it did not complete."""
    cv: float = 0.0
    """Window spread (coefficient of variation)."""


@dataclass(frozen=True)
class Run:
    """One run of the interleaved sequence, as measured (or not), with its repeats."""

    number: int
    """The Optuna trial number of the configuration it ran."""
    is_baseline: bool
    samples_per_s: float | None
    """None: the run did not complete."""
    cv: float = 0.0
    """Window spread (coefficient of variation) of the run."""
    repeats: tuple[Measure, ...] = ()
    """Measured again because an earlier measurement was disturbed."""

    @property
    def measures(self) -> list[Measure]:
        return [Measure(self.samples_per_s, self.cv), *self.repeats]


@dataclass(frozen=True)
class Comparison:
    """One finalist against the clean baseline measurements right beside it."""

    number: int
    ratio: float
    """Median of the paired ratios (finalist / neighbouring baseline)."""
    spread: float
    """One standard deviation of the ratio; the interval is +/- SIGNIFICANCE spreads."""
    pairs: int
    """Paired comparisons behind the ratio."""
    repeated: bool
    """The finalist or a neighbouring baseline was measured again because of disturbance."""
    samples_per_s: float
    baseline_samples_per_s: float

    @property
    def low(self) -> float:
        return self.ratio - SIGNIFICANCE * self.spread

    @property
    def high(self) -> float:
        return self.ratio + SIGNIFICANCE * self.spread

    @property
    def significant(self) -> bool:
        return self.low > 1.0 or self.high < 1.0

    def evidence(self) -> str:
        """Ratio, interval and what it rests on, for the final line, best.yaml and the report."""
        again = ", some repeated after a disturbed run" if self.repeated else ""
        return (
            f"{self.ratio:.2f}x baseline (interval {self.low:.2f}-{self.high:.2f} from "
            f"{self.pairs} paired comparison{'s' if self.pairs != 1 else ''}{again}; "
            f"{self.samples_per_s:.2f} vs {self.baseline_samples_per_s:.2f} samples/s)"
        )

    def line(self) -> str:
        verdict = (
            ("significant gain" if self.ratio > 1 else "significantly slower")
            if self.significant
            else "no significant gain"
        )
        return f"trial {self.number} = {self.evidence()}: {verdict}"


@dataclass(frozen=True)
class Verdict:
    """What the re-measurement decides, with the noise behind it."""

    comparisons: list[Comparison]
    """Highest lower end of the interval first."""
    baseline_spread: float
    """Relative run-to-run spread of the clean baseline measurements."""
    disturbed: list[str] = field(default_factory=list)
    """One line per disturbed measurement (left out of the verdict)."""

    @property
    def chosen(self) -> Comparison | None:
        """The finalist to keep: the highest lower end, when it is above 1."""
        top = self.comparisons[0] if self.comparisons else None
        return top if top is not None and top.low > 1.0 else None

    @property
    def too_noisy(self) -> bool:
        """No winner, but some interval reaches a gain worth having: the noise hides it."""
        return self.chosen is None and any(c.high > 1 + MIN_GAIN for c in self.comparisons)

    def line(self) -> str:
        """The final line: the finalist actually chosen, or why the baseline stays."""
        noise = f"baseline run-to-run spread {self.baseline_spread:.1%}"
        if self.disturbed:
            noise += f", {len(self.disturbed)} disturbed measurement(s) left out"
        if self.chosen is not None:
            return f"keep trial {self.chosen.number}: {self.chosen.evidence()} ({noise})"
        if not self.comparisons:
            return f"no finalist could be compared with a clean baseline run ({noise})"
        top = self.comparisons[0]
        if self.too_noisy:
            return (
                f"too noisy to decide: trial {top.number} is {top.evidence()}, an interval that "
                f"reaches below 1 ({noise}); {BEST_YAML} keeps the baseline; {HELPS}"
            )
        return (
            f"no significant gain: the best finalist, trial {top.number}, is {top.evidence()} "
            f"({noise}); {BEST_YAML} keeps the baseline"
        )


def robust_spread(values: list[float]) -> float:
    """Relative spread that one outlier cannot blow up: scaled MAD over the median from three
    values on (two: their difference; fewer: 0)."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    if len(values) == 2:
        return abs(values[0] - values[1]) / math.sqrt(2) / med
    return MAD_SCALE * statistics.median(abs(v - med) for v in values) / med


def disturbances(runs: list[Run]) -> list[list[str]]:
    """Why each measurement (runs x measures) is disturbed; "" when it is not."""
    cvs = [ms.cv for r in runs for ms in r.measures if ms.samples_per_s]
    typical = statistics.median(cvs) if cvs else 0.0
    limit = max(DISTURBED_CV_FACTOR * typical, DISTURBED_CV_FLOOR)
    groups: dict[object, list[float]] = {}
    for i, r in enumerate(runs):  # every baseline run repeats the baseline
        key = "baseline" if r.is_baseline else i
        groups.setdefault(key, []).extend(ms.samples_per_s for ms in r.measures if ms.samples_per_s)
    out = []
    for i, r in enumerate(runs):
        same = groups["baseline" if r.is_baseline else i]
        med = statistics.median(same) if same else 0.0
        spread = max(robust_spread(same), OUTLIER_SPREAD_FLOOR)
        why = []
        for ms in r.measures:
            if not ms.samples_per_s:
                why.append("")
            elif ms.cv > limit:
                why.append(
                    f"window cv {ms.cv:.1%} > {DISTURBED_CV_FACTOR:g}x the typical {typical:.1%}"
                )
            elif len(same) >= 3 and abs(ms.samples_per_s / med - 1) > OUTLIER_SPREADS * spread:
                why.append(
                    f"{ms.samples_per_s:.2f} samples/s is {abs(ms.samples_per_s / med - 1):.0%} "
                    f"from the median {med:.2f} of its configuration's runs (spread {spread:.1%})"
                )
            else:
                why.append("")
        out.append(why)
    return out


def judge(runs: list[Run], windows: int = 1) -> Verdict:
    """Every finalist with a clean measurement against its clean neighbouring baselines."""
    why = disturbances(runs)
    clean = [
        [ms for ms, w in zip(r.measures, ws, strict=True) if ms.samples_per_s and not w]
        for r, ws in zip(runs, why, strict=True)
    ]
    base = [ms for r, c in zip(runs, clean, strict=True) if r.is_baseline for ms in c]
    window_noise = statistics.median(ms.cv for ms in base) / math.sqrt(windows) if base else 0.0
    base_spread = max(robust_spread([ms.samples_per_s for ms in base]), window_noise)
    comps = []
    for i, run in enumerate(runs):
        near = [j for j in (i - 1, i + 1) if 0 <= j < len(runs) and runs[j].is_baseline]
        bvals = [ms.samples_per_s for j in near for ms in clean[j]]
        if run.is_baseline or not clean[i] or not bvals:
            continue
        cvals = [ms.samples_per_s for ms in clean[i]]
        ratio = statistics.median(c / b for c in cvals for b in bvals)
        config_noise = statistics.median(ms.cv for ms in clean[i]) / math.sqrt(windows)
        rel = math.sqrt(config_noise**2 / len(cvals) + base_spread**2 / len(bvals))
        repeated = any(runs[j].repeats for j in (i, *near))
        comps.append(
            Comparison(
                run.number, ratio, ratio * rel, len(cvals) * len(bvals), repeated,
                statistics.median(cvals), statistics.median(bvals),
            )
        )  # fmt: skip
    shown = [
        f"{'baseline' if r.is_baseline else f'trial {r.number}'} at position {i}"
        f"{f' (repeat {k})' if k else ''}: {w}"
        for i, (r, ws) in enumerate(zip(runs, why, strict=True))
        for k, w in enumerate(ws)
        if w
    ]
    return Verdict(sorted(comps, key=lambda c: -c.low), base_spread, shown)


def comparisons(runs: list[Run], windows: int = 1) -> list[Comparison]:
    """The finalists' comparisons, highest lower end first."""
    return judge(runs, windows).comparisons


def runs_from_rows(rows: list[dict[str, str]]) -> tuple[list[Run], int]:
    """remeasure.csv (one row per measurement: position, repeat) back into runs, and the
    number of windows per run (1 when the file does not say)."""

    def num(value: str | None) -> float | None:
        try:
            return float(value) if value not in (None, "") else None
        except ValueError:
            return None

    by_pos: dict[int, list[dict[str, str]]] = {}
    for row in rows:
        by_pos.setdefault(int(num(row.get("position")) or 0), []).append(row)
    runs = []
    # The first baseline run's placement: a measurement whose ranks sat otherwise does not compare.
    first_run = min(rows, key=lambda r: (num(r.get("position")) or 0, num(r.get("repeat")) or 0),
                    default={})  # fmt: skip
    placement = first_run.get("placement") or ""
    for pos in sorted(by_pos):
        found = sorted(by_pos[pos], key=lambda r: num(r.get("repeat")) or 0)
        ms = [
            Measure(
                num(r.get("samples_per_s"))
                if r.get("state") == "complete" and (r.get("placement") or placement) == placement
                else None,
                num(r.get("throughput_cv")) or 0.0,
            )
            for r in found
        ]
        first = found[0]
        runs.append(
            Run(
                int(num(first.get("trial")) or 0), first.get("role") == "baseline",
                ms[0].samples_per_s, ms[0].cv, tuple(ms[1:]),
            )
        )  # fmt: skip
    windows = max((int(num(r.get("windows")) or 1) for r in rows), default=1)
    return runs, windows
