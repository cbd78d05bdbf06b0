"""A real 3-node Ray cluster on one machine (a 1-CPU head and two 2-CPU nodes), started once for
the module: with ``search.concurrency: 2`` two worker groups measure at the same time, each held
on one node of its own by ``pack`` (the default placement), and ``spread`` puts one rank on each
node; trials.csv and the study say where each rank ran."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import _procs
import optuna
import pytest

pytestmark = pytest.mark.slow
SETS = ["search.remeasure_top=0", "search.scaling_baseline=false", "search.prune=false",
        "strategy=ddp"]  # fmt: skip


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def search(address: str, out: Path, trials: int, *sets: str) -> list[dict[str, str]]:
    """A smoke search of ``trials`` on the cluster; its trials.csv rows."""
    proc = _procs.python(
        "orchestrator.search",
        ["--preset", "smoke", "--trials", str(trials), "--out", str(out), "--address", address,
         *(i for kv in [*SETS, *sets] for i in ("--set", kv))],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with (out / "trials.csv").open() as f:
        return list(csv.DictReader(f))


def study_trials(out: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="smoke", storage=f"sqlite:///{out / 'study.db'}").trials


def test_two_packed_groups_run_at_once_on_disjoint_nodes(address: str, tmp_path: Path) -> None:
    rows = search(address, tmp_path, 4, "search.concurrency=2", "search.group_size=2",
                  "cluster.placement=pack")  # fmt: skip
    assert [(r["state"], r["placement"]) for r in rows] == [("complete", "node0:2")] * 4, rows
    trials = study_trials(tmp_path)
    assert all(len({p["node_id"] for p in t.user_attrs["rank_places"]}) == 1 for t in trials)
    node_sets = {tuple(t.user_attrs["nodes"]) for t in trials}
    assert len(node_sets) == 2, node_sets  # two groups (group_size 2), one node each
    first, second = node_sets
    assert not set(first) & set(second)
    spans = [
        (min(t.datetime_start for t in ts), max(t.datetime_complete for t in ts))
        for ts in ([t for t in trials if tuple(t.user_attrs["nodes"]) == n] for n in node_sets)
    ]
    (a_start, a_end), (b_start, b_end) = spans
    assert a_start < b_end and b_start < a_end, "the two groups overlapped in time"


def test_spread_puts_one_rank_on_each_node(address: str, tmp_path: Path) -> None:
    rows = search(address, tmp_path, 1, "cluster.placement=spread")
    assert [(r["state"], r["placement"]) for r in rows] == [("complete", "node0:1,node1:1")]
    (trial,) = study_trials(tmp_path)
    assert len({p["node_id"] for p in trial.user_attrs["rank_places"]}) == 2
