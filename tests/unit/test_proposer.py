"""Search strategies against a synthetic objective on in-memory Optuna studies (no Ray)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from orchestrator.config.schema import SAMPLERS, load_config
from orchestrator.planning.costmodel import LINKS, ModelSize
from orchestrator.search import estimate, pipeline
from orchestrator.search.context import context_for
from orchestrator.search.proposer import (
    NEIGHBOUR_OF,
    Proposer,
    cost_model_seeds,
    make_sampler,
    search_seeds,
)
from orchestrator.search.results import baseline_failure, records
from orchestrator.search.study import REPEAT, queued_params
from orchestrator.search.tuner import tell
from search_spaces import PLAN_KNOBS, SearchContext, SearchSpace, load_spaces
from train_fns import metrics as m

optuna.logging.set_verbosity(optuna.logging.WARNING)

ALL = ["strategy", "accumulation", "ddp", "fsdp", "nccl"]
TWO_NODES = SearchContext("nccl", "search", True, 8, 2, 64)
CPU = SearchContext("gloo", "search", False, 2, 1, 32)
BEST_SHAPE = ("fsdp", 2, False, False)  # strategy, accumulation, checkpointing, reshard


def _space(context: SearchContext = TWO_NODES) -> SearchSpace:
    return SearchSpace(load_spaces(ALL), context)


def _objective(p: dict[str, Any]) -> float | None:
    """Best at BEST_SHAPE, then rewards many sockets (pressing on the constraint); a few
    configurations fail, as OOMs do."""
    if p.get("accumulation_steps") == 16:
        return None
    shape = (p["strategy"], p["accumulation_steps"], p.get("activation_checkpointing"),
             p.get("reshard_after_forward"))  # fmt: skip
    value = 100.0 if shape == BEST_SHAPE else 50.0 + p["accumulation_steps"]
    sockets = p.get("NCCL_SOCKET_NTHREADS", 1) * p.get("NCCL_NSOCKS_PERTHREAD", 1)
    return value + sockets / 8 + (p.get("bucket_cap_mb") or 0) / 100


def _run(space: SearchSpace, strategy: str, budget: int, n: int, seeds=()) -> optuna.Study:
    study = optuna.create_study(direction="maximize", sampler=make_sampler(strategy, 0, budget))
    study.enqueue_trial(space.optuna_params(space.baseline()))
    proposer = Proposer(space, strategy, budget, seeds)
    for _ in range(n):
        proposer.refill(study)
        trial = study.ask()
        value = _objective(space.suggest(trial))
        state = optuna.trial.TrialState.FAIL if value is None else None
        study.tell(trial, value, state=state)
    return study


def _enqueued(study: optuna.Study) -> list[dict[str, Any]]:
    return [t.params for t in study.trials if "fixed_params" in t.system_attrs]


def _shape(p: dict[str, Any]) -> tuple:
    return (p["strategy"], p["accumulation_steps"], p.get("activation_checkpointing"),
            p.get("reshard_after_forward"))  # fmt: skip


def test_grid_slice_is_the_projection_of_the_grid() -> None:
    space = _space(CPU)
    memory = ["strategy", "accumulation_steps", "activation_checkpointing", "reshard_after_forward"]
    got = space.grid_slice(memory)
    assert [_shape(p) for p in got] == list(dict.fromkeys(_shape(p) for p in space.grid()))
    defaults = {"bucket_cap_mb": 25, "gradient_as_bucket_view": False, "static_graph": False}
    assert all(p.get(k, v) == v for p in got for k, v in defaults.items())


def test_grid_slice_drops_pinned_values_a_constraint_rules_out() -> None:
    space = _space()
    base = {**space.baseline(), "NCCL_SOCKET_NTHREADS": 16}
    sweep = space.grid_slice(["NCCL_NSOCKS_PERTHREAD"], base)
    assert [p["NCCL_NSOCKS_PERTHREAD"] for p in sweep] == [1, 2, 3, 4]
    base = {**space.baseline(), "NCCL_NSOCKS_PERTHREAD": 16}
    assert [p["NCCL_SOCKET_NTHREADS"] for p in space.grid_slice(["NCCL_SOCKET_NTHREADS"], base)]


def test_staged_points_are_valid_points_of_the_space() -> None:
    space = _space()
    study = _run(space, "staged", 40, 45)
    enqueued = _enqueued(study)
    assert len(enqueued) >= 20, "stages 1 and 2 enqueue most of the 40 trials' points"
    for params in enqueued:
        full = space.from_optuna_params(params)
        assert space.optuna_params(full) == params
        assert "static_graph" not in full or full["accumulation_steps"] == 1
        assert full.get("NCCL_NSOCKS_PERTHREAD", 1) * full.get("NCCL_SOCKET_NTHREADS", 1) <= 64


def test_staged_never_enqueues_twice_and_stops_for_stage_3() -> None:
    study = _run(_space(), "staged", 40, 45)
    keys = [repr(sorted(p.items())) for p in _enqueued(study)]
    assert len(keys) == len(set(keys)) >= 20
    assert len(keys) <= 40 - 10  # stage 3's quarter is left to the sampler


def test_stage_2_starts_from_the_best_stage_1_shape() -> None:
    space = _space()  # 40 memory shapes on 8 ranks (integer reshards among them)
    study = _run(space, "staged", 60, 40)
    full = [space.from_optuna_params(t.params) for t in study.trials if t.state.is_finished()]
    first_knob = next(i for i, p in enumerate(full) if p.get("NCCL_ALGO") is not None)
    stage1 = {_shape(p) for p in full[:first_knob]}
    assert BEST_SHAPE in stage1
    assert all(_shape(p) == BEST_SHAPE for p in full[first_knob : first_knob + 2])


def test_staged_is_deterministic_and_resumes_from_the_study() -> None:
    space = _space()
    first, second = _run(space, "staged", 40, 30), _run(space, "staged", 40, 30)
    assert [t.params for t in first.trials] == [t.params for t in second.trials]
    study = _run(space, "staged", 40, 12)
    restarted = Proposer(space, "staged", 40)  # a new driver: only the study remembers
    continued = _run(space, "staged", 40, 13)
    restarted.refill(study)
    queued = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert queued[0].system_attrs["fixed_params"] == continued.trials[12].params


@pytest.mark.parametrize("strategy", ["staged", "tpe", "random"])
def test_seeds_come_first_after_the_baseline(strategy: str) -> None:
    space = _space()
    seeds = cost_model_seeds(space, ModelSize.bert_large(), LINKS["net_100g"], 0.02, 3)
    study = _run(space, strategy, 40, 6, [space.baseline(), *seeds, seeds[0]])
    got = [space.from_optuna_params(t.params) for t in study.trials[1:4]]
    assert got == seeds  # the baseline and the repeated seed are not measured again


def test_grid_enqueues_every_point_in_order() -> None:
    space = _space(CPU)
    grid = space.grid()
    study = _run(space, "grid", 12, len(grid))
    got = [space.from_optuna_params(t.params) for t in study.trials]
    assert got == [space.baseline(), *(p for p in grid if p != space.baseline())]


def test_cost_model_seeds_are_distinct_valid_points() -> None:
    space = _space()
    seeds = cost_model_seeds(space, ModelSize.bert_large(), LINKS["pcie_v100"], 0.02, 5)
    assert len(seeds) == 5
    assert space.baseline() not in seeds
    for seed in seeds:
        assert space.from_optuna_params(space.optuna_params(seed)) == seed
        assert all(seed.get(k) == v for k, v in space.baseline().items() if k.startswith("NCCL"))


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_dry_run_ranks_what_the_search_seeds_from(
    nodes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dry run once ranked a random sample while the search seeded from a grid slice: now
    it ranks that slice, in the context the search builds, and marks the seeds it would run."""
    import ray

    sets = ["cluster.num_workers=4", "search.cost_model_seeds=4", "cluster.use_gpu=true"]
    config = load_config(None, "smoke", sets)
    fake = [{"Alive": True, "NodeID": f"n{i}", "Resources": {"GPU": 2, "CPU": 8}}
            for i in range(nodes)]  # fmt: skip
    monkeypatch.setattr(ray, "nodes", lambda: fake)
    space = SearchSpace(load_spaces(config.search.spaces), pipeline.search_context(config, True))
    size = ModelSize.bert_large()
    dry = estimate.ranking(config, nodes, None, None, size)

    def keys(points: list[dict[str, Any]]) -> list[str]:
        return sorted(repr(sorted(space.optuna_params(p).items())) for p in points)

    slice_ = space.grid_slice([n for n in space.param_names if n in PLAN_KNOBS])
    assert keys([p for _, p in dry.ranked]) == keys(slice_) and dry.baseline == space.baseline()
    seeds = search_seeds(space, size, config.workload.seq_len, config.search.cost_model_seeds)
    assert dry.seeds == seeds and len(seeds) > 1


def test_make_sampler() -> None:
    assert isinstance(make_sampler("staged", 0, 40), optuna.samplers.TPESampler)
    assert all(make_sampler(s, 0, 8) is not None for s in SAMPLERS)
    assert isinstance(make_sampler("grid", 0, 8), optuna.samplers.RandomSampler)
    with pytest.raises(ValueError, match="unknown search strategy"):
        make_sampler("cmaes", 0, 8)
    with pytest.raises(ValueError, match="budget"):
        Proposer(_space(CPU), "staged", 0)


@pytest.mark.parametrize("strategy", ["grid", "staged"])
def test_nothing_is_queued_past_the_budget(strategy: str) -> None:
    """A 4-trial search leaves no WAITING trial in the study (the dashboard's pending work)."""
    space = _space(CPU)
    study = _run(space, strategy, 4, 4)
    waiting = [t for t in study.trials if t.state == optuna.trial.TrialState.WAITING]
    assert len(study.trials) == 4 and not waiting


def test_the_dry_run_prices_cpu_workers_where_the_search_would_run_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cpu-demo on a machine without a GPU (use_gpu: auto): the seeds the dry run marks are
    the CPU search's (it once priced every config on NVLink at 100 TFLOP/s)."""
    monkeypatch.setattr(estimate.shutil, "which", lambda name: None)  # no nvidia-smi here
    config = load_config(None, "cpu-demo", [])
    dry = estimate.ranking(config, 1, None, None, ModelSize.bert_large())
    assert not any(k.startswith("NCCL") for p in dry.seeds for k in p) and dry.tflops < 1
    space = SearchSpace(load_spaces(config.search.spaces), context_for(config, False, 1))
    seeds = search_seeds(space, ModelSize.bert_large(), config.workload.seq_len,
                         config.search.cost_model_seeds)  # fmt: skip
    assert dry.seeds == seeds and dry.baseline == space.baseline()


def test_a_dry_run_beside_a_finished_study_is_not_refused(tmp_path, capsys) -> None:  # noqa: ANN001
    """It writes nothing, so an --out that already holds a study (the README's own smoke run
    leaves runs/smoke) is no reason to refuse it; the live search still refuses."""
    from orchestrator.runfiles import TRIALS_CSV
    from orchestrator.search import cli

    (tmp_path / TRIALS_CSV).write_text("number,state\n")
    args = ["--preset", "smoke", "--out", str(tmp_path)]
    assert cli.main([*args, "--dry-run"]) == 0
    assert "rank" in capsys.readouterr().out.lower()
    assert cli.main(args) == 2 and "already holds a study" in capsys.readouterr().err


def _until_settled(
    budget: int, objective: Any, early_stop: bool = True, strategy: str = "staged"
) -> tuple[optuna.Study, str | None]:
    """A search of the CPU space that ends when the proposer says it has settled (or at
    ``budget``); ``objective(number, params)`` is each trial's throughput."""
    space = _space(CPU)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(strategy, 0, budget))
    study.enqueue_trial(space.optuna_params(space.baseline()))
    proposer = Proposer(space, strategy, budget, early_stop=early_stop)
    for number in range(budget):
        why = proposer.settled(study)
        if why is not None:
            return study, why
        proposer.refill(study)
        trial = study.ask()
        trial.set_user_attr("throughput_cv", 0.02)
        params = space.suggest(trial)
        value = objective(number, params)
        trial.set_user_attr("state", "complete" if value is not None else "crash")
        trial.set_user_attr("params", params)  # what the search records (results.records)
        trial.set_user_attr("samples_per_s", value)
        study.tell(trial, value, state=None if value is not None else TrialState.FAIL)
    return study, None


def test_stage_3_ends_once_the_samplers_trials_raise_nothing() -> None:
    """Stages 1 and 2 always run; a sampled trial within the best's window spread raises
    nothing, and with 9 trials (a stage 3 of 2) one such trial ends the search."""
    study, why = _until_settled(9, lambda number, p: 20.0 + (number == 3))
    sampled = [t for t in study.trials if "fixed_params" not in t.system_attrs]
    assert len(sampled) == 1 and len(study.trials) == 8, why
    assert why and f"({sampled[0].number})" in why and "20.58 samples/s" in why
    assert "search.early_stop: false" in why
    again = Proposer(_space(CPU), "staged", 9, early_stop=True)  # a resumed driver agrees
    assert again.settled(study) == why


def test_a_sampled_trial_clear_of_the_spread_keeps_the_search_going() -> None:
    study, why = _until_settled(9, lambda number, p: 20.0 * 1.05**number)
    assert why is None and len(study.trials) == 9


@pytest.mark.parametrize(("strategy", "early_stop"), [("staged", False), ("tpe", True)])
def test_only_an_early_stopping_staged_search_ends_early(strategy: str, early_stop: bool) -> None:
    study, why = _until_settled(9, lambda number, p: 20.0, early_stop, strategy)
    assert why is None and len(study.trials) == 9


def test_patience_is_half_of_stage_3() -> None:
    space = _space(CPU)
    assert Proposer(space, "staged", 9, early_stop=True).patience == 1  # stage 3: 2 trials
    assert Proposer(space, "staged", 40, early_stop=True).patience == 5  # stage 3: 10 trials
    assert Proposer(space, "staged", 40).patience is None


def test_a_crashed_sampled_trial_is_no_evidence_of_settling() -> None:
    """A crash (a lost node, say) says nothing of the configuration: the next trial runs."""
    study, why = _until_settled(9, lambda number, p: None if number == 7 else 20.0)
    assert why is None and len(study.trials) == 9


def test_nothing_settles_while_stage_2_has_a_sweep_to_queue() -> None:
    """Stage 1 ran (the baseline completed, its other shapes ran out of memory) and a trial
    asked of the sampler before stage 2 was queued (as concurrent groups can) came in lower:
    stage 2's sweep from the best is still owed, so the search has not settled."""
    space = _space(CPU)
    proposer = Proposer(space, "staged", 9, early_stop=True)
    study = optuna.create_study(direction="maximize", sampler=make_sampler("staged", 0, 9))
    study.enqueue_trial(space.optuna_params(space.baseline()))
    for value in [20.0, None, None, None]:
        proposer.refill(study)
        trial = study.ask()
        space.suggest(trial)
        trial.set_user_attr("state", "complete" if value else "oom")
        study.tell(trial, value, state=None if value else TrialState.FAIL)
    trial = study.ask()  # nothing queued: the sampler's
    space.suggest(trial)
    trial.set_user_attr("state", "complete")
    study.tell(trial, 19.0)
    assert "fixed_params" not in study.trials[-1].system_attrs
    assert proposer.settled(study) is None
    assert proposer.refill(study) > 0  # the sweep it was owed


def test_a_resumed_study_that_ended_early_is_a_finished_one() -> None:
    """--resume of a search that ended early re-runs nothing (not even its race); one whose
    baseline never completed runs again, as --resume is for."""
    space = _space(CPU)
    proposer = Proposer(space, "staged", 9, early_stop=True)
    study, why = _until_settled(9, lambda number, p: 20.0 + (number == 3))
    assert why and pipeline._ended_early(study, proposer, space) == why
    failed, why = _until_settled(9, lambda number, p: None if number == 0 else 20.0)
    assert why and pipeline._ended_early(failed, proposer, space) is None
    assert pipeline._ended_early(None, proposer, space) is None


def _stubborn(space: SearchSpace) -> optuna.samplers.BaseSampler:
    """A sampler that asks for the baseline every time: one at its most converged."""
    fixed = space.optuna_params(space.baseline())
    with warnings.catch_warnings():  # Python 3.10 has no catch_warnings(category=...)
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.PartialFixedSampler(fixed, optuna.samplers.RandomSampler(0))


def _run_asking_again(
    space: SearchSpace, proposer: Proposer, measured: int
) -> tuple[optuna.Study, str | None]:
    """The live search's loop with a sampler that asks for one configuration over and over:
    a repeat is told as such and not measured, as ``GroupSearch._next`` does; the early stop
    is asked before each trial. The study, and why the proposer settled (None when
    ``measured`` trials ran)."""
    study = optuna.create_study(direction="maximize", sampler=_stubborn(space))
    study.enqueue_trial(space.optuna_params(space.baseline()))
    ran = 0
    while ran < measured:
        if why := proposer.settled(study):
            return study, why
        proposer.refill(study)
        trial = study.ask()
        params = space.suggest(trial)
        if proposer.repeat_of(study, trial) is not None:
            trial.set_user_attr(m.STATE, REPEAT)
            study.tell(trial, state=TrialState.FAIL)
            continue
        trial.set_user_attr(m.STATE, m.COMPLETE)
        trial.set_user_attr(m.THROUGHPUT_CV, 0.02)
        study.tell(trial, _objective(params) or 0.0)
        ran += 1
    return study, None


@pytest.mark.parametrize("strategy", ["staged", "tpe", "random"])
def test_a_configuration_asked_again_is_not_measured_again(strategy: str) -> None:
    space = _space()
    study, _ = _run_asking_again(space, Proposer(space, strategy, 12), 12)
    run = [repr(sorted(t.params.items())) for t in study.trials
           if t.user_attrs.get(m.STATE) != REPEAT]  # fmt: skip
    assert len(run) == len(set(run)) == 12
    assert any(t.user_attrs.get(m.STATE) == REPEAT for t in study.trials)


def _first_asked(space: SearchSpace) -> tuple[optuna.Study, Proposer, optuna.Trial]:
    """A study whose sampler asks the baseline every time, a TPE proposer, and its first ask
    (params suggested, not yet told)."""
    study = optuna.create_study(direction="maximize", sampler=_stubborn(space))
    first = study.ask()
    space.suggest(first)
    return study, Proposer(space, "tpe", 40), first


def test_a_repeat_is_replaced_by_an_unmeasured_neighbour() -> None:
    space = _space()
    study, proposer, first = _first_asked(space)
    assert proposer.repeat_of(study, first) is None  # new: it runs
    assert not study.get_trials(states=(TrialState.WAITING,))
    study.tell(first, 1.0)
    again = study.ask()
    space.suggest(again)
    assert proposer.repeat_of(study, again) == first.number
    (queued,) = study.get_trials(states=(TrialState.WAITING,))
    point = space.from_optuna_params(first.params)
    near = space.from_optuna_params(queued_params(queued))
    assert point != near
    assert near in [q for n in space.param_names for q in space.grid_slice([n], point)]


def test_a_configuration_whose_run_crashed_runs_again() -> None:
    """A crash or a hang may be the node's: it says nothing of the configuration."""
    space = _space()
    study, proposer, first = _first_asked(space)
    first.set_user_attr(m.STATE, m.CRASH)
    study.tell(first, state=TrialState.FAIL)
    again = study.ask()
    space.suggest(again)
    assert proposer.repeat_of(study, again) is None
    assert not study.get_trials(states=(TrialState.WAITING,))


def test_the_early_stop_counts_the_neighbour_run_in_place_of_a_repeat() -> None:
    """A converged sampler (asking one configuration again and again) is when stopping
    matters: the neighbours run in its place are its trials to the early stop."""
    space = _space(CPU)
    study, why = _run_asking_again(space, Proposer(space, "staged", 12, early_stop=True), 12)
    assert why is not None, "a converged sampler ran its whole budget"
    neighbours = [t.number for t in study.trials if NEIGHBOUR_OF in t.user_attrs]
    assert neighbours and any(f"{n})" in why or f"{n}," in why for n in neighbours), why


def test_a_baseline_queued_again_on_resume_runs_and_a_repeat_row_hides_no_failure() -> None:
    """``--resume`` queues a baseline that never completed (out of memory, say) again: the
    fix is what it is for, so it runs; and a repeat row of it never stands for its failure."""
    space = _space(CPU)
    base = space.optuna_params(space.baseline())
    study = optuna.create_study(direction="maximize", sampler=_stubborn(space))
    study.enqueue_trial(base)
    first = study.ask()
    tell(study, first, space.suggest(first), {m.STATE: m.OOM, m.REASON: "out of memory"})
    study.enqueue_trial(base)  # what the resumed search does
    proposer = Proposer(space, "staged", 12)
    proposer.refill(study)
    again = study.ask()
    assert space.suggest(again) == space.baseline()
    assert proposer.repeat_of(study, again) is None
    tell(study, again, space.suggest(again), {m.STATE: REPEAT, m.REASON: "not run"})
    assert baseline_failure(records(study), space.baseline()) == "oom: out of memory"


@pytest.mark.parametrize("repeats", [0, 2, 4])
def test_repeat_rows_leave_stage_2_its_room(repeats: int) -> None:
    space = _space(CPU)
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial(space.optuna_params(space.baseline()))
    proposer = Proposer(space, "staged", 12)
    for value in range(5):  # the baseline and stage 1
        proposer.refill(study)
        trial = study.ask()
        space.suggest(trial)
        study.tell(trial, 20.0 + value)
    for _ in range(repeats):
        trial = study.ask()
        space.suggest(trial)
        trial.set_user_attr(m.STATE, REPEAT)
        study.tell(trial, state=TrialState.FAIL)
    assert proposer.refill(study) == 4


def test_a_knob_too_wide_for_a_grid_gives_no_neighbours_not_an_error(tmp_path: Path) -> None:
    """A sampler searches a long int range a grid cannot list; its repeat is not an error."""
    wide = tmp_path / "wide.yaml"
    wide.write_text("name: wide\ndescription: a wide int knob\nparams:\n  NCCL_BUFFSIZE: "
                    "{type: int, low: 1048576, high: 1068576, step: 1, default: 1048576}\n")
    space = SearchSpace(load_spaces(["strategy", wide]), TWO_NODES)
    study, proposer, first = _first_asked(space)
    study.tell(first, 1.0)
    again = study.ask()
    space.suggest(again)
    # no grid lists such a space's neighbours: the repeat runs again, as before this check
    assert proposer.repeat_of(study, again) is None
    assert not study.get_trials(states=(TrialState.WAITING,))
