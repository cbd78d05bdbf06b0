"""What a training run says of its recoveries: where a restart resumed from (a checkpoint or
an in-memory snapshot), the steps it re-did, where its seconds went; what snapshots cost."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.schema import ConfigError, load_config
from orchestrator.train.run import snapshot_every
from orchestrator.train.runlog import Restart, RunLog, snapshot_line
from train_fns import metrics as m


def _start(world: int, **fields: object) -> dict:
    return {"kind": "start", "world_size": world, "accumulation_steps": 1, "micro_batch": 8,
            "global_batch": 8 * world, **fields}  # fmt: skip


def _steps(log: RunLog, steps: range, world: int, start: dict, at: float,
           extra: dict | None = None) -> None:  # fmt: skip
    """Steps ``steps`` at ``world`` workers, a second apart from ``at``, after ``start``."""
    extra = extra or {}
    rows = [{m.STEP: s, m.WORLD_SIZE: world, m.SAMPLES_PER_S: 10.0, m.LOSS: 1.0,
             m.WALL_TIME: at + s - steps[0], **extra.get(s, {})} for s in steps]  # fmt: skip
    rows[0][m.EVENTS] = [start]
    log.take({"report": {m.ROWS: rows}})


def test_a_restart_from_a_snapshot_says_so_and_where_its_time_went(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    log = RunLog(tmp_path, steps=40, log_every=100, snapshot_max_mb=1024)
    took = {5: {m.SNAPSHOT_S: 0.02, m.LAYER_GRAD_NORMS: {"layer.0": 1.0}}, 15: {m.SNAPSHOT_S: 0.04}}
    _steps(log, range(1, 18), 2, _start(2, snapshot_every=5, state_mb=0.4), 1000.0, took)
    assert "snapshots: every 5 steps and at each checkpoint (0.4 MB" in capsys.readouterr().out
    log.take({"failure": {1: "ActorDiedError: node died"}, "time": 2000.0})
    setup = {"imports": 1.5, "build": 0.9, "plan": 0.01}  # under 0.05 s: not said
    restart = _start(1, resumed_from="snapshot", resumed_from_step=15, launched_at=2003.0,
                     started_at=2005.5, setup_s=setup)  # fmt: skip
    later = {20: {m.SNAPSHOT_S: 0.03}, 25: {m.SNAPSHOT_HELD_BACK: True}}
    _steps(log, range(16, 41), 1, restart, 2006.0, later)
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].startswith("snapshots: the one at step 25 was held back, the previous still")
    assert lines[1].startswith("restart: node lost; 2 -> 1 workers, resumed from the snapshot "
                               "at step 15 (2 step(s) re-done); accumulation")  # fmt: skip
    assert lines[2] == (
        "recovered: 2 step(s) re-done, first step 6.0s after the failure was seen (new worker "
        "group 3.0s, imports 1.5s, build 0.9s, first step 0.5s)"
    )
    summary = log.summary(100.0, None)
    log.close()
    from orchestrator.report.diagnosis import section_gradients
    from orchestrator.runfiles import collect

    shown = section_gradients(collect([tmp_path]))  # the report's training-run section
    assert "1 restart(s)" in shown and "<li>restart: node lost; 2 -&gt; 1 workers" in shown
    assert summary["snapshots"] == {
        "taken": 3,
        "median_s": 0.03,
        "total_s": pytest.approx(0.09),
        "held_back": 1,
    }
    (restarted,) = summary["restarts"]
    assert [restarted[k] for k in ("source", "last_step", "resumed_from")] == ["snapshot", 17, 15]
    assert restarted["line"].endswith(
        "(2 step(s) re-done), first step 6.0s after the failure was seen (new worker group 3.0s,"
        " imports 1.5s, build 0.9s, first step 0.5s)"
    )


def test_a_restart_from_a_checkpoint_and_snapshots_off_are_said(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    log = RunLog(tmp_path, steps=30, log_every=100, snapshot_max_mb=1024)
    heavy = _start(2, snapshot_every=0, state_mb=4096.0, snapshot_off="train.snapshot_max_mb")
    _steps(log, range(1, 13), 2, heavy, 1000.0)
    assert "snapshots: off, the state weighs 4096.0 MB > train.snapshot_max_mb=1024" in (
        capsys.readouterr().out
    )
    log.take({"failure": {1: "died"}, "time": 2000.0})
    _steps(log, range(11, 31), 2, _start(2, resumed_from="checkpoint", resumed_from_step=10),
           2009.0)  # fmt: skip
    out = capsys.readouterr().out
    assert "resumed from the checkpoint at step 10 (2 step(s) re-done)" in out
    assert "recovered: 2 step(s) re-done, first step 9.0s after the failure was seen\n" in out
    assert log.summary(1.0, None)["snapshots"] is None
    log.close()
    from orchestrator.report.diagnosis import section_gradients
    from orchestrator.runfiles import collect

    shown = section_gradients(collect([tmp_path]))  # no layer norms logged: restarts still shown
    assert "<li>restart: worker died; 2 -&gt; 2 workers, resumed from the checkpoint" in shown
    off = snapshot_line({"snapshot_off": "keeper", "state_mb": 1.0}, 1024)
    assert off.startswith("snapshots: off for this start, the keeper on the driver's node did not")
    fresh = Restart("worker died", 1.0, 4, 0, 2, 2, source="start")  # before any checkpoint
    assert "2 -> 2 workers, started over from step 0 (4 step(s) re-done)" in fresh.line()


def test_snapshots_default_to_half_the_checkpoint_interval() -> None:
    def every(*sets: str) -> int:
        return snapshot_every(load_config(preset="smoke", sets=list(sets)).train)

    assert every("train.checkpoint_every=10") == 5
    assert every("train.checkpoint_every=7") == 3
    assert every("train.checkpoint_every=2") == 0  # a snapshot would save nothing
    assert every("train.checkpoint_every=10", "train.snapshot_every=1") == 1
    assert every("train.snapshot_every=0") == 0
    for bad in ("train.snapshot_every=-1", "train.snapshot_max_mb=-5", "train.snapshot_every=10"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]) as e:
            load_config(preset="smoke", sets=[bad, "train.checkpoint_every=10"])
    assert "set it below 10, or 0 for none" in str(e.value)
