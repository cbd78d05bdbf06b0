"""Training runs (``orchestrator.train``): the tuned config for real, resumable and resizable.

Each start of the worker group (first start, restart after a failure, elastic resize) runs
``worker.train_loop_elastic``, which hands over to ``trainer.ElasticTrainer``: it re-splits
the fixed global batch for the world size it got, loads the latest checkpoint if there is one,
and trains to exactly ``steps``. Resumption is exact:

- model and optimizer state go through ``torch.distributed.checkpoint`` (sharded for FSDP2, so
  a checkpoint written by N workers loads on M), the GradScaler state and the adaptive
  controller's state through ``train_state.json``;
- the data position is the global sample index (``TrialPlan.first_step/first_sample``), so no
  sample is trained twice or skipped, whatever the world size;
- the RNG state is a pure function of ``(seed, step, rank)``: each step reseeds, so a resumed
  step draws what the uninterrupted one drew (the checkpoint records the scheme).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train_fns import metrics as m
from train_fns.adaptive import Split
from train_fns.metrics import STATE_FILE
from train_fns.plan import TrialPlan, resplit

RNG_SCHEME = "torch.manual_seed(step_seed(seed, step, rank)) before every step"
NO_SPLIT_POLL_S = 10.0


@dataclass(frozen=True)
class RunSpec:
    """What ``orchestrator.train`` hands every worker (JSON-able through ``to_dict``)."""

    plan: dict[str, Any]
    """The tuned TrialPlan for the configured world size; re-split per actual world size."""
    steps: int
    checkpoint_every: int
    max_micro_batch: int
    on_no_split: str = "wait"
    adaptive: dict[str, Any] | None = None
    """AdaptiveAccumulation options (window, max_steps, hysteresis, allow_global_batch_change)."""
    reference_every: int = 10
    """Without accumulation, every this many steps one extra no-sync micro-step is timed to
    tell exposed communication from compute (costs one micro-step each time)."""
    grad_norm_every: int = 10
    report_every: int = 10
    progress_file: str | None = None
    """Rank 0 writes the last finished step here (a path the driver can read)."""
    entries: dict[int, dict[str, Any]] | None = None
    """The tuned entry per world size (``orchestrator.config.size_entries.run_entries``): each
    start runs
    the one for its size, fitted to its layout (``train_fns.size_fit``). None: ``plan`` at every
    size, re-split."""
    fit_context: dict[str, Any] | None = None
    """What fitting an entry reads of the run (``orchestrator.config.size_entries.fit_context``)."""
    snapshot_every: int = 0
    """An in-memory snapshot every this many steps between checkpoints (``train_fns.snapshots``;
    0: none), where the worker has a keeper and the state weighs at most ``snapshot_max_mb``."""
    snapshot_max_mb: float = 1024.0
    tune_window: int = 0
    """Tuning while training (``train_fns.online``): steps a window holds; 0: no tuning."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class NoSplit(RuntimeError):
    """The world size cannot carry the global batch exactly."""


def step_seed(seed: int, step: int, rank: int) -> int:
    return (seed * 1_000_003 + step * 4099 + rank) % (2**63)


def plan_for_world(template: TrialPlan, world: int, max_micro: int, split: Split | None = None):
    """The split for ``world`` workers: the adaptive controller's if it chose one for this
    size, the tuned one at the tuned size, else a re-split (None: no exact split exists)."""
    if split is not None and split.world_size == world:
        accumulation, micro = split.accumulation_steps, split.micro_batch
        return dataclasses.replace(
            template, world_size=world, accumulation_steps=accumulation, micro_batch=micro,
            global_batch=split.global_batch, lr=split.lr, max_grad_norm=split.max_grad_norm,
        )  # fmt: skip
    if world == template.world_size:
        return template  # the tuned split, as measured
    found = resplit(template.global_batch, world, max_micro)
    if found is None:
        return None
    accumulation, micro = found
    return dataclasses.replace(
        template, world_size=world, accumulation_steps=accumulation, micro_batch=micro
    )


def split_of(plan: TrialPlan) -> Split:
    return Split(
        plan.accumulation_steps, plan.micro_batch, plan.world_size, plan.lr,
        plan.max_grad_norm if plan.max_grad_norm is not None else 1.0,
    )  # fmt: skip


def save_checkpoint(runner: Any, state: dict[str, Any], directory: Path) -> None:
    """Model + optimizer through DCP (every rank writes its shard), run state by rank 0."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(runner.model, runner.optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(directory))
    if runner.rank == 0:
        (directory / STATE_FILE).write_text(json.dumps(state, indent=1))


def load_checkpoint(runner: Any, directory: Path) -> dict[str, Any]:
    """Load what ``save_checkpoint`` wrote, resharded to this world size; returns the run state.

    A parameter that never had a gradient (an expert not routed to yet) has no optimizer state
    in the checkpoint, while a fresh optimizer's state dict names one for every parameter: it
    is loaded partially and those parameters are left without state, as the run that saved it
    had them (AdamW's step count then matches an uninterrupted run)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    model_sd, optim_sd = get_state_dict(runner.model, runner.optimizer)
    state_dict = {"model": model_sd, "optim": optim_sd}
    saved = dcp.FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    stateless = [fqn for fqn in optim_sd.get("state", {})
                 if not any(key.startswith(f"optim.state.{fqn}.") for key in saved)]  # fmt: skip
    for fqn in stateless:
        del optim_sd["state"][fqn]
    # strict everywhere else: only where parameters had no state may it be partial
    dcp.load(state_dict, checkpoint_id=str(directory),
             planner=DefaultLoadPlanner(allow_partial_load=bool(stateless)))  # fmt: skip
    set_state_dict(
        runner.model,
        runner.optimizer,
        model_state_dict=state_dict["model"],
        optim_state_dict=state_dict["optim"],
        options=StateDictOptions(strict=not stateless),
    )
    return json.loads((directory / STATE_FILE).read_text())


def wait_for_split(spec: RunSpec, template: TrialPlan, world: int, report: Any) -> None:
    """No exact split for this world size: fail, or wait (the elastic monitor restarts the
    group at another size when the cluster changes), saying so."""
    message = (
        f"world size {world} cannot carry global_batch={template.global_batch} exactly "
        f"(micro-batch at most {spec.max_micro_batch})"
    )
    if spec.on_no_split == "fail":
        raise NoSplit(f"{message}; rerun with --workers sizes that divide it")
    while True:
        event = {"kind": "no_split", "message": f"{message}; waiting for a size that has one"}
        report({m.ROWS: [{m.EVENTS: [event], m.WORLD_SIZE: world}]})
        time.sleep(NO_SPLIT_POLL_S)


def read_state(directory: Path) -> dict[str, Any]:
    """The run state a checkpoint holds (step, data position, split, scaler, controller)."""
    return json.loads((directory / STATE_FILE).read_text())


def temp_checkpoint_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="commtune-ckpt-"))
