"""Group-paired re-measurement compares the same machines: every group of the sequence is
pinned to the nodes the baseline ran on, a run that landed elsewhere (same shape, other
machines) does not compare, and each row says which GPUs it ran on (pure: no Ray)."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.cluster.placement import gpu_uuids, group_nodes, pinnable
from orchestrator.runfiles.remeasure import COLUMNS
from orchestrator.search.finalists import _runs
from orchestrator.search.results import TrialRecord
from train_fns import metrics as m


def _places(*nodes: str, gpu: bool = True) -> list[dict]:
    return [{"rank": r, "node_id": n, "gpu_uuid": f"GPU-{n}-{r}" if gpu else ""}
            for r, n in enumerate(nodes)]  # fmt: skip


def _result(value: float, *nodes: str) -> dict:
    return {m.STATE: m.COMPLETE, m.SAMPLES_PER_S: value, m.THROUGHPUT_CV: 0.01,
            m.PLACEMENT: "node0:1,node1:1", m.RANK_PLACES: _places(*nodes)}  # fmt: skip


def test_the_nodes_to_pin_are_the_baselines_while_every_one_is_alive() -> None:
    places = _places("b", "a", "b", "a")
    assert group_nodes(places) == ["b", "a"]
    assert pinnable(places, {"a", "b", "c"}) == ["b", "a"]
    assert pinnable(places, {"a", "c"}) is None  # one is gone: placement decides, rows say so
    assert pinnable([], {"a"}) is None


def test_gpu_uuids_are_recorded_in_rank_order_and_empty_on_cpu() -> None:
    assert gpu_uuids(_places("a", "b")) == "GPU-a-0 GPU-b-1"
    assert gpu_uuids(_places("a", "b", gpu=False)) == ""
    assert "gpus" in COLUMNS


def test_a_run_on_other_machines_of_the_same_shape_does_not_compare() -> None:
    base = TrialRecord(0, m.COMPLETE, "", {}, {})
    other = TrialRecord(3, m.COMPLETE, "", {"NCCL_ALGO": "allreduce:tree"}, {})
    results = [[_result(10.0, "a", "b")], [_result(12.0, "c", "d")], [_result(10.0, "a", "b")]]
    runs = _runs([base, other, base], results, base)
    assert runs[1].samples_per_s is None  # same "node0:1,node1:1" label, other machines
    assert runs[0].samples_per_s == 10.0 and runs[2].samples_per_s == 10.0


class _Group:
    """A worker group that lands its ranks on ``node-<name>`` unless pinned, as ``GroupRun``
    does (``nodes`` restricts its placement), and measures every plan it is given."""

    pins: list = []

    def __init__(self, ctx, name: str, nodes=None, owned: bool = False) -> None:  # noqa: ANN001
        type(self).pins.append(nodes)
        where = nodes[0] if nodes else f"node-{name}"
        self.places = {r: {"rank": r, "node_id": where} for r in range(2)}

    def run(self, source, emit) -> list:  # noqa: ANN001
        out = [{m.STATE: m.COMPLETE, m.SAMPLES_PER_S: 1.0} for _ in source]
        for k, outcome in enumerate(out):
            emit(k, outcome)
        return out


@dataclasses.dataclass(frozen=True)
class _Ctx:
    slowest_start_s: float | None = None


def test_every_group_of_a_sequence_runs_where_the_first_ran_or_where_it_is_pinned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orchestrator.search import trial

    monkeypatch.setattr(trial, "GroupRun", _Group)
    items = [("B", {}), ("t1", {"NCCL_ALGO": "allreduce:tree"}), ("B", {})]
    _Group.pins = []
    trial.measure_plans(_Ctx(), items, "remeasure")
    assert _Group.pins == [None, ["node-remeasure_00"], ["node-remeasure_00"]]
    _Group.pins = []
    trial.measure_plans(_Ctx(), items, "remeasure", nodes=["b"])
    assert _Group.pins == [["b"], ["b"], ["b"]]
