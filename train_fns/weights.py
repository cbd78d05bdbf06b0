"""A model's weights across ranks and wrappers: their names, and a meta-device build filled in.

Built whole on every rank, a model costs each rank of a node the full fp32 model in host memory
(eight ranks: eight copies), and moved to the GPU before sharding, FSDP2 could never train a
model larger than one GPU. A model built on the meta device holds no weights: FSDP2 cuts it
into shards first, each rank then allocates only its own shard on its device, and rank 0, the
one rank that built the model for real (seeded, or from local weights), broadcasts one tensor
at a time, of which every rank keeps its slice (torch's distributed state-dict loader). Under
DDP every rank holds the whole model anyway: rank 0 fills its copy and DDP's constructor
broadcasts its parameters, as it does for every model. The buffers are broadcast here, every one
in the order the model registered them (DDP broadcasts none under ``broadcast_buffers=False``,
FSDP2 never does), never in a set's order: a set of names iterates by their hashes, which differ
between processes (Python's hash seed), and two same-shaped buffers then arrive under each
other's names on some ranks (BERT's position and token type ids). Either way the weights are
exactly those of a whole build, so every configuration of a study starts from the same point
whatever its strategy (the correctness guard compares their losses).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from train_fns.ranks import collective_device

CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."
"""What ``checkpoint_wrapper`` inserts into parameter names; strip it to compare names."""


def canonical_name(name: str) -> str:
    """A parameter name without wrapper prefixes (DDP's ``module.``, a checkpoint wrapper's;
    FSDP2 wraps in place), equal across strategies: what a layer's gradient norm is filed
    under, what a meta build's weights are matched by, and what the distributed tests compare
    gradients by."""
    name = name.removeprefix("module.")
    return name.replace(CHECKPOINT_PREFIX, "")


def on_meta(model: nn.Module) -> bool:
    """Whether ``model`` was built on the meta device (any parameter or buffer without data)."""
    return any(t.is_meta for t in itertools.chain(model.parameters(), model.buffers()))


def full_state(model: nn.Module) -> dict[str, Tensor]:
    """What rank 0 hands a meta build: ``model``'s state dict and its non-persistent buffers
    (rotary frequencies, position ids), which a state dict leaves out and a meta build lacks."""
    state = model.state_dict()
    for name, buffer in model.named_buffers():
        state.setdefault(canonical_name(name), buffer)
    return state


def _persistent(model: nn.Module) -> set[str]:
    """The canonical names a state dict holds (parameters and persistent buffers)."""
    return {canonical_name(name) for name in model.state_dict()}


def _keeping_ties(model: nn.Module, move: Callable[[], object]) -> None:
    """Run ``move`` (``to_empty``) and tie again the parameters that were one object before
    (a tied LM head and embedding): leaving meta, ``to_empty`` makes each slot a new
    parameter, and an untied head would get its own gradient and no update from the other."""
    slots = [(module, name, id(param)) for module in model.modules()
             for name, param in module._parameters.items() if param is not None]  # fmt: skip
    move()
    first: dict[int, nn.Parameter] = {}
    for module, name, key in slots:
        param = first.setdefault(key, module._parameters[name])
        module._parameters[name] = param


def materialise(
    model: nn.Module, state: Mapping[str, Tensor] | None, device: torch.device, sharded: bool
) -> None:
    """Give a meta-built ``model`` storage on ``device`` and rank 0's weights ``state``
    (``full_state`` of a whole build; None on the other ranks). ``sharded``: FSDP2 has cut the
    model, and every rank keeps its slice of each broadcast tensor (collectives: every rank
    calls this at the same point); else only rank 0's parameters are filled, for DDP's
    constructor to broadcast. Every buffer is then broadcast from rank 0, in the order the model
    registered them. Without a process group the caller is rank 0 (the driver's check)."""
    grouped = dist.is_initialized()  # the driver checks a user's workload without a group
    rank = dist.get_rank() if grouped else 0
    has_state = torch.tensor([float(state is not None)], device=collective_device())
    if grouped:
        dist.broadcast(has_state, src=0)  # every rank stops alike, none waits in a broadcast
    if not has_state.item():
        raise RuntimeError(
            "the model is on the meta device but rank 0 has no weights for it: a workload that "
            "builds its model on meta returns `full_state` (the whole model's state dict) on rank 0"
        )
    _keeping_ties(model, lambda: model.to_empty(device=device))
    kept = _persistent(model)
    weights = {k: v for k, v in state.items() if k in kept} if rank == 0 else {}
    with torch.no_grad():
        if sharded:
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(model, weights, options=options)
        elif rank == 0:
            model.load_state_dict(weights)
        for name, buffer in model.named_buffers():  # registration order: alike on every rank
            if rank == 0:
                buffer.copy_(state[canonical_name(name)])
            if grouped:
                dist.broadcast(buffer, src=0)
