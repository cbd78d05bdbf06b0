"""Worker-side stages of the GPU check (``benchmarks/gpu_check.py``): what only a GPU shows of
a warm worker group's memory. Each prints its lines and returns its seconds.

- **one warm group through A B C D A**: five configurations measured one after another in one
  group (``train_fns.group.evaluate_plans``, as a search's warm group runs them), with the
  memory left after each free (torch's allocated and reserved bytes, the device's used bytes:
  what the next configuration starts from) and the order effect (A measured first and last:
  samples/s and peak; a leak or a fragmented cache shows as A's second figures differing).
- **round-0 regrowth of the race's residents**: three configurations built resident as a race
  builds them, then two rounds of windows, without and with the race's step again after the
  last build (``orchestrator.search.race.REGROW_STEPS``): the cudaMalloc segments and reserved
  bytes each window adds. Every build's guard empties the allocator's cache, so without the
  step again round 0's windows regrow memory inside measured steps; round 1's should add none.
- **fp16 step without host syncs**: the synchronizing calls ``Precision.step`` makes under
  fp16 with fused AdamW, counted by torch's sync debug mode.
- **meta build and the issued collectives**: an FSDP plan's model built on the meta device
  holds no device memory until it is sharded and filled from rank 0 (``train_fns.weights``),
  and the counts the OOM agreement compares (``train_fns.group.issued_collectives``) read on
  the real NCCL group (-1 there would end the group on every out-of-memory error).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from train_fns import metrics as m
from train_fns.group import (
    END,
    START,
    evaluate_plans,
    free_memory,
    issued_collectives,
    live_groups,
    release_groups,
)
from train_fns.loop import make_workload
from train_fns.plan import TrialPlan
from train_fns.precision import Precision
from train_fns.strategies import wrap_model
from train_fns.timing import device_used_bytes
from train_fns.weights import canonical_name

MiB = 2**20
GiB = 2**30
RACE_REGROW_STEPS = 1
"""The race's ``REGROW_STEPS`` (the check imports no ``orchestrator``: it pulls in Ray)."""


def _memory(device: torch.device) -> dict[str, Any]:
    """Allocator and device figures now (None on the CPU)."""
    if device.type != "cuda":
        return {"allocated": None, "reserved": None, "used": None, "segments": None}
    stats = torch.cuda.memory_stats(device)
    return {"allocated": torch.cuda.memory_allocated(device),
            "reserved": torch.cuda.memory_reserved(device), "used": device_used_bytes(device),
            "segments": stats.get("segment.all.allocated", 0)}  # fmt: skip


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GiB:.2f}"


def _group(plans: list[TrialPlan], device: torch.device) -> list[dict[str, Any]]:
    """``plans`` in one warm group on this 1-rank process group; per plan its end message
    with the memory at its start and after its end (a non-resident one: after its free)."""
    queue, at_start, ends = iter(plans), {}, []

    def send(message: dict[str, Any]) -> None:
        if message["kind"] == START:
            at_start[message["index"]] = _memory(device)
        elif message["kind"] == END:
            ends.append({**message, "before": at_start.get(message["index"]),
                         "after": _memory(device)})  # fmt: skip

    groups = live_groups()
    free_memory(device)
    evaluate_plans(lambda: next(queue, None), 0, 1, device, send)
    free_memory(device)  # the residents went with evaluate_plans
    release_groups(groups, device)
    return ends


def _samples_per_s(end: dict[str, Any], plan: TrialPlan) -> float | None:
    windows = end["windows"]
    return plan.global_batch / windows[-1][m.GLOBAL_STEP_TIME_S] if windows else None


def warm_group_stage(plans: list[TrialPlan], device: torch.device) -> float:
    """"one warm group through A B C D A": ``plans`` are A B C D; A runs again last."""
    began = time.perf_counter()
    print("stage: one warm group through A B C D A (memory left after each free, GiB)")
    order = [*plans, plans[0]]
    ends = _group(order, device)
    for name, plan, end in zip("ABCDA", order, ends, strict=False):
        after, speed = end["after"], _samples_per_s(end, plan)
        peak = end["windows"][-1].get(m.PEAK_MEM_BYTES) if end["windows"] else None
        print(f"  {name} {plan.strategy} acc{plan.accumulation_steps} {plan.precision}: "
              f"{end['status']}, {speed or 0:.1f} samples/s, peak {_gib(peak)}; after its "
              f"free: allocated {_gib(after['allocated'])}, reserved {_gib(after['reserved'])}, "
              f"device used {_gib(after['used'])}")  # fmt: skip
    if len(ends) == len(order) and ends[0]["windows"] and ends[-1]["windows"]:
        first, last = (_samples_per_s(e, plans[0]) for e in (ends[0], ends[-1]))
        peaks = [e["windows"][-1].get(m.PEAK_MEM_BYTES) for e in (ends[0], ends[-1])]
        print(f"  order effect: A last / A first {last / first:.3f} samples/s; peak "
              f"{_gib(peaks[0])} then {_gib(peaks[1])} GiB")  # fmt: skip
    return time.perf_counter() - began


def _race_plans(plans: list[TrialPlan], regrow: bool, steps: int) -> list[TrialPlan]:
    """As a race asks: each built resident and warmed a step, (``regrow``) each a step again,
    then two rounds of one window each."""
    keys = [dataclasses.replace(p, resident=f"r{k}", prune_below=None)
            for k, p in enumerate(plans)]  # fmt: skip
    build = [dataclasses.replace(p, warmup_steps=1, measure_steps=1, num_windows=1) for p in keys]
    again = [dataclasses.replace(p, warmup_steps=0, measure_steps=RACE_REGROW_STEPS,
                                 num_windows=1) for p in keys] if regrow else []  # fmt: skip
    window = [dataclasses.replace(p, warmup_steps=0, measure_steps=steps, num_windows=1)
              for p in keys]  # fmt: skip
    return build + again + window + window


def regrowth_stage(plans: list[TrialPlan], device: torch.device, steps: int = 3) -> float:
    """"round-0 regrowth of the race's residents", without and with the step again."""
    began = time.perf_counter()
    print("stage: round-0 regrowth of the race's residents (cudaMalloc segments, MiB reserved "
          "each window adds)")  # fmt: skip
    for regrow in (False, True):
        ends = _group(_race_plans(plans, regrow, steps), device)
        rounds = ends[-2 * len(plans):]
        parts = []
        for number, end in enumerate(rounds):
            before, after = end["before"], end["after"]
            if before is None or before["segments"] is None:
                parts.append(f"r{number % len(plans)} {end['status']}")
                continue
            added = after["segments"] - before["segments"]
            grown = (after["reserved"] - before["reserved"]) / MiB
            parts.append(f"r{number % len(plans)} +{added} seg +{grown:.0f} MiB")
        half = len(plans)
        print(f"  {'with' if regrow else 'without'} the step again: round 0: "
              f"{', '.join(parts[:half])}; round 1: {', '.join(parts[half:])}")  # fmt: skip
    return time.perf_counter() - began


def fp16_sync_stage(make_plan: Callable[..., TrialPlan], device: torch.device) -> float:
    """"fp16 step without host syncs": ``Precision.step`` under fp16 with fused AdamW (whose
    GradScaler path needs no sync of its own) under torch's sync debug mode: every
    synchronizing call it makes is counted (commtune's loss-scale check made two a step)."""
    began = time.perf_counter()
    if device.type != "cuda":
        print("stage: fp16 step without host syncs: needs CUDA (skipped)")
        return 0.0
    plan = dataclasses.replace(make_plan("fp16", "ddp", 1, False), adamw_impl="fused")
    model = torch.nn.Linear(1024, 1024, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    precision = Precision(plan, device)
    counts = []
    for _ in range(3):  # the first step creates the scaler's state
        with precision.autocast():
            loss = model(torch.randn(64, 1024, device=device)).float().pow(2).mean()
        precision.backward(loss)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                precision.step(optimizer, loss)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        optimizer.zero_grad(set_to_none=True)
        counts.append(sum("synchroniz" in str(w.message) for w in seen))
    print(f"stage: fp16 step without host syncs: synchronizing calls per step {counts} "
          f"(want 0 after the first)")  # fmt: skip
    return time.perf_counter() - began


def meta_build_stage(make_plan: Callable[..., TrialPlan], device: torch.device) -> float:
    """"meta build and the issued collectives": an FSDP plan's workload built on meta and
    filled from rank 0 on this backend (the device bytes before wrapping, want none; after;
    whether every weight equals rank 0's whole copy), then the training groups'
    issued-collective counts on this backend (want non-negative)."""
    began = time.perf_counter()
    plan = make_plan("bf16", "fsdp", 1, False)
    keep, start = live_groups(), _memory(device)["allocated"] or 0
    workload = make_workload(plan, 0, device)
    held = (_memory(device)["allocated"] or 0) - start
    model = wrap_model(workload.model, plan, device, workload.blocks, workload.full_state)
    filled = (_memory(device)["allocated"] or 0) - start
    # the non-persistent buffers too (BERT's position and token type ids): filled by broadcast
    state = {canonical_name(k): v.full_tensor() if hasattr(v, "full_tensor") else v
             for k, v in [*model.state_dict().items(), *model.named_buffers()]}  # fmt: skip
    equal = sorted(state) == sorted(workload.full_state) and all(
        torch.equal(state[k].cpu(), v.cpu()) for k, v in workload.full_state.items())
    del state  # a whole gathered copy: freed before the stage's own free_memory
    print(f"stage: meta build: device MiB before wrapping {held / MiB:.1f} (want 0), after "
          f"{filled / MiB:.1f}; weights equal rank 0's: {equal}; issued collectives (groups, "
          f"sum, weighted) {issued_collectives()} (want no -1)")  # fmt: skip
    del model, workload
    release_groups(keep, device)
    free_memory(device)
    return time.perf_counter() - began


STAGE_CASES = (("bf16", "ddp", 1, False), ("bf16", "fsdp", 4, True), ("bf16", "fsdp", 1, False),
               ("fp32", "ddp", 1, False))  # fmt: skip
"""A B C D: (precision, strategy, accumulation, activation checkpointing)."""


def run_worker_stages(make_plan: Callable[..., TrialPlan], device: torch.device) -> float:
    """The stages over ``STAGE_CASES`` (``make_plan(*case)``: the check's plan of a case),
    shortened to 2 warm-up and 4 measured steps; returns their seconds. A failure is printed
    and the check goes on (its table still runs)."""
    began = time.perf_counter()
    plans = [dataclasses.replace(make_plan(*case), warmup_steps=2, measure_steps=4,
                                 num_windows=2) for case in STAGE_CASES]  # fmt: skip
    stages = ((warm_group_stage, plans), (regrowth_stage, plans[:3]),
              (fp16_sync_stage, make_plan), (meta_build_stage, make_plan))  # fmt: skip
    for stage, given in stages:
        try:
            stage(given, device)
        except Exception as e:  # reported, not fatal: the table is the check's main part
            print(f"  stage failed: {type(e).__name__}: {e}", flush=True)
    return time.perf_counter() - began
