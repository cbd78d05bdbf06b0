"""Strict placement as a pure choice: nodes (what each holds), world size, mode -> Ray's
placement-group strategy and, where needed, the node of every worker's bundle."""

from __future__ import annotations

from collections import Counter

import pytest

from orchestrator.placement import (
    NODE_LABEL,
    PlacementError,
    choose_layout,
    layout_for,
    placement_label,
)

EIGHT_GPU_NODES = [("b", 8), ("a", 8), ("c", 8)]


def counts(pinned: tuple[str, ...]) -> dict[str, int]:
    return dict(Counter(pinned))


def test_pack_on_one_node_when_one_holds_the_group() -> None:
    layout = choose_layout(EIGHT_GPU_NODES, 8, "pack")
    assert layout.strategy == "STRICT_PACK" and layout.pinned == ()
    assert layout.scaling() == {"placement_strategy": "STRICT_PACK", "label_selector": None}


def test_pack_across_nodes_fills_whole_nodes_never_four_and_four() -> None:
    layout = choose_layout(EIGHT_GPU_NODES, 16, "pack")
    assert counts(layout.pinned) == {"a": 8, "b": 8}  # largest first, then by id
    assert layout.pinned == ("a",) * 8 + ("b",) * 8  # each node's ranks contiguous
    selectors = layout.scaling()["label_selector"]
    assert len(selectors) == 16 and selectors[0] == {NODE_LABEL: "a"}
    assert counts(choose_layout(EIGHT_GPU_NODES, 12, "pack").pinned) == {"a": 8, "b": 4}


def test_pack_prefers_the_bigger_node() -> None:
    layout = choose_layout([("a", 4), ("b", 8)], 10, "pack")
    assert counts(layout.pinned) == {"b": 8, "a": 2}


def test_spread_one_rank_per_node_when_nodes_suffice() -> None:
    layout = choose_layout(EIGHT_GPU_NODES, 2, "spread")
    assert layout.strategy == "STRICT_SPREAD" and layout.pinned == ()


def test_spread_beyond_the_node_count_is_even() -> None:
    assert counts(choose_layout(EIGHT_GPU_NODES[:2], 8, "spread").pinned) == {"a": 4, "b": 4}
    assert counts(choose_layout(EIGHT_GPU_NODES, 7, "spread").pinned) == {"a": 3, "b": 2, "c": 2}
    # a small node takes what it holds, the rest goes to the others
    assert counts(choose_layout([("a", 1), ("b", 8)], 6, "spread").pinned) == {"a": 1, "b": 5}


@pytest.mark.parametrize("mode", ["pack", "spread"])
def test_a_placement_the_cluster_cannot_give_is_said(mode: str) -> None:
    with pytest.raises(PlacementError, match="17 ranks do not fit: the nodes hold 16"):
        choose_layout(EIGHT_GPU_NODES[:2], 17, mode)
    with pytest.raises(PlacementError, match="hold 0"):
        choose_layout([("a", 0)], 1, mode)


def ray_node(node_id: str, cpus: float, gpus: float = 0, alive: bool = True) -> dict:
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpus, "GPU": gpus}}


def test_layout_for_reads_ray_nodes_gpus_cpus_and_the_allowed_set() -> None:
    nodes = [ray_node("a", 64, 8), ray_node("b", 64, 8), ray_node("dead", 64, 8, alive=False),
             ray_node("head", 8)]  # fmt: skip
    gpu = layout_for(nodes, None, 16, 4.0, True, "pack")
    assert counts(gpu.pinned) == {"a": 8, "b": 8}
    cpu = layout_for(nodes, None, 2, 1.0, False, "spread")
    assert cpu.strategy == "STRICT_SPREAD"
    only_b = layout_for(nodes, ["b"], 4, 4.0, True, "pack")
    assert only_b.strategy == "STRICT_PACK"
    assert only_b.scaling()["label_selector"] == {NODE_LABEL: "in(b)"}  # concurrency kept
    with pytest.raises(PlacementError, match="cannot spread over 1 node"):
        layout_for(nodes, ["b"], 2, 1.0, True, "spread")  # one node: no spread at all


def test_placement_label_tells_shapes_apart_not_machines() -> None:
    def places(nodes: str) -> list[dict]:
        return [{"rank": r, "node_id": n} for r, n in enumerate(nodes)]

    assert placement_label(places("AAAA")) == "node0:4"
    assert placement_label(places("AABB")) == "node0:2,node1:2"
    assert placement_label(places("XXYY")) == "node0:2,node1:2"
    assert placement_label(places("AAAB")) != placement_label(places("AABB"))
    assert placement_label(list(reversed(places("AABBB")))) == "node0:2,node1:3"
