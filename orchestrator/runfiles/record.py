"""A run as the doctor and the report see it: whatever files its folder holds, read once.

The files are read from each folder and its ``train`` subfolder (``files.KNOWN_FILES``);
run_info.json becomes a ``RunInfo`` and summary.json a ``Summary``. An unreadable file, or a
value of the wrong kind in one (a hand edit), is noted in one line and skipped: the other rules
still run.
"""

from __future__ import annotations

import csv
import logging
import math
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
from orchestrator.runfiles.kinds import wrong_kinds
from orchestrator.runfiles.remeasure import Remeasured, read_rows
from orchestrator.runfiles.summary import Summary
from search_spaces.guarded_yaml import read_capped

log = logging.getLogger("commtune")


@dataclass
class RunRecord:
    """Whatever a run left behind; every field may be empty."""

    files: dict[str, Path] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)
    """Per file, why it (or a part of it, read as absent) was skipped: one line each."""
    trials: list[dict[str, str]] = field(default_factory=list)
    param_names: list[str] = field(default_factory=list)
    best_config: dict[str, Any] = field(default_factory=dict)
    best_number: int | None = None
    """The trial best.yaml was written from (its header names it)."""
    run_info: RunInfo = field(default_factory=RunInfo)
    probe: list[dict[str, str]] = field(default_factory=list)
    remeasure: list[Remeasured] = field(default_factory=list)
    summary: Summary = field(default_factory=Summary)
    progress: list[dict[str, str]] = field(default_factory=list)
    topology: dict[str, Any] = field(default_factory=dict)

    def _section(self, key: str) -> dict[str, Any]:
        """A section of best.yaml, {} when absent or not a mapping (a hand edit)."""
        value = self.best_config.get(key)
        return value if isinstance(value, dict) else {}

    @property
    def name(self) -> str | None:
        return _text(self.best_config.get("name"))

    @property
    def model(self) -> str | None:
        return _text(self._section("workload").get("model"))

    @property
    def backend(self) -> str | None:
        """run_info's backend, else the probe's (same workers), else gloo for CPU-only configs."""
        probed = {r.get("backend") for r in self.probe} - {None, ""}
        if self.run_info.backend or len(probed) == 1:
            return self.run_info.backend or probed.pop()
        cpu_only = self._section("cluster").get("use_gpu") is False
        return "gloo" if cpu_only else None

    @property
    def world_size(self) -> int | None:
        """run_info's, else best.yaml's workers, else the largest size a training run had."""
        trained = self.summary.world_sizes or [None]  # sorted
        for size in (self.run_info.world_size, self._section("cluster").get("num_workers"),
                     trained[-1]):  # fmt: skip
            count = num(size)
            if count is not None and count >= 1 and count.is_integer():
                return int(count)
        return None

    @property
    def env(self) -> dict[str, Any]:
        return self._section("env")

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


def _text(value: Any) -> str | None:
    """A name from best.yaml: a string, else absent (``name: [1]`` is no study name)."""
    return value if isinstance(value, str) else None


def num(value: Any) -> float | None:
    """A CSV cell or JSON value as a finite float; blanks, junk and "nan"/"inf" are None
    (absent, not zero: an infinite samples/s must not make a trial the best)."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


BELOW_SEARCHED = 0.8
"""A world size that trains below this share of what the search measured for its own entry is
flagged (the run log, the report and the doctor)."""


def below_searched(by_size: list[dict[str, Any]] | None) -> list[tuple[dict[str, Any], float]]:
    """The sizes of ``Summary.by_size`` that trained below ``BELOW_SEARCHED`` of the figure the
    search measured at that same size (another size's figure does not compare), with the share.
    """
    out = []
    for size in by_size or []:
        world, entry = num(size.get("world_size")), num(size.get("entry_size"))
        trained, searched = num(size.get("samples_per_s")), num(size.get("searched_samples_per_s"))
        own = world is not None and entry == world
        if own and trained and searched and 0 < trained < BELOW_SEARCHED * searched:
            out.append(({**size, "world_size": world, "samples_per_s": trained,
                         "searched_samples_per_s": searched}, trained / searched))  # fmt: skip
    return out


Read = Callable[[Path], tuple[Any, list[str]]]
"""A file's reader: its value and the keys it read as absent (of the wrong kind)."""


def _rows(path: Path) -> tuple[list[dict[str, str]], list[str]]:
    """A CSV's rows: every cell a string, judged where it is used (``num``)."""
    return read_csv(path), []


def _remeasured(path: Path) -> tuple[list[Remeasured], list[str]]:
    """remeasure.csv as records: a hand-edited value of the wrong kind reads as absent."""
    return read_rows(read_csv(path)), []


def _typed(record: type[RunInfo] | type[Summary]) -> Read:
    """A reader of a JSON record: wrong kinds read as absent, and named."""

    def read(path: Path) -> tuple[Any, list[str]]:
        raw = read_mapping(path)
        return record.from_mapping(raw), wrong_kinds(record, raw)

    return read


_BEST_SECTIONS: dict[str, type] = {
    "name": str, "cluster": dict, "workload": dict, "search": dict, "train": dict, "env": dict,
}  # fmt: skip
"""best.yaml's top-level keys and their kinds: a config's sections are mappings."""


def _read_best(path: Path) -> tuple[dict[str, Any], list[str]]:
    """best.yaml without its keys of the wrong kind (``cluster: 5`` is no section)."""
    config = read_mapping(path)
    wrong = [k for k, kind in _BEST_SECTIONS.items() if k in config
             and not isinstance(config[k], kind)]  # fmt: skip
    return {k: v for k, v in config.items() if k not in wrong}, wrong


_READERS: dict[str, tuple[str, Read]] = {
    TRIALS_CSV: ("trials", _rows),
    BEST_YAML: ("best_config", _read_best),
    RUN_INFO: ("run_info", _typed(RunInfo)),
    PROBE_CSV: ("probe", _rows),
    REMEASURE_CSV: ("remeasure", _remeasured),
    SUMMARY_JSON: ("summary", _typed(Summary)),
    PROGRESS_CSV: ("progress", _rows),
}
"""Which RunRecord field each file fills (grad_norms.csv is read where it is drawn)."""

UNREADABLE = (OSError, ValueError, csv.Error, yaml.YAMLError)
"""What reading a file may raise (read_capped, json, the guarded YAML loader, csv): skipped."""


def collect(dirs: list[Path]) -> RunRecord:
    """A RunRecord from whatever files the folders hold; the first folder holding a file wins.

    An unreadable file, or a value of the wrong kind in one, is noted and skipped (with a
    warning): the other rules, figures and sections still run.
    """
    record = RunRecord()
    for folder in dirs:
        for name, path in run_files(Path(folder)).items():
            record.files.setdefault(name, path)
    for name, (attr, reader) in _READERS.items():
        if name in record.files:
            _read_into(record, name, attr, reader)
    if record.trials:
        header = list(record.trials[0])
        end = header.index("samples_per_s") if "samples_per_s" in header else len(header)
        record.param_names = header[2:end]  # number, state, then the params (results.py)
    if record.best_config:
        record.best_number = _best_number(record.files[BEST_YAML])
    record.topology = _recorded_topology(record.run_info.topology)
    return record


def _read_into(record: RunRecord, name: str, attr: str, reader: Read) -> None:
    """One file into its field, or a line saying why not: the doctor and the report both read
    a folder through here, so the line names neither."""
    path = record.files[name]
    try:
        value, wrong = reader(path)
    except UNREADABLE as e:
        log.warning("skipping unreadable %s: %s", path, e)
        record.unreadable[name] = str(e).splitlines()[0] if str(e) else type(e).__name__
        return
    setattr(record, attr, value)
    if wrong:
        why = f"{', '.join(wrong)}: wrong kind or value, read as absent"
        log.warning("reading %s: %s", path, why)
        record.unreadable[name] = why


def _best_number(path: Path) -> int | None:
    """The trial best.yaml was written from: results.py's header line names it."""
    try:
        head = read_capped(path).partition("\n")[0]
    except UNREADABLE:
        return None
    match = re.match(r"# commtune best configuration: trial (\d+)", head)
    return int(match[1]) if match else None


def _recorded_topology(recorded: Any) -> dict[str, Any]:
    """The run's own topology when the driver kept it; else this machine's, said as such."""
    if isinstance(recorded, dict) and recorded:
        return {"source": RUN_INFO, **recorded}
    if recorded:
        return {"source": RUN_INFO, "description": str(recorded)}
    return {"source": f"this machine at diagnosis time; {RUN_INFO} has none", **topology()}
