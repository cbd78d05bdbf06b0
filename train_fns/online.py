"""The worker's half of tuning while training (``orchestrator.train --tune``): windows of real
training steps, timed, and the setting each window trains with (its accumulation split, and
under DDP its bucket size), as the driver's judge (``orchestrator.train.tune``) decides.

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

A new bucket size re-wraps the model in DDP (``strategies.rebucket``) between two steps. Where
the judge asks for a check (a candidate's first switch), the workers first compute the next
step's gradients under the old wrapper and then the new one, with dropout off, and hand the
judge their relative distance (``switch_gap``): a candidate whose gradients are not the running
setting's is refused before it trains a step. The check costs two forward-backward passes and
one copy of the gradients, once per bucket candidate. The first ``UNTIMED_AFTER_REBUCKET``
steps after every re-wrap are left out of the windows: DDP's first steps on new buckets carry
one-off costs that would fall in alternate halves of the pairs.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.nn.parallel import DistributedDataParallel

from train_fns.loop import StepRunner
from train_fns.plan import ACCUMULATION, BUCKETS, TrialPlan
from train_fns.ranks import reduce_over_ranks, reduce_tensor
from train_fns.strategies import rebucket

UNTIMED_AFTER_REBUCKET = 2
"""Steps after a re-wrap that no window times: DDP's first step runs its buckets in reverse
parameter order and the second rebuilds them in the order gradients came (one-off costs that
would fall in alternate pairs' halves, unlike the floor's windows)."""


class Judge(Protocol):
    """What rank 0 asks (``orchestrator.train.tune.Judge``, through an actor in a real run)."""

    def begin(self, world: int, per_rank: int, running: dict[str, float],
              split_fixed: bool = False) -> dict[str, Any]: ...  # fmt: skip

    def window(self, world: int, seconds: float, steps: int) -> dict[str, Any]: ...

    def checked(self, world: int, gap: float) -> dict[str, Any]: ...


def setting_of(runner: StepRunner) -> dict[str, float]:
    """The knobs this group can switch live, at their values now: the split, and the bucket
    size where the model is DDP over more than one rank."""
    setting = {ACCUMULATION: float(runner.plan.accumulation_steps)}
    if isinstance(runner.model, DistributedDataParallel) and runner.plan.world_size > 1:
        setting[BUCKETS] = float(runner.plan.ddp.bucket_cap_mb)  # always given to torch
    return setting


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
        self.untimed = 0
        """Steps no window times yet (``UNTIMED_AFTER_REBUCKET`` after a re-wrap)."""
        self.beat: Callable[[], None] = lambda: None
        """The watchdog's heartbeat (``ElasticTrainer.run`` sets it): a check is two passes."""
        self.running: dict[str, float] = {}
        """The size's running setting as the judge last said (empty: not yet): what the run
        keeps should the judge stop answering, not the candidate a window was trying."""
        self.events: list[dict[str, Any]] = []

    def begin(self, runner: StepRunner, step: int, samples_seen: int) -> None:
        """The group's start: the setting its first window trains with."""
        plan = runner.plan
        per_rank = plan.global_batch // plan.world_size
        self.running = setting_of(runner)
        answer = self._ask(step, "begin", self.world, per_rank, self.running,
                           plan.ddp.static_graph)  # fmt: skip
        self._apply(runner, answer, step, samples_seen)

    def start_step(self, device: torch.device, profiled: bool) -> None:
        """Before a step: a step that counts starts its clock on an empty device queue (not
        the first steps after a re-wrap)."""
        if self.untimed:
            self.untimed -= 1
        elif not (self.done or profiled):
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

    def _ask(self, step: int, call: str, *args: Any) -> Answer:
        """Rank 0 asks the judge; every rank gets its answer (summed over the side group, so
        it is rank 0's). A judge that fails to answer ends the tuning, not the run: training
        goes on with the running setting it last named."""
        mine = torch.zeros(len(Answer.FIELDS), dtype=torch.float64)
        if self.judge is not None:
            try:
                answer = getattr(self.judge, call)(*args)
                mine[:] = Answer.pack(answer["setting"], answer["running"], answer["done"],
                                      answer["check"])  # fmt: skip
                self.events.extend({**event, "step": step} for event in answer["events"])
            except Exception as e:  # noqa: BLE001 - rank 0 must reach the collective below
                mine[:] = Answer.pack(self.running, self.running, done=True, check=False)
                self.events.append({"kind": "tune_off", "world": self.world, "step": step,
                                    "why": f"{type(e).__name__}: {e}"[:300]})  # fmt: skip
        answer = Answer.unpack(reduce_tensor(mine, "sum").tolist())
        self.running = answer.running
        return answer

    def _apply(self, runner: StepRunner, answer: Answer, step: int, samples_seen: int) -> None:
        """Switch to the answer's setting; a bucket switch the judge asks to check is
        checked first, and the judge's answer to the check applied in turn."""
        self.done = answer.done
        accumulation = int(answer.setting.get(ACCUMULATION, 0))
        if accumulation >= 1 and accumulation != runner.plan.accumulation_steps:
            runner.plan = resplit(runner.plan, accumulation, step, samples_seen)
        buckets = answer.setting.get(BUCKETS)
        if not buckets or buckets == setting_of(runner).get(BUCKETS, buckets):
            return
        if not answer.check:
            self._rebucket(runner, buckets)
            return
        running = answer.running.get(BUCKETS)
        if running and running != setting_of(runner)[BUCKETS]:  # after a refused candidate
            self._rebucket(runner, running)  # the check compares with the running setting
        gap = switch_gap(runner, step, lambda: self._rebucket(runner, buckets))
        self.beat()
        self._apply(runner, self._ask(step, "checked", self.world, gap), step, samples_seen)

    def _rebucket(self, runner: StepRunner, buckets: float) -> None:
        """Re-wrap with ``buckets`` MB and leave the next steps untimed."""
        switch_buckets(runner, buckets)
        self.untimed = UNTIMED_AFTER_REBUCKET


@dataclasses.dataclass(frozen=True)
class Answer:
    """The judge's answer as every rank takes it: numbers only (they travel as one tensor)."""

    setting: dict[str, float]
    running: dict[str, float]
    done: bool
    check: bool
    FIELDS = ("setting.accumulation", "setting.buckets", "running.accumulation",
              "running.buckets", "done", "check")  # fmt: skip

    @staticmethod
    def pack(setting: dict, running: dict, done: bool, check: bool) -> torch.Tensor:
        """The answer's numbers (a knob the setting lacks is 0)."""
        return torch.tensor([setting.get(ACCUMULATION, 0), setting.get(BUCKETS, 0),
                             running.get(ACCUMULATION, 0), running.get(BUCKETS, 0),
                             float(done), float(check)], dtype=torch.float64)  # fmt: skip

    @staticmethod
    def unpack(values: list[float]) -> Answer:
        def knobs(accumulation: float, buckets: float) -> dict[str, float]:
            return {ACCUMULATION: accumulation, **({BUCKETS: buckets} if buckets else {})}

        return Answer(knobs(*values[0:2]), knobs(*values[2:4]), bool(values[4]), bool(values[5]))


def switch_buckets(runner: StepRunner, buckets: float) -> None:
    """Re-wrap the runner's model with ``buckets`` MB buckets, every rank at the same step.

    The old wrapper is dropped first and collected at once: a wrapper that has run a step sits
    in a reference cycle, so dropping it frees nothing until the collector runs, at different
    points on different ranks, and until then its reducer's hooks still fire on every gradient.
    Its buckets are freed before the new wrapper allocates its own."""
    runner.optimizer.zero_grad(set_to_none=True)  # no bucket view outlives its bucket
    ddp = dataclasses.replace(runner.plan.ddp, bucket_cap_mb=buckets)
    runner.plan = dataclasses.replace(runner.plan, ddp=ddp)
    module = runner.model.module
    runner.model = module
    gc.collect()
    runner.model = rebucket(module, runner.plan, runner.device)


def switch_gap(runner: StepRunner, step: int, switch: Any) -> float:
    """The relative distance between step ``step``'s gradients before and after ``switch``
    (the largest over ranks; inf where the candidate's are not finite and the running one's
    are; 0 where neither's are, as an fp16 step the loss scaler skips says nothing). Both
    passes run with dropout off and the same seed; the gradients are freed after. They run
    between steps: the timer's next step starts its record afresh."""
    before = _gradients(runner, step, lambda grads: [g.detach().clone() for g in grads])
    switch()
    gap = _gradients(runner, step, lambda grads: _distance(grads, before))
    return reduce_over_ranks([gap], "max")[0]


def _distance(after: list[torch.Tensor], before: list[torch.Tensor]) -> float:
    """||after - before|| / ||before|| over every gradient, in float64 (``before`` is spent)."""
    norm = sum(float(torch.linalg.vector_norm(b, dtype=torch.float64)) ** 2 for b in before)
    if len(after) != len(before):  # a parameter lost or gained its gradient
        return math.inf
    for a, b in zip(after, before, strict=True):
        b.sub_(a)
    diff = sum(float(torch.linalg.vector_norm(b, dtype=torch.float64)) ** 2 for b in before)
    if not math.isfinite(norm):
        return 0.0 if not math.isfinite(diff) else math.inf
    if not math.isfinite(diff):
        return math.inf
    return math.sqrt(diff / norm) if norm > 0 else (0.0 if diff == 0 else math.inf)


def _gradients(runner: StepRunner, step: int, take: Any) -> Any:
    """``take`` of step ``step``'s reduced gradients, computed with every module in eval mode
    (dropout off) and a seed of the step's own; each module's mode is restored and the
    gradients freed after."""
    modes = {module: module.training for module in runner.model.modules()}
    runner.model.eval()
    devices = [runner.device] if runner.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(step)
            runner.accumulate_gradients(step)
        return take([p.grad for p in runner.model.parameters() if p.grad is not None])
    finally:
        runner.optimizer.zero_grad(set_to_none=True)
        for module, mode in modes.items():
            module.training = mode


def _drain(device: torch.device) -> None:
    """Wait for the device's queue (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
