"""A search over a range of world sizes (``--workers MIN:MAX``, ``search.world_sizes``): what an
elastic run needs, a configuration measured at each size it may train at.

The sizes are searched one after another, the largest first: it is ``cluster.num_workers``, the
primary search, in the run folder itself, with the configured trials. Each smaller size is a
search of its own in ``size-N/`` (its own baseline, finalists and verdict against that
baseline), with half the trials: it starts from what the sizes before it found best, fitted to
it (tried right after its baseline), the staged proposer's memory shapes and the cost model, so
it needs fewer trials than a search from nothing; its windows (the race's too) are as many
seconds as the primary's, in fewer of its longer steps (``window_steps``). best.yaml in the
run folder then holds an entry per size (``sizes``, ``orchestrator.config.size_entries``) that
``orchestrator.train`` switches between as the run resizes.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from pathlib import Path
from typing import Any

from orchestrator.config.schema import Config, ConfigError, dump_config, load_config
from orchestrator.runfiles import BEST_YAML, write_atomic
from train_fns.plan import steps_per_window

HEADER = re.compile(r"# commtune best configuration: trial (\d+), ([\d.]+) samples/s")
VERDICT = re.compile(r"# verdict, measured beside the baseline: (.*)")
MIN_TRIALS = 4
"""The fewest trials a smaller size gets: its baseline, what a larger size found, two more."""


def size_config(config: Config, size: int, primary: bool) -> Config:
    """``config`` for the search at ``size``: the primary keeps its name and trials; a smaller
    size has its own study name (a shared database holds both), half the trials and windows
    of as many seconds as the primary's (``window_steps``)."""
    if primary:  # what it writes becomes the entries: an older best.yaml's are not kept
        return dataclasses.replace(config, sizes={})
    trials = min(config.search.trials, max(MIN_TRIALS, math.ceil(config.search.trials / 2)))
    steps = window_steps(config, size) * config.search.windows
    measure = min(config.search.measure_steps, steps)
    search = dataclasses.replace(
        config.search, trials=trials, world_sizes=[], measure_steps=measure
    )
    cluster = dataclasses.replace(config.cluster, num_workers=size)
    return dataclasses.replace(config, name=f"{config.name}-size{size}", cluster=cluster,
                               search=search, sizes={})  # fmt: skip


def window_steps(config: Config, size: int) -> int:
    """Steps a window of a smaller size's search measures: the primary's steps a window (the
    shortest, ``train_fns.plan.steps_per_window``, as its search takes them), scaled by the
    size and rounded up, at least one. At a fixed global batch each of ``size`` workers does
    ``num_workers / size`` times the primary's work per step, so a window of as many steps
    would take that much longer for no more certainty: a window's noise is the machine's over
    its seconds (and the race's pairs, half the smaller size's time at equal steps, are
    windows too)."""
    primary = steps_per_window(config.search.measure_steps, config.search.windows)
    return max(1, math.ceil(primary * size / config.cluster.num_workers))


def check_sizes_can_run(config: Config) -> None:
    """Each smaller size's config is valid (a fixed ``tuned`` value, the study's name): a
    mistake stops before Ray, not after the largest size's whole search."""
    for size in sorted(config.search.world_sizes, reverse=True)[1:]:
        try:
            size_config(config, size, primary=False)
        except ConfigError as e:
            raise ConfigError(e.key, f"at {size} workers (search.world_sizes): "
                              f"{str(e).split(': ', 1)[1]}") from e  # fmt: skip


def size_folder(out: Path, size: int, primary: bool) -> Path:
    return out if primary else out / f"size-{size}"


def run_range(
    config: Config, out: Path, faults: dict[int, str], resume: bool, verbose: bool,
    deadline: float | None,
) -> tuple[list[str], str | None]:  # fmt: skip
    """Search every size of ``config.search.world_sizes``; best.yaml gets an entry per size.
    Returns the closing lines and why the primary's baseline failed (None when it did not)."""
    from orchestrator.search.pipeline import run_search  # Ray and Tune: once the input is good

    sizes = sorted(config.search.world_sizes, reverse=True)
    lines: list[str] = []
    entries: dict[int, dict[str, Any]] = {}
    walls: dict[int, float] = {}
    failed: str | None = None
    for i, size in enumerate(sizes):
        folder = size_folder(out, size, i == 0)
        entry = read_entry(folder / BEST_YAML) if resume else None
        if entry is not None and "verdict" in entry:  # searched and decided before the resume
            print(f"world size {size}: searched before ({folder}); its entry is kept", flush=True)
        elif i and deadline is not None and time.time() > deadline:
            print(f"time budget spent: {size} workers not searched", flush=True)
            continue
        else:
            folder.mkdir(parents=True, exist_ok=True)
            print(f"world size {size} ({i + 1} of {len(sizes)}): searching in {folder}", flush=True)
            started = time.monotonic()
            carried = tuple({**e, "size": s} for s, e in sorted(entries.items()))  # nearest first
            size_lines, why = run_search(size_config(config, size, i == 0), folder,
                                         faults if i == 0 else {}, resume, verbose, deadline,
                                         carried)  # fmt: skip
            walls[size] = time.monotonic() - started
            lines += [f"[{size} workers] {line}" for line in size_lines]
            failed = why if i == 0 else failed
            entry = read_entry(folder / BEST_YAML)
        if entry is not None:
            entries[size] = entry
    lines += write_sizes(out / BEST_YAML, entries, sizes[0])
    # a figure only where this run searched every size from its start (a resumed or
    # budget-cut one has no whole search to compare with)
    lines += [cost_line(walls, sizes)] if list(walls) == sizes and not resume else []
    return lines, failed


def read_entry(path: Path) -> dict[str, Any] | None:
    """A size's entry from the best.yaml its search wrote: the configuration, the trial and
    the samples/s its header gives, the verdict line (None: no trial completed)."""
    if not path.is_file():
        return None
    text = path.read_text()
    header, verdict = HEADER.search(text), VERDICT.search(text)
    chosen = load_config(str(path))
    tuned = dict(chosen.tuned)
    if chosen.strategy in ("ddp", "fsdp"):  # a searched strategy is written at the top level
        tuned["strategy"] = chosen.strategy
    entry: dict[str, Any] = {"tuned": tuned, "env": dict(chosen.env)}
    if header:
        entry |= {"trial": int(header.group(1)), "samples_per_s": float(header.group(2))}
    if verdict:  # the decision and its figures; the advice stays in that size's folder
        entry["verdict"] = verdict.group(1).split(f"; {BEST_YAML} keeps")[0]
    return entry


def write_sizes(path: Path, entries: dict[int, dict[str, Any]], primary: int) -> list[str]:
    """Rewrite the primary's best.yaml (``path``) with ``sizes``: its header kept, a line per
    entry said. The primary's own entry is its top level (``check_sizes`` wants them equal);
    a variable other than NCCL's that a smaller size would change is left out (a worker reads
    it as its process starts: it cannot switch with the size), and said."""
    if primary not in entries or not path.is_file():
        return [f"the {primary}-worker search completed no trial: {path} has no sizes (each "
                f"size's own {BEST_YAML} is in its size-N folder)"]  # fmt: skip
    lines: list[str] = []
    top = entries[primary]
    for size, entry in entries.items():
        for name in [n for n in entry["env"] if not n.startswith("NCCL_")]:
            if top["env"].get(name) != entry["env"][name]:
                lines.append(f"size {size}: {name}={entry['env'].pop(name)} not kept (read as "
                             "a worker starts, it cannot switch with the size)")  # fmt: skip
    text = path.read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    config = load_config(str(path))
    search = dataclasses.replace(config.search, world_sizes=[])  # it trains; it searches no more
    config = dataclasses.replace(config, tuned=dict(top["tuned"]), sizes=entries, search=search)
    note = f"# sizes: one entry per world size searched ({', '.join(map(str, sorted(entries)))})\n"
    write_atomic(path, header + note + dump_config(config))
    return lines + [_entry_line(size, e) for size, e in sorted(entries.items())]


def _entry_line(size: int, entry: dict[str, Any]) -> str:
    figure = f"{entry['samples_per_s']:.1f} samples/s" if "samples_per_s" in entry else "n/a"
    knobs = ", ".join(f"{k}={v}" for k, v in sorted({**entry["tuned"], **entry["env"]}.items()))
    verdict = entry.get("verdict", "no verdict (nothing re-measured)").split(" (")[0]
    return f"size {size}: trial {entry.get('trial', '?')}, {figure}, {{{knobs}}}; {verdict}"


def cost_line(walls: dict[int, float], sizes: list[int]) -> str:
    """What tuning the sizes cost against the primary search alone: in wall-clock, and in
    worker-seconds (each size's wall-clock times its workers: what a cluster that releases
    idle workers bills, since a smaller size's search holds fewer workers while its steps take
    longer; a fixed cluster bills the wall-clock)."""
    first, total = walls[sizes[0]], sum(walls.values())
    held = sum(wall * size for size, wall in walls.items())
    return (f"tuned {len(sizes)} world sizes in {total:.0f}s: {total / first:.2f}x the "
            f"{sizes[0]}-worker search alone ({first:.0f}s); in worker-seconds "
            f"{held / (first * sizes[0]):.2f}x")  # fmt: skip
