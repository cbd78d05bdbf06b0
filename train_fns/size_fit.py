"""Which tuned configuration a world size runs, and what of it that size's layout cannot run.

best.yaml may hold a configuration per world size (``sizes``), each searched at its size. A
training run that (re)starts at a size runs its entry, or the nearest one, fitted to the layout
it got: every tuned value the layout cannot run (a reshard group that does not divide, HSDP on
one node, socket threads or an algorithm that needs several nodes) goes back to its default,
by the same conditions the shipped search spaces put on the search, and each is named with why.
The split is the entry's own at its size, else the largest micro-batch up to the entry's that
divides the fixed global batch exactly. The driver fits every size of the elastic range before
a worker starts (``orchestrator.config.size_entries``); each start fits again to the layout it
really got.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from train_fns.plan import TrialPlan, knob_fields, resplit

FIT_SPACES = ("accumulation", "ddp", "fsdp", "nccl", "optimizer")
"""The shipped spaces whose conditions say what a layout can run (the strategy is the entry's)."""


@dataclass(frozen=True)
class Layout:
    """Where a group's ranks are: how many, on how many nodes, as many on each node or not."""

    world: int
    nodes: int = 1
    even: bool = True


@dataclass(frozen=True)
class Fitted:
    """An entry carried to a layout: what runs, and what was dropped from it and why."""

    size: int
    """The world size the entry was tuned (and measured) at."""
    tuned: dict[str, Any]
    env: dict[str, str]
    split: tuple[int, int] | None
    """(accumulation_steps, micro_batch) at the layout's world size; None: none exists."""
    dropped: tuple[tuple[str, Any, str], ...] = ()
    samples_per_s: float | None = None
    """What the search measured for the entry at its own size (None: not recorded)."""

    def line(self, world: int) -> str:
        """One line for the run log: which entry runs, the split, and what was dropped."""
        source = "its own entry" if self.size == world else f"the entry for {self.size} workers"
        measured = f", searched at {self.samples_per_s:.1f} samples/s" if self.samples_per_s else ""
        split = "no exact split" if self.split is None else (
            f"accumulation {self.split[0]} x micro-batch {self.split[1]}")  # fmt: skip
        text = f"{world} workers run {source}{measured}: {split}"
        if self.dropped:
            text += "; dropped: " + "; ".join(f"{k}={v} ({why})" for k, v, why in self.dropped)
        return text


def entries_of(
    top: int, tuned: Mapping[str, Any], env: Mapping[str, Any], sizes: Mapping[Any, Any]
) -> dict[int, dict[str, Any]]:
    """Every entry a run may pick from: the top level's (``tuned``/``env``) at its own size
    ``top``, and ``sizes``. An entry's variables lie over the top level's: one that names none
    keeps the fixed ones (a site's interface names)."""
    entries = {top: {"tuned": dict(tuned), "env": dict(env)}}
    for size, entry in sizes.items():
        entries[int(size)] = {**entry, "env": {**env, **(entry.get("env") or {})}}
    return entries


def nearest(sizes: Mapping[int, Any], world: int) -> int:
    """The entry for ``world``: its own, else the nearest size (the smaller of two as near:
    its micro-batch was measured to fit with fewer ranks to share the model's memory)."""
    return min(sizes, key=lambda size: (abs(size - world), size))


def entry_split(entry: Mapping[str, Any], size: int, global_batch: int) -> tuple[int, int]:
    """(accumulation, micro-batch) the entry was tuned with at its own size."""
    accumulation = int(entry.get("tuned", {}).get("accumulation_steps", 1))
    return accumulation, max(1, global_batch // (size * accumulation))


def fit(
    entries: Mapping[int, Mapping[str, Any]], layout: Layout, context: Mapping[str, Any]
) -> Fitted:
    """The entry for ``layout.world`` fitted to the layout. ``context`` holds what the run
    fixes (``global_batch``, ``strategy``, ``use_gpu``, ``nvswitch``, ``unsafe_nccl``,
    ``precision``, ``lossy``, ``unused_parameters``)."""
    size = nearest(entries, layout.world)
    entry, global_batch = entries[size], int(context["global_batch"])
    tuned, env = dict(entry.get("tuned") or {}), dict(entry.get("env") or {})
    accumulation, micro = entry_split(entry, size, global_batch)
    own = size == layout.world and global_batch == layout.world * accumulation * micro
    split = (accumulation, micro) if own else resplit(global_batch, layout.world, micro)
    measured = entry.get("samples_per_s")
    fitted = Fitted(size, tuned, env, split, samples_per_s=measured and float(measured))
    if split is None:
        return fitted
    always = never_runs({**tuned, "accumulation_steps": accumulation}, env, size, context)
    tuned["accumulation_steps"] = split[0]
    dropped = [d for d in misfits(tuned, env, layout, context) if d[0] not in always]
    for key, _, _ in dropped:
        if key in env:
            del env[key]
        else:
            tuned.pop(key, None)  # the plan's default
    return dataclasses.replace(fitted, tuned=tuned, env=env, dropped=tuple(dropped))


def never_runs(
    tuned: Mapping[str, Any], env: Mapping[str, str], size: int, context: Mapping[str, Any]
) -> set[str]:
    """Keys the spaces judge unrunnable at the entry's own size on every layout it could have
    (NCCL variables on gloo, an NVLS setting where ``cluster.nvswitch`` is not declared): not
    the resize's to drop; they run as they ran before (inert, or the user knows better)."""
    layouts = [Layout(size, n) for n in range(1, size + 1) if size % n == 0]
    found = [{k for k, _, _ in misfits(tuned, env, layout, context)} for layout in layouts]
    return set.intersection(*found)


@functools.cache
def _fit_specs() -> tuple[Any, ...]:
    """The shipped spaces, read once per process (a range check fits every size on several
    layouts)."""
    from search_spaces import load_spaces

    return tuple(load_spaces(FIT_SPACES))


def misfits(
    tuned: Mapping[str, Any], env: Mapping[str, str], layout: Layout, context: Mapping[str, Any]
) -> list[tuple[str, Any, str]]:
    """(key, value, why) for each tuned value or variable ``layout`` cannot run."""
    from search_spaces import SearchContext, SearchSpace

    use_gpu = bool(context.get("use_gpu"))
    space = SearchSpace(
        _fit_specs(),
        SearchContext(
            backend="nccl" if use_gpu else "gloo",
            strategy_mode=str(tuned.get("strategy", context.get("strategy", "ddp"))),
            use_gpu=use_gpu,
            world_size=layout.world,
            num_nodes=layout.nodes,
            global_batch=int(context["global_batch"]),
            nvswitch=bool(context.get("nvswitch")),
            unsafe_nccl=bool(context.get("unsafe_nccl")),
            precision=str(context.get("precision", "fp32")),
            lossy=bool(context.get("lossy")),
            unused_parameters=bool(context.get("unused_parameters")),
            even_nodes=layout.even,
        ),
    )
    found = space.misfits({**tuned, **env}, given=("accumulation_steps",))  # the split's
    reshard = tuned.get("reshard_after_forward")
    if type(reshard) is int and (layout.world % reshard or reshard >= layout.world):
        found.append(("reshard_after_forward", reshard, f"resharding to {reshard} ranks needs a "
                      f"world size that {reshard} divides, above {reshard}"))  # fmt: skip
    first: dict[str, tuple[str, Any, str]] = {}
    for item in found:
        first.setdefault(item[0], item)
    return list(first.values())


def plan_of(template: TrialPlan, fitted: Fitted, world: int) -> TrialPlan:
    """``template`` (the run's plan: model, data, measurement) with the fitted entry's knobs
    and split at ``world`` workers. The split must exist (``fitted.split``)."""
    assert fitted.split is not None, "no split: the caller waits for another size"
    accumulation, micro = fitted.split
    return dataclasses.replace(
        template,
        world_size=world,
        accumulation_steps=accumulation,
        micro_batch=micro,
        **knob_fields(fitted.tuned, template.unused_parameters, template.strategy),
    )


def gathered_layout(world: int) -> Layout:
    """This group's layout, the same on every rank: each rank's node is its local world
    (``LOCAL_WORLD_SIZE``/``LOCAL_RANK``, as Ray Train and torchrun set them, as
    ``strategies.fsdp_mesh`` reads them), gathered over the gloo side group, so that no NCCL
    communicator exists before ``apply_env`` sets the entry's variables."""
    import torch.distributed as dist

    from train_fns.ranks import side_group

    group = side_group()
    if group is None:
        return Layout(world)
    rank = dist.get_rank()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    mine = (rank, local, int(os.environ.get("LOCAL_RANK", rank % local)))
    layouts: list[tuple[int, int, int]] = [mine] * world
    dist.all_gather_object(layouts, mine, group=group)
    nodes = {r - local_rank for r, _, local_rank in layouts}
    return Layout(world, len(nodes), len({n for _, n, _ in layouts}) == 1)


LIVE_PREFIX = "NCCL_"
"""Variables a running process still takes: NCCL reads its own as it makes a communicator,
lazily, at the first collective. The rest of a worker's allow-listed ones were read as the
process started: PYTORCH_CUDA_ALLOC_CONF by the CUDA allocator, TORCH_NCCL_* by the process
group, FI_*/GLOO_* and the like by their libraries' set-up."""


def apply_env(environ: MutableMapping[str, str], fitted: Fitted, names: set[str]) -> Fitted:
    """Set the fitted entry's NCCL variables in this process before its first NCCL collective,
    and unset those of ``names`` (every entry's) that it does not set: the worker group started
    with the configured size's. A variable read as the process started that the entry would
    change is not set (it would be silently ignored) but dropped, with the reason; returns the
    entry as this process runs it."""
    for name in names - set(fitted.env):
        if name.startswith(LIVE_PREFIX):
            environ.pop(name, None)
    late = {k: v for k, v in fitted.env.items()
            if not k.startswith(LIVE_PREFIX) and environ.get(k) != v}  # fmt: skip
    environ.update({k: v for k, v in fitted.env.items() if k not in late})
    dropped = [(k, v, f"{k} is read as the process starts (the allocator and the process group "
                f"exist already), so this process keeps {environ.get(k)!r}; a fresh start at "
                "this size would take it") for k, v in late.items()]  # fmt: skip
    env = {k: v for k, v in fitted.env.items() if k not in late}
    return dataclasses.replace(fitted, env=env, dropped=(*fitted.dropped, *dropped))
