"""A user workload that is not a Hugging Face model: a small residual CNN classifying synthetic
images. Run it with ``workload.entrypoint: examples/vision_workload.py:make_workload``.

Each sample is a function of its global index (a generator seeded by the index), so every split
of the global batch sees the same images and labels: what keeps commtune's numbers exact.
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """conv-norm-relu twice, with a skip connection: the unit FSDP shards one by one."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1), nn.GroupNorm(8, channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.GroupNorm(8, channels),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class SmallResNet(nn.Module):
    def __init__(self, channels: int, depth: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.ModuleList(Block(channels) for _ in range(depth))
        self.head = nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


def make_workload(ctx):
    options = ctx.options
    size, classes = int(options.get("image_size", 32)), int(options.get("classes", 10))
    model = SmallResNet(int(options.get("width", 32)), int(options.get("depth", 4)), classes)

    def sample(index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(ctx.seed * 1_000_003 + index)
        label = torch.randint(classes, (), generator=g)
        # A class-dependent mean so the task is learnable, plus noise.
        image = torch.randn(3, size, size, generator=g) + label.float() / classes
        return image, label

    def batch(indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = zip(*(sample(i) for i in indices), strict=True)
        return torch.stack(images), torch.stack(labels)

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        images, labels = batch
        return nn.functional.cross_entropy(model(images), labels)

    return {"model": model, "batch": batch, "loss": loss, "blocks": list(model.blocks)}
