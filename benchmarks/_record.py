"""Every benchmark run leaves a record: what ran, on which commit and machine, what it printed.

A figure without its run cannot be checked or compared, so each benchmark's ``main`` runs inside
``recording``: what it prints is shown and kept, and when it ends without an error one JSON file
is written, ``YYYYMMDD-<benchmark>-<HHMMSS>.json`` (UTC), holding the ``Record`` below. A
measurement's record goes into ``benchmarks/results/``, where the docs link it. A ``--quick`` run
is a smoke check, not a measurement: it writes a record only into a folder it is given
(``--results DIR``, or the ``COMMTUNE_RESULTS`` variable, which tests set), so no quick run or
test adds a file to the repository. Standard library only: the GPU check imports no more.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import io
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
"""Where a measurement's record goes unless ``--results`` or ``COMMTUNE_RESULTS`` says."""
RESULTS_ENV = "COMMTUNE_RESULTS"


@dataclass(frozen=True)
class Record:
    """One benchmark run."""

    benchmark: str
    utc: str
    """When it ended, ISO 8601 in UTC."""
    commit: str | None
    """The checkout's HEAD (None outside a git checkout)."""
    dirty: bool | None
    """A tracked file differed from ``commit`` (untracked ones, records among them, do not
    count); None outside a git checkout."""
    machine: dict[str, Any]
    command: str
    figures: dict[str, Any] = field(default_factory=dict)
    """What the benchmark measured, by name (its own keys)."""
    printed: list[str] = field(default_factory=list)
    """Its output as a user saw it."""


def add_results_option(parser: argparse.ArgumentParser) -> None:
    """``--results DIR``: the one option every benchmark takes for its record."""
    where = f"default: ${RESULTS_ENV}, else benchmarks/results/; a --quick run: only where told"
    parser.add_argument(
        "--results", type=Path, metavar="DIR", help=f"write the run's record into DIR ({where})"
    )


def destination(results: Path | None, quick: bool) -> Path | None:
    """The record's folder: ``results``, else ``$COMMTUNE_RESULTS``, else the repository's
    results folder for a measurement and none for a quick run."""
    if results is not None:
        return results
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV])
    return None if quick else RESULTS


class _Tee(io.TextIOBase):
    """Writes through to the real stdout and keeps a copy."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.copy = inner, io.StringIO()

    def write(self, text: str) -> int:
        self.inner.write(text)
        return self.copy.write(text)

    def flush(self) -> None:
        self.inner.flush()

    def fileno(self) -> int:
        return self.inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]  (what callers of sys.stdout read)
        return self.inner.encoding


@contextmanager
def recording(module: str, argv: list[str] | None, results: Path | None,
              quick: bool) -> Iterator[dict[str, Any]]:  # fmt: skip
    """Run the block as benchmark ``module`` (``benchmarks.delivered``) parsed from ``argv``
    (None: this process's command line); yields the figures dict the block fills. The record is
    written only if the block ends without an error: a failed run has no figures to keep."""
    figures: dict[str, Any] = {}
    tee, shown = _Tee(sys.stdout), sys.stdout
    sys.stdout = tee
    try:
        yield figures
    finally:
        sys.stdout = shown
    folder = destination(results, quick)
    if folder is None:
        return
    command = sys.orig_argv if argv is None else ["python", "-m", module, *argv]
    commit, dirty = _checkout()
    record = Record(module.rsplit(".", 1)[-1], _now().isoformat(timespec="seconds"), commit,
                    dirty, machine(), shlex.join(command), figures,
                    tee.copy.getvalue().splitlines())  # fmt: skip
    print(f"record: {write(record, folder)}")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def write(record: Record, folder: Path) -> Path:
    """The record as ``folder/YYYYMMDD-<benchmark>-<HHMMSS>.json``; never over another."""
    when = dt.datetime.fromisoformat(record.utc)
    path = folder / f"{when:%Y%m%d}-{record.benchmark}-{when:%H%M%S}.json"
    folder.mkdir(parents=True, exist_ok=True)
    with path.open("x") as f:
        json.dump(dataclasses.asdict(record), f, indent=1, default=str)
        f.write("\n")
    return path


def read(path: Path) -> Record:
    """A record as ``write`` wrote it."""
    return Record(**json.loads(path.read_text()))


def _output(cmd: list[str]) -> str | None:
    """The command's output; None where it is missing, hangs or fails."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _git(*args: str) -> str | None:
    return _output(["git", "-C", str(ROOT), *args])


def _checkout() -> tuple[str | None, bool | None]:
    """HEAD and whether a tracked file differs from it (None, None outside a checkout)."""
    head = _git("rev-parse", "HEAD")
    if head is None:
        return None, None
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return head.strip(), None if changed is None else bool(changed.strip())


def machine() -> dict[str, Any]:
    """What the figures depend on: cores, memory, GPUs, and the versions of Python, torch
    and Ray (None where not installed: the GPU machines have no Ray)."""
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"cpus": os.cpu_count(), "memory_bytes": pages, "gpus": gpu_names(),
            "platform": platform.platform(), "python": platform.python_version(),
            "torch": _version("torch"), "ray": _version("ray")}  # fmt: skip


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def gpu_names() -> list[str]:
    """The GPUs ``nvidia-smi`` lists (none without it)."""
    listed = _output(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) or ""
    return [line.strip() for line in listed.splitlines() if line.strip()]
