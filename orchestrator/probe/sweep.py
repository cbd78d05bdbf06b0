"""The bandwidth probe: measure what the interconnect gives, as nccl-tests reports it.

Runs an all-reduce, all-gather and reduce-scatter sweep over power-of-two message sizes on the
workers a trial would get (same Ray cluster, backend and tuned environment variables) and writes
``probe.csv``: per op and size the median time, algbw = size / time and busbw = algbw x
``costmodel.bus_factor`` (GB = 1e9 bytes). busbw of a large all-reduce is the ``Link`` bandwidth
the cost model wants.

Exit codes: 0 success, 2 usage error (one line naming the option, before Ray starts), 1 failure.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.cluster.placement import layout_for
from orchestrator.cluster.session import check_capacity, driver_queue, resolve_gpu, start_ray
from orchestrator.cluster.workers import Fit, GroupSpec, Heartbeat, torch_trainer
from orchestrator.config.schema import Config, ConfigError, WorkloadConfig
from orchestrator.planning.costmodel import bus_factor
from orchestrator.runfiles import write_atomic
from train_fns.metrics import OPS

COLUMNS = (
    "op",
    "size_bytes",
    "world_size",
    "backend",
    "time_s",
    "algbw_gbps",
    "busbw_gbps",
    "iters",
)
CPU_SIZES = "1K:64M"
GPU_SIZES = "1K:1G"
"""Default sweeps: 1G buffers would take seconds each over gloo and fill a small machine."""
PROBE_TIMEOUT_S = 300
"""Process-group timeout: the largest default message takes well under a second on GPUs."""
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
_SIZE = re.compile(r"(\d+)([KMG]?)", re.IGNORECASE)

Row = dict[str, Any]


class ProbeError(RuntimeError):
    """The probe's workers failed, or came back without every row."""


def parse_size(text: str) -> int:
    """``64M`` -> 67108864 bytes (K, M, G are powers of 1024, as message sizes are)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ConfigError("--sizes", f"{text!r} is not a size such as 4096, 1K, 64M or 1G")
    return int(match[1]) * _UNITS[match[2].upper()]


def parse_sizes(text: str) -> list[int]:
    """``LOW:HIGH`` (or one SIZE) -> the powers of two from LOW to HIGH, both included."""
    low_text, sep, high_text = text.partition(":")
    if sep and not (low_text.strip() and high_text.strip()):
        raise ConfigError("--sizes", f"{text!r} is not LOW:HIGH; e.g. --sizes 1K:64M")
    low, high = parse_size(low_text), parse_size(high_text if sep else low_text)
    if low > high:
        raise ConfigError("--sizes", f"{text!r}: LOW is above HIGH; e.g. --sizes 1K:64M")
    if low < 4:
        raise ConfigError("--sizes", f"{text!r}: sizes start at 4 bytes (one float32)")
    sizes = [2**k for k in range((low - 1).bit_length(), high.bit_length()) if 2**k <= high]
    if not sizes:
        raise ConfigError("--sizes", f"{text!r} holds no power of two; e.g. --sizes 1K:64M")
    return sizes


def parse_ops(text: str) -> tuple[str, ...]:
    """``all`` or a comma list of collectives, in the order given, without repeats."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if names == ["all"]:
        return OPS
    unknown = [n for n in names if n not in OPS]
    if unknown or not names:
        raise ConfigError("--ops", f"{text!r}: use 'all' or a comma list of {', '.join(OPS)}")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class ProbeSettings:
    """What to measure; where and with which environment comes from a ``Config``."""

    sizes: tuple[int, ...] | None = None
    """Message sizes in bytes; None: CPU_SIZES on CPU workers, GPU_SIZES on GPUs."""
    ops: tuple[str, ...] = OPS
    iters: int = 20
    """Timed iterations per op and size (fewer for large sizes: ~0.5 s of timing each)."""
    warmup: int = 5

    def __post_init__(self) -> None:
        for key, value in (("--iters", self.iters), ("--warmup", self.warmup)):
            if value < 1:
                raise ConfigError(key, f"got {value}; it must be at least 1")
        if set(self.ops) - set(OPS) or not self.ops:
            raise ConfigError("--ops", f"{self.ops}: use a non-empty subset of {', '.join(OPS)}")


def probe_config(
    base: Config,
    num_workers: int | None,
    address: str | None,
    backend: str | None,
    env: dict[str, str],
) -> Config:
    """A config for the probe: ``base``'s cluster and environment with the CLI's overrides.

    The probe trains nothing; its placeholder workload's batch splits over any world size.
    """
    from search_spaces import SpaceError, env_strings

    try:
        merged = env_strings({**base.env, **env}, base.search.unsafe_nccl)
    except SpaceError as e:
        raise ConfigError(f"--env {e.key}", e.message) from e
    use_gpu = {None: base.cluster.use_gpu, "gloo": False, "nccl": True}[backend]
    cluster = dataclasses.replace(
        base.cluster,
        num_workers=num_workers or base.cluster.num_workers,
        address=address or base.cluster.address,
        use_gpu=use_gpu,
    )
    workload = WorkloadConfig(global_batch=cluster.num_workers)
    return Config(name="probe", cluster=cluster, env=merged, workload=workload, search=base.search)


def run_probe(
    config: Config,
    settings: ProbeSettings | None = None,
    *,
    storage_path: str | None = None,
    verbose: bool = False,
    on_row: Callable[[Row], None] | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> list[Row]:
    """Run the sweep on ``config.cluster`` with ``config.env``; return rank 0's rows.

    Joins the running Ray if there is one (a search calls this once after starting Ray) and
    otherwise starts one as the search does and shuts it down after. ``on_row`` sees each row
    as it is measured; ``say`` gets what the sweep decided (sizes, skipped cells). Raises
    ConfigError when the cluster cannot hold the workers.
    """
    import ray

    from train_fns.collectives import fits

    settings = settings or ProbeSettings()
    owned = not ray.is_initialized()
    if owned:
        start_ray(config, verbose)
    try:
        use_gpu = resolve_gpu(config)
        check_capacity(config, use_gpu)
        sizes = settings.sizes or tuple(parse_sizes(GPU_SIZES if use_gpu else CPU_SIZES))
        n = config.cluster.num_workers
        say(
            f"probe: {n} {'GPU' if use_gpu else 'CPU'} workers, {len(sizes)} sizes from "
            f"{format_size(sizes[0])} to {format_size(sizes[-1])}, {', '.join(settings.ops)}; "
            f"env: {' '.join(f'{k}={v}' for k, v in config.env.items()) or 'none'}"
        )
        cells = [(op, size) for op in settings.ops for size in sizes]
        skipped = [(op, size) for op, size in cells if not fits(op, size, n)]
        for op, size in skipped:
            say(f"probe: {op} at {format_size(size)} skipped: not a whole float32 per rank")
        settings = dataclasses.replace(settings, sizes=sizes)
        rows = _fit(config, settings, use_gpu, storage_path, on_row or (lambda row: None))
    finally:
        if owned:
            ray.shutdown()
    if len(rows) != len(cells) - len(skipped):
        raise ProbeError(f"{len(rows)} of {len(cells) - len(skipped)} rows came back")
    return rows


def _fit(
    config: Config,
    settings: ProbeSettings,
    use_gpu: bool,
    storage_path: str | None,
    on_row: Callable[[Row], None],
) -> list[Row]:
    """One worker-group run of the sweep; rows stream back through a queue as measured, and
    get their bus bandwidth here (nccl-tests' factor, from the cost model)."""
    import ray

    from train_fns.worker import probe_loop_per_worker

    cluster = config.cluster
    layout = layout_for(ray.nodes(), None, cluster.num_workers, cluster.cpus_per_worker,
                        use_gpu, cluster.placement)  # fmt: skip
    rows_queue, rows = driver_queue(), []
    beat, last = Heartbeat(config.search.heartbeat_s), [time.monotonic()]

    def take(row: Row) -> None:
        rows.append(with_busbw(row))
        on_row(rows[-1])
        last[0] = time.monotonic()
        beat.quiet()

    def waiting() -> str:
        silent_s = time.monotonic() - last[0]
        return f"probe: {len(rows)} rows measured, nothing new for {silent_s:.0f} s"

    fit = Fit(torch_trainer(GroupSpec(
        loop=probe_loop_per_worker,
        loop_config=dataclasses.asdict(settings) | {"rows": rows_queue},
        name="probe",
        storage_path=storage_path,
        num_workers=config.cluster.num_workers,
        use_gpu=use_gpu,
        cpus_per_worker=config.cluster.cpus_per_worker,
        env=config.env,
        timeout_s=PROBE_TIMEOUT_S,
        scaling=layout.scaling(),
    )))  # fmt: skip
    try:
        fit.drain(rows_queue, take, stop=lambda: beat.beat(waiting))
    finally:
        rows_queue.shutdown()
    if fit.error is not None:
        raise ProbeError(f"the probe's workers failed: {fit.error}") from fit.error
    return rows


def with_busbw(row: Row) -> Row:
    """A worker's row with its bus bandwidth: algbw x nccl-tests' factor for the op and ranks."""
    return row | {"busbw_gbps": row["algbw_gbps"] * bus_factor(row["op"], row["world_size"])}


def format_size(size_bytes: int) -> str:
    """67108864 -> ``64M``: the largest of G, M, K that divides the size exactly."""
    for suffix in ("G", "M", "K"):
        if size_bytes >= _UNITS[suffix] and size_bytes % _UNITS[suffix] == 0:
            return f"{size_bytes // _UNITS[suffix]}{suffix}"
    return str(size_bytes)


def write_csv(rows: list[Row], path: Path) -> Path:
    """Write ``probe.csv`` (COLUMNS, full float precision), atomically."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, text.getvalue())
    return path
