"""One trial: sampled params -> checked TrialPlan -> a real TorchTrainer run -> outcome.

``run_trial`` is the Ray Tune function trainable. It never raises for an outcome
it understands (infeasible, oom, hang, crash): it reports the outcome with its
reason, so that the search goes on and Optuna is told the truth.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue as std_queue
import shutil
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import Config
from orchestrator.outcome import should_prune, window_throughputs
from search_spaces import SearchSpace, is_env_name
from train_fns import metrics as m
from train_fns.models import default_task, resolve_model_config
from train_fns.plan import DDPOptions, FSDPOptions, InfeasiblePlan, TrialPlan, split_global_batch

TRIAL_NUMBER = "trial_number"
"""Config key carrying the Optuna trial number (what users see) into the trial."""
OUTCOME = "outcome"
"""Result key holding the trial's whole outcome record (state, reason, metrics, timings)."""
PRUNE_BELOW = "_prune_below"
"""Config key: samples/s below which this trial is clearly slower than the best so far."""


@dataclass(frozen=True)
class TrialContext:
    """What every trial shares; shipped once with ``tune.with_parameters``."""

    config: Config
    space: SearchSpace
    use_gpu: bool
    storage_path: str
    task: str
    """mlm or clm, resolved once on the driver (a trial may run where a local model is not)."""
    faults: dict[int, str] = field(default_factory=dict)
    link: Any = None
    """The costmodel Link the probe measured (None: no probe): each trial's bound."""


def resolve_task(config: Config) -> str:
    """The task from the config, or inferred from the model (causal LMs train with clm)."""
    if config.workload.task:
        return config.workload.task
    hf = resolve_model_config(config.workload.model, config.workload.model_overrides)
    return default_task(hf)


def sampled_params(config: dict[str, Any], space: SearchSpace) -> dict[str, Any]:
    """The trial's params by their real names (no Optuna-internal or bookkeeping keys)."""
    names = {*space.param_names, "strategy"}
    return {k: v for k, v in config.items() if k in names}


def derive_plan(
    ctx: TrialContext, params: dict[str, Any], fault: str | None = None
) -> tuple[TrialPlan, dict[str, str]]:
    """Combine the fixed config with the sampled knobs; raise InfeasiblePlan if it cannot run."""
    cfg = ctx.config
    knobs = {**cfg.tuned, **ctx.space.knobs(params)}
    env = {**cfg.env, **ctx.space.env_vars(params)}
    plan = plan_from_config(
        cfg,
        ctx.task,
        ctx.use_gpu,
        knobs,
        cfg.cluster.num_workers,
        warmup_steps=cfg.search.warmup_steps,
        measure_steps=cfg.search.measure_steps,
        num_windows=cfg.search.windows,
        env_names=tuple(sorted(set(env) | set(filter(is_env_name, ctx.space.param_names)))),
        fault=fault,
    )
    return plan, env


def plan_from_config(
    cfg: Config, task: str, use_gpu: bool, knobs: dict[str, Any], world: int, **extra: Any
) -> TrialPlan:
    """The TrialPlan of a config's workload with ``knobs`` (tuned values) on ``world`` workers;
    ``extra`` sets the measurement fields (a trial's windows, a training run's steps)."""
    accumulation = int(knobs.get("accumulation_steps", 1))
    ddp_defaults = DDPOptions()
    return TrialPlan(
        model=cfg.workload.model,
        task=task,
        seq_len=cfg.workload.seq_len,
        global_batch=cfg.workload.global_batch,
        world_size=world,
        accumulation_steps=accumulation,
        micro_batch=split_global_batch(cfg.workload.global_batch, world, accumulation),
        strategy=knobs.get("strategy", cfg.strategy if cfg.strategy != "search" else "ddp"),
        precision=cfg.workload.precision,
        ddp=DDPOptions(
            bucket_cap_mb=float(knobs.get("bucket_cap_mb", ddp_defaults.bucket_cap_mb)),
            gradient_as_bucket_view=bool(
                knobs.get("gradient_as_bucket_view", ddp_defaults.gradient_as_bucket_view)
            ),
            static_graph=bool(knobs.get("static_graph", ddp_defaults.static_graph)),
        ),
        fsdp=FSDPOptions(
            reshard_after_forward=bool(knobs.get("reshard_after_forward", True)),
        ),
        activation_checkpointing=bool(knobs.get("activation_checkpointing", False)),
        model_overrides=dict(cfg.workload.model_overrides),
        data=cfg.workload.data,
        tokenizer=cfg.workload.tokenizer,
        use_gpu=use_gpu,
        lr=cfg.workload.lr,
        seed=cfg.search.seed,
        step_deadline_s=cfg.search.step_deadline_s,
        **extra,
    )


def run_trial(params: dict[str, Any], ctx: TrialContext) -> None:
    """Tune function trainable: run one configuration and report exactly one outcome."""
    from ray import tune

    started = time.monotonic()
    number = int(params.get(TRIAL_NUMBER, -1))
    try:
        outcome = _run(params, ctx, number)
    except Exception as e:  # a driver-side bug must not kill the search; keep its trace
        outcome = {
            m.STATE: m.ERROR,
            m.REASON: f"trial driver failed: {type(e).__name__}: {e}",
            "traceback": traceback.format_exc(limit=8),
        }
    outcome["trial_wall_s"] = time.monotonic() - started
    outcome["params"] = sampled_params(params, ctx.space)
    # Tune insists that the objective is in every result; the rest travels as one record.
    tune.report({m.SAMPLES_PER_S: outcome.get(m.SAMPLES_PER_S), OUTCOME: outcome})


def _run(params: dict[str, Any], ctx: TrialContext, number: int) -> dict[str, Any]:
    try:
        plan, env = derive_plan(ctx, params, ctx.faults.get(number))
    except InfeasiblePlan as e:
        return {m.STATE: m.INFEASIBLE, m.REASON: str(e)}
    result = TrainerRun(plan, env, ctx, name=f"trial_{number:04d}").run(
        deadline_s=ctx.config.search.trial_timeout_s, prune_below=params.get(PRUNE_BELOW)
    )
    result["env"] = env
    result["plan"] = plan.to_dict()
    if result.get(m.STATE) == m.COMPLETE:
        from orchestrator.explain import comm_bound

        result.update(comm_bound(plan, result.get(m.NUM_PARAMS, 0), ctx.link))
    return result


class TrainerRun:
    """A TorchTrainer run whose window reports stream back while it runs.

    ``fit()`` blocks, so it runs in a daemon thread while this thread watches the
    report queue against a deadline. On a hang the trial returns; Tune then ends
    the trial's actor and Ray's ownership ends the controller and every worker.
    """

    def __init__(self, plan: TrialPlan, env: dict[str, str], ctx: TrialContext, name: str):
        self.marker_dir = Path(ctx.storage_path) / name / "hang-markers"
        shutil.rmtree(self.marker_dir, ignore_errors=True)  # a rerun must not see old markers
        self.plan = dataclasses.replace(plan, marker_dir=str(self.marker_dir))
        self.env, self.ctx, self.name = env, ctx, name
        self.windows: list[list[dict[str, Any]]] = []
        self.error: BaseException | None = None
        self.timings: dict[str, float] = {}

    def run(self, deadline_s: float, prune_below: float | None = None) -> dict[str, Any]:
        from ray.util.queue import Empty, Queue

        from orchestrator.callbacks import driver_queue

        reports: Queue = driver_queue()
        done = threading.Event()
        start = time.monotonic()
        thread = threading.Thread(target=self._fit, args=(reports, done), daemon=True)
        thread.start()
        try:
            while not done.is_set() or not reports.empty():
                with contextlib.suppress(Empty, std_queue.Empty):
                    self._take(reports.get(timeout=0.5), start)
                if time.monotonic() - start > deadline_s and not done.is_set():
                    return self._outcome_hang(deadline_s)
                if not done.is_set() and should_prune(self._throughputs(), prune_below):
                    return self._outcome_pruned(prune_below)
        finally:
            if done.is_set():  # a run ended early may still report: its queue goes with it
                reports.shutdown()
        self.timings["fit_s"] = time.monotonic() - start
        return self._outcome()

    def _take(self, item: list[dict[str, Any]], start: float) -> None:
        if not self.windows:
            self.timings["first_window_s"] = time.monotonic() - start
        self.windows.append(item)

    def _fit(self, reports: Any, done: threading.Event) -> None:
        try:
            self._trainer(reports).fit()
        except BaseException as e:  # classified by the watcher thread, never lost
            self.error = e
        finally:
            done.set()

    def _trainer(self, reports: Any) -> Any:
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer

        from orchestrator.callbacks import WindowCollector
        from train_fns import train_loop_per_worker

        cluster = self.ctx.config.cluster
        return TorchTrainer(
            train_loop_per_worker,
            train_loop_config=self.plan.to_dict(),
            torch_config=TorchConfig(
                backend="nccl" if self.plan.use_gpu else "gloo",
                timeout_s=int(self.plan.step_deadline_s) + 30,
            ),
            scaling_config=ScalingConfig(
                num_workers=self.plan.world_size,
                use_gpu=self.plan.use_gpu,
                resources_per_worker={"CPU": cluster.cpus_per_worker}
                | ({"GPU": 1} if self.plan.use_gpu else {}),
            ),
            run_config=RunConfig(
                name=self.name,
                storage_path=self.ctx.storage_path,
                worker_runtime_env={"env_vars": self.env},
                callbacks=[WindowCollector(reports)],
                failure_config=FailureConfig(max_failures=0),
            ),
        )

    def _outcome(self) -> dict[str, Any]:
        from orchestrator.outcome import classify_failure, failure_texts, summarize

        peak = max((w[m.PEAK_MEM_BYTES] for r in self.windows for w in r), default=None)
        if self.error is not None:
            state, reason = classify_failure(self.error, self.plan, peak, self._hang_markers())
            detail = "\n".join(failure_texts(self.error))[-4000:]
            return {m.STATE: state, m.REASON: reason, "failure": detail, "timings": self.timings}
        if len(self.windows) < self.plan.num_windows:
            return {
                m.STATE: m.ERROR,
                m.REASON: f"{len(self.windows)} of {self.plan.num_windows} windows reported",
            }
        return {
            m.STATE: m.COMPLETE,
            m.REASON: "",
            **summarize(self.windows, self.plan),
            "timings": self.timings,
        }

    def _hang_markers(self) -> list[str]:
        """What the workers' watchdogs left before ending themselves (empty: no hang)."""
        if not self.marker_dir.is_dir():
            return []
        return [p.read_text().strip() for p in sorted(self.marker_dir.glob("hang-rank*.txt"))]

    def _throughputs(self) -> list[float]:
        return window_throughputs(self.windows, self.plan.global_batch)

    def _outcome_pruned(self, threshold: float) -> dict[str, Any]:
        shown = ", ".join(f"{t:.1f}" for t in self._throughputs())
        return {
            m.STATE: m.PRUNED,
            m.REASON: (
                f"windows at {shown} samples/s, all below {threshold:.1f} (the best so far "
                "minus 3x the measured noise, at least 5% each); stopped early"
            ),
            "window_samples_per_s": self._throughputs(),
            "timings": self.timings,
        }

    def _outcome_hang(self, deadline_s: float) -> dict[str, Any]:
        return {
            m.STATE: m.HANG,
            m.REASON: (
                f"no result within trial_timeout_s={deadline_s:g}s "
                f"({len(self.windows)} of {self.plan.num_windows} windows); the worker group "
                "was ended with the trial"
            ),
            "timings": self.timings,
        }


def storage_dir(out_dir: Path) -> str:
    """Where each trial's TorchTrainer keeps its run state."""
    return str((out_dir / "trials").resolve())
