"""Correctness guard, driver side: a fast configuration that computes the wrong thing loses.

Every configuration starts from the same seeded weights and data stream, and every knob the
spaces tune is exact: it may change the order of a sum, never its value beyond rounding. The
worker records the warm-up steps' global losses and gradient norms with dropout off
(``train_fns.guard``); here they are compared with the baseline's. A configuration beyond the
tolerance ends ``corrupt``, is told to Optuna as failed and can never be best.

The tolerance is measured, not guessed (tests/dist/test_guard.py on 2 gloo ranks, fp32, tiny
BERT, 4 warm-up steps, every exact knob of the spaces: DDP and FSDP, accumulation 1/2/4,
buckets 1 and 100 MB, gradient views, static graph, checkpointing): the largest relative
difference from the baseline was 1.3e-7 for the losses and 6.6e-7 for the gradient norms, and
one rank's gradients perturbed after the all-reduce moved the first step's norm by about 12%.
``TOLERANCE`` sits orders of magnitude above the first (rounding grows over steps and with
model size; AdamW's normalised first steps amplify it) and far below the second.
"""

from __future__ import annotations

from typing import Any

TOLERANCE = 1e-3
"""Largest relative difference from the baseline of a warm-up loss or gradient norm."""


def relative_gap(a: float, b: float) -> float:
    """|a - b| relative to the baseline's value ``b`` (absolute near zero)."""
    return abs(a - b) / max(abs(b), 1e-12)


def check(base: dict[str, Any], got: dict[str, Any], tolerance: float = TOLERANCE) -> str | None:
    """Why ``got`` did not compute what the baseline did (the evidence for the trial's reason),
    or None. Both are ``train_fns.guard`` figures over the same warm-up steps."""
    for key, label in (("grad_norms", "grad norm"), ("losses", "loss")):
        pairs = list(zip(base.get(key) or [], got.get(key) or [], strict=False))
        for step, (b, g) in enumerate(pairs):
            if not relative_gap(g, b) <= tolerance:  # NaN fails too
                return (
                    f"warm-up step {step} {label} {g:.6g} vs the baseline's {b:.6g} "
                    f"(relative difference {relative_gap(g, b):.2e} > tolerance {tolerance:g}); "
                    "an exact knob must compute the same up to summation order"
                )
    return None


def guard_check(reference: dict[str, Any] | None, got: dict[str, Any] | None) -> str | None:
    """``check`` when there is a baseline to compare with; a configuration that completed
    without figures (a worker side too old to record them) is not judged."""
    if not reference or not got:
        return None
    return check(reference, got)
