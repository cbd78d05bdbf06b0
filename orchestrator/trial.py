"""Trials: sampled params -> checked TrialPlan -> a real TorchTrainer run -> outcome.

``run_group`` is the Ray Tune function trainable: one Tune trial is one worker group that
measures one or more configurations (warm evaluation), each an Optuna trial of its own. It
never raises for an outcome it understands (infeasible, oom, hang, crash): it reports the
outcome with its reason, so that the search goes on and Optuna is told the truth.
"""

from __future__ import annotations

import dataclasses
import itertools
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import Config
from search_spaces import SearchSpace, is_env_name
from train_fns import metrics as m
from train_fns.models import default_task, resolve_model_config
from train_fns.plan import DDPOptions, FSDPOptions, InfeasiblePlan, TrialPlan, split_global_batch

TRIAL_NUMBER = "trial_number"
"""Config key carrying the Optuna trial number (what users see) into the trial."""
OUTCOME = "outcome"
"""Result key holding the trial's whole outcome record (state, reason, metrics, timings)."""
WORK = "work"
"""Config key of a Tune trial: the queue its configurations (``Member`` dicts) come from."""
NODES = "nodes"
"""Config key of a Tune trial: the node ids its workers must stay on (None: anywhere)."""


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


@dataclass(frozen=True)
class Member:
    """One configuration of a group: its Optuna trial number and sampled params."""

    number: int
    params: dict[str, Any]
    prune_below: float | None = None


WORK_TIMEOUT_S = 3600.0
"""How long a group waits for the searcher's next configuration before it ends."""


def run_group(config: dict[str, Any], ctx: TrialContext) -> None:
    """Tune function trainable: one worker group measuring the configurations the searcher
    puts in ``config[WORK]`` (``Member`` dicts; None ends the group), reporting one result
    per configuration as each ends; the searcher answers each with the next one.

    Configurations the group did not reach (it crashed or hung on an earlier one) are not
    reported: the searcher re-queues them.
    """
    from ray import tune

    from orchestrator.group_run import GroupRun

    def report(member: Member, outcome: dict[str, Any]) -> None:
        outcome["params"] = sampled_params(member.params, ctx.space)
        # Tune insists that the objective is in every result; the rest travels as one record.
        tune.report(
            {
                m.SAMPLES_PER_S: outcome.get(m.SAMPLES_PER_S),
                TRIAL_NUMBER: member.number,
                OUTCOME: outcome,
            }
        )

    members: list[Member] = []  # the feasible ones, in the group's order
    try:
        run = GroupRun(ctx, f"group_{tune.get_context().get_trial_id()}", config.get(NODES))
        _measure(run, _members(config[WORK], ctx, report, members), members, ctx, report)
    except Exception as e:  # a driver-side bug must not kill the search; keep its trace
        if members:  # else the searcher marks the group's first configuration
            report(members[-1], {
                m.STATE: m.ERROR,
                m.REASON: f"trial driver failed: {type(e).__name__}: {e}",
                "traceback": traceback.format_exc(limit=8),
            })  # fmt: skip


def _members(
    work: Any, ctx: TrialContext, report: Callable, taken: list[Member]
) -> Iterator[tuple[TrialPlan, dict[str, str]]]:
    """(plan, env) of each configuration the searcher sends, appended to ``taken``; infeasible
    ones are reported at once (and the searcher answers with the next)."""
    while (data := work.get(timeout=WORK_TIMEOUT_S)) is not None:
        member = Member(**data)
        try:
            plan, env = derive_plan(ctx, member.params, ctx.faults.get(member.number))
        except InfeasiblePlan as e:
            report(member, {m.STATE: m.INFEASIBLE, m.REASON: str(e), "trial_wall_s": 0.0})
            continue
        taken.append(member)
        yield dataclasses.replace(plan, prune_below=member.prune_below), env


def _measure(
    run: Any, source: Iterator, members: list[Member], ctx: TrialContext, report: Callable
) -> None:
    from orchestrator.explain import comm_bound

    def emit(index: int, outcome: dict[str, Any]) -> None:
        plan = run.plans[index]
        outcome["env"], outcome["plan"] = run.env, plan.to_dict()
        if run.nodes:
            outcome["nodes"] = run.nodes
        if outcome.get(m.STATE) == m.COMPLETE:
            outcome.update(comm_bound(plan, outcome.get(m.NUM_PARAMS, 0), ctx.link))
        report(members[index], outcome)

    run.run(source, emit)


def measure_plans(
    ctx: TrialContext,
    items: list[tuple[TrialPlan, dict[str, str]]],
    name: str,
    on_outcome: Callable[[int, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Measure plans outside the search (re-measurement, scaling), in order: consecutive plans
    with the same environment share a worker group; one not reached is an ``error``.
    ``on_outcome(position, outcome)`` is called as each one ends."""
    from orchestrator.group_run import GroupRun

    outcomes: list[dict[str, Any]] = []
    for _, run in itertools.groupby(items, key=lambda item: item[1]):
        run = list(run)
        first = len(outcomes)

        def emit(index: int, outcome: dict[str, Any], first: int = first) -> None:
            if on_outcome is not None:
                on_outcome(first + index, outcome)

        group = GroupRun(ctx, name=f"{name}_{first:02d}")
        for outcome in group.run(iter(run), emit) + [None] * (len(run) - len(group.plans)):
            outcomes.append(outcome or {m.STATE: m.ERROR, m.REASON: "not reached: the group ended"})
    return outcomes


def storage_dir(out_dir: Path) -> str:
    """Where each trial's TorchTrainer keeps its run state."""
    return str((out_dir / "trials").resolve())
