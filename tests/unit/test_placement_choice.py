"""Strict placement as a pure choice: nodes (what each holds), world size, mode -> Ray's
placement-group strategy and, where needed, the node of every worker's bundle."""

from __future__ import annotations

from collections import Counter

import pytest

from orchestrator.cluster.placement import (
    NODE_LABEL,
    PlacementError,
    choose_layout,
    layout_for,
    mixed_placements,
    placement_label,
)
from orchestrator.cluster.session import check_placement
from orchestrator.config.schema import ClusterConfig, ConfigError

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


def test_mixed_placements_names_each_placement_with_its_trials() -> None:
    assert mixed_placements([(0, "node0:2"), (1, "node0:2"), (2, "")]) is None  # unknown: left out
    assert mixed_placements([(0, "node0:8"), (1, "node0:4,node1:4"), (2, "node0:8")]) == (
        "node0:8 (trials 0, 2); node0:4,node1:4 (trial 1)"
    )


def test_a_strict_placement_the_cluster_cannot_give_is_a_config_error() -> None:
    one_node = [ray_node("a", 8)]
    check_placement(one_node, ClusterConfig(num_workers=2, placement="pack"), False)
    with pytest.raises(ConfigError, match=r"cluster\.placement: spread of 2 workers: 2 ranks "
                       r"cannot spread over 1 node .*set cluster.placement=pack"):  # fmt: skip
        check_placement(one_node, ClusterConfig(num_workers=2, placement="spread"), False)
    two = [ray_node("a", 64, 8), ray_node("b", 64, 8)]
    with pytest.raises(ConfigError, match="17 ranks do not fit: the nodes hold 16.*GPUs"):
        check_placement(two, ClusterConfig(num_workers=17, placement="pack"), True)


def test_the_search_summary_warns_when_trials_ran_on_different_placements(tmp_path) -> None:
    from types import SimpleNamespace

    from orchestrator.config.schema import Config
    from orchestrator.search.results import TrialRecord, write_outputs
    from train_fns import metrics as m

    space = SimpleNamespace(baseline=lambda: {}, knobs=lambda p: {}, env_vars=lambda p: {})
    recs = [TrialRecord(n, m.COMPLETE, "", {}, {m.SAMPLES_PER_S: v, m.PLACEMENT: p})
            for n, v, p in [(0, 10.0, "node0:2"), (1, 12.0, "node0:1,node1:1")]]  # fmt: skip
    lines = write_outputs(recs, Config(), space, tmp_path)  # type: ignore[arg-type]
    assert any(line.startswith("warning: trials ran on different placements, node0:2 (trial 0)")
               for line in lines), lines  # fmt: skip
    assert "placement" in (tmp_path / "trials.csv").read_text().splitlines()[0].split(",")
    recs[1].attrs[m.PLACEMENT] = "node0:2"
    assert not any("placements" in line for line in write_outputs(recs, Config(), space, tmp_path))


def test_the_head_holds_the_trials_sliver_so_its_last_cpu_is_not_a_workers() -> None:
    """The local twin: a 1-CPU head (where the Tune trial's 0.01 CPU is held) and two 1-CPU
    worker nodes. A bundle pinned to the head waited forever beside the sliver (every baseline
    was a hang in phase start): the workers go to the two other nodes."""
    from orchestrator.cluster.placement import HEAD_RESOURCE, trial_resources

    def node(node_id: str, head: bool) -> dict:
        resources = {"CPU": 1.0, **({HEAD_RESOURCE: 1.0} if head else {})}
        return {"NodeID": node_id, "Alive": True, "Resources": resources}

    nodes = [node("head", True), node("w1", False), node("w2", False)]
    layout = layout_for(nodes, None, 2, 1.0, False, "pack")
    assert sorted(layout.pinned) == ["w1", "w2"]
    assert trial_resources(nodes)[HEAD_RESOURCE] > 0, "the trial is held to the head"
    cpuless = [{"NodeID": "head", "Alive": True, "Resources": {"CPU": 0.0, HEAD_RESOURCE: 1.0}}]
    assert HEAD_RESOURCE not in trial_resources(cpuless), "a 0-CPU head cannot hold it"
    one_node = [{"NodeID": "h", "Alive": True, "Resources": {"CPU": 3.0, HEAD_RESOURCE: 1.0}}]
    assert layout_for(one_node, None, 2, 1.0, False, "pack").strategy == "STRICT_PACK"


def test_a_trial_on_a_worker_node_leaves_that_nodes_last_cpu_alone() -> None:
    """A head with no CPU (``ray start --head --num-cpus=0``) cannot hold the trial's sliver, so
    Ray puts it on a worker node: the group's workers go around it. Counted as whole, that
    node got a pinned worker that waited 300 s for a CPU it could not have (the local twin,
    three 1-CPU nodes: two of three trials hung in phase start)."""
    from orchestrator.cluster.placement import HEAD_RESOURCE

    head = {"NodeID": "head", "Alive": True, "Resources": {"CPU": 0.0, HEAD_RESOURCE: 1.0}}
    nodes = [head, ray_node("a", 1), ray_node("b", 1), ray_node("c", 1)]
    around = layout_for(nodes, None, 2, 1.0, False, "pack", held={"a": 0.01})
    assert sorted(around.pinned) == ["b", "c"]
    assert sorted(layout_for(nodes, None, 2, 1.0, False, "pack").pinned) == ["a", "b"]
    with pytest.raises(PlacementError, match="2 ranks do not fit: the nodes hold 1"):
        layout_for(nodes[:3], None, 2, 1.0, False, "pack", held={"a": 0.01})
    # a map counts only what it names: an empty one counts the head whole, the sliver on it not
    two_cpus = {"NodeID": "head", "Alive": True, "Resources": {"CPU": 2.0, HEAD_RESOURCE: 1.0}}
    assert layout_for([two_cpus], None, 2, 1.0, False, "pack", held={}).strategy == "STRICT_PACK"
    with pytest.raises(PlacementError, match="the nodes hold 1"):
        layout_for([two_cpus], None, 2, 1.0, False, "pack", held={"head": 0.01})
