"""A search over a range of world sizes (``--workers MIN:MAX``, ``search.world_sizes``): what an
elastic run needs, a configuration measured at each size it may train at.

The sizes are searched one after another, the largest first: it is ``cluster.num_workers``, the
primary search, in the run folder itself, with the configured trials. Each smaller size is a
search of its own in ``size-N/`` (its own baseline, finalists and verdict against that
baseline), with half the trials: it starts from what the sizes before it found best, fitted to
it (tried right after its baseline), the staged proposer's memory shapes and the cost model, so
it needs fewer trials than a search from nothing. best.yaml in the run folder then holds an
entry per size (``sizes``, ``orchestrator.sizes``) that ``orchestrator.train`` switches
between as the run resizes.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from pathlib import Path
from typing import Any

from orchestrator.config import Config, dump_config, load_config
from orchestrator.runfiles import BEST_YAML, STUDY_DB, STUDY_JOURNAL, TRIALS_CSV, write_atomic
from orchestrator.search.pipeline import run_search

HEADER = re.compile(r"# commtune best configuration: trial (\d+), ([\d.]+) samples/s")
VERDICT = re.compile(r"# verdict, measured beside the baseline: (.*)")
MIN_TRIALS = 4
"""The fewest trials a smaller size gets: its baseline, what a larger size found, two more."""


def size_config(config: Config, size: int, primary: bool) -> Config:
    """``config`` for the search at ``size``: the primary keeps its name and trials; a smaller
    size has its own study name (a shared database holds both) and half the trials."""
    if primary:
        return config
    trials = min(config.search.trials, max(MIN_TRIALS, math.ceil(config.search.trials / 2)))
    search = dataclasses.replace(config.search, trials=trials, world_sizes=[])
    cluster = dataclasses.replace(config.cluster, num_workers=size)
    return dataclasses.replace(config, name=f"{config.name}-size{size}", cluster=cluster,
                               search=search, sizes={})  # fmt: skip


def size_folder(out: Path, size: int, primary: bool) -> Path:
    return out if primary else out / f"size-{size}"


def run_range(
    config: Config, out: Path, faults: dict[int, str], resume: bool, verbose: bool,
    deadline: float | None,
) -> tuple[list[str], str | None]:  # fmt: skip
    """Search every size of ``config.search.world_sizes``; best.yaml gets an entry per size.
    Returns the closing lines and why the primary's baseline failed (None when it did not)."""
    sizes = sorted(config.search.world_sizes, reverse=True)
    lines: list[str] = []
    carried: list[dict[str, Any]] = []
    walls: dict[int, float] = {}
    failed: str | None = None
    for i, size in enumerate(sizes):
        folder = size_folder(out, size, i == 0)
        folder.mkdir(parents=True, exist_ok=True)
        print(f"world size {size} ({i + 1} of {len(sizes)}): searching in {folder}", flush=True)
        started = time.monotonic()
        size_lines, why = run_search(
            size_config(config, size, i == 0), folder, faults if i == 0 else {},
            resume and _holds_study(folder), verbose, deadline, tuple(carried),
        )  # fmt: skip
        walls[size] = time.monotonic() - started
        lines += [f"[{size} workers] {line}" for line in size_lines]
        failed = why if i == 0 else failed
        entry = read_entry(folder / BEST_YAML)
        if entry is not None:
            carried.append({**entry, "size": size})
    lines += write_sizes(out / BEST_YAML, {e["size"]: e for e in carried})
    lines.append(cost_line(walls, sizes))
    return lines, failed


def _holds_study(folder: Path) -> bool:
    return any((folder / name).exists() for name in (STUDY_DB, STUDY_JOURNAL, TRIALS_CSV))


def read_entry(path: Path) -> dict[str, Any] | None:
    """A size's entry from the best.yaml its search wrote: the configuration, the trial and
    the samples/s its header gives, the verdict line (None: no trial completed)."""
    if not path.is_file():
        return None
    text = path.read_text()
    header, verdict = HEADER.search(text), VERDICT.search(text)
    chosen = load_config(str(path))
    entry: dict[str, Any] = {"tuned": dict(chosen.tuned), "env": dict(chosen.env)}
    if header:
        entry |= {"trial": int(header.group(1)), "samples_per_s": float(header.group(2))}
    if verdict:  # the decision and its figures; the advice stays in that size's folder
        entry["verdict"] = verdict.group(1).split(f"; {BEST_YAML} keeps")[0]
    return entry


def write_sizes(path: Path, entries: dict[int, dict[str, Any]]) -> list[str]:
    """Rewrite the primary's best.yaml (``path``) with ``sizes``: its header kept, a line per
    entry said. The primary's own entry equals its top level, as ``check_sizes`` wants."""
    if not path.is_file():
        return [f"no size completed a trial: {BEST_YAML} has no sizes"]
    text = path.read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    config = load_config(str(path))
    sizes = {size: {k: v for k, v in e.items() if k != "size"} for size, e in entries.items()}
    config = dataclasses.replace(config, sizes=sizes)
    note = f"# sizes: one entry per world size searched ({', '.join(map(str, sorted(sizes)))})\n"
    write_atomic(path, header + note + dump_config(config))
    return [_entry_line(size, e) for size, e in sorted(sizes.items())]


def _entry_line(size: int, entry: dict[str, Any]) -> str:
    figure = f"{entry['samples_per_s']:.1f} samples/s" if "samples_per_s" in entry else "n/a"
    knobs = ", ".join(f"{k}={v}" for k, v in sorted({**entry["tuned"], **entry["env"]}.items()))
    verdict = entry.get("verdict", "no verdict (nothing re-measured)").split(" (")[0]
    return f"size {size}: trial {entry.get('trial', '?')}, {figure}, {{{knobs}}}; {verdict}"


def cost_line(walls: dict[int, float], sizes: list[int]) -> str:
    """What tuning the sizes cost against the primary search alone."""
    first, total = walls[sizes[0]], sum(walls.values())
    return (f"tuned {len(sizes)} world sizes in {total:.0f}s: {total / first:.2f}x the "
            f"{sizes[0]}-worker search alone ({first:.0f}s)")  # fmt: skip
