"""One worker's training run between two starts of its worker group (see ``elastic``)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from train_fns import metrics as m
from train_fns import snapshots
from train_fns.adaptive import AdaptiveAccumulation, Split
from train_fns.commsplit import exposed_comm, nosync_from_accumulation
from train_fns.gradients import layer_grad_norms
from train_fns.hold import hold
from train_fns.loop import StepRunner, build_runner
from train_fns.online import Judge, OnlineTuning
from train_fns.plan import TrialPlan
from train_fns.ranks import reduce_over_ranks, reduce_tensor
from train_fns.restart import (
    RNG_SCHEME,
    RunSpec,
    load_checkpoint,
    plan_for_world,
    read_state,
    save_checkpoint,
    split_of,
    step_seed,
    temp_checkpoint_dir,
    wait_for_split,
)
from train_fns.size_fit import Fitted, apply_env, fit, gathered_layout, plan_of
from train_fns.watchdog import Watchdog

PHASE_COLUMNS = (m.DATA_S, m.OPTIM_S, m.EXPOSED_COMM_S, m.COMPUTE_S)
"""A step's figures from its phase times: measured on profiled steps only (``_profiled``)."""

Report = Callable[[dict[str, Any], Path | None], None]
"""``report(metrics, checkpoint_dir)``: every rank calls it at the same steps."""


class Marks:
    """Seconds between named points of a worker group's start, from ``since`` (where a
    restart's time goes: imports, state, plan, build, restore)."""

    def __init__(self, since: float | None) -> None:
        self.since = since if since is not None else time.time()
        self.last = self.since
        self.seconds: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.time()
        self.seconds[name] = round(now - self.last, 3)
        self.last = now


class ElasticTrainer:
    """Re-split, restore, train to ``spec.steps``, checkpoint; report every step.

    Every step's row has its wall-clock time and loss; one step in ``spec.reference_every`` is
    profiled and adds its phases, exposed communication and compute (``_profiled``). The
    adaptive controller observes those steps only, so its ``window`` counts profiled steps."""

    def __init__(
        self,
        spec: RunSpec,
        rank: int,
        world: int,
        device: torch.device,
        report: Report,
        checkpoint_dir: Path | None,
        keeper: snapshots.Keeper | None = None,
        setup: Marks | None = None,
        judge: Judge | None = None,
    ) -> None:
        """``keeper``: where snapshots go (None: checkpoints only); ``setup``: the start's
        phases so far, from the worker function's launch (the start event says where a
        restart's seconds went); ``judge``: rank 0's, with ``spec.tune_window`` (tuning
        while training, ``train_fns.online``)."""
        self.spec, self.rank, self.world, self.device = spec, rank, world, device
        self.report, self.checkpoint_dir, self.keeper = report, checkpoint_dir, keeper
        self.setup = setup or Marks(None)
        self.resumed_from: str | None = None
        self.snapshot_every = 0
        self.snapshot_off: str | None = None
        self.state_mb = 0.0
        self.template = TrialPlan.from_dict(spec.plan)
        self.state: dict[str, Any] = {}
        self.reference_s: float | None = None
        self.events: list[dict[str, Any]] = []
        self.layer_norms: dict[str, float] = {}
        self.pending: list[dict[str, Any]] = []
        self.fitted: Fitted | None = None
        self.tuning = None
        if spec.tune_window:
            self.tuning = OnlineTuning(judge if rank == 0 else None, world, spec.tune_window)

    def run(self) -> None:
        saved = self._saved_state()
        snapshot, usable = snapshots.newer(self.keeper, self.rank, saved.get("step", 0))
        if not usable and self.keeper is not None:
            self.keeper, self.snapshot_off = None, "keeper"
        self.resumed_from = "snapshot" if snapshot else "checkpoint" if saved else None
        saved = snapshot.state if snapshot else saved
        self.setup.mark("state")
        plan = self._plan(saved)
        self.setup.mark("plan")
        runner, _ = build_runner(plan, self.rank, self.device)
        self.setup.mark("build")
        self.adaptive = self._controller(plan, saved)
        if snapshot:
            snapshots.load(runner, snapshot)
        elif self.checkpoint_dir is not None:
            load_checkpoint(runner, self.checkpoint_dir)
        runner.precision.load_scaler_state(saved.get("scaler"))
        self.setup.mark("restore")
        self.state = {"step": saved.get("step", 0), "samples_seen": saved.get("samples_seen", 0)}
        self.snapshot_every = self._snapshot_every(runner)
        if self.tuning is not None:  # the split this size's tuning starts from, or decided
            self.tuning.begin(runner, self.state["step"], self.state["samples_seen"])
        self.events.append(self._start_event(runner.plan, saved))
        self._take_tuning_events()
        watchdog = Watchdog(self.rank, plan.step_deadline_s, marker_dir=None).start()
        if self.tuning is not None:  # a bucket switch's check runs two passes between steps
            self.tuning.beat = watchdog.beat
        try:
            for step in range(self.state["step"], self.spec.steps):
                hold(f"step-{step}")  # a test's kill point; a no-op in real runs
                self._train_step(runner, step)
                watchdog.beat()
        finally:
            watchdog.stop()

    def _snapshot_every(self, runner: StepRunner) -> int:
        """Steps between snapshots in this start: none without a keeper (none configured, or
        it did not answer: ``snapshot_off`` is already "keeper"), or where the state weighs
        more than ``spec.snapshot_max_mb`` (the start event says which)."""
        self.state_mb = snapshots.state_bytes(runner) / 2**20
        if self.snapshot_off is None and (self.keeper is None or not self.spec.snapshot_every):
            self.snapshot_off = "train.snapshot_every"
        elif self.snapshot_off is None and self.state_mb > self.spec.snapshot_max_mb:
            self.snapshot_off = "train.snapshot_max_mb"
        return 0 if self.snapshot_off else self.spec.snapshot_every

    def _saved_state(self) -> dict[str, Any]:
        return {} if self.checkpoint_dir is None else read_state(self.checkpoint_dir)

    def _plan(self, saved: dict[str, Any]) -> TrialPlan:
        """This world size's split (the adaptive controller's if it chose one for it), placed
        at the saved data position."""
        adaptive = saved.get("adaptive") or {}
        split = Split(**adaptive["split"]) if adaptive.get("split") else None
        base = self._entry_plan() if self.spec.entries else self.template
        plan = base and plan_for_world(base, self.world, self.spec.max_micro_batch, split)
        if plan is None:
            wait_for_split(self.spec, self.template, self.world, self._report_wait)
        return dataclasses.replace(
            plan, first_step=saved.get("step", 0), first_sample=saved.get("samples_seen", 0)
        )

    def _entry_plan(self) -> TrialPlan | None:
        """The tuned entry for this world size fitted to the layout the group got, its
        variables set before the first NCCL collective; None where no split exists."""
        entries = {int(size): entry for size, entry in (self.spec.entries or {}).items()}
        layout = gathered_layout(self.world)
        self.fitted = fit(entries, layout, self.spec.fit_context or {})
        if self.fitted.split is None:
            return None
        names = {name for entry in entries.values() for name in entry.get("env") or {}}
        self.fitted = apply_env(os.environ, self.fitted, names)
        return plan_of(self.template, self.fitted, self.world)

    def _report_wait(self, metrics: dict[str, Any]) -> None:
        self.report(metrics, None)

    def _controller(self, plan: TrialPlan, saved: dict[str, Any]) -> AdaptiveAccumulation | None:
        if self.spec.adaptive is None:
            return None
        controller = AdaptiveAccumulation(
            split_of(plan), max_micro_batch=self.spec.max_micro_batch, **self.spec.adaptive
        )
        if saved.get("adaptive"):
            controller.load_state(saved["adaptive"])
            controller.split = split_of(plan)  # the world size may have changed since
        return controller

    def _start_event(self, plan: TrialPlan, saved: dict[str, Any]) -> dict[str, Any]:
        return {
            "kind": "start",
            "world_size": self.world,
            "resumed_from_step": saved.get("step") if saved else None,
            "checkpoint_world_size": saved.get("world_size"),
            "accumulation_steps": plan.accumulation_steps,
            "micro_batch": plan.micro_batch,
            "global_batch": plan.global_batch,
            "started_at": time.time(),
            "launched_at": self.setup.since,
            "setup_s": self.setup.seconds,
            "resumed_from": self.resumed_from,
            "snapshot_every": self.snapshot_every,
            "snapshot_off": self.snapshot_off,
            "state_mb": round(self.state_mb, 3),
            **self._entry_fields(),
        }

    def _entry_fields(self) -> dict[str, Any]:
        """Which tuned entry this start runs, what it drops here, what the search measured."""
        fitted = self.fitted
        if fitted is None:
            return {}
        dropped = [{"key": k, "value": v, "why": why} for k, v, why in fitted.dropped]
        return {"entry_size": fitted.size, "dropped": dropped,
                "entry_line": fitted.line(self.world),
                "searched_samples_per_s": fitted.samples_per_s}  # fmt: skip

    def _train_step(self, runner: StepRunner, step: int) -> None:
        plan = runner.plan
        profiled = self._profiled(step)
        if plan.accumulation_steps == 1 and profiled:
            self.reference_s = runner.nosync_reference(step)
        torch.manual_seed(step_seed(plan.seed, step, self.rank))
        probe = step % self.spec.grad_norm_every == 0
        runner.before_optimizer = self._probe_gradients if probe else None
        if self.tuning is not None:  # a profiled or probed step syncs: it is not timed
            self.tuning.start_step(runner.device, profiled or probe)
        start = time.perf_counter()
        loss = runner.run_step(step, profiled)
        times = runner.timer.take_window()
        seen = self.state["samples_seen"] + plan.global_batch
        self.state = {"step": step + 1, "samples_seen": seen}
        # the loss stays on the device until its batch is reported (``_settle_losses``)
        metrics = self._metrics(runner, step, loss.detach(), start)
        if profiled:
            comm, compute = reduce_over_ranks(self._comm_split(times, plan))  # every rank alike
            metrics.update(self._phase_metrics(times, comm, compute))
            if self.adaptive is not None:
                self._adapt(runner, comm, compute, step)
        if self.tuning is not None:
            self.tuning.after_step(runner, step + 1, seen)
            self._take_tuning_events()
        metrics[m.EVENTS] = self.events
        self.events = []
        self._report_step(runner, metrics)

    def _take_tuning_events(self) -> None:
        if self.tuning is not None:
            self.events.extend(self.tuning.take_events())

    def _profiled(self, step: int) -> bool:
        """Whether ``step`` is timed phase by phase: one step in ``reference_every``, the one
        whose no-sync reference is taken just before it (no accumulation). On CUDA a profiled
        step waits for the device at each phase boundary, holding back the host and FSDP2's
        prefetch (``train_fns.timing``): profiling every step would make every step slower
        than it needs to be. The others are timed by wall-clock only. Decided by the step's
        number, so every rank decides alike (the split is all-reduced)."""
        return step % self.spec.reference_every == 0

    def _comm_split(self, times: dict[str, float], plan: TrialPlan) -> tuple[float, float]:
        """Exposed communication and compute of this step, measured: the syncing micro-step
        against one without sync (an accumulation micro-step, or the periodic reference)."""
        accumulation = plan.accumulation_steps
        if accumulation > 1:
            nosync = nosync_from_accumulation(times["fwd_bwd"], times["sync_micro"], accumulation)
        elif self.reference_s is not None:
            nosync = self.reference_s
        else:
            return 0.0, times["fwd_bwd"]
        return exposed_comm(times["sync_micro"], nosync, times["fwd_bwd"])

    def _metrics(self, runner: StepRunner, step: int, loss: Any, start: float) -> dict[str, Any]:
        """The row every step gets; its step time is wall-clock (a profiled step's holds its
        phase syncs too). ``loss``: this rank's, a device tensor until ``_settle_losses``. The
        phase columns (``_phase_metrics``) are None, so blank in progress.csv, on the steps
        that were not profiled: no figure is carried over from another step (it could predate
        a re-split)."""
        plan, precision = runner.plan, runner.precision
        step_s = time.perf_counter() - start
        metrics = {
            m.STEP: step + 1,
            m.WALL_TIME: time.time(),
            m.LOSS: loss,
            m.STEP_TIME_S: step_s,
            m.SAMPLES_PER_S: plan.global_batch / step_s,
            m.WORLD_SIZE: self.world,
            m.ACCUMULATION_STEPS: plan.accumulation_steps,
            m.MICRO_BATCH: plan.micro_batch,
            m.GLOBAL_BATCH: plan.global_batch,
            m.SAMPLES_SEEN: self.state["samples_seen"],
            **dict.fromkeys(PHASE_COLUMNS),  # a profiled step's replace them
            m.GRAD_NORM: precision.last_grad_norm,
            m.NUM_NONFINITE: precision.num_nonfinite(),
            m.LOSS_SCALE: precision.loss_scale(),
            m.LR: runner.optimizer.param_groups[0]["lr"],
        }
        if runner.before_optimizer is not None:
            metrics[m.LAYER_GRAD_NORMS] = self.layer_norms
        return metrics

    @staticmethod
    def _phase_metrics(times: dict[str, float], comm: float, compute: float) -> dict[str, float]:
        """A profiled step's phases: this rank's data wait and optimizer, and the exposed
        communication and compute averaged over ranks."""
        return {m.DATA_S: times["data"], m.OPTIM_S: times["optim"], m.EXPOSED_COMM_S: comm,
                m.COMPUTE_S: compute}  # fmt: skip

    def _probe_gradients(self, runner: StepRunner) -> None:
        """Per-layer gradient norms of this step, before clipping (every rank takes part)."""
        self.layer_norms = layer_grad_norms(runner.model)

    def _adapt(self, runner: StepRunner, comm: float, compute: float, step: int) -> None:
        change = self.adaptive.observe(comm, compute)
        if change is None:
            return
        split, ratio = change
        old = runner.plan
        new = dataclasses.replace(
            old, accumulation_steps=split.accumulation_steps, micro_batch=split.micro_batch,
            global_batch=split.global_batch, lr=split.lr, max_grad_norm=split.max_grad_norm,
            first_step=step + 1, first_sample=self.state["samples_seen"],
        )  # fmt: skip
        runner.plan = new
        runner.precision.max_grad_norm = split.max_grad_norm
        for group in runner.optimizer.param_groups:
            group["lr"] = split.lr
        self.events.append({
            "kind": "resplit", "step": step + 1, "ratio": ratio,
            "from": [old.accumulation_steps, old.micro_batch, old.global_batch],
            "to": [new.accumulation_steps, new.micro_batch, new.global_batch],
            "lr": split.lr, "max_grad_norm": split.max_grad_norm,
        })  # fmt: skip

    def _report_step(self, runner: StepRunner, metrics: dict[str, Any]) -> None:
        """Steps are reported in batches (a Ray Train report waits for the controller, far
        longer than a small step); checkpoints at their steps, with the batch."""
        step = self.state["step"]
        self._mark_progress(step)
        self.pending.append(metrics)
        final = step == self.spec.steps
        checkpoint = step % self.spec.checkpoint_every == 0 or final
        if checkpoint or not step % self.spec.report_every:
            self._settle_losses()
        if self.snapshot_every and not final and (checkpoint or step % self.snapshot_every == 0):
            self._snapshot(runner, step, metrics)
        if not checkpoint and step % self.spec.report_every:
            return
        batch, self.pending = {m.ROWS: self.pending}, []
        if not checkpoint:
            self.report(batch, None)
            return
        directory = temp_checkpoint_dir()
        try:
            save_checkpoint(runner, self._checkpoint_state(runner, metrics), directory)
            metrics[m.CHECKPOINT_STEP] = step
            self.report(batch, directory)
        finally:
            if dist.is_initialized():
                dist.barrier()  # every rank's shard is persisted before any temp dir goes
            shutil.rmtree(directory, ignore_errors=True)

    def _settle_losses(self) -> None:
        """The pending rows' losses, each the mean over ranks: one copy from the device and
        one all-reduce over the side group per reported batch, not a host sync and a gloo
        round trip (1 ms at 16 ranks, 5 to 15 ms at 128) in every step. Every rank calls it at
        the same steps (a report's or a checkpoint's, by step number)."""
        rows = [row for row in self.pending if isinstance(row[m.LOSS], torch.Tensor)]
        if not rows:
            return
        local = torch.stack([row[m.LOSS].to(torch.float64) for row in rows])
        for row, loss in zip(rows, reduce_tensor(local, "mean").tolist(), strict=True):
            row[m.LOSS] = loss

    def _snapshot(self, runner: StepRunner, step: int, metrics: dict[str, Any]) -> None:
        """A snapshot at ``step``; at a checkpoint's step too: its registration needs every
        rank's report, so a node lost during it leaves the previous checkpoint the newest."""
        started = time.perf_counter()
        state = self._checkpoint_state(runner, metrics)
        done = snapshots.take(runner, state, self.keeper, step)
        if done == snapshots.SENT:
            metrics[m.SNAPSHOT_S] = time.perf_counter() - started
        elif done == snapshots.HELD_BACK:
            metrics[m.SNAPSHOT_HELD_BACK] = True

    def _mark_progress(self, step: int) -> None:
        """Rank 0 notes each finished step where the driver can read it after a failure (the
        steps re-done by a recovery are counted from it, not from the last batch)."""
        if self.rank == 0 and self.spec.progress_file:
            Path(self.spec.progress_file).write_text(str(step))

    def _checkpoint_state(self, runner: StepRunner, metrics: dict[str, Any]) -> dict[str, Any]:
        """The run state saved with the weights; ``last_loss`` (the saved step's loss) lets a
        ``--resume`` whose checkpoint already holds the last step close the run without Ray."""
        return {
            **self.state,
            "last_loss": _number(metrics.get(m.LOSS)),
            "world_size": self.world,
            "split": [runner.plan.accumulation_steps, runner.plan.micro_batch],
            "global_batch": runner.plan.global_batch,
            "scaler": runner.precision.scaler_state(),
            "adaptive": None if self.adaptive is None else self.adaptive.state(),
            "rng": RNG_SCHEME,
            "saved_at": time.time(),
        }


def _number(value: Any) -> Any:
    """A figure as a number: a loss not yet settled is this rank's, read from the device (a
    snapshot between reports: the snapshot's state wants a number, not a device tensor)."""
    return float(value) if isinstance(value, torch.Tensor) else value
