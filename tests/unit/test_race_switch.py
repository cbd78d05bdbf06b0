"""The race takes its unmeasured switch steps as a parameter (the A/A benchmark tries other
counts with it): each paired window then runs them before its measured steps, and is that much
shorter, so a visit costs the same steps; the default is the module's ``SWITCH_STEPS``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.search import race as race_mod
from orchestrator.search.results import TrialRecord
from train_fns import metrics as m
from train_fns.plan import TrialPlan


def _race(monkeypatch: pytest.MonkeyPatch, **switch: int) -> race_mod.Race:
    """A one-finalist race on a stand-in context."""
    plan = TrialPlan(model="x", task=None, seq_len=8, global_batch=4, world_size=2,
                     accumulation_steps=1, micro_batch=2)  # fmt: skip
    search = SimpleNamespace(verdict_delta=0.02, verdict_pairs=3, measure_steps=9, windows=3)
    monkeypatch.setattr(race_mod, "derive_plan", lambda ctx, params: (plan, {}))
    ctx = SimpleNamespace(config=SimpleNamespace(search=search))
    return race_mod.Race(ctx, TrialRecord(0, m.COMPLETE, "", {}, {}),
                         [TrialRecord(5, m.COMPLETE, "", {"n": 5}, {})], say=lambda _: None,
                         **switch)  # fmt: skip


def _windows(monkeypatch: pytest.MonkeyPatch, **switch: int) -> set[tuple[int, int]]:
    """(warm-up, measured) steps of every paired window a one-finalist race asks for."""
    race = _race(monkeypatch, **switch)
    asked = set()
    for index, window in enumerate(race._schedule()):
        if race.slots[index].pair is not None:
            asked.add((window.warmup_steps, window.measure_steps))
        race._take(index, {m.STATE: m.COMPLETE, race_mod.WINDOW_FIGURE: 100.0 + index % 2})
    return asked


def test_the_race_counts_its_paired_windows_measured_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The measured share of search time counts the race's paired windows, not its warm-ups
    (built, then warm again after the last build: four windows that pair with nothing)."""
    race = _race(monkeypatch)
    paired = 0
    for index, _ in enumerate(race._schedule()):
        paired += race.slots[index].pair is not None
        race._take(index, {m.STATE: m.COMPLETE, race_mod.WINDOW_FIGURE: 100.0 + index % 2,
                           "timings": {"measured_s": 1.5}})  # fmt: skip
    assert len(race.slots) - paired == 4 and paired >= 4
    assert race.measured_s == pytest.approx(1.5 * paired)


def test_switch_steps_are_a_parameter_of_the_race(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _windows(monkeypatch) == {(race_mod.SWITCH_STEPS, 4 - race_mod.SWITCH_STEPS)}
    assert _windows(monkeypatch, switch_steps=1) == {(1, 3)}
    assert _windows(monkeypatch, switch_steps=2) == {(2, 2)}
