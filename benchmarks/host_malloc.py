"""What glibc's malloc tunables buy a CPU training step, measured side by side: the evidence
behind ``GLIBC_TUNABLES`` in a config's ``env:`` (docs/search-spaces.md).

Round after round, two fresh gloo ranks train a BERT masked-LM with DDP (accumulation 1, the
cpu-demo's step: 16 samples a rank) for ``--steps`` timed steps after three warm-up steps,
once with glibc's defaults and once with ``GLIBC_TUNABLES`` (glibc reads it when a process
starts, so every measurement starts its own processes, as a search trial does), the order
alternating from round to round (B T, T B, ...). Printed: each round's median steps and their
ratio, the ratio over the rounds with its 95% interval, the steps' cv, and the two ranks' page
faults and system time per step (what the tunables save: the kernel re-mapping large blocks).

    python -m benchmarks.host_malloc                   # bert-mini, 6 rounds of 8 steps
    python -m benchmarks.host_malloc --quick           # bert-tiny, 2 short rounds: seconds

Torch and transformers only (no Ray), with the ranks of ``benchmarks.step_noise``.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import tempfile
from pathlib import Path

import torch.multiprocessing as mp

from benchmarks.step_noise import MODELS, free_port, run_rank
from orchestrator.verdict.paired import t_quantile

TUNED = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=100000000000"
"""Large blocks from the heap, and freed memory kept for the next step (the documented value)."""


def measure(args: argparse.Namespace, tunables: str | None) -> tuple[list[float], float, float]:
    """One fresh pair of ranks: its timed steps (s), and page faults and system seconds per
    step of both ranks (warm-up and start included: the same for either setting)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    saved = os.environ.pop("GLIBC_TUNABLES", None)
    if tunables:
        os.environ["GLIBC_TUNABLES"] = tunables
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "steps.txt")
            mp.spawn(run_rank, args=(args, free_port(), out), nprocs=2)
            steps = [float(line.split()[2]) for line in Path(out).read_text().splitlines()]
    finally:
        os.environ.pop("GLIBC_TUNABLES", None)
        if saved is not None:
            os.environ["GLIBC_TUNABLES"] = saved
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    count = len(steps)
    return (steps, (after.ru_minflt - before.ru_minflt) / count,
            (after.ru_stime - before.ru_stime) / count)  # fmt: skip


def summary(name: str, steps: list[float], faults: list[float], system: list[float]) -> str:
    """One setting's line: its steps' mean and cv, faults and system time per step."""
    mean = statistics.fmean(steps)
    return (f"{name}: mean step {mean:.3f} s, cv {statistics.stdev(steps) / mean:.1%}, "
            f"{statistics.fmean(faults):,.0f} page faults and "
            f"{statistics.fmean(system):.2f} s system time a step (both ranks)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="bert-tiny, 2 short rounds")
    parser.add_argument("--model", choices=sorted(MODELS), default="bert-mini")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per measurement")
    parser.add_argument("--per-rank", type=int, default=16, help="samples per rank and step")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--tunables", default=TUNED, help="the GLIBC_TUNABLES value to measure")
    args = parser.parse_args()
    if args.quick:  # a check that it runs, not a figure
        args.model, args.rounds, args.steps, args.per_rank, args.seq_len = "bert-tiny", 2, 3, 4, 32
    if args.rounds < 2 or args.steps < 2:
        raise SystemExit("--rounds and --steps take at least 2 (an interval needs two rounds)")
    args.accumulation, args.visit, rounds = [1], args.steps, args.rounds
    args.rounds = 1  # each measurement is one visit of one configuration, in its own processes
    print(f"host malloc: {args.model}, 2 gloo ranks, {args.per_rank} samples a rank, glibc "
          f"defaults vs GLIBC_TUNABLES={args.tunables}, {rounds} rounds of {args.steps} steps",
          flush=True)  # fmt: skip
    seen: dict[str, tuple[list, list, list]] = {"defaults": ([], [], []), "tuned": ([], [], [])}
    logs = []
    for r in range(rounds):
        order = ("defaults", "tuned") if r % 2 == 0 else ("tuned", "defaults")
        median = {}
        for name in order:
            steps, faults, system = measure(args, args.tunables if name == "tuned" else None)
            for kept, value in zip(seen[name], (steps, [faults], [system]), strict=True):
                kept.extend(value)
            median[name] = statistics.median(steps)
        logs.append(math.log(median["defaults"] / median["tuned"]))
        print(f"round {r + 1} ({order[0]} first): defaults {median['defaults']:.3f} s, tuned "
              f"{median['tuned']:.3f} s: {math.exp(logs[-1]):.3f}x", flush=True)  # fmt: skip
    for name, (steps, faults, system) in seen.items():
        print(summary(name, steps, faults, system))
    half = t_quantile(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    mean = statistics.fmean(logs)
    print(f"tuned vs defaults: {math.exp(mean):.3f}x faster (95% interval "
          f"{math.exp(mean - half):.3f}-{math.exp(mean + half):.3f} over {len(logs)} rounds)")


if __name__ == "__main__":
    main()
