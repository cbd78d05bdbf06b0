"""Every benchmark keeps running and leaves its record: each script under benchmarks/ (its
folders too) has a ``--quick`` mode, and the slow tier runs it as a user would, ``python -m
benchmarks.NAME --quick``, checking the line that carries its figure and the one record it
writes into the folder the test gives it (``COMMTUNE_RESULTS``), never into the repository. A
new benchmark without a quick mode, or one this file does not run, fails the first test (in the
quick tier: it reads files only)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import _procs
import pytest

from benchmarks import _record

ROOT = Path(__file__).resolve().parents[2]
QUICK = {
    "calibration.bad_inputs": r"\| 2 \| [0-9.]+ \| .*error: .*\n\n2 bad inputs; slowest",
    "calibration.search_efficiency": r"target staged median <= grid/5 .*\n.*8xA100-nvlink",
    "gpu_check": (r"NOT the GPU check[\s\S]*\nfp32 ddp acc1 \(baseline again\) +ok +[0-9.e+-]+ "
                  r"[\s\S]*; imports: torch only, no Ray, no Optuna\n"),
    "calibration.step_noise": r"\nthe switch step alone \| [0-9.]+ \| [0-9.]+%\n?",
    "calibration.tune_aa": (r"decision 3: [a-z ]+ at [0-9.]+x from \d pair\(s\)[\s\S]*"
                            r"false keeps: \d of 3 decisions \(\d+%\) at δ 2%"),
    "trainer_export": (r"exported / defaults: median [0-9.]+ \(range [0-9.]+-[0-9.]+ over 1 "
                       r"paired runs\)\ncommtune's verdict for the same run: no verdict recorded"),
}
"""Script -> what its quick output must hold (no Ray: seconds each)."""
SEARCHES = {
    "overhead": (r"reading smoke \(warm\) from .*run0\n[\s\S]*smoke +warm +2 +\(read\) "
                 r"[\s\S]*smoke: warm/cold trials wall-clock [0-9.]+x, measured share"
                 r"[\s\S]*smoke: warm and cold order [01]/1 pairs of the 2 configurations"),
    "calibration.record_grid": (r"accumulation_steps,.*samples_per_s,cv,state\n"
                                r"(1|2|4|8),.*,[0-9.]+,[0-9.]+,complete"),
    "calibration.verdicts": r"run 1/1 \.\.\.\n  \d+ s; \d+/\d+ disturbed",
    "calibration.aa_verdict": (r"quiet: 3 decisions: .*\n"
                               r"false keeps: \d of 3 decisions \(\d+%\) at δ 2%"),
    "delivered": (r"pair 1: trial \d+ [0-9.]+ vs baseline [0-9.]+ samples/s = [0-9.]+; "
                  r"over the wall-clock [0-9.]+\n"
                  r"delivered: [0-9.]+x from 1 pair \(an interval needs two: --rounds 2 or more\)"
                  r" of 12-step training runs\n"
                  r"delivered over the wall-clock: [0-9.]+x from 1 pair"
                  r"[\s\S]*the verdict's ratio [0-9.]+ for trial \d+ is not checked: one pair"),
    "tune_online": (r"round 1, \(a\) untuned: \d+s, trained at [0-9.]+ samples/s[\s\S]*"
                    r"round 1, \(c\) train --tune: \d+s[\s\S]*"
                    r"a/c wall: [0-9.]+x from 1 pair[\s\S]*"
                    r"\(c\)'s final loss against \(a\)'s: [+-][0-9.]+%"),
}
"""Script -> what its quick output must hold (real searches: half a minute to a few minutes
each)."""


def _scripts() -> set[str]:
    """Every runnable script under benchmarks/, by its dotted name below ``benchmarks.``."""
    found = (p.relative_to(ROOT / "benchmarks").with_suffix("")
             for p in (ROOT / "benchmarks").rglob("*.py")
             if 'if __name__ == "__main__"' in p.read_text())  # fmt: skip
    return {".".join(p.parts) for p in found}


def test_every_benchmark_has_a_quick_mode_that_a_test_runs() -> None:
    scripts = _scripts()
    assert scripts == set(QUICK) | set(SEARCHES), "run each benchmark's --quick here"
    assert not set(QUICK) & set(SEARCHES), "each benchmark once"
    for name in scripts:
        path = ROOT / "benchmarks" / f"{name.replace('.', '/')}.py"
        assert '"--quick"' in path.read_text() and "recording(" in path.read_text(), name


def _quick(name: str, pattern: str, timeout_s: float, results: Path, *args: str) -> None:
    env = {**os.environ, _record.RESULTS_ENV: str(results)}
    proc = _procs.python(f"benchmarks.{name}", [*args, "--quick"], timeout=timeout_s, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert re.search(pattern, proc.stdout), out[-3000:]
    (path,) = results.iterdir()
    record = _record.read(path)
    assert record.benchmark == name.rsplit(".", 1)[-1] and record.figures, record
    assert record.command.endswith(f"-m benchmarks.{name} {' '.join([*args, '--quick'])}"), (
        record.command
    )
    assert re.search(pattern, "\n".join(record.printed) + "\n"), record.printed[-20:]


ON_A_KEPT_RUN = {"delivered": "calibration.verdicts", "overhead": "calibration.verdicts"}
"""Script -> the benchmark whose kept smoke search it reads (``RUN --quick``): one search, not
three, for the three quick modes (``overhead`` reads it as its warm search)."""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QUICK) + sorted(set(SEARCHES) - set(ON_A_KEPT_RUN)))
def test_quick_benchmark_runs(name: str, tmp_path: Path) -> None:
    if name in ON_A_KEPT_RUN.values():
        return _searched_then_read(name, tmp_path)
    _quick(name, QUICK.get(name) or SEARCHES[name], timeout_s=480, results=tmp_path)


@pytest.mark.slow
def test_step_noise_rebuild_runs(tmp_path: Path) -> None:
    """``step_noise --rebuild``: each visit a fresh trial plan through the trial's own path,
    the window after 3 and after 2 warm-up steps side by side (seconds, no Ray)."""
    pattern = r"\n3 \| 3-3 \| [0-9.]+ \| [0-9.]+% \| 1\.000 \| 1\.000\n2 \| 2-2 \| [0-9.]+ \| "
    _quick("calibration.step_noise", pattern, 240, tmp_path, "--rebuild")


def _searched_then_read(name: str, tmp_path: Path) -> None:
    """``name --quick --keep DIR``, then each benchmark that reads its run: ``RUN --quick``."""
    kept = tmp_path / "kept"
    (tmp_path / name).mkdir()
    _quick(name, SEARCHES[name], 480, tmp_path / name, "--keep", str(kept))
    for reader in (r for r, source in ON_A_KEPT_RUN.items() if source == name):
        (tmp_path / reader).mkdir()
        _quick(reader, SEARCHES[reader], 480, tmp_path / reader, str(kept / "run0"))
