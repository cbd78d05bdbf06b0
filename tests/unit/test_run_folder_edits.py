"""A run folder read as typed records, whatever it holds, and written whole.

Run folders get hand-edited, copied between versions and mailed around: a value of the wrong
kind, a number no count can be (negative, NaN, infinite, past a float) or a file too big or too
deep reads as absent and is said in one line; every whole file is written beside and renamed
into place, so a reader holding the old one keeps it whole.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchestrator.runfiles import (
    PROGRESS_CSV,
    REMEASURE_CSV,
    RUN_INFO,
    SUMMARY_JSON,
    TRIALS_CSV,
    RunInfo,
    Summary,
    collect,
    num,
    read_csv,
    read_mapping,
    read_run_info,
    write_csv,
    write_summary,
)


def held_copy(path: Path, text: str, keep: Path) -> None:
    """``path`` holding ``text``, and ``keep`` a second name for the same file: what a reader
    that opened the old file still sees once the new one is in place."""
    path.write_text(text)
    keep.unlink(missing_ok=True)
    keep.hardlink_to(path)


def test_run_info_numbers_must_be_finite_and_not_negative(tmp_path: Path) -> None:
    """The doctor printed "GPUs busy only -50.0%" and "-2 workers"; a 400-digit count raised
    OverflowError: each reads as absent."""
    raw = {"gpu_util": -0.5, "world_size": -2, "grad_bytes": math.nan, "num_nodes": 10**400,
           "search_wall_s": math.inf, "memory_capacity_bytes": 2.5, "backend": "gloo"}  # fmt: skip
    (tmp_path / RUN_INFO).write_text(json.dumps(raw))  # NaN and Infinity, as Python writes them
    info = read_run_info(tmp_path)
    assert info == RunInfo(backend="gloo")
    assert RunInfo.from_mapping({"gpu_util": 0, "world_size": 8.0}).world_size == 8


def test_json_nested_past_the_parser_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / RUN_INFO
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        read_mapping(path)
    assert collect([tmp_path]).unreadable == {RUN_INFO: "nested too deeply to read"}


def test_a_non_finite_cell_is_absent() -> None:
    for cell in ("nan", "inf", "-inf", "1e400", math.nan, 10**400):
        assert num(cell) is None, cell
    assert num("2.5") == 2.5 and num(-1) == -1.0


def test_an_infinite_trial_is_not_the_best(tmp_path: Path) -> None:
    rows = "number,state,samples_per_s\n0,complete,10\n1,complete,inf\n2,complete,nan\n"
    (tmp_path / TRIALS_CSV).write_text(rows)
    record = collect([tmp_path])
    assert record.best()["number"] == "0"
    assert [r["number"] for r in record.completed()] == ["0"]


def test_infinite_step_parts_are_not_diagnosed(tmp_path: Path) -> None:
    """"data inf ms of a inf ms step" came from progress.csv cells reading "inf"."""
    from orchestrator.findings import training_step

    cells = "step,step_time_s,data_s,compute_s,exposed_comm_s\n1,inf,inf,nan,0.1\n"
    (tmp_path / PROGRESS_CSV).write_text(cells)
    step = training_step(collect([tmp_path]))
    assert (step.step_time_s, step.data_s, step.compute_s) == (None, None, None)


def test_a_csv_past_its_cap_is_skipped_naming_the_cap(tmp_path: Path) -> None:
    """read_mapping was capped and read_csv was not: a huge progress.csv was read whole."""
    path = tmp_path / PROGRESS_CSV
    with path.open("w") as f:
        f.write("step,loss\n")
        f.truncate(65 << 20)  # past the 64 MiB cap, without writing 65 MiB
    why = collect([tmp_path]).unreadable[PROGRESS_CSV]
    assert "larger than 65536 KiB" in why and "cap" in why
    (tmp_path / "small.csv").write_text("a,b\n1,2\n" + "3,4\n" * 100)
    with pytest.raises(ValueError, match="larger than 0 KiB"):
        read_csv(tmp_path / "small.csv", limit=100)


def test_write_csv_round_trips_and_replaces_the_file_whole(tmp_path: Path) -> None:
    path, keep = tmp_path / "t.csv", tmp_path / "held.csv"
    held_copy(path, "old\n", keep)
    write_csv(path, ["a", "b"], [[1, None], ["x,y", 2.5]])
    assert read_csv(path) == [{"a": "1", "b": ""}, {"a": "x,y", "b": "2.5"}]
    assert keep.read_text() == "old\n" and not list(tmp_path.glob("*.tmp"))


def test_summary_reads_wrong_kinds_as_absent(tmp_path: Path) -> None:
    """The kinds RunInfo keeps, for summary.json: a loss may be negative, a count may not."""
    raw = {"steps": "10", "steps_wanted": 10, "final_loss": -0.5, "world_sizes": 5,
           "restarts": {}, "warnings": ["ok", 1], "nonfinite_rate": math.nan,
           "loss_scale": math.inf, "nonfinite_steps": -1, "error": None, "other": 1}  # fmt: skip
    (tmp_path / SUMMARY_JSON).write_text(json.dumps(raw))
    record = collect([tmp_path])
    assert record.summary == Summary(steps_wanted=10, final_loss=-0.5)
    wrong = "steps, nonfinite_steps, nonfinite_rate, loss_scale, world_sizes, restarts, warnings"
    assert record.unreadable == {SUMMARY_JSON: f"{wrong}: wrong kind or value, read as absent"}
    assert record.world_size is None


def test_summary_round_trips_with_every_key(tmp_path: Path) -> None:
    summary = Summary(steps=5, steps_wanted=5, final_loss=1.25, world_sizes=[1, 2],
                      restarts=[{"reason": "node lost", "line": "restart"}], warnings=[],
                      nonfinite_steps=0, nonfinite_rate=0.0)  # fmt: skip
    write_summary(tmp_path, summary)
    assert set(json.loads((tmp_path / SUMMARY_JSON).read_text())) == set(summary.as_mapping())
    record = collect([tmp_path])
    assert record.summary == summary and record.unreadable == {} and record.world_size == 2


def test_the_training_run_rewrites_its_summary_whole(tmp_path: Path) -> None:
    """A resumed run rewrites summary.json: the doctor reading it meanwhile sees one whole."""
    from orchestrator.train.runlog import RunLog

    keep = tmp_path / "held.json"
    held_copy(tmp_path / SUMMARY_JSON, '{"steps": 3}', keep)
    log = RunLog(tmp_path, steps=10, log_every=10)
    written = log.summary(2.0, "worker died")
    log.close()
    assert keep.read_text() == '{"steps": 3}'
    assert Summary.from_mapping(written) == collect([tmp_path]).summary
    assert (written["steps"], written["world_sizes"], written["error"]) == (0, [], "worker died")


def test_the_closing_lines_of_a_diverged_run(capsys: pytest.CaptureFixture[str]) -> None:
    """A NaN final loss reads as absent: the training command says n/a, not a format error."""
    from orchestrator.train.cli import print_summary

    summary = Summary.from_mapping({"steps": 4, "steps_wanted": 4, "final_loss": math.nan,
                                    "world_sizes": [2], "nonfinite_steps": 4,
                                    "nonfinite_rate": 1.0, "wall_s": 3.0})  # fmt: skip
    print_summary(summary, Path("out"))
    out = capsys.readouterr().out
    assert "done: 4/4 steps, final loss n/a, n/a samples/s" in out
    assert "0 restart(s), 3s" in out and "non-finite steps: 4 (100.00%)" in out


def test_a_resume_whose_checkpoint_holds_the_last_step_trains_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The driver died after the workers' final checkpoint, before its rows reached it (seen
    in the killed-driver test): --resume closes the run from that checkpoint, without Ray,
    exit 0, the summary at the last step with the loss it saved."""
    import ray

    from orchestrator.train.cli import main

    folder = tmp_path / "run" / "train" / "checkpoint_2026-12-02_07-19-22.988152"
    folder.mkdir(parents=True)
    (folder / "train_state.json").write_text(json.dumps({"step": 40, "last_loss": 7.639}))
    args = ["--preset", "smoke", "--steps", "40", "--out", str(tmp_path / "run")]
    assert main(args) == 2  # without --resume: the folder holds a run
    assert main([*args, "--resume"]) == 0
    out = capsys.readouterr().out
    assert "already reached step 40 of 40" in out and "final loss 7.6390" in out
    summary = collect([tmp_path / "run"]).summary
    assert (summary.steps, summary.steps_wanted, summary.final_loss) == (40, 40, 7.639)
    assert summary.warnings == ["steps 1-40 ran before this --resume (its checkpoint "
                                "checkpoint_2026-12-02_07-19-22.988152) but never reached "
                                "progress.csv"] and not ray.is_initialized()  # fmt: skip


def test_the_remeasure_table_is_written_whole(tmp_path: Path) -> None:
    from orchestrator.runfiles.remeasure import write_remeasure

    keep = tmp_path / "held.csv"
    held_copy(tmp_path / REMEASURE_CSV, "old\n", keep)
    rows = [{"trial": 0, "role": "baseline", "state": "complete", "samples_per_s": 10.0},
            {"trial": 3, "role": "finalist", "state": "oom", "samples_per_s": None}]  # fmt: skip
    write_remeasure(tmp_path / REMEASURE_CSV, rows)
    assert keep.read_text() == "old\n"
    rows = read_csv(tmp_path / REMEASURE_CSV)
    assert [(r["trial"], r["role"], r["samples_per_s"]) for r in rows] == [
        ("0", "baseline", "10.0"), ("3", "finalist", "")
    ]  # fmt: skip
