"""How a benchmark runs the project's commands: as a user does, one fresh interpreter each.

``run_module`` is the one runner: ``python -m MODULE ARGS`` from the repository root in a
session of its own, so that when the benchmark stops it (its timeout, Ctrl-C, an error) the
command and everything it started go with it, not only the direct child. ``QUICK_SEARCH`` is
the one smoke search that the benchmarks' ``--quick`` modes race: a verdict comes from it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK_PRESET = "smoke"
QUICK_ARGS = [
    "--trials", "2",
    *("--set", "search.verdict_pairs=3", "--set", "search.scaling_baseline=false"),
    *("--set", "search.prune=false"),
]  # fmt: skip
QUICK_SEARCH = ["--preset", QUICK_PRESET, *QUICK_ARGS]
"""The smoke search of a ``--quick`` mode that checks a verdict: 2 trials, a race of 3 pairs, no
1-worker baseline. No pruning: with one trial beside the baseline, a pruned trial 1 leaves no
finalist, so no race and no verdict, and the quick mode would fail on a slow window. The
quick modes that read a kept run (``delivered``, ``overhead``) read one of these."""


TEARDOWN_ABORT = "terminate called without an active exception"
"""What torch prints when a gloo worker thread outlives the interpreter's teardown: SIGABRT at
exit, after the work is done (pytorch/pytorch#179291), even where the group was destroyed."""


@dataclass(frozen=True)
class Ran:
    """A finished command: its exit code, output and wall-clock."""

    returncode: int
    stdout: str
    stderr: str
    """Empty when streamed: stderr then goes into ``stdout``, in order."""
    seconds: float


def run_module(
    module: str, args: list[str], *, check: bool = True, timeout_s: float | None = None,
    on_line: Callable[[str], None] | None = None, env: dict[str, str] | None = None,
) -> Ran:  # fmt: skip
    """``python -m module *args``; with ``on_line``, each output line as it comes (stderr merged
    in). ``check``: a non-zero exit ends the benchmark, naming the command and its output's
    tail. Past ``timeout_s`` the command's session is ended and the benchmark stops. ``env``:
    the command's whole environment (default: this process's)."""
    cmd = [sys.executable, "-m", module, *args]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.STDOUT if on_line else subprocess.PIPE,
                            start_new_session=True, env=env)  # fmt: skip
    fired = threading.Event()
    timer = threading.Timer(timeout_s, lambda: (fired.set(), _end(proc))) if timeout_s else None
    try:
        if timer:
            timer.start()
        if on_line is None:
            out, err = proc.communicate()
        else:
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:
                lines.append(line)
                on_line(line.rstrip("\n"))
            out, err = "".join(lines), ""
            proc.wait()
    except BaseException:
        _end(proc)
        raise
    finally:
        if timer:
            timer.cancel()
    ran = Ran(proc.returncode, out, err, time.monotonic() - started)
    shown = shlex.join(cmd[1:])
    if fired.is_set():
        raise SystemExit(f"{shown} ran past {timeout_s:g} s and was ended:\n{_tail(ran)}")
    if check and ran.returncode != 0:
        raise SystemExit(f"{shown} exited {ran.returncode}:\n{_tail(ran)}")
    return ran


def _tail(ran: Ran) -> str:
    return ran.stdout[-3000:] + ran.stderr[-3000:]


def _end(proc: subprocess.Popen) -> None:
    """End the command's session (it and all it started), then reap it."""
    with contextlib.suppress(ProcessLookupError):  # it ended by itself
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
