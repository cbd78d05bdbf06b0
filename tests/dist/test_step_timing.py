"""The worker loop's timing on two gloo ranks, as a GPU worker would time it:
``torch.cuda.synchronize`` is counted instead of run, and the timer is told it serves CUDA.
A measured step that is not its window's profiled step syncs once; batches are built before
the step's clock starts."""

from __future__ import annotations

import time

import torch
from _spawn import run_distributed
from _tiny import CPU, tiny_plan

import train_fns.loop
from train_fns.loop import build_runner, run_training, window_ends
from train_fns.plan import TrialPlan
from train_fns.timing import StepTimer

SYNCS = [0]
SLOW_BATCH_S = 1000.0
"""What one batch build takes on the timer's clock: far beyond any real step."""


class CountingTimer(StepTimer):
    """A timer that takes the device for CUDA and notes the syncs of each step."""

    made: list[CountingTimer] = []

    def __init__(self, device: torch.device) -> None:
        super().__init__(torch.device("cuda"))
        self.per_step: list[int] = []
        self._mark = 0
        CountingTimer.made.append(self)

    def start_step(self, *args: bool) -> None:
        self._mark = SYNCS[0]
        super().start_step(*args)

    def end_step(self) -> float:
        total = super().end_step()
        self.per_step.append(SYNCS[0] - self._mark)
        return total


def _count_sync() -> None:
    SYNCS[0] += 1


def _syncs_per_step(rank: int, world: int, plan: TrialPlan) -> list[int]:
    torch.cuda.synchronize = _count_sync  # this spawned process only
    torch.cuda.mem_get_info = lambda device=None: (0, 0)
    # the peak is reset after the guard's steps (StepTimer.reset_peak): no CUDA here to reset
    torch.cuda.reset_peak_memory_stats = lambda device=None: None
    torch.cuda.empty_cache = lambda: None
    train_fns.loop.StepTimer = CountingTimer
    run_training(plan, rank, world, CPU, lambda report: None)
    return CountingTimer.made[0].per_step


def test_a_measured_step_syncs_once_but_the_profiled_one_per_window() -> None:
    plan = tiny_plan(warmup_steps=2, measure_steps=6, num_windows=2, accumulation_steps=2)
    profiled = {end - 1 for end in window_ends(plan)}  # each window's last step
    for per_step in run_distributed(_syncs_per_step, plan):
        assert len(per_step) == plan.total_steps
        for step, count in enumerate(per_step):
            if step in profiled:
                assert count > 2, (step, per_step)  # a sync at each phase boundary
            else:
                assert count == 1, (step, per_step)  # its end only


class SkewedClock:
    """The host clock plus what the batch builds "took": a build costs ``SLOW_BATCH_S`` on this
    clock and nothing on the machine, so a loaded machine cannot blur the test."""

    def __init__(self) -> None:
        self.skew = 0.0

    def __call__(self) -> float:
        return time.perf_counter() + self.skew


def _window_with_slow_batches(rank: int, world: int, plan: TrialPlan) -> dict[str, float]:
    runner, _ = build_runner(plan, rank, CPU)
    clock, build = SkewedClock(), runner.workload.batch
    runner.timer = StepTimer(CPU, clock=clock)

    def slow_batch(indices: list[int]) -> object:
        clock.skew += SLOW_BATCH_S  # a costly host-side batch build (e.g. sample by sample)
        return build(indices)

    runner.workload.batch = slow_batch
    for step in range(3):
        runner.run_step(step)
    return {**runner.timer.take_window(), "builds_s": clock.skew}


def test_batches_are_built_before_the_step_clock_starts() -> None:
    plan = tiny_plan(accumulation_steps=2)
    for window in run_distributed(_window_with_slow_batches, plan):
        # two micro-batches a step, each a long build: not in the data wait (the copy to the
        # device), nor anywhere else in the step the search compares
        assert window["builds_s"] >= 6 * SLOW_BATCH_S, "the builds ran (3 steps x 2)"
        assert window["data"] < SLOW_BATCH_S and window["total"] < SLOW_BATCH_S, window
