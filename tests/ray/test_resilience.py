"""A search survives crashing, hanging and OOM trials, and its own driver's death."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import optuna
import pytest
from _search import FAST, Holds, interrupt_in_second_trial
from _search import cli as _cli

DEADLINE_S = 15


def _rows(out: Path) -> list[dict]:
    return list(csv.DictReader((out / "trials.csv").open()))


@pytest.mark.slow  # minutes of CI time: run with -m slow
def test_injected_faults_are_recorded_and_the_search_goes_on(tmp_path: Path) -> None:
    """Crash, hang, OOM and corrupt trials in one search (a search each cost a cold start):
    trial 5's gradients are perturbed on one rank after the all-reduce, not slower, only wrong;
    the guard ends it corrupt, and the healthy configurations (exact knobs, dropout on in the
    smoke model) pass it."""
    out = tmp_path / "faults"
    proc = _cli(
        [
            *FAST,
            "--out",
            str(out),
            "--trials",
            "6",
            "--set",
            "search.prune=false",
            "--set",
            f"search.step_deadline_s={DEADLINE_S}",
            "--inject-faults",
            "1:crash,2:hang,3:oom,5:corrupt",
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {int(r["number"]): r for r in _rows(out)}
    assert rows[0]["state"] == "complete"
    assert rows[1]["state"] == "crash" and "died" in rows[1]["reason"]
    assert rows[2]["state"] == "hang" and "step_deadline_s=15" in rows[2]["reason"]
    assert rows[3]["state"] == "oom" and "micro_batch=" in rows[3]["reason"]
    assert rows[5]["state"] == "corrupt" and "grad norm" in rows[5]["reason"], rows[5]
    # a crash or a hang ends its worker group (the next trial starts a new one); an OOM on
    # every rank does not: trial 4 is measured by trial 3's workers
    assert all(float(rows[n]["start_s"]) > 0 for n in (0, 2, 3))
    assert rows[4]["state"] == "complete" and float(rows[4]["start_s"]) == 0
    # the hang is ended by its step deadline, not by the trial's timeout (the smoke preset's
    # search.trial_timeout_s, 300 s): past its group's start, within the deadline plus the
    # build, warm-up and teardown around it
    hang = rows[2]
    assert float(hang["trial_wall_s"]) - float(hang["start_s"]) < DEADLINE_S + 45, hang
    assert not (out / "best.yaml").read_text().startswith("# commtune best configuration: trial 5,")
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{out / 'study.db'}")
    states = [t.state for t in study.trials]
    assert states[0] == states[4] == optuna.trial.TrialState.COMPLETE
    failed = [states[n] for n in (1, 2, 3, 5)]
    assert failed == [optuna.trial.TrialState.FAIL] * 4, "never a throughput of 0"
    assert not proc.left, f"no process of the search survives it: {proc.left}"


@pytest.mark.slow  # 179 s on a loaded 2-core machine
def test_ctrl_c_leaves_no_open_trial_in_the_study(tmp_path: Path) -> None:
    out = tmp_path / "sigint"
    args = [*FAST, "--out", str(out), "--trials", "3", "--set", "search.prune=false"]
    storage = f"sqlite:///{out / 'study.db'}"
    holds = Holds(tmp_path / "holds")
    rc, left = interrupt_in_second_trial(args, storage, holds, tmp_path / "stderr.txt")
    err = (tmp_path / "stderr.txt").read_text()
    assert "commtune: Ctrl-C: ending the search" in err, err[-3000:]  # it reached the driver
    assert rc == 1 and "interrupted; resume with --resume" in err, err[-3000:]
    assert not left, f"no process it started survives Ctrl-C: {left}"
    study = optuna.load_study(study_name="smoke", storage=storage)
    states = [t.state for t in study.trials]
    assert states[0] == optuna.trial.TrialState.COMPLETE
    open_states = {optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING}
    assert not open_states & set(states), states
    closed = [t for t in study.trials if t.user_attrs.get("state") == "interrupted"]
    assert 1 in [t.number for t in closed], "trial 1, stopped mid-way, is interrupted"
    assert all("Ctrl-C" in t.user_attrs["reason"] for t in closed)


@pytest.mark.slow  # minutes of CI time: run with -m slow
def test_time_budget_stops_cleanly_and_writes_outputs(tmp_path: Path) -> None:
    out = tmp_path / "budget"
    proc = _cli([*FAST, "--out", str(out), "--trials", "20", "--time-budget", "0.05"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "time budget reached" in proc.stdout
    rows = _rows(out)
    assert 1 <= len(rows) < 20 and rows[0]["state"] == "complete"
    assert (out / "best.yaml").is_file()
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{out / 'study.db'}")
    open_states = {optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING}
    assert not open_states & {t.state for t in study.trials}, "nothing queued stays behind"
    assert {r["number"] for r in rows} <= {str(t.number) for t in study.trials if t.datetime_start}


def test_more_workers_than_the_cluster_holds_fails_fast(tmp_path: Path) -> None:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        started = time.monotonic()
        proc = _cli(
            [
                *FAST,
                "--out",
                str(tmp_path / "big"),
                "--address",
                cluster.address,
                "--set",
                "cluster.num_workers=4",
                "--set",
                "workload.global_batch=16",
            ]
        )
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "cluster.num_workers" in proc.stderr and "CPU=1" in proc.stderr
        assert time.monotonic() - started < 60
    finally:
        cluster.shutdown()
