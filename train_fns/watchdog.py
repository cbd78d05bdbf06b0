"""Liveness watchdog: a worker that finishes no step in time ends itself.

A rank stuck in a collective (a peer died or hangs) blocks inside C++ and never raises; waiting
for NCCL's or gloo's own timeout (30 minutes by default) would stall the whole search. Ending the
process lets the driver move on. Ray reports any dead worker the same way ("the actor
died"), so before exiting the watchdog leaves a marker file in ``marker_dir`` (the trial's
run folder, shared like all Ray Train storage): that file is how the driver tells a hang
from a crash. Stdlib only, so it is cheap to import and to test.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from train_fns.metrics import HANG_EXIT_CODE, HANG_MARKER, WATCHDOG_PREFIX


class Watchdog:
    """A daemon thread that calls ``exit_fn(HANG_EXIT_CODE)`` when ``beat`` stops coming."""

    def __init__(
        self,
        rank: int,
        deadline_s: float,
        exit_fn: Callable[[int], object] = os._exit,
        marker_dir: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if deadline_s <= 0:
            raise ValueError(f"step_deadline_s={deadline_s} must be > 0")
        self.rank = rank
        self.deadline_s = deadline_s
        self._exit_fn = exit_fn
        self._marker_dir = marker_dir
        self._clock = clock
        """Monotonic seconds (a test gives a logical clock: no bound a loaded machine breaks)."""
        self._last_beat = clock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="commtune-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self.beat()
        self._thread.start()
        return self

    def beat(self) -> None:
        """A step finished: the deadline starts again."""
        self._last_beat = self._clock()

    def stop(self) -> None:
        """Training ended (normally or by an exception): stop watching."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _watch(self) -> None:
        poll_s = min(1.0, self.deadline_s / 4)
        while not self._stopped.wait(poll_s):
            if self.check():
                return

    def check(self) -> bool:
        """One look (the watching thread's, every poll): True, with the worker ended, when no
        beat came within the deadline."""
        if self._clock() - self._last_beat < self.deadline_s:
            return False
        message = (
            f"{WATCHDOG_PREFIX} rank {self.rank} finished no step in "
            f"{self.deadline_s:g}s; ending this worker (hang)"
        )
        print(message, file=sys.stderr, flush=True)
        self._leave_marker(message)
        self._exit_fn(HANG_EXIT_CODE)
        return True

    def _leave_marker(self, message: str) -> None:
        if self._marker_dir is None:
            return
        try:
            os.makedirs(self._marker_dir, exist_ok=True)
            path = os.path.join(self._marker_dir, HANG_MARKER.format(rank=self.rank))
            with open(path, "w") as f:
                f.write(message + "\n")
        except OSError as e:  # the exit must happen anyway; the driver then says "crash"
            print(f"{WATCHDOG_PREFIX} could not write hang marker: {e}", file=sys.stderr)
