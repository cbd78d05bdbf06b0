"""Running ``orchestrator.search`` as a user does, and killing it mid-search (a node loss)."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--preset", "smoke", "--set", "search.remeasure_top=0", "--set", "strategy=ddp",
        "--set", "search.scaling_baseline=false"]
"""The smoke search without its verdict's race or its 1-worker baseline (a cold group start
each, the most of a smoke search's time): for tests of the trials themselves."""


def cli(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.search", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        **kw,
    )


def kill_during_second_trial(args: list[str], storage: str) -> float:
    """Start a search, SIGKILL its driver and its Ray session once trial 1 runs; return trial 0's
    throughput (what the resumed study must keep)."""
    proc, first = _start_until_second_trial(args, storage, subprocess.DEVNULL)
    session = os.path.realpath("/tmp/ray/session_latest")
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything in its session
    proc.wait()
    for pid in _ray_session_pids(os.path.basename(session)):  # what a node loss would take too
        os.kill(pid, signal.SIGKILL)
    return first


def interrupt_during_second_trial(
    args: list[str], storage: str, log: Path
) -> tuple[int, list[int]]:
    """Start a search (its stderr to ``log``) and press Ctrl-C (SIGINT to its process group)
    once trial 1 runs: (exit code, the pids of its Ray session alive 10 s after it ended)."""
    with log.open("w") as err:
        proc, _ = _start_until_second_trial(args, storage, err)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    time.sleep(10)
    sessions = glob.glob(f"/tmp/ray/session_*_{proc.pid}")  # the session this driver started
    assert len(sessions) == 1, sessions
    return proc.returncode, _ray_session_pids(os.path.basename(sessions[0]))


def _start_until_second_trial(
    args: list[str], storage: str, stderr: Any
) -> tuple[subprocess.Popen, float]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.search", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )
    return proc, _wait_for_second_trial(storage, proc)


def _ray_session_pids(session: str) -> list[int]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in ps.splitlines() if session in line]


def _wait_for_second_trial(storage: str, proc: subprocess.Popen) -> float:
    """Wait until trial 0 completed and trial 1 runs; return trial 0's throughput."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the search ended before it could be killed"
        try:
            trials = optuna.load_study(study_name="smoke", storage=storage).trials
        except Exception:  # not created yet
            trials = []
        if len(trials) >= 2 and trials[0].state.is_finished():
            time.sleep(1)  # well inside trial 1
            return trials[0].user_attrs["samples_per_s"]
        time.sleep(1)
    raise AssertionError("trial 1 never started")
