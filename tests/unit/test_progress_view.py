"""A training run shows where it is: a bar on a terminal, a line now and then in a log."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from orchestrator.train.progress import StepProgress
from orchestrator.train.runlog import RunLog
from train_fns import metrics as m


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _rows(steps: int) -> list[dict]:
    rows = [{m.STEP: s, m.WORLD_SIZE: 2, m.SAMPLES_PER_S: 10.0 * s, m.LOSS: 4.0 - s,
             m.WALL_TIME: 100.0 + s} for s in range(1, steps + 1)]  # fmt: skip
    rows[0][m.EVENTS] = [{"kind": "start", "world_size": 2, "accumulation_steps": 1,
                          "micro_batch": 8, "global_batch": 16}]  # fmt: skip
    return rows


def test_a_log_gets_a_line_at_most_so_often_and_at_the_end(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    log = RunLog(tmp_path, steps=4, log_every=1)
    log.take({"report": {m.ROWS: _rows(4)}})
    log.close()
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("progress:")]
    # four steps within a second: only the last is said
    assert lines == ["progress: step 4/4 (100%): loss 0, samples/s 40.0, workers 2"]


def test_a_terminal_gets_a_bar() -> None:
    screen = _Terminal()
    view = StepProgress(4, screen)
    for row in _rows(4):
        view.update(row[m.STEP], row[m.LOSS], row[m.SAMPLES_PER_S], row[m.WORLD_SIZE])
    view.close()
    shown = screen.getvalue()
    assert "\r" in shown and "4/4" in shown and "samples/s=40.0" in shown
    assert "progress:" not in shown
