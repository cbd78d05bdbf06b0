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
DDP leaves it: AdamW skips it rather than decaying it). Used means reached by the outputs'
autograd graph, as DDP finds it (a tied or functionally used parameter counts), agreed over
the training communicator. Measured on 2 gloo ranks (tests/dist/test_unused_parameters.py):
the losses of one process on the same micro-batches, with and without accumulation.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from train_fns.ranks import collective_device


class UnusedParameters:
    """Installed on a model right after ``fully_shard`` of its root; ``settle`` before each
    optimizer step, ``forget`` after a forward whose gradients are discarded."""

    def __init__(self, model: nn.Module) -> None:
        self.params = list(model.parameters())  # each once, tied ones too
        index = {id(p): i for i, p in enumerate(self.params)}
        self.slots = [(m, name, index[id(p)]) for m in model.modules()
                      for name, p in m.named_parameters(recurse=False)]  # fmt: skip
        self.used = [False] * len(self.params)
        # first among the root's forward hooks: before FSDP2's, while parameters are unsharded
        model.register_forward_hook(self._after_forward, prepend=True)

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> Any:
        """Mark what the output depends on (autograd reachability, as DDP finds unused
        parameters), then add zero times every parameter to each floating output."""
        slot_of = {id(m._parameters[name]): i for m, name, i in self.slots}  # unsharded now
        for leaf in _reachable_leaves(output):
            if id(leaf) in slot_of:
                self.used[slot_of[id(leaf)]] = True
        zero = sum(p.sum() for p in module.parameters()) * 0.0
        return _add_to_floats(output, zero)

    def forget(self) -> None:
        """Drop what a forward marked whose gradients were discarded (a no-sync reference)."""
        self.used = [False] * len(self.params)

    def settle(self) -> None:
        """Drop the gradients of parameters no rank used since the last call (every rank calls
        it at the same point). Inside the measured step, so over the training communicator as
        DDP's ``find_unused_parameters`` agrees its own map, not over the gloo side group (a
        host round trip DDP does not pay: FSDP would be measured slower for it); a float32
        sum, which every forced NCCL algorithm runs (NVLS included)."""
        flags = torch.tensor(self.used, dtype=torch.float32, device=collective_device())
        if dist.is_initialized():  # one process alone (no group) agrees with itself
            dist.all_reduce(flags)
        used = flags.tolist()
        for param, flag in zip(self.params, used, strict=True):
            if not flag:
                param.grad = None
        self.forget()


def _reachable_leaves(output: Any) -> list[Tensor]:
    """The leaf tensors (parameters) the autograd graph of ``output``'s tensors reaches."""
    todo = [t.grad_fn for t in _tensors(output) if t.grad_fn is not None]
    seen, leaves = set(), []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad: a leaf's gradient sink
        if variable is not None:
            leaves.append(variable)
        todo.extend(child for child, _ in node.next_functions)
    return leaves


def _tensors(output: Any) -> list[Tensor]:
    if isinstance(output, Tensor):
        return [output]
    items = output.values() if isinstance(output, dict) else output
    if isinstance(output, (tuple, list, dict)):
        return [t for item in items for t in _tensors(item)]
    return []


def _add_to_floats(output: Any, zero: Tensor) -> Any:
    """``output`` with ``zero`` added to every floating tensor in it (a tensor, a tuple, list
    or mapping such as a Hugging Face ModelOutput, nested): whichever the loss uses, it
    carries every parameter."""
    if isinstance(output, Tensor):
        return output + zero if output.is_floating_point() else output
    if isinstance(output, dict):
        for key, item in output.items():
            output[key] = _add_to_floats(item, zero)
        return output
    if isinstance(output, (tuple, list)):
        items = [_add_to_floats(item, zero) for item in output]
        if isinstance(output, list):
            return items
        return type(output)(*items) if hasattr(output, "_fields") else tuple(items)
    return output
