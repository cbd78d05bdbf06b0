"""The search plans for the nodes a group lands on, not the cluster's count: a
packed group on one node of a larger cluster gets no multi-node knob, NVLSTree, PAT or HSDP;
an uneven fill (8 + 4) gets no HSDP; a spread group gets what several nodes allow."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.config.schema import ConfigError, load_config
from orchestrator.search import pipeline
from search_spaces import SearchSpace, load_spaces


def _nodes(*gpus: int) -> list[dict[str, Any]]:
    return [{"Alive": True, "NodeID": f"node{i}", "Resources": {"GPU": g, "CPU": 64}}
            for i, g in enumerate(gpus)]  # fmt: skip


def _offered(nodes: list[dict[str, Any]], workers: int, placement: str,
             monkeypatch: pytest.MonkeyPatch) -> tuple[Any, set[str], set]:  # fmt: skip
    import ray

    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    sets = [f"cluster.num_workers={workers}", f"cluster.placement={placement}",
            "cluster.nvswitch=true", "strategy=search", "workload.global_batch=96",
            "search.spaces=[nccl, ddp, fsdp, strategy]"]  # fmt: skip
    config = load_config(None, "smoke", sets)
    context = pipeline.search_context(config, use_gpu=True)
    space = SearchSpace(load_spaces(config.search.spaces), context)
    names = [n for n in ("strategy", "NCCL_ALGO", "hsdp", "NCCL_SOCKET_NTHREADS")
             if n in space.param_names]  # fmt: skip
    points = space.grid_slice(names, limit=100_000)
    # a param counts as offered where some point moves it off the baseline's value
    offered = {n for n in names if len({repr(p.get(n)) for p in points}) > 1}
    return context, offered, {p.get("NCCL_ALGO") for p in points}


def test_a_packed_group_on_one_node_of_four_plans_for_one(monkeypatch) -> None:  # noqa: ANN001
    context, names, algos = _offered(_nodes(8, 8, 8, 8), 8, "pack", monkeypatch)
    assert (context.num_nodes, context.workers_per_node) == (1, 8)
    assert "hsdp" not in names and "NCCL_SOCKET_NTHREADS" not in names
    assert "allreduce:nvlstree" not in algos and "allgather:pat;reducescatter:pat" not in algos
    assert "allreduce:nvls" in algos  # one NVSwitch node: NVLS is its algorithm


def test_a_group_over_two_full_nodes_gets_hsdp_and_nvlstree(monkeypatch) -> None:  # noqa: ANN001
    context, names, algos = _offered(_nodes(8, 8, 8, 8), 16, "pack", monkeypatch)
    assert (context.num_nodes, context.even_nodes) == (2, True)
    assert "hsdp" in names and "allreduce:nvlstree" in algos and "allreduce:nvls" not in algos


def test_an_uneven_fill_gets_no_hsdp(monkeypatch) -> None:  # noqa: ANN001
    context, names, _ = _offered(_nodes(8, 8, 8), 12, "pack", monkeypatch)
    assert (context.num_nodes, context.even_nodes) == (2, False) and "hsdp" not in names


def test_a_spread_group_of_one_gpu_per_node_gets_pat(monkeypatch) -> None:  # noqa: ANN001
    context, _, algos = _offered(_nodes(8, 8, 8, 8), 4, "spread", monkeypatch)
    assert (context.num_nodes, context.workers_per_node) == (4, 1)
    assert "allgather:pat;reducescatter:pat" in algos


def test_a_fixed_hsdp_on_one_node_is_refused_before_any_worker() -> None:
    """tuned.hsdp bypasses the space's condition; every plan would raise in its mesh."""
    from orchestrator.search.pipeline import check_tuned_layout
    from search_spaces import SearchContext

    config = load_config(None, "smoke", ["strategy=fsdp", "tuned={hsdp: true}"])
    one_node = SearchContext("nccl", "fsdp", True, 2, 1, 8)
    with pytest.raises(ConfigError, match="^tuned.hsdp: HSDP needs several nodes"):
        check_tuned_layout(config, one_node)
    check_tuned_layout(config, SearchContext("nccl", "fsdp", True, 4, 2, 8))
