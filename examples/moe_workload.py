"""A model that leaves parameters unused in a step: a small mixture-of-experts regressor whose
router sends each sample to one expert, so in a micro-batch of a few samples the experts no
sample picked get no gradient (the same holds for conditional branches, early exits and
multi-task heads). Routing per sample keeps the model the same function however the global
batch is split, so accumulation stays an exact knob.

    workload:
      entrypoint: examples/moe_workload.py:make_workload
      options: {width: 64, experts: 4}

commtune sees on the driver that a forward/backward of a few micro-batches leaves experts
without a gradient, and runs DDP with ``find_unused_parameters=True`` in every plan, the
baseline too (one line says so; ``workload.unused_parameters`` decides it yourself), and FSDP2
with the model as one unit (``train_fns/unused.py``): both give one process's losses.
"""

import torch
from torch import nn


class MixtureOfExperts(nn.Module):
    def __init__(self, features: int, width: int, experts: int) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.router = nn.Linear(width, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(experts)
        )
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        scores = self.router(h)
        pick = scores.argmax(dim=1)  # one expert per sample
        gate = torch.softmax(scores, dim=1).gather(1, pick[:, None])  # the router learns by it
        mixed = torch.zeros_like(h)
        for expert in pick.unique().tolist():  # only the experts some sample picked run
            chosen = pick == expert
            mixed[chosen] = self.experts[expert](h[chosen])
        return self.out(h + gate * mixed)


def make_workload(ctx):
    features, options = 16, ctx.options
    model = MixtureOfExperts(features, int(options.get("width", 64)),
                             int(options.get("experts", 4)))

    def sample(i):
        generator = torch.Generator().manual_seed(ctx.seed * 7919 + i)
        return torch.randn(features + 1, generator=generator)

    def batch(indices):
        data = torch.stack([sample(i) for i in indices])
        return data[:, :features], data[:, features:]

    def loss(model, batch):
        x, y = batch
        return nn.functional.mse_loss(model(x), y)

    return {"model": model, "batch": batch, "loss": loss}
