"""``python -m orchestrator.probe``: measure what the interconnect gives, as nccl-tests reports it.

Runs an all-reduce, all-gather and reduce-scatter sweep over power-of-two message sizes on the
workers a trial would get (same Ray cluster, backend and tuned environment variables) and writes
``probe.csv``: per op and size the median time, algbw = size / time and busbw = algbw x
``costmodel.bus_factor`` (GB = 1e9 bytes). busbw of a large all-reduce is the ``Link`` bandwidth
the cost model wants.

Exit codes: 0 success, 2 usage error (one line naming the option, before Ray starts), 1 failure.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import queue as std_queue
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config import Config, ConfigError, WorkloadConfig, load_config
from orchestrator.costmodel import OPS, bus_factor
from orchestrator.inputs import check_out_dir

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
DEFAULT_OUT = Path("runs/probe")
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


def parse_env(items: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` items -> a dict (names and values are checked with the config)."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(
                "--env", f"{item!r} is not NAME=VALUE; e.g. --env NCCL_BUFFSIZE=8388608"
            )
        env[name.strip()] = value
    return env


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
    from search_spaces import SpaceError, check_env

    merged = {**base.env, **env}
    try:
        check_env(merged)
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
    return Config(name="probe", cluster=cluster, env=merged, workload=workload)


def run_probe(
    config: Config,
    settings: ProbeSettings | None = None,
    *,
    storage_path: str | None = None,
    verbose: bool = False,
    on_row: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Run the sweep on ``config.cluster`` with ``config.env``; return rank 0's rows.

    Joins the running Ray if there is one (a search calls this once after starting Ray) and
    otherwise starts one as the search does and shuts it down after. ``on_row`` sees each row
    as it is measured. Raises ConfigError when the cluster cannot hold the workers.
    """
    import ray

    from orchestrator.driver import check_capacity, resolve_gpu, start_ray
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
        print(
            f"probe: {n} {'GPU' if use_gpu else 'CPU'} workers, {len(sizes)} sizes from "
            f"{format_size(sizes[0])} to {format_size(sizes[-1])}, {', '.join(settings.ops)}; "
            f"env: {' '.join(f'{k}={v}' for k, v in config.env.items()) or 'none'}",
            flush=True,
        )
        cells = [(op, size) for op in settings.ops for size in sizes]
        skipped = [(op, size) for op, size in cells if not fits(op, size, n)]
        for op, size in skipped:
            print(f"probe: {op} at {format_size(size)} skipped: not a whole float32 per rank")
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
    """One TorchTrainer run of the sweep; rows stream back through a Ray queue as measured.

    ``fit()`` blocks, so it runs in a daemon thread while this one prints rows.
    """
    from ray.util.queue import Empty, Queue

    from orchestrator.callbacks import driver_queue

    rows_queue: Queue = driver_queue()
    trainer = _trainer(config, settings, use_gpu, storage_path, rows_queue)
    errors: list[BaseException] = []
    done = threading.Event()

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as e:  # re-raised below, in the caller's thread
            errors.append(e)
        finally:
            done.set()

    threading.Thread(target=fit, daemon=True).start()
    rows: list[Row] = []
    try:
        while not done.is_set() or not rows_queue.empty():
            with contextlib.suppress(Empty, std_queue.Empty):
                rows.append(rows_queue.get(timeout=0.5))
                on_row(rows[-1])
    finally:
        rows_queue.shutdown()
    if errors:
        raise ProbeError(f"the probe's workers failed: {errors[0]}") from errors[0]
    return rows


def _trainer(
    config: Config, settings: ProbeSettings, use_gpu: bool, storage_path: str | None, rows: Any
) -> Any:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from train_fns.collectives import probe_loop_per_worker

    cluster = config.cluster
    loop_config = dataclasses.asdict(settings) | {"rows": rows}
    return TorchTrainer(
        probe_loop_per_worker,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo", timeout_s=PROBE_TIMEOUT_S),
        scaling_config=ScalingConfig(
            num_workers=cluster.num_workers,
            use_gpu=use_gpu,
            resources_per_worker={"CPU": cluster.cpus_per_worker} | ({"GPU": 1} if use_gpu else {}),
        ),
        run_config=RunConfig(
            name="probe",
            storage_path=storage_path,
            # Variables such as NCCL_* are read once when the process group starts: only fresh
            # worker processes, started with this environment, see them.
            worker_runtime_env={"env_vars": config.env},
            failure_config=FailureConfig(max_failures=0),
        ),
    )


def format_size(size_bytes: int) -> str:
    """67108864 -> ``64M``: the largest of G, M, K that divides the size exactly."""
    for suffix in ("G", "M", "K"):
        if size_bytes >= _UNITS[suffix] and size_bytes % _UNITS[suffix] == 0:
            return f"{size_bytes // _UNITS[suffix]}{suffix}"
    return str(size_bytes)


class Table:
    """Prints rows as they arrive: a header per op, then one line per size."""

    def __init__(self, out: Any = None) -> None:
        self.out = out
        self.op: str | None = None

    def __call__(self, row: Row) -> None:
        if row["op"] != self.op:
            self.op = row["op"]
            factor = bus_factor(row["op"], row["world_size"])
            self._print(
                f"\n{row['op']} on {row['world_size']} ranks ({row['backend']}), "
                f"busbw = algbw x {factor:g}\n"
                f"{'size':>6} {'time_us':>12} {'algbw_GB/s':>11} {'busbw_GB/s':>11} {'iters':>6}"
            )
        self._print(
            f"{format_size(row['size_bytes']):>6} {row['time_s'] * 1e6:12.1f} "
            f"{row['algbw_gbps']:11.3f} {row['busbw_gbps']:11.3f} {row['iters']:6d}"
        )

    def _print(self, text: str) -> None:
        print(text, file=self.out or sys.stdout, flush=True)


def write_csv(rows: list[Row], path: Path) -> Path:
    """Write ``probe.csv`` (COLUMNS, full float precision); beside, then renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)
    return path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m orchestrator.probe", description=__doc__)
    p.add_argument("--workers", type=int, help="workers (default 2, or the --config's)")
    p.add_argument(
        "--sizes",
        help=f"LOW:HIGH in bytes, K/M/G = 2**10/20/30 (default {CPU_SIZES} on CPU, "
        f"{GPU_SIZES} on GPU)",
    )
    p.add_argument("--ops", default="all", help=f"'all' or a comma list of {', '.join(OPS)}")
    p.add_argument("--iters", type=int, default=ProbeSettings.iters, help="timed iterations")
    p.add_argument("--warmup", type=int, default=ProbeSettings.warmup, help="warm-up iterations")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--address", help="join a running Ray cluster ('auto' or HOST:PORT)")
    p.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl on GPUs, else gloo")
    p.add_argument("--config", help="commtune YAML (e.g. a best.yaml): its cluster and env")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment variable for the workers, e.g. NCCL_BUFFSIZE=8388608 (repeatable)",
    )
    p.add_argument("--verbose", action="store_true", help="show Ray and worker logs")
    return p.parse_args(argv)


def prepare(args: argparse.Namespace) -> tuple[Config, ProbeSettings]:
    """Everything that can fail on user input, checked before Ray starts (cheap checks first)."""
    sizes = tuple(parse_sizes(args.sizes)) if args.sizes is not None else None
    settings = ProbeSettings(sizes, parse_ops(args.ops), args.iters, args.warmup)
    env = parse_env(args.env)
    if args.workers is not None and args.workers < 1:
        raise ConfigError("--workers", f"got {args.workers}; it must be at least 1")
    check_out_dir(Path(args.out))
    base = load_config(args.config) if args.config else Config()
    return probe_config(base, args.workers, args.address, args.backend, env), settings


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config, settings = prepare(args)
    except ConfigError as e:
        print(f"commtune: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        rows = run_probe(
            config,
            settings,
            storage_path=str((out / "trainer").resolve()),
            verbose=args.verbose,
            on_row=Table(),
        )
    except ConfigError as e:  # found only once the cluster is known (too few CPUs or GPUs)
        print(f"commtune: error: {e}", file=sys.stderr)
        return 2
    except ProbeError as e:
        print(f"commtune: probe failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("commtune: probe interrupted; nothing written", file=sys.stderr)
        return 1
    print(f"\nwrote {write_csv(rows, out / 'probe.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
