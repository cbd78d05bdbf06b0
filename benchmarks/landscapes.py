"""Landscapes for the search-efficiency benchmark: every grid point's true throughput.

Two sources: a grid recorded from real runs (``benchmarks/data/cpu_demo_grid.csv``: one row
per grid point, the params under their real names with an empty cell where inactive, then
``samples_per_s``, ``cv`` and ``state``), and grids simulated with
:mod:`benchmarks.gpu_model`. Each comes with the cost-model seeds the live search would use.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import gpu_model
from orchestrator.config import SearchConfig
from orchestrator.costmodel import ModelSize
from orchestrator.search.proposer import cost_model_seeds, search_seeds
from search_spaces import SearchContext, SearchSpace, load_spaces

HERE = Path(__file__).parent
CPU_DEMO_CSV = HERE / "data" / "cpu_demo_grid.csv"
SPACES = ["strategy", "accumulation", "ddp", "fsdp"]
NCCL_SUBSET = str(HERE / "spaces" / "nccl_subset.yaml")
NUM_SEEDS = SearchConfig().cost_model_seeds
"""As many seeds as a live search takes by default."""
GPU_CV = 0.03
"""Run-to-run spread assumed for GPU trials (steadier than the CPU machine's)."""
CPU_RUN_CV = 0.05
"""Floor on the CPU demo's noise: repeated baselines on the 2-core machine spread by about
5% (orchestrator/outcome.py MIN_NOISE), more than one trial's windows show."""
BERT_MINI = ModelSize(11_200_000, 4, "bert-mini")
"""bert-mini (hidden 256, 4 blocks, BERT vocabulary): about 11.2M parameters."""


@dataclass(frozen=True)
class Point:
    """One grid point's truth: ``value`` None when it cannot run (OOM, crash)."""

    value: float | None
    cv: float


@dataclass(frozen=True)
class Landscape:
    """A space, the truth at each of its grid points, and what the search starts from."""

    name: str
    space: SearchSpace
    points: dict[str, Point]
    """By :func:`point_key`."""
    budget: int
    """search.trials of the matching preset: what a user would give the search."""
    seeds: list[dict[str, Any]]

    @property
    def best(self) -> float:
        return max(p.value for p in self.points.values() if p.value is not None)

    def lookup(self, params: dict[str, Any]) -> Point:
        """Unrecorded points count as failed: the search cannot know better."""
        return self.points.get(point_key(self.space, params), Point(None, 0.0))


def point_key(space: SearchSpace, params: dict[str, Any]) -> str:
    return repr(sorted(space.optuna_params(params).items()))


def _cell(value: Any) -> str:
    """A CSV cell's canonical text: a pandas-written ``25.0`` or ``True`` reads as ``25`` or
    ``true``; an empty (or NaN) cell is an inactive param."""
    text = "" if value is None else str(value).strip().lower()
    if text == "nan":
        return ""
    try:
        number = float(text)
    except ValueError:
        return text
    return str(int(number)) if number.is_integer() else text


def cpu_demo_space() -> SearchSpace:
    """The cpu-demo preset's space: 2 CPU workers on gloo, global batch 32, NCCL dropped."""
    context = SearchContext("gloo", "search", False, 2, 1, 32)
    return SearchSpace(load_spaces([*SPACES, "nccl"]), context)


def load_recorded(path: Path = CPU_DEMO_CSV) -> Landscape:
    """The recorded cpu-demo grid; rows match grid points by their cells' text."""
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: record it with python -m benchmarks.record_grid --preset "
            f"cpu-demo --csv {path}, or pass --cpu-demo-csv PATH"
        )
    space = cpu_demo_space()
    names = space.param_names
    by_cells = {tuple(_cell(p.get(n)) for n in names): p for p in space.grid()}
    points: dict[str, Point] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            cells = tuple(_cell(row.get(n) or None) for n in names)
            if cells not in by_cells:
                raise ValueError(f"{path}: row {dict(row)} is not a point of the cpu-demo space")
            ok = row["state"].strip().lower() == "complete"
            value = float(row["samples_per_s"]) if ok else None
            cv = max(float(row.get("cv") or 0.0), CPU_RUN_CV)
            points[point_key(space, by_cells[cells])] = Point(value, cv)
    seeds = search_seeds(space, BERT_MINI, 64, NUM_SEEDS)  # as the live search (seq_len 64)
    return Landscape(f"cpu-demo ({path.name})", space, points, 12, seeds)


def simulated(cluster: gpu_model.Cluster) -> Landscape:
    """BERT-large on ``cluster``: every grid point of the GPU space with the NCCL subset."""
    context = SearchContext(
        "nccl", "search", True, cluster.world_size, cluster.num_nodes, gpu_model.GLOBAL_BATCH
    )
    space = SearchSpace(load_spaces([*SPACES, NCCL_SUBSET]), context)
    model = ModelSize.bert_large()
    points = {
        point_key(space, p): Point(gpu_model.throughput(cluster, model, p), GPU_CV)
        for p in space.grid()
    }
    per_sample_s = cluster.compute_s_per_sample(model)
    seeds = cost_model_seeds(space, model, cluster.nominal_link, per_sample_s, NUM_SEEDS)
    return Landscape(cluster.name, space, points, 40, seeds)
