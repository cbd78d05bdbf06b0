"""The GPU check: what can only be verified on a machine with GPUs, as one prepared script.

From the project root on a GPU machine, in under 8 minutes (each phase has its own time limit,
and a phase that fails is reported and the next one runs):

1. ``worker``: the worker loop alone, without Ray (one rank, NCCL): the built-in bert-large
   workload in bf16, DDP, timed two ways side by side (profiled steps, a device sync at each
   phase boundary, vs plain steps, one sync per step), samples/s and model FLOP utilisation
   (6 x params x tokens/s over the GPU's dense bf16 peak, the peak named in the output);
2. ``smoke``: the smoke search on GPU (``--preset smoke``, NCCL);
3. ``bert-large``: a short bert-large search under a time budget;
4. ``probe``: the bandwidth probe;
5. ``train``: a 30-step training run with a checkpoint.

Phases 2-5 need Ray and Optuna. On a GPU machine without a package index (Python 3.12, a CUDA
torch and transformers, nothing else), bring them as wheels from a machine that has one::

    python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux2014_x86_64 -d .whl "ray[train,tune]==2.60.*" "optuna>=4" pyyaml
    # there: python3 -m pip install --no-index --target /tmp/site .whl/*.whl
    #        PYTHONPATH=/tmp/site python3 -m benchmarks.gpu_check

Phase 1 runs with torch alone. ``--phases worker`` picks phases; ``--out`` is where runs go;
``--quick`` runs phase 1 on the CPU with a tiny model (what the tests run).
One GPU is one rank: NCCL's algorithm and protocol choice is not exercised there (a local
copy), GPU correctness and speed are.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DENSE_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "V100": 125.0}
"""Dense (no sparsity) bf16 peaks from the vendors' data sheets (V100: fp16 tensor cores)."""
PHASES = ("worker", "smoke", "bert-large", "probe", "train")
LIMIT_S = {"worker": 120, "smoke": 150, "bert-large": 180, "probe": 90, "train": 120}


def peak_tflops(name: str) -> tuple[str, float | None]:
    for key, value in DENSE_BF16_TFLOPS.items():
        if key in name:
            return key, value
    return name, None


def worker_phase(steps: int = 12, quick: bool = False) -> list[str]:
    """The worker loop on this GPU, without Ray: per-phase syncs vs one sync per step.
    ``quick``: bert-tiny on the CPU over gloo, 2 steps (the same code path, no GPU figures)."""
    import torch
    import torch.distributed as dist

    from train_fns.loop import build_runner
    from train_fns.plan import TrialPlan

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo" if quick else "nccl", rank=0, world_size=1)
    device = torch.device("cpu") if quick else torch.device("cuda", 0)
    model, seq_len, precision = ("bert-tiny", 64, "fp32") if quick else ("bert-large", 512, "bf16")
    steps = 2 if quick else steps
    if not quick:
        torch.cuda.set_device(device)
    plan = TrialPlan(model=model, task="mlm", seq_len=seq_len, global_batch=16, world_size=1,
                     accumulation_steps=1, micro_batch=16, precision=precision,
                     use_gpu=not quick)  # fmt: skip
    runner, _ = build_runner(plan, 0, device)
    lines, name = [], "CPU" if quick else torch.cuda.get_device_name(device)
    gpu, peak = peak_tflops(name)
    sync = (lambda: None) if quick else torch.cuda.synchronize
    for sync_phases in (True, False):
        for step in range(3):
            runner.run_step(step, profiled=sync_phases)  # warm-up
        sync()
        start = time.perf_counter()
        for step in range(3, 3 + steps):
            runner.run_step(step, profiled=sync_phases)
        sync()
        per_s = plan.global_batch * steps / (time.perf_counter() - start)
        flops = 6 * runner.num_params * plan.seq_len * per_s
        mfu = f"{flops / (peak * 1e12):.1%} of {gpu} dense bf16 {peak:g} TFLOP/s" if peak else (
            f"{flops / 1e12:.2f} TFLOP/s (no peak known for {name})")  # fmt: skip
        how = "per-phase syncs" if sync_phases else "one sync per step"
        lines.append(f"worker: {model} {precision} DDP x1, {how}: {per_s:.1f} samples/s, "
                     f"MFU {mfu}")  # fmt: skip
    if not quick:
        peak_gib = torch.cuda.max_memory_allocated(device) / 2**30
        lines.append(f"worker: peak memory {peak_gib:.1f} GiB; NCCL {torch.cuda.nccl.version()}")
    dist.destroy_process_group()
    return lines


def cli_phase(name: str, out: Path) -> list[str]:
    """One of the CLI phases as a subprocess; its last lines."""
    commands = {
        "smoke": ["orchestrator.search", "--preset", "smoke", "--out", str(out / "smoke"),
                  "--set", "cluster.num_workers=1", "--set", "workload.global_batch=16"],
        "bert-large": ["orchestrator.search", "--preset", "bert-large", "--out",
                       str(out / "bert-large"), "--set", "cluster.num_workers=1",
                       "--trials", "6", "--time-budget", "2"],
        "probe": ["orchestrator.probe", "--workers", "1", "--out", str(out / "probe")],
        "train": ["orchestrator.train", "--preset", "smoke", "--set", "cluster.num_workers=1",
                  "--set", "workload.global_batch=16", "--steps", "30",
                  "--checkpoint-every", "15", "--out", str(out / "train")],
    }  # fmt: skip
    done = subprocess.run([sys.executable, "-m", *commands[name]], cwd=ROOT, text=True,
                          capture_output=True, timeout=LIMIT_S[name])  # fmt: skip
    tail = (done.stdout + done.stderr).strip().splitlines()[-6:]
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}\n" + "\n".join(tail))
    return [f"  {line}" for line in tail]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {PHASES}")
    p.add_argument("--out", default=None, help="where the runs go (default: a temp folder)")
    p.add_argument("--quick", action="store_true",
                   help="the worker phase alone, on the CPU over gloo with bert-tiny (no GPU; "
                   "what the tests run, so the script cannot rot)")  # fmt: skip
    args = p.parse_args()
    if args.quick:
        args.phases = "worker"
    out = Path(args.out or tempfile.mkdtemp(prefix="commtune-gpu-check-"))
    for phase in [x.strip() for x in args.phases.split(",") if x.strip()]:
        started = time.monotonic()
        try:
            lines = worker_phase(quick=args.quick) if phase == "worker" else cli_phase(phase, out)
            status = "ok"
        except Exception as e:  # the next phase still runs; this one says why
            lines, status = [f"{phase}: {type(e).__name__}: {e}"], "FAILED"
        print(f"== {phase}: {status} in {time.monotonic() - started:.0f}s", flush=True)
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
