"""Data-parallel strategies: DDP or FSDP2 ``fully_shard``, with optional activation checkpointing.

Everything here is an *exact* knob (buckets, sharding, prefetch, HSDP and checkpointing change
where and when bytes move, never the gradients; the dist tests check this against a single
process) except the opt-in lossy ones: DDP's compression hooks and FSDP's low reduce dtype.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from train_fns.plan import TrialPlan
from train_fns.unused import UnusedParameters
from train_fns.weights import materialise, on_meta_everywhere
from train_fns.workload import default_blocks

LOW_PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def apply_activation_checkpointing(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """Wrap each transformer block so its activations are recomputed in backward.

    Torch's non-reentrant ``checkpoint_wrapper`` is used rather than HF's
    ``gradient_checkpointing_enable``: it is applied before ``fully_shard`` (as torchtitan
    does), so FSDP2's all-gather hooks sit outside the recomputed region, and it works the same
    under DDP. Non-reentrant checkpointing restores the RNG state, so dropout masks (and thus
    gradients) are unchanged. Returns the wrapped blocks, each in its block's place.
    """
    wrapped = [checkpoint_wrapper(b, checkpoint_impl=CheckpointImpl.NO_REENTRANT) for b in blocks]
    replace_modules(model, dict(zip(map(id, blocks), wrapped, strict=True)))
    return wrapped


def replace_modules(model: nn.Module, new: dict[int, nn.Module]) -> None:
    """Put ``new[id(child)]`` where each such child sits in the model (its parent's attribute
    or container slot); raise when one of them is not inside the model."""
    found = set()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in new:
                setattr(parent, name, new[id(child)])
                found.add(id(child))
    if found != set(new):
        raise ValueError("a block is not a submodule of the model (blocks must be inside it)")


COMM_HOOKS = {
    "bf16": default_hooks.bf16_compress_hook,
    "fp16": default_hooks.fp16_compress_hook,
}
"""``DDPOptions.comm_hook``: each casts a bucket to 16 bits, all-reduces it and casts the mean
back (half the bytes; gradients rounded: lossy). torch 2.13 registers the bf16 hook only on
CUDA with NCCL >= 2.10 (or XPU), so it is an NCCL knob; fp16 runs on gloo too."""
SYNC_BUFFERS_ARG = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else "broadcast_buffers"
)
"""``DDPOptions.broadcast_buffers`` as torch spells it: torch 2.13 deprecates
``broadcast_buffers`` for ``forward_sync_buffers``, which still syncs buffers once at
construction (every rank starts equal, as the guard needs) and skips the per-forward sync."""


def _wrap_ddp(model: nn.Module, plan: TrialPlan, device: torch.device) -> nn.Module:
    ddp = DistributedDataParallel(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        bucket_cap_mb=plan.ddp.bucket_cap_mb,
        gradient_as_bucket_view=plan.ddp.gradient_as_bucket_view,
        static_graph=plan.ddp.static_graph,
        find_unused_parameters=plan.ddp.find_unused_parameters,
        **{SYNC_BUFFERS_ARG: plan.ddp.broadcast_buffers},
    )
    if plan.ddp.comm_hook is not None:
        ddp.register_comm_hook(None, COMM_HOOKS[plan.ddp.comm_hook])  # None: the default group
    return ddp


def rebucket(module: nn.Module, plan: TrialPlan, device: torch.device) -> nn.Module:
    """``module`` (a DDP wrapper's own) wrapped anew with ``plan``'s buckets (tuning while
    training, ``train_fns.online``): a collective, every rank at the same step, between steps
    with the gradients freed (a bucket view would outlive its bucket). The old wrapper's
    reducer removes its gradient hooks when it is freed, which the caller sees to first; the
    parameters are the same tensors, so the optimizer and its state carry on."""
    return _wrap_ddp(module, plan, device)


def fsdp_mesh(plan: TrialPlan, device: torch.device) -> DeviceMesh:
    """The ranks FSDP2 shards over: all of them, or under HSDP (``fsdp.hsdp``) a 2-D mesh that
    replicates across nodes and shards within one. A node's ranks are its local world
    (``LOCAL_WORLD_SIZE``/``LOCAL_RANK``, set by Ray Train and torchrun); HSDP needs every node
    to hold the same number of consecutive ranks, which is checked across ranks here."""
    if not plan.fsdp.hsdp:
        return init_device_mesh(device.type, (plan.world_size,))
    world, rank = plan.world_size, torch.distributed.get_rank()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    local_rank = int(os.environ.get("LOCAL_RANK", rank % local))
    layouts: list[tuple[int, int, int]] = [(0, 0, 0)] * world
    torch.distributed.all_gather_object(layouts, (rank, local, local_rank))
    uniform = all(n == local and r % local == lr for r, n, lr in layouts)
    if not uniform or world % local or local in (1, world):
        raise RuntimeError(
            f"fsdp.hsdp needs several nodes with the same number (> 1) of consecutive ranks "
            f"each; the ranks' (rank, local world, local rank) are {layouts}"
        )
    return init_device_mesh(
        device.type, (world // local, local), mesh_dim_names=("replicate", "shard")
    )


def _mp_policy(plan: TrialPlan) -> MixedPrecisionPolicy:
    """Compute in the plan's precision; reduce in fp32 unless ``fsdp.reduce_dtype`` opts into
    the low one (lossy: the sum of bf16 gradients is rounded at every step of the reduction)."""
    if plan.precision not in LOW_PRECISION_DTYPES:
        return MixedPrecisionPolicy()
    reduce = LOW_PRECISION_DTYPES.get(plan.fsdp.reduce_dtype, torch.float32)
    return MixedPrecisionPolicy(param_dtype=LOW_PRECISION_DTYPES[plan.precision],
                                reduce_dtype=reduce)  # fmt: skip


def set_prefetch(blocks: list[nn.Module], forward: int, backward: int) -> None:
    """Explicit FSDP2 prefetch: block k all-gathers the next ``forward`` blocks before its
    forward and the previous ``backward`` blocks before its backward (0 keeps FSDP2's implicit
    schedule, which gathers one block ahead in backward and relies on the CPU running ahead in
    forward)."""
    for k, block in enumerate(blocks):
        if forward:
            block.set_modules_to_forward_prefetch(blocks[k + 1 : k + 1 + forward])
        if backward:
            block.set_modules_to_backward_prefetch(blocks[max(0, k - backward) : k][::-1])


def _wrap_fsdp(
    model: nn.Module,
    plan: TrialPlan,
    device: torch.device,
    blocks: list[nn.Module],
    state: Mapping[str, Tensor] | None,
    meta: bool,
) -> nn.Module:
    """Shard each block, then the root (embeddings, tied LM head, final norm).

    ``fully_shard`` moves a block to the device only as it cuts it, so no rank ever holds the
    whole model there; a meta-built model stays on meta until it is materialised, sharded.
    One FSDP group per block lets the all-gather of block k+1 overlap block k's compute.
    Reductions stay in fp32 under mixed precision unless the plan opts into a lossy
    ``reduce_dtype``, so bf16/fp16 otherwise only changes the compute, never the gradient sum.
    A model whose steps leave parameters unused is one unit (``train_fns.unused``).
    """
    if plan.unused_parameters:
        blocks = []  # ranks running different blocks would pair different units' collectives
    options = {
        "mesh": fsdp_mesh(plan, device),
        "reshard_after_forward": plan.fsdp.reshard_after_forward,
        "mp_policy": _mp_policy(plan),
    }
    for block in blocks:
        fully_shard(block, **options)
    # the root without a reshard setting: FSDP2 then keeps it gathered from forward to
    # backward (an explicit True re-gathered it every micro-step: the embeddings and LM head,
    # or the whole model where it is one unit)
    fully_shard(model, **{**options, "reshard_after_forward": None})
    if meta:
        materialise(model, state, device, sharded=True)
    set_prefetch(blocks, plan.fsdp.forward_prefetch, plan.fsdp.backward_prefetch)
    if plan.unused_parameters:
        model.commtune_unused = UnusedParameters(model)  # StepRunner settles it each step
    return model


def wrap_model(
    model: nn.Module,
    plan: TrialPlan,
    device: torch.device,
    blocks: list[nn.Module] | None = None,
    state: Mapping[str, Tensor] | None = None,
) -> nn.Module:
    """Place ``model`` on ``device`` and wrap it for ``plan.strategy`` (process group required);
    ``blocks`` are the units FSDP2 shards and checkpointing wraps (default: the layer stack).
    A model built on the meta device is given rank 0's weights ``state`` (``train_fns.weights``;
    None on the other ranks), after sharding under FSDP2."""
    if not torch.distributed.is_initialized():
        raise RuntimeError(
            "wrap_model needs an initialised torch.distributed process group "
            "(Ray Train sets one up; tests use gloo)"
        )
    meta = on_meta_everywhere(model)
    needs_blocks = plan.activation_checkpointing or plan.strategy == "fsdp"
    if needs_blocks and blocks is None:
        blocks = default_blocks(model)
    if plan.activation_checkpointing:
        blocks = apply_activation_checkpointing(model, blocks)
    if plan.strategy == "fsdp":
        return _wrap_fsdp(model, plan, device, blocks, state, meta)
    if meta:
        materialise(model, state, device, sharded=False)
    return _wrap_ddp(model.to(device), plan, device)


@contextmanager
def sync_gradients(model: nn.Module, plan: TrialPlan, enabled: bool) -> Iterator[None]:
    """Run a backward with gradient sync on or off.

    Accumulation syncs only on the last micro-step: the earlier ones add into local
    gradients, which is what makes accumulation cheaper than a bigger world.
    """
    if isinstance(model, DistributedDataParallel):
        if enabled:
            yield
        else:
            with model.no_sync():
                yield
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        yield
    else:
        yield  # an unwrapped model has nothing to sync


def _fsdp_params(model: nn.Module) -> list:
    """FSDP2's per-parameter states (``FSDPParam``) of every sharded unit of ``model``: where
    it keeps unsharded parameters and gradients. torch 2.13 has no public view of them
    (tests/dist/test_reference_step.py and test_reference_memory.py pin their use here)."""
    return [param for module in model.modules() if isinstance(module, FSDPModule)
            for group in module._get_fsdp_state()._fsdp_param_groups
            for param in group.fsdp_params]  # fmt: skip


def discard_unsynced_gradients(model: nn.Module) -> None:
    """Drop the gradients of backwards run with sync off, so the next synced step starts clean.

    DDP keeps them in ``param.grad`` (``zero_grad`` clears them). FSDP2 keeps them unsharded in
    its own buffers (the unsharded parameter's ``grad``, or ``unsharded_accumulated_grad`` under
    a reduce dtype) until the next synced backward adds them in and reduce-scatters the sum;
    ``zero_grad`` only sees the sharded parameters, so the buffers are cleared here.
    """
    for fsdp_param in _fsdp_params(model):
        fsdp_param.unsharded_accumulated_grad = None
        if hasattr(fsdp_param, "_unsharded_param"):
            fsdp_param._unsharded_param.grad = None


def _drop_gradient(param: Tensor) -> None:
    param.grad = None


@contextmanager
def unsynced_gradients_dropped(model: nn.Module) -> Iterator[None]:
    """A backward inside drops each FSDP2 unsharded gradient as soon as autograd has made it
    (DDP and unwrapped models: nothing changes). For a backward with sync off that is only
    timed: FSDP2 would otherwise keep every full gradient until the next synced backward, the
    whole model's (fp32 under bf16) on every rank, where training holds a 1/world shard; a
    model that fits only sharded would run out of memory in it. Enter it after the forward:
    FSDP2 makes its unsharded parameters at their first all-gather."""
    handles = [param._unsharded_param.register_post_accumulate_grad_hook(_drop_gradient)
               for param in _fsdp_params(model)
               if hasattr(param, "_unsharded_param")]  # fmt: skip
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
