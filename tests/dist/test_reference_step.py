"""The no-sync reference micro-step (timed to split compute from communication) must leave no
trace in the step after it: under FSDP2 its unsynced gradient sat in FSDP2's own buffers, which
``zero_grad`` does not clear, and the next synced backward added it in."""

from __future__ import annotations

import pytest
from _spawn import full_gradients, run_distributed
from _tiny import CPU, tiny_plan

from train_fns.loop import build_runner
from train_fns.plan import TrialPlan


def _step_gradients(rank: int, world: int, plan: TrialPlan, reference: bool) -> dict:
    """Step 0's synced gradients, with or without a reference micro-step before them."""
    runner, _ = build_runner(plan, rank, CPU)
    if reference:
        runner.nosync_reference(step=0)
    runner.accumulate_gradients(step=0)
    return full_gradients(runner.model)


@pytest.mark.parametrize(
    "strategy,precision", [("fsdp", "fp32"), ("fsdp", "bf16"), ("ddp", "fp32")]
)
def test_a_reference_micro_step_leaves_the_next_step_unchanged(
    strategy: str, precision: str
) -> None:
    plan = tiny_plan(strategy=strategy, precision=precision)
    plain = run_distributed(_step_gradients, plan, False)[0]
    after = run_distributed(_step_gradients, plan, True)[0]
    worst = max((after[name] - grad).abs().max().item() for name, grad in plain.items())
    assert worst <= 1e-6, f"max |delta grad| = {worst:.3g} after a reference micro-step"
