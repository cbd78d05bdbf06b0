"""The guard at 16 ranks (issue 24 item 7): one corrupt rank under FSDP2 moves the global
gradient norm by about 1/16 of its own shard's change, inside bf16's tolerance, so the
shard's own norm against the DDP baseline's same chunk is what catches it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from _spawn import run_distributed
from _tiny import guard_figures, tiny_plan

from orchestrator.search.correctness import TOLERANCES, check

WORLD = 16
STEPS = {"warmup_steps": 2, "measure_steps": 1, "num_windows": 1, "world_size": WORLD,
         "global_batch": WORLD, "micro_batch": 1}  # fmt: skip


@pytest.mark.slow  # 16 processes: about a minute on 2 cores
def test_one_corrupt_rank_of_sixteen_is_caught_at_bf16_tolerance() -> None:
    changes = {"ddp": {}, "fsdp": {"strategy": "fsdp"},
               "fsdp corrupt": {"strategy": "fsdp", "fault": "corrupt"}}  # fmt: skip
    plans = {name: replace(tiny_plan(), **STEPS, **c).to_dict() for name, c in changes.items()}
    figures = run_distributed(guard_figures, plans, world_size=WORLD, timeout_s=400.0)[0]
    base, bad = figures["ddp"], figures["fsdp corrupt"]
    assert check(base, figures["fsdp"], TOLERANCES["fp32"]) is None  # exact: shards agree
    hidden = {**bad, "shard_norms": {}}
    assert check(base, hidden, TOLERANCES["bf16"]) is None, "the global norm alone sees it now"
    reason = check(base, bad, TOLERANCES["bf16"])
    assert reason is not None and f"shard {WORLD - 1} of {WORLD}" in reason
