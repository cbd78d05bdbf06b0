"""FSDP2 for a model whose steps leave parameters unused (a mixture of experts, a conditional
branch): the same gradients DDP's ``find_unused_parameters`` gives.

Two things break FSDP2 on such a model. Ranks that route to different experts would run
different FSDP units, pairing one unit's all-gather or reduce-scatter with another's across
ranks; and even in one unit, FSDP2 reduce-scatters only the parameters that got a gradient, so
ranks that used different parameters reduce-scatter different sizes. So the model is sharded
as one unit (the root: every rank all-gathers and reduce-scatters the same tensors in the same
order), every parameter takes part in every forward at zero weight (each rank then has a
gradient, zero where it did not use the parameter: the sum over ranks is the true gradient),
and before the optimizer a parameter no rank used in the step gets no gradient (None, as
DDP leaves it: AdamW skips it rather than decaying it). Which modules ran is agreed over the
gloo side group. Measured on 2 gloo ranks (tests/dist/test_unused_parameters.py): the losses
of one process on the same micro-batches, with and without accumulation.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from train_fns.ranks import reduce_tensor


class UnusedParameters:
    """Installed on a model right after ``fully_shard`` of its root; ``settle`` before each
    optimizer step."""

    def __init__(self, model: nn.Module) -> None:
        self.called: set[nn.Module] = set()
        self.owners = [m for m in model.modules() for _ in m.parameters(recurse=False)]
        self.params = [p for m in model.modules() for p in m.parameters(recurse=False)]
        for module in model.modules():
            module.register_forward_pre_hook(self._called)
        # first among the root's forward hooks: before FSDP2's, while parameters are unsharded
        model.register_forward_hook(self._touch_all, prepend=True)

    def _called(self, module: nn.Module, args: Any) -> None:
        self.called.add(module)

    def _touch_all(self, module: nn.Module, args: Any, output: Any) -> Any:
        """The output plus zero times every parameter: each gets a gradient on every rank."""
        zero = sum(p.sum() for p in module.parameters()) * 0.0
        return _add_to_first_tensor(output, zero)

    def settle(self) -> None:
        """Drop the gradients of parameters no rank used since the last call (every rank calls
        it at the same point: an all-reduce over the side group)."""
        used = torch.tensor([float(m in self.called) for m in self.owners], dtype=torch.float64)
        used = reduce_tensor(used, "max").tolist()
        for param, flag in zip(self.params, used, strict=True):
            if not flag:
                param.grad = None
        self.called.clear()


def _add_to_first_tensor(output: Any, zero: Tensor) -> Any:
    """``output`` with ``zero`` added to its first floating tensor (a tensor, or the first of a
    tuple, list or mapping such as a Hugging Face ModelOutput)."""
    if isinstance(output, Tensor):
        return output + zero if output.is_floating_point() else output
    if isinstance(output, (tuple, list)):
        items = list(output)
        for i, item in enumerate(items):
            if isinstance(item, Tensor) and item.is_floating_point():
                items[i] = item + zero
                return type(output)(items) if isinstance(output, list) else tuple(items)
        return output
    if isinstance(output, dict):
        for key, item in output.items():
            if isinstance(item, Tensor) and item.is_floating_point():
                output[key] = item + zero
                return output
    return output
