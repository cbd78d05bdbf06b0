"""From a config to the TrialPlan its workers run: shared by the search and training runs.

The search adds the sampled knobs of each configuration (``search.trial.derive_plan``); a
training run adds the tuned ones from best.yaml. Either way the fixed global batch is split
here, once, and an impossible split is an ``InfeasiblePlan``.
"""

from __future__ import annotations

from typing import Any

from orchestrator.config import Config
from train_fns.models import default_task, resolve_model_config
from train_fns.plan import DDPOptions, FSDPOptions, TrialPlan, split_global_batch


def resolve_task(config: Config) -> str:
    """The task from the config, or inferred from the model (causal LMs train with clm)."""
    if config.workload.task:
        return config.workload.task
    hf = resolve_model_config(config.workload.model, config.workload.model_overrides)
    return default_task(hf)


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
