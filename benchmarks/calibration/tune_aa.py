"""How often tuning while training keeps a split that is no faster: the A/A check of ``--tune``.

The judge of ``orchestrator.train --tune`` (``orchestrator.train.tune``) races candidates that
*are* the running split, its twins, decision after decision, in a real training run: 2 gloo
ranks, the preset's model and plan as ``orchestrator.train`` builds them (``run_spec``), the
training run's own trainer and worker half of tuning, every window real training steps. Every
"keep" is a false keep and every "slower" a false alarm; "no gain" is right and "undecided"
the pair budget (``search.verdict_pairs``) running out. ``--busy`` runs it all beside a
neighbour on each core (busy and idle in turns, ``aa_verdict``'s).

    python -m benchmarks.calibration.tune_aa                # cpu-demo, 20 decisions
    python -m benchmarks.calibration.tune_aa --decisions 40 --busy
    python -m benchmarks.calibration.tune_aa --quick        # smoke, 3 decisions, 1-step windows
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks._record import add_results_option, recording
from benchmarks.calibration.aa_verdict import Neighbours
from orchestrator.config.schema import Config, load_config
from orchestrator.planning.from_config import resolve_task
from orchestrator.train.run import run_spec
from orchestrator.train.tune import FLOOR_WINDOWS, WARMUP_WINDOWS, Judge, TuneSettings
from orchestrator.train.tune_knobs import ACCUMULATION, Candidate, Setting
from orchestrator.verdict.decide import KEEP
from train_fns.restart import RunSpec
from train_fns.trainer import ElasticTrainer


class TwinJudge(Judge):
    """The run's judge, racing ``twins`` copies of the running split."""

    def __init__(self, settings: TuneSettings, twins: int) -> None:
        super().__init__(settings, set(), {}, None)
        self.twins = twins

    def candidates(self, per_rank: int, running: Setting, split_fixed: bool) -> list[Candidate]:
        return [(ACCUMULATION, running[ACCUMULATION])] * self.twins


class Decided(Exception):
    """Every twin is judged: the run stops here, not at its last step."""


class UntilDecided(ElasticTrainer):
    """The training run's trainer, ended once tuning is done (every rank alike: ``done`` is
    agreed over the side group)."""

    def _train_step(self, runner: Any, step: int) -> None:
        super()._train_step(runner, step)
        if self.tuning is not None and self.tuning.done:
            raise Decided


def settings_of(config: Config, decisions: int) -> TuneSettings:
    """The preset's tuning settings, with a budget no decision runs out of."""
    train, search = config.train, config.search
    windows = 1 + search.verdict_pairs  # a twin's settling window and its half of every pair
    return TuneSettings(
        window_steps=train.tune_window, budget_steps=decisions * windows * train.tune_window,
        delta=search.verdict_delta, max_pairs=search.verdict_pairs,
        max_accumulation=train.max_accumulation,
    )  # fmt: skip


def run_rank(rank: int, config: Config, decisions: int, port: int, out: str) -> None:
    """One rank of the run; rank 0 holds the judge and writes its decisions to ``out``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    settings = settings_of(config, decisions)
    spec, _ = run_spec(config, resolve_task(config), False, Path(out).parent)
    # the running split's windows as many as the twins', and room for the profiled steps
    most = (WARMUP_WINDOWS + FLOOR_WINDOWS) * settings.window_steps + settings.budget_steps * 3
    spec = RunSpec(**{**spec.to_dict(), "steps": most, "checkpoint_every": most,
                      "snapshot_every": 0, "progress_file": None,
                      "tune_window": settings.window_steps})  # fmt: skip
    judge = TwinJudge(settings, decisions) if rank == 0 else None
    trainer = UntilDecided(spec, rank, 2, torch.device("cpu"), lambda *_: None, None, judge=judge)
    with contextlib.suppress(Decided):
        trainer.run()
    if judge is not None:
        Path(out).write_text(json.dumps(judge.summary()["sizes"]["2"]["decisions"]))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu-demo", help="the model, batch and tuning settings")
    ap.add_argument("--decisions", type=int, default=20, help="twins raced, one decision each")
    ap.add_argument("--busy", action="store_true", help="beside a busy neighbour on each core")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override, e.g. train.tune_window=4")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="smoke, 3 decisions, 1-step windows")
    add_results_option(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.preset, args.decisions = "smoke", 3
        args.set += ["train.tune_window=1", "search.verdict_pairs=3"]
    if args.decisions < 1:
        ap.error(f"--decisions {args.decisions}: at least 1")
    config = load_config(None, args.preset, ["cluster.num_workers=2", *args.set])
    with (recording(__spec__.name, argv, args.results, args.quick) as figures,
          tempfile.TemporaryDirectory() as tmp):  # fmt: skip
        print(f"tune A/A: {args.preset}, 2 gloo ranks, {args.decisions} twins of the running "
              f"split, windows of {config.train.tune_window} steps, at most "
              f"{config.search.verdict_pairs} pairs each, δ {config.search.verdict_delta:.0%}"
              f"{', beside busy neighbours' if args.busy else ''}", flush=True)  # fmt: skip
        out = str(Path(tmp) / "decisions.json")
        with Neighbours(0) if args.busy else contextlib.nullcontext():
            mp.spawn(run_rank, args=(config, args.decisions, free_port(), out), nprocs=2)
        decisions = json.loads(Path(out).read_text())
        for k, d in enumerate(decisions, start=1):
            interval = f" (interval {d['low']:.3f}-{d['high']:.3f})" if d["high"] else ""
            print(f"decision {k}: {d['outcome']} at {d['ratio']:.3f}x from {d['pairs']} "
                  f"pair(s){interval}", flush=True)  # fmt: skip
        if not decisions:
            raise SystemExit("no twin was judged: the run ended first (a defect to find)")
        counts = Counter(d["outcome"] for d in decisions)
        keeps = counts.get(KEEP, 0)
        print(f"outcomes: {dict(sorted(counts.items()))}")
        print(f"false keeps: {keeps} of {len(decisions)} decisions "
              f"({keeps / len(decisions):.0%}) at δ {config.search.verdict_delta:.0%}")  # fmt: skip
        figures.update(preset=args.preset, busy=args.busy, decisions=decisions,
                       outcomes=dict(counts), false_keeps=keeps)  # fmt: skip


if __name__ == "__main__":
    main()
