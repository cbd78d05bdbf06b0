"""What a forced NCCL algorithm must be able to run: NVLS reduces only Sum on
float32/float64 and Sum/Max on half types, so every all-reduce commtune issues on the training
communicator must be one of those. commtune's own figures (the slowest step time, the mean
loss, the guard's norms, per-layer gradient norms, the probe's timings) go over the gloo side
group instead; this records every Python-level all-reduce on any other group, through a search
trial (with the guard) and a training run (clipping, gradient norms), for DDP and FSDP2."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.distributed as dist
from _spawn import run_distributed
from _tiny import CPU, tiny_plan

from search_spaces._nccl import NVLS_REDUCTIONS
from train_fns import metrics as m
from train_fns import ranks
from train_fns.loop import run_training
from train_fns.restart import RunSpec
from train_fns.trainer import ElasticTrainer

NAMES = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max", dist.ReduceOp.MIN: "min"}
DTYPES = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16",
          torch.bfloat16: "bf16", torch.int32: "int32", torch.int64: "int64"}  # fmt: skip


def _recorded(rank: int, world: int, strategy: str) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    original = dist.all_reduce

    @functools.wraps(original)
    def recording(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):  # noqa: ANN001, ANN202
        if not any(group is side for _, side in ranks._SIDE_GROUP):
            seen.append((NAMES.get(op, str(op)), DTYPES.get(tensor.dtype, str(tensor.dtype))))
        return original(tensor, op=op, group=group, async_op=async_op)

    dist.all_reduce = recording
    plan = tiny_plan(warmup_steps=3, measure_steps=2, num_windows=1, strategy=strategy)
    run_training(plan, rank, world, CPU, lambda window: None)
    spec = RunSpec(
        plan=dataclasses.replace(plan, max_grad_norm=1.0).to_dict(), steps=2,
        checkpoint_every=100, max_micro_batch=plan.micro_batch, reference_every=1,
        grad_norm_every=1, report_every=1,
    )  # fmt: skip
    ElasticTrainer(spec, rank, world, CPU, lambda b, d: b[m.ROWS], None).run()
    return seen


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_training_communicator_sees_only_reductions_nvls_runs(strategy: str) -> None:
    seen = run_distributed(_recorded, strategy, timeout_s=180)[0]
    unrunnable = [(op, dtype) for op, dtype in seen
                  if dtype not in NVLS_REDUCTIONS.get(op, frozenset())]  # fmt: skip
    assert unrunnable == [], f"on the training communicator: {sorted(set(seen))}"
