"""A training run's summary states what the user pays: samples over the wall-clock from the
first step to the last, beside the median step's figure, which leaves out what runs between
steps (reports, checkpoints, the no-sync reference, restarts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.train.runlog import RunLog
from train_fns import metrics as m


def _row(step: int, wall: float) -> dict:
    return {m.STEP: step, m.WALL_TIME: wall, m.LOSS: 1.0, m.SAMPLES_PER_S: 80.0,
            m.STEP_TIME_S: 0.1, m.WORLD_SIZE: 2, m.GRAD_NORM: 1.0}  # fmt: skip


def test_the_summary_states_samples_over_the_wall_clock(tmp_path: Path) -> None:
    """Ten steps of 0.1 s (8 samples each at 80 samples/s), one every 0.2 s: the steps'
    figure is 80 samples/s, the wall-clock's 80 samples over 1.9 s."""
    log = RunLog(tmp_path, steps=10, log_every=100)
    log.take({"report": {m.ROWS: [_row(step, 100.0 + 0.2 * step) for step in range(1, 11)]}})
    summary = log.summary(5.0, None)
    log.close()
    assert summary["samples_per_s"] == pytest.approx(80.0)
    assert summary["wall_samples_per_s"] == pytest.approx(80 / 1.9)
