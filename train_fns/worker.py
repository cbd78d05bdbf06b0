"""The Ray Train entry point of the search: what ``TorchTrainer`` runs in every worker process.

Ray Train has already initialised the process group (gloo or NCCL) and set the device; this
only adapts Ray's context to ``evaluate_plans`` (training runs: ``train_fns.elastic``).
Imports are deferred so that importing ``train_fns`` (the driver does, for ``TrialPlan``)
stays light.
"""

from __future__ import annotations

import time
from typing import Any


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Measure the plans the driver puts in ``config["inbox"]`` (one copy per rank; None ends
    the group) one after another in this worker group (warm evaluation), sending every message
    to the driver's queue ``config["reports"]``.

    The queue, not ``ray.train.report``: a report waits for the Train controller (about 2 s a
    call in Ray 2.60), which a search would spend per window instead of measuring.
    """
    imports_start = time.perf_counter()
    import ray.train
    import ray.train.torch

    from train_fns.group import evaluate_plans
    from train_fns.plan import TrialPlan

    imports_s = time.perf_counter() - imports_start
    inbox = config["inbox"]

    def next_plan() -> TrialPlan | None:
        data = inbox.get()
        return None if data is None else TrialPlan.from_dict(data)

    context = ray.train.get_context()
    evaluate_plans(
        next_plan,
        rank=context.get_world_rank(),
        world_size=context.get_world_size(),
        device=ray.train.torch.get_device(),
        send=config["reports"].put,
        started={"imports_s": imports_s},
    )
