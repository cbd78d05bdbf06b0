"""The correctness guard's tolerance logic: summation-order differences pass, anything beyond
the measured tolerance (or not a number) ends the configuration as corrupt, with evidence."""

from __future__ import annotations

import dataclasses
import math

from orchestrator.search.correctness import (
    check,
    guard_check,
    relative_gap,
)
from train_fns.guard import LOSSY_TOLERANCES, TOLERANCE, tolerance_for
from train_fns.plan import DDPOptions, FSDPOptions, TrialPlan

PLAN = TrialPlan("bert-tiny", "mlm", 16, 8, 2, 1, 4, use_gpu=True)
BASE = {"losses": [6.30, 6.21, 6.05, 5.90], "grad_norms": [2.10, 1.95, 1.80, 1.70]}


def _scaled(key: str, step: int, factor: float) -> dict:
    got = {k: list(v) for k, v in BASE.items()}
    got[key][step] *= factor
    return got


def test_summation_order_differences_pass() -> None:
    assert check(BASE, BASE) is None
    assert check(BASE, _scaled("losses", 3, 1 + 1e-6)) is None  # 10x the largest measured
    assert check(BASE, _scaled("grad_norms", 0, 1 - TOLERANCE / 2)) is None


def test_beyond_the_tolerance_is_corrupt_with_the_evidence() -> None:
    why = check(BASE, _scaled("grad_norms", 0, 1.12))  # what the injected fault does
    assert why.startswith("warm-up step 0 grad norm 2.352 vs the baseline's 2.1")
    assert f"> tolerance {TOLERANCE:g}" in why
    assert "loss" in check(BASE, _scaled("losses", 2, 1 + 2 * TOLERANCE))


def test_not_a_number_is_corrupt_and_missing_figures_are_not_judged() -> None:
    assert check(BASE, _scaled("losses", 1, math.nan)) is not None
    assert guard_check(None, BASE, PLAN) is None and guard_check(BASE, {}, PLAN) is None
    assert check(BASE, {"losses": BASE["losses"][:2], "grad_norms": []}) is None  # fewer steps
    assert relative_gap(0.0, 0.0) == 0.0


def test_a_group_reports_a_corrupt_configuration_as_corrupt() -> None:
    """The group's driver judges each configuration against the baseline figures its
    ``Member`` carries, before the result reaches Tune, the printer and Optuna."""
    from types import SimpleNamespace

    from orchestrator.search.trial import Member, _measure
    from train_fns import metrics as m
    plan = PLAN
    wrong = {"losses": BASE["losses"], "grad_norms": [2.35, *BASE["grad_norms"][1:]]}

    class Run:
        plans, env, nodes = [plan, plan], {}, None

        def run(self, source, emit, **_: object):
            emit(0, {m.STATE: m.COMPLETE, m.GUARD: BASE})
            emit(1, {m.STATE: m.COMPLETE, m.GUARD: wrong})

    told: list[tuple[int, dict]] = []
    members = [Member(1, {}, None, BASE), Member(2, {}, None, BASE)]
    _measure(Run(), iter(()), members, SimpleNamespace(link=None), lambda mb, o: told.append(
        (mb.number, o)))  # fmt: skip
    assert [(n, o[m.STATE]) for n, o in told] == [(1, m.COMPLETE), (2, m.CORRUPT)]
    assert told[1][1][m.REASON].startswith("warm-up step 0 grad norm 2.35 vs the baseline's 2.1")


def test_reduced_precision_gets_its_own_tolerance() -> None:
    got = _scaled("grad_norms", 0, 1 + 5e-3)  # bf16 rounding can reach 5e-4; fp32 cannot
    bf16 = dataclasses.replace(PLAN, precision="bf16")
    assert guard_check(BASE, got, PLAN) is not None
    assert guard_check(BASE, got, bf16) is None
    assert guard_check(BASE, _scaled("grad_norms", 0, 1.05), bf16) is not None


def test_a_lossy_knob_is_judged_against_its_declared_tolerance() -> None:
    hook = dataclasses.replace(PLAN, ddp=DDPOptions(comm_hook="fp16"))
    assert hook.lossy() == ["ddp.comm_hook=fp16"]
    assert tolerance_for(hook) == LOSSY_TOLERANCES["ddp.comm_hook=fp16"] > TOLERANCE
    got = _scaled("grad_norms", 0, 1 + LOSSY_TOLERANCES["ddp.comm_hook=fp16"] / 2)
    assert guard_check(BASE, got, PLAN) is not None  # exact: far beyond summation order
    assert guard_check(BASE, got, hook) is None
    why = guard_check(BASE, _scaled("grad_norms", 0, 1.12), hook)  # the injected fault
    assert why is not None and "lossy: ddp.comm_hook=fp16" in why
    # a knob of the other strategy is inert, so not lossy
    assert dataclasses.replace(PLAN, fsdp=FSDPOptions(reduce_dtype="fp32")).lossy() == []
    fsdp = dataclasses.replace(PLAN, strategy="fsdp", precision="bf16",
                               fsdp=FSDPOptions(reduce_dtype="bf16"))  # fmt: skip
    assert tolerance_for(fsdp) == LOSSY_TOLERANCES["fsdp.reduce_dtype=bf16"]
    assert set(LOSSY_TOLERANCES) == {f"{k}={v}" for k, v in (
        ("ddp.comm_hook", "bf16"), ("ddp.comm_hook", "fp16"), ("fsdp.reduce_dtype", "bf16"),
        ("fsdp.reduce_dtype", "fp16"))}  # fmt: skip  every lossy value declares one
