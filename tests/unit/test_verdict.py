"""The verdict on recorded re-measurement sequences: robust to one disturbed run, the winner by
the lower end of its interval, "too noisy" said as such; the bounded repeats of disturbed runs."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.runfiles.remeasure import write_remeasure
from orchestrator.search import finalists as fin
from orchestrator.search.results import TrialRecord
from orchestrator.verdict.decide import (
    Comparison,
    Measure,
    Run,
    Verdict,
    disturbances,
    judge,
    runs_from_rows,
    verdict_from_rows,
)
from orchestrator.verdict.paired import MAD_SCALE, scaled_mad
from train_fns import metrics as m

# A default run with a neighbour busy for its first minute, as its remeasure.csv held it:
# B 22.14 (13.2%) | t5 27.08 (3.4%) | B 23.01 (15.4%) | t1 21.57 (7.2%) | B 19.93 (10.5%) |
# t2 21.97 (4.2%) | B 12.88 (30.7%)
ISSUE_18 = [
    Run(0, True, 22.14, 0.132), Run(5, False, 27.08, 0.034), Run(0, True, 23.01, 0.154),
    Run(1, False, 21.57, 0.072), Run(0, True, 19.93, 0.105), Run(2, False, 21.97, 0.042),
    Run(0, True, 12.88, 0.307),
]  # fmt: skip


@pytest.mark.parametrize("windows", [1, 3, 10])
def test_issue_sequence_chooses_trial_5_or_says_too_noisy(windows: int) -> None:
    verdict = judge(ISSUE_18, windows)
    assert verdict.chosen is None or verdict.chosen.number == 5
    assert verdict.chosen is not None or verdict.too_noisy
    line = verdict.line()
    assert "1.34x" not in line and "trial 2" not in line
    assert "no gain worth having" not in line
    assert [c.number for c in verdict.comparisons][0] == 5
    (why,) = verdict.disturbed
    assert why.startswith("baseline at position 6: window cv 30.7%")
    t2 = next(c for c in verdict.comparisons if c.number == 2)
    assert t2.pairs == 1 and t2.ratio == pytest.approx(21.97 / 19.93)  # not against 12.88


def test_issue_sequence_with_three_windows_keeps_trial_5() -> None:
    verdict = judge(ISSUE_18, 3)
    assert verdict.chosen.number == 5 and verdict.chosen.low > 1 + verdict.delta
    assert verdict.line().startswith("keep trial 5: 1.20x baseline (interval 1.")
    assert "paired runs in separate worker groups" in verdict.line()


def test_too_noisy_says_so_with_the_numbers_and_what_helps() -> None:
    runs = [Run(0, True, 100.0, 0.10), Run(3, False, 112.0, 0.10), Run(0, True, 92.0, 0.10)]
    verdict = judge(runs)
    assert verdict.chosen is None and verdict.too_noisy
    line = verdict.line()
    assert line.startswith("too noisy to decide: trial 3 is 1.17x baseline (interval 0.")
    assert "baseline run-to-run spread" in line
    for knob in ("search.verdict_pairs", "search.verdict_delta", "search.remeasure_top"):
        assert knob in line


def test_no_gain_on_a_quiet_machine_is_no_gain_worth_having() -> None:
    runs = [Run(0, True, 100.0, 0.005), Run(3, False, 100.4, 0.005), Run(0, True, 100.2, 0.005)]
    verdict = judge(runs)
    assert not verdict.too_noisy and verdict.line().startswith("no gain worth having")
    assert "below 1 + δ = 1.020" in verdict.line()


def test_paired_runs_decide_no_gain_on_the_one_sided_bound() -> None:
    """Group pairing: the bound is 1.28 spreads above the ratio where the interval's upper end
    is 2: a ratio of 1.008 whose interval reaches 1.041 is no gain at δ 4% (bound 1.024)."""
    runs = [Run(0, True, 100.0, 0.02), Run(3, False, 100.8, 0.02), Run(0, True, 100.0, 0.02)]
    (comp,) = judge(runs, delta=0.04).comparisons
    spread = (comp.high - comp.ratio) / 2
    assert comp.bound == pytest.approx(comp.ratio + 1.2816 * spread, rel=1e-4)
    assert comp.high > 1.04 > comp.bound and comp.decision == "no gain"


def test_too_noisy_names_the_undecided_finalist_not_one_decided_no_gain() -> None:
    decided = Comparison(5, 1.02, 0.99, 1.05, 6, "window", 102.0, 100.0, 0.04, bound=1.035)
    undecided = Comparison(6, 1.02, 0.985, 1.055, 6, "window", 102.0, 100.0, 0.04, bound=1.045)
    verdict = Verdict([decided, undecided], 0.05, [], 0.04)
    assert decided.decision == "no gain" and undecided.decision == "undecided"
    assert verdict.line().startswith("too noisy to decide: trial 6 is")


def test_a_gain_inside_delta_is_not_kept_however_sure() -> None:
    """1.01x with a tight interval (1.005-1.015) is a gain, but not one worth a change at
    δ 2%; at δ 0.5% it is kept."""
    runs = [Run(0, True, 100.0, 0.001), Run(3, False, 101.0, 0.001), Run(0, True, 100.0, 0.001)]
    assert judge(runs).chosen is None and not judge(runs).too_noisy
    assert judge(runs, delta=0.005).chosen.number == 3


def test_winner_is_the_highest_lower_end_not_the_largest_ratio() -> None:
    runs = [
        Run(0, True, 100.0, 0.05), Run(1, False, 125.0, 0.09), Run(0, True, 100.0, 0.05),
        Run(2, False, 118.0, 0.01), Run(0, True, 100.0, 0.05),
    ]  # fmt: skip
    verdict = judge(runs)
    by_ratio = max(verdict.comparisons, key=lambda c: c.ratio)
    assert by_ratio.number == 1 and verdict.chosen.number == 2
    assert verdict.line().startswith("keep trial 2")


def test_one_outlier_cannot_blow_up_the_baseline_spread() -> None:
    runs = [Run(0, True, v, 0.01) for v in (100.0, 101.0, 99.0, 60.0)]
    why = disturbances(runs)
    assert [bool(w[0]) for w in why] == [False, False, False, True]
    assert "from the median" in why[3][0]
    assert judge(runs).baseline_spread < 0.02


def test_a_clean_repeat_replaces_the_disturbed_measurement() -> None:
    runs = [*ISSUE_18[:-1], Run(0, True, 12.88, 0.307, (Measure(22.5, 0.11),))]
    verdict = judge(runs, 3)
    t2 = next(c for c in verdict.comparisons if c.number == 2)
    assert t2.pairs == 2 and t2.repeated
    assert "some repeated after a disturbed run" in t2.evidence()


def test_paired_runs_repeat_disturbed_runs_a_bounded_number_of_times(tmp_path: Path) -> None:
    """Group pairing measures the issue's figures; the last baseline stays disturbed on its
    first repeat and is clean on the second; the rows keep every measurement."""
    figures = [(r.samples_per_s, r.cv) for r in ISSUE_18]
    script = [figures, [(13.5, 0.29)], [(22.4, 0.10)], [(99.0, 0.9)]]
    calls: list[list] = []

    def measure(ctx, plans, name, show, nodes):
        calls.append(plans)
        out = [{m.STATE: m.COMPLETE, m.SAMPLES_PER_S: v, m.THROUGHPUT_CV: cv}
               for v, cv in script[len(calls) - 1]]  # fmt: skip
        for i, res in enumerate(out):
            show(i, res)
        return out

    search = SimpleNamespace(windows=3, remeasure_repeats=2, verdict_delta=0.02)
    ctx = SimpleNamespace(config=SimpleNamespace(search=search))
    rec = {n: TrialRecord(n, m.COMPLETE, "", {"t": n}, {}) for n in (0, 5, 1, 2)}
    mp = pytest.MonkeyPatch()
    mp.setattr(fin, "derive_plan", lambda ctx, params: params)
    mp.setattr(fin, "measure_plans", measure)
    try:
        made = fin._group_rows(ctx, rec[0], [rec[5], rec[1], rec[2]], start=0)
    finally:
        mp.undo()
    assert len(calls) == 3 and calls[1] == [{"t": 0}] and calls[2] == [{"t": 0}]
    write_remeasure(tmp_path / "remeasure.csv", made)
    rows = list(csv.DictReader((tmp_path / "remeasure.csv").open()))
    assert [(r["position"], r["repeat"]) for r in rows][-3:] == [("6", "0"), ("6", "1"), ("6", "2")]
    assert [bool(r["disturbed"]) for r in rows[-3:]] == [True, True, False]
    assert {r["pairing"] for r in rows} == {"group"}
    runs, windows = runs_from_rows(rows)
    assert windows == 3 and runs[-1].repeats == (Measure(13.5, 0.29), Measure(22.4, 0.10))
    verdict = verdict_from_rows(rows)
    assert verdict == judge(runs, windows)
    assert verdict.chosen.number == 5


def test_best_yaml_names_the_chosen_finalist_with_its_interval(tmp_path: Path) -> None:
    from orchestrator.config.schema import Config
    from orchestrator.search.results import write_outputs
    from search_spaces import SearchContext, SearchSpace, load_spaces

    context = SearchContext("gloo", "ddp", False, world_size=2, num_nodes=1, global_batch=16)
    space = SearchSpace(load_spaces(["accumulation"]), context)
    points = [p for p in space.grid() if p != space.baseline()]
    speeds = {0: 22.0, 5: 25.0, 1: 24.0, 2: 30.0}  # the search alone would pick trial 2
    recs = [
        TrialRecord(n, m.COMPLETE, "", space.baseline() if n == 0 else points[k % len(points)],
                    {m.SAMPLES_PER_S: v})
        for k, (n, v) in enumerate(speeds.items())
    ]  # fmt: skip
    lines = write_outputs(recs, Config(), space, tmp_path, judge(ISSUE_18, 3))
    head = (tmp_path / "best.yaml").read_text().splitlines()[:2]
    assert head[0] == "# commtune best configuration: trial 5, 25.00 samples/s"
    assert head[1].startswith("# verdict, measured beside the baseline: keep trial 5: 1.20x")
    assert "from 2 paired runs" in head[1] and "δ 2%" in head[1]
    assert "keep trial 5" in lines[-1]
    # one figure per claim: the race's ratio for the kept trial, the search's 1.36x a ranking
    assert lines[0].startswith("kept: trial 5 at 1.20x baseline, measured beside it (the verdict")
    assert "rank the trials, they do not claim: its fastest, trial 2 at 30.00" in lines[0]
    lines = write_outputs(recs, Config(), space, tmp_path, judge(ISSUE_18, 1))
    head = (tmp_path / "best.yaml").read_text().splitlines()[:2]
    assert head[0].startswith("# commtune best configuration: trial 0,")  # too noisy: baseline
    assert "too noisy to decide" in head[1]
    assert lines[0].startswith("kept: the baseline, the race kept no finalist (the verdict")
    lines = write_outputs(recs, Config(), space, tmp_path)  # no race: a ranking, said so
    assert lines[0].startswith("best: trial 2 at 30.00 samples/s = 1.36x baseline")
    assert "no race measured it beside the baseline" in lines[0] and "kept" not in lines[0]


def test_a_run_placed_otherwise_than_the_baseline_is_not_compared() -> None:
    """remeasure.csv: the finalist's ranks sat 4+4 while the baseline's sat 8+0; its figure
    is the cluster's, not the knobs'."""
    rows = [
        {"position": str(i), "trial": str(n), "role": "baseline" if n == 0 else "finalist",
         "state": "complete", "samples_per_s": str(v), "throughput_cv": "0.01", "placement": p}
        for i, (n, v, p) in enumerate(
            [(0, 100.0, "node0:8"), (5, 150.0, "node0:4,node1:4"), (0, 100.0, "node0:8")]
        )
    ]  # fmt: skip
    runs, _ = runs_from_rows(rows)
    assert runs[1].samples_per_s is None and runs[0].samples_per_s == 100.0
    assert judge(runs, 3).chosen is None
    rows[1]["placement"] = "node0:8"
    assert runs_from_rows(rows)[0][1].samples_per_s == 150.0


def test_the_scaled_mad_ignores_one_outlier() -> None:
    """The spread both outlier tests read (the verdict's runs, the race's pairs): the median
    deviation from the median, scaled to a normal standard deviation."""
    assert scaled_mad([1.0, 2.0, 3.0, 4.0, 100.0]) == pytest.approx(MAD_SCALE)
    assert scaled_mad([5.0, 5.0, 5.0]) == 0.0


def test_the_trainer_benchmark_records_the_verdict_line_alone(tmp_path: Path) -> None:
    """benchmarks.trainer_export's record takes best.yaml's verdict line, not the header's
    other comment lines glued to it (the trial's figure, how it was measured)."""
    from benchmarks.trainer_export import verdict_line
    from orchestrator.config.schema import Config
    from orchestrator.search.results import write_outputs
    from search_spaces import SearchContext, SearchSpace, load_spaces

    context = SearchContext("gloo", "ddp", False, world_size=2, num_nodes=1, global_batch=16)
    space = SearchSpace(load_spaces(["accumulation"]), context)
    points = [p for p in space.grid() if p != space.baseline()]
    recs = [TrialRecord(n, m.COMPLETE, "", space.baseline() if n == 0 else points[n % 2],
                        {m.SAMPLES_PER_S: 22.0 + n}) for n in (0, 1, 2, 5)]  # fmt: skip
    write_outputs(recs, Config(), space, tmp_path, judge(ISSUE_18, 3))
    assert verdict_line(tmp_path) == judge(ISSUE_18, 3).line()
    (tmp_path / "best.yaml").write_text("strategy: ddp\n")
    assert verdict_line(tmp_path).startswith("no verdict recorded")
