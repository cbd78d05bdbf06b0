"""The tuned result for your own training loop: ``from train_fns import tuned``.

commtune's search writes ``best.yaml``; these three calls carry it into a loop commtune does not
run (a Ray Train ``train_loop_per_worker`` of your own, or a torchrun script)::

    best = tuned.load("runs/my-study/best.yaml")
    micro_batch, accumulation = tuned.split(best, world_size)   # that size's entry, batch fixed
    model = tuned.wrap(model, best)            # DDP with the tuned buckets, or FSDP2 sharding
    trainer = TorchTrainer(..., run_config=RunConfig(
        worker_runtime_env={"env_vars": tuned.worker_env(best)}))  # NCCL reads them at start

``best.env`` stays for launchers that are not Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from search_spaces import env_strings
from search_spaces.guarded_yaml import load_yaml, read_capped
from train_fns.plan import TrialPlan, knob_fields
from train_fns.size_fit import Fitted, Layout, entries_of, fit, gathered_layout

Best = Mapping[str, Any]


def load(path: str | Path) -> dict[str, Any]:
    """A best.yaml (or any complete commtune config) as a mapping, read as every file a user
    hands commtune is: capped and guarded (``search_spaces.guarded_yaml``)."""
    data = load_yaml(read_capped(Path(path).expanduser()))
    if not isinstance(data, dict) or "workload" not in data:
        raise ValueError(f"{path}: not a commtune config (no workload section)")
    return data


def fitted(best: Best, world_size: int, num_nodes: int = 1, even: bool | None = None) -> Fitted:
    """The entry of ``best`` for ``world_size`` (its own in ``sizes``, else the nearest; the
    top level is the entry for ``cluster.num_workers``) fitted to ``num_nodes`` nodes: what
    ``orchestrator.train`` runs at that size (``train_fns.size_fit``; ``fitted.line`` says it)."""
    workload, search = best["workload"], best.get("search") or {}
    cluster = best.get("cluster") or {}
    top = int(cluster.get("num_workers", world_size))
    entries = entries_of(top, best.get("tuned") or {}, best.get("env") or {},
                         best.get("sizes") or {})  # fmt: skip
    strategy = str(best.get("strategy", "ddp")).replace("search", "ddp")
    context = {"global_batch": int(workload["global_batch"]), "strategy": strategy,
               "use_gpu": torch.cuda.is_available(), "nvswitch": bool(cluster.get("nvswitch")),
               "unsafe_nccl": bool(search.get("unsafe_nccl")), "lossy": bool(search.get("lossy")),
               "precision": str(workload.get("precision", "fp32")),
               "unused_parameters": bool(workload.get("unused_parameters"))}  # fmt: skip
    even = world_size % num_nodes == 0 if even is None else even  # the nodes hold as many ranks
    return fit(entries, Layout(world_size, num_nodes, even), context)


def split(best: Best, world_size: int) -> tuple[int, int]:
    """``(micro_batch, accumulation_steps)`` for ``world_size`` workers, the global batch fixed:
    the split of the size's entry at its size, else the largest micro-batch up to the entry's
    that divides exactly (what ``orchestrator.train`` does when the world resizes)."""
    found = fitted(best, world_size).split
    if found is None:
        raise ValueError(
            f"global_batch={best['workload']['global_batch']} cannot be split over "
            f"{world_size} workers; use a world size that divides it"
        )
    accumulation, micro = found
    return micro, accumulation


def worker_env(best: Best, world_size: int | None = None, num_nodes: int = 1) -> dict[str, str]:
    """The tuned environment variables, for ``RunConfig(worker_runtime_env={"env_vars": ...})``
    or the environment of a torchrun launch (every process must start with them), checked as
    every other route checks them (``search_spaces.env_strings``): a hand-edited best.yaml
    cannot pass ``LD_PRELOAD`` or a YAML ``true`` that NCCL would read as 0. With
    ``world_size``, the variables of that size's entry that ``num_nodes`` nodes can run."""
    unsafe = bool((best.get("search") or {}).get("unsafe_nccl", False))
    env = best.get("env") or {} if world_size is None else fitted(best, world_size, num_nodes).env
    return env_strings(env, unsafe)


def plan_for(
    best: Best, world_size: int, num_nodes: int = 1, even: bool | None = None
) -> TrialPlan:
    """The TrialPlan of ``best`` at ``world_size`` on ``num_nodes`` nodes (what ``wrap``
    applies): that size's entry, fitted."""
    entry = fitted(best, world_size, num_nodes, even)
    if entry.split is None:
        split(best, world_size)  # raises, saying why
    accumulation, micro = entry.split
    workload = best["workload"]
    default = str(best.get("strategy", "ddp")).replace("search", "ddp")
    return TrialPlan(
        model=str(workload.get("entrypoint") or workload.get("model")),
        task=None,
        seq_len=int(workload.get("seq_len", 1)),
        global_batch=int(workload["global_batch"]),
        world_size=world_size,
        accumulation_steps=accumulation,
        micro_batch=micro,
        precision=str(workload.get("precision", "fp32")),
        **knob_fields(entry.tuned, workload.get("unused_parameters"), default),
        use_gpu=torch.cuda.is_available(),
        unused_parameters=bool(workload.get("unused_parameters")),
    )


def wrap(
    model: nn.Module,
    best: Best,
    device: torch.device | None = None,
    blocks: list[nn.Module] | None = None,
    full_state: Mapping[str, Tensor] | None = None,
) -> nn.Module:
    """``model`` on ``device`` (default: this rank's GPU, else CPU), wrapped as tuned: DDP with
    the tuned bucket settings, or FSDP2 with the tuned sharding, activation checkpointing on
    ``blocks`` (default: the largest ModuleList of same-class modules). Needs an initialised
    process group, as Ray Train and torchrun give. A model built on the meta device takes
    rank 0's ``full_state`` (``train_fns.weights.whole_state(build)``: a real build's, the random
    generators left as the meta ranks' are; None on the other ranks), as a workload's does in a
    trial."""
    from train_fns.strategies import wrap_model

    world = torch.distributed.get_world_size()
    layout = gathered_layout(world)
    if device is None:
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    plan = plan_for(best, world, layout.nodes, layout.even)
    return wrap_model(model, plan, device, blocks, full_state)


def before_step(model: nn.Module) -> None:
    """Call between the last backward and ``optimizer.step()`` with a model ``wrap`` sharded
    with FSDP2 whose steps leave parameters unused: a parameter no rank used in the step then
    gets no gradient, as DDP leaves it (``train_fns.unused``); on every other model, nothing.
    Every rank must call it (an all-reduce)."""
    unused = getattr(model, "commtune_unused", None)
    if unused is not None:
        unused.settle()
