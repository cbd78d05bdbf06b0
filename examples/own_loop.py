"""Your own training loop with commtune's tuned configuration (torchrun, gloo or NCCL):

    python -m torch.distributed.run --nproc_per_node 2 examples/own_loop.py runs/<study>/best.yaml

``tuned.worker_env`` gives the variables that must be set before the processes start (for
torchrun: ``source runs/<study>/best.env`` first; for Ray Train: ``worker_runtime_env``).
Prints one line per step from rank 0.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from mlp_workload import ResidualMLP

from train_fns import tuned


def main(best_path: str, steps: int = 3) -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    best = tuned.load(best_path)
    micro_batch, accumulation = tuned.split(best, world)  # the global batch stays what you tuned
    torch.manual_seed(0)  # the same initial weights on every rank
    model = tuned.wrap(ResidualMLP(64, 64, 2), best)  # DDP buckets or FSDP2 sharding, as tuned
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(rank)
    for step in range(steps):
        for _ in range(accumulation):
            data = torch.randn(micro_batch, 65, generator=generator).to(device)
            loss = torch.nn.functional.mse_loss(model(data[:, :64]), data[:, 64:]) / accumulation
            loss.backward()  # (use model.no_sync() on all but the last micro-step under DDP)
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            split = f"micro_batch {micro_batch} x accumulation {accumulation}"
            print(f"step {step}: loss {loss.item() * accumulation:.4f}, {split}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
