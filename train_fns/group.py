"""Warm evaluation: several configurations, one after another, in one worker group.

Starting a worker group (processes, imports, the process group) costs more than measuring a
configuration. NCCL reads its variables once per process, so configurations that differ in
them need fresh workers; the others can share them. Each configuration gets a model, optimizer
and data stream built from scratch with the same seed (same initial weights, same batches), and
everything of the previous one is freed first, so no state leaks from one to the next.

Plans come from ``next_plan`` one at a time (the driver decides the next one after it has the
outcome of the last, so the sampler learns from every configuration; None ends the group).
Messages go to ``send`` (a Ray queue's ``put`` on the driver's node, or a list in tests):
``{"kind": "start", "index": i, "rank": r}`` from rank 0 when configuration ``i`` begins (from
every rank for the first: the driver, not a watchdog in a process that may be frozen, bounds the
group's start by it), ``{"kind": "window", "index": i, "window": k}`` from rank 0 as each
measured window ends (the driver's heartbeat shows it), then from every rank
``{"kind": "end", "index": i, "rank": r, "status": complete|pruned|oom, "windows": [...],
"reason": ..., "pid": ...}`` (the process that measured it: whether a group's workers were
reused shows). An out-of-memory error that strikes every rank at the same step, after as many
collectives issued, is recorded and the group goes on (agreed over a gloo side group,
``agree_all_oom``); any other ends the group (peers still in a collective are ended by their
watchdog), and the driver re-queues what was not measured.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from train_fns import metrics as m
from train_fns.hold import hold
from train_fns.loop import StepRunner, run_training
from train_fns.plan import TrialPlan
from train_fns.ranks import reduce_over_ranks, side_group

START, WINDOW, END = "start", "window", "end"
def evaluate_plans(
    next_plan: Callable[[], TrialPlan | None],
    rank: int,
    world_size: int,
    device: torch.device,
    send: Callable[[dict[str, Any]], Any],
    started: dict[str, float] | None = None,
) -> None:
    """Measure each plan in turn on this rank until ``next_plan`` gives None; ``started``
    (group set-up times, e.g. imports) rides along with the first start message.

    A plan with a ``resident`` key keeps what it built (``run_training``) until a plan without
    one arrives: the residents, and the process groups they made, are freed then, together."""
    side_group()  # made here, where every rank is, before any plan needs it
    residents: dict[str, StepRunner] = {}
    before_residents: set[dist.ProcessGroup] = set()
    for index, plan in enumerate(iter(next_plan, None)):
        if rank == 0 or index == 0:
            send({"kind": START, "index": index, "rank": rank, "time": time.time(),
                  **(started or {})})  # fmt: skip
            started = None
        hold("measure")  # a test's kill point (started, not measuring); a no-op in real runs
        if residents and plan.resident is None:
            residents.clear()
            free_memory(device)
            release_groups(before_residents, device)
        windows: list[dict[str, Any]] = []

        def on_window(window: dict[str, Any], index: int = index, windows: list = windows) -> None:
            windows.append(window)
            if rank == 0:
                send({"kind": WINDOW, "index": index, "window": len(windows)})

        status, reason, oom_step = m.COMPLETE, "", -1
        groups = live_groups()
        if not residents:
            before_residents = groups
        try:
            if not run_training(plan, rank, world_size, device, on_window, residents):
                status = m.PRUNED
        except torch.OutOfMemoryError as e:
            status, reason, oom_step = m.OOM, str(e), getattr(e, "step", -1)
            residents.pop(plan.resident or "", None)  # the others stay
        free_start = time.perf_counter()
        kept = plan.resident in residents
        if not kept:
            free_memory(device)
        elif device.type == "cuda":  # the residents stay; the next window's peak is its own
            torch.cuda.reset_peak_memory_stats(device)
        if status != m.OOM and not kept:  # after an OOM, agree first: ranks may sit elsewhere
            release_groups(groups, device)
        send(
            {
                "kind": END,
                "index": index,
                "rank": rank,
                "status": status,
                "reason": reason,
                "windows": windows,
                "free_s": time.perf_counter() - free_start,
                "pid": os.getpid(),
            }
        )
        if status == m.OOM:
            agree_all_oom(world_size, oom_step)
            release_groups(groups, device)


def free_memory(device: torch.device) -> None:
    """Drop what the last configuration left (its model, optimizer and gradients are
    unreferenced once ``run_training`` returns) and reset the peak for the next one."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def live_groups() -> set[dist.ProcessGroup]:
    """The process groups this process holds now (the default, the side group, meshes)."""
    return set(dist.distributed_c10d._world.pg_map) if dist.is_initialized() else set()


def release_groups(keep: set[dist.ProcessGroup], device: torch.device) -> None:
    """Destroy the process groups a configuration made (an integer ``reshard_after_forward``
    builds a mesh per ``fully_shard`` call, HSDP one per plan): on NCCL each holds a
    communicator's buffers, hundreds of MB, so left alive they would make later plans measure
    against leaked memory, and their peaks depend on the order of the plans."""
    stale = live_groups() - keep
    if not stale:
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # nothing of the plan still running on them
    # In one order on every rank (NCCL's teardown waits for its peers): the newest first, as
    # torch's own destroy_process_group() does
    names = dist.distributed_c10d._world.pg_names  # "1", "2", ...: numeric order by length
    for group in sorted(stale, key=lambda g: (len(names[g]), names[g]), reverse=True):
        dist.destroy_process_group(group)
    # DTensor caches sharding by mesh, and a mesh equal to a destroyed one compares equal:
    # the next plan would reach the destroyed groups through the cache
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()


def oom_verdict(
    num_oom: int, world_size: int, first_step: int, last_step: int,
    least_issued: int = 0, most_issued: int = 0,
) -> str | None:  # fmt: skip
    """Why the group cannot go on after an out-of-memory error (None: it can).

    Only when every rank ran out of memory at the same step, having issued as many collectives
    on the training groups (``issued_collectives``), did all of them stop at the same point of
    the collective sequence. The same step is not enough: NCCL runs asynchronously, so ranks
    that fail at different allocations of one step have issued different numbers of bucket
    all-reduces or FSDP all-gathers, and the next configuration's first collectives would
    pair with the stale ones (a hang, or mixed data the guard calls corrupt).
    """
    if num_oom != world_size:
        return f"out of memory on {num_oom} of {world_size} ranks only"
    if first_step != last_step:
        return f"out of memory at different steps ({first_step} to {last_step})"
    if least_issued != most_issued:
        return (f"out of memory after different numbers of collectives issued on the training "
                f"groups ({least_issued} to {most_issued})")  # fmt: skip
    return None


def issued_collectives() -> tuple[int, int, int]:
    """What this rank has issued on its training process groups (every live group but the gloo
    side group, in the order they were made, the same on every rank): how many groups, and the
    plain and position-weighted sums of their sequence numbers, which count each collective as
    it is issued, not as it completes (ranks one collective apart on any group differ in a sum).
    A backend without sequence numbers gives (-1, -1, -1): its ranks cannot show they agree."""
    side = side_group()
    groups = [g for g in dist.distributed_c10d._world.pg_map if g is not side]
    try:
        counts = [g._get_sequence_number_for_group() for g in groups]
    except RuntimeError:  # "ProcessGroup ... does not yet support sequence numbers"
        return -1, -1, -1
    return len(counts), sum(counts), sum(k * c for k, c in enumerate(counts, 1))


def agree_all_oom(world_size: int, step: int) -> None:
    """Go on only if every rank ran out of memory at the same step, after as many collectives
    (``oom_verdict``).

    Agreed over the gloo side group. A rank that did not run out of memory is still inside a
    training collective: this one then waits here until that rank's watchdog ends it (gloo
    then reports the lost peer) or the side group's timeout; either ends the group, and the
    driver has the OOM message already.
    """
    if side_group() is None:
        return
    issued = issued_collectives()  # before the first reduction: every rank reaches both
    (num_oom,) = reduce_over_ranks([1.0], op="sum")
    mine = [step, *issued]
    high = reduce_over_ranks([*mine, *(-v for v in mine)], "max")  # the most, then -the least
    most, least = [round(v) for v in high[: len(mine)]], [-round(v) for v in high[len(mine) :]]
    differ = next(((lo, hi) for lo, hi in zip(least[1:], most[1:], strict=True) if lo != hi),
                  (0, 0))  # fmt: skip
    why = oom_verdict(round(num_oom), world_size, least[0], most[0], *differ)
    if why is not None:
        raise RuntimeError(f"{why}; the worker group cannot go on")
