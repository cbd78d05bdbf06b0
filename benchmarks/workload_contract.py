"""Does the workload contract cost anything? The built-in Hugging Face workload measured through
it (this tree) and without it (a git revision from before the contract), side by side in one
run, alternating, on the same machine.

Each run is a real one-trial search (the untouched baseline only, no re-measurement, no scaling
baseline) of ``--preset`` (cpu-demo by default); the figure is the trial's samples/s (median
window). The older revision is checked out with ``git worktree`` into a temporary folder and run
from there.

    python -m benchmarks.workload_contract --rounds 3           # 8000939 vs c182516 (~15 min)
    python -m benchmarks.workload_contract --in-process 30     # one process, ~3 min
    python -m benchmarks.workload_contract --quick             # smoke, 4 pairs (the tests')

The contract alone is its commit c182516 against its parent 8000939 (the defaults): both time a
step alike. A wider pair (e.g. ``--before e0dbb9a --after 2ff7b2f``) measures every change
between them too, and later revisions time a step otherwise (a window's step is
its median step; batches are built before the step's clock starts), so ``--after`` must name a
revision that times steps as ``--before`` does. Windows hold an odd number of steps
(``search.measure_steps=15`` over 3 windows) so the median step is a real middle one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.runfiles import TRIALS_CSV, read_csv

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "8000939"
"""The parent of the contract's commit (c182516): its worker built the HF model and batches
directly."""
AFTER = "c182516"
"""The contract's commit."""
ONE_TRIAL = [
    *("--set", "search.trials=1", "--set", "search.remeasure_top=0"),
    *("--set", "search.scaling_baseline=false", "--set", "search.cost_model_seeds=0"),
    *("--set", "search.measure_steps=15"),  # 5 steps a window: an odd count, a true median
]


def baseline_samples_per_s(tree: Path, preset: str, out: Path) -> float:
    """One baseline-only search run from ``tree``; its trial's samples/s."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.search", "--preset", preset, "--out", str(out),
         *ONE_TRIAL], cwd=tree, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: search failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    (row,) = read_csv(out / TRIALS_CSV)
    return float(row["samples_per_s"])


def _checkout(revision: str, where: Path) -> Path:
    """A detached worktree of ``revision`` (removed by the caller)."""
    subprocess.run(["git", "worktree", "add", "--detach", str(where), revision], cwd=ROOT,
                   check=True, capture_output=True)  # fmt: skip
    return where


def in_process(preset: str, pairs: int) -> None:
    """Both step paths on one model in this process, alternating (ABBA), 1 thread: the
    batch-making and forward+backward of micro-step 0 before the contract (``BatchSource.batch``
    and ``model(**batch).loss``) and through it (the workload's ``batch(indices)``, ``pinned``,
    ``to_device`` and ``loss``, as ``StepRunner`` calls them). No process or Ray noise between
    the two, so a cost of a fraction of a percent would show."""
    import torch

    from orchestrator.config.schema import load_config
    from orchestrator.planning.from_config import plan_from_config, resolve_task
    from train_fns.data import make_batch_source, sample_indices
    from train_fns.hf_workload import hf_workload
    from train_fns.workload import pinned, to_device

    torch.set_num_threads(1)  # a worker of cpus_per_worker=1
    config = load_config(preset=preset)
    plan = plan_from_config(config, resolve_task(config), False, {}, config.cluster.num_workers, {})
    torch.manual_seed(plan.seed)
    workload, cpu = hf_workload(plan), torch.device("cpu")
    model, source = workload.model, make_batch_source(plan, workload.model.config)

    def before(step: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        batch = source.batch(0, step, 0, cpu)
        t1 = time.perf_counter()
        model(**batch).loss.backward()
        return t1 - t0, time.perf_counter() - t1

    def contract(step: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        indices = list(sample_indices(plan, 0, step, 0))
        batch = to_device(pinned(workload.batch(indices), cpu), cpu)
        t1 = time.perf_counter()
        workload.loss(model, batch).backward()
        return t1 - t0, time.perf_counter() - t1

    times: dict[str, list[tuple[float, float]]] = {"before": [], "contract": []}
    for k in range(pairs + 1):  # the first pair warms up and is dropped
        order = (("before", before), ("contract", contract))
        for name, path in order if k % 2 else order[::-1]:
            times[name].append(path(k))
            model.zero_grad(set_to_none=True)
    ratios = [c[1] / b[1] for b, c in zip(times["before"][1:], times["contract"][1:], strict=True)]
    for name, rows in times.items():
        data, step = (statistics.median(col) for col in zip(*rows[1:], strict=True))
        fastest = min(row[1] for row in rows[1:])  # a shared machine's noise only adds time
        print(f"{name:8s} batch {data * 1e3:7.2f} ms   forward+backward median "
              f"{step * 1e3:8.1f} ms, fastest {fastest * 1e3:8.1f} ms")  # fmt: skip
    q = statistics.quantiles(ratios, n=4)
    print(f"{preset} in one process: forward+backward contract / before = "
          f"{statistics.median(ratios):.4f} (median of {pairs} paired steps; quartiles "
          f"{q[0]:.4f}-{q[2]:.4f})")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu-demo")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--before", default=BEFORE, help="git revision without the contract")
    p.add_argument("--after", default=AFTER,
                   help="git revision with the contract ('.': this tree)")  # fmt: skip
    p.add_argument("--in-process", type=int, metavar="PAIRS",
                   help="instead: both step paths on one model in this process, PAIRS pairs")
    p.add_argument("--quick", action="store_true",
                   help="--in-process 4 on the smoke preset (seconds; what the tests run)")
    args = p.parse_args()
    if args.quick:
        return in_process("smoke", 4)
    if args.in_process:
        return in_process(args.preset, args.in_process)
    with tempfile.TemporaryDirectory(prefix="commtune-contract-") as tmp:
        old = _checkout(args.before, Path(tmp) / "before")
        new = ROOT if args.after == "." else _checkout(args.after, Path(tmp) / "after")
        try:
            figures: dict[str, list[float]] = {"before": [], "contract": []}
            for r in range(args.rounds):  # alternate, so drift hits both alike
                for name, tree in (("before", old), ("contract", new)):
                    value = baseline_samples_per_s(tree, args.preset, Path(tmp) / f"{name}{r}")
                    figures[name].append(value)
                    print(f"round {r + 1}: {name:8s} {value:8.2f} samples/s", flush=True)
        finally:
            for tree in {old, new} - {ROOT}:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                               capture_output=True)  # fmt: skip
    before, contract = (statistics.median(figures[k]) for k in ("before", "contract"))
    spread = max(statistics.pstdev(v) / statistics.fmean(v) for v in figures.values())
    print(f"{args.preset}: contract / before = {contract / before:.3f} (medians {contract:.2f} vs "
          f"{before:.2f} samples/s; largest run-to-run spread {spread:.1%})")  # fmt: skip


if __name__ == "__main__":
    main()
