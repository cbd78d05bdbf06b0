"""Running ``orchestrator.search`` as a user does, and killing it in trial 1 (a node loss) or
pressing Ctrl-C there: the search holds at the start of trial 1 (``train_fns.hold``) until the
test has acted, so the kill lands there every time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _procs
import optuna

from train_fns.hold import HOLD_DIR_VAR

FAST = [
    "--preset",
    "smoke",
    "--set",
    "search.remeasure_top=0",
    "--set",
    "strategy=ddp",
    "--set",
    "search.scaling_baseline=false",
]
"""The smoke search without its verdict's race or its 1-worker baseline (a cold group start
each, the most of a smoke search's time): for tests of the trials themselves."""
SEARCH_TIMEOUT_S = 420
"""One smoke search's limit: under pytest's per-test timeout (pyproject.toml)."""


def cli(args: list[str], timeout: float = SEARCH_TIMEOUT_S, **kw) -> _procs.Finished:
    return _procs.python("orchestrator.search", args, timeout=timeout, **kw)


class Holds:
    """A folder of kill points (``train_fns.hold``) for the commands a test starts."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder

    def env(self) -> dict[str, str]:
        return {**os.environ, HOLD_DIR_VAR: str(self.folder)}

    def arm(self, *names: str) -> None:
        for name in names:
            (self.folder / f"{name}.arm").touch()

    def wait(self, name: str, proc: subprocess.Popen, timeout_s: float = 300) -> None:
        """Until a process of ``proc``'s holds at ``name``; fails if ``proc`` ends first."""
        deadline = time.monotonic() + timeout_s
        while not (self.folder / f"{name}.held").exists():
            assert proc.poll() is None, f"the command ended before it reached {name}"
            assert time.monotonic() < deadline, f"{name} was never reached"
            time.sleep(0.1)

    def release(self, name: str) -> None:
        (self.folder / f"{name}.release").touch()


def kill_in_second_trial(args: list[str], storage: str, holds: Holds) -> float:
    """Start a search, SIGKILL its driver and everything it started (what a node loss takes)
    while trial 1 holds at its start; return trial 0's throughput (what the resumed study must
    keep)."""
    proc, owner, first = _start_in_second_trial(args, storage, holds, subprocess.DEVNULL)
    _procs.end(owner)
    proc.wait()
    return first


def interrupt_in_second_trial(
    args: list[str], storage: str, holds: Holds, log: Path
) -> tuple[int, dict[int, str]]:
    """Start a search (its stderr to ``log``) and press Ctrl-C (SIGINT to its process group)
    while trial 1 holds at its start: (exit code, its processes alive 10 s after it ended)."""
    with log.open("w") as err:
        proc, owner, _ = _start_in_second_trial(args, storage, holds, err)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    return proc.returncode, _procs.wait_gone(owner, timeout_s=10)


def _start_in_second_trial(
    args: list[str], storage: str, holds: Holds, stderr: Any
) -> tuple[subprocess.Popen, str, float]:
    """The search, held at trial 1's start once trial 0 is on record: (it, its owner mark,
    trial 0's throughput)."""
    holds.arm("trial-1")
    owner = _procs.new_owner("search")
    proc = _procs.start(
        [sys.executable, "-m", "orchestrator.search", *args], owner, holds.env(),
        stdout=subprocess.DEVNULL, stderr=stderr,
    )  # fmt: skip
    try:
        holds.wait("trial-1", proc)
        # the searcher tells the study trial 0's result before it sends trial 1
        first = optuna.load_study(study_name="smoke", storage=storage).trials[0]
        assert first.state.is_finished(), "trial 1 was sent before trial 0 was recorded"
    except BaseException:
        _procs.end(owner)  # held: it would wait for a release that never comes
        raise
    return proc, owner, first.user_attrs["samples_per_s"]
