"""The Ray Train entry point: what ``TorchTrainer`` runs in every worker process.

Ray Train has already initialised the process group (gloo or NCCL) and set the device; this
only adapts Ray's context to ``run_training``. Imports are deferred so that importing
``train_fns`` (the driver does, for ``TrialPlan``) stays light.
"""

from __future__ import annotations

from typing import Any


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Run one trial's plan (``TrialPlan.to_dict()``) on this Ray Train worker."""
    import ray.train
    import ray.train.torch

    from train_fns.loop import run_training
    from train_fns.plan import TrialPlan

    plan = TrialPlan.from_dict(config)
    context = ray.train.get_context()
    run_training(
        plan,
        rank=context.get_world_rank(),
        world_size=context.get_world_size(),
        device=ray.train.torch.get_device(),
        report=ray.train.report,
    )
