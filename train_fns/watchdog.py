"""Liveness watchdog: a worker that finishes no step in time ends itself.

A rank stuck in a collective (a peer died or hangs) blocks inside C++ and never raises; waiting
for NCCL's or gloo's own timeout (30 minutes by default) would stall the whole search. Ending the
process with a known exit status lets the driver record the trial as a hang and move on.
Stdlib only, so it is cheap to import and to test.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from train_fns.metrics import HANG_EXIT_CODE, WATCHDOG_PREFIX


class Watchdog:
    """A daemon thread that calls ``exit_fn(HANG_EXIT_CODE)`` when ``beat`` stops coming."""

    def __init__(
        self,
        rank: int,
        deadline_s: float,
        exit_fn: Callable[[int], object] = os._exit,
    ) -> None:
        if deadline_s <= 0:
            raise ValueError(f"step_deadline_s={deadline_s} must be > 0")
        self.rank = rank
        self.deadline_s = deadline_s
        self._exit_fn = exit_fn
        self._last_beat = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="commtune-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self.beat()
        self._thread.start()
        return self

    def beat(self) -> None:
        """A step finished: the deadline starts again."""
        self._last_beat = time.monotonic()

    def stop(self) -> None:
        """Training ended (normally or by an exception): stop watching."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def _watch(self) -> None:
        poll_s = min(1.0, self.deadline_s / 4)
        while not self._stopped.wait(poll_s):
            if time.monotonic() - self._last_beat < self.deadline_s:
                continue
            print(
                f"{WATCHDOG_PREFIX} rank {self.rank} finished no step in "
                f"{self.deadline_s:g}s; ending this worker (hang)",
                file=sys.stderr,
                flush=True,
            )
            self._exit_fn(HANG_EXIT_CODE)
            return
