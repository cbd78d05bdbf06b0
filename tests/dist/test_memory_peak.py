"""The peak memory a trial reports (``PEAK_MEM_BYTES``) is its training steps', not the
correctness guard's warm-up (whose float64 gradient copies are no part of a training step).

On CPU the peak is the process's resident high-water mark, which the timer resets when the
guard's steps end (``StepTimer.reset_peak``). Two allocations stand in for what a step holds:
a large one inside the guard's warm-up hook and a smaller one in the first measured step; the
reported peak must count the second and not the first (on GPU the same reset goes through
``torch.cuda.reset_peak_memory_stats``, see tests/unit/test_peak_reset.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _spawn import run_distributed
from _tiny import CPU, tiny_plan

MiB = 2**20
GUARD_SPIKE = 768 * MiB
MEASURED_SPIKE = 256 * MiB


def _resident_peak() -> int:
    """The kernel's resident high-water mark of this process (``VmHWM``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def _spike(nbytes: int) -> int:
    """Hold ``nbytes`` (every page touched) for a moment; returns the high-water mark then."""
    held = torch.ones(nbytes // 4, dtype=torch.float32)
    peak = _resident_peak()
    del held
    return peak


def _peak_worker(rank: int, world_size: int, plan: dict) -> dict[str, int]:
    from train_fns import metrics as m
    from train_fns.guard import Guard
    from train_fns.loop import StepRunner, run_training
    from train_fns.plan import TrialPlan

    seen: dict[str, int] = {}
    guard_hook, accumulate = Guard.after_backward, StepRunner.accumulate_gradients

    def spiky_guard(self: Guard, runner: StepRunner) -> None:
        guard_hook(self, runner)
        seen["guard"] = _spike(GUARD_SPIKE)

    def spiky_step(self: StepRunner, step: int, batches: list | None = None) -> torch.Tensor:
        if step == self.plan.warmup_steps:
            seen["measured"] = _spike(MEASURED_SPIKE)
        return accumulate(self, step, batches)

    Guard.after_backward = spiky_guard  # type: ignore[method-assign]
    StepRunner.accumulate_gradients = spiky_step  # type: ignore[method-assign]
    reports: list[dict] = []
    run_training(TrialPlan.from_dict(plan), rank, world_size, CPU, reports.append)
    return {"reported": reports[-1][m.PEAK_MEM_BYTES], **seen}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc needed")
def test_reported_peak_excludes_the_guard_warmup() -> None:
    plan = tiny_plan(warmup_steps=3, measure_steps=2, num_windows=1).to_dict()
    for rank, seen in enumerate(run_distributed(_peak_worker, plan, timeout_s=300.0)):
        # the kernel's resident counters are approximate (per-CPU batches): margins of half
        # a spike, far above that error and far below either spike
        counted = seen["measured"] - MEASURED_SPIKE // 2
        assert seen["reported"] > counted, f"rank {rank}: a measured step uncounted: {seen}"
        assert seen["reported"] < seen["guard"] - GUARD_SPIKE // 2, f"rank {rank}: {seen}"
