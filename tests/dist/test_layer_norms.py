"""Per-layer gradient norms (``train_fns.gradients``, ``grad_norms.csv``) do not depend on how
the gradients are laid out: DDP's full copies, FSDP2's shards and HSDP's shards replicated
across nodes give the same norm per layer.

HSDP needs two nodes: 4 gloo ranks pose as 2 nodes of 2 (``LOCAL_WORLD_SIZE``/``LOCAL_RANK``,
as Ray Train and torchrun set them). Each HSDP shard lives once per node, so a sum of squares
over every rank counts it once per node: without the replica divisor the norm came out
sqrt(2) too large."""

from __future__ import annotations

import os

import pytest
from _spawn import run_distributed
from _tiny import CPU, GLOBAL_BATCH, tiny_plan

from train_fns.gradients import layer_grad_norms
from train_fns.loop import build_runner
from train_fns.plan import FSDPOptions, TrialPlan

WORLD, NODES = 4, 2
PLANS = {
    "ddp": tiny_plan(world_size=WORLD),
    "fsdp": tiny_plan(world_size=WORLD, strategy="fsdp"),
    "hsdp": tiny_plan(world_size=WORLD, strategy="fsdp", fsdp=FSDPOptions(hsdp=True)),
}


def _norms_worker(rank: int, world_size: int, plans: dict[str, dict]) -> dict[str, dict]:
    """Step 0's per-layer norms of each plan, after the real micro-step loop."""
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size // NODES)
    os.environ["LOCAL_RANK"] = str(rank % (world_size // NODES))
    out = {}
    for name, plan in plans.items():
        runner, _ = build_runner(TrialPlan.from_dict(plan), rank, CPU)
        runner.accumulate_gradients(step=0)
        out[name] = layer_grad_norms(runner.model)
    return out


@pytest.fixture(scope="module")
def norms() -> list[dict[str, dict]]:
    assert GLOBAL_BATCH % WORLD == 0
    plans = {name: plan.to_dict() for name, plan in PLANS.items()}
    return run_distributed(_norms_worker, plans, world_size=WORLD, timeout_s=300.0)


@pytest.mark.parametrize("layout", ["fsdp", "hsdp"])
def test_sharded_layer_norms_match_ddp(norms: list[dict[str, dict]], layout: str) -> None:
    for rank, by_plan in enumerate(norms):
        ddp, sharded = by_plan["ddp"], by_plan[layout]
        assert sharded.keys() == ddp.keys() and len(ddp) >= 3, f"rank {rank}: layers"
        for layer, norm in ddp.items():
            assert norm > 0, f"rank {rank} {layer}: no gradient"
            assert sharded[layer] == pytest.approx(norm, rel=1e-5), f"rank {rank} {layout} {layer}"
