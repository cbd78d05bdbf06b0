"""A plain-PyTorch model of your own: a residual MLP regressor on synthetic data.

    workload:
      entrypoint: examples/mlp_workload.py:make_workload
      options: {width: 256, depth: 4}

Its layers sit in an ``nn.ModuleList``, which commtune takes as the blocks FSDP2 shards one by
one (return ``blocks`` to choose others). Sample ``i`` is drawn from a generator seeded by
``(ctx.seed, i)``: the same index always gives the same sample.
"""

import torch
from torch import nn


class ResidualMLP(nn.Module):
    def __init__(self, features: int, width: int, depth: int) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
            for _ in range(depth)
        )
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for layer in self.layers:
            x = x + layer(x)
        return self.out(x)


def make_workload(ctx):
    features, options = 64, ctx.options
    model = ResidualMLP(features, int(options.get("width", 256)), int(options.get("depth", 4)))

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
