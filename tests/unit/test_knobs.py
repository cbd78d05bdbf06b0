"""The DDP/FSDP/optimizer knobs without Ray: which appear for which world size, nodes, backend,
precision and opt-in; the plan and config checks that refuse what torch cannot run; and the
outputs (trials.csv, best.yaml, best.env) that carry them."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.schema import ConfigError, load_config
from orchestrator.planning.from_config import plan_from_config
from orchestrator.search.results import TrialRecord, write_outputs
from search_spaces import SearchContext, SearchSpace, SpaceError, load_spaces
from search_spaces._expr import parse_condition
from train_fns import metrics as m
from train_fns.plan import DDPOptions, FSDPOptions, InfeasiblePlan
from train_fns.strategies import COMM_HOOKS

SPACES = ["strategy", "accumulation", "ddp", "fsdp", "nccl", "optimizer"]


def _offered(context: SearchContext) -> dict[str, set[Any]]:
    """Every value each active param takes somewhere in the space (strategy searched)."""
    space = SearchSpace(load_spaces(SPACES), context)
    names = ["reshard_after_forward", "hsdp", "reduce_dtype", "comm_hook", "adamw_impl",
             "forward_prefetch", "broadcast_buffers", "activation_checkpointing", "strategy"]
    points = space.grid_slice(names, limit=100_000)
    return {n: {p[n] for p in points if n in p} for n in names}


def _ctx(backend: str = "nccl", world: int = 8, nodes: int = 1, **kw: Any) -> SearchContext:
    return SearchContext(backend, "search", backend == "nccl", world, nodes, 64 * world, **kw)


def test_integer_reshard_only_where_it_divides_the_world_strictly() -> None:
    assert _offered(_ctx(world=2))["reshard_after_forward"] == {True, False}
    assert _offered(_ctx(world=6))["reshard_after_forward"] == {True, False, 2}
    assert _offered(_ctx(world=8))["reshard_after_forward"] == {True, False, 2, 4}
    assert _offered(_ctx(world=16))["reshard_after_forward"] == {True, False, 2, 4, 8}


def test_hsdp_only_on_several_nodes_of_several_workers_and_never_with_an_int_reshard() -> None:
    assert _offered(_ctx(world=8, nodes=1))["hsdp"] == set()
    assert _offered(_ctx(world=2, nodes=2))["hsdp"] == set()  # one worker per node
    assert _offered(_ctx(world=16, nodes=2))["hsdp"] == {True, False}
    space = SearchSpace(load_spaces(SPACES), _ctx(world=16, nodes=2))
    points = space.grid_slice(["strategy", "reshard_after_forward", "hsdp"])
    assert all(isinstance(p["reshard_after_forward"], bool) for p in points if p.get("hsdp"))
    assert any(p.get("reshard_after_forward") == 2 and "hsdp" not in p for p in points)


def test_lossy_knobs_only_with_search_lossy_and_where_they_act() -> None:
    exact = _offered(_ctx(precision="bf16"))
    assert exact["comm_hook"] == set() and exact["reduce_dtype"] == set()
    lossy = _offered(_ctx(precision="bf16", lossy=True))
    assert lossy["comm_hook"] == {None, "bf16", "fp16"}
    assert lossy["reduce_dtype"] == {"fp32", "bf16"}  # the parameters' dtype, not fp16
    assert _offered(_ctx(precision="fp32", lossy=True))["reduce_dtype"] == set()  # nothing to cast
    gloo = _offered(_ctx("gloo", world=2, lossy=True))
    assert gloo["comm_hook"] == {None, "fp16"}  # torch's bf16 hook needs CUDA + NCCL
    assert _offered(_ctx(world=1, lossy=True))["comm_hook"] == set()  # no all-reduce


def test_adamw_impl_fused_on_gpus_foreach_on_cpus() -> None:
    assert _offered(_ctx("nccl"))["adamw_impl"] == {None, "fused"}
    assert _offered(_ctx("gloo", world=2))["adamw_impl"] == {None, "foreach"}


def test_ddp_gets_checkpointing_and_buffer_sync_knobs() -> None:
    space = SearchSpace(load_spaces(SPACES), _ctx("gloo", world=2))
    ddp = [p for p in space.grid_slice(["strategy", "activation_checkpointing"])
           if p["strategy"] == "ddp"]  # fmt: skip
    assert {p["activation_checkpointing"] for p in ddp} == {True, False}
    assert _offered(_ctx("gloo", world=2))["broadcast_buffers"] == {True, False}
    one = _offered(_ctx("gloo", world=1))
    assert one["activation_checkpointing"] == {True, False}  # memory, even on one worker
    assert one["broadcast_buffers"] == set() and one["forward_prefetch"] == set()


def test_a_condition_can_test_divisibility() -> None:
    cond = parse_condition("world_size % 4 == 0 and world_size > 4", "k")
    assert [cond.evaluate({"world_size": w}) for w in (4, 8, 12, 6)] == [False, True, True, False]
    assert cond.evaluate({}) is None
    with pytest.raises(SpaceError, match="left side"):
        parse_condition("world_size % 0 == 0", "k")


def _plan(knobs: dict[str, Any]) -> Any:
    config = load_config(preset="smoke", sets=["cluster.num_workers=4"])
    return plan_from_config(config, "mlm", False, knobs, 4, {})


@pytest.mark.parametrize(
    ("knobs", "text"),
    [
        ({"reshard_after_forward": 3}, "divide the world size"),
        ({"reshard_after_forward": 4}, "strictly between 1"),
        ({"reduce_dtype": "bf16"}, "precision=fp32; use fp32"),
        ({"comm_hook": "int8"}, "comm_hook"),
        ({"comm_hook": "bf16"}, "NCCL >= 2.10"),
        ({"adamw_impl": "fused"}, "needs GPUs"),
        ({"forward_prefetch": 9}, "0 to 8"),
        ({"hsdp": True, "reshard_after_forward": 2}, "true or false with HSDP"),
    ],
)
def test_infeasible_knobs_are_refused_by_the_plan(knobs: dict, text: str) -> None:
    with pytest.raises(InfeasiblePlan, match=text):
        _plan(knobs)


def test_knobs_reach_the_plan() -> None:
    plan = _plan({"strategy": "fsdp", "reshard_after_forward": 2, "forward_prefetch": 1,
                  "backward_prefetch": 2, "broadcast_buffers": False,
                  "comm_hook": "fp16", "adamw_impl": "foreach", "activation_checkpointing": True})
    assert plan.fsdp == FSDPOptions(reshard_after_forward=2, forward_prefetch=1,
                                    backward_prefetch=2)  # fmt: skip
    assert _plan({"strategy": "fsdp", "hsdp": True}).fsdp.hsdp
    assert plan.ddp == DDPOptions(broadcast_buffers=False, comm_hook="fp16")
    assert plan.adamw_impl == "foreach" and plan.activation_checkpointing
    assert plan.lossy() == []  # the DDP hook is inert under FSDP
    assert set(COMM_HOOKS) == {"bf16", "fp16"}


BAD_TUNED = [
    (["tuned.comm_hook=fp16"], "tuned.comm_hook", "search.lossy: true"),
    (["tuned.comm_hook=int8"], "tuned.comm_hook", "bf16, fp16"),
    (["tuned.reduce_dtype=bf16", "search.lossy=true"], "tuned.reduce_dtype", "fp32; use fp32"),
    (["tuned.reshard_after_forward=3"], "tuned.reshard_after_forward", "divide"),
    (["tuned.reshard_after_forward=1"], "tuned.reshard_after_forward", "from 2"),
    (["tuned.forward_prefetch=9"], "tuned.forward_prefetch", "0, 1, 2"),
    (["tuned.adamw_impl=fused", "cluster.use_gpu=false"], "tuned.adamw_impl", "CUDA only"),
    (["tuned.hsdp=1"], "tuned.hsdp", "true or false"),
]


@pytest.mark.parametrize(("sets", "key", "text"), BAD_TUNED)
def test_bad_tuned_knobs_exit_2_naming_key_value_and_fix(
    sets: list[str], key: str, text: str, capsys: pytest.CaptureFixture
) -> None:
    from orchestrator.search.cli import main

    code = main(["--preset", "smoke", *[a for s in sets for a in ("--set", s)]])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert key in err and text in err, err


def test_good_tuned_knobs_load() -> None:
    config = load_config(preset="smoke", sets=[
        "cluster.num_workers=4", "workload.global_batch=16", "tuned.reshard_after_forward=2",
        "tuned.comm_hook=fp16", "search.lossy=true", "tuned.forward_prefetch=2"])  # fmt: skip
    assert config.tuned["reshard_after_forward"] == 2
    with pytest.raises(ConfigError, match="lossy"):
        load_config(preset="smoke", sets=["tuned.comm_hook=fp16"])


def test_outputs_carry_the_knobs_and_the_tuner_plugin(tmp_path: Path) -> None:
    config = load_config(preset="smoke", sets=["search.lossy=true"])
    context = SearchContext("gloo", "ddp", False, 2, 1, 16, lossy=True)
    space = SearchSpace(load_spaces(["accumulation", "ddp"]), context)
    best = {**space.baseline(), "broadcast_buffers": False, "comm_hook": "fp16"}
    recs = [TrialRecord(0, m.COMPLETE, "", space.baseline(), {m.SAMPLES_PER_S: 10.0}),
            TrialRecord(1, m.COMPLETE, "", best, {m.SAMPLES_PER_S: 12.0})]  # fmt: skip
    write_outputs(recs, config, space, tmp_path)
    rows = list(csv.DictReader((tmp_path / "trials.csv").open()))
    assert rows[1]["broadcast_buffers"] == "False" and rows[1]["comm_hook"] == "fp16"
    assert rows[1]["lossy"] == "comm_hook=fp16" and rows[0]["lossy"] == ""
    assert "# lossy: comm_hook=fp16" in (tmp_path / "best.yaml").read_text()
    again = load_config(str(tmp_path / "best.yaml"), preset=None)
    assert again.tuned["broadcast_buffers"] is False and again.tuned["comm_hook"] == "fp16"
    assert "NCCL_TUNER" not in (tmp_path / "best.env").read_text()
    (tmp_path / "nccl_tuner.conf").write_text("allreduce,0,65536,tree,simple,-1,-1,2,-1,-1\n")
    write_outputs(recs, config, space, tmp_path)
    env = (tmp_path / "best.env").read_text()
    assert 'export NCCL_TUNER_PLUGIN="${NCCL_TUNER_PLUGIN:-example}"' in env
    assert f"export NCCL_TUNER_CONFIG_FILE={(tmp_path / 'nccl_tuner.conf').resolve()}" in env
    assert "NCCL_TUNER" not in (tmp_path / "best.yaml").read_text()  # a door: best.env only
