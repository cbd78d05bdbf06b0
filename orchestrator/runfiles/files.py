"""The run folder's files: their names, and how they are written and read.

Every name a run folder holds is a constant here; nothing else spells one. A search folder
holds SEARCH_FILES (plus best.env, report.html and the probe's tuner file); a training run's
folder holds TRAIN_FILES, beside the search's in a ``train`` subfolder or on its own.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from search_spaces.guarded_yaml import load_yaml, read_capped

log = logging.getLogger("commtune")

TRIALS_CSV = "trials.csv"
"""One row per trial: number, state, the params, then the measured columns (results.py)."""
BEST_YAML = "best.yaml"
"""The configuration to train with; its first line names the trial it was written from."""
BEST_ENV = "best.env"
"""best.yaml's environment variables as ``export`` lines, for a shell or a job spec."""
STUDY_DB = "study.db"
STUDY_JOURNAL = "study.journal"
"""The study on a network file system, where SQLite's locking is unreliable (storage.py)."""
REMEASURE_CSV = "remeasure.csv"
"""The finalists and the baseline re-measured, interleaved: the verdict's evidence."""
PROBE_CSV = "probe.csv"
RUN_INFO = "run_info.json"
"""What a search records beyond its trials: ``RunInfo`` (info.py)."""
REPORT_HTML = "report.html"
TUNER_CONF = "nccl_tuner.conf"
"""The probe's per-size NCCL algorithm/protocol rules (``orchestrator.probe --tuner-conf``)."""
SUMMARY_JSON = "summary.json"
"""A training run's totals: steps, sizes it ran at, non-finite steps, fractions."""
PROGRESS_CSV = "progress.csv"
"""A training run's logged steps (PROGRESS_COLUMNS in train/runlog.py)."""
GRAD_NORMS_CSV = "grad_norms.csv"
"""Per-layer gradient norms of a training run's logged steps."""
EVENTS_JSONL = "events.jsonl"
"""A training run's events (starts, resizes, restarts, checkpoints), one JSON per line."""
LAST_STEP = "last_step"
"""The step a training run reached, written by its rank 0: what the driver's heartbeat shows."""
TUNED_SIZES_YAML = "tuned_sizes.yaml"
"""The entry per world size a ``--tune`` training run decided, in best.yaml's ``sizes`` format:
a ``--resume`` starts those sizes tuned."""
SEARCH_FILES = (
    TRIALS_CSV, BEST_YAML, STUDY_DB, STUDY_JOURNAL, REMEASURE_CSV, PROBE_CSV, RUN_INFO
)  # fmt: skip
TRAIN_FILES = (SUMMARY_JSON, PROGRESS_CSV, GRAD_NORMS_CSV)
KNOWN_FILES = SEARCH_FILES + TRAIN_FILES
"""The files that make a folder a run folder (the doctor and the report read these)."""
WRITTEN_FILES = (
    *KNOWN_FILES, BEST_ENV, REPORT_HTML, TUNER_CONF, EVENTS_JSONL, LAST_STEP, TUNED_SIZES_YAML
)
"""Every file commtune writes into a run folder."""
TRIALS_DIR = "trials"
"""Each search group's TorchTrainer run state (``storage_dir``)."""
TRAIN_DIR = "train"
"""A training run kept beside the search that tuned it."""
PROBE_DIR = "trainer"
"""The probe's TorchTrainer run state inside its output folder."""
TENSORBOARD_DIR = "tensorboard"
"""TensorBoard event files: ``search``, ``race`` (a search's) and ``train`` (a training run's)
beside each other, so ``tensorboard --logdir runs/<name>/tensorboard`` shows them all."""
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
    return str((out_dir / TRIALS_DIR).resolve())


def run_files(folder: Path) -> dict[str, Path]:
    """The known files in ``folder`` or its ``train`` subfolder (a training run kept beside)."""
    found: dict[str, Path] = {}
    for where in (folder, folder / TRAIN_DIR):
        for name in KNOWN_FILES:
            if name not in found and (where / name).is_file():
                found[name] = where / name
    return found


def missing_dirs(dirs: list[Path]) -> list[str]:
    """One line per DIR that is not a run folder: the commands that read one say which and
    what was expected (exit 2)."""
    return [
        f"{d}: holds none of {', '.join(KNOWN_FILES)} (expected a search output folder such as "
        "runs/<name>, or a training run folder)"
        for d in dirs
        if not run_files(d)
    ]


CSV_MAX_BYTES = 64 << 20
"""The largest CSV a reader takes (progress.csv of some 300,000 logged steps): a run folder may
come from someone else, and a bigger file is skipped with a line naming the cap rather than
read whole into memory (JSON and YAML files are capped at ``MAX_FILE_BYTES``, 1 MiB)."""


def read_csv(path: Path, limit: int = CSV_MAX_BYTES) -> list[dict[str, str]]:
    """A CSV file's rows as strings; raises OSError, ValueError (not a regular file, larger
    than ``limit``, not UTF-8) or csv.Error, which a reader of a run folder skips."""
    return list(csv.DictReader(io.StringIO(read_capped(path, limit), newline="")))


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A CSV file written whole: the text is built first, then renamed into place
    (``write_atomic``), so a reader never sees half a table; None cells are written blank."""
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(header)
    writer.writerows(rows)
    write_atomic(path, text.getvalue())


def read_mapping(path: Path) -> dict[str, Any]:
    """A JSON or YAML file that must hold a mapping (ValueError otherwise, also for JSON nested
    too deep for the parser: a RecursionError would end the doctor with a traceback)."""
    text = read_capped(path)  # a run folder may come from someone else: capped, guarded
    try:
        data = json.loads(text) if path.suffix == ".json" else load_yaml(text)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected a mapping, got {type(data).__name__}")
    return data


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
    info["net_transport"] = net_transport(os.environ)
    return info


RDMA_CLASS = Path("/sys/class/infiniband")


def net_transport(env: Mapping[str, str], rdma_class: Path = RDMA_CLASS) -> str:
    """The transport NCCL carries traffic between nodes on, from this node's RDMA devices and
    the variables that steer NCCL's choice: ``efa`` (an EFA device: NCCL goes through the OFI
    plugin), ``ib`` (InfiniBand or RoCE verbs), ``socket`` (none, or NCCL told to use TCP).
    Socket threads act only on the socket transport, queue pairs only on verbs."""
    drivers = {p.resolve().name for p in rdma_class.glob("*/device/driver")}
    if "efa" in drivers:
        return "efa"
    net = env.get("NCCL_NET", "").lower()
    if not drivers or net == "socket" or env.get("NCCL_IB_DISABLE") == "1" and net != "ib":
        return "socket"
    return "ib"


def _run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.rstrip()
