"""The probe's sweep on two gloo ranks: every op and size measured, figures consistent."""

from __future__ import annotations

import torch
from _spawn import run_distributed

from train_fns.collectives import MIN_ITERS, fits, sweep
from train_fns.metrics import OPS

SIZES = [4] + [2**k for k in range(10, 21)]  # 4 bytes: all-gather/reduce-scatter cannot split it
CPU = torch.device("cpu")


def _sweep(rank: int, world_size: int, sizes: list[int], budget_s: float) -> tuple[list, list]:
    streamed: list[dict] = []
    rows = sweep(sizes, list(OPS), 5, 1, CPU, budget_s=budget_s, on_row=streamed.append)
    return rows, streamed


def test_sweep_measures_every_op_and_size() -> None:
    # A budget no size can exhaust: every op and size gets its 5 iterations even when the one
    # warm-up iteration (the budget's estimate) is a cold, slow first call.
    (rows, streamed), (other_rows, other_streamed) = run_distributed(_sweep, SIZES, 60.0)
    assert other_rows == [] and other_streamed == []  # rows come back on rank 0 only
    assert streamed == rows
    expected = [(op, size) for op in OPS for size in SIZES if fits(op, size, 2)]
    assert [(r["op"], r["size_bytes"]) for r in rows] == expected
    assert ("all_gather", 4) not in expected and ("all_reduce", 4) in expected
    for row in rows:
        assert row["world_size"] == 2 and row["backend"] == "gloo" and row["iters"] == 5
        assert row["time_s"] > 0
        assert row["algbw_gbps"] == row["size_bytes"] / row["time_s"] / 1e9
        assert "busbw_gbps" not in row  # the driver adds it (orchestrator.probe.sweep)
    for op in OPS:
        algbw = [r["algbw_gbps"] for r in rows if r["op"] == op]
        # 1 MiB moves orders of magnitude faster per byte than 1 KiB (latency-bound).
        assert algbw[-1] > algbw[0], op


def test_large_sizes_get_fewer_iterations_within_the_budget() -> None:
    rows, _ = run_distributed(_sweep, [2**20], 1e-9)[0]
    assert [r["iters"] for r in rows] == [MIN_ITERS] * len(OPS)
