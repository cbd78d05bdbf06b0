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

``--rebuild``: each visit is a configuration built afresh, as a search's warm group builds each
trial in the same processes, through the trial's own path (``train_fns.loop.run_training``: the
guard's step with dropout off, then train mode), a step a window. Printed: each configuration's
mean step by position after the build, relative to its steps from position 3 on, and the
window figure and pair spread when the measured steps start after 3 warm-up steps and after 2
(``orchestrator.search.group_run.WARM_WARMUP_STEPS``), side by side from the same visits.

    python -m benchmarks.calibration.step_noise --rebuild --accumulation 1,4 --rounds 8

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


VISIT = 4
"""Steps per visit unless ``--visit`` says, without ``--rebuild``."""


def run_rank(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    """One rank: build both configurations, warm them up, then visit them in turn (with
    ``--rebuild``: build each visit afresh, ``rebuilt_visits``)."""
    from transformers import BertConfig, BertForMaskedLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if args.rebuild:
        lines = rebuilt_visits(rank, args)
        if rank == 0:
            Path(out).write_text("\n".join(lines))
        dist.destroy_process_group()
        return
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


def rebuilt_visits(rank: int, args: argparse.Namespace) -> list[str]:
    """Each round, each configuration trained as a fresh trial plan of ``--visit`` one-step
    windows and no warm-up, so every step after the build is timed (the slowest rank's),
    the guard's first; lines "round configuration seconds"."""
    from train_fns import metrics as m
    from train_fns.loop import run_training
    from train_fns.plan import TrialPlan

    lines = []
    for r in range(args.rounds):
        for k, accumulation in enumerate(args.accumulation):
            plan = TrialPlan(
                model=args.model, task="mlm", seq_len=args.seq_len,
                global_batch=2 * args.per_rank, world_size=2, accumulation_steps=accumulation,
                micro_batch=args.per_rank // accumulation, warmup_steps=0,
                measure_steps=args.visit, num_windows=args.visit, step_deadline_s=600.0,
            )  # fmt: skip
            windows: list[dict] = []
            run_training(plan, rank, 2, torch.device("cpu"), windows.append)
            lines += [f"{r} {k} {w[m.GLOBAL_STEP_TIME_S]!r}" for w in windows]
    return lines


REBUILD_WARMUPS = (3, 2)
"""The warm-up steps compared by ``--rebuild``: before and after the guard took its update
figure (``train_fns.guard.Guard.after_update``) and a warm plan's warm-up went from 3 to 2."""


def rebuild_report(
    visits: dict[tuple[int, int], list[float]], rounds: int, figures: dict[str, object]
) -> list[str]:
    """The printed lines of ``--rebuild``: by position after the build, then the window figure
    (the mean of as many steps) after each warm-up of ``REBUILD_WARMUPS``."""
    width = len(next(iter(visits.values())))
    span = width - max(REBUILD_WARMUPS)
    lines, by_position = [], {}
    for k in (0, 1):
        steps = [visits[(r, k)] for r in range(rounds)]
        settled = statistics.fmean(t for ts in steps for t in ts[max(REBUILD_WARMUPS):])
        by_position[k] = [statistics.fmean(ts[i] for ts in steps) / settled for i in range(width)]
        lines.append(f"configuration {k}: mean step by position after the build, over its steps "
                     f"from position {max(REBUILD_WARMUPS)} on ({settled:.3f} s): "
                     + ", ".join(f"{x:.3f}" for x in by_position[k]))  # fmt: skip
    lines.append("warm-up steps | window (positions) | ratio c1/c0 | log-ratio spread | "
                 "bias c0 | bias c1")  # fmt: skip
    pairs = {}
    for warmup in REBUILD_WARMUPS:
        def figure(k: int, r: int, warmup: int = warmup) -> float:
            return statistics.fmean(visits[(r, k)][warmup : warmup + span])

        logs = [math.log(figure(1, r) / figure(0, r)) for r in range(rounds)]
        bias = [statistics.fmean(by_position[k][warmup : warmup + span]) for k in (0, 1)]
        pairs[warmup] = {"ratio": math.exp(statistics.fmean(logs)),
                         "spread": statistics.stdev(logs), "bias": bias}  # fmt: skip
        lines.append(f"{warmup} | {warmup}-{warmup + span - 1} | {pairs[warmup]['ratio']:.3f} | "
                     f"{pairs[warmup]['spread']:.1%} | {bias[0]:.3f} | {bias[1]:.3f}")
    figures.update(rebuild_by_position=by_position, rebuild_windows=pairs)
    return lines


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
    parser.add_argument("--visit", type=int, default=None,
                        help=f"steps per visit (at least 3, default {VISIT}; with --rebuild at "
                             "least 4, default 6)")
    parser.add_argument("--per-rank", type=int, default=16, help="samples per rank and step")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--rebuild", action="store_true",
                        help="build each visit afresh, as a search's trial (see above)")
    add_results_option(parser)
    args = parser.parse_args(argv)
    if args.quick:  # a check that it runs, not a figure: bert-tiny, short steps, few rounds
        args.model, args.rounds, args.per_rank, args.seq_len = "bert-tiny", 3, 4, 32
    least = max(REBUILD_WARMUPS) + 1 if args.rebuild else 3
    if args.visit is None:  # --rebuild: a window of 3 steps after 3 warm-ups (1 in --quick)
        args.visit = (least + (0 if args.quick else 2)) if args.rebuild else (
            least if args.quick else VISIT)
    args.accumulation = [int(a) for a in args.accumulation.split(",")]
    if len(args.accumulation) != 2 or args.visit < least or args.rounds < 2:
        sys.exit(f"--accumulation takes two counts (e.g. 1,4), --visit at least {least} steps, "
                 "--rounds at least 2")  # fmt: skip
    if any(args.per_rank % a for a in args.accumulation):
        sys.exit(f"--per-rank {args.per_rank} must divide by each accumulation count")
    with (recording(__spec__.name, argv, args.results, args.quick) as figures,
          tempfile.TemporaryDirectory() as tmp):  # fmt: skip
        built = "each visit built afresh" if args.rebuild else "both built once"
        print(f"step noise: {args.model}, 2 gloo ranks, accumulation {args.accumulation[0]} vs "
              f"{args.accumulation[1]}, {args.rounds} rounds of {args.visit} steps each, "
              f"{built}", flush=True)  # fmt: skip
        out = str(Path(tmp) / "steps.txt")
        mp.spawn(run_rank, args=(args, free_port(), out), nprocs=2)
        visits: dict[tuple[int, int], list[float]] = {}
        for line in Path(out).read_text().splitlines():
            r, k, seconds = line.split()
            visits.setdefault((int(r), int(k)), []).append(float(seconds))
        figures.update(model=args.model, accumulation=args.accumulation, rounds=args.rounds,
                       visit=args.visit, rebuild=args.rebuild)  # fmt: skip
        lines = (rebuild_report if args.rebuild else report)(visits, args.rounds, figures)
        print("\n".join(lines))


if __name__ == "__main__":
    main()
