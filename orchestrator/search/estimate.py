"""``python -m orchestrator.search --dry-run``: rank candidate configs with the cost model,
without a cluster.

Candidates are drawn from the config's search spaces (as the search would sample them, in a
GPU/NCCL context of ``--nodes`` nodes), the model's size is counted on the meta device
(no memory, no weights), compute per sample comes from ``costmodel.compute_s_per_sample``
(6 x params x seq_len FLOPs) at the given TFLOP/s, and ``costmodel.rank_candidates`` predicts
each one's samples/s on a nominal link. It explains DDP vs FSDP traffic in bytes; it does not
replace a measurement.
"""

from __future__ import annotations

from typing import Any

from orchestrator.config import Config, ConfigError
from orchestrator.costmodel import (
    LINKS,
    ModelSize,
    comm_per_step,
    compute_s_per_sample,
    rank_candidates,
)
from orchestrator.inputs import check_range
from orchestrator.plans import check_entrypoint
from search_spaces import SearchContext, SearchSpace, SpaceError, load_spaces


def model_size(config: Config) -> ModelSize:
    """Parameters and blocks of the workload's model, counted on the meta device (a user
    workload is built once on CPU by ``plans.check_entrypoint``)."""
    import torch

    shape = check_entrypoint(config)
    if shape is not None:
        return ModelSize(shape.num_params, shape.num_blocks, str(config.workload.entrypoint))

    from train_fns.models import default_task, model_class, resolve_model_config

    hf = resolve_model_config(config.workload.model, config.workload.model_overrides)
    with torch.device("meta"):
        model = model_class(config.workload.task or default_task(hf)).from_config(hf)
    params = sum(p.numel() for p in model.parameters())
    return ModelSize(params, int(getattr(hf, "num_hidden_layers", 0)), config.workload.model)


def candidates(config: Config, nodes: int, count: int) -> list[dict[str, Any]]:
    """Up to ``count`` distinct configurations the search could sample (baseline first)."""
    import optuna

    context = SearchContext("nccl", config.strategy, True, config.cluster.num_workers, nodes,
                            config.workload.global_batch, config.cluster.nvswitch,
                            config.search.unsafe_nccl, config.workload.precision,
                            config.search.lossy)  # fmt: skip
    space = SearchSpace(load_spaces(config.search.spaces), context)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=config.search.seed))
    found = [space.knobs(space.baseline())]
    for _ in range(count * 5):  # NCCL variables are not modelled: distinct plan knobs only
        knobs = space.knobs(space.suggest(study.ask()))
        if knobs not in found:
            found.append(knobs)
        if len(found) >= count:
            break
    return found


def dry_run(config: Config, link_name: str, nodes: int, tflops: float, count: int = 200) -> list:
    """The ranked lines a dry run prints."""
    if link_name not in LINKS:
        raise ConfigError("--link", f"{link_name!r}; use one of {', '.join(LINKS)}")
    world = config.cluster.num_workers
    check_range("--nodes", nodes, 1, world)  # 0 divided by zero; more nodes than ranks is none
    check_range("--tflops", tflops, 1e-3, 1e6)  # 0 divided by zero; nan ranked nothing
    try:  # the GPU/NCCL context may reach a space mistake the CPU check did not
        found = candidates(config, nodes, count)
    except SpaceError as e:
        raise ConfigError(f"search.spaces.{e.key}" if e.key else "search.spaces", str(e)) from e
    link, size = LINKS[link_name], model_size(config)
    per_sample = compute_s_per_sample(size.num_params, config.workload.seq_len, tflops)
    ranked = rank_candidates(found, size, world, link, per_sample,
                             global_batch=config.workload.global_batch)  # fmt: skip
    lines = [f"dry run: {size.name} ({size.num_params / 1e6:.0f}M params), {world} ranks on "
             f"{link.name} ({link.bandwidth_bytes_per_s / 1e9:g} GB/s), {tflops:g} TFLOP/s per "
             f"rank; {len(ranked)} distinct plans, best first (predicted, not measured; "
             "NCCL variables are not modelled)"]  # fmt: skip
    for rank, (throughput, knobs) in enumerate(ranked[:10], start=1):
        traffic = comm_per_step(
            knobs.get("strategy", "ddp"), size.num_params, 4, world,
            int(knobs.get("accumulation_steps", 1)), bool(knobs.get("reshard_after_forward", True)),
            link, bucket_bytes=int(float(knobs.get("bucket_cap_mb", 25)) * 2**20),
            num_fsdp_units=size.num_fsdp_units,
        )  # fmt: skip
        shown = ", ".join(f"{k}={v}" for k, v in sorted(knobs.items()))
        lines.append(f"{rank:3d}. {throughput:9.1f} samples/s  {{{shown}}}")
        lines.append(f"      {traffic.summary()}")
    return lines
