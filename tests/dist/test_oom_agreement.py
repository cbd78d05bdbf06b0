"""After an out-of-memory error on every rank at the same step, the group goes on only if the
ranks had issued as many collectives: NCCL is asynchronous, so ranks that fail at different
allocations of one step have left different numbers of bucket all-reduces in flight, and the
next configuration's collectives would pair with the stale ones. Here one rank leaves one
collective issued and unmatched (as a rank that got one bucket further would)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from _spawn import run_distributed

from train_fns.group import agree_all_oom, issued_collectives
from train_fns.ranks import side_group


def _oom_after(rank: int, world_size: int, extra_on: int | None) -> str:
    side_group()
    group = dist.new_group(timeout=timedelta(seconds=5))  # a training group of the plan
    dist.all_reduce(torch.ones(2), group=group)  # matched: both ranks count it
    if rank == extra_on:  # one bucket further before running out of memory: left in flight
        dist.all_reduce(torch.ones(2), group=group, async_op=True)
    issued = issued_collectives()[1]  # (groups, sum, weighted sum): the sum
    try:
        agree_all_oom(world_size, step=5)
    except RuntimeError as e:
        return f"{issued}: {e}"
    return f"{issued}: goes on"


def test_ranks_that_issued_as_many_collectives_go_on() -> None:
    assert run_distributed(_oom_after, None) == ["1: goes on", "1: goes on"]


def test_ranks_that_issued_different_numbers_of_collectives_end_the_group() -> None:
    results = run_distributed(_oom_after, 1)
    assert [r.split(":")[0] for r in results] == ["1", "2"], results
    for r in results:
        assert "different numbers of collectives issued on the training groups (1 to 2)" in r
        assert "the worker group cannot go on" in r
