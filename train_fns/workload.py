"""The workload contract: what commtune trains, whether the user's own code or a built-in model.

A workload is a callable named in the config (``workload.entrypoint``, ``path/file.py:make`` or
``package.module:make``). ``make(ctx)`` is called on every worker after torch is seeded alike
on every rank, with a :class:`WorkloadContext`, and returns an object (or a dict) with:

- ``model``: an ``nn.Module`` on CPU or the meta device; commtune places, wraps and shards it
  (a model on meta needs ``full_state`` on rank 0);
- ``batch(indices)``: the collated samples with these global sample indices (a tensor, or a
  tuple / dict of tensors). The same index must always give the same sample: that is what keeps
  the global batch exact across splits and resumption exact;
- ``loss(model, batch)``: a scalar tensor, the mean over the batch's samples;
- optional ``blocks`` (the modules FSDP2 shards one by one and activation checkpointing wraps;
  default: the largest ``nn.ModuleList`` of same-class modules), ``tokens_per_sample`` and
  ``flops_per_sample`` (for tokens/s and model FLOP utilisation), ``optimizer(params)``
  (default AdamW at ``workload.lr``), ``full_state`` (rank 0 only, for a model built on the
  meta device: the whole model's weights, ``train_fns.weights.full_state`` of a real build;
  the other ranks never hold them, and each keeps its shard of them under FSDP2).

The built-in Hugging Face models are one workload behind the same contract (``hf_workload``), so
there is one way through the worker code.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

REQUIRED = ("model", "batch", "loss")
OPTIONAL = (
    "blocks", "tokens_per_sample", "flops_per_sample", "optimizer", "unused_parameters",
    "full_state",
)  # fmt: skip


class WorkloadError(ValueError):
    """A workload entrypoint that cannot be loaded, or a return value that breaks the contract."""


@dataclass(frozen=True)
class WorkloadContext:
    """What ``make_workload(ctx)`` is told about where it runs."""

    seed: int
    rank: int
    world_size: int
    device: torch.device
    """Where commtune will place the model (build it on CPU or meta; commtune moves it)."""
    seq_len: int | None
    options: dict[str, Any] = field(default_factory=dict)
    """``workload.options`` from the config, passed through as is."""
    precision: str = "fp32"


@dataclass
class Workload:
    """A workload checked against the contract (see the module docstring)."""

    model: nn.Module
    batch: Callable[[list[int]], Any]
    loss: Callable[[nn.Module, Any], Tensor]
    blocks: list[nn.Module] | None = None
    tokens_per_sample: int | None = None
    flops_per_sample: float | None = None
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None
    unused_parameters: bool | None = None
    """True: some steps leave parameters without a gradient (DDP must find them); None: the
    driver finds out (``find_unused``)."""
    full_state: Mapping[str, Tensor] | None = None
    """Rank 0's weights for a ``model`` built on the meta device (None: the model has its own)."""


def split_entrypoint(entrypoint: str) -> tuple[str, str]:
    """``"path/file.py:make"`` or ``"pkg.mod:make"`` -> (module part, function name)."""
    module, sep, name = entrypoint.rpartition(":")
    if not sep or not module or not name.isidentifier():
        raise WorkloadError(
            f"{entrypoint!r} is not MODULE:FUNCTION; e.g. my_workload.py:make_workload or "
            "my_package.my_module:make_workload"
        )
    return module, name


def load_entrypoint(entrypoint: str, source: str | None = None) -> Callable[[WorkloadContext], Any]:
    """The ``make_workload`` callable an entrypoint names (a file path or a module name).

    ``source``: the file's text as the driver read it, so a worker on a node that has never
    seen the file runs exactly what the driver checked."""
    module_part, name = split_entrypoint(entrypoint)
    try:
        if source is not None:
            module = _load_source(module_part, source)
        elif module_part.endswith(".py"):
            module = _load_source(module_part, _read_file(Path(module_part).expanduser()))
        else:
            module = importlib.import_module(module_part)
    except WorkloadError:
        raise
    except Exception as e:  # the user's module failed to import: say what and where
        raise WorkloadError(f"importing {module_part!r} failed: {type(e).__name__}: {e}") from e
    make = getattr(module, name, None)
    if not callable(make):
        raise WorkloadError(f"{module_part!r} has no function {name!r}")
    return make


def _read_file(path: Path) -> str:
    if not path.is_file():
        raise WorkloadError(f"{str(path)!r} is not a file")
    return path.read_text()


def _load_source(filename: str, source: str) -> Any:
    """A workload file's module, built from its text once per process (named after a hash of
    the text, so two files of the same name do not collide and a changed file is reloaded)."""
    name = f"commtune_workload_{hashlib.sha256(source.encode()).hexdigest()[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    try:
        exec(compile(source, filename, "exec"), module.__dict__)  # the user's own workload file
    except BaseException:
        del sys.modules[name]
        raise
    return module


def as_workload(value: Any) -> Workload:
    """Check what ``make_workload`` returned against the contract."""
    get = value.get if isinstance(value, Mapping) else lambda key: getattr(value, key, None)
    missing = [key for key in REQUIRED if get(key) is None]
    if missing:
        raise WorkloadError(
            f"make_workload returned {type(value).__name__} without {', '.join(missing)}; "
            "return an object or dict with model, batch(indices) and loss(model, batch)"
        )
    workload = Workload(**{key: get(key) for key in REQUIRED + OPTIONAL})
    if not isinstance(workload.model, nn.Module):
        raise WorkloadError(f"model is a {type(workload.model).__name__}, not a torch nn.Module")
    if workload.unused_parameters is not None and not isinstance(workload.unused_parameters, bool):
        raise WorkloadError(f"unused_parameters is {workload.unused_parameters!r}; return True, "
                            "False or leave it out (commtune then finds out)")  # fmt: skip
    for key in ("batch", "loss"):
        if not callable(getattr(workload, key)):
            raise WorkloadError(f"{key} must be callable")
    if workload.blocks is not None:
        workload.blocks = list(workload.blocks)
        if not all(isinstance(b, nn.Module) for b in workload.blocks):
            raise WorkloadError("blocks must be nn.Module instances inside the model")
    return workload


def default_blocks(model: nn.Module) -> list[nn.Module]:
    """The largest ``nn.ModuleList`` of same-class modules (by parameters): the layer stack
    that FSDP2 shards block by block and activation checkpointing wraps."""
    best: nn.ModuleList | None = None
    best_params = 0
    for module in model.modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        num_params = sum(p.numel() for p in module.parameters())
        if num_params > best_params:
            best, best_params = module, num_params
    if best is None:
        raise WorkloadError(
            f"{type(model).__name__} has no ModuleList of repeated blocks; return `blocks` "
            "from make_workload (the modules to shard one by one)"
        )
    return list(best)


def pinned(batch: Any, device: torch.device) -> Any:
    """A host batch in page-locked memory when it is bound for a GPU: only from there does
    ``.to(device, non_blocking=True)`` copy asynchronously instead of staging it first."""
    if device.type != "cuda":
        return batch
    return _map_tensors(batch, lambda t: t if t.is_cuda else t.pin_memory())


def to_device(batch: Any, device: torch.device) -> Any:
    """Move a batch (a tensor, or a tuple / list / dict of them) to ``device``."""
    non_blocking = device.type == "cuda"
    return _map_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


def _map_tensors(batch: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(batch, Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: _map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_map_tensors(v, fn) for v in batch)
    return batch


UNUSED_PROBE_BATCHES = 4
"""Micro-batches the driver runs through a user's model to see which parameters get no
gradient: a router that picks per micro-batch shows in a few."""


def find_unused(workload: Workload, micro_batch: int) -> list[str]:
    """Names of the trainable parameters that got no gradient in at least one of a few
    micro-batches (forward and backward on the driver's CPU build, samples 0, 1, ...): with
    such parameters DDP needs ``find_unused_parameters``. The gradients are cleared after."""
    model, unused = workload.model, set()
    for k in range(UNUSED_PROBE_BATCHES):
        model.zero_grad(set_to_none=True)
        indices = list(range(k * micro_batch, (k + 1) * micro_batch))
        workload.loss(model, workload.batch(indices)).backward()
        unused |= {n for n, p in model.named_parameters() if p.requires_grad and p.grad is None}
    model.zero_grad(set_to_none=True)
    return sorted(unused)
