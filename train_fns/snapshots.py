"""In-memory snapshots between checkpoints, so that a lost node re-does few steps.

A checkpoint goes through Ray Train's storage: every rank writes its shard and the controller
registers it (seconds each time), so it is taken every ``train.checkpoint_every`` steps and a
failure re-does up to that many. A snapshot is cheaper: the full model and optimizer state,
gathered to rank 0 (a collective under FSDP2), serialised and handed to a keeper on the
driver's node (``orchestrator.train.snapshots``), which a lost worker node cannot take with
it. A restart loads whichever of the two is newer. The full state loads at any world size
(rank 0 broadcasts it, torch shards it), as a resharded checkpoint does; the keeper lives with
the driver, so a resumed driver starts from the checkpoint.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from train_fns.loop import StepRunner


class KeeperUnreachable(RuntimeError):
    """The keeper did not answer: this start goes on without snapshots, from its checkpoint."""


class Keeper(Protocol):
    """Where rank 0 sends snapshots and a restart's rank 0 asks for the newest one."""

    def ready(self) -> bool:
        """Whether the previous snapshot has arrived: while it is on its way the next is held
        back (a slow link skips snapshots rather than pile them up or hold the step)."""

    def put(self, step: int, data: bytes) -> None:
        """Send ``data`` as the snapshot at ``step`` without waiting for it to arrive."""

    def latest(self, than_step: int) -> tuple[int, bytes] | None:
        """The newest snapshot if it is newer than ``than_step`` (None: none). Puts from an
        earlier group that arrive after this are ignored. Raises KeeperUnreachable."""


SENT, HELD_BACK = "sent", "held back"
"""What ``take`` did with a snapshot on rank 0."""


def state_bytes(runner: StepRunner) -> int:
    """What a snapshot of this model and its optimizer weighs, from the global shapes (the
    same on every rank, so every rank decides alike): parameters and optimizer state (AdamW
    keeps two tensors a parameter), both in the parameters' types."""
    params = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    return 3 * params


def _options(**extra: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **extra)


def take(runner: StepRunner, state: dict[str, Any], keeper: Keeper, step: int) -> str | None:
    """Every rank: gather the full state; rank 0 sends it, with the run's ``state`` (step,
    data position, split, scaler, controller: what a checkpoint's train_state.json holds).
    Not before the optimizer has state (every step so far skipped as non-finite): gathering
    would make torch initialise it with a zero step, which the uninterrupted run never took
    (the same answer on every rank: None). Rank 0 returns SENT or HELD_BACK (the previous
    snapshot still on its way); the other ranks SENT."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    if not runner.optimizer.state:
        return None
    options = _options(cpu_offload=True)
    model_sd, optim_sd = get_state_dict(runner.model, runner.optimizer, options=options)
    if runner.rank != 0:
        return SENT
    if not keeper.ready():
        return HELD_BACK
    buffer = io.BytesIO()
    torch.save({"model": model_sd, "optim": optim_sd, "state": state}, buffer)
    keeper.put(step, buffer.getvalue())
    return SENT


@dataclass
class Snapshot:
    """A snapshot found newer than the checkpoint: the same on every rank but its tensors."""

    state: dict[str, Any]
    """The run state (what a checkpoint's train_state.json holds)."""
    stateful: list[str]
    """The parameters (by name) with optimizer state: one never given a gradient yet (an
    expert not routed to) has none, and must have none after the load, as before it."""
    tensors: dict[str, Any] | None
    """Model and optimizer state: rank 0's only (it broadcasts them in ``load``)."""


def newer(keeper: Keeper | None, rank: int, than_step: int) -> tuple[Snapshot | None, bool]:
    """The keeper's snapshot if it is newer than the checkpoint's step, and whether this
    start can send snapshots (a keeper that did not answer: none this start). Rank 0 asks and
    broadcasts what every rank needs over the gloo side group (no NCCL communicator may exist
    before the entry's variables are set: ``sizes.apply_env``). Without a keeper, no rank has
    one: nothing to agree on."""
    from train_fns.ranks import side_group

    if keeper is None:
        return None, False
    found, usable = None, True
    if rank == 0:
        try:
            latest = keeper.latest(than_step)
        except KeeperUnreachable as e:
            print(f"snapshots: off for this start, {e}: resuming from the checkpoint", flush=True)
            latest, usable = None, False
        if latest is not None:
            tensors = torch.load(io.BytesIO(latest[1]), weights_only=True)
            found = Snapshot(tensors["state"], sorted(tensors["optim"]["state"]), tensors)
    group = side_group()
    if group is not None:
        box = [(usable, None if found is None else (found.state, found.stateful))]
        dist.broadcast_object_list(box, src=0, group=group)
        usable, known = box[0]
        if rank != 0 and known is not None:
            found = Snapshot(*known, tensors=None)
    return found, usable


def load(runner: StepRunner, snapshot: Snapshot) -> None:
    """Every rank: load the snapshot (its tensors on rank 0), resharded to this group by
    torch. Model and optimizer each in their own call: a combined one takes an empty model
    dict (every rank but 0's) for "optimizer only". The model strictly; the optimizer allows
    the parameters the snapshot has no state for, and leaves them without."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    model, optimizer = runner.model, runner.optimizer
    names = [n for g in get_optimizer_state_dict(model, optimizer)["param_groups"]
             for n in g["params"]]  # fmt: skip
    params = [p for g in optimizer.param_groups for p in g["params"]]  # the same order
    stateless = [p for n, p in zip(names, params, strict=True) if n not in snapshot.stateful]
    many = dist.is_initialized() and dist.get_world_size() > 1
    tensors = snapshot.tensors or {"model": {}, "optim": {}}
    partial = _options(broadcast_from_rank0=many, strict=not stateless)
    set_optimizer_state_dict(model, optimizer, tensors["optim"], options=partial)
    set_model_state_dict(model, tensors["model"], options=_options(broadcast_from_rank0=many))
    for param in stateless:  # the load gave them a fresh state; the saved run had none
        optimizer.state.pop(param, None)
