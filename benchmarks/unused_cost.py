"""What ``find_unused_parameters`` costs a model that does not need it: DDP's reducer then walks
the autograd graph after every forward to find parameters without a gradient.

commtune turns it on for every plan of a model whose steps leave parameters unused (a mixture of
experts, a conditional branch), and only there. This measures the price on a dense model (the
cpu-demo preset's BERT): the same plan with the setting off and on, alternated in one warm worker
group of 2 gloo ranks (off, on, off, on, ...), each on the same seeded weights and batches; the
figure is each "on" run's samples/s over the mean of the "off" runs beside it, so slow drift of
the machine cancels.

    python -m benchmarks.unused_cost              # bert-mini, 6 rounds (~4 min on 2 cores)
    python -m benchmarks.unused_cost --quick      # bert-tiny, 2 rounds (the tests')
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from train_fns import metrics as m
from train_fns.group import END, evaluate_plans
from train_fns.plan import DDPOptions, TrialPlan

WORLD = 2


def plans(quick: bool, rounds: int) -> list[TrialPlan]:
    """off (the group's first: it pays the start and is left out), then off, on, off, on, ...,
    off: every "on" run between two "off" runs."""
    model, seq_len, batch, steps = ("bert-tiny", 32, 16, 4) if quick else ("bert-mini", 64, 32, 12)
    base = TrialPlan(model=model, task="mlm", seq_len=seq_len, global_batch=batch,
                     world_size=WORLD, accumulation_steps=1, micro_batch=batch // WORLD,
                     warmup_steps=3, measure_steps=steps, num_windows=1)  # fmt: skip
    on = replace(base, ddp=DDPOptions(find_unused_parameters=True))
    return [base, base, *[p for _ in range(rounds) for p in (on, base)]]


def _rank(rank: int, port: int, sequence: list[dict[str, Any]], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    queue = iter([TrialPlan.from_dict(p) for p in sequence])
    ends: list[dict[str, Any]] = []
    evaluate_plans(lambda: next(queue, None), rank, WORLD, torch.device("cpu"),
                   lambda msg: ends.append(msg) if msg["kind"] == END else None)  # fmt: skip
    torch.save(ends, Path(out) / f"rank{rank}.pt")
    dist.destroy_process_group()


def measure(sequence: list[TrialPlan]) -> list[float]:
    """Each run's global samples/s (a step is as slow as its slowest rank)."""
    with tempfile.TemporaryDirectory() as out:
        sock = __import__("socket").socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        mp.spawn(_rank, args=(port, [p.to_dict() for p in sequence], out), nprocs=WORLD)
        ends = [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    batch = sequence[0].global_batch
    return [batch / max(e["windows"][0][m.STEP_TIME_S] for e in runs)
            for runs in zip(*ends, strict=True)][1:]  # fmt: skip


def ratios(samples: list[float]) -> list[float]:
    """Each "on" run (odd positions) over the mean of the "off" runs on either side."""
    return [samples[i] / ((samples[i - 1] + samples[i + 1]) / 2)
            for i in range(1, len(samples) - 1, 2)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.unused_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rounds", type=int, default=6, help="on runs, each between two off runs")
    p.add_argument("--quick", action="store_true", help="bert-tiny, 2 rounds (the tests')")
    args = p.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    sequence = plans(args.quick, rounds)
    print(f"unused_cost: {sequence[0].model}, {2 * rounds + 1} runs in one warm group of "
          f"{WORLD} gloo ranks (off, on, off, ...) after one that starts it",
          flush=True)  # fmt: skip
    samples = measure(sequence)
    for i, value in enumerate(samples):
        print(f"  run {i + 1}: find_unused_parameters={'on ' if i % 2 else 'off'} "
              f"{value:.1f} samples/s")  # fmt: skip
    found = ratios(samples)
    print(f"on / off: median {statistics.median(found):.3f} (range {min(found):.3f}-"
          f"{max(found):.3f} over {len(found)} paired runs)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
