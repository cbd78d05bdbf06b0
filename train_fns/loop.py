"""The worker step loop: build, wrap, train ``plan.total_steps`` steps, report per window.

Usable without Ray: ``run_training`` takes the rank, world size, device and a ``report``
callable, so the dist tests drive it with torch.multiprocessing and a list's ``append``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from train_fns import metrics as m
from train_fns.commsplit import nosync_from_accumulation
from train_fns.data import sample_indices
from train_fns.guard import Guard, guarded_steps
from train_fns.hf_workload import hf_workload
from train_fns.metrics import HANG_EXIT_CODE
from train_fns.plan import TrialPlan, window_lengths
from train_fns.precision import Precision
from train_fns.ranks import reduce_over_ranks
from train_fns.strategies import (
    discard_unsynced_gradients,
    sync_gradients,
    unsynced_gradients_dropped,
    wrap_model,
)
from train_fns.timing import (
    StepTimer,
    gpu_utilization,
    memory_capacity_bytes,
    peak_memory_bytes,
)
from train_fns.watchdog import Watchdog
from train_fns.workload import (
    Workload,
    WorkloadContext,
    as_workload,
    load_entrypoint,
    pinned,
    to_device,
)

__all__ = ["HANG_EXIT_CODE", "StepRunner", "build_runner", "run_training", "window_ends"]


def window_ends(plan: TrialPlan) -> list[int]:
    """Absolute step counts after which a window is reported (warm-up steps excluded).

    Windows differ by at most one step when ``measure_steps`` does not divide evenly.
    """
    ends, done = [], plan.warmup_steps
    for steps in window_lengths(plan.measure_steps, plan.num_windows):
        done += steps
        ends.append(done)
    return ends


@dataclass
class StepRunner:
    """One worker's training state, built once; ``run_step`` is one optimizer step."""

    plan: TrialPlan
    rank: int
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    precision: Precision
    workload: Workload
    timer: StepTimer
    fault: str | None
    before_optimizer: Callable[[StepRunner], None] | None = None
    """Called between the last backward and the optimizer step (gradient probes)."""
    after_optimizer: Callable[[StepRunner], None] | None = None
    """Called after the optimizer step, before the gradients are freed (the guard's update)."""
    num_params: int = 0
    nosync_s: float | None = None
    """The no-accumulation compute reference (``nosync_reference``), measured once."""
    reference_s: float = 0.0
    """Wall-clock that reference took (overhead, not measurement)."""

    def run_step(self, step: int, profiled: bool = True) -> Tensor:
        """One optimizer step; returns its mean loss (a device tensor: no host sync per step).

        Its micro-batches are built before the clock starts: building them is the workload's
        cost, not the step's, and the same for every configuration searched. ``profiled``:
        see ``StepTimer.start_step``."""
        if step == self.plan.warmup_steps and self.fault == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        batches = self.host_batches(step)
        self.timer.start_step(profiled)
        step_loss = self.accumulate_gradients(step, batches)
        unused = getattr(self.model, "commtune_unused", None)  # FSDP2, see train_fns.unused
        if unused is not None:
            unused.settle()
        if self.before_optimizer is not None:
            self.before_optimizer(self)
        with self.timer.phase("optim"):
            self.precision.step(self.optimizer, step_loss)
            if self.after_optimizer is not None:
                self.after_optimizer(self)
            self.optimizer.zero_grad(set_to_none=True)
        self.timer.end_step()
        return step_loss

    def accumulate_gradients(self, step: int, batches: list[Any] | None = None) -> Tensor:
        """Forward and backward of every micro-step; gradients sync on the last one only.
        ``batches``: the step's host batches (``host_batches``; built here when None)."""
        plan = self.plan
        inject = self.fault if step == plan.warmup_steps else None
        step_loss = torch.zeros((), device=self.device)
        if batches is None:
            batches = self.host_batches(step)
        for micro_step in range(plan.accumulation_steps):
            with self.timer.phase("data"):  # the copy to the device only
                batch = to_device(batches[micro_step], self.device)
            last = micro_step == plan.accumulation_steps - 1
            with (
                self.timer.phase("fwd_bwd"),
                self.timer.phase("sync_micro") if last else nullcontext(),
                sync_gradients(self.model, plan, enabled=last),
            ):
                with self.precision.autocast():
                    if inject == "oom":
                        raise torch.OutOfMemoryError(
                            "commtune injected fault: out of memory in forward "
                            f"(micro_batch={plan.micro_batch})"
                        )
                    # Mean of micro-batch means == big-batch mean (equal-size micro-batches).
                    loss = self.loss(batch) / plan.accumulation_steps
                if inject == "hang":
                    _block_forever()  # peers then wait in the gradient all-reduce
                self.precision.backward(loss)
            step_loss += loss.detach()
        return step_loss

    def host_batches(self, step: int) -> list[Any]:
        """This rank's micro-batches of ``step``, on the host (``host_batch``)."""
        return [self.host_batch(step, micro) for micro in range(self.plan.accumulation_steps)]

    def host_batch(self, step: int, micro_step: int) -> Any:
        """This rank's micro-batch at ``(step, micro_step)`` on the host, pinned on CUDA (so
        that the copy to the device is asynchronous): the workload's samples at the global
        indices the plan assigns (the same whatever the split)."""
        indices = list(sample_indices(self.plan, self.rank, step, micro_step))
        return pinned(self.workload.batch(indices), self.device)

    def loss(self, batch: Any) -> Tensor:
        """The workload's loss of ``batch`` on the wrapped model."""
        return self.workload.loss(self.model, batch)

    def nosync_reference(self, step: int) -> float:
        """Seconds of one forward+backward of micro-step 0 with gradient sync off, then
        discarded: the compute-only twin of ``sync_micro`` when there is no accumulation
        (every micro-step syncs). Costs one micro-step; its gradients are discarded (under FSDP2
        each as soon as it is made: ``unsynced_gradients_dropped``)."""
        batch = to_device(self.host_batch(step, 0), self.device)
        start = self.timer.now()
        with sync_gradients(self.model, self.plan, enabled=False), self.precision.autocast():
            loss = self.loss(batch) / self.plan.accumulation_steps
        with unsynced_gradients_dropped(self.model):  # FSDP2: never the whole model's at once
            self.precision.backward(loss)
        elapsed = self.timer.now() - start
        # Zeroed, not dropped, under DDP's find_unused_parameters: its reducer remembers which
        # parameters the no-sync backward used and all-reduces them at the next synced one,
        # which fails on a gradient set to None ("undefined, but still allreduced by DDP
        # reducer"). The zeros add nothing to the next step's gradients (a parameter no rank
        # uses in that step then gets a zero one, not none: once per configuration).
        self.optimizer.zero_grad(set_to_none=not self.plan.ddp.find_unused_parameters)
        discard_unsynced_gradients(self.model)  # FSDP2 keeps them where zero_grad cannot see
        unused = getattr(self.model, "commtune_unused", None)
        if unused is not None:
            unused.forget()  # what that forward used is not the next step's
        return elapsed


def _block_forever() -> None:
    while True:
        time.sleep(60)


def _nosync_micro_s(runner: StepRunner, times: dict[str, float], step: int) -> float:
    """A micro-step's forward+backward without gradient sync: from the accumulation
    micro-steps, or (no accumulation) one extra micro-step timed after the first window and
    reused (it costs a step's compute; once per configuration is enough)."""
    accumulation = runner.plan.accumulation_steps
    if accumulation > 1:
        return nosync_from_accumulation(times["fwd_bwd"], times["sync_micro"], accumulation)
    if runner.nosync_s is None:
        start = time.perf_counter()
        runner.nosync_s = runner.nosync_reference(step)
        runner.reference_s = time.perf_counter() - start
    return runner.nosync_s


def _window_metrics(
    runner: StepRunner,
    step: int,
    world_size: int,
    loss: Tensor,
    setup: dict[str, float],
    window_wall_s: float,
) -> dict:
    times = runner.timer.take_window()
    memory = _memory_metrics(runner)  # the window's peak, read before the reference's step
    nosync_s = _nosync_micro_s(runner, times, step)
    setup["reference_s"] = runner.reference_s
    return {
        m.WINDOW: window_ends(runner.plan).index(step + 1),
        m.RANK: runner.rank,
        m.WORLD_SIZE: world_size,
        m.NUM_STEPS: int(times["num_steps"]),
        m.STEP_TIME_S: times["total"],
        m.MEAN_STEP_TIME_S: times["mean_total"],
        m.DATA_S: times["data"],
        m.FWD_BWD_S: times["fwd_bwd"],
        m.OPTIM_S: times["optim"],
        m.SYNC_MICRO_S: times["sync_micro"],
        m.NOSYNC_MICRO_S: nosync_s,
        m.LOSS: reduce_over_ranks([float(loss)])[0],
        **memory,
        m.ENV_SEEN: {name: os.environ.get(name) for name in runner.plan.env_names},
        m.SETUP_S: dict(setup),
        m.NUM_NONFINITE: runner.precision.num_nonfinite(),
        m.NUM_PARAMS: runner.num_params,
        m.GPU_UTIL: gpu_utilization(runner.device),
        m.WINDOW_WALL_S: window_wall_s,
        # a synchronous step is as slow as its slowest rank
        m.GLOBAL_STEP_TIME_S: reduce_over_ranks([times["total"]], op="max")[0],
    }


def _memory_metrics(runner: StepRunner) -> dict[str, int | None]:
    """Peak memory both ways and the capacity it is compared with (``train_fns.metrics``)."""
    device, used_peak = runner.device, runner.timer.device_used_peak
    on_gpu = device.type == "cuda"
    return {
        m.PEAK_MEM_BYTES: peak_memory_bytes(device, used_peak),
        m.ALLOCATED_PEAK_BYTES: int(torch.cuda.max_memory_allocated(device)) if on_gpu else None,
        m.DEVICE_USED_PEAK_BYTES: used_peak if on_gpu else None,
        m.MEMORY_CAPACITY_BYTES: memory_capacity_bytes(device),
    }


def make_workload(plan: Any, rank: int, device: torch.device) -> Workload:
    """The plan's workload on this rank: the user's entrypoint, or the built-in HF model.

    torch is seeded with ``plan.seed`` first, so a model built with random init has the same
    weights on every rank."""
    torch.manual_seed(plan.seed)
    if plan.entrypoint is None:
        return hf_workload(plan)
    ctx = WorkloadContext(
        seed=plan.seed, rank=rank, world_size=plan.world_size, device=device,
        seq_len=plan.seq_len, options=dict(plan.options), precision=plan.precision,
    )  # fmt: skip
    return as_workload(load_entrypoint(plan.entrypoint, plan.workload_source)(ctx))


def default_optimizer(lr: float, impl: str | None = None) -> Callable[[Any], torch.optim.Optimizer]:
    """AdamW at ``lr``: the optimizer when the workload names none. ``impl`` (the plan's
    ``adamw_impl``) picks ``foreach`` (one kernel per op over all tensors) or ``fused`` (one
    kernel per step, CUDA): the same update up to rounding; None leaves torch's choice."""
    flags = {impl: True} if impl is not None else {}
    return lambda params: torch.optim.AdamW(params, lr=lr, **flags)


def build_runner(plan: TrialPlan, rank: int, device: torch.device) -> tuple[StepRunner, dict]:
    """Seed, build and wrap the model, make optimizer and data; returns set-up times too."""
    start = time.perf_counter()
    workload = make_workload(plan, rank, device)
    num_params = sum(p.numel() for p in workload.model.parameters() if p.requires_grad)
    model_build_s = time.perf_counter() - start
    start = time.perf_counter()
    model = wrap_model(workload.model, plan, device, workload.blocks, workload.full_state)
    workload.full_state = None  # rank 0's whole copy, now in every rank's model: free it
    wrap_s = time.perf_counter() - start
    # Weights are identical on every rank (seeded build); dropout masks should not be.
    torch.manual_seed(plan.seed + 1 + rank)
    runner = StepRunner(
        plan=plan,
        rank=rank,
        device=device,
        model=model,
        optimizer=(workload.optimizer or default_optimizer(plan.lr, plan.adamw_impl))(
            model.parameters()
        ),
        precision=Precision(plan, device),
        workload=workload,
        timer=StepTimer(device),
        # An OOM strikes every rank alike (same model, same micro-batch); a crash or a hang
        # takes one rank, and the others must notice.
        fault=plan.fault if plan.fault == "oom" or rank == plan.world_size - 1 else None,
    )
    runner.num_params = num_params
    setup = {"model_build_s": model_build_s, "wrap_s": wrap_s, "warmup_s": 0.0, "reference_s": 0.0}
    return runner, setup


def _run_step_with_context(runner: StepRunner, step: int, profiled: bool) -> Tensor:
    """``run_step``; an OOM is re-raised (same type) saying where and at what peak memory, and
    carrying the step (``group.agree_all_oom``)."""
    try:
        return runner.run_step(step, profiled)
    except torch.OutOfMemoryError as e:
        peak_gib = peak_memory_bytes(runner.device, runner.timer.device_used_peak) / 2**30
        error = torch.OutOfMemoryError(
            f"rank {runner.rank}, step {step}, micro_batch={runner.plan.micro_batch}, "
            f"peak {peak_gib:.1f} GiB: {e}"
        )
        error.step = step  # the group goes on only if every rank ran out at the same step
        raise error from e


def run_training(
    plan: TrialPlan,
    rank: int,
    world_size: int,
    device: torch.device,
    report: Callable[[dict], None],
    residents: dict[str, StepRunner] | None = None,
) -> bool:
    """Train ``plan`` on this rank and ``report`` one metrics dict per measurement window.

    Every rank reports at the same boundaries (Ray Train requires all ranks to report). The
    watchdog ends this process with ``HANG_EXIT_CODE`` if no step finishes in
    ``plan.step_deadline_s`` seconds, set-up included. Returns False when the run stopped
    early because it was clearly slower than ``plan.prune_below`` (every rank decides alike,
    from the slowest rank's step time), True when every window was measured.

    ``residents``: the runners kept alive by key (``TrialPlan.resident``). A plan whose key is
    there measures on that runner (no build, no guard: it was checked when it was built); one
    whose key is not builds as usual and is kept there.
    """
    if world_size != plan.world_size:
        raise ValueError(f"plan is for world_size={plan.world_size}, running on {world_size}")
    watchdog = Watchdog(rank, plan.step_deadline_s, marker_dir=plan.marker_dir).start()
    try:
        kept = residents.get(plan.resident) if residents is not None and plan.resident else None
        if kept is not None:
            kept.plan = dataclasses.replace(
                kept.plan, warmup_steps=plan.warmup_steps, measure_steps=plan.measure_steps,
                num_windows=plan.num_windows, prune_below=plan.prune_below,
            )  # fmt: skip
            kept.reference_s = 0.0  # its no-sync reference was taken (and timed) once, at build
            setup = {"model_build_s": 0.0, "wrap_s": 0.0, "warmup_s": 0.0, "reference_s": 0.0}
            return _train_windows(kept, world_size, setup, report, watchdog, guard=None)
        runner, setup = build_runner(plan, rank, device)
        if residents is not None and plan.resident:
            residents[plan.resident] = runner
        return _train_windows(runner, world_size, setup, report, watchdog, guard=Guard())
    finally:
        watchdog.stop()


def _train_windows(
    runner: StepRunner,
    world_size: int,
    setup: dict[str, float],
    report: Callable[[dict], None],
    watchdog: Watchdog,
    guard: Guard | None,
) -> bool:
    """The warm-up steps (the first of them guarded when ``guard`` is given) and the measured
    windows of ``runner.plan``; see ``run_training``."""
    plan = runner.plan
    ends, throughputs, checked = window_ends(plan), [], {}
    # Dropout off in the guarded warm-up steps (see train_fns.guard); the last warm-up step
    # (when there are two or more) runs in train mode, so that the first measured step is
    # never the first one with dropout on.
    guarded = guarded_steps(plan.warmup_steps) if guard is not None else 0
    if guard is not None:
        runner.before_optimizer, runner.after_optimizer = guard.after_backward, guard.after_update
        runner.model.eval()
    if plan.warmup_steps == 0:  # its first step is measured (a race's after a switch): the
        reduce_over_ranks([0.0])  # ranks start it together, none waiting in it for another
    window_start = time.perf_counter()
    for step in range(plan.total_steps):
        # one profiled step per window, its last (see train_fns.timing)
        loss = _run_step_with_context(runner, step, profiled=step + 1 in ends)
        watchdog.beat()
        if step < guarded:
            guard.record_loss(loss)
        if step + 1 == guarded:
            runner.before_optimizer = runner.after_optimizer = None
            runner.model.train()
            checked = guard.figures()
            # the peak reported is of training steps, not of the guard's float64 copies;
            # the last warm-up step (if any) regrows the allocator's cache (timing.py)
            runner.timer.reset_peak()
        if step + 1 == plan.warmup_steps:
            setup["warmup_s"] = time.perf_counter() - window_start
            runner.timer.take_window()  # warm-up steps are never measured
            runner.precision.reset_num_nonfinite()
            window_start = time.perf_counter()
        if step + 1 in ends:
            wall_s = time.perf_counter() - window_start
            metrics = _window_metrics(runner, step, world_size, loss, setup, wall_s)
            metrics[m.GUARD], checked = checked, {}  # the first window carries it
            report(metrics)
            throughputs.append(plan.global_batch / metrics[m.GLOBAL_STEP_TIME_S])
            if should_prune(throughputs, plan.prune_below):
                return False
            window_start = time.perf_counter()
    return True


def should_prune(window_throughputs: list[float], threshold: float | None) -> bool:
    """Prune only after two measured windows (warm-up is never judged), and only when even
    the best window is below the threshold (the best so far minus the measured noise)."""
    if threshold is None or len(window_throughputs) < 2:
        return False
    return max(window_throughputs) < threshold
