"""The DDP/FSDP/optimizer knobs reach what torch runs: each is read back from the wrapped model
or the optimizer a worker builds from its plan (gloo, CPU), not from the plan itself.

HSDP and an integer ``reshard_after_forward`` need a shard group with a non-trivial divisor,
so they run on 4 ranks posing as 2 nodes of 2 (``LOCAL_WORLD_SIZE``/``LOCAL_RANK``, as Ray
Train and torchrun set them)."""

from __future__ import annotations

import dataclasses
import os

import pytest
from _spawn import run_distributed
from _tiny import CPU, GLOBAL_BATCH, guard_figures, tiny_plan

from orchestrator.search.correctness import check
from train_fns.loop import build_runner
from train_fns.plan import DDPOptions, FSDPOptions, TrialPlan
from train_fns.strategies import SYNC_BUFFERS_ARG

PLANS = {
    "ddp": {},
    "ddp no broadcast, fp16 hook": {"ddp": DDPOptions(broadcast_buffers=False, comm_hook="fp16")},
    "ddp foreach": {"adamw_impl": "foreach"},
    "ddp checkpointing": {"activation_checkpointing": True},
    "fsdp": {"strategy": "fsdp"},
    "fsdp prefetch 1/2": {"strategy": "fsdp", "fsdp": FSDPOptions(forward_prefetch=1,
                                                                backward_prefetch=2)},
    "fsdp bf16 reduce": {"strategy": "fsdp", "precision": "bf16",
                         "fsdp": FSDPOptions(reduce_dtype="bf16")},
}  # fmt: skip
FOUR = {
    "fsdp reshard to 2": {"strategy": "fsdp", "fsdp": FSDPOptions(reshard_after_forward=2)},
    "hsdp": {"strategy": "fsdp", "fsdp": FSDPOptions(hsdp=True)},
}


def _seen(model: object, optimizer: object) -> dict:
    """What torch holds: DDP's buffer sync and hooks, FSDP's mesh, prefetch lists and reduce
    dtype, the optimizer's implementation."""
    optim = optimizer.defaults  # type: ignore[attr-defined]
    seen = {"foreach": optim.get("foreach"), "fused": optim.get("fused")}
    if hasattr(model, "_comm_hooks"):
        hooks = [h.__qualname__ for h, _ in model._comm_hooks]  # type: ignore[attr-defined]
        wrapped = [n for n, _ in model.named_modules() if n.endswith("_checkpoint_wrapped_module")]
        return {**seen, "sync_buffers": getattr(model, SYNC_BUFFERS_ARG), "hooks": hooks,
                "checkpointed": len(wrapped)}  # fmt: skip
    root = model._get_fsdp_state()  # type: ignore[attr-defined]
    blocks = [m for m in model.modules() if hasattr(m, "_get_fsdp_state") and m is not model]
    states = [b._get_fsdp_state() for b in blocks]
    group = states[0]._fsdp_param_group
    post = group.post_forward_mesh_info
    return {
        **seen,
        "mesh": tuple(group.mesh_info.mesh.shape),
        "post_forward_shard": None if post is None else post.shard_mesh_size,
        "forward_prefetch": [[states.index(s) for s in st._states_to_forward_prefetch]
                             for st in states],
        "backward_prefetch": [[states.index(s) for s in st._states_to_backward_prefetch]
                              for st in states],
        "reduce_dtype": str(group.mp_policy.reduce_dtype),
        "root_is_sharded": root._fsdp_param_group is not None,
    }  # fmt: skip


def _applied_worker(rank: int, world_size: int, plans: dict, nodes: int) -> dict:
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size // nodes)
    os.environ["LOCAL_RANK"] = str(rank % (world_size // nodes))
    out = {}
    for name, plan in plans.items():
        runner, _ = build_runner(TrialPlan.from_dict(plan), rank, CPU)
        out[name] = _seen(runner.model, runner.optimizer)
        runner.run_step(0)  # it also trains
    return out


def _plans(changes: dict, world_size: int) -> dict:
    return {
        name: dataclasses.replace(tiny_plan(world_size=world_size), **c).to_dict()
        for name, c in changes.items()
    }


@pytest.fixture(scope="module")
def seen() -> dict:
    by_rank = run_distributed(_applied_worker, _plans(PLANS, 2), 1, timeout_s=300.0)
    return by_rank[0]


def test_ddp_knobs_reach_the_ddp_module(seen: dict) -> None:
    assert seen["ddp"]["sync_buffers"] is True and seen["ddp"]["hooks"] == []
    assert seen["ddp no broadcast, fp16 hook"]["sync_buffers"] is False
    assert seen["ddp no broadcast, fp16 hook"]["hooks"] == ["fp16_compress_hook"]
    assert seen["ddp checkpointing"]["checkpointed"] == 2  # both blocks of the tiny BERT
    assert seen["ddp"]["checkpointed"] == 0


def test_adamw_impl_reaches_the_optimizer(seen: dict) -> None:
    assert seen["ddp foreach"]["foreach"] is True
    assert seen["ddp"]["foreach"] is None and not seen["ddp"]["fused"]  # torch's choice


def test_fsdp_knobs_reach_fully_shard(seen: dict) -> None:
    plain, prefetch = seen["fsdp"], seen["fsdp prefetch 1/2"]
    assert plain["mesh"] == (2,) and plain["post_forward_shard"] == 2
    assert plain["forward_prefetch"] == [[], []] and plain["backward_prefetch"] == [[], []]
    assert prefetch["forward_prefetch"] == [[1], []]
    assert prefetch["backward_prefetch"] == [[], [0]]
    assert plain["reduce_dtype"] == "None"  # fp32 workload: nothing to cast
    assert seen["fsdp bf16 reduce"]["reduce_dtype"] == "torch.bfloat16"


def test_hsdp_and_integer_reshard_reach_the_mesh() -> None:
    assert GLOBAL_BATCH % 4 == 0
    by_rank = run_distributed(_applied_worker, _plans(FOUR, 4), 2, world_size=4,
                              timeout_s=300.0)  # fmt: skip
    seen = by_rank[0]
    assert seen["fsdp reshard to 2"]["mesh"] == (4,)
    assert seen["fsdp reshard to 2"]["post_forward_shard"] == 2
    assert seen["hsdp"]["mesh"] == (2, 2)  # replicate over 2 nodes, shard over 2 ranks each


def test_hsdp_and_integer_reshard_pass_the_guard() -> None:
    """Exact knobs: the 4-rank baseline's warm-up losses and gradient norms, up to summation
    order (the 2-rank knobs are in test_guard.py)."""
    steps = {"warmup_steps": 3, "measure_steps": 1, "num_windows": 1}
    plans = {name: {**plan, **steps} for name, plan in _plans({"ddp": {}, **FOUR}, 4).items()}
    figures = run_distributed(guard_figures, plans, 2, world_size=4, timeout_s=300.0)[0]
    for name in FOUR:
        assert check(figures["ddp"], figures[name]) is None, name
