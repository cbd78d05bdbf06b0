"""Pruning, re-measurement and resume decisions: pure logic, no Ray."""

from __future__ import annotations

import optuna
import pytest

from orchestrator.search.finalists import finalists, interleave
from orchestrator.search.outcome import MIN_NOISE, prune_threshold
from orchestrator.search.results import TrialRecord, baseline_record, records
from orchestrator.search.study import (
    INTERRUPTED,
    close_interrupted,
    counted,
    requeue_interrupted,
)
from orchestrator.verdict.decide import Run, judge
from search_spaces import SearchContext, SearchSpace, load_spaces
from train_fns import metrics as m
from train_fns.loop import should_prune


def test_prune_threshold_respects_measured_noise() -> None:
    assert prune_threshold(None, None) is None
    assert prune_threshold(100.0, 0.10) == pytest.approx(70.0)  # 3 sigma of 10%
    assert prune_threshold(100.0, 0.0) == pytest.approx(100.0 * (1 - 3 * MIN_NOISE))


def test_never_prunes_on_one_window_or_without_a_best() -> None:
    assert not should_prune([1.0], threshold=100.0)  # first window alone is never judged
    assert not should_prune([1.0, 1.0, 1.0], threshold=None)
    assert not should_prune([50.0, 95.0], threshold=90.0)  # its best window is in range
    assert should_prune([50.0, 60.0], threshold=90.0)


def _space() -> SearchSpace:
    ctx = SearchContext(
        backend="gloo",
        strategy_mode="ddp",
        use_gpu=False,
        world_size=2,
        num_nodes=1,
        global_batch=16,
    )
    return SearchSpace(load_spaces(["accumulation", "ddp"]), ctx)


def _rec(number: int, value: float | None, params: dict) -> TrialRecord:
    state = m.COMPLETE if value is not None else m.OOM
    return TrialRecord(number, state, "", params, {m.SAMPLES_PER_S: value})


def test_finalists_and_interleaving() -> None:
    base = _rec(0, 100.0, {"a": 1})
    recs = [
        base,
        _rec(1, 120.0, {"a": 2}),
        _rec(2, 130.0, {"a": 3}),
        _rec(3, 125.0, {"a": 3}),
        _rec(4, None, {"a": 4}),
        _rec(5, 99.0, {"a": 5}),
    ]
    top = finalists(recs, base, 2)
    assert [r.number for r in top] == [2, 1]  # trial 3 repeats trial 2's config
    assert [r.number for r in interleave(base, top)] == [0, 2, 0, 1, 0]
    assert baseline_record(recs, {"a": 1}) is base


def test_comparison_claims_gain_only_outside_noise() -> None:
    clear = judge(
        [Run(0, True, 100.0, 0.02), Run(7, False, 150.0, 0.02), Run(0, True, 102.0, 0.02)]
    )
    (comp,) = clear.comparisons
    assert comp.ratio == pytest.approx(150.0 / 101.0, rel=1e-3)
    assert comp.decision == "keep" and "a gain above 1 + δ = 1.02" in comp.line()
    noisy = judge(
        [Run(0, True, 100.0, 0.05), Run(7, False, 104.0, 0.05), Run(0, True, 101.0, 0.05)]
    )  # the interval (0.91-1.16) holds both 1 and a 2% gain: the machine cannot tell
    assert noisy.comparisons[0].decision == "undecided" and "too noisy to decide" in noisy.line()


def test_interrupted_trials_are_requeued_not_counted(tmp_path) -> None:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    for value in (1.0, 2.0):
        t = study.ask({"x": optuna.distributions.IntDistribution(0, 9)})
        study.tell(t, value)
    running = study.ask({"x": optuna.distributions.IntDistribution(0, 9)})  # the driver dies here
    assert counted(study) == 2
    assert requeue_interrupted(study) == [running.number]
    assert counted(study) == 2, "the interrupted trial does not count"
    t = study.trials[running.number]
    assert t.state == optuna.trial.TrialState.FAIL and t.user_attrs[m.STATE] == INTERRUPTED
    again = study.ask({"x": optuna.distributions.IntDistribution(0, 9)})
    assert again.params == running.params, "its params run again"


def test_a_stopped_search_leaves_no_open_trial_and_resume_queues_them_once(tmp_path) -> None:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    x = {"x": optuna.distributions.IntDistribution(0, 9)}
    study.tell(study.ask(x), 1.0)
    running = study.ask(x)
    seed = {"x": (running.params["x"] + 1) % 10}  # never the running one's (1 run in 10 failed)
    study.enqueue_trial(seed)  # a seed queued, never run
    assert close_interrupted(study, "stopped") == [running.number, running.number + 1]
    open_states = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    assert not study.get_trials(states=open_states)
    for t in study.trials[1:]:
        assert t.state == optuna.trial.TrialState.FAIL
        assert (t.user_attrs[m.STATE], t.user_attrs[m.REASON]) == (INTERRUPTED, "stopped")
    assert counted(study) == 1
    shown = [r.number for r in records(study)]
    assert shown == [0, 1], "trials.csv shows the stopped trial, not the seed that never ran"
    assert requeue_interrupted(study) == [1, 2]
    assert requeue_interrupted(study) == [], "a second resume does not queue them again"
    again = [study.ask(x).params for _ in range(2)]
    assert again == [running.params, seed]


def test_storage_urls_and_journal_files(tmp_path) -> None:
    from orchestrator.config.schema import load_config
    from orchestrator.search.study import open_storage

    default = open_storage(load_config(preset="smoke"), tmp_path)
    assert isinstance(default, optuna.storages.RDBStorage)
    journal = load_config(preset="smoke", sets=[f"search.storage={tmp_path / 'study.log'}"])
    storage = open_storage(journal, tmp_path)
    assert isinstance(storage, optuna.storages.JournalStorage)
    study = optuna.create_study(study_name="j", storage=storage, direction="maximize")
    study.tell(study.ask({"x": optuna.distributions.IntDistribution(0, 3)}), 1.0)
    assert counted(optuna.load_study(study_name="j", storage=open_storage(journal, tmp_path))) == 1


def test_same_as_follows_a_conditionally_inactive_param(tmp_path) -> None:
    """A copy of a param that is off in this trial is off too, not a second grid branch."""
    path = tmp_path / "chan.yaml"
    path.write_text(
        "name: chan\ndescription: channels only under fsdp\nparams:\n"
        "  NCCL_MIN_NCHANNELS: {type: categorical, choices: [null, 2, 4], default: null,"
        " when: strategy == fsdp}\n"
        "  NCCL_MAX_NCHANNELS: {same_as: NCCL_MIN_NCHANNELS}\n"
    )
    ctx = SearchContext(
        backend="nccl",
        strategy_mode="search",
        use_gpu=True,
        world_size=2,
        num_nodes=1,
        global_batch=16,
    )
    space = SearchSpace(load_spaces(["strategy", str(path)]), ctx)
    assert space.baseline() == {"strategy": "ddp"}
    grid = space.grid()
    assert len(grid) == 1 + 3, grid  # ddp alone; fsdp with each channel choice
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        params = space.suggest(study.ask())
        assert params.get("NCCL_MAX_NCHANNELS") == params.get("NCCL_MIN_NCHANNELS")


def test_a_resume_with_nothing_owed_leaves_no_open_trial(tmp_path, capsys) -> None:
    """A dead driver's RUNNING trial is closed, not queued again, when the study already has
    its trials (queued, it would stay WAITING: no search runs to take it)."""
    from types import SimpleNamespace

    from orchestrator.config.schema import load_config
    from orchestrator.search.pipeline import _tune

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    config = load_config(preset="smoke", sets=["search.trials=2"])
    study = optuna.create_study(study_name=config.name, storage=storage, direction="maximize")
    x = {"x": optuna.distributions.IntDistribution(0, 9)}
    for value in (1.0, 2.0):
        study.tell(study.ask(x), value)
    study.ask(x)  # the driver died here
    ctx = SimpleNamespace(config=config, space=SimpleNamespace(grid=lambda: [{}] * 9))
    assert _tune(ctx, storage, resume=True, out=tmp_path, deadline=None) is False
    assert "already has 2 of 2 trials" in capsys.readouterr().out
    open_states = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    assert not study.get_trials(states=open_states)
    assert study.trials[2].user_attrs[m.STATE] == INTERRUPTED
