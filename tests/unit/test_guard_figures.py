"""The correctness guard under fp16 loss scaling and in a warm group:
norms judged unscaled, a step both sides overflowed is not called corrupt, and a warm plan's
guard sees a step after an optimizer update."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn

from orchestrator.search.correctness import check, first_steps
from orchestrator.search.group_run import WARM_WARMUP_STEPS
from train_fns.guard import Guard, guarded_steps, shard_squares

INF = math.inf


def _runner(scale: float | None, grad: float) -> SimpleNamespace:
    model = nn.Linear(1, 1, bias=False)
    model.weight.grad = torch.full((1, 1), grad)
    precision = SimpleNamespace(loss_scale=lambda: scale)
    return SimpleNamespace(model=model, fault=None, device=torch.device("cpu"),
                           precision=precision, plan=SimpleNamespace(world_size=1))  # fmt: skip


def test_the_norm_is_judged_unscaled() -> None:
    """Scaled by GradScaler's 2^16, the same gradient gives the fp32 run's norm."""
    scaled, plain = Guard(), Guard()
    scaled.after_backward(_runner(2.0**16, 3.0 * 2**16))
    plain.after_backward(_runner(None, 3.0))
    scaled.record_loss(torch.tensor(1.0))
    plain.record_loss(torch.tensor(1.0))
    assert scaled.figures()["grad_norms"] == plain.figures()["grad_norms"] == [3.0]


def test_an_overflow_on_both_sides_is_a_skipped_step_not_a_corruption() -> None:
    """GradScaler's first steps overflow at 2^16 in baseline and candidate alike: inf - inf
    was NaN and every fp16 trial came out corrupt."""
    base = {"losses": [2.0, 1.9], "grad_norms": [INF, 1.0]}
    assert check(base, {"losses": [2.0, 1.9], "grad_norms": [INF, 1.0]}) is None
    assert check(base, {"losses": [2.0, 1.9], "grad_norms": [math.nan, 1.0]}) is None


def test_an_overflow_on_one_side_only_is_caught_outside_fp16() -> None:
    """Under fp16 another accumulation split can overflow alone at the same loss scale: its
    gradient figure is skipped there, and the losses still judge it."""
    base = {"losses": [2.0, 1.9], "grad_norms": [1.0, 1.0]}
    reason = check(base, {"losses": [2.0, 1.9], "grad_norms": [INF, 1.0]})
    assert reason is not None and "warm-up step 0 grad norm" in reason
    assert check(base, {"losses": [2.0, 1.9], "grad_norms": [INF, 1.0]}, 1e-2, fp16=True) is None
    assert check(base, {"losses": [2.0, 2.5], "grad_norms": [INF, 1.0]}, 1e-2, fp16=True)
    assert check({**base, "grad_norms": [INF, 1.0]}, base) is not None
    assert check(base, {"losses": [2.0, math.nan], "grad_norms": [1.0, 1.0]}) is not None


def test_a_warm_plan_guards_the_update_and_measures_no_first_train_step() -> None:
    """Step 0's gradients come before any optimizer step: the guard's update figure checks the
    optimizer's side in that same step (it was blind there with WARM_WARMUP_STEPS = 1), and
    the last warm-up step runs with dropout on, so the first measured step is not the first."""
    assert WARM_WARMUP_STEPS - guarded_steps(WARM_WARMUP_STEPS) == 1
    assert guarded_steps(WARM_WARMUP_STEPS) >= 1
    assert guarded_steps(1) == 1 and guarded_steps(0) == 1


def _updated(lr: float, grad: float, scale: float | None = None, skip: bool = False,
             free: bool = False) -> dict:
    """The guard's figures for one SGD step of a 1-parameter model at weight 2. ``skip``: the
    step GradScaler skips (no update, its scale halved); ``free``: the optimizer frees the
    gradient in its step."""
    runner = _runner(scale, grad)
    runner.model.weight.data.fill_(2.0)
    guard = Guard()
    guard.after_backward(runner)
    optimizer = torch.optim.SGD(runner.model.parameters(), lr=lr)
    if skip:
        runner.precision.loss_scale = lambda: scale / 2
    else:
        if scale is not None:
            runner.model.weight.grad.div_(scale)  # GradScaler unscales in place
        optimizer.step()
    if free:
        runner.model.weight.grad = None
    guard.after_update(runner)
    guard.record_loss(torch.tensor(1.0))
    return guard.figures()


def test_the_update_figure_catches_an_optimizer_side_fault() -> None:
    """Same loss, same gradient: only the update tells a doubled learning rate apart. SGD moves
    the weight by -0.1 x 3, so along the gradient 3 x -0.3; at lr 0.2, 3 x -0.6."""
    base = _updated(0.1, 3.0)
    assert base["updates"]["high"] == base["updates"]["low"]
    assert math.isclose(base["updates"]["high"][0], -0.9, rel_tol=1e-6)  # an fp32 weight
    assert math.isclose(_updated(0.2, 3.0)["updates"]["high"][0], -1.8, rel_tol=1e-6)
    assert check(base, _updated(0.1, 3.0)) is None
    reason = check(base, _updated(0.2, 3.0))
    assert reason is not None and "0 update (highest rank)" in reason
    assert "1" in base["update_shards"]  # the one layout of one rank
    older = {key: value for key, value in base.items() if not key.startswith("update")}
    assert check(older, _updated(0.2, 3.0)) is None  # a baseline that recorded no update


def test_a_skipped_step_updates_nothing_and_is_judged_as_overflowed() -> None:
    """A step GradScaler skips gives inf in every update figure, as its gradient norm, not a
    fault of 0 against the baseline's change; on a rank whose own shard did not overflow too
    (the scale it lowered on every rank says so), and whatever the gradients were left as."""
    for skipped in (_updated(0.1, INF, scale=2.0**16, skip=True),
                    _updated(0.1, 3.0 * 2**16, scale=2.0**16, skip=True)):  # fmt: skip
        assert skipped["updates"] == {"high": [INF], "low": [INF]}
        assert skipped["update_shards"]["1"] == {"high": [[INF]], "low": [[INF]]}
        assert check(skipped, skipped) is None
        assert check(_updated(0.1, 3.0), skipped, 1e-2, fp16=True) is None
    taken = _updated(0.1, 3.0 * 2**16, scale=2.0**16)  # unscaled: as the fp32 run's
    assert math.isclose(taken["updates"]["high"][0], -0.9, rel_tol=1e-6)


def test_updates_after_a_one_sided_skip_are_not_compared_under_fp16() -> None:
    """Under fp16 a step only one side skipped leaves one side's next update Adam's first and
    the other's its second: the updates after it are not compared (all would fail), the losses
    and gradient norms still are."""
    base = {"losses": [2.0, 1.9, 1.8], "grad_norms": [1.0, 1.0, 1.0],
            "updates": {"high": [-0.5, -0.4, -0.3], "low": [-0.5, -0.4, -0.3]}}  # fmt: skip
    got = {"losses": [2.0, 1.9, 1.8], "grad_norms": [INF, 1.0, 1.0],
           "updates": {"high": [INF, -0.6, -0.1], "low": [INF, -0.6, -0.1]}}  # fmt: skip
    assert check(base, got, 1e-2, fp16=True) is None
    reason = check(base, {**got, "losses": [2.0, 1.9, 2.5]}, 1e-2, fp16=True)
    assert reason is not None and "2 loss" in reason
    reason = check(base, got, 1e-2)  # outside fp16 an overflow on one side is caught
    assert reason is not None and "warm-up step 0 grad norm" in reason
    reason = check({**base, "grad_norms": [INF, 1.0, 1.0]}, got, 1e-2, fp16=True)
    assert reason is not None and "1 update" in reason  # both skipped: still one path
    cut = first_steps({"a": [1, 2], "b": {"2": {"high": [[1], [2]]}}}, 1)
    assert cut == {"a": [1], "b": {"2": {"high": [[1]]}}}


def test_an_optimizer_that_frees_the_gradients_in_its_step_is_still_judged() -> None:
    """The guard holds the step's gradients from before the optimizer: one that sets
    ``p.grad = None`` in its step (to save memory) is judged, not a crash of every trial."""
    assert _updated(0.1, 3.0, free=True)["updates"] == _updated(0.1, 3.0)["updates"]


def test_a_non_finite_update_is_inf_before_the_ranks_reduce_it() -> None:
    """gloo's max may drop a NaN: a NaN update is recorded as inf, which it keeps."""
    assert _updated(float("nan"), 3.0)["updates"] == {"high": [INF], "low": [INF]}


def test_a_full_gradient_is_chunked_as_fsdp2_shards_it() -> None:
    """A DDP baseline's shard figures are the squares of torch.chunk's dim-0 chunks, the
    pieces FSDP2's Shard(0) gives each rank (ceil-sized; short or empty at the end)."""
    grad = torch.arange(30, dtype=torch.float32).reshape(10, 3)
    got = shard_squares(grad, 4, torch.device("cpu"))
    want = [float(c.double().pow(2).sum()) for c in torch.chunk(grad, 4, dim=0)]
    assert got.tolist() == want and len(torch.chunk(grad, 4)) == 4
    assert shard_squares(torch.ones(2, 2), 4, torch.device("cpu")).tolist() == [2, 2, 0, 0]


def test_one_corrupt_shard_of_sixteen_is_caught_where_the_global_norm_hides_it() -> None:
    """One rank's shard 12% off (the injected fault's size) moves the norm of 16 equal
    shards by under 1%: inside bf16's 1e-2, so only the shard's own figure catches it."""
    base_shards = [[1.0] * 16]
    bad = [[1.0] * 15 + [1.12]]
    global_base = [math.sqrt(sum(x * x for x in base_shards[0]))]
    global_bad = [math.sqrt(sum(x * x for x in bad[0]))]
    base = {"losses": [2.0], "grad_norms": global_base, "shard_norms": {"16": base_shards}}
    got = {"losses": [2.0], "grad_norms": global_bad, "shard_norms": {"16": bad}}
    assert check({**base, "shard_norms": {}}, {**got, "shard_norms": {}}, 1e-2) is None
    reason = check(base, got, 1e-2)
    assert reason is not None and "shard 15 of 16" in reason
    other_layout = {**got, "shard_norms": {"8": [[1.0] * 8]}}
    assert check(base, other_layout, 1e-2) is None  # no layout in common: the global norm
