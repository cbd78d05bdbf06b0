"""best.yaml's configuration per world size (``sizes``): checked when a config is read, handed
to every worker of a training run, and fitted to every size of its elastic range before a
worker starts (``train_fns.size_fit`` fits them; each start fits again to the layout it got).

A search over a range of world sizes writes one entry per size it tuned::

    sizes:
      1: {tuned: {...}, env: {...}, samples_per_s: 812.0, verdict: "no gain worth having ..."}
      2: {tuned: {...}, env: {...}, samples_per_s: 1490.0, verdict: "keep: trial 5 is ..."}

The top-level ``tuned`` and ``env`` stay what runs at ``cluster.num_workers`` (a reader that
knows nothing of sizes, ``best.env``, a fixed-size run), and a hand-written entry is checked
like them: known knobs of their kind, safe variables, a world size that carries the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from orchestrator.config.inputs import ConfigError, check_range, check_split, check_tuned
from train_fns.size_fit import Fitted, Layout, entries_of, fit

ENTRY_KEYS = ("tuned", "env", "samples_per_s", "verdict", "trial")
MAX_SIZE = 16_384
"""The largest world size, as ``cluster.num_workers`` allows."""


def check_sizes(config: Any) -> dict[int, dict[str, Any]]:
    """``config.sizes`` with integer keys and checked entries; a ConfigError names the first
    key at fault (``sizes.3.tuned.bucket_cap_mb``) and how to fix it. A size given twice (``2``
    in a file, ``--set sizes.2.samples_per_s=...`` as text) is one entry, the later's keys over
    the earlier's."""
    out: dict[int, dict[str, Any]] = {}
    for key, entry in config.sizes.items():
        size = _size(key, config.workload.global_batch)
        if not isinstance(entry, dict):
            raise ConfigError(f"sizes.{size}", f"expected a mapping of {', '.join(ENTRY_KEYS)}")
        out[size] = _entry(config, size, _over(out.get(size), entry))
    top = out.get(config.cluster.num_workers)
    if top is not None and (top["tuned"] != config.tuned or top["env"] != config.env):
        raise ConfigError(f"sizes.{config.cluster.num_workers}", "this size is cluster.num_workers"
                          ", whose entry is the top-level tuned and env; make them the same, or "
                          "remove it")  # fmt: skip
    return out


def check_world_sizes(config: Any) -> None:
    """``search.world_sizes``: distinct sizes that carry the global batch, the largest being
    ``cluster.num_workers`` (its search is the primary one, in the run folder itself)."""
    sizes, batch = config.search.world_sizes, config.workload.global_batch
    for i, size in enumerate(sizes):  # each within BOUNDS already
        if batch % size:
            raise ConfigError(f"search.world_sizes[{i}]", f"{size} workers cannot carry "
                              f"workload.global_batch={batch}; leave it out")  # fmt: skip
    if len(set(sizes)) != len(sizes):
        raise ConfigError("search.world_sizes", f"{sizes} names a size twice")
    top = max(sizes, default=config.cluster.num_workers)
    if top != config.cluster.num_workers:
        raise ConfigError("cluster.num_workers", f"{config.cluster.num_workers}, but the largest "
                          f"of search.world_sizes is {top}; set it to {top}")  # fmt: skip


def sizes_to_tune(low: int, high: int, global_batch: int) -> list[int]:
    """The sizes of ``low:high`` worth a search, largest first: the two ends (where a run
    starts and where it shrinks to) and the powers of two between (the usual node multiples),
    each one that carries the global batch exactly."""
    between = [2**k for k in range(high.bit_length()) if low < 2**k < high]
    return sorted({s for s in (low, high, *between) if global_batch % s == 0}, reverse=True)


def workers_range(text: str) -> tuple[int, int]:
    """``--workers MIN:MAX`` as two integers, 1 <= MIN <= MAX <= ``MAX_SIZE``; a single N is
    N:N (exactly N workers: what a user means by ``--workers 2``)."""
    low, sep, high = text.strip().partition(":")
    high = high if sep else low
    digits = all(part.isascii() and part.isdigit() for part in (low, high))
    if not digits or not 1 <= int(low) <= int(high) <= MAX_SIZE:
        raise ConfigError("--workers", f"{text!r} is not N or MIN:MAX with 1 <= MIN <= MAX <= "
                          f"{MAX_SIZE}, e.g. 2 or 1:4")  # fmt: skip
    return int(low), int(high)


def check_batch_fits(low: int, high: int, batch: int, anywhere: bool = False) -> None:
    """``--workers low:high`` must carry ``batch`` exactly at MAX (a search starts there), or,
    ``anywhere``, at some size of the range (a training run waits out the sizes that cannot:
    ``train.on_no_split``; with none it would wait forever); a ConfigError names the sizes
    nearest that do."""
    if batch % high == 0 or anywhere and any(batch % n == 0 for n in range(low, high + 1)):
        return
    below = next((n for n in range(min(high, batch), 0, -1) if batch % n == 0), None)
    above = next((n for n in range(high + 1, min(batch, MAX_SIZE) + 1) if batch % n == 0), None)

    def moved(n: int) -> str:  # what was asked, moved just enough to take size n
        lo, hi = (n, n) if low == high else (min(low, n), max(high, n) if anywhere else n)
        return f"--workers {lo}" if lo == hi else f"--workers {lo}:{hi}"

    near = " or ".join(moved(n) for n in (below, above) if n is not None)
    what = f"no size of {low}:{high} can" if anywhere and low < high else f"{high} workers cannot"
    raise ConfigError("--workers", f"{what} carry workload.global_batch={batch} "
                      f"exactly; use {near}")  # fmt: skip


def _over(earlier: dict[str, Any] | None, later: dict[str, Any]) -> dict[str, Any]:
    """``later``'s keys over ``earlier``'s, its tuned and env values over theirs."""
    if earlier is None:
        return later
    merged = {**earlier, **later}
    for part in ("tuned", "env"):
        if isinstance(later.get(part), dict):
            merged[part] = {**earlier[part], **later[part]}
    return merged


def _entry(config: Any, size: int, entry: dict[str, Any]) -> dict[str, Any]:
    """One checked entry: known keys, knobs of their kind that fit the size, variables as NCCL
    reads them (only ``NCCL_`` ones may differ from the top level's)."""
    from search_spaces import SpaceError, env_strings

    where = f"sizes.{size}"
    unknown = sorted(str(k) for k in entry if k not in ENTRY_KEYS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", f"unknown key; known: {', '.join(ENTRY_KEYS)}")
    tuned, env = _mapping(entry, "tuned", where), _mapping(entry, "env", where)
    at_size = dataclasses.replace(config.cluster, num_workers=size)
    try:
        check_tuned(tuned, _Sized(at_size, config.workload, config.search))
        check_split(tuned, config.workload.global_batch // size, "tuned")
        env = env_strings(env, config.search.unsafe_nccl)
    except ConfigError as e:
        raise ConfigError(f"{where}.{e.key}", str(e).split(": ", 1)[1]) from e
    except SpaceError as e:
        raise ConfigError(f"{where}.env.{e.key}" if e.key else f"{where}.env", e.message) from e
    for name, value in env.items():
        if not name.startswith("NCCL_") and config.env.get(name) != value:
            raise ConfigError(f"{where}.env.{name}", "only NCCL_ variables switch with the size "
                              f"(a worker reads {name} as its process starts); set it in the "
                              "top-level env")  # fmt: skip
    _check_figures(entry, where)
    return {**entry, "tuned": tuned, "env": env}


def _mapping(entry: dict[str, Any], part: str, where: str) -> dict[str, Any]:
    value = entry.get(part)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}.{part}", f"expected a mapping, got {value!r}")
    return dict(value)


def _check_figures(entry: dict[str, Any], where: str) -> None:
    """What the search recorded of an entry: a throughput, a verdict line, a trial number."""
    if entry.get("samples_per_s") is not None:
        check_range(f"{where}.samples_per_s", entry["samples_per_s"], 0.0, 1e12)
    if entry.get("trial") is not None:
        check_range(f"{where}.trial", entry["trial"], 0, 10**9)
    if entry.get("verdict") is not None and not isinstance(entry["verdict"], str):
        raise ConfigError(f"{where}.verdict", f"expected a line of text, got {entry['verdict']!r}")


@dataclasses.dataclass(frozen=True)
class _Sized:
    """What ``check_tuned`` reads of a config, at an entry's world size."""

    cluster: Any
    workload: Any
    search: Any


def _size(key: Any, global_batch: int) -> int:
    """A world size key (YAML may give ``"2"`` as text): positive, and carrying the batch."""
    text = key.strip() if isinstance(key, str) else ""
    size = int(text) if text.isascii() and text.isdigit() else key
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SIZE:
        raise ConfigError(f"sizes.{key}", f"a key is a world size: a whole number from 1 to "
                          f"{MAX_SIZE}")  # fmt: skip
    if global_batch % size:
        raise ConfigError(f"sizes.{size}", f"workload.global_batch={global_batch} cannot be split "
                          f"over {size} workers; remove the entry or change the batch")  # fmt: skip
    return size


def run_entries(config: Any) -> dict[int, dict[str, Any]]:
    """Every entry a run may pick from (``train_fns.size_fit.entries_of``) for ``config``."""
    return entries_of(config.cluster.num_workers, config.tuned, config.env, config.sizes)


def fit_context(config: Any, use_gpu: bool) -> dict[str, Any]:
    """What the run fixes that fitting reads (``train_fns.size_fit.fit``)."""
    return {
        "global_batch": config.workload.global_batch,
        "strategy": config.strategy if config.strategy != "search" else "ddp",
        "use_gpu": use_gpu,
        "nvswitch": config.cluster.nvswitch,
        "unsafe_nccl": config.search.unsafe_nccl,
        "precision": config.workload.precision,
        "lossy": config.search.lossy,
        "unused_parameters": bool(config.workload.unused_parameters),
    }


def fit_range(
    config: Any, use_gpu: bool, sizes: range, layout_of: Callable[[int], Layout]
) -> dict[int, Fitted]:
    """Each size's fitted entry under the layout it is expected to get. A tuned value that no
    size of the range can run is a ConfigError naming it (the run would never use it: the
    range or the value is a mistake); one some sizes cannot run is dropped there, and said."""
    entries, context = run_entries(config), fit_context(config, use_gpu)
    fitted = {world: fit(entries, layout_of(world), context) for world in sizes}
    runnable = [f for f in fitted.values() if f.split is not None]
    for size in sorted({f.size for f in runnable}):  # the entries the range runs
        using = [f for f in runnable if f.size == size]
        for key, value, why in using[0].dropped:
            if all(key in {k for k, _, _ in f.dropped} for f in using):
                where = "" if size == config.cluster.num_workers else f"sizes.{size}."
                section = "env" if key in entries[size]["env"] else "tuned"
                raise ConfigError(
                    f"{where}{section}.{key}",
                    f"{value} runs at no size of the range {sizes.start}:{sizes.stop - 1} that "
                    f"runs this entry ({why}); remove it, or train over sizes that can run it",
                )
    return fitted
