"""The NCCL space offers only what NCCL runs on the group's layout and network: no NVLS where
a node holds at most 2 of the group's GPUs (NCCL turns NVLS off there), no buffer size times
channel count that eats gigabytes of GPU memory, no socket knob off the socket transport and
no InfiniBand queue pairs off InfiniBand (pure: no Ray, no torch.distributed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.runfiles.files import net_transport
from orchestrator.search.outcome import classify_failure
from search_spaces import SearchContext, SearchSpace, load_spaces
from train_fns import metrics as m
from train_fns.plan import TrialPlan
from train_fns.size_fit import Layout, fit

MIB = 1024**2
NVLS_VALUES = {"allreduce:nvls", "allreduce:nvlstree"}
PLAN = TrialPlan(model="bert-tiny", task="mlm", seq_len=64, global_batch=16, world_size=2,
                 accumulation_steps=2, micro_batch=4, num_windows=3, measure_steps=6)
GPU = {"global_batch": 48, "strategy": "ddp", "use_gpu": True, "nvswitch": True}


def _space(world: int, nodes: int, **context: object) -> SearchSpace:
    ctx = SearchContext("nccl", "ddp", True, world, nodes, 48 * world, nvswitch=True, **context)
    return SearchSpace(load_spaces(["nccl"]), ctx)


def _algos(space: SearchSpace) -> set:
    return {p.get("NCCL_ALGO") for p in space.grid_slice(["NCCL_ALGO"], limit=1000)}


@pytest.mark.parametrize(("world", "nodes"), [(2, 1), (4, 2), (2, 2), (6, 3)])
def test_no_nvls_with_at_most_two_gpus_of_the_group_on_a_node(world: int, nodes: int) -> None:
    space = _space(world, nodes)
    assert not _algos(space) & NVLS_VALUES
    assert "NCCL_NVLS_ENABLE" not in space.param_names  # NVLS is off already: inert
    assert any("at most 2" in why for _, why in space.dropped())


def test_nvls_stays_where_nodes_hold_three_or_more() -> None:
    assert "allreduce:nvls" in _algos(_space(4, 1))
    assert "allreduce:nvlstree" in _algos(_space(16, 2))
    assert "allreduce:nvlstree" not in _algos(_space(12, 2, even_nodes=False))  # 8 + 4? or 11 + 1


def test_fitting_drops_nvls_where_a_node_holds_two() -> None:
    for value in ("allreduce:nvls", "AllReduce:NVLS"):  # a hand-written spelling too
        entries = {8: {"env": {"NCCL_ALGO": value}}}
        assert fit(entries, Layout(8, 1), GPU).env == {"NCCL_ALGO": value}
        shrunk = fit(entries, Layout(2, 1), GPU)
        assert shrunk.env == {} and "at most 2" in shrunk.dropped[0][2], value
    kept = {8: {"env": {"NCCL_ALGO": "allreduce:nvls,ring"}}}  # Ring carries it where NVLS is off
    assert fit(kept, Layout(2, 1), GPU).env == {"NCCL_ALGO": "allreduce:nvls,ring"}


def test_nccl_buffers_times_channels_stay_bounded() -> None:
    names = ["NCCL_BUFFSIZE", "NCCL_MIN_NCHANNELS", "NCCL_MIN_CTAS"]
    points = _space(8, 1).grid_slice(names, limit=100_000)
    worst = max(p.get("NCCL_BUFFSIZE", 4 * MIB) * (p.get("NCCL_MIN_NCHANNELS")
                or p.get("NCCL_MIN_CTAS") or 32) for p in points)  # fmt: skip
    assert 128 * MIB < worst <= 512 * MIB  # NCCL picks up to 32 channels where none is forced


def test_an_nccl_allocation_failure_is_out_of_memory() -> None:
    text = (
        "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO "
        "for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function "
        "failed.\nLast error:\nFailed to CUDA calloc async 608 bytes"
    )
    state, reason = classify_failure(RuntimeError(text), PLAN)
    assert state == m.OOM and "NCCL" in reason


@pytest.mark.parametrize(
    ("transport", "offered"),
    [
        ("socket", {"NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"}),
        ("ib", {"NCCL_IB_QPS_PER_CONNECTION"}),
        ("efa", set()),
        ("unknown", {"NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD",
                     "NCCL_IB_QPS_PER_CONNECTION"}),  # fmt: skip
    ],
)
def test_transport_knobs_are_searched_only_on_their_transport(transport: str, offered: set) -> None:
    names = {"NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_IB_QPS_PER_CONNECTION"}
    space = _space(16, 2, transport=transport)
    assert names & set(space.param_names) == offered
    assert all(f"the {transport} transport" in why for n, why in space.dropped() if n in names)


def _device(root: Path, name: str, driver: str) -> None:
    (root / "drivers" / driver).mkdir(parents=True, exist_ok=True)
    (root / "class" / name / "device").mkdir(parents=True)
    (root / "class" / name / "device" / "driver").symlink_to(root / "drivers" / driver)


def test_the_transport_is_read_from_the_nodes_rdma_devices_and_the_env(tmp_path: Path) -> None:
    assert net_transport({}, tmp_path / "class") == "socket"  # no RDMA device
    _device(tmp_path, "mlx5_0", "mlx5_core")
    assert net_transport({}, tmp_path / "class") == "ib"
    assert net_transport({"NCCL_IB_DISABLE": "1"}, tmp_path / "class") == "socket"
    assert net_transport({"NCCL_NET": "Socket"}, tmp_path / "class") == "socket"
    _device(tmp_path, "rdmap16s27", "efa")
    assert net_transport({}, tmp_path / "class") == "efa"
