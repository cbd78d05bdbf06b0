"""Paired windows: a finalist's ratio to the baseline from windows measured side by side.

Runs a minute apart drift more than the gains a search finds (the baseline's run-to-run
spread was 16% on a busy 2-core machine, its windows 2-7%). So the verdict alternates the
baseline and a finalist window by window in the same worker processes and judges the ratio of
each adjacent pair: drift that is slow next to a window cancels. The pairs' order alternates
(B c, then c B) so that a steady drift adds as much to one pair as it takes from the next.

A pair's ratio is treated as a sample: their geometric mean is the finalist's ratio, and the
interval is Student's t on the log ratios (exact for normal noise, whatever the noise's size:
nothing is assumed about the machine). The sequential rule that uses it (``decide`` in
``orchestrator.verdict.decide``) looks after every pair; the A/A benchmark
(``benchmarks/calibration/aa_verdict.py``) measures how often that claims a gain where there is
none.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.runfiles.remeasure import BASELINE, FINALIST, WINDOW, Rows, read_rows

MIN_PAIRS = 3
"""Pairs before any decision: two give a t quantile of 12.7 (an interval wider than any gain),
three of 4.3."""
CONFIDENCE = 0.95
"""Two-sided confidence of the interval (its t quantiles below)."""
FUTILITY_CONFIDENCE = 0.90
"""One-sided confidence of the bound that decides "no gain worth having" (``PairedRatio.bound``).
The two wrong answers cost differently: a false keep hands the user a configuration that is no
faster (it must be rare: a keep still needs the 95% interval's lower end above 1 + δ, and the
A/A benchmark counts false keeps), a false "no gain" keeps the baseline the user already runs
and misses a gain. Sequential designs stop for futility on a weaker bound for that reason.
Simulated races through this code decide "no gain" far more often where there is none than
the 95% interval's upper end did, and rarely where there is a real gain (the record named
futility in benchmarks/results/); false keeps cannot rise (a race that stops for futility keeps
nothing)."""
_T_TABLES = {
    0.975: (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201,
            2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086),
    0.90: (3.078, 1.886, 1.638, 1.533, 1.476, 1.440, 1.415, 1.397, 1.383, 1.372, 1.363, 1.356,
           1.350, 1.345, 1.341, 1.337, 1.333, 1.330, 1.328, 1.325),
}  # fmt: skip
"""Student's t quantiles (0.975: the interval's; 0.90: the futility bound's) for 1 to 20
degrees of freedom."""


def t_quantile(df: int, level: float = 0.975) -> float:
    """Student's t ``level`` quantile for ``df`` degrees of freedom (for 0.975 and 0.90 a table
    to 20, then, and for any other level at once, the normal quantile with its first
    Cornish-Fisher correction: within 0.1% from 20 on)."""
    if df < 1:
        raise ValueError(f"df={df}: a t quantile needs at least one degree of freedom")
    table = _T_TABLES.get(level, ())
    if df <= len(table):
        return table[df - 1]
    z = statistics.NormalDist().inv_cdf(level)
    return z + (z**3 + z) / (4 * df)


DISTURBED_SPREADS = 4.0
"""A pair whose log ratio is this many robust spreads from the pairs' median is disturbed: a
neighbour's burst hit one of its windows (30-50% off, where undisturbed pairs scatter by 2-4%)."""
SPREAD_FLOOR = 0.02
"""The least spread the disturbance test assumes: a few pairs that happen to agree closely must
not make an ordinary one an outlier."""
OUTLIER_PAIRS = 5
"""Pairs before any is called disturbed: the median absolute deviation of three or four is
one of the others' own scatter, and would cast out an ordinary pair."""
MAD_SCALE = 1.4826
"""MAD x this estimates the standard deviation of normal noise."""
SLOW_WINDOW = 0.7
"""A baseline window slower than this share of the baseline's search figure is disturbed, and
so is its pair. A neighbour's burst slows a window far more than drift moves one within a race,
so 70% tells the two apart. Ratios alone miss a neighbour that hits one side's windows pair
after pair: the outlier test then casts out the one odd pair and keeps the rest, all slowed on
the same side, and an A/A decision can "keep" the baseline's twin
(``benchmarks/calibration/aa_verdict.py`` beside a busy neighbour; the record named disturbed-pairs
in benchmarks/results/). Only the baseline's windows are judged so: a finalist's slow window stays
evidence against it (a configuration that stalls must not be kept for its fast windows), and the
reference is the search's figure, not the race's fastest window (one window fast by a glitch would
cast out every other)."""


def scaled_mad(values: list[float]) -> float:
    """The median absolute deviation from the median, times ``MAD_SCALE``: a spread in the
    values' own units that one outlier cannot blow up (the standard deviation, for normal
    noise). The disturbance test and the verdict's outlier test both read it."""
    middle = statistics.median(values)
    return MAD_SCALE * statistics.median(abs(v - middle) for v in values)


@dataclass(frozen=True)
class PairedRatio:
    """The ratios of a finalist's windows to their paired baseline windows, and what they say:
    disturbed pairs (``disturbed``) are left out of the ratio and its interval, as a disturbed
    run is out of a paired-run verdict; the race measures on until the rest decides."""

    ratios: tuple[float, ...]
    floor: float = 0.0
    """The noise the search measured (``noise_floor``), pooled into the interval's spread as
    ``FLOOR_WEIGHT`` degrees of freedom (``floored_spread``). Three or four pairs that happen
    to agree closely would otherwise give an interval far narrower than the machine's noise,
    and a false keep."""
    baseline: tuple[float, ...] = ()
    """The baseline's window (samples/s) of each pair, where known."""
    reference: float = 0.0
    """The baseline's search figure (samples/s; 0: unknown): a baseline window under
    ``SLOW_WINDOW`` of it marks its pair disturbed."""

    @property
    def disturbed(self) -> tuple[int, ...]:
        """Which pairs were disturbed: a baseline window far slower than the baseline's search
        figure (``SLOW_WINDOW``, at any count, where both are known), or a ratio far from the
        others (from ``OUTLIER_PAIRS`` pairs on: fewer give no robust spread; never nearer
        than ``DISTURBED_SPREADS`` times the noise floor)."""
        slow = set(self._slow())
        if len(self.ratios) < OUTLIER_PAIRS:
            return tuple(sorted(slow))
        logs = [math.log(r) for r in self.ratios]
        middle = statistics.median(logs)
        mad = scaled_mad(logs)
        limit = DISTURBED_SPREADS * max(mad, SPREAD_FLOOR, self.floor)
        return tuple(k for k, x in enumerate(logs) if abs(x - middle) > limit or k in slow)

    def _slow(self) -> tuple[int, ...]:
        """Pairs whose baseline window ran under ``SLOW_WINDOW`` of the baseline's search
        figure."""
        if not self.baseline or not self.reference > 0:
            return ()
        if len(self.baseline) != len(self.ratios):
            raise ValueError(f"{len(self.baseline)} baseline windows for {len(self.ratios)} "
                             "pairs: one per pair")  # fmt: skip
        limit = SLOW_WINDOW * self.reference
        return tuple(k for k, b in enumerate(self.baseline) if b < limit)

    @property
    def clean(self) -> tuple[float, ...]:
        gone = set(self.disturbed)
        return tuple(r for k, r in enumerate(self.ratios) if k not in gone)

    @property
    def pairs(self) -> int:
        """Pairs behind the ratio (the disturbed ones left out)."""
        return len(self.clean)

    @property
    def ratio(self) -> float:
        """Geometric mean of the clean pairs' ratios (1.0 before any pair)."""
        if not self.clean:
            return 1.0
        return math.exp(statistics.fmean(math.log(r) for r in self.clean))

    @property
    def half_width(self) -> float:
        """The interval's half width in log space; infinite below two clean pairs."""
        return self._width(0.975)

    def _width(self, level: float) -> float:
        """Student's t ``level`` quantile times the floored standard error, in log space."""
        clean = self.clean
        if len(clean) < 2:
            return math.inf
        logs = [math.log(r) for r in clean]
        spread = floored_spread(statistics.stdev(logs), len(clean), self.floor)
        return t_quantile(len(clean) - 1, level) * spread / math.sqrt(len(clean))

    @property
    def bound(self) -> float:
        """The one-sided ``FUTILITY_CONFIDENCE`` upper bound of the ratio: below 1 + δ, no gain
        worth having (``verdict.decide``)."""
        return self.ratio * math.exp(self._width(FUTILITY_CONFIDENCE))

    @property
    def low(self) -> float:
        return self.ratio * math.exp(-self.half_width)

    @property
    def high(self) -> float:
        return self.ratio * math.exp(self.half_width)


FLOOR_WEIGHT = 2
"""Degrees of freedom the search's measured noise (the floor) counts for beside the pairs'
own spread, from ``OUTLIER_PAIRS`` pairs on. Taken whole at any count, a search whose windows
happened to scatter would outvote any number of pairs that agree, and a real gain would stay
undecided (the record named floor-weight in benchmarks/results/). Below five pairs it is taken
whole: three or four lucky pairs are what it is there to hold back."""


def floored_spread(spread: float, pairs: int, floor: float) -> float:
    """The spread an interval uses, never below the pairs' own (``spread`` from ``pairs``
    pairs): below ``OUTLIER_PAIRS`` pairs at least the floor; from there on the floor pooled in
    as ``FLOOR_WEIGHT`` degrees of freedom."""
    if pairs < OUTLIER_PAIRS:
        return max(spread, floor)
    df = pairs - 1
    pooled = math.sqrt((FLOOR_WEIGHT * floor**2 + df * spread**2) / (FLOOR_WEIGHT + df))
    return max(spread, pooled)


CALIBRATED_WINDOWS = 3
"""Windows a trial of the searches had whose window cv set the race's figures: the noise floor
the A/A benchmark's false keeps were counted with, ``finalists.NOISE_MARGIN``, the presets' δ."""


def noise_floor(window_cvs: list[float], windows: int) -> float:
    """The least spread of a pair's log ratio: the median window cv the search measured (from
    ``windows`` windows a trial, as three would show it: ``comparable_cv``), times the square
    root of 2 (a ratio of two windows)."""
    cvs = sorted(cv for cv in window_cvs if math.isfinite(cv) and cv >= 0)
    return math.sqrt(2) * comparable_cv(statistics.median(cvs), windows) if cvs else 0.0


def median_cv(windows: int) -> float:
    """The median of the population cv (``summarize``'s) of ``windows`` draws of normal noise
    whose own cv is 1: sqrt(median(chi-square, windows - 1 df) / windows), the chi-square
    median by Wilson and Hilferty (within 1% of the exact ratio of two windows' to three's)."""
    df = windows - 1
    return math.sqrt(df * (1 - 2 / (9 * df)) ** 3 / windows)


def comparable_cv(cv: float, windows: int) -> float:
    """A trial's window cv from ``windows`` windows as ``CALIBRATED_WINDOWS`` would show it. The
    fewer the windows, the lower the cv in the median (two windows' is 0.70 of three's at the
    same noise), so a search of two windows a trial (the cpu-demo's) would otherwise lower the
    floor and the margin below what they were measured at. One window has no cv."""
    if windows < 2:
        return cv
    return cv * median_cv(CALIBRATED_WINDOWS) / median_cv(windows)


def pair_order(pair: int) -> tuple[str, str]:
    """Which of the two windows of pair ``pair`` (0, 1, ...) runs first: B c, then c B."""
    return (BASELINE, FINALIST) if pair % 2 == 0 else (FINALIST, BASELINE)


def recorded_positive(values: Iterable[float | None]) -> float:
    """The first positive finite value remeasure.csv records in a column (``r.reference for r
    in rows``: the baseline's search figure); 0.0 where no row holds one (an older file, or a
    hand-edited one)."""
    return next((v for v in values if v is not None and 0 < v < math.inf), 0.0)


def recorded_fraction(values: Iterable[float | None], default: float) -> float:
    """The first value in [0, 1) that remeasure.csv records in a column (``r.delta for r in
    rows``: δ, the noise floor); ``default`` where no row holds one (an older file, or a
    hand-edited one)."""
    return next((v for v in values if v is not None and 0 <= v < 1), default)


def ratios_from_rows(rows: Rows) -> dict[int, tuple[list[float], list[float]]]:
    """remeasure.csv's window-paired rows back into, per finalist (its trial number), the
    ratios of its complete pairs and the baseline windows of those pairs; a pair with a
    window that did not complete, or whose windows come from different worker groups (the
    ``attempt`` column), is left out."""
    windows: dict[tuple[int, int, int], dict[str, float]] = {}
    for row in read_rows(rows):
        if row.pairing != WINDOW or row.pair is None or row.against is None:
            continue  # a pair's two windows come from one worker group (its attempt)
        value = row.samples_per_s if row.state == "complete" else None
        if value is not None and value > 0:
            key = (row.against, row.pair, row.attempt or 0)
            windows.setdefault(key, {})[row.role or ""] = value
    out: dict[int, tuple[list[float], list[float]]] = {}
    for (number, _pair, _attempt), found in sorted(windows.items()):
        if BASELINE in found and FINALIST in found:
            ratio = found[FINALIST] / found[BASELINE]
            if 0 < ratio < math.inf:
                ratios, base = out.setdefault(number, ([], []))
                ratios.append(ratio)
                base.append(found[BASELINE])
    return out
