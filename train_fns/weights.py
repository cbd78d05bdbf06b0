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

from train_fns.ranks import reduce_over_ranks, side_group

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


def on_meta_everywhere(model: nn.Module) -> bool:
    """``on_meta``, agreed by every rank (a collective in a process group): a rank that built
    its model for real would skip the broadcasts its peers wait in, so a model on meta on some
    ranks only stops every rank, saying so."""
    mine = on_meta(model)
    if not dist.is_initialized():
        return mine
    some, not_all = reduce_over_ranks([float(mine), float(not mine)], "max")
    if some and not_all:
        raise RuntimeError(
            "the model is on the meta device on some ranks only: a workload builds it on meta "
            "on every rank (and returns `full_state` on rank 0) or on none"
        )
    return mine


def full_state(model: nn.Module) -> dict[str, Tensor]:
    """What rank 0 hands a meta build: ``model``'s state dict and its non-persistent buffers
    (rotary frequencies, position ids), which a state dict leaves out and a meta build lacks;
    a buffer several modules share under each of its names."""
    state = model.state_dict()
    for name, buffer in model.named_buffers(remove_duplicate=False):
        state.setdefault(canonical_name(name), buffer)
    return state


def whole_state(build: Callable[[], nn.Module]) -> dict[str, Tensor]:
    """``full_state`` of the model ``build()`` makes for real, the global generators as they
    were before it: rank 0's whole build draws its initial weights from them where the other
    ranks' meta builds draw nothing, so whatever a workload draws after it (synthetic data, a
    dropout mask) would otherwise differ on rank 0 alone."""
    with torch.random.fork_rng(devices=[]):
        return full_state(build())


def _persistent(model: nn.Module) -> set[str]:
    """The canonical names a state dict holds (parameters and persistent buffers)."""
    return {canonical_name(name) for name in model.state_dict()}


def _problem(model: nn.Module, state: Mapping[str, Tensor] | None) -> str | None:
    """Why rank 0's ``state`` cannot fill the meta-built ``model`` (None: it can): no state,
    values that are not real tensors (None, an object, a meta tensor: a ``full_state`` of the
    meta model itself), missing, unexpected or misshapen names, judged before any rank
    allocates or waits. Whatever goes wrong while judging is the answer too: the peers wait
    for it in ``_stop_alike``, and an exception here would leave them waiting."""
    if state is None:
        return ("the model is on the meta device but rank 0 has no weights for it: a workload "
                "that builds its model on meta returns `full_state` (the whole model's state "
                "dict) on rank 0")  # fmt: skip
    try:
        return _misfits(model, state)
    except Exception as e:  # said on every rank, never raised on rank 0 alone
        return f"rank 0's full_state could not be read: {type(e).__name__}: {e}"


def _misfits(model: nn.Module, state: Mapping[str, Tensor]) -> str | None:
    """``_problem`` for a given state: what of it does not fit the model."""
    unreal = sorted(name for name, t in state.items()
                    if not isinstance(t, Tensor) or t.is_meta)  # fmt: skip
    if unreal:
        return (f"rank 0's full_state holds values that are not real tensors: {_names(set(unreal))}"
                " (a whole build's state dict, not the meta model's)")  # fmt: skip
    want = {canonical_name(n): tuple(t.shape) for n, t in model.state_dict().items()}
    want.update((canonical_name(n), tuple(b.shape))
                for n, b in model.named_buffers(remove_duplicate=False))  # fmt: skip
    got = {name: tuple(t.shape) for name, t in state.items()}
    missing, unexpected = want.keys() - got.keys(), got.keys() - want.keys()
    faults = [f"missing {_names(missing)}"] if missing else []
    faults += [f"unexpected {_names(unexpected)}"] if unexpected else []
    faults += [f"{name} is {list(got[name])}, the model's {list(want[name])}"
               for name in sorted(want.keys() & got.keys()) if got[name] != want[name]]  # fmt: skip
    if not faults:
        return None
    return f"rank 0's full_state does not fit the model: {'; '.join(faults[:4])}"


def _names(names: set[str], shown: int = 4) -> str:
    """Up to ``shown`` of ``names``, sorted, and how many more."""
    first = sorted(names)[:shown]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(first) + more


def _stop_alike(problem: str | None) -> None:
    """Raise rank 0's ``problem`` on every rank (a collective in a process group), so that no
    rank waits in a broadcast a failed peer never joins."""
    if dist.is_initialized():
        said = [problem]
        dist.broadcast_object_list(said, src=0, group=side_group())
        problem = said[0]
    if problem is not None:
        raise RuntimeError(problem)


def _keeping_ties(model: nn.Module, move: Callable[[], object]) -> None:
    """Run ``move`` (``to_empty``, or a load that assigns) and tie again the tensors that were
    one object before: leaving meta, each slot gets a new tensor, and an untied LM head would
    get its own gradient and no update from the embedding, a shared buffer a copy per module."""
    slots = [(owner, name, id(tensor)) for module in model.modules()
             for owner in (module._parameters, module._buffers)
             for name, tensor in owner.items() if tensor is not None]  # fmt: skip
    move()
    first: dict[int, Tensor] = {}
    for owner, name, key in slots:
        owner[name] = first.setdefault(key, owner[name])


def _assign(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Make ``state``'s tensors the model's own (no copy): parameters and persistent buffers
    through ``load_state_dict(assign=True)``, the other buffers slot by slot."""
    kept = _persistent(model)
    model.load_state_dict({k: v for k, v in state.items() if k in kept}, assign=True)
    for prefix, module in model.named_modules(remove_duplicate=False):
        for name in list(module._buffers):
            key = canonical_name(f"{prefix}.{name}".lstrip("."))
            if key not in kept and module._buffers[name] is not None:
                module._buffers[name] = state[key]


def materialise(
    model: nn.Module, state: Mapping[str, Tensor] | None, device: torch.device, sharded: bool
) -> None:
    """Give a meta-built ``model`` rank 0's weights ``state`` (``full_state`` of a whole build;
    None on the other ranks), checked on rank 0 first. Without a process group (the driver's
    check) the model takes ``state``'s tensors themselves, not a second copy. In a group
    (every rank calls this at the same point: collectives) it gets storage on ``device``;
    ``sharded``: FSDP2 has cut the model, and every rank keeps its slice of each broadcast
    tensor; else only rank 0's parameters are filled, for DDP's constructor to broadcast.
    Every buffer is then broadcast from rank 0, in the order the model registered them."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    _stop_alike(_problem(model, state) if rank == 0 else None)
    if not dist.is_initialized():
        _keeping_ties(model, lambda: _assign(model, state))
        return
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
            dist.broadcast(buffer, src=0)
