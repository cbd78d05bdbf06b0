"""TensorBoard: Tune's logger sees each result's scalars, not the outcome record (a stock one
warns on the record's first list, each rank's place, once per search, on the terminal); and
the run folder's own event files (a search's trials and race pairs, a training run's steps),
read back with TensorBoard's EventAccumulator."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from ray.tune.logger import TBXLoggerCallback
from ray.util.debug import reset_log_once

from orchestrator.runfiles import TENSORBOARD_DIR, Board
from orchestrator.search.progress import tensorboard_loggers
from orchestrator.search.trial import OUTCOME
from orchestrator.train.runlog import RunLog
from train_fns import metrics as m


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


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``folder``'s event files, as TensorBoard itself reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}  # fmt: skip


def test_a_training_run_writes_each_logged_step(tmp_path: Path) -> None:
    log = RunLog(tmp_path, steps=4, log_every=1)
    start = {"kind": "start", "world_size": 2, "accumulation_steps": 1, "micro_batch": 8,
             "global_batch": 16}  # fmt: skip
    rows = [{m.STEP: s, m.WORLD_SIZE: 2 if s < 3 else 1, m.SAMPLES_PER_S: 10.0 * s,
             m.LOSS: 4.0 - s, m.WALL_TIME: 100.0 + s, m.EXPOSED_COMM_S: 0.1,
             m.COMPUTE_S: 0.3} for s in range(1, 5)]  # fmt: skip
    rows[0][m.EVENTS] = [start]
    log.take({"report": {m.ROWS: rows}})
    log.close()
    found = _scalars(tmp_path / TENSORBOARD_DIR / "train")
    assert found["train/loss"] == [(1, 3.0), (2, 2.0), (3, 1.0), (4, 0.0)]
    assert found["train/samples_per_s"][-1] == (4, 40.0)
    assert [v for _, v in found["train/world_size"]] == [2, 2, 1, 1]
    assert found["train/comm_share"][0] == (1, pytest.approx(0.25))


def test_a_search_writes_each_trial_as_it_is_told(tmp_path: Path) -> None:
    from test_group_search import _run_all, _search

    search = _search(group_size=2)
    search.board = Board(tmp_path, "search")
    groups = _run_all(search)
    found = _scalars(tmp_path / TENSORBOARD_DIR / "search")
    told = sorted(member["number"] for members in groups for member in members)
    assert [step for step, _ in found["trial/samples_per_s"]] == told
    assert {value for _, value in found["trial/samples_per_s"]} == {100.0}


def test_a_race_writes_each_judged_pair(tmp_path: Path) -> None:
    from test_group_search import _search

    from orchestrator.search.race import WINDOW_FIGURE, Race, Slot
    from orchestrator.search.results import TrialRecord

    ctx = _search().ctx
    base = TrialRecord(0, m.COMPLETE, "", ctx.space.baseline(), {m.SAMPLES_PER_S: 100.0})
    race = Race(ctx, base, [TrialRecord(3, m.COMPLETE, "", base.params, {})], say=lambda _: None)
    race.board = Board(tmp_path, "race")
    (entrant,) = race.entrants
    for pair, (mine, theirs) in enumerate([(110.0, 100.0), (120.0, 100.0)]):
        race.slots += [Slot(entrant, entrant, pair), Slot(race.base, entrant, pair)]
        for slot, value in ((-2, mine), (-1, theirs)):
            race._take(len(race.slots) + slot, {m.STATE: m.COMPLETE, WINDOW_FIGURE: value})
    found = _scalars(tmp_path / TENSORBOARD_DIR / "race")
    assert found["race/trial_3/pair_ratio"] == [(1, pytest.approx(1.1)), (2, pytest.approx(1.2))]
    assert [step for step, _ in found["race/trial_3/interval_low"]] == [2]  # needs two pairs


def test_a_board_pickles_as_its_folder(tmp_path: Path) -> None:
    """Tune pickles the searcher that holds the search's board: an open writer's lock cannot."""
    import pickle

    board = Board(tmp_path, "search")
    board.add({"samples_per_s": 1.0}, 0)
    again = pickle.loads(pickle.dumps(board))
    again.add({"samples_per_s": 2.0}, 1)
    board.close()
    again.close()
    assert [v for _, v in _scalars(tmp_path / TENSORBOARD_DIR / "search")["samples_per_s"]] == [
        1.0, 2.0]  # fmt: skip


def test_the_search_closes_its_board_when_the_experiment_ends(tmp_path: Path) -> None:
    """The search's board is written from the driver as trials end; Tune's end of the
    experiment closes it (its writer's thread ended), as a training run closes its own."""
    from types import SimpleNamespace

    from orchestrator.search.tuner import Handover

    board = Board(tmp_path, "search")
    board.add({"samples_per_s": 3.0}, 0, "trial/")
    writer = board._writer
    assert writer is not None
    Handover(SimpleNamespace(board=board, lease=None, lend=None)).on_experiment_end([])
    assert board._writer is None and writer.all_writers is None  # SummaryWriter.close()
