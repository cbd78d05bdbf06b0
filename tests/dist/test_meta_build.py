"""Large models: no rank but rank 0 builds the whole model, and every rank still starts from
exactly the weights a whole build has (buffers and tied weights included), its own shard of
them under FSDP2. A user's workload may build on meta too, handing rank 0's weights over."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from _spawn import run_distributed
from _tiny import CPU, GLOBAL_BATCH, step_losses, tiny_plan
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from train_fns import tuned
from train_fns.loop import build_runner, make_workload
from train_fns.models import build_model
from train_fns.plan import TrialPlan
from train_fns.strategies import wrap_model
from train_fns.weights import canonical_name, full_state, materialise

TINY_LLAMA = {
    "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64,
    "tie_word_embeddings": True,
}  # fmt: skip
"""A rotary model: its frequencies are a buffer no state dict holds, and its head is tied."""


def _bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes with storage behind them (a meta tensor has none; a DTensor counts its shard)."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local if not t.is_meta)


def _weights(model: torch.nn.Module, sharded: bool) -> dict[str, torch.Tensor]:
    """The whole model's weights as every rank sees them, by canonical name."""
    inner = model if sharded else model.module
    options = StateDictOptions(full_state_dict=True)
    state = get_model_state_dict(inner, options=options) if sharded else inner.state_dict()
    state.update((canonical_name(n), b) for n, b in inner.named_buffers())
    return {canonical_name(k): v.detach().clone() for k, v in state.items()}


def _built(rank: int, world: int, plans: list[dict]) -> list[dict]:
    """Per plan: bytes each rank's workload holds before wrapping and after, whether its head
    is still tied, and whether its weights equal a whole build's."""
    out = []
    for data in plans:
        plan = TrialPlan.from_dict(data)
        workload = make_workload(plan, rank, CPU)
        before = _bytes(list(workload.model.parameters()))
        sharded = plan.strategy == "fsdp"
        model = wrap_model(workload.model, plan, CPU, workload.blocks, workload.full_state)
        inner = model if sharded else model.module
        whole = full_state(build_model(plan))
        got = _weights(model, sharded)
        out.append({
            "before": before,
            "after": _bytes(list(model.parameters())),
            "whole": _bytes(list(whole.values())),
            "tied": inner.get_output_embeddings().weight is inner.get_input_embeddings().weight,
            "equal": sorted(got) == sorted(whole)
            and all(torch.equal(got[k], whole[k]) for k in whole),
        })  # fmt: skip
    return out


def test_only_rank_0_builds_the_whole_model_and_every_rank_gets_its_weights() -> None:
    llama = {"model": "llama", "task": "clm", "model_overrides": TINY_LLAMA}
    plans = [
        tiny_plan(),
        tiny_plan(strategy="fsdp"),
        tiny_plan(strategy="fsdp", activation_checkpointing=True),
        tiny_plan(**llama),
        tiny_plan(strategy="fsdp", **llama),
    ]
    ranks = run_distributed(_built, [plan.to_dict() for plan in plans])
    for plan, zero, one in zip(plans, *ranks, strict=True):
        assert zero["equal"] and one["equal"], plan
        assert zero["tied"] and one["tied"], plan
        assert zero["before"] == one["before"] == 0, (plan, zero, one)  # meta until wrapped
        if plan.strategy == "fsdp":  # each rank keeps its half (blocks padded to the world)
            assert one["after"] < 0.6 * one["whole"], (plan, one)


META_WORKLOAD = '''
import torch
from torch import nn
from train_fns.weights import full_state

def make_workload(ctx):
    def build():
        torch.manual_seed(ctx.seed)
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    with torch.device("meta"):
        model = build()
    state = full_state(build()) if ctx.rank == 0 and ctx.options.get("hand_over") else None
    xs = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    return {
        "model": model, "blocks": [model[0], model[2]], "full_state": state,
        "batch": lambda indices: xs[indices],
        "loss": lambda model, batch: model(batch).pow(2).mean(),
    }
'''


def _trained(rank: int, world: int, plans: list[dict]) -> list:
    """Per plan: its first two steps' losses, or the text of the RuntimeError that stopped
    building it."""
    out: list = []
    for data in plans:
        try:
            out.extend(step_losses(rank, world, [data], 2))
        except RuntimeError as e:
            out.append(str(e))
    return out


def _meta_plan(path: Path, strategy: str, **options: bool) -> TrialPlan:
    return TrialPlan(
        model="meta-mlp", task=None, seq_len=1, global_batch=GLOBAL_BATCH, world_size=2,
        accumulation_steps=1, micro_batch=GLOBAL_BATCH // 2, strategy=strategy,
        entrypoint=f"{path}:make_workload", options=options, lr=1e-2,
    )  # fmt: skip


def test_a_users_meta_model_trains_from_rank_0s_weights_or_stops_on_every_rank(
    tmp_path: Path,
) -> None:
    path = tmp_path / "meta_workload.py"
    path.write_text(META_WORKLOAD)
    plans = [_meta_plan(path, s, hand_over=True) for s in ("ddp", "fsdp")]
    plans.append(_meta_plan(path, "fsdp", hand_over=False))
    zero, one = run_distributed(_trained, [plan.to_dict() for plan in plans])
    assert zero[0] == one[0] == zero[1] == one[1], (zero, one)  # the same training either way
    assert len(zero[0]) == 2 and zero[0][0] != zero[0][1], zero  # and it trains
    for stopped in (zero[2], one[2]):
        assert "rank 0 has no weights" in stopped and "full_state" in stopped, stopped


class _Ordered(set):
    """A set that iterates its names sorted, or reversed: two processes whose hash seeds
    differ (every Ray worker draws its own) may iterate one set of names in either order."""

    reverse = False

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set.__iter__(self), reverse=self.reverse))


def _buffers_filled(rank: int, world: int, plans: list[dict]) -> list[bool]:
    """Per plan: whether every buffer equals a whole build's once rank 0's weights are filled
    in (under FSDP2 by wrapping, under DDP before its constructor, which on an older torch
    broadcasts no buffer at ``broadcast_buffers=False``), rank 1 iterating every module's
    set of non-persistent buffer names in the other order."""
    out = []
    for data in plans:
        plan = TrialPlan.from_dict(data)
        workload = make_workload(plan, rank, CPU)
        for module in workload.model.modules():
            names = _Ordered(module._non_persistent_buffers_set)
            names.reverse = rank == 1
            module._non_persistent_buffers_set = names
        model = workload.model
        if plan.strategy == "fsdp":
            model = wrap_model(model, plan, CPU, workload.blocks, workload.full_state)
        else:
            materialise(model, workload.full_state, CPU, sharded=False)
        whole = dict(build_model(plan).named_buffers())
        out.append(all(torch.equal(b, whole[n]) for n, b in model.named_buffers()))
    return out


def test_every_buffer_reaches_its_own_name_whatever_order_a_process_sees_names_in() -> None:
    plans = [tiny_plan(strategy="fsdp"), tiny_plan()]  # BERT: position and token type ids
    zero, one = run_distributed(_buffers_filled, [plan.to_dict() for plan in plans])
    assert zero == one == [True, True], (zero, one)


SHARED_WORKLOAD = '''
import torch
from torch import nn
from train_fns.weights import full_state

class Scaled(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("scale", scale, persistent=False)

    def forward(self, x):
        return self.linear(x) * self.scale

def make_workload(ctx):
    def build():
        torch.manual_seed(ctx.seed)
        scale = torch.rand(4) + 0.5
        return nn.Sequential(Scaled(scale), nn.ReLU(), Scaled(scale))  # one buffer, two modules
    real = ctx.rank == 0 and ctx.options.get("real_on_rank_0")
    with torch.device("cpu" if real else "meta"):
        model = build()
    state = full_state(build()) if ctx.rank == 0 else None
    if state is not None and ctx.options.get("wrong"):
        del state["0.linear.bias"]
        state["2.linear.weight"] = torch.zeros(4, 5)
    xs = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    return {
        "model": model, "blocks": [model[0], model[2]], "full_state": state,
        "batch": lambda indices: xs[indices],
        "loss": lambda model, batch: model(batch).pow(2).mean(),
    }
'''


def _shared_runs(rank: int, world: int, plans: list[dict]) -> list:
    """Per plan: whether the two modules still share one buffer, its value and the first
    step's loss on this rank; or the text of the RuntimeError that stopped building it."""
    out: list = []
    for data in plans:
        try:
            runner, _ = build_runner(TrialPlan.from_dict(data), rank, CPU)
        except RuntimeError as e:
            out.append(str(e))
            continue
        inner = runner.model.module if data["strategy"] == "ddp" else runner.model
        out.append({"tied": inner[0].scale is inner[2].scale, "scale": inner[0].scale.clone(),
                    "loss": float(runner.run_step(0))})  # fmt: skip
    return out


def test_a_shared_buffer_stays_shared_and_a_bad_hand_over_stops_every_rank_alike(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared_workload.py"
    path.write_text(SHARED_WORKLOAD)
    plans = [_meta_plan(path, "ddp"), _meta_plan(path, "fsdp"),
             _meta_plan(path, "fsdp", real_on_rank_0=True), _meta_plan(path, "ddp", wrong=True),
             _meta_plan(path, "fsdp", wrong=True)]  # fmt: skip
    zero, one = run_distributed(_shared_runs, [plan.to_dict() for plan in plans], timeout_s=90)
    torch.manual_seed(0)
    scale = torch.rand(4) + 0.5
    for run in (*zero[:2], *one[:2]):
        assert isinstance(run, dict) and run["tied"] and torch.equal(run["scale"], scale), run
    assert abs(zero[0]["loss"] - zero[1]["loss"]) < 1e-6 * abs(zero[0]["loss"]), zero
    assert zero[2] == one[2] and "on some ranks only" in zero[2], (zero[2], one[2])
    for stopped in (*zero[3:], *one[3:]):
        assert stopped == zero[3] and "full_state does not fit" in stopped, (zero, one)
    assert "missing 0.linear.bias" in zero[3] and "2.linear.weight is [4, 5]" in zero[3], zero


TUNED_BEST = {
    "strategy": "fsdp",
    "workload": {"model": "bert-tiny", "global_batch": GLOBAL_BATCH, "seq_len": 16},
    "cluster": {"num_workers": 2},
    "tuned": {"accumulation_steps": 1, "reshard_after_forward": True},
}  # fmt: skip


def _tuned_weights(rank: int, world: int, data: dict) -> dict[str, torch.Tensor]:
    """The weights a meta-built workload has once ``tuned.wrap`` shards it, by name."""
    workload = make_workload(TrialPlan.from_dict(data), rank, CPU)
    model = tuned.wrap(workload.model, TUNED_BEST, CPU, workload.blocks, workload.full_state)
    return _weights(model, sharded=True)


def test_tuned_wrap_fills_a_meta_model_from_rank_0s_weights() -> None:
    plan = tiny_plan(strategy="fsdp")
    whole = full_state(build_model(plan))
    for got in run_distributed(_tuned_weights, plan.to_dict()):
        assert sorted(got) == sorted(whole), sorted(set(got) ^ set(whole))
        assert all(torch.equal(got[k], whole[k]) for k in whole)
