"""A user workload (examples/vision_workload.py, not a Hugging Face model) through the real
worker loop on two gloo ranks: DDP and FSDP2, every accumulation split and activation
checkpointing give the losses of a single process on the same samples."""

from __future__ import annotations

from pathlib import Path

import torch
from _spawn import run_distributed

from train_fns.loop import build_runner
from train_fns.plan import TrialPlan

CPU = torch.device("cpu")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENTRYPOINT = f"{EXAMPLES / 'vision_workload.py'}:make_workload"
OPTIONS = {"width": 16, "depth": 2, "image_size": 8, "classes": 4}
GLOBAL_BATCH = 8
STEPS = 3


def plan(world_size: int, accumulation: int, **changes: object) -> TrialPlan:
    return TrialPlan(
        model="vision", task=None, seq_len=1, global_batch=GLOBAL_BATCH, world_size=world_size,
        accumulation_steps=accumulation, micro_batch=GLOBAL_BATCH // (world_size * accumulation),
        entrypoint=ENTRYPOINT, options=OPTIONS, lr=1e-2, **changes,
    )  # fmt: skip


def _losses(rank: int, world_size: int, plans: list[dict]) -> list[list[float]]:
    """Each plan's per-step mean loss (averaged over ranks, as a step's loss is)."""
    out = []
    for data in plans:
        runner, _ = build_runner(TrialPlan.from_dict(data), rank, CPU)
        steps = []
        for step in range(STEPS):
            loss = runner.run_step(step).detach().clone()
            if world_size > 1:
                torch.distributed.all_reduce(loss)
                loss /= world_size
            steps.append(float(loss))
        out.append(steps)
    return out


def test_user_workload_is_exact_across_strategies_and_splits() -> None:
    (reference,) = run_distributed(_losses, [plan(1, 1).to_dict()], world_size=1)[0]
    variants = {
        "ddp acc1": plan(2, 1),
        "ddp acc2": plan(2, 2),
        "fsdp acc1 checkpointing": plan(2, 1, strategy="fsdp", activation_checkpointing=True),
        "fsdp acc4": plan(2, 4, strategy="fsdp"),
    }
    results = run_distributed(_losses, [p.to_dict() for p in variants.values()])[0]
    assert reference[0] > 0
    for name, losses in zip(variants, results, strict=True):
        torch.testing.assert_close(losses, reference, rtol=1e-4, atol=1e-5, msg=name)
