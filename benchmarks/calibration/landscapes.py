"""Landscapes for the search-efficiency benchmark: every grid point's true throughput.

Two sources: a grid recorded from real runs (``data/cpu_demo_grid.csv`` beside this file: one
row per grid point, the params under their real names with an empty cell where inactive, then
``samples_per_s``, ``cv`` and ``state``), and grids simulated with
:mod:`benchmarks.calibration.gpu_model`. Each comes with the cost-model seeds the live search
would use.
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.calibration import gpu_model
from orchestrator.config.schema import SearchConfig
from orchestrator.planning.costmodel import ModelSize
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
5% (orchestrator/search/outcome.py MIN_NOISE), more than one trial's windows show."""
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


HELD = ("broadcast_buffers", "forward_prefetch", "backward_prefetch", "activation_checkpointing")
"""Knobs of the cpu-demo space that the recorded grid does not cover: the first three came
after it was recorded, and checkpointing was recorded under FSDP only (DDP offers it now). The
replay holds them at their defaults, as the baseline does, so that the recorded rows are a
complete landscape of the rest; rows with another value of one are left out (and counted)."""


GRID_LIMIT = 50_000
"""Checkpointing under DDP doubled the simulated grids past the search's own cap (10,000)."""
UNMODELLED = HELD[:3]
"""Knobs :mod:`benchmarks.calibration.gpu_model` does not model: held at their defaults in its
landscapes."""


def held_space(names: list[str], context: SearchContext, held: tuple[str, ...]) -> SearchSpace:
    """The named spaces without the ``held`` params (each stays at its default in every plan)."""
    specs = [dataclasses.replace(s, params=tuple(p for p in s.params if p.name not in held))
             for s in load_spaces(names)]  # fmt: skip
    return SearchSpace(specs, context)


def cpu_demo_space(held: tuple[str, ...] = ()) -> SearchSpace:
    """The cpu-demo preset's space: 2 CPU workers on gloo, global batch 32, NCCL dropped."""
    return held_space([*SPACES, "nccl"], SearchContext("gloo", "search", False, 2, 1, 32), held)


def _defaults(names: tuple[str, ...]) -> dict[str, str]:
    """The default cell of each named param of the cpu-demo spaces."""
    specs = load_spaces([*SPACES, "nccl"])
    return {p.name: _cell(p.default) for s in specs for p in s.params if p.name in names}


def load_recorded(path: Path = CPU_DEMO_CSV) -> Landscape:
    """The recorded cpu-demo grid; rows match grid points by their cells' text."""
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: record it with python -m benchmarks.calibration.record_grid "
            f"--preset cpu-demo --csv {path}, or pass --cpu-demo-csv PATH"
        )
    space, held = cpu_demo_space(HELD), _defaults(HELD)
    names = space.param_names
    by_cells = {tuple(_cell(p.get(n)) for n in names): p for p in space.grid()}
    points: dict[str, Point] = {}
    left_out = 0
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if any(_cell(row.get(n) or None) not in ("", d) for n, d in held.items()):
                left_out += 1  # a held knob at another value: outside the replayed space
                continue
            cells = tuple(_cell(row.get(n) or None) for n in names)
            if cells not in by_cells:
                raise ValueError(f"{path}: row {dict(row)} is not a point of the cpu-demo space")
            ok = row["state"].strip().lower() == "complete"
            value = float(row["samples_per_s"]) if ok else None
            cv = max(float(row.get("cv") or 0.0), CPU_RUN_CV)
            points[point_key(space, by_cells[cells])] = Point(value, cv)
    seeds = search_seeds(space, BERT_MINI, 64, NUM_SEEDS)  # as the live search (seq_len 64)
    name = (f"cpu-demo ({path.name}; {', '.join(HELD)} held at their defaults, {left_out} "
            "recorded rows outside that left out)")  # fmt: skip
    return Landscape(name, space, points, 12, seeds)


def simulated(cluster: gpu_model.Cluster) -> Landscape:
    """BERT-large on ``cluster``: every grid point of the GPU space with the NCCL subset."""
    context = SearchContext(
        "nccl", "search", True, cluster.world_size, cluster.num_nodes, gpu_model.GLOBAL_BATCH
    )
    space = held_space([*SPACES, NCCL_SUBSET], context, UNMODELLED)
    model = ModelSize.bert_large()
    points = {
        point_key(space, p): Point(gpu_model.throughput(cluster, model, p), GPU_CV)
        for p in space.grid(GRID_LIMIT)
    }
    per_sample_s = cluster.compute_s_per_sample(model)
    seeds = cost_model_seeds(space, model, cluster.nominal_link, per_sample_s, NUM_SEEDS)
    return Landscape(cluster.name, space, points, 40, seeds)
