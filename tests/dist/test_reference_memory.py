"""The no-sync reference micro-step (no accumulation: the compute-only twin of a synced
micro-step) must not hold every unsharded gradient under FSDP2: a backward with sync off keeps
each full gradient until the next synced one (N x 4 bytes a rank, not N / world), so a model
that fits only sharded would run out of memory there, and the peak would be inflated."""

from __future__ import annotations

import torch
from _spawn import run_distributed
from _tiny import CPU, tiny_plan
from torch.distributed.fsdp import FSDPModule

from train_fns.loop import build_runner
from train_fns.plan import TrialPlan


def _fsdp_params(model: torch.nn.Module) -> list:
    """FSDP2's per-parameter state (``FSDPParam``), where its unsharded gradients live."""
    return [param for module in model.modules() if isinstance(module, FSDPModule)
            for group in module._get_fsdp_state()._fsdp_param_groups
            for param in group.fsdp_params]  # fmt: skip


def _held_bytes(params: list) -> int:
    """Bytes of unsharded gradients FSDP2 holds now (autograd's, or its reduce-dtype copy)."""
    held = 0
    for param in params:
        for grad in (param._unsharded_param.grad, param.unsharded_accumulated_grad):
            held += grad.numel() * grad.element_size() if grad is not None else 0
    return held


def _reference_held(rank: int, world: int, plans: list[TrialPlan]) -> list[tuple[int, int, int]]:
    """Per plan: the most unsharded-gradient bytes held while the reference's gradients
    accumulate, the largest parameter's and all parameters' full bytes."""
    out = []
    for plan in plans:
        runner, _ = build_runner(plan, rank, CPU)
        runner.run_step(step=0)  # a synced step: FSDP2 has made its unsharded parameters
        params = _fsdp_params(runner.model)
        sizes = [p._unsharded_param.numel() * 4 for p in params]  # fp32 gradients or copies
        most = [0]

        def probe(_: torch.Tensor, params: list = params, most: list = most) -> None:
            most[0] = max(most[0], _held_bytes(params))

        handles = [p._unsharded_param.register_post_accumulate_grad_hook(probe) for p in params]
        runner.nosync_reference(step=1)
        for handle in handles:
            handle.remove()
        out.append((most[0], max(sizes), sum(sizes)))
    return out


def test_the_fsdp_reference_holds_one_unsharded_gradient_at_a_time() -> None:
    plans = [tiny_plan(strategy="fsdp"), tiny_plan(strategy="fsdp", precision="bf16")]
    for held, largest, full in run_distributed(_reference_held, plans)[0]:
        assert 0 < held <= largest < full / 2, (held, largest, full)
