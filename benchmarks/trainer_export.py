"""Hugging Face Trainer with the exported arguments against Trainer's defaults, side by side.

``python -m orchestrator.export RUN --to trainer`` gives ``TrainingArguments`` keyword arguments;
this measures what they buy a Trainer user: one torchrun launch of 2 gloo ranks builds a fresh
Trainer per run, alternating defaults and exported (defaults, exported, defaults, ...) on the
same seeded model and samples, so the machine's drift cancels in each exported run's ratio to
the mean of the default runs beside it. "Defaults" is Trainer as a user starts it at the same
global batch: the whole per-rank batch in one micro-batch, every other argument Trainer's own.
Each run's figure is the global batch over its median step time after the warm-up steps.
The variables of the export (best.env's) reach both arms alike, one launch holding both: on
gloo they are inert; on NCCL, compare two launches instead. Beside the ratio it prints the
run's own verdict (best.yaml's header and the entry's searched samples/s) where it has one.

    python -m benchmarks.trainer_export runs/cpu-demo      # the run's model, 3 rounds
    python -m benchmarks.trainer_export --quick            # a built-in tiny run, 1 round
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks._commands import ROOT, TEARDOWN_ABORT, run_module
from benchmarks._record import add_results_option, recording
from orchestrator.runfiles import BEST_YAML

WORLD = 2
QUICK_BEST = {
    "name": "trainer-export-quick",
    "strategy": "ddp",
    "workload": {"model": "bert-tiny", "seq_len": 32, "global_batch": 16,
                 "model_overrides": {"vocab_size": 2048, "max_position_embeddings": 64}},
    "cluster": {"num_workers": WORLD, "use_gpu": False},
    "tuned": {"accumulation_steps": 2, "bucket_cap_mb": 5, "broadcast_buffers": False},
}  # fmt: skip
"""A run whose tuned values are the kind a CPU search keeps (a smaller micro-batch, smaller
buckets, no buffer broadcast), for the quick mode only: no search behind it, no verdict."""


def export_settings(run: Path) -> dict[str, Any]:
    from orchestrator.export import export

    return export(run, "trainer", WORLD).settings


def verdict_line(run: Path) -> str:
    """What the search said of its kept configuration: the verdict line of best.yaml's header
    (not its other comment lines) and the entry's searched figure (``sizes``), or that there is
    none."""
    from orchestrator.export.entry import best_path
    from orchestrator.search.results import VERDICT_HEADER

    text = best_path(run).read_text()
    said = next((line.removeprefix(VERDICT_HEADER) for line in text.splitlines()
                 if line.startswith(VERDICT_HEADER)), None)  # fmt: skip
    entry = (yaml.safe_load(text).get("sizes") or {}).get(WORLD) or {}
    figure = entry.get("samples_per_s")
    parts = [said or f"no verdict recorded (no search behind this {BEST_YAML})"]
    if figure:
        parts.append(f"searched at {figure} samples/s in commtune's own loop")
    return "; ".join(parts)


def worker(settings_path: str, out: str, rounds: int, warmup: int, measure: int) -> None:
    """One rank: the arms alternated, each a fresh Trainer; rank 0 writes the figures. The
    process group the Trainers made is torn down at the end, on error too: a gloo group still
    up at interpreter exit can abort the process ("terminate called without an active
    exception"), as ``tests/dist/_export_check.py`` found."""
    import torch.distributed as dist

    try:
        _arms(settings_path, out, rounds, warmup, measure)
        if dist.is_initialized():  # rank 0 has written the figures before any rank ends
            dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _arms(settings_path: str, out: str, rounds: int, warmup: int, measure: int) -> None:
    """``worker``'s runs."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from train_fns.models import default_task, model_class, resolve_model_config

    setup = json.loads(Path(settings_path).read_text())
    workload, exported = setup["workload"], setup["training_arguments"]
    world = int(os.environ["WORLD_SIZE"])
    defaults = {
        "per_device_train_batch_size": workload["global_batch"] // world,
        "ddp_backend": exported["ddp_backend"],
        "use_cpu": exported.get("use_cpu", False),
    }
    config = resolve_model_config(workload["model"], workload.get("model_overrides") or {})
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (4096, workload["seq_len"]), generator=gen)
    samples = [{"input_ids": row, "labels": row.clone()} for row in ids]

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.ends.append(time.perf_counter())

    figures: dict[str, list[float]] = {"defaults": [], "exported": []}
    for _ in range(rounds):
        for arm, kwargs in (("defaults", defaults), ("exported", exported)):
            torch.manual_seed(0)
            model = model_class(default_task(config)).from_config(config)
            clock = Clock()
            args = TrainingArguments(output_dir=str(Path(out) / arm), report_to=[],
                                     max_steps=warmup + measure, save_strategy="no",
                                     disable_tqdm=True, **kwargs)  # fmt: skip
            Trainer(model=model, args=args, train_dataset=samples, callbacks=[clock]).train()
            ends = clock.ends[warmup - 1 :]
            steps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
            figures[arm].append(workload["global_batch"] / statistics.median(steps))
            if int(os.environ["RANK"]) == 0:
                print(f"  {arm}: {figures[arm][-1]:.1f} samples/s", flush=True)
    if int(os.environ["RANK"]) == 0:
        (Path(out) / "figures.json").write_text(json.dumps(figures))


def measure(run: Path, rounds: int, warmup: int, steps: int) -> dict[str, list[float]]:
    """The alternated runs in one torchrun launch; each arm's samples/s in run order."""
    from orchestrator.config.schema import load_config
    from orchestrator.export.entry import best_path

    config = load_config(str(best_path(run)))
    settings = export_settings(run)
    with tempfile.TemporaryDirectory() as out:
        setup = Path(out) / "setup.json"
        workload = {"model": config.workload.model, "seq_len": config.workload.seq_len,
                    "global_batch": config.workload.global_batch,
                    "model_overrides": config.workload.model_overrides}  # fmt: skip
        setup.write_text(json.dumps({**settings, "workload": workload}))
        env = {**os.environ, **settings["environment"], "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT)}  # fmt: skip
        launch = ["--standalone", "--nproc-per-node", str(WORLD), "-m", "benchmarks.trainer_export",
                  "--worker", str(setup), out, str(rounds), str(warmup), str(steps)]  # fmt: skip
        ran = run_module("torch.distributed.run", launch, on_line=print, env=env, check=False)
        figures = Path(out) / "figures.json"
        if ran.returncode != 0 and not (figures.is_file() and TEARDOWN_ABORT in ran.stdout):
            raise SystemExit(f"torchrun exited {ran.returncode}:\n{ran.stdout[-3000:]}")
        if ran.returncode != 0:  # rank 0 wrote the figures after the last round: all ran
            print("torchrun: a rank aborted in torch's teardown after every run was done "
                  "(pytorch/pytorch#179291); the figures are complete", flush=True)  # fmt: skip
        return json.loads(figures.read_text())


def ratios(figures: dict[str, list[float]]) -> list[float]:
    """Each exported run over the mean of the default runs on either side (the last over the
    one before it)."""
    base, tuned = figures["defaults"], figures["exported"]
    beside = [(base[i] + base[i + 1]) / 2 if i + 1 < len(base) else base[i]
              for i in range(len(tuned))]  # fmt: skip
    return [t / b for t, b in zip(tuned, beside, strict=True)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.trainer_export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("run", nargs="?", help=f"a run folder or {BEST_YAML} (default with --quick: "
                   "a built-in tiny run)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="default/exported pairs")
    p.add_argument("--steps", type=int, default=12, help="measured steps per run")
    p.add_argument("--quick", action="store_true", help="the built-in tiny run, 1 round")
    p.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    add_results_option(p)
    args = p.parse_args(argv)
    if args.worker:
        setup, out, rounds, warmup, steps = args.worker
        worker(setup, out, int(rounds), int(warmup), int(steps))
        return 0
    if args.run is None and not args.quick:
        p.error("give a run folder (runs/<name>) or --quick")
    rounds, steps = (1, 6) if args.quick else (args.rounds, args.steps)
    with (recording(__spec__.name, argv, args.results, args.quick) as record,
          tempfile.TemporaryDirectory() as scratch):  # fmt: skip
        run = Path(args.run) if args.run else Path(scratch) / BEST_YAML
        if args.run is None:
            run.write_text(yaml.safe_dump(QUICK_BEST))
        settings = export_settings(run)
        print(f"trainer_export: {settings['split']}; exported "
              f"{json.dumps(settings['training_arguments'])}", flush=True)  # fmt: skip
        figures = measure(run, rounds, warmup=3, steps=steps)
        found = ratios(figures)
        print(f"exported / defaults: median {statistics.median(found):.3f} (range "
              f"{min(found):.3f}-{max(found):.3f} over {len(found)} paired runs)")  # fmt: skip
        print(f"commtune's verdict for the same run: {verdict_line(run)}")
        record.update(split=settings["split"], arms=figures, ratios=found,
                      median=statistics.median(found), verdict=verdict_line(run))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
