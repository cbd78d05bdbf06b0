"""No silent stalls: a worker frozen (SIGSTOP) is caught by the driver within its bound,
recorded with the phase it hung in, its processes are gone, and the search goes on.

A frozen process cannot run its own watchdog, so these freeze a real Ray Train worker from
outside and time the user's line that says so.
"""

from __future__ import annotations

import csv
import re
import time
from pathlib import Path

import pytest
from _search import Holds
from _stalls import Command, report

HEARTBEAT_S = 5
PATIENT_START_S = 300
"""search.start_timeout_s: generous for a group to start on a loaded 2-core machine; the frozen
starts are caught earlier, by the bound adapted to the starts seen before them."""
TRIAL_TIMEOUT_S = 20
"""Below the smoke preset's step_deadline_s (60 s after the last step, in the live rank):
the driver's bound is what ends a frozen configuration here."""


def _search(
    out: Path, *sets: str, trials: int = 3, env: dict[str, str] | None = None
) -> Command:
    """The smoke search of ``trials`` with the given ``--set`` values on top of short bounds."""
    base = [f"search.start_timeout_s={PATIENT_START_S}", f"search.heartbeat_s={HEARTBEAT_S}",
            f"search.trial_timeout_s={TRIAL_TIMEOUT_S}", "search.prune=false"]  # fmt: skip
    args = ["--preset", "smoke", "--out", str(out), "--trials", str(trials)]
    for value in [*base, *sets]:
        args += ["--set", value]
    return Command("orchestrator.search", args, env)


def _baseline_completed(search: Command) -> float:
    """When trial 0's line came; it must have completed (else the machine is too loaded for
    these bounds, and the test says so rather than freezing the wrong group)."""
    at, line = search.first("trial   0 ", timeout_s=300)
    assert "HANG" not in line and "ERROR" not in line, "the baseline failed:\n" + search.text()
    return at


def _rows(out: Path) -> dict[int, dict[str, str]]:
    return {int(r["number"]): r for r in csv.DictReader((out / "trials.csv").open())}


@pytest.mark.slow
@pytest.mark.timeout(1500)  # four bounds waited in one search (one cold start, not two)
def test_four_frozen_groups_in_one_search_are_hangs_in_their_phases(tmp_path: Path) -> None:
    """One search, four freezes, each a different group's phase. Trial 1 runs warm on trial 0's
    workers: one of them frozen mid-measurement is a hang in phase measure within
    search.trial_timeout_s, and its group is ended. Trial 2 goes on in a fresh group: a worker
    frozen while that group starts is a hang in phase start at a multiple of the starts seen,
    well before search.start_timeout_s (300 s). Trial 3 completes in a fresh group. The frozen
    verdict's race goes on in trial 3's group (lent to it): a worker frozen there is a hang,
    its group is ended and the race goes on in a fresh one, the pairs so far kept. The 1-worker
    scaling group, measured after the verdict, frozen once started (held at the 'measure' kill
    point), is a hang in phase measure too, killed before the search writes its report (not
    left until it ends). No worker survives."""
    out, holds = tmp_path / "stall", Holds(tmp_path / "holds")
    search = _search(out, "search.remeasure_top=1", trials=4, env=holds.env())
    try:  # warm evaluation: trial 1 runs on trial 0's workers, dispatched as 0 ends
        after = _baseline_completed(search)
        frozen, stopped_at = search.freeze(min(search.workers()))
        seen_at, line = search.first("trial   1     HANG", TRIAL_TIMEOUT_S + 60, after)
        report("mid-measurement", seen_at - stopped_at, line)
        assert "phase measure" in line and f"trial_timeout_s={TRIAL_TIMEOUT_S}" in line, line
        assert seen_at - stopped_at < TRIAL_TIMEOUT_S + 15, search.text()
        # trial 2's group is a new one: its workers are frozen as they appear
        seen_at, start_line, _, stopped_at = search.freeze_new_workers(
            search.workers() | {frozen}, "trial   2     HANG", PATIENT_START_S + 60
        )
        start_took_s = seen_at - stopped_at
        report("while its group starts", start_took_s, start_line)
        # the race goes on in trial 3's group, lent to it: a worker frozen there is a hang
        after, _ = search.first("race round 1: ", timeout_s=300)
        frozen, stopped_at = search.freeze(min(search.workers()))
        seen_at, race_line = search.first(": hang: hang in phase measure", TRIAL_TIMEOUT_S + 60,
                                          after)  # fmt: skip
        report("during the verdict's race", seen_at - stopped_at, race_line)
        race_took_s = seen_at - stopped_at
        search.first("going on in a fresh worker group", 60, after)
        # the 1-worker scaling group: its worker frozen where it holds, started, not measuring
        after, _ = search.first("scaling: measuring the baseline on 1 worker", timeout_s=500)
        before = search.workers()
        holds.arm("measure")
        holds.wait("measure", search.proc, timeout_s=PATIENT_START_S)
        scaling = search.workers() - before
        assert scaling, "the worker holding at 'measure' is not a new one:\n" + search.text()
        scaling_at = max(search.freeze(pid)[1] for pid in sorted(scaling))
        seen_at, line = search.first("scaling: the 1-worker baseline did not complete",
                                     TRIAL_TIMEOUT_S + 60, after)  # fmt: skip
        report("in the 1-worker scaling group", seen_at - scaling_at, line)
        assert "hang in phase measure" in line, search.text()
        gone = _gone_by(search, scaling, "report: ")
        rc = search.proc.wait(timeout=400)
        left = search.left()
    finally:
        search.kill()
    assert rc == 0, search.text()
    assert "trial 1: window" in search.said()  # the heartbeats while each waited
    assert "trial 2: starting 2 workers" in search.said()
    bound = re.search(r"within (\d+)s \(4x the slowest group start seen", start_line)
    assert "phase start" in start_line and bound, start_line
    bound_s = float(bound.group(1))
    assert bound_s < PATIENT_START_S and start_took_s < bound_s + 15, search.text()
    rows = _rows(out)
    assert (rows[1]["state"], rows[1]["phase"]) == ("hang", "measure")
    assert (rows[2]["state"], rows[2]["phase"]) == ("hang", "start")
    assert rows[3]["state"] == "complete", "the search goes on in a fresh group"
    waited_s = bound_s - 0.5  # the line prints the bound in whole seconds (74.6 s shows as 75s)
    assert float(rows[2]["trial_wall_s"]) >= waited_s
    assert float(rows[2]["start_s"]) >= waited_s  # its wait is not hidden
    assert gone, "the frozen scaling worker was still alive when the search wrote its report"
    assert race_took_s < TRIAL_TIMEOUT_S + 15, search.text()
    assert "\nverdict: " in search.said(), search.text()
    raced = list(csv.DictReader((out / "remeasure.csv").open()))
    states = [r["state"] for r in raced]
    assert "hang" in states and states[states.index("hang") + 1 :].count("complete") >= 2, states
    assert not left, f"no process of the search survives it: {left}"


def _gone_by(command: Command, pids: set[int], text: str) -> bool:
    """Whether ``pids`` had all ended when the line with ``text`` appeared (waiting for it)."""
    while not any(text in line for _, line in command.lines):
        if pids & command.survivors() and command.proc.poll() is None:
            time.sleep(0.1)
            continue
        break
    return not pids & command.survivors()


@pytest.mark.slow
def test_a_worker_frozen_in_training_ends_the_run_with_phase_step(tmp_path: Path) -> None:
    stall_s = 20
    train = Command("orchestrator.train", [
        "--preset", "smoke", "--steps", "400", "--workers", "1:2", "--out", str(tmp_path / "run"),
        "--set", "train.log_every=1", "--set", f"train.stall_timeout_s={stall_s}",
        "--set", "train.first_report_timeout_s=300",
        "--set", f"search.heartbeat_s={HEARTBEAT_S}",
    ])  # fmt: skip
    try:
        after, _ = train.first("step      3/400", timeout_s=300)
        frozen, stopped_at = train.freeze(min(train.workers()))
        seen_at, line = train.first("training: hang in phase", stall_s + 60, after)
        rc = train.proc.wait(timeout=120)
        left = train.left()
    finally:
        train.kill()
    report("in a training run", seen_at - stopped_at, line)
    assert rc == 1, train.text()
    assert "hang in phase step" in line and f"stall_timeout_s={stall_s}" in line, line
    assert seen_at - stopped_at < stall_s + 15, train.text()
    assert "nothing new for" in train.said()  # the heartbeat while it waited
    assert not left, f"no process of the run survives it: {left}"
