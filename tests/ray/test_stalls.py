"""No silent stalls: a worker frozen (SIGSTOP) is caught by the driver within its bound,
recorded with the phase it hung in, its processes are gone, and the search goes on.

A frozen process cannot run its own watchdog, so these freeze a real Ray Train worker from
outside and time the user's line that says so.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S, HEARTBEAT_S = 20, 5


def _workers() -> dict[int, str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    rows = (line.strip().split(None, 1) for line in ps.splitlines()[1:])
    return {int(pid): args for pid, args in rows if "RayTrainWorker" in args}


class _Search:
    """The search command as a user runs it, stdout a pipe (not a terminal), each line timed."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.search", *args], cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))

    def first(self, text: str, timeout_s: float) -> tuple[float, str]:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            found = next(((t, line) for t, line in self.lines if text in line), None)
            if found:
                return found
            time.sleep(0.2)
        self.proc.kill()
        raise AssertionError(f"no line with {text!r}:\n" + self.text())

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)[-6000:]


@pytest.mark.slow
def test_a_worker_frozen_while_its_group_starts_is_a_hang_in_phase_start(tmp_path: Path) -> None:
    out = tmp_path / "stall"
    search = _Search([
        "--preset", "smoke", "--out", str(out), "--trials", "3",
        "--set", "search.warm=false", "--set", "search.remeasure_top=0",
        "--set", "search.scaling_baseline=false", "--set", "search.prune=false",
        "--set", f"search.start_timeout_s={START_TIMEOUT_S}",
        "--set", f"search.heartbeat_s={HEARTBEAT_S}", "--set", "search.trial_timeout_s=600",
    ])  # fmt: skip
    search.first("trial   0 ", timeout_s=300)
    before = set(_workers())
    end = time.monotonic() + 120
    while not (new := set(_workers()) - before) and time.monotonic() < end:
        time.sleep(0.05)
    assert new, "trial 1's worker group never appeared:\n" + search.text()
    frozen = min(new)
    os.kill(frozen, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        seen_at, line = search.first("trial   1     HANG", timeout_s=START_TIMEOUT_S + 120)
        rc = search.proc.wait(timeout=400)
    finally:
        if search.proc.poll() is None:
            search.proc.kill()
        if frozen in _workers():
            os.kill(frozen, signal.SIGKILL)
    took_s = seen_at - stopped_at
    print(f"freeze while starting -> the user's line: {took_s:.1f} s ({line})")
    assert rc == 0, search.text()
    assert "phase start" in line and f"start_timeout_s={START_TIMEOUT_S}" in line
    assert took_s < START_TIMEOUT_S + 15, search.text()
    assert "trial 1: starting 2 workers" in search.text()  # a heartbeat, though not a terminal
    rows = {int(r["number"]): r for r in csv.DictReader((out / "trials.csv").open())}
    assert rows[1]["state"] == "hang" and rows[1]["phase"] == "start"
    assert rows[2]["state"] == "complete"
    assert float(rows[1]["trial_wall_s"]) >= START_TIMEOUT_S
    assert float(rows[1]["start_s"]) >= START_TIMEOUT_S  # its wait is not hidden
    assert frozen not in _workers() and not _workers(), "no worker survives the search"
