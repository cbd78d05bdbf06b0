"""Correctness guard, driver side: a fast configuration that computes the wrong thing loses.

Every configuration starts from the same seeded weights and data stream, and every knob the
spaces tune is exact: it may change the order of a sum, never its value beyond rounding. The
worker records the warm-up steps' global losses, gradient norms and updates (how far each
optimizer step moved the parameters along its gradient) with dropout off (``train_fns.guard``);
here they are compared with the baseline's. A configuration beyond the
tolerance ends ``corrupt``, is told to Optuna as failed and can never be best.

The tolerance is measured, not guessed: tests/dist/test_guard.py runs every exact knob of the
spaces on 2 gloo ranks (tiny BERT with dropout, 4 warm-up steps: DDP and FSDP, accumulation
1/2/4, buckets 1 and 100 MB, gradient views, static graph, checkpointing, unsynced buffers,
foreach AdamW, FSDP prefetch) and writes the figures to $COMMTUNE_GUARD_FIGURES. Largest
relative difference from the baseline, fp32: 7.6e-8 (losses), 2.4e-8 (gradient norms); bf16
autocast: 5.2e-5 (losses), 6.0e-4 (gradient norms, FSDP at accumulation 1). One rank's gradients
perturbed after the all-reduce moved the first step's norm by 1.35e-1 (DDP) and 5.0e-2 (FSDP,
one shard), the losses only by 3e-5 to 9e-5 in 4 steps (so the norm is the sharp test). Each
tolerance sits far above its precision's rounding (which grows over steps and with model size)
and below the injected fault: fp32 1e-3 (10^4 x the rounding, 50 x below the fault), bf16 1e-2
(17 x its rounding, 5 x below the fault); fp16 (GPU only, not measured here) gets bf16's, its
rounding unit being finer. The updates differ by as little as the gradient norms under every
exact knob, while a doubled learning rate doubles them (the same test; the figures are in the
record named guard-update in benchmarks/results/).

Lossy knobs (opt-in, ``search.lossy``) round the gradients themselves, so each declares its own
tolerance (``train_fns.guard.LOSSY_TOLERANCES``, beside the precisions' ``TOLERANCES``), measured
by the same test: the fp16 compression hook moved the fp32 study's gradient norms by 2.1e-5 and its
losses by 7.6e-8 (acc 1 and 2); a bf16 reduce-scatter under bf16 moved them by 6.6e-4 and 1.8e-5
against the bf16 baseline (where bf16's exact FSDP runs reach 6.0e-4: at bf16 the low reduce hides
in the compute's rounding). torch registers the bf16 hook on CUDA/NCCL only; it rounds reduced
gradients to bf16 like the bf16 reduce-scatter, and its rounding unit is 8 x fp16's (about 1.7e-4
by the fp16 figure). Each gets 1e-2: 15 x or more above its effect, and still 5 x (FSDP) to 13 x
(DDP) below the injected fault, which the test checks is caught at every tolerance here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from train_fns.guard import TOLERANCE, tolerance_for


def relative_gap(a: float, b: float) -> float:
    """|a - b| relative to the baseline's value ``b`` (absolute near zero)."""
    return abs(a - b) / max(abs(b), 1e-12)


def check(
    base: dict[str, Any], got: dict[str, Any], tolerance: float = TOLERANCE, fp16: bool = False
) -> str | None:
    """Why ``got`` did not compute what the baseline did (the evidence for the trial's reason),
    or None. Both are ``train_fns.guard`` figures over the same warm-up steps. A gradient
    figure both sides overflowed is a step GradScaler skips; under ``fp16`` so is one that
    overflowed on one side only (another accumulation split sums other magnitudes at the same
    loss scale), and the losses still judge the run; the updates after one that only one side
    skipped are not compared (``on_one_path``)."""
    if fp16:
        base, got = on_one_path(base, got)
    for what, b, g, gradient in _figures(base, got):
        overflowed = (not math.isfinite(b), not math.isfinite(g))
        if gradient and (all(overflowed) or (fp16 and any(overflowed))):
            continue
        if not relative_gap(g, b) <= tolerance:  # NaN fails too
            return (
                f"warm-up step {what} {g:.6g} vs the baseline's {b:.6g} "
                f"(relative difference {relative_gap(g, b):.2e} > tolerance {tolerance:g}); "
                "an exact knob must compute the same up to summation order"
            )
    return None


def first_steps(figures: dict[str, Any], steps: int) -> dict[str, Any]:
    """``figures`` as a run that guarded only its first ``steps`` steps records them: every
    per-step list cut there, at any depth of the dictionaries that hold them."""

    def cut(value: Any) -> Any:
        return {k: cut(v) for k, v in value.items()} if isinstance(value, dict) else value[:steps]

    return {key: cut(value) for key, value in figures.items()}


def on_one_path(base: dict[str, Any], got: dict[str, Any]) -> tuple[dict, dict]:
    """Both sides' figures, their updates only up to the first step one of them alone skipped
    (GradScaler: its gradient norm overflowed), that step included: from there on one side's
    update is Adam's first and the other's its second, from other weights. The losses and
    gradient norms move by one step's update, far less than a tolerance: they still judge."""
    norms = zip(base.get("grad_norms") or [], got.get("grad_norms") or [], strict=False)
    split = next((step for step, (b, g) in enumerate(norms)
                  if math.isfinite(b) != math.isfinite(g)), None)  # fmt: skip

    def updates_cut(figures: dict[str, Any]) -> dict[str, Any]:
        updates = {k: v for k, v in figures.items() if k.startswith("update")}
        return {**figures, **first_steps(updates, split + 1)}

    return (base, got) if split is None else (updates_cut(base), updates_cut(got))


def _figures(base: dict[str, Any], got: dict[str, Any]) -> Iterator[tuple[str, float, float, bool]]:
    """(what, the baseline's, got's, whether a gradient figure) for every figure both sides
    recorded: the gradient norm and the loss of each step, then each shard's norm in every
    layout both recorded (one corrupt rank of N moves the global norm by 1/N of what it moves
    its own shard's)."""
    for key, label, gradient in (("grad_norms", "grad norm", True), ("losses", "loss", False)):
        for step, (b, g) in enumerate(zip(base.get(key) or [], got.get(key) or [], strict=False)):
            yield f"{step} {label}", b, g, gradient
    shared = set(base.get("shard_norms") or {}) & set(got.get("shard_norms") or {})
    for count in sorted(shared, key=int):
        yield from _per_shard(count, base["shard_norms"][count], got["shard_norms"][count],
                              "grad norm")  # fmt: skip
    yield from _update_figures(base, got)


def _per_shard(
    count: str, base: list[list[float]], got: list[list[float]], what: str
) -> Iterator[tuple[str, float, float, bool]]:
    """Each step's figure of each of ``count`` shards, both sides' (gradient figures)."""
    for step, (b, g) in enumerate(zip(base, got, strict=False)):
        for index, (bs, gs) in enumerate(zip(b, g, strict=False)):
            yield f"{step} shard {index} of {count} {what}", bs, gs, True


def _update_figures(
    base: dict[str, Any], got: dict[str, Any]
) -> Iterator[tuple[str, float, float, bool]]:
    """The updates' figures both sides recorded (``train_fns.guard.Guard.after_update``): how
    far each step's update moved the parameters along its gradient, the highest and the lowest
    rank's, globally and per shard. Judged as gradient figures: a skipped step gives inf."""
    for side in ("high", "low"):
        steps = zip((base.get("updates") or {}).get(side) or [],
                    (got.get("updates") or {}).get(side) or [], strict=False)  # fmt: skip
        for step, (b, g) in enumerate(steps):
            yield f"{step} update ({side}est rank)", b, g, True
    b_shards, g_shards = base.get("update_shards") or {}, got.get("update_shards") or {}
    for count in sorted(set(b_shards) & set(g_shards), key=int):
        for side in ("high", "low"):
            yield from _per_shard(count, b_shards[count][side], g_shards[count][side],
                                  f"update ({side}est rank)")  # fmt: skip


def guard_check(
    reference: dict[str, Any] | None, got: dict[str, Any] | None, plan: Any
) -> str | None:
    """``check`` at the plan's tolerance when there is a baseline to compare with; a lossy plan
    says so in its reason. A configuration that completed without figures (a worker side too
    old to record them) is not judged."""
    if not reference or not got:
        return None
    why = check(reference, got, tolerance_for(plan), fp16=plan.precision == "fp16")
    if why is not None and plan.lossy():
        why += f" (lossy: {', '.join(plan.lossy())}, beyond its declared tolerance)"
    return why
