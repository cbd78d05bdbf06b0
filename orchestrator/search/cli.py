"""``python -m orchestrator.search``: tune a real DDP/FSDP run and write the best config.

Exit codes: 0 success, 2 usage or configuration error (one line naming the key,
before any Ray process starts), 1 runtime failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from orchestrator.cluster.session import check_ray_address
from orchestrator.config.inputs import check_out_dir
from orchestrator.config.schema import Config, ConfigError, load_config, merged
from orchestrator.config.size_entries import check_batch_fits, sizes_to_tune, workers_range
from orchestrator.planning.from_config import absolute_paths, check_model
from orchestrator.runfiles import STUDY_DB, STUDY_JOURNAL, TRIALS_CSV
from orchestrator.search import ctrl_c
from orchestrator.search.context import space_for
from orchestrator.search.ranged import check_sizes_can_run
from train_fns.plan import FAULT_KINDS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m orchestrator.search", description=__doc__, allow_abbrev=False
    )
    p.add_argument("--config", help="YAML config file (merged over the preset)")
    p.add_argument("--preset", help="smoke, cpu-demo or bert-large (default: by hardware)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one key, e.g. --set search.trials=8 (repeatable)",
    )
    p.add_argument("--trials", type=int, help="total trials, baseline included")
    p.add_argument("--workers", metavar="MIN:MAX", help="tune each world size an elastic run "
                   "may have (the ends, the powers of two between): an entry per size; a "
                   "single N searches N workers")  # fmt: skip
    p.add_argument("--out", help="output folder (default: runs/<name>)")
    p.add_argument(
        "--storage",
        help="Optuna storage: a database URL (postgresql://...) or a .journal path (default: "
        f"SQLite {STUDY_DB} in --out; {STUDY_JOURNAL} there when --out is on a network disk)",
    )
    p.add_argument("--resume", action="store_true", help="continue the study in --out")
    p.add_argument(
        "--time-budget",
        type=float,
        metavar="MINUTES",
        help="start no trial after this many minutes (whichever of this and "
        "--trials comes first); outputs are still written",
    )
    p.add_argument("--address", help="join a running Ray cluster ('auto' or HOST:PORT)")
    p.add_argument(
        "--inject-faults",
        default="",
        metavar="N:KIND,...",
        help="testing aid: make trial N crash, hang, oom or corrupt (wrong gradients): 2:corrupt",
    )
    p.add_argument("--verbose", action="store_true", help="show Ray and worker logs")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="rank candidate configs with the cost model; no cluster, nothing measured",
    )
    p.add_argument("--link", help="dry run: pcie_v100, nvlink_a100, ... (default: the search's "
                   "nominal link, nvlink_a100 on one node, net_100g across nodes)")  # fmt: skip
    p.add_argument("--nodes", type=int, help="dry run: nodes the ranks span (default 1)")
    p.add_argument("--tflops", type=float, help="dry run: TFLOP/s per rank (default: the "
                   "search's nominal 100)")  # fmt: skip
    return p.parse_args(argv)


def parse_faults(text: str) -> dict[int, str]:
    faults: dict[int, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        number, _, kind = item.partition(":")
        if not number.isdigit() or kind not in FAULT_KINDS:
            raise ConfigError(
                "--inject-faults",
                f"{item!r} is not TRIAL:KIND with KIND one of {', '.join(FAULT_KINDS)}; "
                "e.g. --inject-faults 2:crash,3:hang",
            )
        faults[int(number)] = kind
    return faults


def check(argv: list[str]) -> Config:
    """The config a search with these arguments would run, validated without touching the
    output folder: the command's face, which ``orchestrator.submit`` calls before it sends a
    job (a mistake stops on this machine, not minutes later on the cluster)."""
    return configure(parse_args(argv))[0]


def configure(args: argparse.Namespace) -> tuple[Config, dict[int, str]]:
    """The config and faults the arguments describe, validated without touching the output
    folder."""
    config, faults = _settings(args)
    return _with_model(config), faults


def _settings(args: argparse.Namespace) -> tuple[Config, dict[int, str]]:
    """Every check short of building the model (which imports transformers: seconds)."""
    sets = list(args.set)
    for key, value in (
        ("search.trials", args.trials),
        ("search.storage", args.storage),
        ("cluster.address", args.address),
        ("search.time_budget_min", args.time_budget),
    ):
        if value is not None:  # a string option stays a string (YAML made a dict of "x:")
            sets.append(f"{key}={json.dumps(value) if isinstance(value, str) else value}")
    if args.workers:
        sets += _range_sets(args, sets)
    config = load_config(args.config, args.preset, sets)
    check_sizes_can_run(config)
    space_for(config, use_gpu=False, num_nodes=1)  # a mistake in the spaces stops before Ray
    _check_dry_run_options(args, config)
    faults = parse_faults(args.inject_faults)
    return absolute_paths(config), faults


def _range_sets(args: argparse.Namespace, sets: list[str]) -> list[str]:
    """``--workers MIN:MAX`` as the keys it sets: the sizes worth a search, which depend on the
    global batch the config gives (read at one worker, which carries any batch). A single size
    (``--workers N``) is the usual search at N workers."""
    low, high = workers_range(args.workers)
    if args.dry_run and low < high:
        raise ConfigError("--workers", "a dry run prices one size; give one, e.g. --workers "
                          f"{high}")  # fmt: skip
    if any(item.split("=")[0].strip() == "search.world_sizes" for item in sets):
        raise ConfigError("--workers", "search.world_sizes is set too; give one of the two")
    batch = (merged(args.config, args.preset, sets).get("workload") or {}).get("global_batch")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        return [f"cluster.num_workers={high}"]  # the config's own check names the batch
    check_batch_fits(low, high, batch)
    if low == high:
        return [f"cluster.num_workers={high}"]
    sizes = sizes_to_tune(low, high, batch)
    if low not in sizes:
        print(f"--workers: {low} workers cannot carry workload.global_batch={batch} exactly; "
              "not searched")  # fmt: skip
    return [f"cluster.num_workers={high}", f"search.world_sizes={json.dumps(sizes)}"]


def _with_model(config: Config) -> Config:
    """The config with the model checked (built once on the driver; what it found said)."""
    config, notes = check_model(config)
    for note in notes:
        print(note)
    return config


def _check_dry_run_options(args: argparse.Namespace, config: Config) -> None:
    """--link, --nodes and --tflops price a dry run: checked before the model is built (the
    cheap checks first), and refused without --dry-run rather than silently ignored."""
    given = [f for f, v in (("--link", args.link), ("--nodes", args.nodes),
                            ("--tflops", args.tflops)) if v is not None]  # fmt: skip
    if not args.dry_run:
        if given:
            raise ConfigError(given[0], "prices a dry run only; add --dry-run, or leave it out")
        return
    from orchestrator.search.estimate import check_dry_run

    check_dry_run(config, args.link, 1 if args.nodes is None else args.nodes, args.tflops)


def output_dir(args: argparse.Namespace, config: Config) -> Path:
    """``--out`` with ``~`` and ``$VARS`` expanded (a submitted job's folder names the
    cluster's home), else ``runs/<name>``."""
    if args.out:
        return Path(os.path.expandvars(os.path.expanduser(args.out)))
    return Path("runs") / config.name


def prepare(args: argparse.Namespace) -> tuple[Config, Path, dict[int, str]]:
    """Everything that can fail on user input, checked before Ray starts: the cheap checks
    (the folder, the address) before the model is built."""
    config, faults = _settings(args)
    out = output_dir(args, config)
    if args.dry_run:  # writes nothing: any --out, even one holding a study, is fine
        return _with_model(config), out, faults
    check_out_dir(out)
    if args.resume and not config.search.world_sizes and any(out.glob(f"size-*/{TRIALS_CSV}")):
        raise ConfigError("--resume", f"{out} holds a search over several world sizes; resume "
                          "it with the same --workers MIN:MAX")  # fmt: skip
    check_ray_address(config, "--address" if args.address else "cluster.address")
    if not args.resume and any((out / f).exists() for f in (STUDY_DB, STUDY_JOURNAL, TRIALS_CSV)):
        raise ConfigError(
            "--out",
            f"{out} already holds a study; pass --resume to continue it or choose another --out",
        )
    return _with_model(config), out, faults


def check_storage(config: Config, out: Path) -> str | None:
    """Check the study's storage (connect to a database URL); what to say about the choice."""
    from orchestrator.config import study_storage as storage

    choice = storage.choose(config.search.storage, out)
    storage.check(choice)
    return choice.note


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config, out, faults = prepare(args)
    except ConfigError as e:
        print(f"commtune: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        from orchestrator.search.estimate import dry_run

        try:
            nodes = 1 if args.nodes is None else args.nodes
            print("\n".join(dry_run(config, args.link, nodes, args.tflops)))
        except ConfigError as e:
            print(f"commtune: error: {e}", file=sys.stderr)
            return 2
        return 0
    try:  # a bad --storage exits here, not after Ray has started
        note = check_storage(config, out)
    except ConfigError as e:
        print(f"commtune: error: {e}", file=sys.stderr)
        return 2
    if note:
        print(note)
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.monotonic()
    ctrl_c.install()
    try:
        from orchestrator.search.pipeline import run_search
        from orchestrator.search.ranged import run_range

        budget = config.search.time_budget_min
        deadline = time.time() + budget * 60 if budget else None
        search = run_range if config.search.world_sizes else run_search
        lines, baseline_failed = search(config, out, faults, args.resume, args.verbose, deadline)
    except ConfigError as e:  # found only once the cluster is known (e.g. too few resources)
        print(f"commtune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("commtune: interrupted; resume with --resume", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    print(f"outputs in {out} ({time.monotonic() - started:.0f}s)")
    if baseline_failed is not None:
        print(
            f"commtune: the baseline (trial 0) did not complete ({baseline_failed}); there is "
            f"nothing to compare against (see {TRIALS_CSV})",
            file=sys.stderr,
        )
        return 1
    return 0
