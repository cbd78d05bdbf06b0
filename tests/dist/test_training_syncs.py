"""A training run's steps keep commtune's own figures out of the hot path: the loss is read
from the device and averaged over ranks (a gloo all-reduce: 1 ms at 16 ranks, 5 to 15 ms at
128) once per reported batch of steps, not in every step."""

from __future__ import annotations

import dataclasses

from _spawn import run_distributed
from _tiny import CPU, tiny_plan

from train_fns import metrics as m
from train_fns.ranks import side_group
from train_fns.restart import RunSpec
from train_fns.trainer import ElasticTrainer

REPORT_EVERY = 4


def _side_collectives(rank: int, world: int, steps: int) -> tuple[int, list]:
    """Side-group collectives a ``steps``-step run issues (one profiled step, a checkpoint at
    the end), and the losses it reported."""
    plan = dataclasses.replace(tiny_plan(), warmup_steps=0)
    spec = RunSpec(
        plan=plan.to_dict(), steps=steps, checkpoint_every=100, max_micro_batch=plan.micro_batch,
        reference_every=100, grad_norm_every=100, report_every=REPORT_EVERY,
    )  # fmt: skip
    before = side_group()._get_sequence_number_for_group()
    rows: list[dict] = []
    ElasticTrainer(spec, rank, world, CPU, lambda batch, _: rows.extend(batch[m.ROWS]), None).run()
    return side_group()._get_sequence_number_for_group() - before, [r[m.LOSS] for r in rows]


def _both(rank: int, world: int) -> list[tuple[int, list]]:
    return [_side_collectives(rank, world, steps) for steps in (REPORT_EVERY, 3 * REPORT_EVERY)]


def test_the_loss_is_averaged_once_per_report_not_per_step() -> None:
    ranks = run_distributed(_both, timeout_s=180)
    (short, _), (long, losses) = ranks[0]
    assert long - short <= 2, f"{long - short} side-group collectives for {2 * REPORT_EVERY} steps"
    assert len(losses) == 3 * REPORT_EVERY and all(isinstance(x, float) for x in losses)
    assert losses == ranks[1][1][1]  # every rank reports the mean over ranks


def _side_per_step(rank: int, world: int) -> int:
    """Side-group collectives in three measured steps of FSDP2 on a model whose steps leave
    parameters unused (its used-parameter agreement runs inside every step)."""
    from _tiny import example_plan

    from train_fns.loop import build_runner

    plan = example_plan("moe_workload", {"width": 16, "experts": 4}, world, 1,
                        strategy="fsdp", unused_parameters=True)  # fmt: skip
    runner, _ = build_runner(plan, rank, CPU)
    runner.run_step(0)
    before = side_group()._get_sequence_number_for_group()
    for step in range(1, 4):
        runner.run_step(step)
    return side_group()._get_sequence_number_for_group() - before


def test_fsdp_unused_parameters_agree_without_a_gloo_round_trip_in_the_step() -> None:
    """DDP agrees its unused parameters over the training communicator; FSDP2's agreement
    must too, or FSDP is measured paying a gloo round trip in every step that DDP does not."""
    assert run_distributed(_side_per_step, timeout_s=120) == [0, 0]
