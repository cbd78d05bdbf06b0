"""Tuning while training, without Ray: rank 0 asks a real judge after every window, every rank
switches the split at the same step, and the run's trajectory is the untuned run's."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from _spawn import run_distributed
from _tiny import CPU, tiny_plan

from orchestrator.train.tune import Judge, TuneSettings
from train_fns import metrics as m
from train_fns.restart import RunSpec
from train_fns.trainer import ElasticTrainer

STEPS = 24
SETTINGS = TuneSettings(window_steps=1, budget_steps=STEPS, delta=0.02, max_pairs=3,
                        max_accumulation=8)  # fmt: skip


def spec(tune_window: int) -> dict:
    plan = tiny_plan(warmup_steps=0, measure_steps=STEPS, num_windows=1, max_grad_norm=1.0)
    return RunSpec(
        plan=plan.to_dict(), steps=STEPS, checkpoint_every=STEPS, max_micro_batch=plan.micro_batch,
        reference_every=STEPS, grad_norm_every=STEPS, tune_window=tune_window,
    ).to_dict()  # fmt: skip


def _train(rank: int, world: int, spec_dict: dict) -> tuple[list[dict], dict | None]:
    reports: list[dict] = []
    judge = Judge(SETTINGS, set(), {}, None) if rank == 0 else None

    def report(batch: dict, directory: Path | None) -> None:
        reports.extend(batch[m.ROWS])

    ElasticTrainer(RunSpec(**spec_dict), rank, world, CPU, report, None, judge=judge).run()
    return reports, None if judge is None else judge.summary()


def test_tuning_switches_every_rank_alike_and_keeps_the_trajectory() -> None:
    tuned = run_distributed(_train, spec(1))
    plain = run_distributed(_train, spec(0))[0][0]
    (rows, summary), (other, _) = tuned
    splits = [(r[m.ACCUMULATION_STEPS], r[m.MICRO_BATCH]) for r in rows]
    assert splits == [(r[m.ACCUMULATION_STEPS], r[m.MICRO_BATCH]) for r in other]
    assert {1, 2, 4} <= {a for a, _ in splits}  # both candidates trained windows
    assert {r[m.GLOBAL_BATCH] for r in rows} == {8}
    for tuned_row, plain_row in zip(rows, plain, strict=True):
        assert tuned_row[m.LOSS] == pytest.approx(plain_row[m.LOSS], rel=1e-4), tuned_row[m.STEP]
    kinds = [e["kind"] for r in rows for e in r.get(m.EVENTS, [])]
    assert kinds[:2] == ["start", "tune_start"] and "tune_done" in kinds
    done = next(e for r in rows for e in r.get(m.EVENTS, []) if e["kind"] == "tune_done")
    after = {a for (a, _), r in zip(splits, rows, strict=True) if r[m.STEP] > done["step"]}
    assert after == {done["running"]}  # decided: the rest of the run trains with it
    assert len(summary["sizes"]["2"]["decisions"]) == 2
    theirs = {e["kind"] for r in other for e in r.get(m.EVENTS, [])}
    assert theirs == {"start"}  # only rank 0 reports the judge's events


def test_a_judge_that_fails_ends_tuning_not_the_run() -> None:
    rows = run_distributed(_train_broken_judge, spec(1))[0]
    assert [r[m.STEP] for r in rows] == list(range(1, STEPS + 1))
    off = [e for r in rows for e in r.get(m.EVENTS, []) if e["kind"] == "tune_off"]
    assert len(off) == 1 and "RuntimeError: the actor died" in off[0]["why"]
    # accumulation 2 from the start; step 1 is profiled (untimed), step 2 is the first window's:
    # the judge gone at its end, the run goes back to its own split, 1
    assert [r[m.ACCUMULATION_STEPS] for r in rows] == [2, 2] + [1] * (STEPS - 2)


class _Broken:
    def begin(self, world: int, per_rank: int, running: int) -> dict:
        return {"accumulation_steps": 2, "running": running, "done": False, "events": []}

    def window(self, world: int, seconds: float, steps: int) -> dict:
        raise RuntimeError("the actor died")


def _train_broken_judge(rank: int, world: int, spec_dict: dict) -> list[dict]:
    reports: list[dict] = []
    ElasticTrainer(RunSpec(**spec_dict), rank, world, CPU,
                   lambda batch, _: reports.extend(batch[m.ROWS]), None,
                   judge=_Broken() if rank == 0 else None).run()  # fmt: skip
    return reports


def test_no_window_is_counted_across_a_profiled_step() -> None:
    """A profiled step (phase syncs, a reference micro-step) is left out of every window, and
    so is what runs between steps."""
    from train_fns.online import OnlineTuning

    class Count:
        seconds: list[float] = []

        def begin(self, world: int, per_rank: int, running: int) -> dict:
            return {"accumulation_steps": running, "running": running, "done": False,
                    "events": []}  # fmt: skip

        def window(self, world: int, seconds: float, steps: int) -> dict:
            self.seconds.append(seconds)
            return {"accumulation_steps": 1, "running": 1, "done": False, "events": []}

    judge = Count()
    tuning = OnlineTuning(judge, 1, window_steps=2)
    runner = dataclasses.make_dataclass("R", ["plan", "device"])(tiny_plan(world_size=1), CPU)
    for step, (seconds, profiled) in enumerate([(0.05, False), (0.5, True), (0.05, False)]):
        tuning.start_step(CPU, profiled)
        time.sleep(seconds)
        tuning.after_step(runner, step + 1, 0)
        time.sleep(0.2)  # a report or a checkpoint between steps
    assert len(judge.seconds) == 1 and 0.1 <= judge.seconds[0] < 0.3
