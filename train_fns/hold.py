"""Kill points for tests: a process holds at a named point until the test lets it go.

A test that kills a run "in trial 1" or "at step 15" must land its kill there every time, not
wherever a poll happens to see it (a smoke step takes a few hundredths of a second, so a kill
timed by polling lands late on a busy machine, and the test then proves something else).

With ``COMMTUNE_HOLD_DIR`` set, the first process that reaches point NAME while the file
``NAME.arm`` is in that folder takes it (renames it to ``NAME.held``: one process, once) and
waits until ``NAME.release`` appears there (or ``MAX_HOLD_S`` pass: a test that died without
releasing it leaves no process held for good); the test acts while it waits. Every real run has the
variable unset, and then ``hold`` costs one environment look-up. The variable reaches Ray
workers the way every variable of the driver does (a local Ray's processes inherit it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

HOLD_DIR_VAR = "COMMTUNE_HOLD_DIR"
POLL_S = 0.05
MAX_HOLD_S = 900.0


def hold(name: str) -> None:
    """Wait at point ``name`` if a test armed it (see the module docstring)."""
    folder = os.environ.get(HOLD_DIR_VAR)
    if not folder:
        return
    armed = Path(folder) / f"{name}.arm"
    try:
        armed.rename(armed.with_suffix(".held"))  # atomic: one taker, whoever comes first
    except FileNotFoundError:
        return
    release, deadline = armed.with_suffix(".release"), time.monotonic() + MAX_HOLD_S
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(POLL_S)
