"""What a cold ``orchestrator.train`` costs with and without Ray Train's preemption watcher.

A local Ray runs no watcher (``orchestrator/session.py`` ``LOCAL_ENV``): one machine has no spot
node to lose, and the watcher is a process every worker group starts. This runs the smoke
preset's training from a cold start (its own local Ray each time), watcher on and off in turns
(on/off, then off/on, ...: a slow drift of the machine cancels), and prints each run's
wall-clock and the busy CPU-seconds of the whole machine over it (``/proc/stat``: Ray's own
processes included, which a child's rusage misses), then the median off/on ratios. Nothing
else should run meanwhile: the CPU figure counts every process.

    python -m benchmarks.cold_start                 # 3 pairs of 40 steps
    python -m benchmarks.cold_start --quick         # 1 pair of 10 steps (the tests')
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

from orchestrator.paired import pair_order

ROOT = Path(__file__).resolve().parents[1]
WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


def busy_cpu_s() -> float:
    """The machine's busy CPU-seconds since boot (user, nice, system, irq, softirq)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def cold_run(watcher: bool, steps: int, out: Path) -> tuple[float, float]:
    """One cold smoke training run: (wall-clock s, busy CPU-s of the machine)."""
    env = {**os.environ, WATCHER: "1" if watcher else "0"}
    cmd = [sys.executable, "-m", "orchestrator.train", "--preset", "smoke", "--steps",
           str(steps), "--checkpoint-every", str(steps), "--out", str(out)]  # fmt: skip
    cpu, wall = busy_cpu_s(), time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall, cpu = time.monotonic() - wall, busy_cpu_s() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}"
                         f"{done.stderr[-3000:]}")  # fmt: skip
    return wall, cpu


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--quick", action="store_true", help="1 pair of 10 steps (the tests')")
    args = ap.parse_args(argv)
    pairs, steps = (1, 10) if args.quick else (args.pairs, args.steps)
    ratios: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            got = {}
            for side in pair_order(i):  # the watcher on first in even pairs, off first in odd
                watcher = side == "baseline"
                got[watcher] = cold_run(watcher, steps, Path(tmp) / f"{i}-{watcher}")
            (on_wall, on_cpu), (off_wall, off_cpu) = got[True], got[False]
            print(f"pair {i + 1}: watcher on {on_wall:.1f} s, {on_cpu:.0f} CPU-s | "
                  f"off {off_wall:.1f} s, {off_cpu:.0f} CPU-s", flush=True)  # fmt: skip
            ratios.append((off_wall / on_wall, off_cpu / on_cpu))
    wall = statistics.median(r[0] for r in ratios)
    cpu = statistics.median(r[1] for r in ratios)
    print(f"off / on: wall-clock {wall:.2f}x, busy CPU {cpu:.2f}x (median of {pairs} pairs of "
          f"{steps}-step cold runs)")  # fmt: skip


if __name__ == "__main__":
    main()
