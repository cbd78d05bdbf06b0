"""Paired windows: the interval of a paired ratio, the race's schedule and stopping rule, and
the verdict read back from remeasure.csv's window rows. Pure logic: the race is driven by hand
with the outcomes a worker group would send, no Ray."""

from __future__ import annotations

import math
import random
import statistics
from types import SimpleNamespace

import pytest

from orchestrator.runfiles.remeasure import as_text, write_remeasure
from orchestrator.search import race as race_mod
from orchestrator.search.results import TrialRecord
from orchestrator.verdict.decide import (
    KEEP,
    NO_GAIN,
    SLOWER,
    UNDECIDED,
    decide,
    measured_on,
    verdict_from_rows,
)
from orchestrator.verdict.paired import (
    MIN_PAIRS,
    PairedRatio,
    pair_order,
    ratios_from_rows,
    t_quantile,
)
from train_fns import metrics as m
from train_fns.plan import TrialPlan


def test_t_quantiles_from_the_table_and_beyond() -> None:
    assert t_quantile(1) == pytest.approx(12.706)
    assert t_quantile(2) == pytest.approx(4.303)
    assert t_quantile(30) == pytest.approx(2.042, abs=0.003)
    assert t_quantile(1000) == pytest.approx(1.962, abs=0.002)
    with pytest.raises(ValueError):
        t_quantile(0)
    assert t_quantile(2, 0.90) == pytest.approx(1.886)  # the futility bound's one-sided 90%
    assert t_quantile(1000, 0.90) == pytest.approx(1.2824, abs=0.002)


def test_a_paired_ratio_is_the_geometric_mean_with_a_t_interval() -> None:
    paired = PairedRatio((1.10, 1.08, 1.12))
    assert paired.ratio == pytest.approx((1.10 * 1.08 * 1.12) ** (1 / 3))
    logs = [math.log(r) for r in paired.ratios]
    sd = (sum((x - sum(logs) / 3) ** 2 for x in logs) / 2) ** 0.5
    assert paired.low == pytest.approx(paired.ratio * math.exp(-4.303 * sd / 3**0.5))
    assert paired.low < paired.ratio < paired.high
    assert PairedRatio((1.1,)).half_width == math.inf and PairedRatio(()).ratio == 1.0


def test_decisions_against_delta() -> None:
    assert decide(1.03, 1.10, 0.02) == KEEP
    assert decide(1.01, 1.10, 0.02) == UNDECIDED
    assert decide(0.99, 1.015, 0.02) == NO_GAIN
    assert decide(0.90, 0.97, 0.02) == SLOWER
    # "no gain" on the one-sided futility bound where there is one; a keep still on the interval
    assert decide(0.97, 1.05, 0.02, bound=1.018) == NO_GAIN
    assert decide(0.97, 1.05, 0.02, bound=1.03) == UNDECIDED
    assert decide(1.03, 1.10, 0.02, bound=1.01) == KEEP


def test_the_futility_bound_is_one_sided_ninety_percent_inside_the_interval() -> None:
    paired = PairedRatio((1.00, 1.04, 0.99, 1.01))
    logs = [math.log(r) for r in paired.ratios]
    mean = sum(logs) / 4
    sd = (sum((x - mean) ** 2 for x in logs) / 3) ** 0.5
    assert paired.bound == pytest.approx(paired.ratio * math.exp(1.638 * sd / 2))
    assert paired.ratio < paired.bound < paired.high
    # the 95% interval reaches above 1.04, the 90% bound does not: no gain at δ 4%
    assert paired.high > 1.04 > paired.bound
    assert decide(paired.low, paired.high, 0.04, paired.bound) == NO_GAIN
    assert PairedRatio((1.1,)).bound == math.inf


def test_pairs_alternate_their_order() -> None:
    assert [pair_order(k) for k in range(3)] == [
        ("baseline", "finalist"), ("finalist", "baseline"), ("baseline", "finalist"),
    ]  # fmt: skip


def _row(position: int, trial: int, role: str, value: float | str, pair: int | str,
         against: int | str, state: str = "complete") -> dict[str, str]:  # fmt: skip
    return {"position": str(position), "trial": str(trial), "role": role, "state": state,
            "samples_per_s": str(value), "pairing": "window", "pair": str(pair),
            "against": str(against), "delta": "0.02"}  # fmt: skip


def test_window_rows_read_back_into_a_verdict_that_says_how_it_paired() -> None:
    rows = [_row(0, 0, "baseline", 100.0, "", ""), _row(1, 7, "finalist", 108.0, "", 7)]
    figures = [(100.0, 110.0), (101.0, 110.5), (99.0, 109.0), (100.0, 111.0)]
    for k, (base, mine) in enumerate(figures):
        rows += [_row(2 + 2 * k, 0, "baseline", base, k, 7), _row(3 + 2 * k, 7, "finalist",
                 mine, k, 7)]  # fmt: skip
    rows.append(_row(10, 7, "finalist", "", 4, 7, state="oom"))  # half a pair: left out
    rows.append({**_row(11, 0, "baseline", "fast", 5, 7)})  # a hand-edited figure: not evidence
    found = ratios_from_rows(rows)
    assert list(found) == [7] and len(found[7][0]) == 4
    verdict = verdict_from_rows(rows)
    (comp,) = verdict.comparisons
    assert comp.pairing == "window" and comp.pairs == 4 and comp.decision == KEEP
    assert verdict.chosen is comp and comp.ratio == pytest.approx(1.1, abs=0.01)
    line = verdict.line()
    assert line.startswith("keep trial 7: 1.10x baseline (interval 1.0")
    assert "from 4 window pairs" in line and "δ 2%" in line
    assert "paired windows in the same processes" in line


def test_a_no_gain_verdict_names_the_bound_it_rests_on() -> None:
    rows = []
    for k, (base, mine) in enumerate([(100.0, 100.0), (100.0, 104.0), (100.0, 99.0),
                                      (100.0, 101.0)]):  # fmt: skip
        rows += [_row(2 * k, 0, "baseline", base, k, 7), _row(2 * k + 1, 7, "finalist", mine,
                 k, 7)]  # fmt: skip
    for row in rows:
        row["delta"] = "0.04"
    verdict = verdict_from_rows(rows)
    (comp,) = verdict.comparisons
    assert comp.high > 1.04 > comp.bound and comp.decision == NO_GAIN
    line = verdict.line()
    assert line.startswith("no gain worth having: the best finalist, trial 7")
    assert f"its 90% upper bound {comp.bound:.3f} below 1 + δ = 1.040" in line
    assert "its 90% upper bound" in comp.line()


SEEDS = range(8)
"""The draws a noisy race scenario is run with: what it claims holds whatever they are."""
SCATTERED = (1.10, 0.90, 1.00)
"""A finalist's windows 10% up, 10% down and level by turns: pairs too spread to decide in a
few. Not up and down by twos: that would line up with the pairs' alternating order (the
machine's drift moves every other pair the same way), and the lower of two levels would be
cast out as disturbed."""
LEAD_CHANGES = {5: (1.12, 1.02, 1.08, 0.75), 6: (1.14, 0.94, 1.03)}
"""Two finalists at the baseline's speed scaled so, pair by pair: after three pairs each,
trial 5 leads (the higher lower end); its fourth pair, 25% slow, hands the lead to trial 6,
whose spread keeps it undecided to the end of a twelve-pair budget."""


class _Driven:
    """A race whose worker group is this test: ``step`` answers each window it asks for.

    A window's figure is its configuration's speed, scattered by ``noise`` (normal draws from
    ``seed``); a finalist in ``turns`` has its paired windows scaled by those factors in turn
    (cycling), so that its pairs spread, or its lead changes, whatever the draws."""

    def __init__(self, finalists: dict[int, float], noise: float = 0.01, max_pairs: int = 10,
                 fail: tuple[int, int] | None = None, seed: int = 0,
                 turns: dict[int, tuple[float, ...]] | None = None) -> None:  # fmt: skip
        plan = TrialPlan(model="x", task=None, seq_len=8, global_batch=4, world_size=2,
                         accumulation_steps=1, micro_batch=2)  # fmt: skip
        search = SimpleNamespace(verdict_delta=0.02, verdict_pairs=max_pairs, measure_steps=9,
                                 windows=3, warmup_steps=3)  # fmt: skip
        ctx = SimpleNamespace(config=SimpleNamespace(search=search))
        mp = pytest.MonkeyPatch()
        mp.setattr(race_mod, "derive_plan", lambda ctx, params: (plan, {}))
        try:
            self.race = race_mod.Race(
                ctx, TrialRecord(0, m.COMPLETE, "", {}, {}),
                [TrialRecord(n, m.COMPLETE, "", {"n": n}, {}) for n in finalists],
                say=lambda line: None,
            )  # fmt: skip
        finally:
            mp.undo()
        self.speed = {0: 1.0, **finalists}
        self.rng, self.noise, self.fail = random.Random(seed), noise, fail
        self.turns, self.taken = turns or {}, dict.fromkeys(self.speed, 0)
        self.asked: list[tuple[str, int | None, int | None]] = []

    def figure(self, slot: race_mod.Slot, level: float) -> float:
        """The figure of ``slot``'s window on a machine at ``level`` samples/s."""
        number, scale = slot.who.record.number, 1.0
        if number in self.turns and slot.pair is not None:
            scale = self.turns[number][self.taken[number] % len(self.turns[number])]
            self.taken[number] += 1
        return level * self.speed[number] * scale * (1 + self.rng.gauss(0, self.noise))

    def run(self) -> None:
        drift = 100.0
        for index, plan in enumerate(self.race._schedule()):
            slot = self.race.slots[index]
            number = slot.who.record.number
            self.asked.append((plan.resident, slot.pair, plan.measure_steps))
            drift *= 1.02  # a machine getting faster by 2% a window: pairing cancels it
            value = self.figure(slot, drift)
            state = m.COMPLETE
            if self.fail == (number, slot.pair):
                state = m.OOM
            self.race._take(index, {m.STATE: state, race_mod.WINDOW_FIGURE: value, m.REASON: "x"})


@pytest.mark.parametrize("seed", SEEDS)
def test_a_clear_gain_is_kept_after_three_pairs_despite_drift(seed: int) -> None:
    """20% faster, windows scattered by 1%, the machine 2% faster each window: kept on its
    first judgement, the drift cancelled by the pairs' alternating order."""
    driven = _Driven({5: 1.20}, seed=seed)
    driven.run()
    (entrant,) = driven.race.entrants
    assert entrant.paired.pairs == 3 and entrant.out is None
    assert decide(entrant.paired.low, entrant.paired.high, 0.02) == KEEP
    residents = [who for who, pair, _ in driven.asked]
    assert residents[:2] == ["baseline", "trial5"]  # built and warmed up, the baseline first
    # then each a step again, after the last build emptied the allocator's cache
    assert residents[2:4] == ["baseline", "trial5"]
    assert [steps for _, pair, steps in driven.asked[2:4]] == [race_mod.REGROW_STEPS] * 2
    assert residents[4:] == ["baseline", "trial5", "trial5", "baseline", "baseline", "trial5"]
    # a window: the search's (9 steps in 3 windows) and the step after the switch, counted
    assert {steps for _, pair, steps in driven.asked if pair is not None} == {4}


def test_the_race_drops_the_slower_and_keeps_racing_the_undecided() -> None:
    driven = _Driven({5: 1.10, 6: 0.90, 7: 1.09}, noise=0.0)
    driven.run()
    by = {e.record.number: e for e in driven.race.entrants}
    assert by[6].out.startswith("slower") and by[6].paired.pairs == 3
    assert by[5].out is None and by[7].out is None  # both kept racing: neither below the other
    rows = driven.race.rows
    assert {r.pairing for r in rows} == {"window"} and len(rows) == 2 * 4 + 3 * 3 * 2


@pytest.mark.parametrize("seed", SEEDS)
def test_no_gain_ends_the_race_and_the_budget_ends_an_undecided_one(seed: int) -> None:
    flat = _Driven({5: 1.0}, noise=0.001, seed=seed)
    flat.run()
    assert flat.race.entrants[0].out.startswith("no gain")
    noisy = _Driven({5: 1.02}, max_pairs=5, seed=seed, turns={5: SCATTERED})
    noisy.run()
    (entrant,) = noisy.race.entrants
    assert entrant.paired.pairs == 5 and entrant.out is None


def test_a_finalist_decided_early_leaves_its_pairs_to_the_undecided() -> None:
    """Two finalists, six pairs each, twelve in all: trial 5 (the baseline's speed, steady) is
    "no gain" within its six, trial 6 (2% faster, its windows 8% up, down and level by turns)
    takes all the pairs left and no more. No draws: every figure is set."""
    driven = _Driven({5: 1.0, 6: 1.02}, noise=0.0, max_pairs=6, turns={6: (1.08, 0.92, 1.0)})
    driven.run()
    by = {e.record.number: e for e in driven.race.entrants}
    early = by[5].paired.pairs
    assert by[5].out.startswith("no gain") and early < 6
    assert by[6].out is None and by[6].paired.pairs == 12 - early > 6
    assert driven.race.spent() == driven.race.budget == 12


@pytest.mark.parametrize("seed", SEEDS)
def test_after_three_pairs_each_the_rounds_go_to_the_leader(seed: int) -> None:
    """Two finalists whose lead changes hands (``LEAD_CHANGES``): three pairs each, then one
    pair a round, for the finalist with the highest lower end at that round; each finalist's
    own pairs alternate B c, c B whichever rounds it had; neither decided, the race ends
    when its twelve pairs are spent."""
    driven = _Driven({5: 1.0, 6: 1.0}, noise=0.005, max_pairs=6, seed=seed, turns=LEAD_CHANGES)
    driven.run()
    race = driven.race
    by_round: dict[int, list[race_mod.Slot]] = {}
    for slot in race.slots:
        if slot.pair is not None:
            by_round.setdefault(slot.pair, []).append(slot)
    assert all({s.against.record.number for s in by_round[p]} == {5, 6} for p in range(3))
    later = [p for p in by_round if p >= 3]
    assert later and all(len({s.against.record.number for s in by_round[p]}) == 1 for p in later)
    assert [by_round[p][0].against.record.number for p in later] == [5, 6, 6, 6, 6, 6]
    assert race.spent() == race.budget == 12
    assert [race._decision(e) for e in race.entrants] == [UNDECIDED, UNDECIDED]
    assert all(e.out is None for e in race.entrants)
    for entrant in race.entrants:
        mine = [s for s in race.slots if s.against is entrant]
        firsts = [mine[k].who is race.base for k in range(0, len(mine), 2)]
        assert firsts == [k % 2 == 0 for k in range(len(firsts))]
    for p in later:  # the one due was the leader after the rounds before
        before = [s for s in race.slots if s.pair is not None and s.pair < p]
        lows = {}
        for entrant in race.entrants:
            keys = {s.pair for s in before if s.against is entrant}
            ratios = tuple(entrant.windows[k] / entrant.baseline[k] for k in sorted(keys))
            lows[entrant.record.number] = PairedRatio(ratios).low
        assert by_round[p][0].against.record.number == max(lows, key=lows.get)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_failed_baseline_window_ends_the_race_and_a_failed_finalist_leaves_it(
    seed: int,
) -> None:
    lost = _Driven({5: 1.20}, fail=(0, 1), seed=seed)
    lost.run()
    assert lost.race.ended.startswith("a baseline window did not complete")
    gone = _Driven({5: 1.20, 6: 1.30}, fail=(6, 0), seed=seed)
    gone.run()
    by = {e.record.number: e for e in gone.race.entrants}
    assert by[6].out.startswith("a window did not complete") and by[5].paired.pairs == 3


def _raced(
    hangs: set[tuple[int, int, int]], finalists: dict[int, float] | None = None,
    max_pairs: int = 10, carry: list[dict[str, str]] | None = None, noise: float = 0.01,
    seed: int = 0, turns: dict[int, tuple[float, ...]] | None = None,
) -> tuple[_Driven, list[list[str]]]:  # fmt: skip
    """A race through ``Race.run`` whose worker groups are this test: the window of (group,
    trial, pair) in ``hangs`` hangs, ending its group; the others complete at their speed
    (``noise``, ``seed``, ``turns``: as ``_Driven``'s). ``carry``: remeasure.csv rows it
    measures on from."""
    driven = _Driven(finalists or {5: 1.10, 6: 1.10}, noise, max_pairs, seed=seed, turns=turns)
    if carry is not None:
        driven.race.carry(carry)
    groups: list[list[str]] = []

    class Group:
        def __init__(self, *args: object, **kwargs: object) -> None:
            groups.append([])

        def run(self, source, take, label):  # noqa: ANN001, ANN202
            for index, (plan, _env) in enumerate(source):
                slot = driven.race.slots[index]
                groups[-1].append(plan.resident)
                key = (len(groups), slot.who.record.number, slot.pair)
                if key in hangs:
                    take(index, {m.STATE: m.HANG, m.REASON: "hang in phase measure"})
                    return [None]
                value = driven.figure(slot, 100.0)
                take(index, {m.STATE: m.COMPLETE, race_mod.WINDOW_FIGURE: value})
            return []

    mp = pytest.MonkeyPatch()
    mp.setattr(race_mod, "GroupRun", Group)
    mp.setattr(race_mod, "derive_plan", lambda ctx, params: (driven.race.base.plan, {}))
    try:
        driven.race.run()
    finally:
        mp.undo()
    return driven, groups


@pytest.mark.parametrize("seed", SEEDS)
def test_a_hang_ends_the_group_and_the_race_goes_on_in_a_fresh_one(seed: int) -> None:
    """The baseline's window of pair 2 hangs once: the group is ended, a fresh one builds and
    warms up both again, and the race carries on from pair 2 with the pairs so far kept. A
    finalist that hangs in both groups is out; the baseline hanging twice ends the race."""
    once, groups = _raced({(1, 0, 1)}, seed=seed)
    assert len(groups) == 2 and groups[1][:3] == ["baseline", "trial5", "trial6"]
    assert once.race.ended is None
    assert all(e.paired.pairs >= 3 and e.out is None for e in once.race.entrants)
    twice, _ = _raced({(1, 6, 0), (2, 6, 0)}, seed=seed)
    by = {e.record.number: e for e in twice.race.entrants}
    assert by[6].out.startswith("a window did not complete (hang") and by[5].paired.pairs >= 3
    lost, _ = _raced({(1, 0, 0), (2, 0, 0)}, seed=seed)
    assert lost.race.ended.startswith("a baseline window did not complete (hang")


@pytest.mark.parametrize("seed", SEEDS)
def test_a_group_ending_in_the_last_round_leaves_no_finalist_short(seed: int) -> None:
    """Three pairs each, six in all; trial 6's window of the last pair hangs after trial 5's
    pair is in: the fresh group measures trial 6's last pair (trial 5 owes none), not fewer."""
    driven, groups = _raced({(1, 6, 2)}, {5: 1.05, 6: 1.05}, max_pairs=3, seed=seed)
    assert len(groups) == 2 and driven.race.ended is None
    assert [e.paired.pairs for e in driven.race.entrants] == [3, 3]
    assert driven.race.spent() == driven.race.budget == 6


@pytest.mark.parametrize("seed", SEEDS)
def test_measuring_on_starts_from_the_pairs_on_record(seed: int) -> None:
    """A race that ended "too noisy" after its four pairs, measured on: the finalist starts
    with those four, the rounds, rows and worker groups are numbered on after them, its pairs
    keep alternating (the fifth is B c), four more pairs are allowed, and the rows of both read
    back into the interval the race decided on."""
    noisy = {"noise": 0.02, "seed": seed, "turns": {5: SCATTERED}}
    first, _ = _raced(set(), {5: 1.03}, max_pairs=4, **noisy)
    rows = as_text(first.race.rows)
    before = verdict_from_rows(rows)
    assert before.too_noisy and before.comparisons[0].pairs == 4
    on, groups = _raced(set(), {5: 1.03}, max_pairs=4, carry=rows, **noisy)
    race = on.race
    (entrant,) = race.entrants
    assert race.carried == 4 and race.budget == 8 and race.attempt == 1
    assert 4 < entrant.measured <= 8 and groups[0][:2] == ["baseline", "trial5"]
    first_round = [s for s in race.slots if s.pair is not None][:2]
    assert [s.pair for s in first_round] == [4, 4] and first_round[0].who is race.base
    assert [r.position for r in race.rows][0] == len(rows)
    after = verdict_from_rows(rows + as_text(race.rows))
    (comp,) = after.comparisons
    assert comp.pairs == entrant.paired.pairs and comp.low == pytest.approx(entrant.paired.low)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_finalist_the_pairs_on_record_decide_against_does_not_race_again(seed: int) -> None:
    first, _ = _raced(set(), {5: 1.02, 6: 0.80}, max_pairs=3, seed=seed, turns={5: SCATTERED})
    by = {e.record.number: e for e in first.race.entrants}
    assert by[6].out.startswith("slower") and by[5].out is None
    on = _Driven({5: 1.02, 6: 0.80}, max_pairs=3)
    on.race.carry(as_text(first.race.rows))
    by = {e.record.number: e for e in on.race.entrants}
    assert by[6].out.startswith("slower") and by[5].out is None and on.race.carried == 6
    assert [e.record.number for e in on.race._alive()] == [5]


class _Steady:
    """A worker group whose windows complete at fixed speeds (the baseline's 100), the k-th
    window 0.5% up or down by turns."""

    speeds = {0: 100.0, 5: 110.0}
    made = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        type(self).made += 1

    def run(self, source, take, label):  # noqa: ANN001, ANN202
        for index, (plan, _env) in enumerate(source):
            number = 0 if plan.resident == "baseline" else int(plan.resident[len("trial"):])
            value = self.speeds[number] * (1.005 if index % 2 else 0.995)
            take(index, {m.STATE: m.COMPLETE, race_mod.WINDOW_FIGURE: value})
        return []


def _measure_on(tmp_path, rows: list[dict[str, str]], delta: float = 0.02):  # noqa: ANN001, ANN202
    """``finalists.measure_on`` over ``rows`` as remeasure.csv, its groups ``_Steady``."""
    from orchestrator.search import finalists as fin

    write_remeasure(tmp_path / "remeasure.csv", rows)
    plan = TrialPlan(model="x", task=None, seq_len=8, global_batch=4, world_size=2,
                     accumulation_steps=1, micro_batch=2)  # fmt: skip
    search = SimpleNamespace(verdict_delta=delta, verdict_pairs=4, measure_steps=9, windows=3)
    ctx = SimpleNamespace(config=SimpleNamespace(search=search))
    base = TrialRecord(0, m.COMPLETE, "", {}, {m.SAMPLES_PER_S: 100.0})
    recs = [base, TrialRecord(5, m.COMPLETE, "", {"n": 5}, {m.SAMPLES_PER_S: 108.0})]
    _Steady.made = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(race_mod, "derive_plan", lambda ctx, params: (plan, {}))
        mp.setattr(race_mod, "GroupRun", _Steady)
        verdict = fin.measure_on(ctx, base, recs, tmp_path)  # type: ignore[arg-type]
    return verdict, fin.read_csv(tmp_path / "remeasure.csv")


@pytest.mark.parametrize("seed", SEEDS)
def test_a_resumed_search_measures_a_too_noisy_verdict_on(tmp_path, capsys, seed: int) -> None:  # noqa: ANN001
    """``--resume`` on a finished search: a decided verdict on record stands (no group runs);
    a "too noisy" one measures on from its pairs, remeasure.csv keeps them and gains the new
    ones; a δ configured otherwise than the one on record leaves it standing, said."""
    kept, _ = _raced(set(), {5: 1.10}, max_pairs=4, seed=seed)
    verdict, rows = _measure_on(tmp_path, as_text(kept.race.rows))
    assert verdict.chosen.number == 5 and _Steady.made == 0
    assert len(rows) == len(kept.race.rows)
    assert "the verdict on record stands (decided): keep trial 5" in capsys.readouterr().out
    noisy, _ = _raced(set(), {5: 1.03}, max_pairs=4, noise=0.02, seed=seed,
                      turns={5: SCATTERED})  # fmt: skip
    on_record = as_text(noisy.race.rows)
    verdict, rows = _measure_on(tmp_path, on_record, delta=0.03)
    said = capsys.readouterr().out
    assert "δ 2% on record, 3% configured: the verdict stays" in said
    assert "measuring trial(s) 5 on from their pairs" in said
    assert _Steady.made == 1 and len(rows) > len(on_record) and rows[: len(on_record)] == [
        {k: r.get(k, "") for k in rows[0]} for r in on_record
    ]  # fmt: skip
    assert {r["delta"] for r in rows} == {"0.02"}
    (comp,) = verdict.comparisons
    assert comp.pairs + comp.disturbed > 4  # the four on record and more (any cast out counted)
    assert comp.delta == 0.02 and verdict.delta == 0.02


@pytest.mark.parametrize("seed", SEEDS)
def test_measuring_on_after_the_lead_changed_pairs_no_new_window_with_an_old_one(
    seed: int,
) -> None:
    """The leader changed hands, so a finalist's rounds on record run past its pair count: the
    rounds measured on are numbered after the highest on record, in the next worker group
    (``carry`` alone, as the benchmark drives it, not through ``run``), and every pair reads
    back whole."""
    speeds, changes = {5: 1.0, 6: 1.0}, {"seed": seed, "turns": LEAD_CHANGES}
    first = _Driven(speeds, noise=0.005, max_pairs=6, **changes)
    first.run()
    rows = as_text(first.race.rows)
    last = max(int(r["pair"]) for r in rows if r["pair"] != "")
    assert last + 1 > max(e.measured for e in first.race.entrants), "a round was skipped"
    on = _Driven(speeds, noise=0.005, max_pairs=6, **changes)
    on.race.carry(rows)
    on.run()
    new = as_text(on.race.rows)
    assert min(int(r["pair"]) for r in new if r["pair"] != "") == last + 1
    assert {r["attempt"] for r in new} == {"1"}
    found = ratios_from_rows(rows + new)
    assert {n: len(r) for n, (r, _) in found.items()} == {
        e.record.number: e.measured for e in on.race.entrants
    }  # fmt: skip


def test_what_a_resume_leaves_alone_and_what_it_measures_on(tmp_path, capsys) -> None:  # noqa: ANN001
    """A race that ended before its first pair (only warm-ups on record) is measured on; a
    "too noisy" verdict whose undecided finalist ran in paired runs stands, its line not
    sending the user to --resume; so does a race measured on twice already."""
    built = [_row(0, 0, "baseline", 100.0, "", ""), _row(1, 5, "finalist", 108.0, "", "")]
    verdict, rows = _measure_on(tmp_path, built)
    assert _Steady.made == 1 and verdict.comparisons[0].pairs >= 3
    grouped = [{"position": str(k), "trial": str(n), "role": role, "state": "complete",
                "samples_per_s": str(v), "pairing": "group", "throughput_cv": "0.05",
                "windows": "3", "delta": "0.02"}
               for k, (n, role, v) in enumerate([(0, "baseline", 100), (5, "finalist", 104),
                                                 (0, "baseline", 100)])]  # fmt: skip
    verdict, _ = _measure_on(tmp_path, grouped)
    assert verdict.too_noisy and _Steady.made == 0 and "--resume" not in verdict.line()
    assert "ran in paired runs, which are not measured on" in capsys.readouterr().out
    once = [{**_row(2 * k + j, n, role, 100.0 * (1.03 + 0.09 * (-1) ** k) if j else 100.0, k,
                    5), "race": str(k // 4)}
            for k in range(2 * 4) for j, (n, role) in enumerate([(0, "baseline"),
                                                                 (5, "finalist")])]  # fmt: skip
    assert "--resume" in verdict_from_rows(once).line()  # measured on once: once more
    _Steady.speeds = {0: 100.0, 5: 103.0}
    try:  # the second measuring on, its pairs at 1.03x ± 0.5%: still undecided at its end
        verdict, rows = _measure_on(tmp_path, once)
    finally:
        _Steady.speeds = {0: 100.0, 5: 110.0}
    assert _Steady.made == 1 and {r["race"] for r in rows[len(once):]} == {"2"}
    assert verdict.too_noisy and verdict.measured_on == 2 and "--resume" not in verdict.line()
    verdict, _ = _measure_on(tmp_path, rows)
    assert verdict.too_noisy and _Steady.made == 0 and "--resume" not in verdict.line()
    assert "measured on 2 times already, the most a race is" in capsys.readouterr().out


def test_no_finalist_when_only_the_baseline_completed() -> None:
    from orchestrator.search.finalists import finalists

    base = TrialRecord(0, m.COMPLETE, "", {"a": 1}, {m.SAMPLES_PER_S: 10.0})
    failed = TrialRecord(1, m.OOM, "", {"a": 2}, {})
    assert finalists([base, failed], base, 3, margin=0.04) == []


def test_a_hand_edited_remeasure_csv_is_read_without_raising() -> None:
    rows = [_row(2 + k, n, role, value, k // 2, 7) for k, (n, role, value) in enumerate(
        [(0, "baseline", "1e300"), (7, "finalist", "1e-300"), (0, "baseline", "-5"),
         (7, "finalist", "nan"), (0, "baseline", "inf"), (7, "finalist", "3")])]  # fmt: skip
    rows += [{"position": "nan", "trial": "inf", "role": "baseline", "state": "complete",
              "samples_per_s": "-1", "windows": "-4", "throughput_cv": "nan"},
             {"position": "1", "trial": "3", "role": "finalist", "state": "complete",
              "samples_per_s": "1", "windows": "nan"}]  # fmt: skip
    verdict = verdict_from_rows(rows)
    assert verdict.chosen is None and verdict.line()
    for race in ("abc", "-1", "²", "①", "9" * 5000, " 1 ", ""):
        assert measured_on([{**r, "race": race} for r in rows]) == (1 if race == " 1 " else 0)


@pytest.mark.parametrize(("attrs", "reference"), [
    ({m.SAMPLES_PER_S: 100.0, m.MEAN_SAMPLES_PER_S: 92.0}, 92.0),
    ({m.SAMPLES_PER_S: 100.0}, 100.0),  # a study recorded before the mean figure
])  # fmt: skip
def test_slow_baseline_windows_are_judged_against_the_figure_they_are_taken_as(
    monkeypatch: pytest.MonkeyPatch, attrs: dict[str, float], reference: float
) -> None:
    """A race window is a mean step: the baseline's search figure it is judged against
    (``paired.SLOW_WINDOW``) is its mean-step figure too, where the study has one."""
    plan = TrialPlan(model="x", task=None, seq_len=8, global_batch=4, world_size=2,
                     accumulation_steps=1, micro_batch=2)  # fmt: skip
    search = SimpleNamespace(verdict_delta=0.02, verdict_pairs=4, measure_steps=9, windows=3)
    monkeypatch.setattr(race_mod, "derive_plan", lambda ctx, params: (plan, {}))
    ctx = SimpleNamespace(config=SimpleNamespace(search=search))
    finalist = TrialRecord(5, m.COMPLETE, "", {"n": 5}, {})
    race = race_mod.Race(ctx, TrialRecord(0, m.COMPLETE, "", {}, attrs), [finalist],
                         say=lambda _: None)  # fmt: skip
    race._schedule().__next__()
    race._take(0, {m.STATE: m.COMPLETE, race_mod.WINDOW_FIGURE: 90.0})
    assert race.entrants[0].reference == reference == float(as_text(race.rows)[0]["reference"])


def test_the_looks_counted_are_those_that_paired() -> None:
    """A measuring on counts once it paired a window: one whose time ran out in its warm-ups
    took no look. A file from before the race column counts its later worker groups instead
    (a hang's as well: never fewer looks than were taken)."""
    first = [{**_row(k, n, role, 100.0, 0, 5), "race": "0"}
             for k, (n, role) in enumerate([(0, "baseline"), (5, "finalist")])]  # fmt: skip
    warmed = [{**_row(2, 0, "baseline", 100.0, "", ""), "race": "1"}]
    assert measured_on(first + warmed) == 0
    assert measured_on(first + [{**r, "race": "1"} for r in first]) == 1
    legacy = [{k: v for k, v in r.items() if k != "race"} | {"attempt": "2"} for r in first]
    assert measured_on(legacy) == 2



def test_the_noise_floor_keeps_lucky_agreement_from_deciding() -> None:
    """Four pairs that happen to agree within 2% on a machine whose windows scatter by 8%
    (the search measured it): without the floor a false keep, with it undecided."""
    from orchestrator.verdict.paired import noise_floor

    lucky = (1.05, 1.07, 1.06, 1.08)
    assert decide(PairedRatio(lucky).low, PairedRatio(lucky).high, 0.02) == KEEP
    floor = noise_floor([0.08, 0.07, 0.09], 3)
    assert floor == pytest.approx(0.08 * 2**0.5)
    floored = PairedRatio(lucky, floor)
    assert decide(floored.low, floored.high, 0.02) == UNDECIDED
    assert noise_floor([], 3) == 0.0 and noise_floor([float("nan")], 3) == 0.0


@pytest.mark.parametrize("windows", [2, 4, 6])
def test_a_cv_from_fewer_or_more_windows_reads_as_three_would(windows: int) -> None:
    """Searches of 2, 4 or 6 windows a trial at the same noise (windows of cv 5%, normal)
    give, in the median over many trials, the floor a search of three windows gives, within
    3%: uncorrected, two windows' would be 30% lower (a floor too low lets lucky pairs keep)."""
    from orchestrator.verdict.paired import comparable_cv, noise_floor

    rng = random.Random(windows)

    def cvs(k: int) -> list[float]:
        out = []
        for _ in range(4000):
            xs = [rng.gauss(100.0, 5.0) for _ in range(k)]
            out.append(statistics.pstdev(xs) / statistics.fmean(xs))
        return out

    three = noise_floor(cvs(3), 3)
    assert noise_floor(cvs(windows), windows) == pytest.approx(three, rel=0.03)
    if windows == 2:
        assert statistics.median(cvs(2)) < 0.75 * statistics.median(cvs(3))
    assert comparable_cv(0.05, 3) == 0.05 and comparable_cv(0.0, 1) == 0.0


def _sequential(ratios: list[float], floor: float, delta: float) -> str:
    """The race's rule for one finalist: decide from the third pair on, at most six."""
    for n in range(3, min(6, len(ratios)) + 1):
        paired = PairedRatio(tuple(ratios[:n]), floor)
        decision = decide(paired.low, paired.high, delta)
        if decision != UNDECIDED:
            return decision
    return UNDECIDED


# Recorded decisions of the A/A benchmark (the baseline against itself, δ 4%, cpu-demo on 2
# cores; `python -m benchmarks.calibration.aa_verdict`): floor, then each decision's pairs. The
# last two of the second run had a busy neighbour.
_AA_RECORDED = (
    (0.034, [[0.935, 1.025, 1.081, 0.985, 1.014, 0.976], [1.006, 1.046, 0.898, 0.890, 0.984, 1.008],
             [0.920, 0.969, 1.061, 1.016, 0.923, 0.995], [0.966, 1.100, 1.000, 1.272, 1.031, 0.988],
             [0.969, 0.974, 1.028, 0.999, 0.941], [0.940, 0.991, 0.989, 1.022, 0.979],
             [0.972, 0.966, 0.964, 1.005], [1.003, 0.998, 0.944, 0.989],
             [0.999, 0.973, 1.021, 1.015, 1.066, 1.059], [1.058, 1.018, 1.046, 1.028, 1.020, 0.972],
             [0.943, 1.017, 0.968, 1.040, 1.028, 1.073], [0.984, 0.994, 1.031, 1.205, 1.014, 0.913],
             [1.008, 1.117, 1.076, 1.060, 1.016, 0.950], [0.891, 1.013, 1.033, 1.067, 0.911, 1.022],
             [1.049, 1.026, 0.964, 0.905, 1.020, 0.973], [0.997, 1.027, 0.987, 1.056, 0.962, 1.021],
             ]),
    (0.029, [[0.957, 0.952, 0.913], [0.976, 1.003, 1.173, 1.037, 0.997, 1.035],
             [1.006, 1.014, 0.955, 0.941], [1.586, 1.306, 2.007, 0.981, 0.462, 0.839],
             [0.924, 0.795, 3.273, 1.074, 1.845, 0.489]]),
)  # fmt: skip


# An A/A benchmark run at cf7a099 (cpu-demo, two windows a trial, δ 4%): each
# decision's pairs and its baseline windows (samples/s; the baseline's search figure 17.99).
# Decisions 3, 6, 9, 12, 15 and 18 had a busy neighbour. Its own floor was 10.6%.
_AA_TWO_WINDOWS = (
    ([0.930, 0.950, 0.960, 1.004, 0.981],
     [21.6, 22.0, 21.4, 21.6, 22.4]),
    ([1.018, 0.920, 0.927, 1.053, 1.056, 0.985],
     [21.5, 22.1, 22.0, 20.5, 21.0, 21.6]),
    ([0.384, 0.974, 1.281, 0.959, 0.750, 0.972],
     [22.3, 22.3, 7.8, 21.0, 10.6, 22.5]),
    ([0.993, 1.005, 0.964, 0.998, 1.009],
     [22.2, 22.4, 22.6, 22.3, 22.0]),
    ([0.958, 1.009, 1.004, 0.963, 1.000],
     [22.1, 22.3, 22.1, 22.4, 21.0]),
    ([0.911, 1.842, 0.257, 0.891, 0.492, 1.022],
     [21.3, 10.4, 12.3, 21.7, 21.1, 9.3]),
    ([0.956, 1.061, 1.103, 1.047, 0.884, 1.009],
     [21.8, 18.9, 20.0, 21.1, 20.1, 21.0]),
    ([1.012, 0.985, 1.018, 0.991, 0.988, 0.984],
     [21.2, 19.5, 21.3, 21.8, 21.7, 22.0]),
    ([0.752, 1.164, 0.405, 0.582, 1.564, 0.937],
     [7.5, 16.5, 20.7, 16.9, 12.1, 10.8]),
    ([1.033, 0.960, 1.016, 1.006, 1.024, 0.904],
     [21.2, 21.6, 21.3, 22.0, 20.9, 21.7]),
    ([1.004, 1.009, 0.971, 1.004, 1.005, 1.001],
     [22.1, 21.5, 22.0, 21.9, 21.5, 22.0]),
    ([1.031, 2.274, 0.967, 0.749, 1.282, 1.411],
     [21.2, 9.7, 10.4, 13.1, 10.1, 10.4]),
    ([1.157, 1.078, 1.001, 0.947, 0.921, 0.985],
     [18.8, 20.1, 20.8, 22.1, 22.0, 21.4]),
    ([0.962, 1.033, 0.979, 0.967, 0.955],
     [21.5, 21.3, 22.1, 21.6, 22.0]),
    ([1.056, 1.130, 1.343, 1.364, 0.532, 1.916],
     [9.7, 10.2, 11.8, 10.1, 18.6, 9.4]),
    ([1.021, 0.972, 1.047, 1.043, 1.012, 0.984],
     [20.3, 19.7, 20.3, 20.9, 19.7, 20.9]),
    ([0.946, 0.978, 0.973, 0.961, 0.995],
     [21.4, 21.6, 22.0, 22.2, 21.0]),
    ([1.064, 1.009, 0.521, 1.781, 1.125, 1.784],
     [8.1, 20.2, 17.5, 9.9, 11.3, 9.5]),
    ([1.001, 0.993, 0.987, 1.044, 0.917],
     [19.6, 21.2, 21.6, 19.9, 19.0]),
    ([0.828, 1.172, 1.100, 0.925, 0.953, 0.964],
     [19.8, 16.4, 17.8, 19.5, 21.1, 19.9]),
)  # fmt: skip


def _replayed(pairs: list[float], base: list[float], floor: float, delta: float) -> str:
    """The race's rule for one finalist with its baseline windows: judged from the third
    clean pair on, stopped at the first decision."""
    for n in range(MIN_PAIRS, len(pairs) + 1):
        paired = PairedRatio(tuple(pairs[:n]), floor, tuple(base[:n]), 17.99)
        if paired.pairs >= MIN_PAIRS:
            decision = decide(paired.low, paired.high, delta, paired.bound)
            if decision != UNDECIDED:
                return decision
    return UNDECIDED


@pytest.mark.parametrize("floor", [0.02, 0.03, 0.045, 0.067, 0.106])
def test_the_two_window_aa_keeps_nothing_whatever_the_floor(floor: float) -> None:
    """Its floor (two calibration trials) came out above a search's, so its 0 false keeps of
    20 could be the floor's doing: replayed at floors from 2% (five default searches' were
    2.2-8.9%) to its own, at δ 4% and 2%, nothing is kept; at its own floor the
    replay gives what it printed."""
    for delta in (0.04, 0.02):
        decisions = [_replayed(p, b, floor, delta) for p, b in _AA_TWO_WINDOWS]
        assert len(decisions) == 20 and KEEP not in decisions
    if floor == 0.106:
        assert [_replayed(p, b, floor, 0.04) for p, b in _AA_TWO_WINDOWS].count(NO_GAIN) == 10


def test_the_floor_weighs_as_two_pairs_and_never_narrows() -> None:
    """A recorded default run: six pairs within 3% of 1.08 on a day whose search windows
    scattered by 3.5% (floor 4.9%). Taken whole the floor left it undecided; pooled as two
    pairs' worth it keeps. Recorded A/A decisions keep nothing either way, and a floor below
    the pairs' own spread changes nothing."""
    race = [1.103, 1.104, 1.042, 1.114, 1.042, 1.095]
    assert _sequential(race, 0.049, 0.04) == KEEP
    whole = PairedRatio(tuple(race), 0.0)
    logs = [math.log(r) for r in race]
    own = (sum((x - sum(logs) / 6) ** 2 for x in logs) / 5) ** 0.5
    floored = PairedRatio(tuple(race), 0.049)
    assert whole.half_width < floored.half_width  # widened, but not to the whole floor's:
    whole_floor_low = whole.ratio * math.exp(-t_quantile(5) * max(own, 0.049) / 6**0.5)
    assert whole_floor_low < 1.04 < floored.low
    assert PairedRatio(tuple(race), 0.001).half_width == pytest.approx(whole.half_width)
    decisions = [_sequential(pairs, floor, 0.04) for floor, runs in _AA_RECORDED for pairs in runs]
    assert len(decisions) == 21 and KEEP not in decisions


def test_a_baseline_window_far_below_its_search_figure_disturbs_its_pair() -> None:
    """The A/A decision beside a busy neighbour that kept the baseline's twin at 2.0x: the
    neighbour slowed the twin's first window, then the baseline's four windows after it. By
    ratio alone the first pair is the outlier and the other four keep; judged against the
    baseline's search figure (20.5 samples/s) the four are disturbed, and nothing is left
    (pair 0 is cast out by its ratio). A finalist's own slow windows stay evidence against
    it; a race's ordinary drift (a recorded default run's windows 17% apart) and one
    glitch-fast window disturb nothing."""
    twin = [4.1, 20.6, 20.2, 20.3, 20.5]
    base = [20.8, 10.9, 8.1, 11.0, 10.7]
    ratios = tuple(t / b for t, b in zip(twin, base, strict=True))
    assert _sequential(list(ratios), 0.0, 0.04) == KEEP  # ratios alone (no baseline windows)
    by_speed = PairedRatio(ratios, 0.029, tuple(base), 20.5)
    assert by_speed.disturbed == (0, 1, 2, 3, 4) and by_speed.pairs == 0  # pair 0 by its ratio
    assert by_speed.half_width == math.inf
    assert PairedRatio(ratios, 0.029, tuple(base)).pairs >= 3  # no reference: ratios alone
    stalls = [21.2, 10.6, 21.2, 10.6, 21.2, 10.6, 21.2]  # the finalist stalls: slower
    steady_base = [20.0, 20.1, 19.9, 20.0, 20.2, 19.8, 20.0]
    stall_ratios = tuple(a / b for a, b in zip(stalls, steady_base, strict=True))
    stalled = PairedRatio(stall_ratios, 0.02, tuple(steady_base), 20.0)
    assert stalled.disturbed == PairedRatio(stall_ratios, 0.02).disturbed  # not by speed
    glitch = [30.0, 20.1, 19.9, 20.0, 20.2]
    fast = PairedRatio(tuple(22.0 / b for b in glitch), 0.02, tuple(glitch), 20.0)
    assert fast.disturbed in ((), (0,)) and fast.pairs >= 4  # at most the odd ratio
    drift_mine = [20.27, 21.57, 20.20, 20.70, 17.81, 19.48]
    drift_base = [18.38, 19.54, 19.38, 18.58, 17.10, 17.80]
    steady = PairedRatio(tuple(a / b for a, b in zip(drift_mine, drift_base, strict=True)),
                         0.049, tuple(drift_base), 16.80)  # fmt: skip
    assert steady.disturbed == () and decide(steady.low, steady.high, 0.04) == KEEP
    with pytest.raises(ValueError, match="one per pair"):
        _ = PairedRatio(ratios, 0.0, tuple(base[:2]), 20.5).disturbed
    rows = [{"pairing": "window", "pair": str(k), "against": "3", "attempt": "0",
             "state": "complete", "role": role, "samples_per_s": str(value), "delta": "0.04",
             "reference": "20.5"}
            for k, (t, b) in enumerate(zip(twin, base, strict=True))
            for role, value in (("finalist", t), ("baseline", b))]  # fmt: skip
    verdict = verdict_from_rows(rows)
    assert verdict.chosen is None and verdict.comparisons[0].disturbed == 5
    for row in rows:
        row["reference"] = "nan"  # hand-edited: no reference, ratios alone
    assert verdict_from_rows(rows).chosen is not None  # what the reference is there to stop


def test_below_five_pairs_the_floor_is_taken_whole() -> None:
    """Three pairs agreeing within 0.1% on a machine whose search measured 3%: the floor holds
    them back whole (pooled, they would keep at δ 2%)."""
    lucky = (1.080, 1.081, 1.079)
    held = PairedRatio(lucky, 0.03)
    assert decide(held.low, held.high, 0.02) == UNDECIDED
    assert held.half_width == pytest.approx(t_quantile(2) * 0.03 / 3**0.5)
