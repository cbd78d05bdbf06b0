"""Node-disjoint concurrency on a real 3-node Ray cluster (one machine): two worker groups
measure at the same time, each on its own node."""

from __future__ import annotations

from pathlib import Path

import _procs
import optuna
import pytest


@pytest.mark.slow
def test_two_groups_run_at_once_on_disjoint_nodes(tmp_path: Path) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        out = tmp_path / "concurrent"
        sets = ["search.concurrency=2", "search.group_size=2", "search.remeasure_top=0",
                "search.scaling_baseline=false", "search.prune=false", "strategy=ddp"]  # fmt: skip
        proc = _procs.python(
            "orchestrator.search",
            ["--preset", "smoke", "--trials", "4", "--out", str(out),
             "--address", cluster.address, *(item for kv in sets for item in ("--set", kv))],
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    finally:
        cluster.shutdown()
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{out / 'study.db'}")
    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(trials) == 4
    node_sets = {tuple(t.user_attrs["nodes"]) for t in trials}
    assert len(node_sets) == 2, node_sets  # two groups (group_size 2), one node each
    first, second = node_sets
    assert not set(first) & set(second)
    by_nodes = {
        nodes: [t for t in trials if tuple(t.user_attrs["nodes"]) == nodes] for nodes in node_sets
    }
    spans = [
        (min(t.datetime_start for t in ts), max(t.datetime_complete for t in ts))
        for ts in by_nodes.values()
    ]
    (a_start, a_end), (b_start, b_end) = spans
    assert a_start < b_end and b_start < a_end, "the two groups overlapped in time"
