"""From a config to the TrialPlan its workers run: shared by the search and training runs.

The search adds the sampled knobs of each configuration (``search.trial.derive_plan``); a
training run adds the tuned ones from best.yaml. Either way the fixed global batch is split
here, once, and an impossible split is an ``InfeasiblePlan``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.model_overrides import check_model_overrides
from orchestrator.config.schema import Config, ConfigError
from search_spaces import unreducible
from train_fns.plan import (
    InfeasiblePlan,
    TrialPlan,
    knob_fields,
    split_global_batch,
)

ENTRYPOINT_KEY = "workload.entrypoint"


def resolve_task(config: Config) -> str | None:
    """The task from the config, or inferred from the model (causal LMs train with clm);
    None for a user workload, which gives its own loss."""
    if config.workload.entrypoint is not None:
        return None
    if config.workload.task:
        return config.workload.task
    from train_fns.models import default_task, resolve_model_config

    hf = resolve_model_config(config.workload.model, config.workload.model_overrides)
    return default_task(hf)


def absolute_paths(config: Config) -> Config:
    """The config with its workload's local paths made absolute here: trials and workers run
    in folders of their own (a Tune trial's working directory), where a relative path would
    name nothing."""
    workload = config.workload
    changes: dict[str, Any] = {}
    module, sep, name = str(workload.entrypoint).rpartition(":")
    if workload.entrypoint is not None and module.endswith(".py"):
        changes["entrypoint"] = f"{Path(module).expanduser().resolve()}{sep}{name}"
    if workload.data != "synthetic":
        changes["data"] = str(Path(workload.data).expanduser().resolve())
    if workload.tokenizer:
        changes["tokenizer"] = str(Path(workload.tokenizer).expanduser().resolve())
    if Path(workload.model).expanduser().is_dir():
        changes["model"] = str(Path(workload.model).expanduser().resolve())
    return dataclasses.replace(config, workload=dataclasses.replace(workload, **changes))


@dataclass(frozen=True)
class WorkloadShape:
    """What the driver learnt building a user workload once: for the cost model's seeds."""

    num_params: int
    num_blocks: int
    unused: tuple[str, ...] = ()
    """Parameters a few micro-batches left without a gradient."""
    declared: bool | None = None
    """What the workload itself says (``unused_parameters`` in what make_workload returns)."""
    probe_failed: str | None = None
    """Why that could not be told (the user's batch or loss raised on the driver)."""


def check_model(config: Config) -> tuple[Config, list[str]]:
    """The model the workers will build, checked on the driver before Ray and after every cheap
    check (both need torch): a user workload is imported and built once on CPU; a Hugging Face
    model's overrides are checked against its config class and built on the meta device.
    Returns the config with ``workload.unused_parameters`` settled, and what to say of it."""
    if config.workload.entrypoint is None:
        check_model_overrides(config.workload)
        return config, []
    shape = check_entrypoint(config)
    if config.workload.unused_parameters is not None:
        return config, []
    if shape.probe_failed:
        return config, [f"workload: could not tell whether steps leave parameters unused "
                        f"({shape.probe_failed}); set workload.unused_parameters: true if "
                        "they do"]  # fmt: skip
    found = shape.declared if shape.declared is not None else bool(shape.unused)
    settled = dataclasses.replace(
        config, workload=dataclasses.replace(config.workload, unused_parameters=found)
    )
    if not found:
        return settled, []
    if shape.declared:
        return settled, ["workload: it declares unused_parameters: DDP runs with "
                         "find_unused_parameters=True in every plan, FSDP2 as one "
                         "unit"]  # fmt: skip
    shown = ", ".join(shape.unused[:3]) + (", ..." if len(shape.unused) > 3 else "")
    return settled, [
        f"workload: {len(shape.unused)} parameter(s) got no gradient in some micro-batches "
        f"({shown}): DDP runs with find_unused_parameters=True in every plan, the baseline "
        "too, and FSDP2 shards the model as one unit (workload.unused_parameters: true)"
    ]


def check_entrypoint(config: Config) -> WorkloadShape | None:
    """Import a user workload's entrypoint and build it once on CPU (rank 0), before Ray
    starts: a missing file or function, an import error, a raising ``make_workload`` or a
    return value without ``model``/``batch``/``loss`` is a ConfigError naming the key.
    ``batch`` and ``loss`` are not called here: a failure inside them ends its trial.

    Built once per driver process and workload (the search's input check and its cost-model
    seeds both ask): the answer is kept by what the build depends on."""
    if config.workload.entrypoint is None:
        return None
    fields = workload_fields(config)
    key = (fields["entrypoint"], fields["workload_source"], repr(sorted(fields["options"].items())),
           config.search.seed, config.cluster.num_workers, config.workload.seq_len,
           config.workload.precision, config.workload.global_batch,
           config.workload.unused_parameters)  # fmt: skip
    if key not in _SHAPES:
        _SHAPES[key] = _build_shape(config, fields)
    return _SHAPES[key]


_SHAPES: dict[tuple, WorkloadShape] = {}


def _build_shape(config: Config, fields: dict[str, Any]) -> WorkloadShape:
    import torch

    from train_fns.workload import (
        WorkloadContext,
        WorkloadError,
        as_workload,
        default_blocks,
        load_entrypoint,
    )

    ctx = WorkloadContext(
        seed=config.search.seed, rank=0, world_size=config.cluster.num_workers,
        device=torch.device("cpu"), seq_len=config.workload.seq_len,
        options=dict(config.workload.options), precision=config.workload.precision,
    )  # fmt: skip
    torch.manual_seed(config.search.seed)
    try:
        make = load_entrypoint(fields["entrypoint"], fields["workload_source"])
        workload = as_workload(make(ctx))
    except WorkloadError as e:
        raise ConfigError(ENTRYPOINT_KEY, f"{config.workload.entrypoint}: {e}") from e
    except Exception as e:  # the user's make_workload raised: say what, keep the trace chained
        raise ConfigError(
            ENTRYPOINT_KEY,
            f"{config.workload.entrypoint}: make_workload raised {type(e).__name__}: {e}",
        ) from e
    _materialise_on_driver(workload)
    try:
        blocks = workload.blocks if workload.blocks is not None else default_blocks(workload.model)
    except WorkloadError:
        blocks = []  # fine for DDP; FSDP and checkpointing say so in the trial that needs them
    num_params = sum(p.numel() for p in workload.model.parameters())
    if config.workload.unused_parameters is not None or workload.unused_parameters is not None:
        return WorkloadShape(num_params, len(blocks), declared=workload.unused_parameters)
    unused, failed = _probe_unused(workload, config)  # nobody said: look
    return WorkloadShape(num_params, len(blocks), tuple(unused), probe_failed=failed)


def _materialise_on_driver(workload: Any) -> None:
    """A model the user builds on the meta device, filled with what rank 0 hands over, so the
    probe below runs it; without ``full_state`` every worker would stop at its first trial."""
    import torch

    from train_fns.weights import materialise, on_meta

    if not on_meta(workload.model):
        return
    try:
        materialise(workload.model, workload.full_state, torch.device("cpu"), sharded=False)
    except Exception as e:  # the user's model and weights: say what failed
        raise ConfigError(ENTRYPOINT_KEY, f"make_workload's meta-device model: {e}") from e


def _probe_unused(workload: Any, config: Config) -> tuple[list[str], str | None]:
    """Which parameters a few micro-batches of up to 2 samples leave without a gradient; a
    raising batch or loss is said, not fatal (the trial that runs it shows the user's error
    where it happens)."""
    from train_fns.workload import find_unused

    per_worker = max(1, config.workload.global_batch // config.cluster.num_workers)
    try:
        return find_unused(workload, min(2, per_worker)), None
    except Exception as e:  # the user's code: reported to the user by check_model's line
        return [], f"{type(e).__name__}: {str(e)[:160]}"


def workload_fields(config: Config) -> dict[str, Any]:
    """The plan's workload fields: a file entrypoint made absolute, with its text (shipped to
    every worker, so nodes that never saw the file run what the driver checked)."""
    workload = config.workload
    if workload.entrypoint is None:
        return {"entrypoint": None, "options": {}, "workload_source": None}
    module, _, name = workload.entrypoint.rpartition(":")
    if not module.endswith(".py"):
        return {"entrypoint": workload.entrypoint, "options": dict(workload.options),
                "workload_source": None}  # fmt: skip
    path = Path(module).expanduser().resolve()
    return {
        "entrypoint": f"{path}:{name}",
        "options": dict(workload.options),
        "workload_source": _read_once(path),
    }


@functools.cache
def _read_once(path: Path) -> str:
    """A workload file's text, read once per process: every plan of a search runs the same."""
    if not path.is_file():
        raise ConfigError(ENTRYPOINT_KEY, f"{str(path)!r} is not a file")
    return path.read_text()


def plan_from_config(
    cfg: Config,
    task: str | None,
    use_gpu: bool,
    knobs: dict[str, Any],
    world: int,
    env: dict[str, str],
    **extra: Any,
) -> TrialPlan:
    """The TrialPlan of a config's workload with ``knobs`` (tuned values) on ``world`` workers
    under the workers' ``env``; ``extra`` sets the measurement fields (a trial's windows, a
    training run's steps). InfeasiblePlan where the two cannot run together."""
    accumulation = int(knobs.get("accumulation_steps", 1))
    default = cfg.strategy if cfg.strategy != "search" else "ddp"
    plan = TrialPlan(
        model=cfg.workload.entrypoint or cfg.workload.model,
        task=task,
        seq_len=cfg.workload.seq_len,
        global_batch=cfg.workload.global_batch,
        world_size=world,
        accumulation_steps=accumulation,
        micro_batch=split_global_batch(cfg.workload.global_batch, world, accumulation),
        precision=cfg.workload.precision,
        **knob_fields(knobs, cfg.workload.unused_parameters, default),
        model_overrides=dict(cfg.workload.model_overrides),
        data=cfg.workload.data,
        tokenizer=cfg.workload.tokenizer,
        use_gpu=use_gpu,
        lr=cfg.workload.lr,
        seed=cfg.search.seed,
        step_deadline_s=cfg.search.step_deadline_s,
        unused_parameters=bool(cfg.workload.unused_parameters),
        **workload_fields(cfg),
        **extra,
    )
    check_reductions(plan, env)
    return plan


def check_reductions(plan: TrialPlan, env: dict[str, str]) -> None:
    """A forced NCCL algorithm must run every all-reduce the plan issues: NVLS has no float32
    Max or Avg, so ``NCCL_ALGO=allreduce:nvls`` with fp16 FSDP2 or HSDP would fail the trial at
    its first step with "no algorithm/protocol available" (checked before a worker starts)."""
    if not plan.use_gpu:
        return  # gloo: NCCL variables are inert
    algo = env.get("NCCL_ALGO")
    missing = unreducible(algo, plan.nccl_reductions())
    if missing:
        raise InfeasiblePlan(
            f"NCCL_ALGO={algo!r} leaves only NVLS for what cannot run on it: "
            f"{', '.join(missing)}; leave NCCL_ALGO unset for this strategy, or allow a "
            "fallback (e.g. allreduce:nvls,ring)"
        )
