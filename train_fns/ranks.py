"""Small collectives over the ranks (a mean loss, the slowest step time, a flag), on the device
the process group's backend serves.

NCCL takes CUDA tensors on the rank's own device only; a CPU tensor fails its first
collective. Gloo takes CPU tensors. So every small collective asks ``collective_device`` where
its tensor must live instead of taking the default device (CPU), which is right on gloo only
and therefore invisible to CPU tests (tests/dist guard this rule, see tests/dist/_placement.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

OPS = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """The device whose tensors ``group``'s backend takes: this rank's current CUDA device
    under NCCL, the CPU otherwise (gloo; also when no process group is initialised)."""
    if dist.is_initialized() and dist.get_backend(group) == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduce_over_ranks(
    values: Sequence[float], op: str = "mean", group: dist.ProcessGroup | None = None
) -> list[float]:
    """Element-wise ``op`` (mean, sum or max) of ``values`` across the ranks of ``group``, in
    float64; every rank of the group must call it at the same point. Without a group of more
    than one rank the values come back as they are."""
    tensor = torch.tensor(values, dtype=torch.float64, device=collective_device(group))
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=OPS[op], group=group)
        if op == "mean":
            tensor /= dist.get_world_size(group)
    return tensor.tolist()


def nccl_version() -> str | None:
    """The NCCL version torch ships (``2.27.5``), None without CUDA: NCCL's accepted values
    and defaults change between versions, so a run records the one it tuned."""
    if not torch.cuda.is_available():
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
