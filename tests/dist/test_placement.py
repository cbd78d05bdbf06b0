"""The placement guard (``_placement``) on two gloo ranks run as GPU workers would place tensors:
it catches a collective on a default-device tensor (the bug that crashed ``orchestrator.train``
on NCCL), and the search's and the training run's step loops pass it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from _placement import PlacementError
from _spawn import run_distributed
from _tiny import CPU, tiny_plan

from train_fns import metrics as m
from train_fns.loop import run_training
from train_fns.ranks import reduce_over_ranks
from train_fns.restart import RunSpec
from train_fns.trainer import ElasticTrainer


def _default_device_all_reduce(rank: int, world: int) -> str:
    """The pattern of defect 1, caught in the worker (a rank that raises hangs gloo's exit)."""
    try:
        dist.all_reduce(torch.tensor([1.0, 2.0], dtype=torch.float64) * 2)
    except PlacementError as e:
        return str(e)
    return "not refused"


def _reduce(rank: int, world: int) -> tuple[list[float], list[float]]:
    return reduce_over_ranks([rank, 1.0]), reduce_over_ranks([rank], op="max")


def _steps(rank: int, world: int, strategy: str) -> tuple[list[dict], list[dict]]:
    """Both step loops: a search trial's windows and a training run's steps."""
    plan = tiny_plan(warmup_steps=1, measure_steps=2, num_windows=1, strategy=strategy)
    windows: list[dict] = []
    run_training(plan, rank, world, CPU, windows.append)
    rows: list[dict] = []
    spec = RunSpec(
        plan=dataclasses.replace(plan, max_grad_norm=1.0).to_dict(), steps=2,
        checkpoint_every=100, max_micro_batch=plan.micro_batch, reference_every=1,
        grad_norm_every=1, report_every=1,
    )  # fmt: skip
    ElasticTrainer(spec, rank, world, CPU, lambda b, d: rows.extend(b[m.ROWS]), None).run()
    return windows, rows


def test_the_guard_refuses_a_default_device_tensor() -> None:
    refusals = run_distributed(_default_device_all_reduce, simulate_gpu=True, timeout_s=60)
    assert all(r.startswith("dist.all_reduce got a tensor on the default device") for r in refusals)


def test_the_guard_passes_what_it_should_and_the_reduction_is_right() -> None:
    means, maxima = run_distributed(_reduce, simulate_gpu=True)[0]
    assert means == [0.5, 1.0] and maxima == [1.0]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_both_step_loops_place_collective_tensors_on_the_served_device(strategy: str) -> None:
    windows, rows = run_distributed(_steps, strategy, simulate_gpu=True)[0]
    assert len(windows) == 1 and [r[m.STEP] for r in rows] == [1, 2]
    assert all(r[m.LOSS] > 0 for r in rows)
