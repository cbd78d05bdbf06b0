"""A run as the doctor and the report see it: whatever files its folder holds, read once.

The files are read from each folder and its ``train`` subfolder (``files.KNOWN_FILES``);
run_info.json becomes a ``RunInfo``. An unreadable file is noted and skipped: the other rules
still run.
"""

from __future__ import annotations

import csv
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.runfiles.files import (
    BEST_YAML,
    PROBE_CSV,
    PROGRESS_CSV,
    REMEASURE_CSV,
    RUN_INFO,
    SUMMARY_JSON,
    TRIALS_CSV,
    read_csv,
    read_mapping,
    run_files,
    topology,
)
from orchestrator.runfiles.info import RunInfo

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
    run_info: RunInfo = field(default_factory=RunInfo)
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
        if self.run_info.backend or len(probed) == 1:
            return self.run_info.backend or probed.pop()
        cpu_only = (self.best_config.get("cluster") or {}).get("use_gpu") is False
        return "gloo" if cpu_only else None

    @property
    def world_size(self) -> int | None:
        workers = (self.best_config.get("cluster") or {}).get("num_workers")
        trained = self.summary.get("world_sizes") or [None]  # a training run's sizes, sorted
        size = self.run_info.world_size or workers or trained[-1]
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


def _read_info(path: Path) -> RunInfo:
    return RunInfo.from_mapping(read_mapping(path))


_READERS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    TRIALS_CSV: ("trials", read_csv),
    BEST_YAML: ("best_config", read_mapping),
    RUN_INFO: ("run_info", _read_info),
    PROBE_CSV: ("probe", read_csv),
    REMEASURE_CSV: ("remeasure", read_csv),
    SUMMARY_JSON: ("summary", read_mapping),
    PROGRESS_CSV: ("progress", read_csv),
}
"""Which RunRecord field each file fills (grad_norms.csv is read where it is drawn)."""


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
        head = record.files[BEST_YAML].read_text().partition("\n")[0]
        match = re.match(r"# commtune best configuration: trial (\d+)", head)
        record.best_number = int(match[1]) if match else None
    record.topology = _recorded_topology(record.run_info.topology)
    return record


def _recorded_topology(recorded: Any) -> dict[str, Any]:
    """The run's own topology when the driver kept it; else this machine's, said as such."""
    if isinstance(recorded, dict) and recorded:
        return {"source": RUN_INFO, **recorded}
    if recorded:
        return {"source": RUN_INFO, "description": str(recorded)}
    return {"source": f"this machine at diagnosis time; {RUN_INFO} has none", **topology()}
