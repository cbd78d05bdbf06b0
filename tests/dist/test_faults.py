"""Injected faults end the workers the way the driver expects to classify them.

The fault lands on the last rank at the first measured step; the other rank must not wait
forever either: the dead peer's connection errors out, or its own watchdog ends it.
"""

from __future__ import annotations

import signal

import pytest
from _spawn import run_to_exit
from _tiny import CPU, tiny_plan

from train_fns.loop import run_training
from train_fns.metrics import HANG_EXIT_CODE, WATCHDOG_PREFIX
from train_fns.plan import TrialPlan

HANG_DEADLINE_S = 5.0
"""Short, so the hang test is quick; the watchdog's clock also covers set-up and warm-up."""
DEADLINE_S = 60.0
"""For crash and OOM the peer's connection error ends the healthy rank; the watchdog must
not fire first on a slow, shared machine."""
FAILED = 1  # an uncaught exception in a spawned process


def _faulty_worker(rank: int, world_size: int, plan_dict: dict) -> None:
    run_training(TrialPlan.from_dict(plan_dict), rank, world_size, CPU, lambda _: None)


def _run_with_fault(fault: str) -> list[int | None]:
    plan = tiny_plan(
        warmup_steps=1,
        measure_steps=2,
        num_windows=1,
        fault=fault,
        step_deadline_s=HANG_DEADLINE_S if fault == "hang" else DEADLINE_S,
    )
    return run_to_exit(_faulty_worker, plan.to_dict(), timeout_s=120)


@pytest.mark.parametrize(
    ("fault", "faulty_rank_exit", "message"),
    [
        ("crash", -signal.SIGKILL, None),
        ("oom", FAILED, "commtune injected fault: out of memory in forward (micro_batch=4)"),
        (
            "hang",
            HANG_EXIT_CODE,
            f"{WATCHDOG_PREFIX} rank 1 finished no step in 5s; ending this worker (hang)",
        ),
    ],
    ids=["crash", "oom", "hang"],
)
def test_fault_ends_both_ranks(
    fault: str, faulty_rank_exit: int, message: str | None, capfd: pytest.CaptureFixture
) -> None:
    healthy, faulty = _run_with_fault(fault)
    assert faulty == faulty_rank_exit
    assert healthy in (FAILED, HANG_EXIT_CODE), "the healthy rank must not outlive the fault"
    if message is not None:
        assert message in capfd.readouterr().err
