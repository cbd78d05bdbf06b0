"""Strict placement on a real 2-node Ray cluster (one machine): ``pack`` holds both ranks on
one node, ``spread`` puts one on each, and trials.csv and the study say where each rank ran."""

from __future__ import annotations

import csv
from pathlib import Path

import _procs
import optuna
import pytest

SETS = ["search.remeasure_top=0", "search.scaling_baseline=false", "search.prune=false",
        "strategy=ddp"]  # fmt: skip


def search(address: str, out: Path, placement: str) -> list[dict[str, str]]:
    """One 1-trial smoke search on the cluster; its trials.csv rows."""
    sets = [*SETS, f"cluster.placement={placement}"]
    proc = _procs.python(
        "orchestrator.search",
        ["--preset", "smoke", "--trials", "1", "--out", str(out), "--address", address,
         *(i for kv in sets for i in ("--set", kv))],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with (out / "trials.csv").open() as f:
        return list(csv.DictReader(f))


def rank_nodes(out: Path) -> list[str]:
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{out / 'study.db'}")
    (trial,) = study.trials
    return [p["node_id"] for p in trial.user_attrs["rank_places"]]


@pytest.mark.slow
def test_pack_holds_one_node_and_spread_takes_two(tmp_path: Path) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        packed = search(cluster.address, tmp_path / "pack", "pack")
        spread = search(cluster.address, tmp_path / "spread", "spread")
    finally:
        cluster.shutdown()
    assert [(r["state"], r["placement"]) for r in packed] == [("complete", "node0:2")]
    assert [(r["state"], r["placement"]) for r in spread] == [("complete", "node0:1,node1:1")]
    assert len(set(rank_nodes(tmp_path / "pack"))) == 1
    assert len(set(rank_nodes(tmp_path / "spread"))) == 2
