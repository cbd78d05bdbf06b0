"""``python -m orchestrator.train``: train the configuration a search wrote, elastically.

    python -m orchestrator.train --config runs/<study>/best.yaml [--steps N] [--workers MIN:MAX]
        [--checkpoint-every K] [--out DIR] [--resume] [--adaptive]

Workers may come and go: a failed worker group restarts from the latest checkpoint (within
``--max-failures``), a lost node shrinks the group to what is left (with ``--workers MIN:MAX``)
and a new node grows it again; each start re-splits the global batch exactly. Exit codes: 0 all
steps done, 2 usage or configuration error (before Ray starts), 1 the run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import queue as std_queue
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config import Config, ConfigError, load_config
from orchestrator.inputs import check_out_dir
from train_fns.metrics import STATE_FILE

if TYPE_CHECKING:  # ray.train and torch load only once a run starts (a bad input exits fast)
    from orchestrator.runlog import RunLog, RunRelay
    from train_fns.elastic import RunSpec

RUN_NAME = "train"
"""Ray Train run name inside ``--out``: a second start with the same name resumes it."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m orchestrator.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--config", help="a complete config, e.g. runs/<study>/best.yaml")
    p.add_argument("--preset", help="smoke, cpu-demo or bert-large (default: by hardware)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one key, e.g. --set train.max_failures=5")  # fmt: skip
    p.add_argument("--steps", type=int, help="optimizer steps in all (train.steps)")
    p.add_argument("--workers", metavar="MIN:MAX", help="elastic worker range, e.g. 1:4")
    p.add_argument("--checkpoint-every", type=int, metavar="K", help="train.checkpoint_every")
    p.add_argument("--max-failures", type=int, help="train.max_failures")
    p.add_argument("--adaptive", action="store_true", help="adapt the accumulation split")
    p.add_argument("--out", help="run folder (default runs/<name>-train)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument("--address", help="join a running Ray cluster ('auto' or HOST:PORT)")
    p.add_argument("--verbose", action="store_true", help="show Ray and worker logs")
    return p.parse_args(argv)


def workers_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    if not sep or not low.isdigit() or not high.isdigit() or not 1 <= int(low) <= int(high):
        raise ConfigError("--workers", f"{text!r} is not MIN:MAX with 1 <= MIN <= MAX, e.g. 1:4")
    return int(low), int(high)


def check(args: argparse.Namespace) -> Config:
    """The config the arguments describe, validated without touching the run folder
    (``orchestrator.submit`` checks a job's arguments with it before submitting)."""
    sets = list(args.set)
    for key, value in (("train.steps", args.steps), ("train.checkpoint_every",
                       args.checkpoint_every), ("train.max_failures", args.max_failures),
                       ("cluster.address", args.address)):  # fmt: skip
        if value is not None:
            sets.append(f"{key}={value}")
    if args.adaptive:
        sets.append("train.adaptive=true")
    if args.workers:
        low, high = workers_range(args.workers)
        sets += [f"train.min_workers={low}", f"train.max_workers={high}"]
    return load_config(args.config, args.preset, sets)


def prepare(args: argparse.Namespace) -> tuple[Config, Path]:
    """Everything that can fail on user input, checked before Ray starts."""
    config = check(args)
    out = Path(os.path.expandvars(os.path.expanduser(args.out or f"runs/{config.name}-train")))
    check_out_dir(out)
    latest = latest_checkpoint(out)
    if latest is not None and not args.resume:
        raise ConfigError("--out", f"{out} holds a run (checkpoint at step {latest[0]}); pass "
                          "--resume to continue it or choose another --out")  # fmt: skip
    return config, out


def latest_checkpoint(out: Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest complete checkpoint under ``out`` (None: there is none)."""
    found = []
    for p in (out / RUN_NAME).glob(f"*/{STATE_FILE}"):
        try:
            step = json.loads(p.read_text())["step"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError("--out", f"{p} is unreadable ({type(e).__name__}); remove that "
                              "checkpoint folder or choose another --out") from e  # fmt: skip
        if not isinstance(step, int) or isinstance(step, bool):
            raise ConfigError("--out", f"{p} holds step={step!r}; remove that checkpoint folder")
        found.append((step, p.parent))
    return max(found, default=None)


def worker_counts(config: Config) -> tuple[int, int]:
    train = config.train
    if train.min_workers is None:
        return config.cluster.num_workers, config.cluster.num_workers
    return train.min_workers, train.max_workers


def run_spec(config: Config, task: str, use_gpu: bool, out: Path) -> tuple[RunSpec, dict[str, str]]:
    """The tuned plan for the largest world size, and what every worker is told."""
    from orchestrator.trial import plan_from_config
    from train_fns.elastic import RunSpec

    train = config.train
    _, high = worker_counts(config)
    plan = plan_from_config(
        config, task, use_gpu, dict(config.tuned), config.cluster.num_workers,
        warmup_steps=0, measure_steps=train.steps, num_windows=1,
        max_grad_norm=train.max_grad_norm, env_names=tuple(sorted(config.env)),
    )  # fmt: skip
    adaptive = None
    if train.adaptive:
        adaptive = {"window": train.adaptive_window, "max_steps": train.max_accumulation,
                    "allow_global_batch_change": train.allow_global_batch_change}  # fmt: skip
    spec = RunSpec(
        plan=plan.to_dict(), steps=train.steps, checkpoint_every=train.checkpoint_every,
        max_micro_batch=plan.micro_batch, on_no_split=train.on_no_split, adaptive=adaptive,
        grad_norm_every=train.grad_norm_every, report_every=train.log_every,
        progress_file=str(progress_file(out)),
    )  # fmt: skip
    return spec, dict(config.env)


def progress_file(out: Path) -> Path:
    return (out / "last_step").resolve()


def trainer(config: Config, spec: RunSpec, env: dict[str, str], use_gpu: bool, out: Path,
            relay: RunRelay) -> Any:  # fmt: skip
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from train_fns.elastic import train_loop_elastic

    low, high = worker_counts(config)
    # Read by Ray Train on the driver and passed on to its controller.
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(config.train.start_timeout_s)
    return TorchTrainer(
        train_loop_elastic,
        train_loop_config=spec.to_dict(),
        torch_config=TorchConfig(
            backend="nccl" if use_gpu else "gloo", timeout_s=int(config.search.step_deadline_s) + 30
        ),  # fmt: skip
        scaling_config=ScalingConfig(
            num_workers=(low, high) if low != high else high,
            use_gpu=use_gpu,
            resources_per_worker={"CPU": config.cluster.cpus_per_worker}
            | ({"GPU": 1} if use_gpu else {}),
            elastic_resize_monitor_interval_s=config.train.resize_check_s,
        ),
        run_config=RunConfig(
            name=RUN_NAME,
            storage_path=str(out.resolve()),
            worker_runtime_env={"env_vars": env},
            failure_config=FailureConfig(max_failures=config.train.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            callbacks=[relay],
        ),
    )


def run(config: Config, out: Path, verbose: bool) -> tuple[dict[str, Any], RunLog]:
    """Start or join Ray, train to the end (or failure), return the summary."""
    import ray
    from ray.util.queue import Empty, Queue

    from orchestrator.callbacks import driver_queue
    from orchestrator.driver import check_capacity, quiet_libraries, resolve_gpu, start_ray
    from orchestrator.runlog import RunLog, RunRelay
    from orchestrator.trial import resolve_task

    low, high = worker_counts(config)
    quiet_libraries(verbose)
    start_ray(dataclasses.replace(config, cluster=dataclasses.replace(
        config.cluster, num_workers=high)), verbose)  # fmt: skip
    try:
        use_gpu = resolve_gpu(config)
        check_capacity(dataclasses.replace(config, cluster=dataclasses.replace(
            config.cluster, num_workers=low)), use_gpu)  # fmt: skip
        spec, env = run_spec(config, resolve_task(config), use_gpu, out)
        reports: Queue = driver_queue()
        log = RunLog(out, config.train.steps, config.train.log_every, progress_file(out),
                     alive_nodes=alive_nodes)  # fmt: skip
        outcome: dict[str, Any] = {}
        fit = threading.Thread(target=_fit, daemon=True, args=(
            trainer(config, spec, env, use_gpu, out, RunRelay(reports)), outcome))  # fmt: skip
        started = time.monotonic()
        fit.start()
        while fit.is_alive() or not reports.empty():
            with contextlib.suppress(Empty, std_queue.Empty):
                log.take(reports.get(timeout=0.5))
        summary = log.summary(time.monotonic() - started, outcome.get("error"))
        log.close()
        return summary, log
    finally:
        ray.shutdown()


def alive_nodes() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def _fit(train: Any, outcome: dict[str, Any]) -> None:
    try:
        train.fit()
    except Exception as e:  # reported in the summary, never lost
        outcome["error"] = f"{type(e).__name__}: {e}"[-2000:]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config, out = prepare(args)
    except ConfigError as e:
        print(f"commtune: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        summary, log = run(config, out, args.verbose)
    except ConfigError as e:
        print(f"commtune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"commtune: interrupted; continue with --resume --out {out}", file=sys.stderr)
        return 1
    print_summary(summary, out)
    return 0 if summary["steps"] == config.train.steps and not summary["error"] else 1


def print_summary(summary: dict[str, Any], out: Path) -> None:
    comm, data = summary["comm_fraction"], summary["data_fraction"]
    print(
        f"done: {summary['steps']}/{summary['steps_wanted']} steps, final loss "
        f"{summary['final_loss']:.4f}, {summary['samples_per_s']:.1f} samples/s (median), "
        f"exposed comm {comm if comm is None else f'{comm:.0%}'} of fwd+bwd, data wait "
        f"{data if data is None else f'{data:.0%}'} of the step, "
        f"{len(summary['restarts'])} restart(s), {summary['wall_s']:.0f}s"
        if summary["final_loss"] is not None
        else f"no step finished ({summary['wall_s']:.0f}s)"
    )
    print(f"non-finite steps: {summary['nonfinite_steps']} ({summary['nonfinite_rate']:.2%}); "
          f"loss scale {summary['loss_scale']}")  # fmt: skip
    for warning in summary["warnings"]:
        print(f"warning: {warning}")
    if summary["error"]:
        print(f"commtune: the run failed: {summary['error']}", file=sys.stderr)
    print(f"run folder: {out} (summary.json, progress.csv, grad_norms.csv, events.jsonl)")


if __name__ == "__main__":
    sys.exit(main())
