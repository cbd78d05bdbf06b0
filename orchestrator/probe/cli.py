"""``python -m orchestrator.probe``: the bandwidth sweep from the command line, as a table.

Exit codes: 0 success, 2 usage error (one line naming the option, before Ray starts), 1 failure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from orchestrator.cluster.session import check_ray_address, resolve_gpu, start_ray
from orchestrator.config.inputs import check_out_dir, parse_env_items
from orchestrator.config.schema import Config, ConfigError, load_config
from orchestrator.planning.costmodel import bus_factor
from orchestrator.probe.sweep import (
    CPU_SIZES,
    GPU_SIZES,
    OPS,
    ProbeError,
    ProbeSettings,
    Row,
    format_size,
    parse_ops,
    parse_sizes,
    probe_config,
    run_probe,
    write_csv,
)
from orchestrator.probe.tuner_conf import choose, measure, write
from orchestrator.runfiles import BEST_YAML, PROBE_CSV, PROBE_DIR, TUNER_CONF

DEFAULT_OUT = Path("runs/probe")
MIN_WORKERS = 2
"""A collective between fewer ranks moves nothing: the probe would report busbw 0."""


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
    p.add_argument("--config", help=f"commtune YAML (e.g. a {BEST_YAML}): its cluster and env")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment variable for the workers, e.g. NCCL_BUFFSIZE=8388608 (repeatable)",
    )
    p.add_argument(
        "--tuner-conf",
        action="store_true",
        help=f"NCCL workers: also sweep each algorithm/protocol and write {TUNER_CONF} "
        "(the fastest per message size, for NCCL's example tuner plugin)",
    )
    p.add_argument("--verbose", action="store_true", help="show Ray and worker logs")
    return p.parse_args(argv)


def prepare(args: argparse.Namespace) -> tuple[Config, ProbeSettings]:
    """Everything that can fail on user input, checked before Ray starts (cheap checks first)."""
    sizes = tuple(parse_sizes(args.sizes)) if args.sizes is not None else None
    settings = ProbeSettings(sizes, parse_ops(args.ops), args.iters, args.warmup)
    env = parse_env_items(args.env, "--env")
    if args.workers is not None and args.workers < MIN_WORKERS:
        raise ConfigError("--workers", _too_few(args.workers))
    check_out_dir(Path(args.out))
    if args.tuner_conf and args.backend == "gloo":
        raise ConfigError("--tuner-conf", "the tuner file is NCCL's; drop --backend gloo")
    base = load_config(args.config) if args.config else Config()
    config = probe_config(base, args.workers, args.address, args.backend, env)
    if config.cluster.num_workers < MIN_WORKERS:  # from the --config (or a default of 1)
        raise ConfigError("cluster.num_workers", _too_few(config.cluster.num_workers))
    check_ray_address(config, "--address" if args.address else "cluster.address")
    return config, settings


def _too_few(workers: int) -> str:
    return (f"got {workers}; a probe times collectives between workers, so it needs 2 or more "
            "(one worker moves nothing: busbw 0); pass --workers 2 or more")  # fmt: skip


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
            storage_path=str((out / PROBE_DIR).resolve()),
            verbose=args.verbose,
            on_row=Table(),
            say=lambda line: print(line, flush=True),
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
    print(f"\nwrote {write_csv(rows, out / PROBE_CSV)}")
    if args.tuner_conf:
        return tuner_conf(config, settings, out)
    return 0


def tuner_conf(config: Config, settings: ProbeSettings, out: Path) -> int:
    """Sweep every algorithm/protocol on NCCL workers and write nccl_tuner.conf."""
    import ray

    start_ray(config, verbose=False)
    try:
        if not resolve_gpu(config):
            print("commtune: error: --tuner-conf: the workers are not on GPUs (NCCL); the tuner "
                  "file is NCCL's", file=sys.stderr)  # fmt: skip
            return 2
        storage = str((out / PROBE_DIR).resolve())
        sweeps = measure(config, settings, storage, say=lambda line: print(line, flush=True))
    except ProbeError as e:
        print(f"commtune: probe failed: {e}", file=sys.stderr)
        return 1
    finally:
        ray.shutdown()
    rules = choose(sweeps)
    path = write(rules, out / TUNER_CONF, -1, config.cluster.num_workers)
    for rule in rules:
        print(f"  {rule.op} {rule.min_bytes}..{rule.max_bytes}: {rule.algorithm}/{rule.protocol}")
    print(f"wrote {path}: load it with NCCL's example tuner plugin (NVIDIA/nccl ext-tuner/"
          f"example): NCCL_TUNER_PLUGIN=<its .so> NCCL_TUNER_CONFIG_FILE={path.resolve()}")
    return 0


