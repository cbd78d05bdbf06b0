"""World-size truths: one worker has no link and no gradient traffic, the scaling
baseline keeps the trial's micro-batch, and a worker group goes on after an out-of-memory error
only when every rank agreed. Pure logic, no Ray."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator.planning.costmodel import link_from_probe
from search_spaces import SearchContext, SearchSpace, load_spaces
from train_fns.group import oom_verdict
from train_fns.plan import InfeasiblePlan, TrialPlan, with_world_size


def _plan(world_size: int, accumulation_steps: int, micro_batch: int) -> TrialPlan:
    return TrialPlan(
        model="bert-tiny", task="mlm", seq_len=16, global_batch=32, world_size=world_size,
        accumulation_steps=accumulation_steps, micro_batch=micro_batch,
    )  # fmt: skip


def test_the_one_worker_baseline_keeps_the_micro_batch_and_raises_accumulation() -> None:
    single = with_world_size(_plan(4, 1, 8), 1)
    assert (single.world_size, single.accumulation_steps, single.micro_batch) == (1, 4, 8)
    assert with_world_size(_plan(4, 2, 4), 1).accumulation_steps == 8
    assert with_world_size(_plan(2, 4, 4), 4).accumulation_steps == 2
    with pytest.raises(InfeasiblePlan, match="world_size=3 x micro_batch=8"):
        with_world_size(_plan(4, 1, 8), 3)


@pytest.mark.parametrize(
    "num_oom,first,last,why",
    [
        (2, 5, 5, None),
        (1, 5, 5, "out of memory on 1 of 2 ranks only"),
        (2, 4, 5, "out of memory at different steps (4 to 5)"),
    ],
)
def test_the_group_goes_on_only_when_every_rank_ran_out_at_the_same_step(
    num_oom: int, first: int, last: int, why: str | None
) -> None:
    assert oom_verdict(num_oom, 2, first, last) == why


def test_the_same_step_is_not_enough_when_the_ranks_issued_different_collectives() -> None:
    assert oom_verdict(2, 2, 5, 5, least_issued=40, most_issued=40) is None
    why = oom_verdict(2, 2, 5, 5, least_issued=40, most_issued=41)
    assert why == (
        "out of memory after different numbers of collectives issued on the training groups "
        "(40 to 41)"
    )


def test_ddp_bucket_knobs_are_dropped_on_one_worker_and_the_report_says_why() -> None:
    spaces = load_spaces(["strategy", "ddp"])
    one = SearchSpace(spaces, SearchContext("nccl", "ddp", True, 1, 1, 32))
    assert "bucket_cap_mb" not in one.param_names
    assert "one worker" in dict(one.dropped())["ddp"]
    two = SearchSpace(spaces, SearchContext("nccl", "ddp", True, 2, 1, 32))
    assert "bucket_cap_mb" in two.param_names


def test_a_probe_of_one_rank_is_no_link() -> None:
    row = {"op": "all_reduce", "size_bytes": "1024", "world_size": "1", "time_s": "1e-5",
           "busbw_gbps": "0"}  # fmt: skip
    assert link_from_probe([row]) is None


@pytest.fixture
def tf32_flags() -> Iterator[None]:
    """Restore the two TF32 switches ``prepare_device`` flips. They are served by the backends'
    ``__getattr__``/``__setattr__``, not stored on the module: ``monkeypatch.setattr`` records
    them as absent and its teardown then fails to delete them (pytest >= 9.2), so read and
    write them through the attributes themselves."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_bf16_on_a_pre_ampere_gpu_is_refused_naming_the_key(
    monkeypatch: pytest.MonkeyPatch, tf32_flags: None
) -> None:
    import torch

    from train_fns.precision import prepare_device

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    with pytest.raises(ValueError, match="workload.precision=bf16 .* is 7.0"):
        prepare_device("bf16", torch.device("cuda", 0))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    prepare_device("fp32", torch.device("cuda", 0))
    assert torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cudnn.allow_tf32


def test_run_info_records_the_workers_nccl_version_or_null_without_one(tmp_path) -> None:
    """What the search writes to run_info.json, read back: the version a worker read of its
    node (``session.worker_topology``), null where none did (CPU workers)."""
    from orchestrator.runfiles import read_run_info, update_run_info
    from orchestrator.search.pipeline import _context_info

    context = SearchContext("gloo", "ddp", False, 2, 1, 32)
    update_run_info(tmp_path, _context_info(context, {"nccl_version": None}))
    assert read_run_info(tmp_path).nccl_version is None
    update_run_info(tmp_path, _context_info(context, {"nccl_version": "2.27.5"}))
    assert read_run_info(tmp_path).nccl_version == "2.27.5"


def test_fsdp_bf16_all_gathers_are_costed_at_two_bytes() -> None:
    from orchestrator.planning.costmodel import Link, comm_per_step

    link = Link(1e10, 1e-5, "test")
    fp32 = comm_per_step("fsdp", 10**8, 4, 4, 1, True, link)
    bf16 = comm_per_step("fsdp", 10**8, 4, 4, 1, True, link, gather_bytes=2)
    (gather32, scatter32), (gather16, scatter16) = fp32.collectives, bf16.collectives
    assert gather16.bytes_per_rank * 2 == gather32.bytes_per_rank
    assert scatter16.bytes_per_rank == scatter32.bytes_per_rank  # reductions stay fp32


def test_nccl_knobs_are_dropped_on_one_gpu() -> None:
    """At world size 1 NCCL skips algorithm selection (a local copy): every NCCL knob is
    inert, so the space drops them and says why, as it does on gloo."""
    from search_spaces import SearchContext, SearchSpace, load_spaces

    one = SearchContext("nccl", "ddp", True, 1, 1, 8)
    space = SearchSpace(load_spaces(["accumulation", "nccl"]), one)
    assert not any(name.startswith("NCCL_") for name in space.param_names)
    assert any(what == "nccl" and "1 worker" in why for what, why in space.dropped())
    two = SearchSpace(
        load_spaces(["accumulation", "nccl"]), SearchContext("nccl", "ddp", True, 2, 1, 8)
    )
    assert any(name.startswith("NCCL_") for name in two.param_names)
