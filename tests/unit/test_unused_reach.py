"""Which parameters a step used, for FSDP2 on a model that leaves some unused
(``train_fns.unused``): what the outputs' autograd graph reaches, as DDP decides it, so a tied
parameter used through one of its modules and a parameter used functionally keep their
gradients, and a parameter no output reached loses its (as DDP leaves it). One process: the
side group's agreement is then the rank's own."""

from __future__ import annotations

import torch
from torch import nn

from train_fns.unused import UnusedParameters


class Tied(nn.Module):
    """A multi-task model: the LM head shares the embedding, and each step uses one head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.reg = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, task: str) -> torch.Tensor:
        h = self.emb(x).mean(1)
        return self.head(h).sum() if task == "lm" else self.reg(h).sum()


class Functional(nn.Module):
    """A router whose weights are used functionally: its module's forward never runs."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.body = nn.Linear(4, 2), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = nn.functional.linear(x, self.gate.weight, self.gate.bias).softmax(-1)
        return (weights[:, :1] * self.body(x)).sum()


def test_a_tied_parameter_used_through_its_other_module_keeps_its_gradient() -> None:
    model = Tied()
    unused = UnusedParameters(model)
    model(torch.tensor([[1, 2]]), "reg").backward()
    unused.settle()
    assert model.emb.weight.grad is not None and model.reg.weight.grad is not None


def test_a_functionally_used_parameter_keeps_its_gradient_and_an_unreached_one_loses_it() -> None:
    model = Functional()
    extra = nn.Linear(4, 4)
    model.spare = extra  # registered, never used: no output reaches it
    unused = UnusedParameters(model)
    model(torch.randn(3, 4)).backward()
    unused.settle()
    assert model.gate.weight.grad is not None and model.body.weight.grad is not None
    assert extra.weight.grad is None  # it got a zero one from the zero term; then none


def test_a_discarded_forward_is_forgotten() -> None:
    model = Tied()
    unused = UnusedParameters(model)
    model(torch.tensor([[1, 2]]), "lm").sum()  # a no-sync reference: its gradients discarded
    unused.forget()
    model(torch.tensor([[1, 2]]), "reg").backward()
    unused.settle()
    assert model.reg.weight.grad is not None and model.emb.weight.grad is not None
