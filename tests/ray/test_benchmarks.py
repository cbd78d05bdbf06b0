"""Every benchmark keeps running: each script under benchmarks/ has a ``--quick`` mode, and the
slow tier runs it as a user would, ``python -m benchmarks.NAME --quick``, checking the line that
carries its figure. A new benchmark without a quick mode, or one this file does not run, fails
the first test (in the quick tier: it reads files only)."""

from __future__ import annotations

import re
from pathlib import Path

import _procs
import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICK = {
    "bad_inputs": r"\| 2 \| [0-9.]+ \| .*error: .*\n\n2 bad inputs; slowest",
    "search_efficiency": r"target staged median <= grid/5 .*\n.*8xA100-nvlink",
    "gpu_check": (r"NOT the GPU check[\s\S]*\nfp32 ddp acc1 \(baseline again\) +ok +[0-9.e+-]+ "
                  r"[\s\S]*; imports: torch only, no Ray, no Optuna\n"),
    "workload_contract": r"smoke in one process: forward\+backward contract / before = [0-9.]+",
    "step_noise": r"\nthe switch step alone \| [0-9.]+ \| [0-9.]+%\n?",
    "host_malloc": (r"\ntuned: mean step [0-9.]+ s, .* page faults .*\n"
                    r"tuned vs defaults: [0-9.]+x faster \(95% interval [0-9.]+-[0-9.]+ over 2 "),
    "futility": r"\n8% \| 1\.00 \| new \| 0% \| \d+% \| \d+% \| \d+% \| [0-9.]+\n",
    "race_focus": r"\n6% \| 1\.08, 1\.04 \| leader \| \d+% \| \d+% \| \d+% \| \d+% \| [0-9.]+\n",
    "trainer_export": (r"exported / defaults: median [0-9.]+ \(range [0-9.]+-[0-9.]+ over 1 "
                       r"paired runs\)\ncommtune's verdict for the same run: no verdict recorded"),
}
"""Script -> what its quick output must hold (no Ray: seconds each)."""
SEARCHES = {
    "overhead": r"smoke: warm/cold trials wall-clock [0-9.]+x, measured share",
    "record_grid": (r"accumulation_steps,.*samples_per_s,cv,state\n"
                    r"(1|2|4|8),.*,[0-9.]+,[0-9.]+,complete"),
    "verdicts": r"run 1/1 \.\.\.\n  \d+ s; \d+/\d+ disturbed",
    "unused_cost": r"on / off: median [0-9.]+ \(range [0-9.]+-[0-9.]+ over 2 paired runs\)",
    "aa_verdict": r"quiet: 3 decisions: .*\nfalse keeps: \d of 3 decisions \(\d+%\) at δ 2%",
    "delivered": (r"pair 2: trial \d+ [0-9.]+ vs baseline [0-9.]+ samples/s = [0-9.]+\n"
                  r"delivered: [0-9.]+x \(interval [0-9.]+-[0-9.]+ from 2 pairs of 12-step"
                  r"[\s\S]*the verdict's ratio [0-9.]+ for trial \d+ is (inside|OUTSIDE)"),
}
"""Script -> what its quick output must hold (real searches, or a warm group of spawned ranks:
half a minute to a few minutes each)."""


def _scripts() -> set[str]:
    return {p.stem for p in (ROOT / "benchmarks").glob("*.py")
            if 'if __name__ == "__main__"' in p.read_text()}  # fmt: skip


def test_every_benchmark_has_a_quick_mode_that_a_test_runs() -> None:
    scripts = _scripts()
    assert scripts == set(QUICK) | set(SEARCHES), "run each benchmark's --quick here"
    assert not set(QUICK) & set(SEARCHES), "each benchmark once"
    for name in scripts:
        assert '"--quick"' in (ROOT / "benchmarks" / f"{name}.py").read_text(), name


def _quick(name: str, pattern: str, timeout_s: float) -> None:
    proc = _procs.python(f"benchmarks.{name}", ["--quick"], timeout=timeout_s)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(pattern, proc.stdout), out[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QUICK) + sorted(SEARCHES))
def test_quick_benchmark_runs(name: str) -> None:
    _quick(name, QUICK.get(name) or SEARCHES[name], timeout_s=480)
