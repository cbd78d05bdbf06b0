"""How much a training step's time scatters on this machine, and which window estimator pairs
best: the evidence behind the race's window shape (``search.race``: a window judged by its mean
step, ``race.WINDOW_FIGURE``, the step after the switch counted in it, ``race.SWITCH_STEPS``).

Two gloo ranks (one thread each, as a cpus_per_worker=1 worker) train a BERT masked-LM with DDP,
two configurations built side by side (accumulation ``--accumulation``, e.g. ``1,1`` for an
A/A, ``1,4`` for a real difference), visiting each in turn for ``--visit`` steps, every step
timed between barriers. Printed: the steps' spread, the mean time by position in a visit (the
first follows a switch), and, for each way of turning a visit into a window figure, the ratio
of the two configurations and the spread of its log over the rounds: the smaller that spread,
the fewer pairs a decision needs.

    python -m benchmarks.calibration.step_noise        # bert-mini, A/A, 12 rounds of 4 steps
    python -m benchmarks.calibration.step_noise --accumulation 1,4 --rounds 12
    python -m benchmarks.calibration.step_noise --quick   # bert-tiny, 3 short rounds: seconds

Torch and transformers only (no Ray): the scatter is the machine's and the two ranks', not
Ray's.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks._record import add_results_option, recording

MODELS = {
    "bert-mini": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
                  "intermediate_size": 1024},
    "bert-tiny": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "intermediate_size": 512},
}  # fmt: skip
"""The preset shapes (``train_fns.model_presets``) with BERT's vocabulary."""
ESTIMATORS: dict[str, Callable[[list[float]], float]] = {
    "median after the switch (the search's figure)": lambda s: statistics.median(s[1:]),
    "median with the switch step": lambda s: statistics.median(s[:-1]),
    "mean after the switch": lambda s: statistics.fmean(s[1:]),
    "mean with the switch step": lambda s: statistics.fmean(s[:-1]),
    "the switch step alone": lambda s: s[0],
    "mean of the whole visit (the race)": statistics.fmean,
}
"""Visit (its steps' seconds, the switch step first) -> a window's step time. The 'with the
switch step' ones take as many steps as the 'after' ones; 'the whole visit' counts every step
the race pays for (it runs the switch step either way), one more than the 'after' ones."""


def run_rank(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    """One rank: build both configurations, warm them up, then visit them in turn."""
    from transformers import BertConfig, BertForMaskedLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    config = BertConfig(**MODELS[args.model])
    built = []
    for accumulation in args.accumulation:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(BertForMaskedLM(config))
        built.append((model, torch.optim.AdamW(model.parameters(), lr=1e-4), accumulation))
    ids = torch.randint(0, config.vocab_size, (args.per_rank, args.seq_len))

    def step(k: int) -> float:
        model, optimizer, accumulation = built[k]
        micro = args.per_rank // accumulation
        dist.barrier()
        start = time.perf_counter()
        for i in range(accumulation):
            batch = ids[i * micro : (i + 1) * micro]
            with model.no_sync() if i < accumulation - 1 else torch.enable_grad():
                (model(input_ids=batch, labels=batch).loss / accumulation).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        dist.barrier()
        return time.perf_counter() - start

    for k in range(len(built)):
        for _ in range(3):
            step(k)
    lines = [
        f"{r} {k} {step(k)!r}"
        for r in range(args.rounds)
        for k in range(len(built))
        for _ in range(args.visit)
    ]
    if rank == 0:
        Path(out).write_text("\n".join(lines))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def report(
    visits: dict[tuple[int, int], list[float]], rounds: int, figures: dict[str, object]
) -> list[str]:
    """The printed lines from the timed steps, by (round, configuration); their figures go
    into ``figures``."""
    steps = [t for ts in visits.values() for t in ts]
    mean = statistics.fmean(steps)
    lines = [f"steps: {len(steps)}, mean {mean:.3f} s, cv {statistics.stdev(steps) / mean:.1%}"]
    width = len(next(iter(visits.values())))
    by_position = [statistics.fmean(ts[i] for ts in visits.values()) for i in range(width)]
    lines.append("mean step by position in a visit (0: after a switch): "
                 + ", ".join(f"{t:.3f}" for t in by_position))  # fmt: skip
    lines.append("window figure | ratio c1/c0 | log-ratio spread over rounds")
    pairs = {}
    for name, estimate in ESTIMATORS.items():
        logs = [math.log(estimate(visits[(r, 0)]) / estimate(visits[(r, 1)]))
                for r in range(rounds)]  # fmt: skip
        pairs[name] = {"ratio": math.exp(statistics.fmean(logs)), "spread": statistics.stdev(logs)}
        lines.append(f"{name} | {pairs[name]['ratio']:.3f} | {pairs[name]['spread']:.1%}")
    figures.update(steps=len(steps), mean_step_s=mean, step_cv=statistics.stdev(steps) / mean,
                   mean_step_by_position_s=by_position, window_figures=pairs)  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="bert-tiny, 3 short rounds")
    parser.add_argument("--model", choices=sorted(MODELS), default="bert-mini")
    parser.add_argument("--accumulation", default="1,1", help="two accumulation counts")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--visit", type=int, default=4, help="steps per visit (at least 3)")
    parser.add_argument("--per-rank", type=int, default=16, help="samples per rank and step")
    parser.add_argument("--seq-len", type=int, default=64)
    add_results_option(parser)
    args = parser.parse_args(argv)
    if args.quick:  # a check that it runs, not a figure: bert-tiny, short steps, few rounds
        args.model, args.rounds, args.visit, args.per_rank, args.seq_len = "bert-tiny", 3, 3, 4, 32
    args.accumulation = [int(a) for a in args.accumulation.split(",")]
    if len(args.accumulation) != 2 or args.visit < 3 or args.rounds < 2:
        sys.exit("--accumulation takes two counts (e.g. 1,4), --visit at least 3 steps, "
                 "--rounds at least 2")  # fmt: skip
    if any(args.per_rank % a for a in args.accumulation):
        sys.exit(f"--per-rank {args.per_rank} must divide by each accumulation count")
    with (recording(__spec__.name, argv, args.results, args.quick) as figures,
          tempfile.TemporaryDirectory() as tmp):  # fmt: skip
        print(f"step noise: {args.model}, 2 gloo ranks, accumulation {args.accumulation[0]} vs "
              f"{args.accumulation[1]}, {args.rounds} rounds of {args.visit} steps each",
              flush=True)  # fmt: skip
        out = str(Path(tmp) / "steps.txt")
        mp.spawn(run_rank, args=(args, free_port(), out), nprocs=2)
        visits: dict[tuple[int, int], list[float]] = {}
        for line in Path(out).read_text().splitlines():
            r, k, seconds = line.split()
            visits.setdefault((int(r), int(k)), []).append(float(seconds))
        figures.update(model=args.model, accumulation=args.accumulation, rounds=args.rounds,
                       visit=args.visit)  # fmt: skip
        print("\n".join(report(visits, args.rounds, figures)))


if __name__ == "__main__":
    main()
