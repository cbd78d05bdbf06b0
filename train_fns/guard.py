"""Correctness guard, worker side: what a configuration computed in its warm-up steps.

Every configuration of a study starts from the same seeded weights and the same data stream,
and every exact knob (NCCL variables, buckets, sharding, accumulation split, checkpointing)
must give the same losses up to summation order. The warm-up steps (all but the last, when
there are two or more: the first measured step must not be the first with dropout on) run
with dropout off (``model.eval()``): dropout masks are drawn per rank and per micro-batch, so
they depend on the split and would differ by more than any summation order; the warm-up steps
are never timed, so switching it off there costs the measurement nothing. For those steps the
guard records the global mean loss and the global gradient norm (after the all-reduce, before
the optimizer) and how far the optimizer step moved the parameters along that gradient; the
driver compares them with the baseline's (``orchestrator.search.correctness``).

``corrupt`` (``--inject-faults N:corrupt``) perturbs one rank's gradients after the all-reduce
of the first step, as a corrupting transport would: the step is not slower, only wrong.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from train_fns.gradients import replicas
from train_fns.ranks import reduce_over_ranks, reduce_tensor

TOLERANCES = {"fp32": 1e-3, "bf16": 1e-2, "fp16": 1e-2}
"""Largest relative difference from the baseline of a warm-up loss or gradient norm, by the
study's precision (every configuration of a study shares it): the driver's check
(``orchestrator.search.correctness``, whose docstring says how each was measured), and the
relative distance of a bucket switch's gradients while tuning online (``train_fns.online``)."""
TOLERANCE = TOLERANCES["fp32"]
LOSSY_TOLERANCES = {
    "ddp.comm_hook=fp16": 1e-2,
    "ddp.comm_hook=bf16": 1e-2,
    "fsdp.reduce_dtype=fp16": 1e-2,
    "fsdp.reduce_dtype=bf16": 1e-2,
}
"""Each lossy knob's declared tolerance (``TrialPlan.lossy`` names them): a configuration that
runs one is judged against the larger of it and its precision's; measured as
``orchestrator.search.correctness`` says."""


def tolerance_for(plan: Any) -> float:
    """The guard's tolerance for ``plan`` (a ``TrialPlan``): its precision's, or the declared
    tolerance of a lossy knob it runs when that is larger."""
    base = TOLERANCES.get(plan.precision, max(TOLERANCES.values()))
    return max([base, *(LOSSY_TOLERANCES[knob] for knob in plan.lossy())])


CORRUPT_SCALE = 0.5
"""The injected perturbation: Gaussian noise of this many times each gradient's RMS."""


def _local(grad: Tensor) -> Tensor:
    """A gradient's local part: FSDP2 gradients are sharded DTensors."""
    return grad.to_local() if hasattr(grad, "to_local") else grad


def _finite_or_inf(figure: Tensor, skipped: bool) -> Tensor:
    """``figure`` with inf where it is not finite, or everywhere on a ``skipped`` step."""
    inf = torch.full_like(figure, float("inf"))
    return inf if skipped else torch.where(torch.isfinite(figure), figure, inf)


def _sharded(model: nn.Module) -> bool:
    return any(p.grad is not None and hasattr(p.grad, "to_local") for p in model.parameters())


def corrupt_gradients(model: nn.Module) -> None:
    """Add noise to this rank's (already reduced) gradients, in place."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                grad = _local(p.grad)
                grad.add_(torch.randn_like(grad) * CORRUPT_SCALE * grad.pow(2).mean().sqrt())


def guarded_steps(warmup_steps: int) -> int:
    """How many warm-up steps the guard records: all but the last when there are two or more
    (the first measured step must not be the first with dropout on), else the one. Each
    guarded step records its update too (``Guard.after_update``), so a fault on the
    optimizer's side shows from the first step on, not only one in the gradients."""
    return max(1, warmup_steps - 1)


def layouts(world_size: int) -> tuple[int, ...]:
    """The shard counts a gradient may be split into: every rank (FSDP), and a node's ranks
    (HSDP shards within a node) where every node holds as many ranks, more than one. Agreed
    over the side group: on an uneven placement (8 + 4) ranks see different local sizes, and
    figures of different shapes would hang the guard's reduction."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    most, neg_least = reduce_over_ranks([local, -local], "max")
    even = most == -neg_least and 1 < local < world_size
    return tuple(sorted({world_size} | ({local} if even else set())))


SQUARES_CHUNK_ELEMENTS = 1 << 20
"""Elements of a gradient squared in float64 at a time (8 MiB, twice: the copy and its
square): a whole large gradient in float64 (an embedding's, 4 times its bf16 size) would need
more memory than training does, and the guard runs in the warm-up of a model that fits."""


def row_squares(grad: Tensor, other: Tensor | None = None) -> Tensor:
    """The float64 sum of squares of each dim-0 row of ``grad`` (a 0-d one: one row; an FSDP
    rank's empty shard: none), or of its products with ``other``'s same elements, a bounded
    number of rows at a time (``SQUARES_CHUNK_ELEMENTS``: up to three float64 temporaries of it)."""
    count = grad.shape[0] if grad.dim() else 1
    rows = grad.detach().reshape(count, grad.numel() // count if count else 0)  # an empty shard
    by = None if other is None else other.detach().reshape(rows.shape)
    per = max(1, SQUARES_CHUNK_ELEMENTS // max(1, rows.shape[1]))

    def part(i: int) -> Tensor:
        chunk = rows[i : i + per].double()
        return (chunk.pow(2) if by is None else chunk * by[i : i + per].double()).sum(1)

    parts = [part(i) for i in range(0, rows.shape[0], per)]
    return torch.cat(parts) if parts else rows.new_zeros(0, dtype=torch.float64)


def shard_squares(
    grad: Tensor, count: int, device: torch.device, rows: Tensor | None = None
) -> Tensor:
    """The squares of each of ``count`` dim-0 chunks of a full gradient, as FSDP2 chunks it
    (``torch.chunk``: ceil-sized, the last ones short or empty); ``rows``: its
    ``row_squares`` when already taken."""
    rows = row_squares(grad) if rows is None else rows
    size = -(-rows.numel() // count)  # ceil
    index = torch.arange(rows.numel(), device=rows.device) // size
    return torch.zeros(count, dtype=torch.float64, device=device).index_add_(0, index, rows)


def _shard_of(grad: Tensor) -> tuple[int, int]:
    """(shard count, this rank's shard index) of a sharded DTensor gradient."""
    mesh = grad.device_mesh
    dim = next(i for i, p in enumerate(grad.placements) if p.is_shard())
    return mesh.size(dim), mesh.get_local_rank(dim)


@dataclass
class Guard:
    """The warm-up steps' losses, gradient norms and parameter updates, kept on the device
    until the end.

    Beside the global norm, each shard's: under FSDP a corrupt rank moves the global norm by
    about 1/N of its own change (below bf16's tolerance from 13 ranks on), but its own shard's
    norm by all of it. Sharded gradients give their shard; full (replicated) ones give every
    chunk of each layout FSDP or HSDP could shard them into, so a DDP baseline has the figure
    each FSDP candidate's shard is judged against.

    The update: how far the optimizer step moved the parameters along the step's gradient,
    the sum of gradient x (parameters after - parameters before), globally and per shard;
    negative, about -lr x the gradient's L1 norm for Adam's first step. A wrong first update
    (its size, or its direction along the gradient) cannot show in the step's loss or
    gradients, only in the next step's; this figure shows it in the same step, so a warm plan
    needs no second guarded step for it (``orchestrator.search.group_run``). What the first
    update cannot show either way (Adam's moments, which it starts) is not checked by one
    guarded step nor by two. Taken along the gradient, not as the change of the parameters'
    squares: that sum cancels to a small remainder which a sign flip of a near-zero gradient
    (Adam's first step moves every weight by about lr, whatever its gradient's size) moved
    beyond bf16's tolerance in tests/dist/test_guard.py."""

    losses: list[Tensor] = field(default_factory=list)
    squares: list[Tensor] = field(default_factory=list)
    shards: list[dict[int, Tensor]] = field(default_factory=list)
    updates: list[Tensor] = field(default_factory=list)
    update_shards: list[dict[int, Tensor]] = field(default_factory=list)
    counts: tuple[int, ...] = ()
    """The layouts full gradients are chunked into (``layouts``), agreed at the first step."""
    sharded: bool = False
    _before: tuple[list[tuple[Tensor, Tensor]], float, Tensor, dict[int, Tensor]] | None = None
    """The (gradient, parameter) pairs the optimizer is about to step, the loss scale, and the
    sums of gradient x parameter before it does. The gradients are held, not read again from
    the parameters: an optimizer may free them in its step (GradScaler unscales these same
    tensors in place)."""

    def _sums(self, pairs: list[tuple[Tensor, Tensor | None]], device: torch.device) -> tuple:
        """The float64 sum of a x b over ``pairs`` (a x a where b is None: squares), and per
        shard of each layout (``counts``) as this rank holds it: its own shard of a sharded
        tensor, every chunk of a full one."""
        total = torch.zeros((), dtype=torch.float64, device=device)
        shards: dict[int, Tensor] = {}
        for tensor, other in pairs:
            rows = row_squares(_local(tensor), None if other is None else _local(other))
            local = rows.sum() / replicas(tensor)
            total += local
            if hasattr(tensor, "to_local"):
                count, index = _shard_of(tensor)
                vec = shards.setdefault(count, torch.zeros(count, dtype=torch.float64,
                                                           device=device))  # fmt: skip
                vec[index] += local
            else:
                for count in self.counts:
                    chunk = shard_squares(tensor, count, device, rows)
                    shards[count] = shards[count] + chunk if count in shards else chunk
        return total, shards

    def after_backward(self, runner: Any) -> None:
        """``StepRunner.before_optimizer`` in the warm-up: gradients are reduced, the
        optimizer has not run; the first step is where ``corrupt`` strikes."""
        model = runner.model
        if not self.squares and runner.fault == "corrupt":
            corrupt_gradients(model)
        self.sharded = self.sharded or _sharded(model)
        device = runner.device
        self.counts = self.counts or layouts(runner.plan.world_size)  # every rank, once
        params = [p for p in model.parameters() if p.grad is not None]
        total, shards = self._sums([(p.grad, None) for p in params], device)
        # fp16: the gradients are still multiplied by GradScaler's scale (2^16 at first), so
        # the norm is judged unscaled; a step whose scaled gradients overflowed stays inf, the
        # step GradScaler skips, and the driver compares it as such (correctness.check).
        scale = runner.precision.loss_scale() or 1.0  # a host sync: warm-up is never timed
        self.squares.append(total / scale**2)
        self.shards.append({count: vec / scale**2 for count, vec in shards.items()})
        pairs = [(p.grad, p) for p in params]
        self._before = (pairs, scale, *self._sums(pairs, device))

    def after_update(self, runner: Any) -> None:
        """``StepRunner.after_optimizer`` in the warm-up, before the gradients are freed: the
        step's update along its gradient. GradScaler's step has unscaled the gradients in
        place, so the sums before it are unscaled here. A step GradScaler skipped (it lowers
        its scale on every rank alike, where an overflow shows in one shard's gradients only)
        gives inf in every figure, as its gradient norm does, and is judged alike; so does one
        whose update is not finite (NaN would drop out of gloo's max)."""
        if self._before is None:
            return
        pairs, scale, before, before_shards = self._before
        self._before = None
        skipped = (runner.precision.loss_scale() or 1.0) < scale  # fused AdamW: still scaled
        after, after_shards = self._sums(pairs, runner.device)
        self.updates.append(_finite_or_inf(after - before / scale, skipped))
        self.update_shards.append({
            count: _finite_or_inf(vec - before_shards[count] / scale, skipped)
            for count, vec in after_shards.items()
        })  # fmt: skip

    def record_loss(self, loss: Tensor) -> None:
        self.losses.append(loss.detach().double())

    def figures(self) -> dict[str, Any]:
        """Global figures; every rank calls this at the same step (collectives). Losses are
        the mean over ranks; a sharded gradient's squares add up over ranks (each shard once),
        a replicated one should be equal on every rank, so the largest rank's norm is taken
        (a rank whose gradients were corrupted after the all-reduce shows there). An update
        may be negative (weight decay): a replicated one gives both the highest and the lowest
        rank's, so a rank whose update went either way shows."""
        if not self.losses:
            return {"losses": [], "grad_norms": [], "shard_norms": {}}
        op = "sum" if self.sharded else "max"
        losses = reduce_tensor(torch.stack(self.losses), "mean")  # over gloo: any NCCL_ALGO
        squares = reduce_tensor(torch.stack(self.squares), op)
        shard_norms = {}
        for count in sorted(set().union(*self.shards)):  # the same layouts every step
            steps = torch.stack([step[count] for step in self.shards])
            shard_norms[str(count)] = reduce_tensor(steps, op).sqrt().tolist()
        figures = {"losses": losses.tolist(), "grad_norms": squares.sqrt().tolist(),
                   "shard_norms": shard_norms}  # fmt: skip
        if self.updates:
            figures["updates"] = self._extremes(torch.stack(self.updates))
            figures["update_shards"] = {
                str(count): self._extremes(torch.stack([s[count] for s in self.update_shards]))
                for count in sorted(set().union(*self.update_shards))
            }
        return figures

    def _extremes(self, steps: Tensor) -> dict[str, list]:
        """Per step, the highest and the lowest rank's figure (a sharded one: the sum of the
        shards, both)."""
        if self.sharded:
            total = reduce_tensor(steps, "sum").tolist()
            return {"high": total, "low": total}
        both = reduce_tensor(torch.stack([steps, -steps]), "max")
        return {"high": both[0].tolist(), "low": (-both[1]).tolist()}
