"""benchmarks.delivered reads the search's verdict before spending any training run, and builds
the configs it trains: the verdict's leader, kept or not, and the baseline, each as the search
ran it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benchmarks.delivered import configs, judged, read_verdict, trial_config
from orchestrator.paired import PairedRatio


def test_a_run_without_a_race_says_there_is_no_verdict_to_check(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as ended:
        read_verdict(tmp_path)
    message = str(ended.value)
    assert str(tmp_path / "remeasure.csv") in message and "re-measured no finalist" in message


def _race(run: Path, finalist: float) -> None:
    """remeasure.csv of a four-pair window race: trial 1 at ``finalist`` (+1 a pair) vs 100."""
    rows = ["position,trial,role,state,samples_per_s,pairing,pair,against,delta"]
    for k in range(4):
        rows += [f"{2 * k},0,baseline,complete,100,window,{k},1,0.04",
                 f"{2 * k + 1},1,finalist,complete,{finalist + k},window,{k},1,0.04"]  # fmt: skip
    (run / "remeasure.csv").write_text("\n".join(rows) + "\n")


def test_the_verdict_is_read_as_the_search_read_it(tmp_path: Path) -> None:
    _race(tmp_path, 150)  # paired windows: a finalist about 1.5x the baseline, in turns
    verdict = read_verdict(tmp_path)
    assert verdict.chosen is not None and verdict.chosen.ratio == pytest.approx(1.515, abs=0.01)


BEST = {"name": "demo", "strategy": "ddp", "workload": {"model": "bert-mini"},
        "tuned": {"accumulation_steps": 1, "bucket_cap_mb": 25, "reshard_after_forward": True},
        "env": {"NCCL_DEBUG": "WARN", "NCCL_BUFFSIZE": "4194304"}}  # fmt: skip
"""best.yaml of a run that kept its baseline: a fixed knob and a fixed variable beside the
searched ones."""
TRIALS = ("number,state,accumulation_steps,bucket_cap_mb,static_graph,NCCL_BUFFSIZE,strategy,"
          "samples_per_s,reason\n"
          "0,complete,1,25,False,,ddp,15.2,\n"
          "3,complete,4,,,8388608,ddp,19.6,\n")  # fmt: skip


def test_a_trial_runs_as_the_search_ran_it() -> None:
    row = {"number": "3", "state": "complete", "accumulation_steps": "4", "bucket_cap_mb": "",
           "static_graph": "", "NCCL_BUFFSIZE": "8388608", "strategy": "ddp",
           "samples_per_s": "19.6", "reason": ""}  # fmt: skip
    config = trial_config(BEST, row)
    # its knobs; an empty column is the knob's default, not best.yaml's value for it
    assert config["tuned"] == {"accumulation_steps": 4, "reshard_after_forward": True}
    # its searched variable replaces best.yaml's; a variable it did not search stays
    assert config["env"] == {"NCCL_DEBUG": "WARN", "NCCL_BUFFSIZE": 8388608}
    assert config["workload"] == BEST["workload"] and config["strategy"] == "ddp"
    assert "samples_per_s" not in config["tuned"] and "reason" not in config["env"]


def _run(tmp_path: Path, finalist: float) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.yaml").write_text(yaml.safe_dump({**BEST, "tuned": {"accumulation_steps": 9}}))
    (run / "trials.csv").write_text(TRIALS.replace("\n3,", "\n1,"))
    _race(run, finalist)
    return run


def test_a_finalist_the_verdict_did_not_keep_is_trained_from_its_trial(tmp_path: Path) -> None:
    run = _run(tmp_path, 98)  # about 1.0x: no finalist kept, best.yaml is the baseline
    verdict = read_verdict(run)
    assert verdict.chosen is None
    finalist, baseline, number = configs(run, verdict, None, tmp_path)
    assert number == 1
    assert yaml.safe_load(finalist.read_text())["tuned"]["accumulation_steps"] == 4
    assert yaml.safe_load(baseline.read_text())["tuned"]["accumulation_steps"] == 1


def test_a_kept_finalist_is_trained_from_best_yaml_as_written(tmp_path: Path) -> None:
    run = _run(tmp_path, 150)
    finalist, _, number = configs(run, read_verdict(run), None, tmp_path)
    assert number == 1 and yaml.safe_load(finalist.read_text())["tuned"] == {
        "accumulation_steps": 9}


def test_a_trial_trials_csv_lacks_is_named_in_the_error(tmp_path: Path) -> None:
    run = _run(tmp_path, 150)
    with pytest.raises(SystemExit, match="no row for trial 7 .* --trial"):
        configs(run, read_verdict(run), 7, tmp_path)


def test_the_verdicts_ratio_is_judged_against_the_delivered_interval(tmp_path: Path) -> None:
    _race(tmp_path, 150)
    verdict = read_verdict(tmp_path)
    assert "1.515 for trial 1 is inside" in judged(verdict, 1, PairedRatio((1.4, 1.6, 1.5)))
    assert "OUTSIDE the delivered interval: a defect" in judged(
        verdict, 1, PairedRatio((1.0, 1.02, 0.99)))
    assert "compared no trial 0" in judged(verdict, 0, PairedRatio((1.0, 1.02, 0.99)))
