"""A training run on Ray: the tuned plan, the elastic worker group, its log and summary.

Workers may come and go: a failed worker group restarts from the latest checkpoint (within
``train.max_failures``), a lost node shrinks the group to what is left (with a worker range)
and a new node grows it again; each start re-splits the global batch exactly
(``train_fns.restart``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.cluster.session import (
    alive_nodes,
    check_capacity,
    driver_queue,
    expected_layout,
    quiet_libraries,
    resolve_gpu,
    start_ray,
)
from orchestrator.cluster.workers import Fit, GroupSpec, Heartbeat, torch_trainer
from orchestrator.config.schema import Config, ConfigError, TrainConfig
from orchestrator.config.size_entries import fit_context, fit_range, run_entries
from orchestrator.planning.from_config import check_reductions, plan_from_config, resolve_task
from orchestrator.runfiles import LAST_STEP, SUMMARY_JSON, TRAIN_RUN_NAME
from orchestrator.train.runlog import RunLog, RunRelay
from orchestrator.train.snapshots import start_keeper
from orchestrator.train.tune import TuneSettings, start_judge
from orchestrator.train.tune_files import read_tuned_sizes
from orchestrator.train.tune_knobs import space_bucket_choices
from train_fns.guard import tolerance_for
from train_fns.plan import InfeasiblePlan, TrialPlan
from train_fns.restart import RunSpec
from train_fns.size_fit import Fitted, plan_of

START, STEP = "start", "step"
"""Phases of a training run a stall is recorded in."""
HEALTH_CHECK_S = 0.5
"""How often Ray Train polls the workers: a dead one is seen this long after at most (Ray's
default, 2 s, was up to a fifth of a recovery on the local twin)."""


def worker_counts(config: Config) -> tuple[int, int]:
    train = config.train
    if train.min_workers is None:
        return config.cluster.num_workers, config.cluster.num_workers
    return train.min_workers, train.max_workers


def run_spec(config: Config, task: str, use_gpu: bool, out: Path) -> tuple[RunSpec, dict[str, str]]:
    """The tuned plan for the largest world size, and what every worker is told."""
    train = config.train
    _, high = worker_counts(config)
    plan = plan_from_config(
        config, task, use_gpu, dict(config.tuned), config.cluster.num_workers, dict(config.env),
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
        progress_file=str(progress_file(out)), entries=run_entries(config),
        fit_context=fit_context(config, use_gpu), snapshot_every=snapshot_every(train),
        snapshot_max_mb=train.snapshot_max_mb,
        tune_window=train.tune_window if train.tune == "online" else 0,
    )  # fmt: skip
    return spec, dict(config.env)


def snapshot_every(train: TrainConfig) -> int:
    """Steps between in-memory snapshots: as configured, else half the checkpoint interval
    (none where checkpoints come every step or two: a snapshot would save nothing)."""
    if train.snapshot_every is not None:
        return train.snapshot_every
    return train.checkpoint_every // 2 if train.checkpoint_every > 2 else 0


def progress_file(out: Path) -> Path:
    return (out / LAST_STEP).resolve()


def group_spec(config: Config, spec: RunSpec, env: dict[str, str], use_gpu: bool, out: Path,
               relay: RunRelay, keeper: Any = None, judge: Any = None) -> GroupSpec:  # fmt: skip
    """The elastic worker group: (min, max) workers, restarts from the latest checkpoint or
    the ``keeper``'s newer snapshot; ``judge``: the tuning judge rank 0 asks (``--tune``)."""
    from ray.train import CheckpointConfig

    from train_fns.worker import train_loop_elastic

    low, high = worker_counts(config)
    return GroupSpec(
        loop=train_loop_elastic,
        loop_config={**spec.to_dict(), "keeper": keeper, "judge": judge},
        name=TRAIN_RUN_NAME,
        storage_path=str(out.resolve()),
        num_workers=(low, high) if low != high else high,
        use_gpu=use_gpu,
        cpus_per_worker=config.cluster.cpus_per_worker,
        env=env,
        timeout_s=int(config.search.step_deadline_s) + 30,
        max_failures=config.train.max_failures,
        scaling={"elastic_resize_monitor_interval_s": config.train.resize_check_s},
        run={"checkpoint_config": CheckpointConfig(num_to_keep=2), "callbacks": [relay]},
    )


def waiting_line(log: RunLog, silent_s: float, workers: int) -> str:
    """A heartbeat line of a training run: what it waits on, how long nothing came."""
    if not log.world:
        return f"training: starting {workers} workers ({silent_s:.0f} s)"
    return f"training: step {log.last_step}/{log.steps}, nothing new for {silent_s:.0f} s"


class Watch:
    """The driver's bounds on a training run: from the group's (re)start to its first report
    (phase ``start``), and from each report to the next (phase ``step``). A failure notice
    means a restart follows: the clock starts again in phase ``start``."""

    def __init__(
        self, start_s: float, step_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.bounds = {START: ("train.first_report_timeout_s", start_s),
                       STEP: ("train.stall_timeout_s", step_s)}  # fmt: skip
        self.clock = clock
        self.phase, self.since = START, clock()

    def take(self, item: dict[str, Any]) -> None:
        self.phase = START if "failure" in item else STEP
        self.since = self.clock()

    def silent_s(self) -> float:
        return self.clock() - self.since

    def overrun(self) -> str | None:
        """The reason the run is ended, once its phase's bound is overrun (None: not yet)."""
        key, bound_s = self.bounds[self.phase]
        if self.silent_s() <= bound_s:
            return None
        what = "of the worker group's start" if self.phase == START else "of the last report"
        return (
            f"hang in phase {self.phase}: nothing reported within {key}={bound_s:g}s {what}; "
            "the worker group was ended"
        )


def drain(fit: Fit, reports: Any, log: RunLog, every_s: float, workers: int,
          watch: Watch) -> str | None:  # fmt: skip
    """Log every report; after ``every_s`` without one, a heartbeat line (a restart, a slow
    start or a stuck step is never silent). Returns why the run was ended (a stall), or None
    when it ended on its own."""
    beat = Heartbeat(every_s)
    stalled: list[str] = []

    def take(item: dict[str, Any]) -> None:
        watch.take(item)
        beat.quiet()
        log.take(item)

    def stop() -> bool:
        why = watch.overrun()
        if why is not None:
            stalled.append(why)
            return True
        return beat.beat(lambda: waiting_line(log, watch.silent_s(), workers))

    if fit.drain(reports, take, stop=stop):
        return None
    print(f"training: {stalled[0]}", flush=True)
    fit.end()
    fit.release()  # its controller, workers and placement groups (no wait: the run ends)
    return stalled[0]


def check_runnable(config: Config, use_gpu: bool) -> None:
    """The tuned plan builds on these workers (fp16 needs GPUs; a forced NCCL algorithm must
    reduce what the strategy issues), or a ConfigError saying why."""
    try:
        run_spec(config, resolve_task(config), use_gpu, Path("."))
    except InfeasiblePlan as e:
        raise ConfigError("--config", f"the tuned configuration cannot run here: {e}") from e


def check_sizes_fit(config: Config, use_gpu: bool, template: TrialPlan) -> None:
    """Fit the tuned entries to every size of the run's range on the layout each would get
    here, before a worker starts: a tuned value no size can run is a ConfigError naming it;
    an elastic range prints what each size runs and drops (each start fits again to its
    real layout and logs the same line). ``template``: the run's plan (``run_spec``)."""
    import ray

    low, high = worker_counts(config)
    nodes = ray.nodes()
    fitted = fit_range(config, use_gpu, range(low, high + 1),
                       lambda world: expected_layout(config, use_gpu, world, nodes))  # fmt: skip
    for world, entry in fitted.items():
        if entry.split is not None:
            _check_plan(template, entry, world)
        if low != high or entry.dropped:
            print(f"sizes: {entry.line(world)}", flush=True)


def _check_plan(template: TrialPlan, entry: Fitted, world: int) -> None:
    """The fitted entry builds a plan at ``world`` whose reductions its NCCL_ALGO runs."""
    where = f"sizes.{entry.size}" if entry.size != template.world_size else "tuned"
    try:
        check_reductions(plan_of(template, entry, world), entry.env)
    except InfeasiblePlan as e:
        raise ConfigError(where, f"at {world} workers: {e}") from e


def start_judge_for(config: Config, out: Path, template: TrialPlan,
                    buckets: tuple[float, ...]) -> Any:  # fmt: skip
    """The run's tuning judge: its settings from ``config``, the bucket sizes its spaces offer
    (``buckets``) and the guard's tolerance for the run's plan ``template``; the sizes its own
    entries decide
    (best.yaml's: a search's tuned top level, its ``sizes``) are not tuned, nor are the ones
    a run before this ``--resume`` decided (``tuned_sizes.yaml``)."""
    train, search = config.train, config.search
    settings = TuneSettings(
        window_steps=train.tune_window, budget_steps=int(train.tune_budget * train.steps),
        delta=search.verdict_delta, max_pairs=search.verdict_pairs,
        max_accumulation=train.max_accumulation,
        bucket_choices=buckets, tolerance=tolerance_for(template),
    )  # fmt: skip
    fixed = {int(size) for size in config.sizes}
    if config.tuned:
        fixed.add(config.cluster.num_workers)
    prior = read_tuned_sizes(out, config.workload.global_batch)
    return start_judge(settings, fixed, prior, out)


def judge_summary(judge: Any, log: RunLog) -> dict[str, Any] | None:
    """The judge's account of the run's tuning (None without ``--tune``); a judge that does not
    answer costs the account, with a warning, not the run's summary."""
    import ray

    if judge is None:
        return None
    try:
        return ray.get(judge.summary.remote(), timeout=60)
    except ray.exceptions.RayError as e:
        log.warnings.append(f"the tuning judge did not answer ({type(e).__name__}): "
                            f"{SUMMARY_JSON} holds no tune")  # fmt: skip
        return None


def start_ray_for(config: Config, verbose: bool) -> None:
    """Join ``config``'s cluster, or start the local Ray a run of it needs: sized for its
    largest group (``train.max_workers`` of a worker range)."""
    _, high = worker_counts(config)
    start_ray(dataclasses.replace(config, cluster=dataclasses.replace(
        config.cluster, num_workers=high)), verbose)  # fmt: skip


def run(config: Config, out: Path, verbose: bool) -> tuple[dict[str, Any], RunLog]:
    """Start or join Ray, train to the end (or failure), return the summary."""
    import ray

    low, high = worker_counts(config)
    online = config.train.tune == "online"
    buckets = space_bucket_choices(config.search.spaces) if online else ()  # before Ray
    quiet_libraries(verbose)
    start_ray_for(config, verbose)
    try:
        use_gpu = resolve_gpu(config)
        check_capacity(dataclasses.replace(config, cluster=dataclasses.replace(
            config.cluster, num_workers=low)), use_gpu, placed=False)  # fmt: skip
        check_runnable(config, use_gpu)  # use_gpu: auto is known only now
        spec, env = run_spec(config, resolve_task(config), use_gpu, out)
        template = TrialPlan.from_dict(spec.plan)
        check_sizes_fit(config, use_gpu, template)
        reports = driver_queue()
        train = config.train
        log = RunLog(out, train.steps, train.log_every, progress_file(out),
                     alive_nodes=alive_nodes, snapshot_max_mb=train.snapshot_max_mb)  # fmt: skip
        started = time.monotonic()
        keeper = start_keeper() if spec.snapshot_every else None
        judge = start_judge_for(config, out, template, buckets) if spec.tune_window else None
        trainer = torch_trainer(
            group_spec(config, spec, env, use_gpu, out, RunRelay(reports), keeper, judge)
        )
        # owned: a stall ends the group; the variables are read by Ray Train where fit() runs
        ray_env = {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": str(config.train.start_timeout_s),
                   "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(HEALTH_CHECK_S)}  # fmt: skip
        fit = Fit(trainer, owned=True, env=ray_env)
        watch = Watch(config.train.first_report_timeout_s, config.train.stall_timeout_s)
        error = drain(fit, reports, log, config.search.heartbeat_s, high, watch)
        if error is None and fit.error is not None:
            error = f"{type(fit.error).__name__}: {fit.error}"[-2000:]
        summary = log.summary(time.monotonic() - started, error, judge_summary(judge, log))
        log.close()
        return summary, log
    finally:
        ray.shutdown()
