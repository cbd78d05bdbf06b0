"""``python -m orchestrator.search --dry-run``: rank candidate configs with the cost model,
without a cluster.

The candidates are those the search seeds from (``proposer.ranked_candidates``: the config's
distinct plan knobs, in a GPU/NCCL context of ``--nodes`` nodes), ranked the same way: the
model's size counted on the meta device (no memory, no weights), compute per sample from
``costmodel.compute_s_per_sample`` (6 x params x seq_len FLOPs) at the given TFLOP/s, each
one's samples/s predicted on the given link (by default, the search's nominal figures). The
baseline and the seeds the search would start with are marked. It explains DDP vs FSDP
traffic in bytes; it does not replace a measurement.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Any

from orchestrator.config.inputs import check_range
from orchestrator.config.schema import Config, ConfigError
from orchestrator.planning.costmodel import LINKS, Link, ModelSize, knob_traffic
from orchestrator.planning.from_config import check_entrypoint
from orchestrator.search.context import space_for
from orchestrator.search.proposer import (
    NOMINAL_TFLOPS,
    nominal_compute_s,
    nominal_link,
    ranked_candidates,
    search_seeds,
    seed_count,
)
from search_spaces import PLAN_KNOBS


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


@dataclass(frozen=True)
class Ranking:
    """What a dry run shows: every configuration the search seeds from, ranked."""

    link: Link
    tflops: float
    ranked: list[tuple[float, dict[str, Any]]]
    """Predicted samples/s and params, best first (``proposer.ranked_candidates``)."""
    baseline: dict[str, Any]
    seeds: list[dict[str, Any]]
    """What the search runs after the baseline, on this link (``proposer.cost_model_seeds``)."""

    def mark(self, params: dict[str, Any]) -> str:
        return "baseline" if params == self.baseline else "seed" if params in self.seeds else ""


def ranking(
    config: Config, nodes: int, link: Link | None, tflops: float | None, size: ModelSize
) -> Ranking:
    """The search's candidates over ``nodes`` nodes, on GPU workers where the config says so
    (``cluster.use_gpu: auto``: where this machine has one), ranked as the search ranks them.
    No link or TFLOP/s: the live search's own nominal figures, so the seeds are the ones it
    runs without a probe."""
    use_gpu = config.cluster.use_gpu
    if not isinstance(use_gpu, bool):  # auto: the dry run sees this machine only
        use_gpu = shutil.which("nvidia-smi") is not None
    space = space_for(config, use_gpu=use_gpu, num_nodes=nodes)
    link = link or nominal_link(space.context)
    seq_len = config.workload.seq_len
    seeds = search_seeds(space, size, seq_len, seed_count(config), link, tflops)
    compute_s = nominal_compute_s(space.context, size, seq_len, tflops)
    ranked = ranked_candidates(space, size, link, compute_s)
    return Ranking(link, tflops or NOMINAL_TFLOPS[use_gpu], ranked, space.baseline(), seeds)


def check_dry_run(config: Config, link_name: str | None, nodes: int, tflops: float | None) -> None:
    """The dry run's own options, checked with the cheap checks (before the model is built)."""
    if link_name is not None and link_name not in LINKS:
        raise ConfigError("--link", f"{link_name!r}; use one of {', '.join(LINKS)}")
    # 0 nodes divided by zero; more nodes than ranks is none
    check_range("--nodes", nodes, 1, config.cluster.num_workers)
    if tflops is not None:
        check_range("--tflops", tflops, 1e-3, 1e6)  # 0 divided by zero; nan ranked nothing


def dry_run(config: Config, link_name: str | None, nodes: int, tflops: float | None) -> list:
    """The ranked lines a dry run prints: the ten best, and wherever they rank, the baseline
    and the seeds the search would start with."""
    check_dry_run(config, link_name, nodes, tflops)
    world = config.cluster.num_workers
    size = model_size(config)
    found = ranking(config, nodes, LINKS[link_name] if link_name else None, tflops, size)
    link = found.link
    lines = [f"dry run: {size.name} ({size.num_params / 1e6:.0f}M params), {world} ranks on "
             f"{link.name} ({link.bandwidth_bytes_per_s / 1e9:g} GB/s), {found.tflops:g} "
             f"TFLOP/s per rank; {len(found.ranked)} distinct plans, best first (predicted, "
             "not measured; NCCL variables are not modelled). The search starts with the "
             f"baseline and the {len(found.seeds)} seed(s) marked"]  # fmt: skip
    for rank, (throughput, params) in enumerate(found.ranked, start=1):
        mark = found.mark(params)
        if rank > 10 and not mark:
            continue
        traffic = knob_traffic(params, size, world, link, precision=config.workload.precision)
        shown = ", ".join(f"{k}={v}" for k, v in sorted(params.items()) if k in PLAN_KNOBS)
        lines.append(f"{rank:3d}. {throughput:9.1f} samples/s {mark:>8}  {{{shown}}}")
        lines.append(f"      {traffic.summary()}")
    return lines
