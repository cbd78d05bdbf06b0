"""Tune's TensorBoard logger sees each result's scalars, not the outcome record: a stock one
warns on the record's first list (each rank's place), once per search, on the terminal."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from ray.tune.logger import TBXLoggerCallback
from ray.util.debug import reset_log_once

from orchestrator.search.progress import tensorboard_loggers
from orchestrator.search.trial import OUTCOME


class _Trial:
    """What the logger reads of a Tune trial."""

    def __init__(self, path: Path) -> None:
        self.local_path, self.evaluated_params, self.trial_id = str(path), {}, "t0"

    def init_local_path(self) -> None:
        """The folder exists already."""


def _log(callback: TBXLoggerCallback, path: Path) -> None:
    trial = _Trial(path)
    callback.log_trial_start(trial)
    places = [{"rank": 0, "node_id": "a", "node_ip": "10.0.0.1"}]
    nested = {"samples_per_s": 3.0, "training_iteration": 1, OUTCOME: {"rank_places": places}}
    flat = {"samples_per_s": 3.0, "training_iteration": 2, f"{OUTCOME}/rank_places": places}
    callback.log_trial_result(1, trial, nested)
    callback.log_trial_result(2, trial, flat)
    callback.on_experiment_end([])


@pytest.mark.parametrize("ours", [True, False])
def test_the_outcome_record_never_reaches_tensorboard(ours: bool, tmp_path: Path) -> None:
    (callback,) = tensorboard_loggers() if ours else [TBXLoggerCallback()]
    reset_log_once("invalid_tbx_value")
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("ray.tune.logger.tensorboardx")  # Ray's loggers do not propagate
    log.addHandler(handler)
    try:
        _log(callback, tmp_path)
    finally:
        log.removeHandler(handler)
    warned = any("invalid value" in line for line in seen)
    assert warned is not ours  # the stock logger shows what is avoided
    assert list(tmp_path.glob("events.out.tfevents.*")), "the scalars are still logged"
