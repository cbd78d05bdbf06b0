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
"reason": ...}``. An out-of-memory error that strikes every rank alike is recorded and the group
goes on; one that strikes some ranks only leaves the others in a collective until their
watchdog ends them, and the driver re-queues what was not measured.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from train_fns import metrics as m
from train_fns.loop import run_training
from train_fns.plan import TrialPlan

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
    (group set-up times, e.g. imports) rides along with the first start message."""
    for index, plan in enumerate(iter(next_plan, None)):
        if rank == 0 or index == 0:
            send({"kind": START, "index": index, "rank": rank, "time": time.time(),
                  **(started or {})})  # fmt: skip
            started = None
        windows: list[dict[str, Any]] = []

        def on_window(window: dict[str, Any], index: int = index, windows: list = windows) -> None:
            windows.append(window)
            if rank == 0:
                send({"kind": WINDOW, "index": index, "window": len(windows)})

        status, reason = m.COMPLETE, ""
        try:
            if not run_training(plan, rank, world_size, device, on_window):
                status = m.PRUNED
        except torch.OutOfMemoryError as e:
            status, reason = m.OOM, str(e)
        free_start = time.perf_counter()
        free_memory(device)
        send(
            {
                "kind": END,
                "index": index,
                "rank": rank,
                "status": status,
                "reason": reason,
                "windows": windows,
                "free_s": time.perf_counter() - free_start,
            }
        )
        if status == m.OOM:
            agree_all_oom(device)


def free_memory(device: torch.device) -> None:
    """Drop what the last configuration left (its model, optimizer and gradients are
    unreferenced once ``run_training`` returns) and reset the peak for the next one."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def agree_all_oom(device: torch.device) -> None:
    """Go on only if every rank ran out of memory in this configuration.

    A rank that did not is still inside a collective: this one then waits here until that
    rank's watchdog ends it, which ends the group (the driver has the OOM message already).
    """
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return
    flag = torch.ones(1, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(flag)
    if int(flag.item()) != dist.get_world_size():
        raise RuntimeError("out of memory on some ranks only; the group cannot go on")
