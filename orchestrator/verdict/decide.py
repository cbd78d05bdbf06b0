"""The verdict against the baseline: is a finalist faster by a gain worth having, decided
from measurements taken side by side with the baseline's?

A search compares trials measured minutes apart on a machine whose speed drifts; the final
claim compares each finalist with baseline measurements right beside it, paired one of two ways:

- **window** pairing (``orchestrator.verdict.paired``, ``search.race``): where the finalist differs
  from the baseline only in what a warm worker group can switch, both stay built in the same
  processes and alternate window by window until the paired ratio's interval decides;
- **group** pairing: where the switch needs new processes (NCCL variables), the runs are whole
  worker groups, B c1 B c2 B, as before: a measurement whose window cv is far above the
  sequence's typical cv, or whose figure is far from the other measurements of the same
  configuration (every baseline run repeats the baseline), is *disturbed*, measured again and
  left out; a finalist's ratio is the median of its paired ratios, its noise the finalist's
  window noise and the baseline's run-to-run spread from the median absolute deviation.

Either way the decision is one rule (``decide``) against the noise threshold δ
(``search.verdict_delta``): keep a finalist whose interval lies wholly above 1 + δ (the one with
the highest lower end), no gain worth having where every finalist's one-sided futility bound
(``paired.FUTILITY_CONFIDENCE``) lies below 1 + δ, and "too noisy to decide", with the figures,
where one is still undecided (its bound above 1 + δ, its interval reaching below it). The
search, the report and the doctor all read the verdict from remeasure.csv
(``verdict_from_rows``): one verdict.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from orchestrator.runfiles import BEST_YAML
from orchestrator.runfiles.remeasure import BASELINE, GROUP, WINDOW, Remeasured, Rows, read_rows
from orchestrator.verdict.paired import (
    FUTILITY_CONFIDENCE,
    MIN_PAIRS,
    PairedRatio,
    ratios_from_rows,
    recorded_fraction,
    recorded_positive,
    scaled_mad,
)

DELTA = 0.02
"""The default noise threshold δ: a gain under 2% is not worth a configuration change, and a
paired window ratio on these machines scatters by 1-3% (the A/A benchmark's figure), so a
threshold below that would need tens of pairs to decide anything."""
SIGNIFICANCE = 2.0
"""Group pairing: the interval's half width is this many spreads."""
FUTILITY_SPREADS = statistics.NormalDist().inv_cdf(FUTILITY_CONFIDENCE)
"""Group pairing: the futility bound is this many spreads above the ratio (one-sided)."""
KEEP, NO_GAIN, SLOWER, UNDECIDED = "keep", "no gain", "slower", "undecided"
PAIRINGS = {
    WINDOW: "paired windows in the same processes",
    GROUP: "paired runs in separate worker groups",
}
DISTURBED_CV_FACTOR = 2.0
"""A window cv this many times the sequence's median cv marks a disturbed measurement ..."""
DISTURBED_CV_FLOOR = 0.02
"""... provided it is above this (on a quiet GPU 0.4% against 0.2% is no disturbance)."""
OUTLIER_SPREADS = 3.0
"""A figure this many robust spreads from its configuration's median is disturbed too."""
OUTLIER_SPREAD_FLOOR = 0.01
"""The least relative spread the outlier test assumes (identical runs would make any
difference an outlier)."""
HELPS = (
    "more pairs (search.verdict_pairs), a quieter machine, fewer finalists "
    "(search.remeasure_top), or a larger noise threshold (search.verdict_delta)"
)
"""What helps a "too noisy" verdict in a new search ..."""
MEASURE_ON = "measuring on from these pairs (the same command with --resume)"
"""... and, first, where the undecided finalist raced in paired windows (``search.race``) and
the race was measured on fewer than ``MEASURE_ON_TIMES`` times."""
MEASURE_ON_TIMES = 2
"""Times a race may be measured on (``--resume``), each with its pair budget again: every pair
is one more look at the interval, so the looks are bounded: each resume keeps real gains more
often and twins of the baseline a little more often too (the record named race-focus-resumes
in benchmarks/results/)."""


def decide(low: float, high: float, delta: float, bound: float | None = None) -> str:
    """What an interval of the ratio to the baseline decides against the threshold ``delta``:
    ``keep`` wholly above 1 + δ, ``slower`` wholly below 1 - δ, ``no gain`` (worth having) when
    the one-sided futility bound ``bound`` (``paired.FUTILITY_CONFIDENCE``; the interval's
    upper end where none is given) is below 1 + δ, ``undecided`` otherwise."""
    if low > 1 + delta:
        return KEEP
    if high < 1 - delta:
        return SLOWER
    if (high if bound is None else bound) <= 1 + delta:
        return NO_GAIN
    return UNDECIDED


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
    """One finalist against the baseline measured beside it."""

    number: int
    ratio: float
    low: float
    high: float
    """The interval of the ratio."""
    pairs: int
    """Paired comparisons behind the ratio."""
    pairing: str
    """``window`` or ``group`` (``PAIRINGS``)."""
    samples_per_s: float
    baseline_samples_per_s: float
    delta: float = DELTA
    repeated: bool = False
    """Group pairing: a run was measured again because of disturbance."""
    disturbed: int = 0
    """Window pairing: pairs left out as disturbed (``paired.PairedRatio.disturbed``)."""
    bound: float | None = None
    """The one-sided futility bound (``paired.FUTILITY_CONFIDENCE``) that decides "no gain";
    None: the interval's upper end."""

    @property
    def decision(self) -> str:
        return decide(self.low, self.high, self.delta, self.bound)

    def evidence(self) -> str:
        """Ratio, interval and what it rests on, for the final line, best.yaml and the report."""
        again = ", some repeated after a disturbed run" if self.repeated else ""
        if self.disturbed:
            again = f", {self.disturbed} disturbed pair{'s' if self.disturbed > 1 else ''} left out"
        kind = "window pair" if self.pairing == WINDOW else "paired run"
        return (
            f"{self.ratio:.2f}x baseline (interval {self.low:.2f}-{self.high:.2f} from "
            f"{self.pairs} {kind}{'s' if self.pairs != 1 else ''}{again}, noise threshold "
            f"δ {self.delta * 100:g}%; {self.samples_per_s:.2f} vs "
            f"{self.baseline_samples_per_s:.2f} samples/s)"
        )

    def line(self) -> str:
        said = {
            KEEP: f"a gain above 1 + δ = {1 + self.delta:.2f}",
            NO_GAIN: f"no gain worth having ({self.bound_said()} below 1 + δ = "
            f"{1 + self.delta:.3f})",
            SLOWER: f"slower (below 1 - δ = {1 - self.delta:.2f})",
            UNDECIDED: f"undecided ({self.bound_said(undecided=True)} above 1 + δ = "
            f"{1 + self.delta:.3f}, its interval reaching below it)",
        }[self.decision]
        return f"trial {self.number} = {self.evidence()}: {said}"

    def bound_said(self, undecided: bool = False) -> str:
        """The bound "no gain" rests on, in words (three decimals: a bound of 1.0399 must not
        read as 1 + δ = 1.04 itself)."""
        if self.bound is None:
            return "its interval's upper end" if undecided else "the interval"
        return f"its {FUTILITY_CONFIDENCE:.0%} upper bound {self.bound:.3f}"


@dataclass(frozen=True)
class Verdict:
    """What the re-measurement decides, with the noise behind it."""

    comparisons: list[Comparison]
    """Highest lower end of the interval first."""
    baseline_spread: float
    """The noise the comparisons rest on (``spread_of``): the relative spread of the clean
    baseline runs (paired runs), or of a pair's ratio (paired windows; the median over
    finalists of their clean pairs' standard deviation)."""
    disturbed: list[str] = field(default_factory=list)
    """One line per disturbed measurement (left out of the verdict)."""
    delta: float = DELTA
    measured_on: int = 0
    """Times the race on record was measured on (remeasure.csv's ``race``, ``measured_on``)."""

    @property
    def chosen(self) -> Comparison | None:
        """The finalist to keep: the highest lower end, when it is above 1 + δ."""
        top = self.comparisons[0] if self.comparisons else None
        return top if top is not None and top.decision == KEEP else None

    @property
    def too_noisy(self) -> bool:
        """No winner, but some interval still reaches a gain worth having: the noise hides it."""
        return self.chosen is None and any(c.decision == UNDECIDED for c in self.comparisons)

    @property
    def can_measure_on(self) -> bool:
        """``--resume`` would race the undecided on: a window race, not yet measured on
        ``MEASURE_ON_TIMES`` times (``search.finalists.measure_on``)."""
        undecided = [c for c in self.comparisons if c.decision == UNDECIDED]
        return (
            bool(undecided)
            and undecided[0].pairing == WINDOW
            and self.measured_on < MEASURE_ON_TIMES
        )

    @property
    def pairing(self) -> str:
        """How the comparisons were paired, in words (both kinds where both ran)."""
        kinds = sorted({c.pairing for c in self.comparisons})
        return " and ".join(PAIRINGS[k] for k in kinds) or "nothing paired"

    @property
    def spread_of(self) -> str:
        """What ``baseline_spread`` spreads over: window pairs' ratios, or baseline runs."""
        if self.comparisons and all(c.pairing == WINDOW for c in self.comparisons):
            return "pair-to-pair"
        return "baseline run-to-run"

    def line(self) -> str:
        """The final line: the finalist actually chosen, or why the baseline stays."""
        noise = f"{self.pairing}; {self.spread_of} spread {self.baseline_spread:.1%}"
        if self.disturbed:
            noise += f", {len(self.disturbed)} disturbed measurement(s) left out"
        if self.chosen is not None:
            return f"keep trial {self.chosen.number}: {self.chosen.evidence()} ({noise})"
        if not self.comparisons:
            return f"no finalist could be compared with a clean baseline measurement ({noise})"
        top = self.comparisons[0]
        if self.too_noisy:  # named: the undecided one with the highest lower end
            top = next(c for c in self.comparisons if c.decision == UNDECIDED)
            return (
                f"too noisy to decide: trial {top.number} is {top.evidence()}, an interval that "
                f"reaches both sides of 1 + δ = {1 + self.delta:.2f} ({noise}); {BEST_YAML} "
                f"keeps the baseline; what helps: "
                f"{MEASURE_ON + ', ' if self.can_measure_on else ''}{HELPS}"
            )
        return (
            f"no gain worth having: the best finalist, trial {top.number}, is {top.evidence()}, "
            f"{top.bound_said()} below 1 + δ = {1 + self.delta:.3f} ({noise}); {BEST_YAML} "
            "keeps the baseline"
        )


def robust_spread(values: list[float]) -> float:
    """Relative spread that one outlier cannot blow up: scaled MAD over the median from three
    values on (two: their difference; fewer: 0)."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    if len(values) == 2:
        return abs(values[0] - values[1]) / math.sqrt(2) / med
    return scaled_mad(values) / med


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


def judge(runs: list[Run], windows: int = 1, delta: float = DELTA) -> Verdict:
    """Group pairing: every finalist with a clean measurement against its clean neighbouring
    baselines."""
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
        spread = ratio * math.sqrt(config_noise**2 / len(cvals) + base_spread**2 / len(bvals))
        half = SIGNIFICANCE * spread
        comps.append(
            Comparison(
                run.number, ratio, ratio - half, ratio + half, len(cvals) * len(bvals), GROUP,
                statistics.median(cvals), statistics.median(bvals), delta,
                repeated=any(runs[j].repeats for j in (i, *near)),
                bound=ratio + FUTILITY_SPREADS * spread,
            )
        )  # fmt: skip
    shown = [
        f"{'baseline' if r.is_baseline else f'trial {r.number}'} at position {i}"
        f"{f' (repeat {k})' if k else ''}: {w}"
        for i, (r, ws) in enumerate(zip(runs, why, strict=True))
        for k, w in enumerate(ws)
        if w
    ]
    return Verdict(_ranked(comps), base_spread, shown, delta)


def _ranked(comps: list[Comparison]) -> list[Comparison]:
    """Highest lower end first (the verdict keeps the first when it decides a gain)."""
    return sorted(comps, key=lambda c: -c.low)


def window_comparison(
    number: int, ratios: list[float], baseline: list[float], delta: float, floor: float = 0.0,
    reference: float = 0.0,
) -> Comparison:  # fmt: skip
    """Window pairing: a finalist's comparison from its pairs' ratios and baseline windows
    (``reference``: the baseline's search figure, which its slow windows are judged by)."""
    paired = PairedRatio(tuple(ratios), floor, tuple(baseline), reference)
    gone = set(paired.disturbed)
    kept = [b for k, b in enumerate(baseline) if k not in gone] or baseline
    base = math.exp(statistics.fmean(math.log(b) for b in kept))
    decides = paired.pairs >= MIN_PAIRS
    low, high = (paired.low, paired.high) if decides else (0.0, math.inf)
    return Comparison(number, paired.ratio, low, high, paired.pairs, WINDOW,
                      base * paired.ratio, base, delta, disturbed=len(gone),
                      bound=paired.bound if decides else math.inf)  # fmt: skip


def verdict_from_rows(rows: Rows, default_delta: float = DELTA) -> Verdict:
    """remeasure.csv's verdict: its window-paired finalists and its group-paired runs judged
    together, against the δ the file records (``default_delta`` where it records none)."""
    rows = read_rows(rows)
    delta = recorded_fraction((r.delta for r in rows), default_delta)
    group_rows = [r for r in rows if r.pairing in (None, GROUP)]
    runs, windows = runs_from_rows(group_rows) if group_rows else ([], 1)
    grouped = judge(runs, windows, delta) if runs else Verdict([], 0.0, [], delta)
    found, floor = ratios_from_rows(rows), recorded_fraction((r.floor for r in rows), 0.0)
    reference = recorded_positive(r.reference for r in rows)
    paired = [window_comparison(n, r, b, delta, floor, reference) for n, (r, b) in found.items()]
    if not paired:
        return grouped
    cleans = [PairedRatio(tuple(r), floor, tuple(b), reference).clean for r, b in found.values()]
    spreads = [statistics.stdev(math.log(r) for r in c) for c in cleans if len(c) >= 2]
    spread = grouped.baseline_spread if runs else statistics.median(spreads or [0.0])
    ranked = _ranked(grouped.comparisons + paired)
    return Verdict(ranked, spread, grouped.disturbed, delta, measured_on(rows))


def measured_on(rows: Rows) -> int:
    """Times the window race in remeasure.csv's ``rows`` was measured on: the highest ``race``
    of a pair's window (a measuring on that ended before a pair took no look; a blank or
    hand-edited value counts as 0). A file written before the column counts its worker groups
    after the first (``attempt``): a measuring on took one each, a hang took one too, so the
    count errs towards fewer looks, never more."""
    paired = [r for r in read_rows(rows) if r.pairing == WINDOW and r.pair is not None]
    column = "race" if any(r.race is not None for r in paired) else "attempt"
    return max((max(getattr(r, column) or 0, 0) for r in paired), default=0)


def runs_from_rows(rows: Rows) -> tuple[list[Run], int]:
    """remeasure.csv (one row per measurement: position, repeat) back into runs, and the
    number of windows per run (1 when the file does not say)."""
    rows = read_rows(rows)
    by_pos: dict[int, list[Remeasured]] = {}
    for row in rows:
        by_pos.setdefault(row.position or 0, []).append(row)
    # The first baseline run's placement: a measurement whose ranks sat otherwise does not compare.
    first_run = min(rows, key=lambda r: (r.position or 0, r.repeat or 0), default=Remeasured())
    placement = first_run.placement or ""
    runs = []
    for pos in sorted(by_pos):
        found = sorted(by_pos[pos], key=lambda r: r.repeat or 0)
        ms = [
            Measure(
                r.samples_per_s
                if r.state == "complete" and (r.placement or placement) == placement
                and (r.samples_per_s or 0) > 0
                else None,
                max(0.0, r.throughput_cv or 0.0),
            )
            for r in found
        ]
        first = found[0]
        runs.append(
            Run(first.trial or 0, first.role == BASELINE, ms[0].samples_per_s, ms[0].cv,
                tuple(ms[1:]))
        )  # fmt: skip
    windows = max((max(1, r.windows or 1) for r in rows), default=1)
    return runs, windows
