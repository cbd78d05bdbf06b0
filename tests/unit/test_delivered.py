"""benchmarks.delivered reads the search's verdict before spending any training run, and builds
the configs it trains: the verdict's leader, kept or not, and the baseline, each as the search
ran it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
import yaml

from benchmarks import delivered
from benchmarks.delivered import (
    configs,
    described,
    judged,
    main,
    read_verdict,
    started_from,
    trial_config,
)
from orchestrator.verdict.paired import PairedRatio


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
        "env": {"NCCL_DEBUG": "WARN", "NCCL_BUFFSIZE": "4194304"}, "sizes": {2: {"tuned": {}}}}
"""best.yaml of a run that kept its baseline: a fixed knob and the user's own variables, one of
them searched (the baseline left it at the user's value), and a world-sizes entry."""
HEAD = ("number,state,accumulation_steps,bucket_cap_mb,static_graph,NCCL_BUFFSIZE,strategy,"
        "samples_per_s,reason")  # fmt: skip
BASE = "0,complete,1,25,False,4194304,ddp,15.2,"
"""The baseline: every searched variable at its default (here the user's value, unexported by
the search)."""


def _row(line: str) -> dict[str, str]:
    return dict(zip(HEAD.split(","), line.split(","), strict=True))


def test_a_trial_runs_as_the_search_ran_it() -> None:
    base = _row(BASE)
    config = trial_config(started_from(BEST, base, base), _row("3,complete,4,,,8388608,ddp,19.6,"),
                          base)  # fmt: skip
    # its knobs; a knob it did not set is the user's (reshard) or the default, not best.yaml's
    # value from the kept trial's search (bucket_cap_mb: the baseline's column)
    assert config["tuned"] == {"accumulation_steps": 4, "reshard_after_forward": True}
    # the variable it set away from the baseline's replaces the user's; the others stay
    assert config["env"] == {"NCCL_DEBUG": "WARN", "NCCL_BUFFSIZE": "8388608"}
    assert config["workload"] == BEST["workload"] and config["strategy"] == "ddp"
    assert config["sizes"] == {}  # best.yaml's entries are not this trial's: train refuses them


def test_the_baseline_exports_no_searched_variable_the_user_did_not_set() -> None:
    best = {**BEST, "env": {"NCCL_DEBUG": "WARN"}}
    base = _row(BASE.replace("4194304", "2097152"))  # a default the search left unset
    config = trial_config(started_from(best, base, base), base, base)
    assert config["env"] == {"NCCL_DEBUG": "WARN"}


def test_best_yaml_less_its_kept_trial_is_the_config_the_search_started_from() -> None:
    base, kept = _row(BASE), _row("3,complete,4,,,8388608,fsdp,19.6,")
    best = {**BEST, "strategy": "fsdp", "tuned": {**BEST["tuned"], "accumulation_steps": 4},
            "env": {**BEST["env"], "NCCL_BUFFSIZE": "8388608"}}  # fmt: skip
    start = started_from(best, kept, base)
    baseline = trial_config(start, base, base)
    assert baseline["tuned"]["accumulation_steps"] == 1 and baseline["strategy"] == "ddp"
    assert "NCCL_BUFFSIZE" not in baseline["env"]  # the kept trial's, not the user's


def test_a_reason_with_colons_is_not_parsed() -> None:
    base = _row(BASE)
    row = _row("3,complete,4,,,,ddp,19.6,out of memory (2 ranks): a: b: c")
    config = trial_config(started_from(BEST, base, base), row, base)
    assert config["tuned"]["accumulation_steps"] == 4


def _run(tmp_path: Path, finalist: float) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    best = {**BEST, "tuned": {"accumulation_steps": 9}, "sizes": {}}
    (run / "best.yaml").write_text("# commtune best configuration: trial 1, 22.00 samples/s\n"
                                   + yaml.safe_dump(best))  # fmt: skip
    (run / "trials.csv").write_text("\n".join([HEAD, BASE, "1,complete,4,,,,ddp,19.6,",
                                               "2,pruned,8,,,,ddp,,below the floor: 1: 2"]))
    _race(run, finalist)
    return run


def test_a_finalist_the_verdict_did_not_keep_is_trained_from_its_trial(tmp_path: Path) -> None:
    run = _run(tmp_path, 98)  # about 1.0x: no finalist kept
    verdict = read_verdict(run)
    assert verdict.chosen is None
    finalist, baseline, number = configs(run, verdict, None, tmp_path)
    assert number == 1
    assert yaml.safe_load(finalist.read_text())["tuned"]["accumulation_steps"] == 4
    assert yaml.safe_load(baseline.read_text())["tuned"]["accumulation_steps"] == 1


def test_a_kept_finalist_is_trained_from_best_yaml_as_written(tmp_path: Path) -> None:
    run = _run(tmp_path, 150)
    finalist, baseline, number = configs(run, read_verdict(run), None, tmp_path)
    assert number == 1 and yaml.safe_load(finalist.read_text())["tuned"] == {
        "accumulation_steps": 9}
    assert yaml.safe_load(baseline.read_text())["tuned"]["accumulation_steps"] == 1


@pytest.mark.parametrize(("trial", "said"), [(7, "no row for trial 7"),
                                             (2, "trial 2 .* is pruned \\(below the floor")])
def test_a_trial_that_cannot_be_trained_is_refused_by_name(
    tmp_path: Path, trial: int, said: str
) -> None:
    run = _run(tmp_path, 150)
    with pytest.raises(SystemExit, match=f"{said}.*--trial"):
        configs(run, read_verdict(run), trial, tmp_path)


def test_the_verdicts_ratio_is_judged_against_the_delivered_interval(tmp_path: Path) -> None:
    _race(tmp_path, 150)
    verdict = read_verdict(tmp_path)
    assert "1.515 for trial 1 is inside" in judged(verdict, 1, PairedRatio((1.4, 1.6, 1.5)))
    assert "OUTSIDE the delivered interval: a defect" in judged(
        verdict, 1, PairedRatio((1.0, 1.02, 0.99)))
    assert "compared no trial 0" in judged(verdict, 0, PairedRatio((1.0, 1.02, 0.99)))


def test_one_pair_gives_a_ratio_and_no_interval(tmp_path: Path) -> None:
    """A t-interval from one pair runs from 0 to infinity: said as none, never as "inside"."""
    _race(tmp_path, 150)
    verdict = read_verdict(tmp_path)
    one = PairedRatio((1.4,))
    assert "is not checked: one pair gives no interval" in judged(verdict, 1, one)
    assert described(one) == "1.400x from 1 pair (an interval needs two: --rounds 2 or more)"
    assert described(PairedRatio((1.4, 1.6))).startswith("1.497x (interval ")


def test_no_pair_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["some-run", "--rounds", "0"])
    assert "--rounds 0: at least 1 pair" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "said"), [
    (["--steps", "5"], "--steps 5 --skip 5: a run measures the steps after the skipped ones"),
    (["--skip", "-1"], "--steps 30 --skip -1: a run measures"),
])  # fmt: skip
def test_a_run_with_no_step_to_measure_is_refused_before_training(
    tmp_path: Path, args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path), *args])
    assert said in capsys.readouterr().err


def test_a_mistyped_run_folder_is_named_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path / "runs" / "smok")])
    said = capsys.readouterr().err
    assert f"{tmp_path / 'runs' / 'smok'} is not a folder: name a search's run folder" in said
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert f"{tmp_path} holds no best.yaml" in capsys.readouterr().err


def _trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: dict) -> list:
    """One pair trained as ``trained_pairs`` trains it, with the Ray start and each training
    run stubbed: what happened, in order (Ray starts and stops, each run's arguments)."""
    happened: list = []
    monkeypatch.setattr(delivered, "start_ray_for", lambda config, verbose: happened.append(
        "start"))  # fmt: skip
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(
        gcs_address="127.0.0.1:6390"))  # fmt: skip
    monkeypatch.setattr(ray, "shutdown", lambda: happened.append("stop"))

    def run_module(module: str, args: list[str]) -> None:
        happened.append(args[args.index("--steps") + 2 :])
        out = Path(args[args.index("--out") + 1])
        out.mkdir()
        rows = [f"{s},{s},0.1,{100 + s}" for s in range(1, 6)]
        (out / "progress.csv").write_text("step,wall_time,step_time_s,samples_per_s\n"
                                          + "\n".join(rows) + "\n")  # fmt: skip

    monkeypatch.setattr(delivered, "run_module", run_module)
    tmp_path.mkdir(exist_ok=True)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**BEST, "sizes": {}, "cluster": cluster}))
    args = SimpleNamespace(rounds=1, steps=5, skip=1)
    delivered.trained_pairs({"finalist": config, "baseline": config}, 1, args, tmp_path)
    return happened


def test_the_runs_join_one_local_ray_started_once_and_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    joined = ["--checkpoint-every", "5", "--address", "127.0.0.1:6390", "--out"]
    for cluster in ({}, {"address": "local"}):
        happened = _trained(tmp_path / str(len(cluster)), monkeypatch, cluster)
        assert happened[0] == "start" and happened[-1] == "stop", happened
        assert [h[:5] for h in happened[1:-1]] == [joined, joined], happened


def test_the_runs_join_the_configs_cluster_as_they_would_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    happened = _trained(tmp_path, monkeypatch, {"address": "10.0.0.7:6379"})
    assert [h[:3] for h in happened] == [["--checkpoint-every", "5", "--out"]] * 2, happened
