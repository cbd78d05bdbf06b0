"""Tuning while training, without Ray: rank 0 asks a real judge after every window, every rank
switches the split (or DDP's buckets) at the same step, and the run's trajectory is the untuned
run's; a bucket switch that changes the gradients is refused before it trains a step."""

from __future__ import annotations

import dataclasses
import time
import weakref
from pathlib import Path

import pytest
from _spawn import run_distributed
from _tiny import CPU, tiny_plan

from orchestrator.train.tune import GUARD, Judge, TuneSettings
from train_fns import metrics as m
from train_fns.restart import RunSpec
from train_fns.trainer import ElasticTrainer

STEPS = 24
SETTINGS = TuneSettings(window_steps=1, budget_steps=STEPS, delta=0.02, max_pairs=3,
                        max_accumulation=8)  # fmt: skip


def spec(tune_window: int, steps: int = STEPS) -> dict:
    plan = tiny_plan(warmup_steps=0, measure_steps=steps, num_windows=1, max_grad_norm=1.0)
    return RunSpec(
        plan=plan.to_dict(), steps=steps, checkpoint_every=steps, max_micro_batch=plan.micro_batch,
        reference_every=steps, grad_norm_every=steps, tune_window=tune_window,
    ).to_dict()  # fmt: skip


def _train(rank: int, world: int, spec_dict: dict,
           settings: TuneSettings = SETTINGS) -> tuple[list[dict], dict | None]:  # fmt: skip
    reports: list[dict] = []
    judge = Judge(settings, set(), {}, None) if rank == 0 else None

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
    assert after == {done["running"]["accumulation_steps"]}  # the rest of the run trains with it
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


BUCKET_STEPS = 48
"""Room for two bucket candidates: each re-wrap leaves two steps untimed."""
BUCKET_SETTINGS = dataclasses.replace(SETTINGS, budget_steps=BUCKET_STEPS, max_accumulation=1,
                                      bucket_choices=(0.001, 1.0))  # fmt: skip
"""Buckets only: 1 MB holds all of the tiny model's gradients, as the running 25 MB does;
0.001 MB puts each parameter in a bucket of its own."""


def test_bucket_switches_keep_the_trajectory_and_every_rank_alike() -> None:
    tuned = run_distributed(_train_watching_wrappers, spec(1, BUCKET_STEPS))
    plain = run_distributed(_train, spec(0, BUCKET_STEPS))[0][0]
    (rows, summary, alive, switches), (other, *_) = tuned
    assert alive == 0  # every old wrapper (and its gradient hooks) gone
    assert set(switches) == {1.0, 0.001, 25.0}
    for tuned_row, plain_row in zip(rows, plain, strict=True):
        assert tuned_row[m.LOSS] == pytest.approx(plain_row[m.LOSS], rel=1e-4), tuned_row[m.STEP]
    assert [r[m.LOSS] for r in rows] == [r[m.LOSS] for r in other]
    decisions = summary["sizes"]["2"]["decisions"]
    assert [d["candidate"] for d in decisions] == [{"bucket_cap_mb": 1.0},
                                                   {"bucket_cap_mb": 0.001}]  # fmt: skip
    assert all(d["outcome"] != GUARD and d["steps"] > 0 for d in decisions)
    gaps = [e["gap"] for r in rows for e in r.get(m.EVENTS, []) if e["kind"] == "tune_check"]
    assert len(gaps) == 2 and all(gap < 1e-5 for gap in gaps)  # summation order, no more


def test_a_bucket_switch_that_changes_the_gradients_is_refused() -> None:
    tuned = run_distributed(_train_corrupt_buckets, spec(1, BUCKET_STEPS))
    plain = run_distributed(_train, spec(0, BUCKET_STEPS))[0][0]
    rows, summary = tuned[0]
    for tuned_row, plain_row in zip(rows, plain, strict=True):
        assert tuned_row[m.LOSS] == pytest.approx(plain_row[m.LOSS], rel=1e-4), tuned_row[m.STEP]
    refused, judged = summary["sizes"]["2"]["decisions"]
    assert refused["candidate"] == {"bucket_cap_mb": 1.0} and refused["outcome"] == GUARD
    assert refused["steps"] == 0
    gaps = [e["gap"] for r in rows for e in r.get(m.EVENTS, []) if e["kind"] == "tune_check"]
    assert gaps[0] > 0.1 and gaps[1] < 1e-5  # unreduced, then 0.001 MB as torch builds it
    assert judged["candidate"] == {"bucket_cap_mb": 0.001} and judged["steps"] > 0


def _train_watching_wrappers(rank: int, world: int, spec_dict: dict) -> tuple:
    """``_train`` with buckets only, counting the switches and the old wrappers still alive
    right after each (a live one would still hook every gradient)."""
    from train_fns import online

    switches, alive = [], []

    def switch(runner: object, buckets: float) -> None:
        old = weakref.ref(runner.model)
        real(runner, buckets)
        switches.append(buckets)
        alive.append(old() is not None)

    real, online.switch_buckets = online.switch_buckets, switch
    rows, summary = _train(rank, world, spec_dict, BUCKET_SETTINGS)
    return rows, summary, sum(alive), switches


def _unreduced(state, bucket):  # noqa: ANN001, ANN202 - DDP rejects other annotations
    """A comm hook that reduces nothing: each rank keeps its own gradients."""
    import torch

    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _train_corrupt_buckets(rank: int, world: int, spec_dict: dict) -> tuple:
    """``_train`` where the 1 MB candidate's wrapper leaves gradients unreduced (a transport
    that loses them), the other bucket sizes as torch builds them."""
    from train_fns import online

    def rebucket(ddp: object, plan: object, device: object) -> object:
        wrapped = real(ddp, plan, device)
        if plan.ddp.bucket_cap_mb == 1.0:
            wrapped.register_comm_hook(None, _unreduced)
        return wrapped

    real, online.rebucket = online.rebucket, rebucket
    return _train(rank, world, spec_dict, BUCKET_SETTINGS)


def _answer(accumulation: float, done: bool = False) -> dict:
    setting = {"accumulation_steps": accumulation}
    return {"setting": setting, "running": setting, "done": done, "check": False, "events": []}


class _Broken:
    def begin(self, world: int, per_rank: int, running: dict, split_fixed: bool) -> dict:
        return {**_answer(2), "running": running}

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

        def begin(self, world: int, per_rank: int, running: dict, split_fixed: bool) -> dict:
            return _answer(running["accumulation_steps"])

        def window(self, world: int, seconds: float, steps: int) -> dict:
            self.seconds.append(seconds)
            return _answer(1)

    judge = Count()
    tuning = OnlineTuning(judge, 1, window_steps=2)
    runner = dataclasses.make_dataclass("R", ["plan", "device", "model"])(
        tiny_plan(world_size=1), CPU, None)
    for step, (seconds, profiled) in enumerate([(0.05, False), (0.5, True), (0.05, False)]):
        tuning.start_step(CPU, profiled)
        time.sleep(seconds)
        tuning.after_step(runner, step + 1, 0)
        time.sleep(0.2)  # a report or a checkpoint between steps
    assert len(judge.seconds) == 1 and 0.1 <= judge.seconds[0] < 0.3
