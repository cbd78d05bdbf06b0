"""The worker's half of tuning while training (``orchestrator.train --tune``): windows of real
training steps, timed, and the split each window trains with, as the driver's judge
(``orchestrator.train.tune``) decides.

A window is ``window_steps`` steps that were not profiled (a profiled step waits for the device
at each phase and runs an extra reference micro-step: counted, it would slow whichever window
it falls in). Each of its steps is timed from the device's queue drained before it to the queue
drained after it (``start_step``, ``after_step``): on CUDA a step's host wall-clock leaves out
the device work still queued, and what runs between steps (reports, checkpoints, snapshots) is
not the step's. The drains cost the overlap of one step's tail with the next step's host work,
alike for both sides of a pair, and only while a size tunes. A window's time is the slowest
rank's. Rank 0 hands the window to the judge and every rank takes its answer over the side
group, so each rank switches at the same step. A switch re-splits the per-rank batch
(``resplit``): the same samples in the same order, the global batch kept. Without dropout (or
another random layer) the run's loss is the untuned run's up to the order of summation; with
it, a different split draws different masks, as a resize does.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol

import torch

from train_fns.loop import StepRunner
from train_fns.plan import TrialPlan
from train_fns.ranks import reduce_over_ranks, reduce_tensor


class Judge(Protocol):
    """What rank 0 asks (``orchestrator.train.tune.Judge``, through an actor in a real run)."""

    def begin(self, world: int, per_rank: int, running: int) -> dict[str, Any]: ...

    def window(self, world: int, seconds: float, steps: int) -> dict[str, Any]: ...


def resplit(plan: TrialPlan, accumulation: int, step: int, samples_seen: int) -> TrialPlan:
    """``plan`` with the per-rank batch split ``accumulation`` ways from ``step`` on, which
    starts at global sample ``samples_seen`` (the data position stays exact)."""
    per_rank = plan.global_batch // plan.world_size
    return dataclasses.replace(
        plan, accumulation_steps=accumulation, micro_batch=per_rank // accumulation,
        first_step=step, first_sample=samples_seen,
    )  # fmt: skip


class OnlineTuning:
    """Times windows and switches the runner's split between them (see the module)."""

    def __init__(self, judge: Judge | None, world: int, window_steps: int) -> None:
        """``judge``: rank 0's (other ranks pass None and take rank 0's answers)."""
        self.judge, self.world, self.window_steps = judge, world, window_steps
        self.done, self.steps, self.seconds = False, 0, 0.0
        self.started: float | None = None
        self.running = 0
        """The size's running split as the judge last said (0: not yet): what the run keeps
        should the judge stop answering, not the candidate a window was trying."""
        self.events: list[dict[str, Any]] = []

    def begin(self, runner: StepRunner, step: int, samples_seen: int) -> None:
        """The group's start: the split its first window trains with."""
        plan = runner.plan
        per_rank = plan.global_batch // plan.world_size
        self.running = plan.accumulation_steps
        answer = self._ask(step, "begin", self.world, per_rank, plan.accumulation_steps)
        self._apply(runner, answer, step, samples_seen)

    def start_step(self, device: torch.device, profiled: bool) -> None:
        """Before a step: a step that counts starts its clock on an empty device queue."""
        if not (self.done or profiled):
            _drain(device)
            self.started = time.perf_counter()

    def after_step(self, runner: StepRunner, step: int, samples_seen: int) -> None:
        """Count a finished step (``step`` is the next one's number) if it was timed; at a
        window's end, ask what the next window trains with and switch to it. Every rank calls
        it alike."""
        if self.started is None:
            return
        _drain(runner.device)
        self.steps += 1
        self.seconds += time.perf_counter() - self.started
        self.started = None
        if self.steps < self.window_steps:
            return
        seconds = reduce_over_ranks([self.seconds], "max")[0]
        answer = self._ask(step, "window", self.world, seconds, self.steps)
        self.steps, self.seconds = 0, 0.0
        self._apply(runner, answer, step, samples_seen)

    def take_events(self) -> list[dict[str, Any]]:
        """What the judge said since the last call (rank 0's; others have none)."""
        events, self.events = self.events, []
        return events

    def _ask(self, step: int, call: str, *args: Any) -> tuple[int, bool]:
        """Rank 0 asks the judge; every rank gets its (accumulation, running, done). A judge
        that fails to answer ends the tuning, not the run: training goes on with the running
        split it last named."""
        mine = torch.zeros(3, dtype=torch.float64)
        if self.judge is not None:
            try:
                answer = getattr(self.judge, call)(*args)
                mine[:] = torch.tensor([answer["accumulation_steps"], answer["running"],
                                        answer["done"]])  # fmt: skip
                self.events.extend({**event, "step": step} for event in answer["events"])
            except Exception as e:  # noqa: BLE001 - rank 0 must reach the collective below
                mine[:] = torch.tensor([self.running, self.running, 1])
                self.events.append({"kind": "tune_off", "world": self.world, "step": step,
                                    "why": f"{type(e).__name__}: {e}"[:300]})  # fmt: skip
        accumulation, self.running, done = (int(x) for x in reduce_tensor(mine, "sum").tolist())
        return accumulation, bool(done)

    def _apply(self, runner: StepRunner, answer: tuple[int, bool], step: int,
               samples_seen: int) -> None:  # fmt: skip
        accumulation, self.done = answer
        if accumulation >= 1 and accumulation != runner.plan.accumulation_steps:
            runner.plan = resplit(runner.plan, accumulation, step, samples_seen)


def _drain(device: torch.device) -> None:
    """Wait for the device's queue (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
