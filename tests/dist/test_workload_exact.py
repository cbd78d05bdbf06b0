"""A user workload (examples/vision_workload.py, not a Hugging Face model) through the real
worker loop on two gloo ranks: DDP and FSDP2, every accumulation split and activation
checkpointing give the losses of a single process on the same samples."""

from __future__ import annotations

import torch
from _spawn import run_distributed
from _tiny import example_plan, step_losses

OPTIONS = {"width": 16, "depth": 2, "image_size": 8, "classes": 4}
STEPS = 3


def plan(world_size: int, accumulation: int, **changes: object):  # noqa: ANN201
    return example_plan("vision_workload", OPTIONS, world_size, accumulation, **changes)


def test_user_workload_is_exact_across_strategies_and_splits() -> None:
    (reference,) = run_distributed(step_losses, [plan(1, 1).to_dict()], STEPS, world_size=1)[0]
    variants = {
        "ddp acc1": plan(2, 1),
        "ddp acc2": plan(2, 2),
        "fsdp acc1 checkpointing": plan(2, 1, strategy="fsdp", activation_checkpointing=True),
        "fsdp acc4": plan(2, 4, strategy="fsdp"),
    }
    results = run_distributed(step_losses, [p.to_dict() for p in variants.values()], STEPS)[0]
    assert reference[0] > 0
    for name, losses in zip(variants, results, strict=True):
        torch.testing.assert_close(losses, reference, rtol=1e-4, atol=1e-5, msg=name)
