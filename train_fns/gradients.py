"""Per-layer gradient norms: gradient statistics that catch precision trouble (vanishing
layers, one layer exploding) before the loss shows it."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from train_fns.ranks import reduce_tensor
from train_fns.weights import canonical_name


def layer_of(name: str) -> str:
    """The layer a parameter belongs to: its name up to the first numbered block
    (``encoder.layer.3``), else its first two parts (``embeddings.word_embeddings``);
    wrapper prefixes (DDP's ``module.``, checkpoint wrappers) are dropped."""
    parts = canonical_name(name).split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:2]) if len(parts) > 2 else parts[0]


def replicas(grad: Tensor) -> int:
    """How many ranks hold each element of ``grad``'s local part (1 for a plain tensor): HSDP
    shards over a node and replicates across nodes, so a sum of squares over every rank counts
    each shard that many times, and a norm from it comes out sqrt(nodes) too large unless each
    rank's sum is divided by this (the correctness guard's figures too)."""
    placements = getattr(grad, "placements", ())
    mesh = getattr(grad, "device_mesh", None)
    return math.prod(mesh.size(i) for i, p in enumerate(placements) if p.is_replicate())


def layer_grad_norms(model: nn.Module) -> dict[str, float]:
    """L2 norm of each layer's gradient, over the whole model.

    FSDP2 gradients are sharded DTensors: each rank sums the squares of its shard and the sums
    are all-reduced, so every rank must call this at the same step; under HSDP each shard is
    held once per node, so each rank's sum is divided by its ``replicas``. DDP gradients are
    already synced and complete on every rank.
    """
    groups: dict[str, int] = {}
    squares: list[torch.Tensor] = []
    sharded = False
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        grad, copies = param.grad, replicas(param.grad)
        if hasattr(grad, "to_local"):
            grad, sharded = grad.to_local(), True
        index = groups.setdefault(layer_of(name), len(groups))
        if index == len(squares):
            squares.append(torch.zeros((), dtype=torch.float64, device=grad.device))
        squares[index] += grad.detach().double().pow(2).sum() / copies
    if not squares:
        return {}
    total = torch.stack(squares)
    if sharded:  # over gloo: commtune's figure, whatever NCCL_ALGO forces
        total = reduce_tensor(total, "sum")
    return {layer: float(value) for layer, value in zip(groups, total.sqrt().tolist(), strict=True)}
