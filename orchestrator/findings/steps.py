"""Where a step's time went, read from a run record: per trial, for a training run, and the
one configuration worth diagnosing. The doctor's rules and the report's charts both use these,
so the page and the command say the same numbers.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from orchestrator.runfiles import SUMMARY_JSON, RunRecord, num
from train_fns.commsplit import comm_fraction

FSDP_SCOPE = (
    "FSDP: the gradient reduce-scatter only; the parameter all-gathers run in the no-sync "
    "reference too, so they count as compute and the exposed figure is a lower bound"
)
"""What exposed communication measures under FSDP (under DDP: the gradient all-reduce)."""


@dataclass(frozen=True)
class StepParts:
    """Where one optimizer step's time went, for one configuration.

    The phases (data, forward + backward, optimizer, and the exposed communication split out
    of forward + backward) come from each window's profiled step; the step time is the
    window's median plain step (on CPU, where every step is profiled, the same step); the
    report draws their difference as
    "other". Exposed communication is the syncing micro-step minus one without sync: under
    FSDP that leaves the all-gathers in compute (``comm_scope``)."""

    label: str
    step_time_s: float | None
    data_s: float | None = None
    compute_s: float | None = None
    exposed_comm_s: float | None = None
    optim_s: float | None = None
    fwd_bwd_s: float | None = None
    comm_fraction_given: float | None = None
    data_fraction_given: float | None = None
    sharded: bool = False
    """FSDP/HSDP: see ``comm_scope``."""

    @property
    def comm_scope(self) -> str:
        """What the exposed communication figure measures, said beside it."""
        return FSDP_SCOPE if self.sharded else "DDP: the gradient all-reduce"

    @property
    def comm_fraction(self) -> float | None:
        """comm / (comm + compute): the share of the work the network holds up."""
        if self.comm_fraction_given is not None:
            return self.comm_fraction_given
        return comm_fraction(self.exposed_comm_s, self.compute_s)

    @property
    def data_fraction(self) -> float | None:
        if self.data_fraction_given is not None:
            return self.data_fraction_given
        if self.data_s is None or not self.step_time_s:
            return None
        return self.data_s / self.step_time_s


def _sharded(record: RunRecord, row: dict[str, str] | None = None) -> bool:
    """Whether the configuration ran FSDP: its trial's sampled strategy, else best.yaml's."""
    strategy = (row or {}).get("strategy") or record.best_config.get("strategy")
    return strategy == "fsdp"


def trial_step(row: dict[str, str], label: str, record: RunRecord) -> StepParts:
    keys = ("step_time_s", "data_s", "compute_s", "exposed_comm_s", "optim_s", "fwd_bwd_s")
    parts = {k: num(row.get(k)) for k in keys}
    return StepParts(label, comm_fraction_given=num(row.get("comm_fraction")),
                     sharded=_sharded(record, row), **parts)  # fmt: skip


def training_step(record: RunRecord) -> StepParts | None:
    """Medians over the training run's logged steps; summary fractions win where given."""
    if not record.progress and not record.summary.given():
        return None
    keys = ("step_time_s", "data_s", "compute_s", "exposed_comm_s", "optim_s", "fwd_bwd_s")
    parts = {}
    for key in keys:
        values = [v for r in record.progress if (v := num(r.get(key))) is not None]
        parts[key] = statistics.median(values) if values else None
    label = (
        f"training run (median of {len(record.progress)} logged steps)"
        if record.progress
        else f"training run ({SUMMARY_JSON})"
    )
    given = {
        "comm_fraction_given": record.summary.comm_fraction,
        "data_fraction_given": record.summary.data_fraction,
    }
    return StepParts(label, **parts, **given, sharded=_sharded(record))


def focus_step(record: RunRecord) -> StepParts | None:
    """The configuration worth diagnosing: the training run, else the best trial, else baseline."""
    trained = training_step(record)
    if trained is not None and (trained.comm_fraction, trained.data_fraction) != (None, None):
        return trained
    best, base = record.best(), record.baseline()
    if best is not None:
        return trial_step(best, f"trial {best['number']} (best)", record)
    return trial_step(base, "trial 0 (baseline)", record) if base is not None else None
