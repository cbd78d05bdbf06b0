"""The bandwidth probe's per-rank sweep: time all-reduce, all-gather and reduce-scatter.

Runs inside an initialised process group (a Ray Train worker or a spawned test rank) and
measures as nccl-tests does: a barrier before each timed loop of back-to-back calls so every
rank starts together, the loop timed by CUDA events on GPUs, the slowest rank's time per call
(a collective ends when its last rank does), and the median over loops. ``size_bytes`` is
always the whole (unsharded) buffer.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from train_fns.metrics import OPS
from train_fns.ranks import reduce_over_ranks

log = logging.getLogger("commtune")

DTYPE_BYTES = 4
"""float32: the gradients' dtype in the default fp32 workload."""
MIN_ITERS = 3
"""Timed iterations even for the largest sizes: a median needs a few."""
ROUNDS = 5
"""Timed loops per op and size: the figure is the median of their per-call times."""
BUDGET_S = 0.5
"""Seconds of timed iterations per op and size: iterations are cut to fit, so a default sweep
on CPU workers stays under a minute while small messages still get ``iters`` samples."""

Row = dict[str, Any]


def unit_bytes(op: str, world_size: int) -> int:
    """The step ``size_bytes`` must be a multiple of for ``op`` on ``world_size`` ranks.

    All-gather and reduce-scatter split the buffer into equal shards of whole float32
    elements; all-reduce needs whole elements only.
    """
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r}; use one of {OPS}")
    return DTYPE_BYTES if op == "all_reduce" else DTYPE_BYTES * world_size


def fits(op: str, size_bytes: int, world_size: int) -> bool:
    """Whether ``size_bytes`` of float32 can be measured for ``op`` on ``world_size`` ranks."""
    return size_bytes > 0 and size_bytes % unit_bytes(op, world_size) == 0


# torch 2.13 renamed the single-tensor collectives (the old names warn); torch >= 2.8 is supported.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _collective(op: str, size_bytes: int, device: torch.device) -> Callable[[], None]:
    """One call of ``op`` on buffers allocated once, ready to be timed repeatedly.

    Zeros, so that repeated sums never overflow to inf (and never slow the reduction down).
    """
    numel = size_bytes // DTYPE_BYTES
    shard = numel // dist.get_world_size()
    if op == "all_reduce":
        buffer = torch.zeros(numel, dtype=torch.float32, device=device)
        return lambda: dist.all_reduce(buffer)
    if op == "all_gather":
        inp = torch.zeros(shard, dtype=torch.float32, device=device)
        gathered = torch.empty(numel, dtype=torch.float32, device=device)
        return lambda: _ALL_GATHER(gathered, inp)
    inp = torch.zeros(numel, dtype=torch.float32, device=device)
    scattered = torch.empty(shard, dtype=torch.float32, device=device)
    return lambda: _REDUCE_SCATTER(scattered, inp)


def _timed(call: Callable[[], None], device: torch.device, calls: int = 1) -> float:
    """Seconds per call of ``calls`` back-to-back calls on this rank, started after a barrier.

    On CUDA the loop is timed by two events on the stream, as nccl-tests does: a host clock
    around each call would add 10-30 us of launch and synchronisation to every message, most
    of the time of anything under about 1 MB (and of the fitted latency)."""
    # NCCL's barrier names the GPU: left to guess it takes rank % visible GPUs, wrong on an
    # uneven layout (8 + 6), and the probe hangs
    dist.barrier(device_ids=[device.index]) if device.type == "cuda" else dist.barrier()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - start) / calls
    torch.cuda.synchronize(device)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(calls):
        call()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / calls


def _slowest(times_s: list[float]) -> list[float]:
    """Each iteration's time on the slowest rank, the same on every rank (over the gloo side
    group: the probe's own float64 Max must not depend on the NCCL_ALGO being measured)."""
    return reduce_over_ranks(times_s, op="max")


def num_timed_iters(estimate_s: float, iters: int, budget_s: float) -> int:
    """Timed iterations that fit ``budget_s`` at ``estimate_s`` each, between MIN_ITERS (or
    ``iters`` if smaller) and ``iters``."""
    fit = int(budget_s / max(estimate_s, 1e-9))
    return max(min(iters, MIN_ITERS), min(iters, fit))


def measure(
    op: str, size_bytes: int, iters: int, warmup: int, device: torch.device, budget_s: float
) -> tuple[float, int]:
    """Median over timed iterations of the slowest rank's time, and how many were timed.

    Every rank takes the same decisions from the same max-reduced times, so all run the same
    number of collectives (a rank running one more would hang the others). The first call pays
    one-off set-up, so the budget is judged from the last warm-up when there is more than one.
    """
    call = _collective(op, size_bytes, device)
    estimate_s = _slowest([_timed(call, device)])[0]
    more = min(warmup - 1, int(budget_s / 4 / max(estimate_s, 1e-9)))
    if more > 0:
        estimate_s = _slowest([_timed(call, device, more)])[0]
    count = num_timed_iters(estimate_s, iters, budget_s)
    rounds = min(ROUNDS, count)  # a median over rounds, each a loop of back-to-back calls
    per_round = count // rounds
    times_s = _slowest([_timed(call, device, per_round) for _ in range(rounds)])
    return statistics.median(times_s), rounds * per_round


def make_row(
    op: str, size_bytes: int, world_size: int, backend: str, time_s: float, iters: int
) -> Row:
    """One probe row as measured, algbw in GB/s (1e9 bytes); the driver adds busbw."""
    algbw_gbps = size_bytes / time_s / 1e9
    return {
        "op": op,
        "size_bytes": size_bytes,
        "world_size": world_size,
        "backend": backend,
        "time_s": time_s,
        "algbw_gbps": algbw_gbps,
        "iters": iters,
    }


def sweep(
    sizes: list[int],
    ops: list[str],
    iters: int,
    warmup: int,
    device: torch.device,
    *,
    budget_s: float = BUDGET_S,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Measure every op at every size, op by op; the rows on rank 0, [] elsewhere.

    ``on_row`` is called on rank 0 as each row is measured (the probe streams them to the
    driver's table). Sizes an op cannot split evenly are skipped with a warning (see ``fits``).
    """
    if iters < 1 or warmup < 1:
        raise ValueError(f"iters={iters} and warmup={warmup} must be >= 1")
    rank, world_size, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
    rows: list[Row] = []
    for op in ops:
        for size_bytes in sizes:
            if not fits(op, size_bytes, world_size):
                if rank == 0:
                    unit = unit_bytes(op, world_size)
                    log.warning("%s: %d bytes skipped: not a multiple of %d", op, size_bytes, unit)
                continue
            time_s, count = measure(op, size_bytes, iters, warmup, device, budget_s)
            if rank == 0:
                rows.append(make_row(op, size_bytes, world_size, backend, time_s, count))
                if on_row is not None:
                    on_row(rows[-1])
    return rows
