"""A Ctrl-C the search never loses.

Python turns Ctrl-C into a KeyboardInterrupt wherever the driver's main thread happens to be.
Once in a few dozen searches that exception was swallowed somewhere inside Tune or Ray (the
search then ran on to its end and exited 0, its user's Ctrl-C ignored). So the press is also
remembered here, said at once on stderr, and raised again at the next step of Tune's loop and
when the Tuner returns: a swallowed one costs a fraction of a second, never the search.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

PRESSED = threading.Event()
"""Set by Ctrl-C (SIGINT) once ``install`` ran; never cleared: a search pressed is ending."""


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    if not PRESSED.is_set():
        print("commtune: Ctrl-C: ending the search", file=sys.stderr, flush=True)
    PRESSED.set()
    raise KeyboardInterrupt


def install() -> None:
    """Make Ctrl-C in this process (main thread only) raise as Python's own handler does, and
    remember it for ``check``. Elsewhere than the main thread Python allows no handler, and
    Ctrl-C is not this thread's to take."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)


def check() -> None:
    """Raise KeyboardInterrupt again where Ctrl-C was pressed: the first one may have been
    swallowed by a library between the press and here."""
    if PRESSED.is_set():
        raise KeyboardInterrupt
