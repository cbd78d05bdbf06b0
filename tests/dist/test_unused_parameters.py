"""A model whose steps leave parameters unused (examples/moe_workload.py: one expert per
sample, so a micro-batch of a few samples leaves experts unused, and ranks differ in which)
through the real worker loop on gloo ranks: DDP with find_unused_parameters, FSDP2
as one unit (train_fns/unused.py) on 2 ranks and HSDP on 4 ranks posing as 2 nodes, with and
without accumulation, give one process's losses on the same samples; DDP without it stops, as
it did for users; a checkpoint resumes exactly where a parameter never had a gradient."""

from __future__ import annotations

import pytest
import torch
from _spawn import run_distributed
from _tiny import CPU, EXAMPLES, example_plan, step_losses

from train_fns.plan import DDPOptions, TrialPlan

OPTIONS = {"width": 16, "experts": 4}
ENTRYPOINT = f"{EXAMPLES / 'moe_workload.py'}:make_workload"
STEPS = 4


def plan(world_size: int, accumulation: int, **changes: object) -> TrialPlan:
    return example_plan("moe_workload", OPTIONS, world_size, accumulation, **changes)


def _used_experts(rank: int, world_size: int) -> list[list[int]]:
    """Which experts the samples of each of the reference's micro-batches pick: the test needs
    micro-batches that leave experts unused, and not always the same ones."""
    from train_fns.workload import WorkloadContext, as_workload, load_entrypoint

    ctx = WorkloadContext(seed=0, rank=0, world_size=1, device=CPU, seq_len=1, options=OPTIONS,
                          precision="fp32")  # fmt: skip
    torch.manual_seed(0)
    workload = as_workload(load_entrypoint(ENTRYPOINT)(ctx))
    picks = []
    for k in range(STEPS * 2):
        x, _ = workload.batch(list(range(k * 4, k * 4 + 4)))
        scores = workload.model.router(workload.model.inp(x))
        picks.append(sorted(set(scores.argmax(dim=1).tolist())))
    return picks


FOUND = DDPOptions(find_unused_parameters=True)


@pytest.fixture(scope="module")
def references() -> list:
    """One process, micro-batches of 4 and of 2: the same micro-batches as 2 ranks at
    accumulation 1 and 2 (the second also as 4 ranks of 2 samples each)."""
    picks = run_distributed(_used_experts, world_size=1)[0]
    some = [p for p in picks if len(p) < OPTIONS["experts"]]
    assert some and len({tuple(p) for p in picks}) > 1, f"experts picked per micro-batch: {picks}"
    singles = [plan(1, 2, ddp=FOUND).to_dict(), plan(1, 4, ddp=FOUND).to_dict()]
    return run_distributed(step_losses, singles, STEPS, world_size=1)[0]


def _same(results: list, references: list, what: str) -> None:
    for accumulation, losses, reference in zip((1, 2), results, references, strict=False):
        assert not isinstance(losses, str) and not isinstance(reference, str), losses
        assert losses[-1] != losses[0], "it trains"
        torch.testing.assert_close(losses, reference, rtol=1e-4, atol=1e-5,
                                   msg=f"{what} accumulation {accumulation}")  # fmt: skip


def test_unused_experts_train_exactly_with_ddp(references: list) -> None:
    variants = [plan(2, 1, ddp=FOUND), plan(2, 2, ddp=FOUND)]
    _same(run_distributed(step_losses, [p.to_dict() for p in variants], STEPS)[0], references,
          "ddp")  # fmt: skip


def test_unused_experts_train_exactly_with_fsdp_as_one_unit(references: list) -> None:
    """Ranks route to different experts in the same step: FSDP2 per unit paired one rank's
    expert with another's (1.3027 against 1.3154 at step 0); as one unit it is exact."""
    fsdp = {"strategy": "fsdp", "ddp": FOUND, "unused_parameters": True}
    variants = [plan(2, 1, **fsdp), plan(2, 2, **fsdp)]
    _same(run_distributed(step_losses, [p.to_dict() for p in variants], STEPS)[0], references,
          "fsdp")  # fmt: skip


def _posing_as_two_nodes(rank: int, world_size: int, plans: list[dict], steps: int) -> list:
    import os

    os.environ["LOCAL_WORLD_SIZE"], os.environ["LOCAL_RANK"] = "2", str(rank % 2)
    return step_losses(rank, world_size, plans, steps)


def test_unused_experts_train_exactly_with_hsdp(references: list) -> None:
    """4 ranks of 2 samples each (accumulation 1): the micro-batches of one process at 2."""
    from train_fns.plan import FSDPOptions

    hsdp = plan(4, 1, strategy="fsdp", ddp=FOUND, unused_parameters=True,
                fsdp=FSDPOptions(hsdp=True))  # fmt: skip
    results = run_distributed(_posing_as_two_nodes, [hsdp.to_dict()], STEPS, world_size=4)[0]
    _same(results, references[1:], "hsdp")


@pytest.mark.parametrize("accumulation", [1])
def test_ddp_without_find_unused_parameters_stops_as_users_saw(accumulation: int) -> None:
    (stopped,) = run_distributed(step_losses, [plan(2, accumulation).to_dict()], STEPS)[0]
    assert isinstance(stopped, str) and "Expected to have finished reduction" in stopped


def _search_loop(rank: int, world_size: int, plans: list[dict]) -> list:
    """Each plan through the search's own loop (warm-up with the guard, windows, and at
    accumulation 1 the no-sync reference step): its windows' losses, or what stopped it."""
    from train_fns import metrics as m
    from train_fns.loop import run_training

    out: list = []
    for data in plans:
        windows: list[dict] = []
        try:
            run_training(TrialPlan.from_dict(data), rank, world_size, CPU, windows.append)
        except RuntimeError as e:
            out.append(str(e))
            continue
        out.append([w[m.LOSS] for w in windows])
    return out


def test_the_search_loop_measures_such_a_model() -> None:
    """The trial loop adds what step_losses does not: the guard's warm-up and, without
    accumulation, a no-sync reference micro-step whose gradients are discarded (DDP's reducer
    with find_unused_parameters then saw undefined gradients it still meant to all-reduce)."""
    steps = {"warmup_steps": 3, "measure_steps": 4, "num_windows": 2}
    fsdp = {"strategy": "fsdp", "ddp": FOUND, "unused_parameters": True}
    plans = [plan(2, 1, ddp=FOUND, **steps), plan(2, 2, ddp=FOUND, **steps),
             plan(2, 1, **fsdp, **steps), plan(2, 2, **fsdp, **steps)]  # fmt: skip
    results = run_distributed(_search_loop, [p.to_dict() for p in plans], timeout_s=240)[0]
    for result in results:
        assert not isinstance(result, str) and len(result) == 2, result


class _TwoHeads(torch.nn.Module):
    """``b`` is an expert no step has routed to yet: it has no gradient, so no optimizer state."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x)


def _resume(rank: int, world_size: int, folder: str) -> list[float]:
    """Train 2 steps, checkpoint, train 2 more; then a fresh model and optimizer load the
    checkpoint and train the same 2: the losses after the checkpoint, both ways."""
    from pathlib import Path
    from types import SimpleNamespace

    from torch.nn.parallel import DistributedDataParallel

    from train_fns.restart import load_checkpoint, save_checkpoint

    def build() -> tuple:
        torch.manual_seed(0)
        model = DistributedDataParallel(_TwoHeads(), find_unused_parameters=True)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> list[float]:
        losses = []
        for step in steps:
            loss = model(torch.full((2, 4), float(step + rank))).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))
        return losses

    model, opt = build()
    train(model, opt, range(2))
    save_checkpoint(SimpleNamespace(model=model, optimizer=opt, rank=rank), {"step": 2},
                    Path(folder))  # fmt: skip
    straight = train(model, opt, range(2, 4))
    model, opt = build()
    load_checkpoint(SimpleNamespace(model=model, optimizer=opt, rank=rank), Path(folder))
    return [*straight, *train(model, opt, range(2, 4))]


def test_a_checkpoint_resumes_exactly_where_a_parameter_never_had_a_gradient(tmp_path) -> None:  # noqa: ANN001
    """A fresh optimizer's state names every parameter; the checkpoint has none for ``b``:
    loading once failed ("Missing key in checkpoint state_dict: optim.state.b.weight.step")."""
    straight_and_resumed = run_distributed(_resume, str(tmp_path), timeout_s=120)[0]
    assert straight_and_resumed[:2] == straight_and_resumed[2:], straight_and_resumed
