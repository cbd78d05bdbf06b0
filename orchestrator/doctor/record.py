"""A run as the doctor and the report see it: whatever files its folder holds, read once.

Files read from each folder (and its ``train`` subfolder): trials.csv, best.yaml, study.db (or
study.journal), remeasure.csv, probe.csv, run_info.json (search side); summary.json,
progress.csv, grad_norms.csv (a training run). run_info.json keys, all optional: backend,
world_size, num_nodes, use_gpu, topology, single_worker_samples_per_s, memory_capacity_bytes,
gpu_util, and link (a name in ``costmodel.LINKS``) or grad_bytes (gradient bytes per step) for
the bandwidth check. An unreadable file is noted and skipped: the other rules still run.
"""

from __future__ import annotations

import csv
import logging
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.runfiles import read_csv, read_mapping, run_files, topology
from train_fns.commsplit import comm_fraction

log = logging.getLogger("commtune")


@dataclass
class RunRecord:
    """Whatever a run left behind; every field may be empty."""

    files: dict[str, Path] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)
    trials: list[dict[str, str]] = field(default_factory=list)
    param_names: list[str] = field(default_factory=list)
    best_config: dict[str, Any] = field(default_factory=dict)
    best_number: int | None = None
    """The trial best.yaml was written from (its header names it)."""
    run_info: dict[str, Any] = field(default_factory=dict)
    probe: list[dict[str, str]] = field(default_factory=list)
    remeasure: list[dict[str, str]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    progress: list[dict[str, str]] = field(default_factory=list)
    topology: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str | None:
        return self.best_config.get("name")

    @property
    def model(self) -> str | None:
        return (self.best_config.get("workload") or {}).get("model")

    @property
    def backend(self) -> str | None:
        """run_info's backend, else the probe's (same workers), else gloo for CPU-only configs."""
        probed = {r.get("backend") for r in self.probe} - {None, ""}
        if self.run_info.get("backend") or len(probed) == 1:
            return self.run_info.get("backend") or probed.pop()
        cpu_only = (self.best_config.get("cluster") or {}).get("use_gpu") is False
        return "gloo" if cpu_only else None

    @property
    def world_size(self) -> int | None:
        workers = (self.best_config.get("cluster") or {}).get("num_workers")
        trained = self.summary.get("world_sizes") or [None]  # a training run's sizes, sorted
        size = self.run_info.get("world_size") or workers or trained[-1]
        return int(size) if num(size) else None

    @property
    def env(self) -> dict[str, Any]:
        return self.best_config.get("env") or {}

    def trial(self, number: int | None) -> dict[str, str] | None:
        return next((r for r in self.trials if num(r.get("number")) == number), None)

    def completed(self) -> list[dict[str, str]]:
        return [
            r for r in self.trials if r.get("state") == "complete" and num(r.get("samples_per_s"))
        ]

    def baseline(self) -> dict[str, str] | None:
        """Trial 0 is the untouched default; if it did not complete there is no baseline."""
        row = self.trial(0)
        return row if row in self.completed() else None

    def best(self) -> dict[str, str] | None:
        """The trial best.yaml names, else the fastest completed one."""
        row = self.trial(self.best_number)
        if row in self.completed():
            return row
        done = self.completed()
        return max(done, key=lambda r: num(r["samples_per_s"])) if done else None


def num(value: Any) -> float | None:
    """A CSV cell or JSON value as a float; blanks and junk are None (absent, not zero)."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class StepParts:
    """Where one optimizer step's time went, for one configuration."""

    label: str
    step_time_s: float | None
    data_s: float | None = None
    compute_s: float | None = None
    exposed_comm_s: float | None = None
    optim_s: float | None = None
    fwd_bwd_s: float | None = None
    comm_fraction_given: float | None = None
    data_fraction_given: float | None = None

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


def trial_step(row: dict[str, str], label: str) -> StepParts:
    keys = ("step_time_s", "data_s", "compute_s", "exposed_comm_s", "optim_s", "fwd_bwd_s")
    parts = {k: num(row.get(k)) for k in keys}
    return StepParts(label, comm_fraction_given=num(row.get("comm_fraction")), **parts)


def training_step(record: RunRecord) -> StepParts | None:
    """Medians over the training run's logged steps; summary fractions win where given."""
    if not record.progress and not record.summary:
        return None
    keys = ("step_time_s", "data_s", "compute_s", "exposed_comm_s", "optim_s", "fwd_bwd_s")
    parts = {}
    for key in keys:
        values = [v for r in record.progress if (v := num(r.get(key))) is not None]
        parts[key] = statistics.median(values) if values else None
    label = (
        f"training run (median of {len(record.progress)} logged steps)"
        if record.progress
        else "training run (summary.json)"
    )
    given = {
        "comm_fraction_given": num(record.summary.get("comm_fraction")),
        "data_fraction_given": num(record.summary.get("data_fraction")),
    }
    return StepParts(label, **parts, **given)


def focus_step(record: RunRecord) -> StepParts | None:
    """The configuration worth diagnosing: the training run, else the best trial, else baseline."""
    trained = training_step(record)
    if trained is not None and (trained.comm_fraction, trained.data_fraction) != (None, None):
        return trained
    best, base = record.best(), record.baseline()
    if best is not None:
        return trial_step(best, f"trial {best['number']} (best)")
    return trial_step(base, "trial 0 (baseline)") if base is not None else None



_READERS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "trials.csv": ("trials", read_csv),
    "best.yaml": ("best_config", read_mapping),
    "run_info.json": ("run_info", read_mapping),
    "probe.csv": ("probe", read_csv),
    "remeasure.csv": ("remeasure", read_csv),
    "summary.json": ("summary", read_mapping),
    "progress.csv": ("progress", read_csv),
}


def collect(dirs: list[Path]) -> RunRecord:
    """A RunRecord from whatever files the folders hold; the first folder holding a file wins.

    An unreadable file is noted and skipped (with a warning): the other rules still run.
    """
    record = RunRecord()
    for folder in dirs:
        for name, path in run_files(Path(folder)).items():
            record.files.setdefault(name, path)
    for name, (attr, reader) in _READERS.items():
        if name not in record.files:
            continue
        try:
            setattr(record, attr, reader(record.files[name]))
        except (OSError, ValueError, csv.Error, yaml.YAMLError) as e:
            log.warning("doctor: skipping unreadable %s: %s", record.files[name], e)
            record.unreadable[name] = str(e).splitlines()[0] if str(e) else type(e).__name__
    if record.trials:
        header = list(record.trials[0])
        end = header.index("samples_per_s") if "samples_per_s" in header else len(header)
        record.param_names = header[2:end]  # number, state, then the params (results.py)
    if record.best_config:  # results.py's header line names the trial it was written from
        head = record.files["best.yaml"].read_text().partition("\n")[0]
        match = re.match(r"# commtune best configuration: trial (\d+)", head)
        record.best_number = int(match[1]) if match else None
    record.topology = _recorded_topology(record.run_info.get("topology"))
    return record


def _recorded_topology(recorded: Any) -> dict[str, Any]:
    """The run's own topology when the driver kept it; else this machine's, said as such."""
    if isinstance(recorded, dict) and recorded:
        return {"source": "run_info.json", **recorded}
    if recorded:
        return {"source": "run_info.json", "description": str(recorded)}
    return {"source": "this machine at diagnosis time; run_info.json has none", **topology()}
