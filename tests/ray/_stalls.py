"""Freezing a real worker from outside: a command run as a user runs it (stdout a pipe, each
line timed) and the Ray Train workers it started (found by its owner mark, ``_procs``: the
machine is shared, another user's workers are never touched)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import _procs

ROOT = Path(__file__).resolve().parents[2]


class Command:
    """``python -m <module> <args>`` with stdout a pipe (not a terminal), each line timed."""

    def __init__(self, module: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.owner = _procs.new_owner(module.rsplit(".", 1)[-1])
        self.proc = _procs.start(
            [sys.executable, "-m", module, *args], self.owner,
            {**(env or os.environ), "PYTHONPATH": str(ROOT)},
            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self.seen: set[int] = set()
        """Every worker of this command ever seen: none may survive it."""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))

    def workers(self) -> set[int]:
        """Its live Ray Train workers (of its own Ray session)."""
        found = {p for p, args in _procs.owned(self.owner).items() if "RayTrainWorker" in args}
        self.seen |= found
        return found

    def first(self, text: str, timeout_s: float, after: float = 0.0) -> tuple[float, str]:
        """The first line holding ``text`` (seen after ``after``), waiting up to ``timeout_s``."""
        end = time.monotonic() + timeout_s
        while True:
            ended = self.proc.poll() is not None
            time.sleep(0.5 if ended else 0.2)  # an ended command's reader may hold its last lines
            found = next(((t, s) for t, s in self.lines if text in s and t >= after), None)
            if found or ended or time.monotonic() > end:
                break
        if found:
            return found
        self.kill()
        raise AssertionError(f"no line with {text!r}:\n" + self.text())

    def freeze_new_workers(
        self, before: set[int], text: str, timeout_s: float
    ) -> tuple[float, str, set[int], float]:
        """SIGSTOP every worker not in ``before`` as it appears, until the line holding
        ``text`` comes: (when it came, the line, the pids frozen, when the last was frozen).

        Every one, not the first alone: a worker that appears is not always the group that
        is starting (one of the group it follows, or a start attempt Ray Train gave up and
        retried), and the line must be the starting group's, frozen for sure."""
        after = time.monotonic()
        end, frozen, stopped_at = after + timeout_s, set(), 0.0
        while time.monotonic() < end and self.proc.poll() is None:
            found = next(((t, s) for t, s in self.lines if text in s and t >= after), None)
            if found:
                return found[0], found[1], frozen, stopped_at
            for pid in sorted(self.workers() - before - frozen):
                with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                    stopped_at = self.freeze(pid)[1]
                    frozen.add(pid)
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"no line with {text!r} after freezing {sorted(frozen)}:\n"
                             + self.text())  # fmt: skip

    @staticmethod
    def freeze(pid: int) -> tuple[int, float]:
        os.kill(pid, signal.SIGSTOP)
        return pid, time.monotonic()

    def text(self) -> str:
        """Its output's last lines (for failure messages)."""
        return self.said()[-6000:]

    def said(self) -> str:
        """All of its output so far."""
        return "\n".join(line for _, line in self.lines)

    def kill(self) -> None:
        """End it and whatever of it is left (a failed test must not leave a frozen worker)."""
        _procs.end(self.owner)

    def left(self) -> dict[int, str]:
        """What of it is alive 15 s after it ended (before ``kill`` ends it all)."""
        return _procs.wait_gone(self.owner, timeout_s=15)

    def survivors(self) -> set[int]:
        """Workers of this command still alive after it ended."""
        alive = set()
        for pid in self.seen:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":  # a zombie is gone, only not yet reaped
                alive.add(pid)
        return alive


def report(what: str, seconds: float, line: str) -> None:
    """Print the measured freeze-to-line time (``pytest -s`` shows it) and keep it in
    $COMMTUNE_STALL_LOG if set."""
    text = f"freeze {what} -> the user's line: {seconds:.1f} s ({line.strip()})"
    print(text)
    if os.environ.get("COMMTUNE_STALL_LOG"):
        with open(os.environ["COMMTUNE_STALL_LOG"], "a") as f:
            f.write(text + "\n")
