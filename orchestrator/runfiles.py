"""The run folder, in one place: which files a run holds, and how they are read and written.

A search folder holds trials.csv, best.yaml, best.env, study.db, remeasure.csv, probe.csv,
run_info.json and report.html; a training run folder holds summary.json, progress.csv and
grad_norms.csv. Every command that writes or reads them goes through here, so a file's name
and shape are decided once.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from search_spaces._yaml import load_yaml, read_capped

log = logging.getLogger("commtune")

RUN_INFO = "run_info.json"
STUDY_DB = "study.db"
STUDY_JOURNAL = "study.journal"
"""The study on a network file system, where SQLite's locking is unreliable (storage.py)."""
PROBE_CSV = "probe.csv"
TUNER_CONF = "nccl_tuner.conf"
"""The probe's per-size NCCL algorithm/protocol rules (``orchestrator.probe --tuner-conf``)."""
SEARCH_FILES = (
    "trials.csv", "best.yaml", STUDY_DB, STUDY_JOURNAL, "remeasure.csv", PROBE_CSV, RUN_INFO
)  # fmt: skip
TRAIN_FILES = ("summary.json", "progress.csv", "grad_norms.csv")
KNOWN_FILES = SEARCH_FILES + TRAIN_FILES
TRAIN_RUN_NAME = "train"
"""Ray Train run name inside a training run's folder: a second start with it resumes it."""


def write_atomic(path: Path, text: str) -> None:
    """Write beside, then rename into place: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def storage_dir(out_dir: Path) -> str:
    """Where each search group's TorchTrainer keeps its run state."""
    return str((out_dir / "trials").resolve())


def run_files(folder: Path) -> dict[str, Path]:
    """The known files in ``folder`` or its ``train`` subfolder (a training run kept beside)."""
    found: dict[str, Path] = {}
    for where in (folder, folder / "train"):
        for name in KNOWN_FILES:
            if name not in found and (where / name).is_file():
                found[name] = where / name
    return found


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def read_mapping(path: Path) -> dict[str, Any]:
    """A JSON or YAML file that must hold a mapping (ValueError otherwise)."""
    text = read_capped(path)  # a run folder may come from someone else: capped, guarded
    data = json.loads(text) if path.suffix == ".json" else load_yaml(text)
    if not isinstance(data, dict):
        raise ValueError(f"expected a mapping, got {type(data).__name__}")
    return data


def read_run_info(out: Path) -> dict[str, Any]:
    path = out / RUN_INFO
    return json.loads(path.read_text()) if path.exists() else {}


def update_run_info(out: Path, values: dict[str, Any]) -> dict[str, Any]:
    """Merge ``values`` into run_info.json (the topology of this machine is added once);
    returns the whole record."""
    info = read_run_info(out)
    info.setdefault("topology", topology())
    info.update(values)
    write_atomic(out / RUN_INFO, json.dumps(info, indent=1, default=str))
    return info


def add_search_wall(out: Path, wall_s: float) -> None:
    """Add a search's wall-clock (from its first trial's start to its last's end; a resumed
    search adds its own) to run_info.json, for the measured share of search time."""
    info = read_run_info(out)
    update_run_info(out, {"search_wall_s": info.get("search_wall_s", 0.0) + wall_s})


def read_probe(out: Path) -> list[dict[str, str]] | None:
    """probe.csv's rows in ``out`` (None without a probe)."""
    path = out / PROBE_CSV
    return read_csv(path) if path.exists() else None


def topology(node_root: Path = Path("/sys/devices/system/node")) -> dict[str, Any]:
    """GPU model and count, GPU links (``nvidia-smi topo -m``: ``NV#`` is NVLink), NUMA nodes
    and CPU count of this machine: what decides whether traffic crosses PCIe, NVLink or a
    socket boundary. Read it where the workers run (``session.worker_topology``)."""
    info: dict[str, Any] = {"cpu_count": os.cpu_count()}
    numa = {p.parent.name: p.read_text().strip() for p in sorted(node_root.glob("node*/cpulist"))}
    if numa:
        info["numa_nodes"] = numa
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            names = _run(smi, "--query-gpu=name", "--format=csv,noheader").splitlines()
            info["gpu_model"], info["gpus_on_node"] = (names[0] if names else ""), len(names)
            info["nvidia_smi_topo"] = _run(smi, "topo", "-m")
            info["gpu_link"] = (
                "nvlink" if re.search(r"\bNV\d+\b", info["nvidia_smi_topo"]) else "pcie"
            )
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("nvidia-smi failed", exc_info=True)
            info["nvidia_smi_topo_error"] = str(e)
    return info


def _run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.rstrip()
