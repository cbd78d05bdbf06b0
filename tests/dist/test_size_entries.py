"""Each start of a training run runs the tuned entry for its world size, fitted to its layout,
read back from torch (DDP's bucket cap, FSDP2's mesh, the split), with the trajectory of an
unresized run; 4 ranks pose as 2 nodes of 2 (``LOCAL_WORLD_SIZE``/``LOCAL_RANK``) for HSDP."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
from _spawn import run_distributed
from _tiny import tiny_plan

import train_fns.trainer as trainer_module
from train_fns import metrics as m
from train_fns.restart import RunSpec
from train_fns.trainer import ElasticTrainer

CPU_RUN = {"global_batch": 8, "strategy": "ddp", "use_gpu": False}
ENTRIES = {
    2: {"tuned": {"strategy": "ddp", "accumulation_steps": 2, "bucket_cap_mb": 1}},
    1: {
        "tuned": {"strategy": "ddp", "bucket_cap_mb": 4, "activation_checkpointing": True},
        "samples_per_s": 50.0,
    },
}


def _spec(steps: int, entries: dict, world: int = 2, batch: int = 8, **context: object) -> dict:
    plan = tiny_plan(world_size=world, warmup_steps=0, measure_steps=steps, num_windows=1,
                     max_grad_norm=1.0, global_batch=batch, micro_batch=batch // world)  # fmt: skip
    return RunSpec(
        plan=plan.to_dict(), steps=steps, checkpoint_every=3, max_micro_batch=plan.micro_batch,
        reference_every=2, entries=entries,
        fit_context={**CPU_RUN, "global_batch": batch, **context},
    ).to_dict()  # fmt: skip


def _seen(model: object) -> dict:
    if hasattr(model, "bucket_bytes_cap"):
        wrapped = [n for n, _ in model.named_modules() if n.endswith("_checkpoint_wrapped_module")]
        return {"bucket_mb": model.bucket_bytes_cap / 2**20,  # type: ignore[attr-defined]
                "checkpointed": len(wrapped)}  # fmt: skip
    blocks = [b for b in model.modules() if hasattr(b, "_get_fsdp_state") and b is not model]
    group = blocks[0]._get_fsdp_state()._fsdp_param_group
    after = group.post_forward_mesh_info  # reshard_after_forward: None (False) or its group
    return {"mesh": tuple(group.mesh_info.mesh.shape),
            "post_forward": None if after is None else after.shard_mesh_size}  # fmt: skip


def _train(rank: int, world: int, spec: dict, resume: str | None, root: str, nodes: int) -> dict:
    os.environ["LOCAL_WORLD_SIZE"] = str(world // nodes)
    os.environ["LOCAL_RANK"] = str(rank % (world // nodes))
    built: list[dict] = []
    build = trainer_module.build_runner

    def recording(plan, *args):  # what torch was given, as the trainer built it
        runner, extra = build(plan, *args)
        built.append(_seen(runner.model))
        return runner, extra

    trainer_module.build_runner = recording
    try:
        rows = _run(rank, world, spec, resume, root)
    finally:
        trainer_module.build_runner = build
    return {"rows": rows, "built": built}


def _run(rank: int, world: int, spec: dict, resume: str | None, root: str) -> list[dict]:
    rows: list[dict] = []

    def report(batch: dict, directory: Path | None) -> None:
        rows.extend(batch[m.ROWS])
        if directory is not None:
            shutil.copytree(directory, Path(root) / f"step_{rows[-1][m.STEP]}", dirs_exist_ok=True)

    ElasticTrainer(RunSpec(**spec), rank, world, trainer_module.torch.device("cpu"), report,
                   None if resume is None else Path(resume)).run()  # fmt: skip
    return rows


def _on_two_nodes_then_one(rank: int, world: int, spec: dict, root: str) -> list[dict]:
    return [_train(rank, world, spec, None, f"{root}/{nodes}", nodes) for nodes in (2, 1)]


def test_each_size_runs_its_entry_and_the_trajectory_is_the_unresized_ones(tmp_path) -> None:
    spec = _spec(6, ENTRIES)
    whole = run_distributed(_train, spec, None, str(tmp_path / "a"), 1)[0]
    assert whole["built"] == [{"bucket_mb": 1.0, "checkpointed": 0}]
    start = whole["rows"][0][m.EVENTS][0]
    assert (start["entry_size"], start["accumulation_steps"], start["micro_batch"]) == (2, 2, 2)
    one = run_distributed(_train, spec, str(tmp_path / "a" / "step_3"), str(tmp_path / "b"), 1,
                          world_size=1)[0]  # fmt: skip
    start = one["rows"][0][m.EVENTS][0]
    # the entry for 1, not the one for 2 (its bucket size is inert on one rank, and kept)
    assert one["built"] == [{"bucket_mb": 4.0, "checkpointed": 2}] and start["dropped"] == []
    assert (start["entry_size"], start["searched_samples_per_s"]) == (1, 50.0)
    assert (start["accumulation_steps"], start["micro_batch"]) == (1, 8)
    loss = {r[m.STEP]: r[m.LOSS] for r in whole["rows"]}
    for row in one["rows"]:
        assert row[m.LOSS] == pytest.approx(loss[row[m.STEP]], rel=1e-4), row[m.STEP]


def test_hsdp_tuned_on_two_nodes_runs_there_and_is_dropped_on_one(tmp_path) -> None:
    entries = {4: {"tuned": {"strategy": "fsdp", "hsdp": True}}}
    spec = _spec(2, entries, world=4, strategy="fsdp")
    two_nodes, one_node = run_distributed(_on_two_nodes_then_one, spec, str(tmp_path),
                                          world_size=4, timeout_s=300.0)[0]  # fmt: skip
    assert two_nodes["built"] == [{"mesh": (2, 2), "post_forward": 2}]
    assert two_nodes["rows"][0][m.EVENTS][0]["dropped"] == []
    # HSDP would raise in fsdp_mesh here
    assert one_node["built"] == [{"mesh": (4,), "post_forward": 4}]
    dropped = one_node["rows"][0][m.EVENTS][0]["dropped"]
    assert [d["key"] for d in dropped] == ["hsdp"]


def test_an_integer_reshard_runs_where_it_divides_and_is_dropped_after_a_resize(tmp_path) -> None:
    """``reshard_after_forward: 2`` tuned on 4 ranks reshards to pairs there (FSDP2's
    post-forward group of 2); resumed on 3 ranks, which 2 does not divide, it is dropped (the
    default: the whole group of 3) and the run goes on at the unresized run's losses."""
    entries = {4: {"tuned": {"strategy": "fsdp", "reshard_after_forward": 2}}}
    spec = _spec(5, entries, world=4, batch=12, strategy="fsdp")
    four = run_distributed(_train, spec, None, str(tmp_path / "a"), 1, world_size=4,
                           timeout_s=300.0)[0]  # fmt: skip
    assert four["built"] == [{"mesh": (4,), "post_forward": 2}]
    assert four["rows"][0][m.EVENTS][0]["dropped"] == []
    three = run_distributed(_train, spec, str(tmp_path / "a" / "step_3"), str(tmp_path / "b"),
                            1, world_size=3, timeout_s=300.0)[0]  # fmt: skip
    assert three["built"] == [{"mesh": (3,), "post_forward": 3}]
    start = three["rows"][0][m.EVENTS][0]
    assert [d["key"] for d in start["dropped"]] == ["reshard_after_forward"]
    # the global batch held, the micro-batch at most the one measured (max_micro_batch 3)
    assert (start["entry_size"], start["accumulation_steps"], start["micro_batch"]) == (4, 2, 2)
    loss = {r[m.STEP]: r[m.LOSS] for r in four["rows"]}
    assert [r[m.STEP] for r in three["rows"]] == [4, 5]
    for row in three["rows"]:
        assert row[m.LOSS] == pytest.approx(loss[row[m.STEP]], rel=1e-4), row[m.STEP]


def test_an_entry_variable_reaches_the_process_and_a_dropped_one_is_unset(tmp_path) -> None:
    env = {"NCCL_SOCKET_NTHREADS": "4"}
    spec = _spec(1, {2: {"tuned": {}, "env": env}}, use_gpu=True)
    os.environ.pop("NCCL_SOCKET_NTHREADS", None)
    seen = run_distributed(_env_after_plan, spec, 2)[0]
    assert seen == "4"  # 2 ranks on 2 nodes: socket threads run
    os.environ["NCCL_SOCKET_NTHREADS"] = "4"  # as the worker group's start would set it
    try:
        assert run_distributed(_env_after_plan, spec, 1)[0] is None  # one node: unset
    finally:
        del os.environ["NCCL_SOCKET_NTHREADS"]


def _env_after_plan(rank: int, world: int, spec: dict, nodes: int) -> str | None:
    os.environ["LOCAL_WORLD_SIZE"] = str(world // nodes)
    os.environ["LOCAL_RANK"] = str(rank % (world // nodes))
    trainer = ElasticTrainer(RunSpec(**spec), rank, world, None, None, None)
    plan = trainer._plan({})
    assert dataclasses.is_dataclass(plan)
    return os.environ.get("NCCL_SOCKET_NTHREADS")
