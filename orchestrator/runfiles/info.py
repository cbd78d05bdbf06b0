"""run_info.json as a typed record: every key a search writes there and the doctor and the
report read, declared once.

Writers pass a ``RunInfo`` holding the keys they know (the rest None) and it is merged into
the file; readers get a ``RunInfo`` whatever the file holds: a value of the wrong kind (a
hand-edited file, one from another version; a negative or non-finite number) reads as absent
rather than failing a rule later (``kinds``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.runfiles.files import RUN_INFO, read_mapping, topology, write_atomic
from orchestrator.runfiles.kinds import typed_fields


@dataclass(frozen=True)
class RunInfo:
    """What a search records beyond its trials; every key is optional."""

    backend: str | None = None
    """nccl or gloo: which collectives the trials ran."""
    world_size: int | None = None
    num_nodes: int | None = None
    use_gpu: bool | None = None
    nccl_version: str | None = None
    """The workers' NCCL, read by a worker (None: CPU workers, or no worker answered)."""
    topology: Any = None
    """The workers' machine: GPUs, links, NUMA nodes (``files.topology``), or a description."""
    memory_capacity_bytes: int | None = None
    """The smallest worker memory any trial reported: the doctor's memory rule."""
    grad_bytes: float | None = None
    """Gradient bytes per step of the baseline: the bandwidth a sync implies."""
    gpu_util: float | None = None
    """NVML utilisation of the baseline's GPUs, 0-1 (a percentage is tolerated)."""
    single_worker_samples_per_s: float | None = None
    """The baseline on one worker: scaling efficiency."""
    search_wall_s: float | None = None
    """The search's wall-clock, summed over resumed runs: the measured share."""
    race_wall_s: float | None = None
    """The race's wall-clock, summed over the races of resumed runs."""
    race_measured_s: float | None = None
    """Of it, the paired windows' measured steps: the race's part of the measured share."""
    link: str | None = None
    """A name in ``costmodel.LINKS``, written by hand: the link bound to judge against."""

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> RunInfo:
        """The keys this record knows, each of its kind (``kinds.of_kind``: finite, not
        negative); other keys and wrong kinds are dropped."""
        return cls(**typed_fields(cls, data))

    def given(self) -> dict[str, Any]:
        """The keys that hold a value: what a writer adds to the file."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def read_run_info(out: Path) -> RunInfo:
    """run_info.json in ``out`` (an empty record without one)."""
    path = out / RUN_INFO
    return RunInfo.from_mapping(read_mapping(path)) if path.exists() else RunInfo()


def update_run_info(out: Path, values: RunInfo) -> RunInfo:
    """Merge the keys ``values`` holds into run_info.json (the topology of this machine is
    added once; keys it does not know are kept as found); returns the whole record."""
    path = out / RUN_INFO
    raw = read_mapping(path) if path.exists() else {}
    raw.setdefault("topology", topology())
    raw.update(values.given())
    write_atomic(path, json.dumps(raw, indent=1, default=str))
    return RunInfo.from_mapping(raw)


def add_search_wall(out: Path, wall_s: float) -> None:
    """Add a search's wall-clock (from its first trial's start to its last's end; a resumed
    search adds its own) to run_info.json, for the measured share of search time."""
    before = read_run_info(out).search_wall_s or 0.0
    update_run_info(out, RunInfo(search_wall_s=before + wall_s))


def add_race_time(out: Path, wall_s: float, measured_s: float) -> None:
    """Add a race's wall-clock and its paired windows' measured seconds (a resumed search's
    race adds its own) to run_info.json, for the measured share of search time."""
    before = read_run_info(out)
    update_run_info(out, RunInfo(race_wall_s=(before.race_wall_s or 0.0) + wall_s,
                                 race_measured_s=(before.race_measured_s or 0.0) + measured_s))
