"""Correctness guard, driver side: a fast configuration that computes the wrong thing loses.

Every configuration starts from the same seeded weights and data stream, and every knob the
spaces tune is exact: it may change the order of a sum, never its value beyond rounding. The
worker records the warm-up steps' global losses and gradient norms with dropout off
(``train_fns.guard``); here they are compared with the baseline's. A configuration beyond the
tolerance ends ``corrupt``, is told to Optuna as failed and can never be best.

The tolerance is measured, not guessed: tests/dist/test_guard.py runs every exact knob of the
spaces on 2 gloo ranks (fp32, tiny BERT with dropout, 4 warm-up steps: DDP and FSDP,
accumulation 1/2/4, buckets 1 and 100 MB, gradient views, static graph, checkpointing) and
writes the figures it compared to $COMMTUNE_GUARD_FIGURES; ``TOLERANCE`` must sit well above
the largest relative difference they show (rounding grows over steps and with model size) and
well below what one rank's perturbed gradients do.
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
