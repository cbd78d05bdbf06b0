"""A BERT small enough for two CPU processes, and plans around it (shared by the dist tests)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from train_fns.plan import TrialPlan

TINY_BERT = {
    "vocab_size": 512,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    # Dropout draws differ between one process and two; the maths under test does not.
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
GLOBAL_BATCH = 8
CPU = torch.device("cpu")


def guard_figures(rank: int, world_size: int, plans: dict[str, dict], nodes: int = 1) -> dict:
    """Each plan's correctness-guard figures (``train_fns.guard``) as a trial records them,
    on ``nodes`` pretend nodes (LOCAL_WORLD_SIZE / LOCAL_RANK, as Ray Train sets them)."""
    from train_fns import metrics as m
    from train_fns.loop import run_training

    os.environ["LOCAL_WORLD_SIZE"] = str(world_size // nodes)
    os.environ["LOCAL_RANK"] = str(rank % (world_size // nodes))
    out = {}
    for name, plan in plans.items():
        reports: list[dict] = []
        run_training(TrialPlan.from_dict(plan), rank, world_size, CPU, reports.append)
        out[name] = reports[0][m.GUARD]
    return out


def tiny_plan(world_size: int = 2, accumulation_steps: int = 1, **changes: object) -> TrialPlan:
    plan = TrialPlan(
        model="bert-tiny",
        task="mlm",
        seq_len=16,
        global_batch=GLOBAL_BATCH,
        world_size=world_size,
        accumulation_steps=accumulation_steps,
        micro_batch=GLOBAL_BATCH // (world_size * accumulation_steps),
        model_overrides=TINY_BERT,
    )
    return dataclasses.replace(plan, **changes)


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_plan(
    example: str, options: dict, world_size: int, accumulation: int, **changes: object
) -> TrialPlan:
    """A plan of ``examples/<example>.py``'s workload (not a Hugging Face model) at the global
    batch of 8, split over ``world_size`` ranks and ``accumulation`` micro-batches."""
    return TrialPlan(
        model=example, task=None, seq_len=1, global_batch=GLOBAL_BATCH, world_size=world_size,
        accumulation_steps=accumulation, micro_batch=GLOBAL_BATCH // (world_size * accumulation),
        entrypoint=f"{EXAMPLES / example}.py:make_workload", options=options, lr=1e-2, **changes,
    )  # fmt: skip


def step_losses(rank: int, world_size: int, plans: list[dict], steps: int) -> list:
    """Each plan's per-step mean loss (averaged over ranks, as a step's loss is) through the
    real worker loop, or the text of the RuntimeError that stopped it."""
    from train_fns.loop import build_runner

    out: list = []
    for data in plans:
        runner, _ = build_runner(TrialPlan.from_dict(data), rank, CPU)
        losses = []
        try:
            for step in range(steps):
                loss = runner.run_step(step).detach().clone()
                if world_size > 1:
                    torch.distributed.all_reduce(loss)
                    loss /= world_size
                losses.append(float(loss))
        except RuntimeError as e:
            out.append(str(e))
            continue
        out.append(losses)
    return out
