"""The guard at 16 ranks: one corrupt rank under FSDP2 moves the global
gradient norm by about 1/16 of its own shard's change, inside bf16's tolerance, so the
shard's own norm (and its own update) against the DDP baseline's same chunk is what catches
it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from _spawn import run_distributed
from _tiny import guard_figures, tiny_plan

from orchestrator.search.correctness import check
from train_fns.guard import TOLERANCES

WORLD = 16
STEPS = {"warmup_steps": 2, "measure_steps": 1, "num_windows": 1, "world_size": WORLD,
         "global_batch": WORLD, "micro_batch": 1}  # fmt: skip


@pytest.mark.slow  # 16 processes: about a minute on 2 cores
def test_one_corrupt_rank_of_sixteen_is_caught_at_bf16_tolerance() -> None:
    changes = {"ddp": {}, "fsdp": {"strategy": "fsdp"},
               "fsdp corrupt": {"strategy": "fsdp", "fault": "corrupt"}}  # fmt: skip
    plans = {name: replace(tiny_plan(), **STEPS, **c).to_dict() for name, c in changes.items()}
    figures = run_distributed(guard_figures, plans, world_size=WORLD, timeout_s=400.0)[0]
    base, bad = figures["ddp"], figures["fsdp corrupt"]
    assert check(base, figures["fsdp"], TOLERANCES["fp32"]) is None  # exact: shards agree
    hidden = {**bad, "shard_norms": {}, "update_shards": {}}
    assert check(base, hidden, TOLERANCES["bf16"]) is None, "the global figures alone see it now"
    reason = check(base, bad, TOLERANCES["bf16"])
    assert reason is not None and f"shard {WORLD - 1} of {WORLD} grad norm" in reason
    # the shard's update, which the corrupt gradient drove, sees it too
    reason = check(base, {**bad, "shard_norms": {}}, TOLERANCES["bf16"])
    assert reason is not None and f"shard {WORLD - 1} of {WORLD} update" in reason


def _uneven(rank: int, world_size: int) -> dict:
    """A guard step on 3 ranks placed 2 + 1 (LOCAL_WORLD_SIZE as Ray sets it per node)."""
    import os
    from types import SimpleNamespace

    import torch
    from torch import nn

    from train_fns.guard import Guard

    os.environ["LOCAL_WORLD_SIZE"] = "2" if rank < 2 else "1"
    model = nn.Linear(6, 6)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    runner = SimpleNamespace(model=model, fault=None, device=torch.device("cpu"),
                             plan=SimpleNamespace(world_size=world_size),
                             precision=SimpleNamespace(loss_scale=lambda: None))  # fmt: skip
    guard = Guard()
    guard.after_backward(runner)
    guard.record_loss(torch.tensor(1.0))
    return guard.figures()


def test_an_uneven_placement_agrees_on_the_layouts() -> None:
    """Ranks that see different local sizes chunked into different layouts and the guard's
    reduction hung: the node layout is used only where every rank has it."""
    figures = run_distributed(_uneven, world_size=3, timeout_s=60)
    assert all(set(f["shard_norms"]) == {"3"} for f in figures), figures
