"""Every wait is bounded from the driver: the arithmetic of the bounds and heartbeats (no Ray)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.cluster.workers import Heartbeat
from orchestrator.config.schema import ConfigError, SearchConfig
from orchestrator.search.group_run import (
    MEASURE,
    START,
    START_FLOOR_S,
    GroupRun,
    bound_of,
    slowest_start,
    waiting_on,
)
from train_fns import metrics as m


def test_the_first_configuration_waits_on_the_start_until_every_rank_is_ready() -> None:
    # rank 0 ready, rank 1 frozen: still the start, counted from fit()'s start
    assert waiting_on(0, 1, 2, fit_start=10.0, started={}, dispatched=9.0) == (START, 10.0)
    assert waiting_on(0, 2, 2, 10.0, {0: 25.0}, 9.0) == (MEASURE, 25.0)


def test_later_configurations_are_measured_from_their_start_or_dispatch() -> None:
    assert waiting_on(1, 2, 2, 10.0, {0: 25.0, 1: 60.0}, 55.0) == (MEASURE, 60.0)
    assert waiting_on(2, 2, 2, 10.0, {0: 25.0}, 55.0) == (MEASURE, 55.0)


def test_each_phase_has_its_own_bound() -> None:
    assert bound_of(START, 40.0, 900.0, None) == ("search.start_timeout_s=40s", 40.0)
    assert bound_of(MEASURE, 40.0, 900.0, None) == ("search.trial_timeout_s=900s", 900.0)
    assert bound_of(MEASURE, 40.0, 900.0, 1.0)[1] == 900.0, "a measurement does not adapt"


def test_a_start_adapts_to_the_slowest_start_seen_within_floor_and_cap() -> None:
    text, seconds = bound_of(START, 300.0, 900.0, 20.0)
    assert seconds == 80.0 and "4x the slowest group start seen, 20 s" in text
    assert "search.start_timeout_s=300s is the most" in text
    assert bound_of(START, 300.0, 900.0, 3.0)[1] == START_FLOOR_S, "never under the floor"
    assert bound_of(START, 300.0, 900.0, 90.0) == ("search.start_timeout_s=300s", 300.0)


def test_the_starts_seen_are_first_configurations_that_started() -> None:
    outcomes = [
        {"timings": {"start_s": 12.0, "imports_s": 6.0}},  # a group's first: 18 s in all
        {"timings": {"start_s": 0.0, "imports_s": 0.0}},  # a warm group's second
        {"phase": START, "timings": {"start_s": 300.0}},  # a hang while starting: not a start
        {m.STATE: m.INFEASIBLE},  # never ran
    ]
    assert slowest_start(outcomes) == 18.0
    assert slowest_start(outcomes, so_far=25.0) == 25.0
    assert slowest_start([], None) is None
    odd = [{"timings": {"start_s": float("nan")}}, {"timings": {"start_s": "x"}},
           {"timings": [1]}, {"timings": {"start_s": 5.0, "imports_s": None}}]  # fmt: skip
    assert slowest_start(odd) == 5.0, "what this code did not write is skipped"


def test_start_timeout_is_bounded() -> None:
    assert SearchConfig().start_timeout_s == 300.0
    with pytest.raises(ConfigError, match="search.start_timeout_s"):
        SearchConfig(start_timeout_s=0.0)
    with pytest.raises(ConfigError, match="search.heartbeat_s"):
        SearchConfig(heartbeat_s=0.0)


def test_heartbeat_speaks_only_after_silence() -> None:
    now, lines = [0.0], []
    beat = Heartbeat(30.0, lines.append, clock=lambda: now[0])
    for t in (10.0, 29.0, 30.0, 45.0, 61.0):
        now[0] = t
        assert beat.beat(lambda: f"waiting ({now[0]:.0f} s)") is False  # never stops a drain
    assert lines == ["waiting (30 s)", "waiting (61 s)"]
    beat.quiet()  # a result line was shown: the next heartbeat is 30 s after it
    now[0] = 90.0
    beat.beat(lambda: "late")
    assert lines[-1] == "waiting (61 s)"


class _Plan(SimpleNamespace):
    world_size, num_windows = 2, 3


def _run(clock: list[float], slowest_start_s: float | None = None) -> GroupRun:
    """A GroupRun at fit() start (t=0) without Ray: a search config and one dispatched plan."""
    run = GroupRun.__new__(GroupRun)
    search = SearchConfig(start_timeout_s=40.0, trial_timeout_s=100.0, heartbeat_s=30.0)
    if slowest_start_s is not None:
        search = SearchConfig(start_timeout_s=300.0, trial_timeout_s=100.0, heartbeat_s=30.0)
    run.ctx = SimpleNamespace(config=SimpleNamespace(search=search),
                              slowest_start_s=slowest_start_s)  # fmt: skip
    run.name, run.plans, run.outcomes, run.ends = "g", [_Plan()], [None], [{}]
    run.started, run.ready, run.progress, run.imports_s = {}, set(), {}, 0.0
    run.places = {}
    run.fit_start = run.boundary = run.dispatched = 0.0
    run.lines = []
    run.heartbeat = Heartbeat(30.0, run.lines.append, clock=lambda: clock[0])
    run.label = lambda index: f"trial {index + 4}"
    return run


def test_a_group_that_never_starts_is_a_hang_in_phase_start(monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr("orchestrator.search.group_run.time.monotonic", lambda: clock[0])
    run, told = _run(clock), []
    run._take({"kind": "start", "index": 0, "rank": 0}, lambda i, o: told.append(o))
    clock[0] = 35.0
    assert run._late(lambda i, o: told.append(o)) is False
    assert run.lines == ["trial 4: starting 2 workers (35 s, 1 ready)"]
    clock[0] = 41.0
    assert run._late(lambda i, o: told.append(o)) is True
    (outcome,) = told
    assert outcome[m.STATE] == m.HANG and outcome["phase"] == START
    assert "1 of 2 workers ready within search.start_timeout_s=40s" in outcome[m.REASON]
    # its whole wall-clock was spent starting: none of it is hidden in "other"
    assert outcome["trial_wall_s"] == 41.0 and outcome["timings"]["start_s"] == 41.0


def test_a_started_group_is_bounded_by_trial_timeout(monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr("orchestrator.search.group_run.time.monotonic", lambda: clock[0])
    run, told = _run(clock), []
    clock[0] = 20.0
    for rank in (0, 1):
        run._take({"kind": "start", "index": 0, "rank": rank}, told.append)
    run._take({"kind": "window", "index": 0, "window": 1}, told.append)
    clock[0] = 119.0  # 99 s after every rank was ready: inside trial_timeout_s, past the start's
    assert run._late(lambda i, o: told.append(o)) is False
    assert run.lines == ["trial 4: window 2/3 (99 s)"]
    clock[0] = 121.0
    assert run._late(lambda i, o: told.append(o)) is True
    assert told[0]["phase"] == MEASURE and "1 of 3 windows" in told[0][m.REASON]
    assert told[0]["timings"]["start_s"] == 20.0


def test_a_start_far_slower_than_those_seen_is_a_hang_sooner(monkeypatch) -> None:
    """Starts of 10 s seen: a group frozen while starting is a hang at the 60 s floor, not at
    search.start_timeout_s=300 s; the reason says which bound fired and why."""
    clock = [0.0]
    monkeypatch.setattr("orchestrator.search.group_run.time.monotonic", lambda: clock[0])
    run, told = _run(clock, slowest_start_s=10.0), []
    run._take({"kind": "start", "index": 0, "rank": 0}, told.append)
    clock[0] = 59.0
    assert run._late(lambda i, o: told.append(o)) is False
    clock[0] = 61.0
    assert run._late(lambda i, o: told.append(o)) is True
    assert told[0]["phase"] == START
    assert "within 60s (4x the slowest group start seen, 10 s; search.start_timeout_s=300s is " \
        "the most)" in told[0][m.REASON], told[0][m.REASON]


def test_a_slow_but_healthy_start_on_a_loaded_machine_is_not_a_hang(monkeypatch) -> None:
    """A loaded machine's starts took 40 s: a start of 150 s (busier still) is inside 4x and
    goes on to be measured."""
    clock = [0.0]
    monkeypatch.setattr("orchestrator.search.group_run.time.monotonic", lambda: clock[0])
    run, told = _run(clock, slowest_start_s=40.0), []
    for t in (30.0, 90.0, 150.0):
        clock[0] = t
        assert run._late(lambda i, o: told.append(o)) is False
    for rank in (0, 1):
        run._take({"kind": "start", "index": 0, "rank": rank}, told.append)
    clock[0] = 200.0  # past the start's bound of 160 s, but the group is measuring now
    assert run._late(lambda i, o: told.append(o)) is False and not told
    assert run.started[0] == 150.0


def test_each_configuration_carries_where_its_ranks_ran(monkeypatch) -> None:
    clock = [0.0]
    monkeypatch.setattr("orchestrator.search.group_run.time.monotonic", lambda: clock[0])
    run, told = _run(clock), []
    for rank, node in ((1, "B"), (0, "A")):
        place = {"node_id": node, "node_ip": "10.0.0.1", "node_rank": 0, "local_rank": rank}
        run._take({"kind": "start", "index": 0, "rank": rank, m.PLACE: place}, told.append)
    clock[0] = 200.0
    run._late(lambda i, o: told.append(o))
    (outcome,) = told
    assert outcome[m.PLACEMENT] == "node0:1,node1:1"
    assert [p["rank"] for p in outcome[m.RANK_PLACES]] == [0, 1]
    assert outcome[m.RANK_PLACES][1] == {"rank": 1, "node_id": "B", "node_ip": "10.0.0.1",
                                         "node_rank": 0, "local_rank": 1}  # fmt: skip


def test_a_training_run_heartbeat_says_what_it_waits_on(tmp_path) -> None:
    from orchestrator.train.run import waiting_line
    from orchestrator.train.runlog import RunLog

    log = RunLog(tmp_path, steps=100, log_every=10)
    assert waiting_line(log, 45.2, 2) == "training: starting 2 workers (45 s)"
    log.world, log.last_step = 2, 40
    assert waiting_line(log, 31.0, 2) == "training: step 40/100, nothing new for 31 s"
    log.close()


def test_a_training_run_is_bounded_from_each_start_and_each_report() -> None:
    from orchestrator.train.run import START as T_START
    from orchestrator.train.run import STEP, Watch

    now = [0.0]
    watch = Watch(90.0, 60.0, clock=lambda: now[0])
    now[0] = 90.0
    assert watch.overrun() is None and watch.phase == T_START
    now[0] = 91.0
    why = watch.overrun()
    assert why and why.startswith("hang in phase start") and "first_report_timeout_s=90s" in why
    watch.take({"report": {}})  # a step reported: the clock starts again, phase step
    now[0] = 151.0
    assert watch.overrun() is None and watch.phase == STEP and watch.silent_s() == 60.0
    now[0] = 152.5
    why = watch.overrun()
    assert "hang in phase step" in why and "stall_timeout_s=60s of the last report" in why
    watch.take({"failure": {0: "died"}})  # a restart follows: its start is bounded again
    now[0] = 222.0
    assert watch.overrun() is None and watch.phase == T_START


@pytest.mark.parametrize("key", ["train.stall_timeout_s", "train.first_report_timeout_s"])
@pytest.mark.parametrize("bad", ["0", "-1", "nan", "1e12"])
def test_a_bad_training_bound_exits_2_before_ray(key: str, bad: str, capsys) -> None:
    from orchestrator.train.cli import main

    assert main(["--preset", "smoke", "--set", f"{key}={bad}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0], err
