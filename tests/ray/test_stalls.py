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
from _stalls import Command, report

START_TIMEOUT_S, HEARTBEAT_S = 120, 5
"""Generous enough for trial 0's worker group to start on a loaded 2-core machine (20 s and
60 s were not, beside other users' tests); the frozen scaling group of (b) overruns it, or the
bound adapted to the starts seen before it, whichever is shorter."""
PATIENT_START_S = 300
"""The start bound where the start is not what is tested."""
TRIAL_TIMEOUT_S = 60
"""Below the smoke preset's step_deadline_s (60 s after the last step, in the live rank):
the driver's bound is what ends a frozen configuration here."""


def _search(out: Path, *sets: str, trials: int = 3) -> Command:
    """The smoke search of ``trials`` with the given ``--set`` values on top of short bounds."""
    base = [f"search.start_timeout_s={PATIENT_START_S}", f"search.heartbeat_s={HEARTBEAT_S}",
            f"search.trial_timeout_s={TRIAL_TIMEOUT_S}", "search.prune=false"]  # fmt: skip
    args = ["--preset", "smoke", "--out", str(out), "--trials", str(trials)]
    for value in [*base, *sets]:
        args += ["--set", value]
    return Command("orchestrator.search", args)


def _baseline_completed(search: Command) -> float:
    """When trial 0's line came; it must have completed (else the machine is too loaded for
    these bounds, and the test says so rather than freezing the wrong group)."""
    at, line = search.first("trial   0 ", timeout_s=300)
    assert "HANG" not in line and "ERROR" not in line, "the baseline failed:\n" + search.text()
    return at


def _rows(out: Path) -> dict[int, dict[str, str]]:
    return {int(r["number"]): r for r in csv.DictReader((out / "trials.csv").open())}


@pytest.mark.slow
@pytest.mark.timeout(900)  # two bounds waited in one search: 500 s on a slow 2-core machine
def test_a_frozen_measurement_then_a_frozen_start_are_hangs_in_their_phases(
    tmp_path: Path,
) -> None:
    """One search, two freezes (a search each cost a cold start of its own). Trial 1 runs warm
    on trial 0's workers: one of them frozen mid-measurement is a hang in phase measure within
    search.trial_timeout_s, and its group is ended. Trial 2 goes on in a fresh group: a worker
    frozen while that group starts is a hang in phase start at a multiple of the starts seen,
    well before search.start_timeout_s (300 s, the default; 522 s when the full bound was
    waited). Trial 3 completes, and no worker survives."""
    out = tmp_path / "stall"
    search = _search(out, "search.remeasure_top=0", "search.scaling_baseline=false", trials=4)
    try:  # warm evaluation: trial 1 runs on trial 0's workers, dispatched as 0 ends
        after = _baseline_completed(search)
        frozen, stopped_at = search.freeze(min(search.workers()))
        seen_at, line = search.first("trial   1     HANG", TRIAL_TIMEOUT_S + 60, after)
        report("mid-measurement", seen_at - stopped_at, line)
        assert "phase measure" in line and f"trial_timeout_s={TRIAL_TIMEOUT_S}" in line, line
        assert seen_at - stopped_at < TRIAL_TIMEOUT_S + 15, search.text()
        # trial 2's group is a new one: its first worker is frozen as it appears
        _, stopped_at = search.freeze_new_worker(search.workers() | {frozen})
        seen_at, line = search.first("trial   2     HANG", PATIENT_START_S + 60, seen_at)
        rc = search.proc.wait(timeout=400)
    finally:
        search.kill()
    took_s = seen_at - stopped_at
    report("while its group starts", took_s, line)
    assert rc == 0, search.text()
    assert "trial 1: window" in search.text()  # the heartbeats while each waited
    assert "trial 2: starting 2 workers" in search.text()
    bound = re.search(r"within (\d+)s \(4x the slowest group start seen", line)
    assert "phase start" in line and bound, line
    bound_s = float(bound.group(1))
    assert bound_s < PATIENT_START_S and took_s < bound_s + 15, search.text()
    rows = _rows(out)
    assert (rows[1]["state"], rows[1]["phase"]) == ("hang", "measure")
    assert (rows[2]["state"], rows[2]["phase"]) == ("hang", "start")
    assert rows[3]["state"] == "complete", "the search goes on in a fresh group"
    waited_s = bound_s - 0.5  # the line prints the bound in whole seconds (74.6 s shows as 75s)
    assert float(rows[2]["trial_wall_s"]) >= waited_s
    assert float(rows[2]["start_s"]) >= waited_s  # its wait is not hidden
    assert not search.survivors(), "no worker survives the search"


@pytest.mark.slow
def test_b_frozen_scaling_and_remeasure_groups_are_ended(tmp_path: Path) -> None:
    """A frozen 1-worker scaling group is a hang and is killed before the verdict's race
    starts (not left until the search ends); a worker frozen in the race is a hang too: its
    group is ended and the race goes on in a fresh one, the pairs so far kept."""
    out = tmp_path / "stall"
    search = _search(out, "search.remeasure_top=1", f"search.start_timeout_s={START_TIMEOUT_S}")
    try:
        after, _ = search.first("scaling: measuring the baseline on 1 worker", timeout_s=500)
        scaling, scaling_at = search.freeze_new_worker(search.workers())
        seen_at, line = search.first("scaling: the 1-worker baseline did not complete",
                                     START_TIMEOUT_S + TRIAL_TIMEOUT_S + 60, after)  # fmt: skip
        report("in the 1-worker scaling group", seen_at - scaling_at, line)
        assert "hang in phase" in line, search.text()
        gone = _gone_by(search, scaling, "finalists: ")
        after, _ = search.first("race round 1: ", timeout_s=300)
        frozen, stopped_at = search.freeze(min(search.workers()))
        seen_at, line = search.first(": hang: hang in phase measure", TRIAL_TIMEOUT_S + 60, after)
        search.first("going on in a fresh worker group", 60, after)
        rc = search.proc.wait(timeout=400)
    finally:
        search.kill()
    report("during the verdict's race", seen_at - stopped_at, line)
    assert gone, "the frozen scaling worker was still alive when the race began"
    assert rc == 0, search.text()
    assert seen_at - stopped_at < TRIAL_TIMEOUT_S + 15, search.text()
    assert "\nverdict: " in search.text(), search.text()
    rows = list(csv.DictReader((out / "remeasure.csv").open()))
    states = [r["state"] for r in rows]
    assert "hang" in states and states[states.index("hang") + 1:].count("complete") >= 2, states
    assert not search.survivors(), "no worker survives the search"


def _gone_by(command: Command, pid: int, text: str) -> bool:
    """Whether ``pid`` had ended when the line with ``text`` appeared (waiting for it)."""
    while not any(text in line for _, line in command.lines):
        if pid in command.survivors() and command.proc.poll() is None:
            time.sleep(0.1)
            continue
        return pid not in command.survivors()
    return pid not in command.survivors()


@pytest.mark.slow
def test_c_a_worker_frozen_in_training_ends_the_run_with_phase_step(tmp_path: Path) -> None:
    stall_s = 30
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
    finally:
        train.kill()
    report("in a training run", seen_at - stopped_at, line)
    assert rc == 1, train.text()
    assert "hang in phase step" in line and f"stall_timeout_s={stall_s}" in line, line
    assert seen_at - stopped_at < stall_s + 15, train.text()
    assert "nothing new for" in train.text()  # the heartbeat while it waited
    assert not train.survivors(), "no worker survives the run"
