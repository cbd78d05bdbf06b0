"""Training runs without Ray: exact resume, resize with the global batch kept, FSDP2 checkpoints
from 2 ranks loaded by 1. ``report`` copies each rank's checkpoint files into one folder per step,
as Ray Train merges them into its storage."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from _spawn import run_distributed
from _tiny import CPU, TINY_BERT, tiny_plan

from train_fns import metrics as m
from train_fns.loop import build_runner
from train_fns.plan import TrialPlan
from train_fns.restart import RunSpec, load_checkpoint, plan_for_world
from train_fns.trainer import ElasticTrainer

DROPOUT = {**TINY_BERT, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}


def spec(steps: int, every: int, **plan_changes: object) -> dict:
    plan = tiny_plan(warmup_steps=0, measure_steps=steps, num_windows=1, max_grad_norm=1.0)
    plan = dataclasses.replace(plan, **plan_changes)
    return RunSpec(
        plan=plan.to_dict(), steps=steps, checkpoint_every=every, max_micro_batch=plan.micro_batch,
        reference_every=2, grad_norm_every=2,
    ).to_dict()  # fmt: skip


def _train(rank: int, world: int, spec_dict: dict, resume: str | None, root: str) -> list[dict]:
    reports: list[dict] = []

    def report(batch: dict, directory: Path | None) -> None:
        reports.extend(batch[m.ROWS])
        if directory is not None:
            target = Path(root) / f"step_{reports[-1][m.STEP]}"
            shutil.copytree(directory, target, dirs_exist_ok=True)

    ElasticTrainer(
        RunSpec(**spec_dict), rank, world, CPU, report, None if resume is None else Path(resume)
    ).run()
    return reports


def losses(reports: list[dict]) -> dict[int, float]:
    return {r[m.STEP]: r[m.LOSS] for r in reports}


def test_resume_is_exact_and_the_step_counter_continues(tmp_path: Path) -> None:
    full = spec(6, 3, model_overrides=DROPOUT)
    whole = run_distributed(_train, full, None, str(tmp_path / "a"))[0]
    assert [r[m.STEP] for r in whole] == [1, 2, 3, 4, 5, 6]
    assert [r.get(m.CHECKPOINT_STEP) for r in whole] == [None, None, 3, None, None, 6]
    resumed = run_distributed(_train, full, str(tmp_path / "a" / "step_3"), str(tmp_path / "b"))
    after = resumed[0]
    assert [r[m.STEP] for r in after] == [4, 5, 6]
    assert after[0][m.EVENTS][0]["resumed_from_step"] == 3
    assert after[-1][m.SAMPLES_SEEN] == 6 * whole[0][m.GLOBAL_BATCH]
    for step, loss in losses(after).items():
        assert loss == pytest.approx(losses(whole)[step], rel=1e-6, abs=1e-7), step
    assert {"bert.encoder.layer.0", "bert.encoder.layer.1"} <= set(whole[0][m.LAYER_GRAD_NORMS])


def test_resize_keeps_the_global_batch_and_the_trajectory(tmp_path: Path) -> None:
    full = spec(6, 3, accumulation_steps=2, micro_batch=2)  # 8 = 2 x 2 x 2
    whole = run_distributed(_train, full, None, str(tmp_path / "a"))[0]
    one = run_distributed(
        _train, full, str(tmp_path / "a" / "step_3"), str(tmp_path / "b"), world_size=1
    )[0]
    start = one[0][m.EVENTS][0]
    assert (start["world_size"], start["checkpoint_world_size"]) == (1, 2)
    assert {(r[m.GLOBAL_BATCH], r[m.MICRO_BATCH], r[m.ACCUMULATION_STEPS]) for r in one} == {
        (8, 2, 4)  # the tuned micro-batch kept, accumulation doubled
    }
    for step, loss in losses(one).items():
        assert loss == pytest.approx(losses(whole)[step], rel=1e-4), step


def _state_after_load(rank: int, world: int, spec_dict: dict, checkpoint: str) -> dict:
    template = RunSpec(**spec_dict)
    plan = plan_for_world(TrialPlan.from_dict(template.plan), world, template.max_micro_batch)
    runner, _ = build_runner(plan, rank, CPU)
    load_checkpoint(runner, Path(checkpoint))
    return full_state(runner)


def full_state(runner) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True)
    model_sd, optim_sd = get_state_dict(runner.model, runner.optimizer, options=options)
    exp_avg = {k: v["exp_avg"] for k, v in optim_sd["state"].items()}
    return {"model": model_sd, "exp_avg": exp_avg}


def test_fsdp2_checkpoint_of_two_ranks_loads_on_one(tmp_path: Path) -> None:
    fsdp = spec(2, 2, strategy="fsdp")
    run_distributed(_train, fsdp, None, str(tmp_path))
    checkpoint = tmp_path / "step_2"
    assert len(list(checkpoint.glob("*.distcp"))) == 2  # one shard per rank
    on_two = run_distributed(_state_after_load, fsdp, str(checkpoint))[0]
    on_one = run_distributed(_state_after_load, fsdp, str(checkpoint), world_size=1)[0]
    assert on_one["model"].keys() == on_two["model"].keys()
    for name, tensor in on_two["model"].items():
        torch.testing.assert_close(on_one["model"][name], tensor, msg=name)
    assert on_one["exp_avg"].keys() == on_two["exp_avg"].keys() and on_two["exp_avg"]
    for name, tensor in on_two["exp_avg"].items():
        torch.testing.assert_close(on_one["exp_avg"][name], tensor, msg=str(name))
    untrained = run_distributed(_fresh_state, fsdp, world_size=1)[0]
    assert any(
        not torch.equal(untrained["model"][k], v) for k, v in on_one["model"].items()
    )  # the load changed the weights: they are the trained ones


def _fresh_state(rank: int, world: int, spec_dict: dict) -> dict:
    template = RunSpec(**spec_dict)
    plan = plan_for_world(TrialPlan.from_dict(template.plan), world, template.max_micro_batch)
    return full_state(build_runner(plan, rank, CPU)[0])


def test_adaptive_resplit_in_training_keeps_the_global_batch_and_resumes(tmp_path: Path) -> None:
    """Started at 4 accumulation steps of micro-batch 1 with room up to micro-batch 4, the
    controller sees a comm/compute ratio far below 4 and re-splits toward 1 step; the global
    batch stays 8, and a resume from a checkpoint after the change keeps the new split."""
    adaptive = spec(8, 2, accumulation_steps=4, micro_batch=1)  # a checkpoint every 2 steps
    adaptive["max_micro_batch"] = 4
    adaptive["adaptive"] = {"window": 2, "max_steps": 8}
    whole = run_distributed(_train, adaptive, None, str(tmp_path / "a"))[0]
    events = [e for r in whole for e in r.get(m.EVENTS, []) if e["kind"] == "resplit"]
    assert events and events[0]["from"][0] == 4 and events[0]["to"][0] < 4
    assert events[0]["step"] <= 6, "the controller changes the split within three windows"
    assert {r[m.GLOBAL_BATCH] for r in whole} == {8}
    last_split = (whole[-1][m.ACCUMULATION_STEPS], whole[-1][m.MICRO_BATCH])
    after = next(s for s in (2, 4, 6) if s >= events[0]["step"])  # the first checkpoint after it
    resumed = run_distributed(
        _train, adaptive, str(tmp_path / "a" / f"step_{after}"), str(tmp_path / "b")
    )
    first = resumed[0][0]
    assert first[m.GLOBAL_BATCH] == 8 and first[m.STEP] == after + 1
    assert (first[m.ACCUMULATION_STEPS], first[m.MICRO_BATCH]) != (4, 1), "the new split is kept"
    assert resumed[0][-1][m.STEP] == 8 and last_split[0] * last_split[1] * 2 == 8
