"""The GPU check: commtune's real training path on one GPU, with torch alone, in a few minutes.

The lent machines have torch and transformers but no Ray, Optuna or package index, so this
script imports neither (and says so at the end). Its stages first: the libraries against the
floors and every NCCL value the space offers (``gpu_check_stages``), a warm group through
A B C D A and the race's round-0 regrowth (``gpu_worker_stages``). Then it calls
``train_fns.loop.run_training`` with a ``TrialPlan``, as a trial's worker does, on a 1-rank NCCL
group for each configuration: DDP and FSDP2; fp32 (TF32), bf16 and fp16; accumulation 1 and 4;
checkpointing off and on; fused AdamW; each precision's baseline twice (the GPU's run-to-run
spread). A row holds the guard's gaps from the baseline and its verdict, fp16's overflows, the
window step time beside CUDA events and wall-clock of the same steps, peak memory both ways,
samples/s and MFU. One GPU is one rank: this checks correctness, timing and memory on CUDA, not
NCCL between GPUs. ``python benchmarks/gpu_check.py`` from the repository root (the CSV and the
run's record under $OUT); ``--quick``: a tiny model on the CPU over gloo, so a test keeps it
running.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # ``python benchmarks/gpu_check.py`` puts benchmarks/ first
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from benchmarks._record import add_results_option, recording  # noqa: E402
from benchmarks.gpu_check_stages import (  # noqa: E402
    load_file_module,
    nccl_values_stage,
    versions_stage,
)
from benchmarks.gpu_worker_stages import run_worker_stages  # noqa: E402
from train_fns import metrics as m  # noqa: E402
from train_fns.group import free_memory, live_groups, release_groups  # noqa: E402
from train_fns.loop import StepRunner, run_training  # noqa: E402
from train_fns.plan import TrialPlan  # noqa: E402
from train_fns.ranks import nccl_version  # noqa: E402
from train_fns.timing import StepTimer  # noqa: E402

H200_DENSE_BF16_TFLOPS = 989.0
"""NVIDIA H200 (SXM) data sheet: BF16 Tensor Core 1,979 TFLOPS "with sparsity"; dense is half."""
DENSE_BF16_TFLOPS = {"H200 NVL": 835.5, "H200": H200_DENSE_BF16_TFLOPS, "H100 PCIe": 756.0,
                     "H100": 989.0, "A100": 312.0}  # fmt: skip
"""Dense bf16 peaks from NVIDIA's data sheets (the sparse figure halved); longest name first."""
BUDGET_S = 480.0  # no configuration starts after this: the lent machine allows 10 min a call


@dataclass(frozen=True)
class Case:
    """One configuration of the check; ``role`` marks a precision's baseline (and its rerun)."""

    precision: str
    strategy: str = "ddp"
    accumulation: int = 1
    checkpointing: bool = False
    adamw: str | None = None
    role: str = ""

    @property
    def label(self) -> str:
        ckpt = " ckpt" if self.checkpointing else ""
        adamw = f" {self.adamw}" if self.adamw else ""
        role = f" ({self.role})" if self.role else ""
        return f"{self.precision} {self.strategy} acc{self.accumulation}{ckpt}{adamw}{role}"


def gpu_cases() -> list[Case]:
    """Per precision: the baseline twice, every strategy x accumulation x checkpointing, and
    fused AdamW under each strategy. bf16 first: if the budget runs out, the main case ran."""
    cases = []
    for precision in ("bf16", "fp16", "fp32"):
        cases += [Case(precision, role="baseline"), Case(precision, role="baseline again")]
        for knobs in itertools.product(("ddp", "fsdp"), (1, 4), (False, True)):
            if knobs != ("ddp", 1, False):
                cases.append(Case(precision, *knobs))
        cases += [Case(precision, "ddp", adamw="fused"), Case(precision, "fsdp", adamw="fused")]
    return cases


def quick_cases() -> list[Case]:
    """The CPU stand-in: gloo has no fp16 and CPU no fused AdamW."""
    return [Case("fp32", role="baseline"), Case("fp32", role="baseline again"),
            Case("fp32", "fsdp", 4, True), Case("bf16", role="baseline"),
            Case("bf16", "fsdp", 4)]  # fmt: skip


@dataclass
class Setup:
    """What every configuration shares: the model, the batch and the device."""

    device: torch.device
    model: str
    overrides: dict[str, Any]
    seq_len: int
    global_batch: int
    peak_tflops: float | None
    peak_name: str
    measure_steps: int = 12
    """After 3 warm-up steps (2 guarded, as the group's first trial); a plan's defaults, split
    in 3 windows as trials are."""

    def plan(self, case: Case) -> TrialPlan:
        """The plan a trial of ``case`` would run on one worker (plan defaults otherwise)."""
        return TrialPlan(
            model=self.model, task="mlm", seq_len=self.seq_len, global_batch=self.global_batch,
            world_size=1, accumulation_steps=case.accumulation,
            micro_batch=self.global_batch // case.accumulation, strategy=case.strategy,
            precision=case.precision, activation_checkpointing=case.checkpointing,
            adamw_impl=case.adamw, model_overrides=dict(self.overrides),
            use_gpu=self.device.type == "cuda", measure_steps=self.measure_steps,
            num_windows=min(3, self.measure_steps),
        )  # fmt: skip


@dataclass
class StepSample:
    """One step's independent clocks: CUDA events at the step timer's start and end, and
    the host's wall-clock of the whole ``run_step`` (it ends in the timer's device sync)."""

    step: int
    profiled: bool
    wall_s: float = 0.0
    start: Any = None
    end: Any = None


def _event() -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


@contextmanager
def step_clocks(samples: list[StepSample], cuda: bool) -> Iterator[None]:
    """Observe every step ``run_training`` runs, without changing it: it builds its runner
    inside, so the clocks hook the classes for the duration (restored after)."""
    run_step, start_step, end_step = StepRunner.run_step, StepTimer.start_step, StepTimer.end_step

    def timed_run(runner: StepRunner, step: int, profiled: bool = True) -> torch.Tensor:
        samples.append(StepSample(step, profiled))
        began = time.perf_counter()
        loss = run_step(runner, step, profiled)
        samples[-1].wall_s = time.perf_counter() - began
        return loss

    def timed_start(timer: StepTimer, profiled: bool = True) -> None:
        start_step(timer, profiled)
        samples[-1].start = _event() if cuda else None

    def timed_end(timer: StepTimer) -> float:
        samples[-1].end = _event() if cuda else None  # queued before the timer's own sync
        return end_step(timer)

    StepRunner.run_step, StepTimer.start_step, StepTimer.end_step = (
        timed_run, timed_start, timed_end)  # fmt: skip
    try:
        yield
    finally:
        StepRunner.run_step, StepTimer.start_step, StepTimer.end_step = (
            run_step, start_step, end_step)  # fmt: skip


@dataclass
class Outcome:
    """What one configuration produced: its window reports and step clocks, or its error."""

    case: Case
    plan: TrialPlan
    windows: list[dict] = field(default_factory=list)
    samples: list[StepSample] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0

    @property
    def guard(self) -> dict | None:
        return self.windows[0].get(m.GUARD) if self.windows and not self.error else None


def run_case(case: Case, setup: Setup, tf32: tuple[bool, bool]) -> Outcome:
    """Train ``case`` through ``run_training`` after freeing the last one as a warm worker
    group does, TF32 as a fresh worker finds it; a failure is kept (with its traceback on
    stderr) and the next configuration runs."""
    plan, device = setup.plan(case), setup.device
    outcome, began = Outcome(case, plan), time.perf_counter()
    free_memory(device)
    if device.type == "cuda":  # Precision turns TF32 on for fp32 and nothing turns it off
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    groups = live_groups()
    try:
        with step_clocks(outcome.samples, device.type == "cuda"):
            run_training(plan, 0, 1, device, outcome.windows.append)
    except Exception as e:  # reported in its row (traceback above); the check goes on
        traceback.print_exc()
        outcome.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    release_groups(groups, device)
    outcome.seconds = time.perf_counter() - began
    return outcome


def guard_columns(outcome: Outcome, base: Outcome | None, correctness: ModuleType) -> dict:
    """The guard's largest relative gaps from the baseline (``grad_gap``: its gradient norms
    and updates; figures both overflowed, which the check skips, are skipped here too) and
    the driver's verdict at its tolerance."""
    got = outcome.guard
    norms = (got or {}).get("grad_norms") or []
    overflow = f"{sum(not math.isfinite(x) for x in norms)}/{len(norms)}" if norms else ""
    row = {"tolerance": correctness.tolerance_for(outcome.plan), "guard_overflow": overflow,
           "loss_gap": None, "grad_gap": None}  # fmt: skip
    no_base = base is None or base.guard is None
    failed = "FAILED" if outcome.error else "-"
    status = failed if got is None else "baseline" if outcome.case.role == "baseline" else None
    if status or no_base:
        return {**row, "guard": status or "no baseline"}
    for _what, b, g, gradient in correctness._figures(base.guard, got):  # what check reads
        if gradient and not math.isfinite(b) and not math.isfinite(g):
            continue
        key, gap = "grad_gap" if gradient else "loss_gap", correctness.relative_gap(g, b)
        if row[key] is None or not gap <= row[key]:  # NaN sticks
            row[key] = gap
    why = correctness.guard_check(base.guard, got, outcome.plan)
    return {**row, "guard": "ok" if why is None else "CORRUPT", "why": why or ""}


def _gib(num_bytes: int | None) -> float | None:
    return None if num_bytes is None else num_bytes / 2**30


def timing_columns(outcome: Outcome, setup: Setup) -> dict:
    """The window step time (median over windows, as the driver takes it) beside the CUDA
    events and wall-clock of the measured plain steps; memory, samples/s and MFU."""
    if not outcome.windows:
        return {}
    last, plan = outcome.windows[-1], outcome.plan
    plain = [s for s in outcome.samples  # a step that raised has no end and no wall-clock
             if s.step >= plan.warmup_steps and not s.profiled and s.wall_s]  # fmt: skip
    window_s = statistics.median(w[m.STEP_TIME_S] for w in outcome.windows)
    events = [s.start.elapsed_time(s.end) / 1e3 for s in plain if s.start is not None]
    flops = m.FLOPS_PER_PARAM_TOKEN * last[m.NUM_PARAMS] * plan.global_batch * plan.seq_len
    peak = setup.peak_tflops
    return {
        "window_step_ms": window_s * 1e3,
        "event_step_ms": statistics.median(events) * 1e3 if events else None,
        "wall_step_ms": statistics.median(s.wall_s for s in plain) * 1e3 if plain else None,
        "allocated_peak_gib": _gib(last[m.ALLOCATED_PEAK_BYTES]),
        "device_used_peak_gib": _gib(last[m.DEVICE_USED_PEAK_BYTES]),
        "nonfinite_steps": last[m.NUM_NONFINITE],
        "samples_per_s": plan.global_batch / window_s,
        "mfu": flops / window_s / (peak * 1e12) if peak else None,
        "num_params": last[m.NUM_PARAMS],
    }


COLUMNS = ("config", "precision", "strategy", "accumulation", "checkpointing", "adamw", "role",
           "guard", "loss_gap", "grad_gap", "tolerance", "guard_overflow", "nonfinite_steps",
           "window_step_ms", "event_step_ms", "wall_step_ms", "allocated_peak_gib",
           "device_used_peak_gib", "samples_per_s", "mfu", "num_params", "seconds", "error",
           "why")  # fmt: skip


def table_row(outcome: Outcome, base: Outcome | None, setup: Setup, lib: ModuleType) -> dict:
    """The CSV row of one configuration (``lib``: the correctness module)."""
    case = outcome.case
    row = {"config": case.label, "precision": case.precision, "strategy": case.strategy,
           "accumulation": case.accumulation, "checkpointing": case.checkpointing,
           "adamw": case.adamw or "default", "role": case.role or "variant",
           "seconds": outcome.seconds, "error": outcome.error}  # fmt: skip
    row |= guard_columns(outcome, base, lib) | timing_columns(outcome, setup)
    return {key: row.get(key) for key in COLUMNS}


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None or value == "" else format(value, spec)


TABLE = (("config", "config", -34, "s"), ("guard", "guard", -11, "s"),
         ("loss_gap", "loss gap", 8, ".1e"), ("grad_gap", "grad gap", 8, ".1e"),
         ("tolerance", "tol", 6, "g"), ("guard_overflow", "inf", 4, "s"),
         ("nonfinite_steps", "nf", 3, "d"), ("window_step_ms", "window", 8, ".1f"),
         ("event_step_ms", "events", 8, ".1f"), ("wall_step_ms", "wall", 8, ".1f"),
         ("allocated_peak_gib", "alloc", 6, ".2f"), ("device_used_peak_gib", "used", 6, ".2f"),
         ("samples_per_s", "sampl/s", 8, ".1f"), ("mfu", "MFU", 6, ".1%"))  # fmt: skip


def format_row(row: dict | None) -> str:
    """One line of the printed table, or its header for None: ``TABLE``'s (CSV key, title,
    width, negative for left-aligned, format); the CSV keeps every column at full precision."""
    cells = []
    for key, title, width, spec in TABLE:
        text = title if row is None else _fmt(row[key], spec)
        cells.append(f"{text:<{-width}}" if width < 0 else f"{text:>{width}}")
    return " ".join(cells)


LEGEND = ("gaps: largest relative difference from the precision's baseline; inf: guard steps "
          "whose fp16 gradients overflowed; nf: measured steps skipped as non-finite; window: "
          "the worker's step time, events/wall: CUDA events / wall-clock of the same plain "
          "steps (ms); alloc/used: peak GiB allocated by torch / used on the device; MFU: 6 x "
          "params x tokens / window step / dense bf16 peak, fp32 (TF32) rows too")  # fmt: skip


def init_group(device: torch.device) -> None:
    """A 1-rank process group (NCCL on a GPU, gloo on the CPU) from a file store: no port."""
    store = Path(tempfile.mkdtemp(prefix="commtune-gpu-check-")) / "store"
    cuda = device.type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}", rank=0,
                            world_size=1, device_id=device if cuda else None)  # fmt: skip


def make_setup(args: argparse.Namespace) -> Setup:
    """The device, model and peak figure; the GPU's name picks the peak unless given."""
    if args.quick:
        return Setup(torch.device("cpu"), "bert-tiny", {"vocab_size": 1024}, 32, 8, None, "CPU", 4)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device; --quick runs the CPU stand-in")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    name = torch.cuda.get_device_name(device)
    key = next((k for k in DENSE_BF16_TFLOPS if k in name), None)
    peak = args.peak_tflops or (DENSE_BF16_TFLOPS[key] if key else None)
    source = "--peak-tflops" if args.peak_tflops else (f"{key} data sheet" if key else "unknown")
    return Setup(device, "bert-large", {"num_hidden_layers": args.layers}, args.seq_len,
                 args.global_batch, peak, f"{name}, {source}")  # fmt: skip


def describe(setup: Setup, quick: bool) -> str:
    """The first line: what ran where (a table without its device and versions proves little)."""
    if quick:
        return ("gpu_check: CPU QUICK MODE (gloo, bert-tiny, fp32/bf16 only): this is NOT the GPU "
                "check; it only keeps the script running")  # fmt: skip
    peak = f"{setup.peak_tflops:g} TFLOP/s" if setup.peak_tflops else "no peak known: MFU -"
    return (f"gpu_check: {setup.device} {setup.peak_name}; dense bf16 peak {peak}; torch "
            f"{torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl_version()}; bert-large "
            f"with {setup.overrides['num_hidden_layers']} layers, seq {setup.seq_len}, global "
            f"batch {setup.global_batch}")  # fmt: skip


def run_all(cases: list[Case], setup: Setup, budget_s: float, out: csv.DictWriter) -> list[dict]:
    """Every case in order, a progress line and a CSV row each as it ends (a run cut short
    keeps what it measured); a case after the budget is listed, not run."""
    # the driver's very check, from its file: importing orchestrator.search imports Optuna
    correctness = load_file_module("orchestrator/search/correctness.py", "gpu_check_correctness")
    started = time.perf_counter()
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    baselines: dict[str, Outcome] = {}
    rows = []
    for index, case in enumerate(cases, 1):
        if time.perf_counter() - started > budget_s:
            print(f"[{index:2}/{len(cases)}] {case.label}: not run (budget {budget_s:g}s spent)")
            rows.append({**dict.fromkeys(COLUMNS), "config": case.label, "guard": "not run",
                         "error": "not run: budget spent"})  # fmt: skip
            out.writerow(rows[-1])
            continue
        print(f"[{index:2}/{len(cases)}] {case.label} ...", flush=True)
        outcome = run_case(case, setup, tf32)
        if case.role == "baseline":
            baselines[case.precision] = outcome
        row = table_row(outcome, baselines.get(case.precision), setup, correctness)
        rows.append(row)
        out.writerow(row)
        state = outcome.error or f"guard {row['guard']}, {_fmt(row['window_step_ms'], '.1f')} ms"
        why = f"\n        {row['why']}" if row["why"] else ""
        print(f"        {outcome.seconds:.1f}s, {state}{why}", flush=True)
    return rows


def default_out(quick: bool) -> Path:
    """Under $OUT where the device tool sets it; the quick mode (the tests run it from the
    repository root) writes to the temp folder, not into the working tree."""
    folder = os.environ.get("OUT") or (tempfile.gettempdir() if quick else ".")
    return Path(folder) / ("gpu_check_quick.csv" if quick else "gpu_check.csv")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # fmt: off
    p.add_argument("--quick", action="store_true", help="a tiny model on the CPU over gloo, "
                   "fp32 and bf16, a few configurations (what the tests run; not the GPU check)")
    p.add_argument("--out", type=Path, default=None,
                   help="CSV path (default: $OUT/gpu_check.csv, else ./gpu_check.csv)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak "
                   f"for MFU (default: by GPU name; H200 {H200_DENSE_BF16_TFLOPS:g})")
    p.add_argument("--layers", type=int, default=8, help="bert-large's layers (24 in full)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--global-batch", type=int, default=32, help="a multiple of 4")
    p.add_argument("--budget-s", type=float, default=BUDGET_S,
                   help="start no configuration after this many seconds")
    add_results_option(p)  # under $OUT by default, where the device tool sets it
    p.set_defaults(results=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    # fmt: on
    args = p.parse_args()
    if args.global_batch % 4 or args.global_batch < 4:
        p.error("--global-batch must be a multiple of 4 (accumulation 4 splits it)")
    return args


def main() -> int:
    args = parse_args()
    with recording("benchmarks.gpu_check", None, args.results, args.quick) as figures:
        setup = make_setup(args)
        print(describe(setup, args.quick), flush=True)
        stages_failed = versions_stage(not args.quick) + nccl_values_stage(not args.quick)
        out = args.out or default_out(args.quick)
        out.parent.mkdir(parents=True, exist_ok=True)
        init_group(setup.device)
        with out.open("w", newline="", buffering=1) as f:  # line-buffered: each row as it ends
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            try:
                spent = run_worker_stages(lambda *knobs: setup.plan(Case(*knobs)), setup.device)
                rows = run_all(quick_cases() if args.quick else gpu_cases(), setup,
                               args.budget_s - spent, writer)  # fmt: skip
            finally:
                dist.destroy_process_group()
        print("\n" + "\n".join(format_row(row) for row in [None, *rows]) + f"\n{LEGEND}")
        params = max(row["num_params"] or 0 for row in rows)
        leaked = sorted({"ray", "optuna"} & {name.split(".")[0] for name in sys.modules})
        print(f"model: {params / 1e6:.1f}M parameters, {setup.global_batch * setup.seq_len} "
              f"tokens per step; table: {out}; imports: {leaked or 'torch only, no Ray, no Optuna'}"
              + ("\n(CPU quick mode: not the GPU check)" if args.quick else ""))  # fmt: skip
        failed = [row["config"] for row in rows if row["error"] or row["guard"] == "CORRUPT"]
        failed += stages_failed
        if failed:
            print(f"gpu_check: failed, corrupt or not run: {', '.join(failed)}")
        figures.update(rows=rows, failed=failed, stages_failed=stages_failed, leaked_imports=leaked)
    return 1 if failed or leaked else 0


if __name__ == "__main__":
    sys.exit(main())
