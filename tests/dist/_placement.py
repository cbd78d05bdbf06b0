"""The placement guard: every collective's tensors live on the device the backend serves.

NCCL takes CUDA tensors on the rank's own device only, so a tensor left on the default device
(the CPU) fails a GPU run at its first collective, while gloo, which serves the CPU, hides the
bug from every CPU test. The guard catches it on CPU in two layers:

- ``check_collectives`` wraps the ``torch.distributed`` collectives (the module attributes
  that train_fns and FSDP2 call) so that each checks its tensors against ``collective_device``
  of its group. On a real NCCL run that is the whole rule; on gloo it is CPU == CPU.
- ``SimulatedAccelerator`` makes the gloo run model a GPU worker, where the default device and
  the served device differ. CPU torch has no second device to put tensors on, so the mode
  tracks which tensors *would* sit on the default device on a GPU worker: those made by a
  factory call that names no device (``torch.tensor(values)``), by ``.cpu()``, and what is
  computed from such tensors only (torch computes on the inputs' device; one served-device
  input moves the result there). ``.to(device)`` with a named device, or a factory call with
  ``device=...``, is trusted to name the served device (a hard-coded ``"cpu"`` would slip
  through: on CPU it cannot be told from ``collective_device()``). A collective given such a
  default-placed tensor fails, naming the collective and the fix.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.overrides import TorchFunctionMode

from train_fns.ranks import collective_device

TAG = "_commtune_default_placed"
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
    "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "reduce", "all_to_all",
    "all_to_all_single", "gather", "scatter", "send", "recv", "isend", "irecv",
)  # fmt: skip
FACTORIES = frozenset({
    torch.tensor, torch.as_tensor, torch.scalar_tensor, torch.zeros, torch.ones, torch.empty,
    torch.full, torch.arange, torch.linspace, torch.eye, torch.rand, torch.randn,
    torch.randint, torch.randperm, torch.from_numpy,
})  # fmt: skip


class PlacementError(RuntimeError):
    """A collective was handed a tensor that is not on the device its backend serves."""


def _tensors(value: Any) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def default_placed(tensor: Tensor) -> bool:
    """Whether ``tensor`` would be on the default device (CPU) on a GPU worker."""
    return bool(getattr(tensor, TAG, False))


def _names_device(args: tuple, kwargs: dict) -> bool:
    """Whether a ``Tensor.to`` call names a target device (not just a dtype)."""
    targets = [*args[1:], kwargs.get("device"), kwargs.get("other")]
    return any(isinstance(t, torch.device | str | Tensor) for t in targets)


def _would_be_default(func: Callable, args: tuple, kwargs: dict) -> bool:
    if func in FACTORIES:
        return kwargs.get("device") is None
    if func is Tensor.cpu:
        return True
    if func is Tensor.cuda or (func is Tensor.to and _names_device(args, kwargs)):
        return False
    name = getattr(func, "__name__", "")
    if args and isinstance(args[0], Tensor) and (name.startswith("__i") or name.endswith("_")):
        return default_placed(args[0])  # in place: the result lives where self lives
    inputs = list(_tensors((args, kwargs)))
    return bool(inputs) and all(default_placed(t) for t in inputs)


class SimulatedAccelerator(TorchFunctionMode):
    """Tags each tensor that a GPU worker would hold on the default device (module doc)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        mark = _would_be_default(func, args, kwargs)
        for tensor in _tensors(out):
            if mark or default_placed(tensor):
                with contextlib.suppress(AttributeError):  # some subclasses refuse attributes
                    setattr(tensor, TAG, mark)
        return out


def _checked(name: str, collective: Callable) -> Callable:
    signature = inspect.signature(collective)

    @functools.wraps(collective)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        group = bound.arguments.get("group")
        served = collective_device(group)
        for tensor in _tensors(dict(bound.arguments)):
            if default_placed(tensor) or tensor.device != served:
                where = "the default device" if default_placed(tensor) else str(tensor.device)
                raise PlacementError(
                    f"dist.{name} got a tensor on {where}; the {dist.get_backend(group)} "
                    f"backend serves {served} (NCCL: the rank's CUDA device): create it with "
                    "device=train_fns.ranks.collective_device(group)"
                )
        return collective(*args, **kwargs)

    wrapper.placement_checked = True
    return wrapper


def check_collectives() -> None:
    """Wrap this process's ``torch.distributed`` collectives with the placement check."""
    for name in COLLECTIVES:
        collective = getattr(dist, name, None)
        if collective is not None and not hasattr(collective, "placement_checked"):
            setattr(dist, name, _checked(name, collective))
