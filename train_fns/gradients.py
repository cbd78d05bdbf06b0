"""Per-layer gradient norms: the write-up's gradient statistics for catching precision trouble
(vanishing layers, one layer exploding) before the loss shows it."""

from __future__ import annotations

import torch
from torch import nn

from train_fns.ranks import reduce_tensor
from train_fns.strategies import canonical_name


def layer_of(name: str) -> str:
    """The layer a parameter belongs to: its name up to the first numbered block
    (``encoder.layer.3``), else its first two parts (``embeddings.word_embeddings``);
    wrapper prefixes (DDP's ``module.``, checkpoint wrappers) are dropped."""
    parts = canonical_name(name).split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


def layer_grad_norms(model: nn.Module) -> dict[str, float]:
    """L2 norm of each layer's gradient, over the whole model.

    FSDP2 gradients are sharded DTensors: each rank sums the squares of its shard and the sums
    are all-reduced, so every rank must call this at the same step. DDP gradients are already
    synced and complete on every rank.
    """
    groups: dict[str, int] = {}
    squares: list[torch.Tensor] = []
    sharded = False
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        grad = param.grad
        if hasattr(grad, "to_local"):
            grad, sharded = grad.to_local(), True
        index = groups.setdefault(layer_of(name), len(groups))
        if index == len(squares):
            squares.append(torch.zeros((), dtype=torch.float64, device=grad.device))
        squares[index] += grad.detach().double().pow(2).sum()
    if not squares:
        return {}
    total = torch.stack(squares)
    if sharded:  # over gloo: commtune's figure, whatever NCCL_ALGO forces
        total = reduce_tensor(total, "sum")
    return {layer: float(value) for layer, value in zip(groups, total.sqrt().tolist(), strict=True)}
