"""The searcher's grouping: configurations go to a worker group only with its exact environment,
one at a time, each told to Optuna; what a dead group had not measured runs later. No Ray."""

from __future__ import annotations

import dataclasses
import warnings

import optuna
import pytest

from orchestrator.config.schema import load_config
from orchestrator.search.outcome import MIN_NOISE
from orchestrator.search.proposer import Proposer
from orchestrator.search.study import REPEAT, counted
from orchestrator.search.trial import OUTCOME, TRIAL_NUMBER, WORK, TrialContext
from orchestrator.search.tuner import GroupSearch
from search_spaces import SearchContext, SearchSpace, load_spaces
from train_fns import metrics as m

TOTAL = 12


class ListQueue:
    """What the searcher needs of a Ray queue."""

    def __init__(self) -> None:
        self.items: list = []
        self.closed = False

    def put(self, item: object) -> None:
        self.items.append(item)

    def shutdown(self) -> None:
        self.closed = True


def _search(
    group_size: int = 4, warm: bool = True, spaces: tuple = ("accumulation", "nccl")
) -> GroupSearch:
    sets = [f"search.group_size={group_size}", f"search.warm={warm}", "search.prune=false"]
    config = load_config(None, "smoke", sets)
    context = SearchContext("nccl", "ddp", True, 2, 1, config.workload.global_batch)
    space = SearchSpace(load_spaces(list(spaces)), context)
    ctx = TrialContext(config, space, True, "/unused", "mlm")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0))
    study.enqueue_trial(space.optuna_params(space.baseline()))
    return GroupSearch(ctx, study, Proposer(space, "random", TOTAL), TOTAL, ListQueue)


def _result(number: int, state: str = m.COMPLETE, value: float = 100.0) -> dict:
    outcome = {m.STATE: state, m.REASON: "", m.SAMPLES_PER_S: value}
    return {TRIAL_NUMBER: number, f"{OUTCOME}/{m.STATE}": state, f"{OUTCOME}/{m.REASON}": "",
            f"{OUTCOME}/{m.SAMPLES_PER_S}": outcome[m.SAMPLES_PER_S]}  # fmt: skip


def _run_all(search: GroupSearch) -> list[list[dict]]:
    """Drive the searcher as Tune does, completing every configuration; members by group."""
    groups, n = [], 0
    while (config := search.suggest(f"t{n}")) not in (None, search.FINISHED):
        work, members = config[WORK], []
        while (member := work.items[len(members)]) is not None:
            members.append(member)
            search.on_trial_result(f"t{n}", _result(member["number"]))
        search.on_trial_complete(f"t{n}")
        assert work.closed
        groups.append(members)
        n += 1
    return groups


def test_a_group_holds_only_configurations_with_its_exact_environment() -> None:
    search = _search(group_size=4)
    groups = _run_all(search)
    space = search.ctx.space
    assert sum(len(g) for g in groups) == TOTAL
    assert all(1 <= len(g) <= 4 for g in groups)
    envs = [[space.env_vars(member["params"]) for member in g] for g in groups]
    assert all(all(env == g[0] for env in g) for g in envs)
    # consecutive groups differ in environment unless the first was full
    for before, after, members in zip(envs, envs[1:], groups, strict=False):
        assert before[0] != after[0] or len(members) == 4
    assert groups[0][0]["params"] == space.baseline() and groups[0][0]["prune_below"] is None
    done = search.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) == TOTAL


def test_cold_evaluation_gives_every_configuration_its_own_group() -> None:
    groups = _run_all(_search(warm=False))
    assert [len(g) for g in groups] == [1] * TOTAL


def test_a_dead_group_loses_only_the_configuration_it_was_on() -> None:
    search = _search(group_size=8, spaces=("accumulation",))  # one environment for all
    config = search.suggest("t0")
    baseline = config[WORK].items[0]
    search.on_trial_result("t0", _result(baseline["number"]))
    sent = config[WORK].items[1]  # the next one, sent when the baseline was told
    assert sent is not None
    search.on_trial_complete("t0")  # the group ended before reporting it: re-queued
    again = search.suggest("t1")[WORK].items[0]
    assert again["number"] == sent["number"]
    search.on_trial_complete("t1", error=True)  # its driver died: that one is the casualty
    trial = search.study.trials[sent["number"]]
    assert trial.state == optuna.trial.TrialState.FAIL
    assert trial.user_attrs[m.STATE] == m.CRASH


@pytest.mark.parametrize("state", [m.OOM, m.HANG, m.PRUNED])
def test_failed_configurations_reach_optuna_as_failures_not_zero(state: str) -> None:
    search = _search()
    config = search.suggest("t0")
    number = config[WORK].items[0]["number"]
    search.on_trial_result("t0", _result(number, state=state, value=None))
    trial = search.study.trials[number]
    assert trial.value is None and trial.user_attrs[m.STATE] == state
    expected = optuna.trial.TrialState.PRUNED if state == m.PRUNED else optuna.trial.TrialState.FAIL
    assert trial.state == expected


@pytest.mark.parametrize(("state", "reason"), [
    (m.CRASH, "the training code raised RuntimeError: Expected to have finished reduction"),
    (m.ERROR, "could not derive its plan"),
])  # fmt: skip
def test_a_baseline_that_fails_for_every_trial_ends_the_search_after_it(
    state: str, reason: str, capsys: pytest.CaptureFixture
) -> None:
    """A baseline that crashes in the training code ends the search: every trial would crash
    the same way, so the search stops after it, records what was asked as interrupted, and says
    why."""
    search = _search(group_size=4, spaces=("accumulation",))  # one environment: one group
    config = search.suggest("t0")
    baseline = config[WORK].items[0]
    result = _result(baseline["number"], state=state, value=None)
    result[f"{OUTCOME}/{m.REASON}"] = reason
    search.on_trial_result("t0", result)
    assert config[WORK].items[1] is None, "the baseline's group gets nothing more"
    search.on_trial_complete("t0")
    assert search.suggest("t1") == search.FINISHED
    assert "no further trial starts: the baseline failed" in capsys.readouterr().out
    states = [t.user_attrs[m.STATE] for t in search.study.trials]
    assert states[0] == state and set(states[1:]) <= {"interrupted"}


@pytest.mark.parametrize(("state", "reason"), [
    (m.OOM, "out of memory at micro_batch=8"),  # another split may fit
    (m.HANG, "hang in phase start: 0 of 2 workers ready"),  # a slow or stuck cluster
    (m.CRASH, "a worker process died: ActorDiedError"),  # a lost node, the host's OOM killer
])  # fmt: skip
def test_a_baseline_that_failed_for_its_own_reasons_lets_the_search_go_on(
    state: str, reason: str
) -> None:
    search = _search(group_size=4, spaces=("accumulation",))  # one environment: one group
    config = search.suggest("t0")
    result = _result(config[WORK].items[0]["number"], state, None)
    result[f"{OUTCOME}/{m.REASON}"] = reason
    search.on_trial_result("t0", result)
    assert search.baseline_failed is None


def test_only_configurations_after_a_best_get_a_prune_threshold() -> None:
    search = _search(group_size=8, spaces=("accumulation",))
    search.ctx = dataclasses.replace(
        search.ctx, config=load_config(None, "smoke", ["search.prune=true"])
    )
    config = search.suggest("t0")
    work = config[WORK]
    assert work.items[0]["prune_below"] is None  # the baseline is never pruned
    search.on_trial_result("t0", _result(work.items[0]["number"], value=100.0))
    assert work.items[1]["prune_below"] == pytest.approx(100.0 * (1 - 3 * MIN_NOISE))


class _HangingGroup:
    """A worker group that measures its plans in order until it reaches one named ``hang``:
    that one is a hang, the rest it took are not reached (None), as ``GroupRun.run`` says."""

    made: list[list[str]] = []

    def __init__(self, ctx, name: str, nodes=None, owned: bool = False) -> None:  # noqa: ANN001
        self.name, self.places = name, {}

    def run(self, source, emit) -> list:
        plans = [plan for plan, _ in source]
        type(self).made.append(plans)
        out: list = []
        for k, plan in enumerate(plans):
            hung = plan.startswith("hang")
            outcome = {m.STATE: m.HANG if hung else m.COMPLETE, m.SAMPLES_PER_S: 1.0}
            if hung:
                outcome["phase"] = plan.split()[1]
            emit(k, outcome)
            out.append(outcome)
            if hung:
                return out + [None] * (len(plans) - k - 1)
        return out


@dataclasses.dataclass(frozen=True)
class _Ctx:
    """What measure_plans reads of a TrialContext itself (the groups here are stand-ins)."""

    slowest_start_s: float | None = None


def test_a_hung_remeasured_run_does_not_cost_the_runs_after_it(monkeypatch) -> None:
    from orchestrator.search import trial

    monkeypatch.setattr(trial, "GroupRun", _HangingGroup)
    _HangingGroup.made = []
    env, other = {}, {"NCCL_ALGO": "Ring"}
    items = [("B", env), ("hang measure t5", env), ("B", env), ("t1", other), ("B", env)]
    seen: list[int] = []
    outcomes = trial.measure_plans(_Ctx(), items, "remeasure", lambda i, o: seen.append(i))
    assert [o[m.STATE] for o in outcomes] == [m.COMPLETE, m.HANG, m.COMPLETE, m.COMPLETE,
                                              m.COMPLETE]  # fmt: skip
    assert seen == [0, 1, 2, 3, 4], "each outcome is told at its own position"
    # the baseline after the hang ran in a fresh group; a group per environment run
    assert _HangingGroup.made == [["B", "hang measure t5", "B"], ["B"], ["t1"], ["B"]]


def test_an_environment_whose_group_hangs_while_it_starts_is_not_tried_again(monkeypatch):
    from orchestrator.search import trial

    monkeypatch.setattr(trial, "GroupRun", _HangingGroup)
    _HangingGroup.made = []
    env = {"NCCL_PROTO": "LL128"}
    items = [("hang start t5", env), ("B", env), ("B", {})]
    outcomes = trial.measure_plans(_Ctx(), items, "remeasure")
    assert [o[m.STATE] for o in outcomes] == [m.HANG, m.ERROR, m.COMPLETE]
    assert "not reached" in outcomes[1][m.REASON]
    assert _HangingGroup.made == [["hang start t5", "B"], ["B"]], "one start hang, not two"


def test_a_groups_start_bound_comes_from_this_runs_starts_only() -> None:
    """Not from a resumed study's older trials (another cluster's, perhaps), and not at all
    where the cluster autoscales (a group may wait for new nodes)."""
    from orchestrator.search.trial import SLOWEST_START

    search = _search(group_size=1, spaces=("accumulation",))
    config = search.suggest("t0")
    assert config[SLOWEST_START] is None, "nothing seen yet"
    number = config[WORK].items[0]["number"]
    result = _result(number)
    result[f"{OUTCOME}/timings/start_s"], result[f"{OUTCOME}/timings/imports_s"] = 9.0, 3.0
    search.on_trial_result("t0", result)
    search.on_trial_complete("t0")
    assert search.suggest("t1")[SLOWEST_START] == 12.0
    cluster = dataclasses.replace(search.ctx.config.cluster, autoscaling=True)
    config = dataclasses.replace(search.ctx.config, cluster=cluster)
    search.ctx = dataclasses.replace(search.ctx, config=config)
    assert search.suggest("t2")[SLOWEST_START] is None


def test_a_settled_staged_search_asks_for_nothing_more(capsys: pytest.CaptureFixture) -> None:
    """Every configuration measures the same: once the sampler's stage raised nothing for its
    patience, no configuration is asked, the groups end, and one line says why."""
    search = _search(group_size=4)
    search.proposer = Proposer(search.ctx.space, "staged", TOTAL, early_stop=True)
    groups = _run_all(search)
    assert TOTAL - 2 <= sum(len(g) for g in groups) < TOTAL  # stage 3 of 3, patience 2
    out = capsys.readouterr().out
    assert f"of {TOTAL} trials: the sampler's last 2 trial(s)" in out
    assert out.count("search: ending after") == 1
    assert search.suggest("after") == search.FINISHED


def _run_lending(search: GroupSearch) -> list[ListQueue]:
    """Drive the searcher as Tune does with a race to lend its last group to; the groups' work
    queues (the lent one left open: the race, not the searcher, ends it)."""
    search.lend, works, n = print, [], 0
    while (config := search.suggest(f"t{n}")) not in (None, search.FINISHED):
        work, told = config[WORK], 0
        works.append(work)
        while told < len(work.items) and work.items[told] is not None:
            search.on_trial_result(f"t{n}", _result(work.items[told]["number"]))
            told += 1
        if search.lease is not None:
            break
        search.on_trial_complete(f"t{n}")
        n += 1
    return works


def test_the_last_group_in_the_baselines_environment_is_lent_to_the_race() -> None:
    search = _search(group_size=TOTAL, spaces=("accumulation",))
    (work,) = _run_lending(search)
    assert len(work.items) == TOTAL and None not in work.items, "the group is kept, not ended"
    assert search.lease is not None and search.lease.work is work
    assert search.lease.env == dict(search.ctx.config.env)


def test_only_the_last_group_can_be_lent_and_only_in_the_baselines_environment() -> None:
    search = _search(group_size=4)
    works = _run_lending(search)
    assert sum(len([i for i in w.items if i is not None]) for w in works) == TOTAL
    assert all(w.items[-1] is None for w in works[:-1]), "every group but the last ends"
    space = search.ctx.space
    last_env = space.env_vars(works[-1].items[0]["params"])
    lent = last_env == space.env_vars(space.baseline())
    assert (search.lease is not None) == lent and (works[-1].items[-1] is None) != lent


def test_a_configuration_the_sampler_asks_for_again_is_not_run_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    search = _search(group_size=4)
    fixed = search.ctx.space.optuna_params(search.ctx.space.baseline())  # asked every time
    with warnings.catch_warnings():  # Python 3.10 has no catch_warnings(category=...)
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        search.study.sampler = optuna.samplers.PartialFixedSampler(fixed, search.study.sampler)
    groups = _run_all(search)
    sent = [repr(sorted(member["params"].items())) for g in groups for member in g]
    assert len(sent) == len(set(sent)) == TOTAL
    repeats = [t for t in search.study.trials if t.user_attrs.get(m.STATE) == REPEAT]
    assert repeats and all(t.state == optuna.trial.TrialState.FAIL for t in repeats)
    assert counted(search.study) == TOTAL
    said = capsys.readouterr().out
    for t in repeats:  # each says why its number ran nothing
        assert f"trial {t.number:3d}   REPEAT: not run: trial " in said, said
