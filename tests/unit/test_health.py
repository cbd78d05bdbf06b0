"""Mixed-precision health in training runs: a non-finite step is skipped and counted, and the
run summary warns above 0.1% of steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from orchestrator.train.runlog import RunLog
from train_fns import metrics as m
from train_fns.plan import TrialPlan
from train_fns.precision import Precision


def plan(**changes) -> TrialPlan:
    base = dict(model="bert-tiny", task="mlm", seq_len=8, global_batch=2, world_size=1,
                accumulation_steps=1, micro_batch=2, max_grad_norm=1.0)  # fmt: skip
    return TrialPlan(**(base | changes))


def test_a_step_with_non_finite_gradients_is_skipped_and_counted() -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = Precision(plan(), torch.device("cpu"))
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.ones(1, 4)).sum().backward()
    model.weight.grad[0, 0] = float("nan")
    precision.step(optimizer, torch.tensor(1.0))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert precision.num_nonfinite() == 1 and precision.last_grad_norm != precision.last_grad_norm
    optimizer.zero_grad()
    model(torch.ones(1, 4)).sum().backward()
    precision.step(optimizer, torch.tensor(1.0))  # a finite step goes through, clipped to 1
    assert not torch.equal(before[0], model.weight) and precision.num_nonfinite() == 1
    assert precision.last_grad_norm > 1.0  # reported before clipping


def row(step: int, norm: float) -> dict:
    return {m.STEP: step, m.WALL_TIME: 0.0, m.LOSS: 1.0, m.SAMPLES_PER_S: 10.0,
            m.STEP_TIME_S: 0.1, m.WORLD_SIZE: 1, m.GRAD_NORM: norm, m.DATA_S: 0.01,
            m.EXPOSED_COMM_S: 0.02, m.COMPUTE_S: 0.06}  # fmt: skip


def test_summary_warns_above_a_tenth_of_a_percent(tmp_path: Path) -> None:
    log = RunLog(tmp_path, steps=1000, log_every=1000)
    norms = [float("inf") if step in (10, 20) else 1.0 for step in range(1, 1001)]
    log.take({"report": {m.ROWS: [row(s, n) for s, n in enumerate(norms, start=1)]}})
    summary = log.summary(1.0, None)
    log.close()
    assert summary["nonfinite_steps"] == 2 and summary["nonfinite_rate"] == 0.002
    assert "non-finite" in summary["warnings"][0]
    assert summary["comm_fraction"] == pytest.approx(0.25)
    assert summary["data_fraction"] == pytest.approx(0.1)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 1000


def test_no_warning_at_or_below_the_threshold(tmp_path: Path) -> None:
    log = RunLog(tmp_path, steps=1000, log_every=1000)
    norms = [float("nan") if step == 5 else 1.0 for step in range(1, 1001)]
    log.take({"report": {m.ROWS: [row(s, n) for s, n in enumerate(norms, start=1)]}})
    summary = log.summary(1.0, None)
    log.close()
    assert summary["nonfinite_steps"] == 1 and summary["warnings"] == []


def test_the_data_share_is_over_the_steps_that_measured_it() -> None:
    """A training run splits one step in N into phases and leaves the others blank: the
    share is data over those steps' time, not over every step's (ten times too small)."""
    from orchestrator.train.runlog import _share

    rows = [{m.STEP_TIME_S: 1.0, m.DATA_S: 0.2 if i % 10 == 0 else None} for i in range(20)]
    assert _share(rows, m.DATA_S) == pytest.approx(0.2)
    assert _share([{m.STEP_TIME_S: 1.0}], m.DATA_S) is None
