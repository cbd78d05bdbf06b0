"""Ctrl-C in a search is never lost: a KeyboardInterrupt a library swallowed is raised again at
the next step of Tune's loop (the search once ran on to its end, exit 0, after a Ctrl-C)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from orchestrator.search import ctrl_c
from orchestrator.search.progress import ProgressPrinter


@pytest.fixture
def installed() -> Iterator[None]:
    before = signal.getsignal(signal.SIGINT)
    ctrl_c.install()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        ctrl_c.PRESSED.clear()


def test_a_swallowed_ctrl_c_is_raised_again_at_tunes_next_step(
    installed: None, capsys: pytest.CaptureFixture
) -> None:
    printer = ProgressPrinter()
    printer.on_step_end(iteration=1, trials=[])  # nothing pressed: Tune's loop goes on
    with pytest.raises(KeyboardInterrupt):  # raised where the main thread is, as ever ...
        os.kill(os.getpid(), signal.SIGINT)
        signal.pause()  # (never reached: the handler runs as os.kill returns)
    # ... and swallowed there, as a library between the press and Tune's loop might
    assert "commtune: Ctrl-C: ending the search" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        printer.on_step_end(iteration=2, trials=[])
    with pytest.raises(KeyboardInterrupt):
        ctrl_c.check()  # and when the Tuner returns


def test_without_ctrl_c_nothing_is_raised(installed: None) -> None:
    ctrl_c.check()
    assert not ctrl_c.PRESSED.is_set()
