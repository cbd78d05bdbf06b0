"""``python -m orchestrator.train``: train the configuration a search wrote, elastically.

    python -m orchestrator.train --config runs/<study>/best.yaml [--steps N] [--workers MIN:MAX]
        [--checkpoint-every K] [--out DIR] [--resume] [--adaptive | --tune]

Workers may come and go: a failed worker group restarts from the latest checkpoint (within
``--max-failures``), a lost node shrinks the group to what is left (with ``--workers MIN:MAX``)
and a new node grows it again; each start re-splits the global batch exactly. Exit codes: 0 all
steps done, 2 usage or configuration error (before Ray starts), 1 the run failed.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import sys
from pathlib import Path
from typing import Any

from orchestrator.cluster.session import check_ray_address
from orchestrator.config.inputs import check_out_dir
from orchestrator.config.schema import Config, ConfigError, load_config
from orchestrator.config.size_entries import check_batch_fits, workers_range
from orchestrator.planning.from_config import absolute_paths, check_model
from orchestrator.runfiles import (
    BEST_YAML,
    EVENTS_JSONL,
    PROGRESS_CSV,
    TRAIN_FILES,
    TRAIN_RUN_NAME,
    TUNED_SIZES_YAML,
    Summary,
    num,
    read_csv,
    write_summary,
)
from orchestrator.train.tune import check_budget
from orchestrator.train.tune_files import read_tuned_sizes
from orchestrator.train.tune_lines import summary_lines
from train_fns.metrics import STATE_FILE
from train_fns.restart import read_state


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m orchestrator.train", description=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--config", help=f"a complete config, e.g. runs/<study>/{BEST_YAML}")
    p.add_argument("--preset", help="smoke, cpu-demo or bert-large (default: by hardware)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one key, e.g. --set train.max_failures=5")  # fmt: skip
    p.add_argument("--steps", type=int, help="optimizer steps in all (train.steps)")
    p.add_argument("--workers", metavar="MIN:MAX",
                   help="elastic worker range, e.g. 1:4 (a single N: exactly N)")  # fmt: skip
    p.add_argument("--checkpoint-every", type=int, metavar="K", help="train.checkpoint_every")
    p.add_argument("--max-failures", type=int, help="train.max_failures")
    p.add_argument("--adaptive", action="store_true", help="adapt the accumulation split")
    p.add_argument("--tune", action="store_true", help="tune while training (train.tune=online)")
    p.add_argument("--out", help="run folder (default runs/<name>-train)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--address", help="join a running Ray cluster ('auto' or HOST:PORT)")
    p.add_argument("--verbose", action="store_true", help="show Ray and worker logs")
    return p.parse_args(argv)


def check(argv: list[str]) -> Config:
    """The config a training run with these arguments would run, validated without touching
    the run folder: the command's face, which ``orchestrator.submit`` calls before it sends a
    job (a mistake stops on this machine, not minutes later on the cluster)."""
    return configure(parse_args(argv))


def configure(args: argparse.Namespace) -> Config:
    """The config the arguments describe, validated without touching the run folder."""
    sets = list(args.set)
    for key, value in (("train.steps", args.steps), ("train.checkpoint_every",
                       args.checkpoint_every), ("train.max_failures", args.max_failures),
                       ("cluster.address", args.address)):  # fmt: skip
        if value is not None:
            sets.append(f"{key}={value}")
    if args.adaptive:
        sets.append("train.adaptive=true")
    if args.tune:
        sets.append("train.tune=online")
    if args.workers:
        low, high = workers_range(args.workers)
        sets += [f"train.min_workers={low}", f"train.max_workers={high}"]
    config = load_config(args.config, args.preset, sets)
    if args.workers:  # a group that cannot split the batch would wait for a size forever
        check_batch_fits(low, high, config.workload.global_batch, anywhere=True)
    config = absolute_paths(config)
    config, notes = check_model(config)
    for note in notes:
        print(note)
    return config


def prepare(args: argparse.Namespace) -> tuple[Config, Path]:
    """Everything that can fail on user input, checked before Ray starts."""
    config = configure(args)
    if isinstance(config.cluster.use_gpu, bool):  # known before Ray: the plan can be checked
        from orchestrator.train.run import check_runnable

        check_runnable(config, config.cluster.use_gpu)
    out = Path(os.path.expandvars(os.path.expanduser(args.out or f"runs/{config.name}-train")))
    check_out_dir(out)
    check_ray_address(config, "--address" if args.address else "cluster.address")
    if config.train.tune == "online":
        check_budget(config)
        check_tuned_sizes(out, config, args.resume)
    latest = latest_checkpoint(out)
    if latest is not None and not args.resume:
        raise ConfigError("--out", f"{out} holds a run (checkpoint at step {latest[0]}); pass "
                          "--resume to continue it or choose another --out")  # fmt: skip
    return config, out


def check_tuned_sizes(out: Path, config: Config, resume: bool) -> None:
    """A ``--resume`` starts the sizes an earlier ``--tune`` run decided (its
    ``tuned_sizes.yaml``, read here so that a broken file stops before Ray); a new run into a
    folder that holds one is refused, as one that holds a checkpoint is."""
    decided = read_tuned_sizes(out, config.workload.global_batch)
    if decided and not resume:
        raise ConfigError("--out", f"{out} holds {TUNED_SIZES_YAML} of an earlier --tune run; "
                          "pass --resume to start its sizes tuned, or choose another --out")


def latest_checkpoint(out: Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest complete checkpoint under ``out`` (None: there is none)."""
    found = []
    for p in (out / TRAIN_RUN_NAME).glob(f"*/{STATE_FILE}"):
        try:
            step = read_state(p.parent)["step"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError("--out", f"{p} is unreadable ({type(e).__name__}); remove that "
                              "checkpoint folder or choose another --out") from e  # fmt: skip
        if not isinstance(step, int) or isinstance(step, bool):
            raise ConfigError("--out", f"{p} holds step={step!r}; remove that checkpoint folder")
        found.append((step, p.parent))
    return max(found, default=None)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config, out = prepare(args)
    except ConfigError as e:
        print(f"commtune: error: {e}", file=sys.stderr)
        return 2
    latest = latest_checkpoint(out) if args.resume else None
    if latest is not None and latest[0] >= config.train.steps:
        return finished_before(config, out, latest)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from orchestrator.train.run import run  # Ray Train and torch load once the input is good

    try:
        summary, log = run(config, out, args.verbose)
    except ConfigError as e:
        print(f"commtune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"commtune: interrupted; continue with --resume --out {out}", file=sys.stderr)
        return 1
    totals = Summary.from_mapping(summary)
    print_summary(totals, out)
    return 0 if totals.steps == config.train.steps and not totals.error else 1


def finished_before(config: Config, out: Path, latest: tuple[int, Path]) -> int:
    """``--resume`` of a run whose newest checkpoint already holds its last step (the driver
    stopped after the workers' final checkpoint, before their last rows reached it): nothing
    is trained again; summary.json says the step and loss that checkpoint saved."""
    step, folder = latest
    loss = read_state(folder).get("last_loss")
    logged = _last_logged(out / PROGRESS_CSV)
    lost = [] if logged >= step else [f"steps {logged + 1}-{step} ran before this --resume (its "
                                      f"checkpoint {folder.name}) but never reached "
                                      f"{PROGRESS_CSV}"]  # fmt: skip
    summary = Summary(steps=step, steps_wanted=config.train.steps, final_loss=loss, wall_s=0.0,
                      warnings=lost)  # fmt: skip
    write_summary(out, summary)
    print(
        f"resume: the run already reached step {step} of {config.train.steps} (its checkpoint "
        f"at step {step}): nothing left to train; final loss {_figure(loss, '.4f')}"
    )
    for warning in lost:
        print(f"warning: {warning}")
    print(f"run folder: {out} ({', '.join((*TRAIN_FILES, EVENTS_JSONL))})")
    return 0


def _last_logged(path: Path) -> int:
    """The last step progress.csv holds (0: none, or no readable file: ``runfiles.read_csv``,
    capped as every run-folder reader is)."""
    try:
        rows = read_csv(path)
    except (OSError, ValueError, csv.Error):
        return 0
    return int(max((num(r.get("step")) or 0 for r in rows), default=0))


def print_summary(summary: Summary, out: Path) -> None:
    """The run's closing lines, from its typed summary: a figure it lacks (a non-finite final
    loss reads as absent) prints as n/a rather than failing the format."""
    if summary.world_sizes:  # each logged step gives a world size
        print(
            f"done: {summary.steps}/{summary.steps_wanted} steps, final loss "
            f"{_figure(summary.final_loss, '.4f')}, "
            f"{_figure(summary.wall_samples_per_s, '.1f')} samples/s over the wall-clock "
            f"({_figure(summary.samples_per_s, '.1f')} the median step), exposed comm "
            f"{_figure(summary.comm_fraction, '.0%')} of "
            f"fwd+bwd, data wait {_figure(summary.data_fraction, '.0%')} of the step, "
            f"{len(summary.restarts or [])} restart(s), {_figure(summary.wall_s, '.0f')}s"
        )
    else:
        print(f"no step finished ({_figure(summary.wall_s, '.0f')}s)")
    print(
        f"non-finite steps: {summary.nonfinite_steps} "
        f"({_figure(summary.nonfinite_rate, '.2%')}); loss scale {summary.loss_scale}"
    )
    if len(summary.by_size or []) > 1 or any(s.get("entry_size") for s in summary.by_size or []):
        for size in summary.by_size or []:
            print(size_line(size))
    for line in summary_lines(summary.tune):
        print(line)
    for warning in summary.warnings or []:
        print(f"warning: {warning}")
    if summary.error:
        print(f"commtune: the run failed: {summary.error}", file=sys.stderr)
    print(f"run folder: {out} ({', '.join((*TRAIN_FILES, EVENTS_JSONL))})")


def size_line(size: dict[str, Any]) -> str:
    """One world size of the run: steps, trained samples/s against the searched figure."""
    searched, entry = size.get("searched_samples_per_s"), size.get("entry_size")
    against = "" if searched is None else (
        f" (search measured {searched:.1f} for the entry for {entry})")  # fmt: skip
    return (f"  {size.get('world_size')} workers: {size.get('steps')} steps at "
            f"{_figure(size.get('samples_per_s'), '.1f')} samples/s{against}")  # fmt: skip


def _figure(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)
