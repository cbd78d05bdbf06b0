"""DDP and FSDP2 on gloo, world size 2, against a single-process reference.

Every *exact* knob (strategy, accumulation split, activation checkpointing, DDP buckets) must
leave the gradient of one global batch unchanged. The workers run the real step code
(``StepRunner.accumulate_gradients``); the reference is one plain backward on all samples.
"""

from __future__ import annotations

import traceback

import pytest
import torch
from _spawn import full_gradients, run_distributed
from _tiny import CPU, tiny_plan

from train_fns.data import make_batch_source
from train_fns.loop import build_runner
from train_fns.models import build_model
from train_fns.plan import DDPOptions, FSDPOptions, TrialPlan
from train_fns.strategies import sync_gradients
from train_fns.workload import to_device


@pytest.fixture(scope="module")
def reference_gradients() -> dict[str, torch.Tensor]:
    """One process, one backward over the whole global batch of step 0."""
    plan = tiny_plan(world_size=1)
    model = build_model(plan)
    batch = make_batch_source(plan, model.config).batch(0, 0, 0, CPU)
    model(**batch).loss.backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


SCENARIOS = {
    "ddp": tiny_plan(),
    "fsdp": tiny_plan(strategy="fsdp"),
    "ddp-accum4-no_sync": tiny_plan(accumulation_steps=4),
    "fsdp-accum4-no_sync": tiny_plan(accumulation_steps=4, strategy="fsdp"),
    "ddp-checkpointing-accum2-bucket_view": tiny_plan(
        accumulation_steps=2,
        activation_checkpointing=True,
        ddp=DDPOptions(bucket_cap_mb=0.01, gradient_as_bucket_view=True),
    ),
    "ddp-checkpointing-static_graph": tiny_plan(
        activation_checkpointing=True, ddp=DDPOptions(static_graph=True)
    ),
    "fsdp-checkpointing-no_reshard": tiny_plan(
        accumulation_steps=2,
        strategy="fsdp",
        activation_checkpointing=True,
        fsdp=FSDPOptions(reshard_after_forward=False),
    ),
}


def _gradients(rank: int, plan: TrialPlan) -> dict[str, torch.Tensor]:
    """Step 0's gradients through the real micro-step loop, gathered in full."""
    runner, _ = build_runner(plan, rank, CPU)
    runner.accumulate_gradients(step=0)
    return full_gradients(runner.model)


def _local_gradients_under_no_sync(rank: int, plan: TrialPlan) -> dict[str, torch.Tensor]:
    """Gradients after one micro-step with sync off: each rank's own, not the average."""
    runner, _ = build_runner(plan, rank, CPU)
    with sync_gradients(runner.model, plan, enabled=False):
        runner.loss(to_device(runner.host_batch(0, 0), CPU)).backward()
    return full_gradients(runner.model)


def _scenarios_worker(rank: int, world_size: int, plans: dict[str, dict]) -> dict[str, object]:
    """Every scenario in one process group: one spawn instead of one per scenario.

    A failing scenario returns its traceback so that only its own test fails.
    """
    results: dict[str, object] = {}
    for name, plan_dict in plans.items():
        plan = TrialPlan.from_dict(plan_dict)
        try:
            if name == NO_SYNC_PROBE:
                results[name] = _local_gradients_under_no_sync(rank, plan)
            else:
                results[name] = _gradients(rank, plan)
        except Exception:
            results[name] = traceback.format_exc()
    return results


NO_SYNC_PROBE = "ddp-no_sync-probe"


@pytest.fixture(scope="module")
def distributed_results() -> list[dict[str, object]]:
    plans = {name: plan.to_dict() for name, plan in SCENARIOS.items()}
    plans[NO_SYNC_PROBE] = tiny_plan(accumulation_steps=4).to_dict()
    return run_distributed(_scenarios_worker, plans)


def _rank_result(results: list[dict[str, object]], rank: int, name: str) -> dict:
    result = results[rank][name]
    if isinstance(result, str):
        pytest.fail(f"rank {rank} failed in {name}:\n{result}")
    return result


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_gradients_match_single_process(
    scenario: str,
    reference_gradients: dict[str, torch.Tensor],
    distributed_results: list[dict[str, object]],
) -> None:
    for rank in range(len(distributed_results)):
        grads = _rank_result(distributed_results, rank, scenario)
        assert grads.keys() == reference_gradients.keys(), f"rank {rank}: parameter names"
        for name, expected in reference_gradients.items():
            torch.testing.assert_close(
                grads[name], expected, rtol=1e-4, atol=1e-6, msg=f"rank {rank} {name}"
            )


def test_no_sync_really_skips_the_all_reduce(
    distributed_results: list[dict[str, object]],
) -> None:
    """Guards the test above: exact gradients alone would also pass with a sync every step."""
    grads = [_rank_result(distributed_results, rank, NO_SYNC_PROBE) for rank in (0, 1)]
    differing = [name for name in grads[0] if not torch.equal(grads[0][name], grads[1][name])]
    assert differing, "ranks hold identical gradients after a no_sync micro-step"
