"""summary.json as a typed record: every key a training run writes there and the training
command, the doctor and the report read, declared once.

The training run's driver (``train/runlog.py``) builds a ``Summary`` and writes it whole; a
reader gets a ``Summary`` whatever the file holds: a value of the wrong kind, a negative count
or a non-finite number reads as absent (``kinds``), as run_info.json's keys do.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.runfiles.files import SUMMARY_JSON, write_atomic
from orchestrator.runfiles.kinds import SIGNED, typed_fields


@dataclass(frozen=True)
class Summary:
    """A training run's totals; every key is optional (absent: None)."""

    steps: int | None = None
    """The last step the run reached."""
    steps_wanted: int | None = None
    """train.steps: the run is done when ``steps`` reaches it."""
    final_loss: float | None = field(default=None, metadata=SIGNED)
    """The last logged step's loss (a user's loss may be negative)."""
    wall_s: float | None = None
    samples_per_s: float | None = None
    """The median over the logged steps."""
    wall_samples_per_s: float | None = None
    """Samples over the wall-clock from the first logged step to the last (what training
    delivers, everything between steps included: ``runlog.wall_samples_per_s``)."""
    comm_fraction: float | None = None
    """Exposed communication over fwd+bwd, over the run."""
    data_fraction: float | None = None
    """Data wait over the step time of the steps that measured it (the profiled ones)."""
    nonfinite_steps: int | None = None
    """Steps skipped for non-finite gradients."""
    nonfinite_rate: float | None = None
    loss_scale: float | None = None
    """fp16's loss scale at the last logged step (None without one)."""
    world_sizes: list[int] | None = None
    """Every world size the run trained at, sorted."""
    by_size: list[dict[str, Any]] | None = None
    """Per world size trained at: steps, median samples/s, the tuned entry that ran
    (``entry_size``) and what the search measured for it (``searched_samples_per_s``)."""
    restarts: list[dict[str, Any]] | None = None
    """One per restart: reason, steps, world before and after, what it resumed from, where
    its seconds went, and the line printed."""
    snapshots: dict[str, Any] | None = None
    """In-memory snapshots taken between checkpoints: ``taken``, ``median_s``, ``total_s``,
    ``held_back`` (not sent: the previous one was still on its way)."""
    tune: dict[str, Any] | None = None
    """Tuning while training (``--tune``): per world size the split kept, each decision, and
    the steps and seconds its candidates that were not kept took (``lost``)."""
    warnings: list[str] | None = None
    error: str | None = None
    """Why the run failed (None when it did not)."""

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> Summary:
        """The keys this record knows, each of its kind; other keys and wrong kinds are dropped."""
        return cls(**typed_fields(cls, data))

    def as_mapping(self) -> dict[str, Any]:
        """Every key, None included: what summary.json holds (a reader sees each key named)."""
        return dataclasses.asdict(self)

    def given(self) -> dict[str, Any]:
        """The keys that hold a value (empty: the run left no figure)."""
        return {k: v for k, v in self.as_mapping().items() if v is not None}


def write_summary(out: Path, summary: Summary) -> None:
    """summary.json in ``out``, written whole (a resumed run rewrites it: a reader such as the
    doctor, run while the run goes on, never sees half of it)."""
    write_atomic(out / SUMMARY_JSON, json.dumps(summary.as_mapping(), indent=1, default=str))


def setting_text(setting: Mapping[str, float]) -> str:
    """``accumulation 2, buckets 10 MB``: a setting ``--tune`` switches (its
    ``train_fns.online`` knobs), or a candidate's one knob, as summary.json's ``tune`` and the
    run's lines name it."""
    parts = []
    if "accumulation_steps" in setting:
        parts.append(f"accumulation {int(setting['accumulation_steps'])}")
    if "bucket_cap_mb" in setting:
        parts.append(f"buckets {setting['bucket_cap_mb']:g} MB")
    return ", ".join(parts)


def candidates_text(candidates: list[Mapping[str, float]]) -> str:
    """``accumulation 2, 4; buckets 50, 10 MB``: each knob's values in the order tried."""
    values: dict[str, list[str]] = {}
    for candidate in candidates:
        for knob, value in candidate.items():
            values.setdefault(knob, []).append(f"{value:g}")
    names = {"accumulation_steps": ("accumulation ", ""), "bucket_cap_mb": ("buckets ", " MB")}
    return "; ".join(f"{names[k][0]}{', '.join(v)}{names[k][1]}" for k, v in values.items()
                     if k in names)  # fmt: skip
