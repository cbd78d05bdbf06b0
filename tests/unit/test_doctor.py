"""The doctor's rules on crafted records (each fires when its number is bad and stays quiet on a
healthy run), reading a crafted run folder, topology gathering and the exit codes."""

from __future__ import annotations

import copy
import json
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.doctor import cli as doctor_cli
from orchestrator.findings import RULES, Finding, diagnose, rules
from orchestrator.runfiles import RunInfo, RunRecord, Summary, collect
from orchestrator.runfiles import files as runfiles

GiB = 2**30


def trial_row(number: int, samples: float, **parts: float | str) -> dict[str, str]:
    """A trials.csv row as csv.DictReader gives it: every cell a string."""
    row = {
        "number": str(number),
        "state": "complete",
        "accumulation_steps": "1",
        "strategy": "ddp",
        "samples_per_s": str(samples),
        "throughput_cv": "0.02",
        "step_time_s": "0.16",
        "data_s": "0.002",
        "fwd_bwd_s": "0.13",
        "exposed_comm_s": "0.02",
        "compute_s": "0.11",
        "optim_s": "0.01",
        "peak_mem_mib": "20000",
        "reason": "",
    }
    row.update({k: str(v) for k, v in parts.items()})
    return row


def probe_rows(busbw_gbps: float, backend: str = "nccl") -> list[dict[str, str]]:
    return [
        {"op": "all_reduce", "size_bytes": str(2**k), "world_size": "2", "backend": backend,
         "busbw_gbps": str(busbw_gbps * (1 if k > 20 else 0.1))}
        for k in range(10, 28)
    ]  # fmt: skip


def healthy() -> RunRecord:
    """An 8-GPU-like run where every threshold is met."""
    return RunRecord(
        trials=[trial_row(0, 100.0), trial_row(1, 110.0, accumulation_steps="2")],
        param_names=["accumulation_steps", "strategy"],
        best_config={
            "name": "crafted",
            "strategy": "ddp",
            "workload": {"model": "bert-large"},
            "cluster": {"num_workers": 2},
            "env": {"NCCL_ALGO": "Ring"},
        },
        best_number=1,
        run_info=RunInfo(
            backend="nccl",
            world_size=2,
            gpu_util=0.93,
            memory_capacity_bytes=80 * GiB,
            single_worker_samples_per_s=60.0,
        ),
        probe=probe_rows(120.0),
        summary=Summary(steps=1000, nonfinite_steps=0, nonfinite_rate=0.0),
        topology={"source": "test", "nvidia_smi_topo": "GPU0\tX\tNV12"},
    )


def gloo_healthy() -> RunRecord:
    """A CPU run: no link bound, no NVML; the trial's sync keeps up with the probe."""
    rec = healthy()
    rec.run_info = RunInfo(backend="gloo", world_size=2, grad_bytes=16e6)
    rec.best_config["env"] = {}
    rec.probe = probe_rows(1.4, backend="gloo")
    rec.trials[1]["exposed_comm_s"] = "0.01"  # 16 MB at >= 1.6 GB/s busbw: above 0.7
    return rec


def mutate(rec: RunRecord, **changes: object) -> RunRecord:
    rec = copy.deepcopy(rec)
    for key, value in changes.items():
        setattr(rec, key, value)
    return rec


def best_row(rec: RunRecord, **parts: str) -> RunRecord:
    rec = copy.deepcopy(rec)
    rec.trials[1].update(parts)
    return rec


def issue_18_rows() -> list[dict[str, str]]:
    """A recorded remeasure.csv whose last baseline run was disturbed (cv 30.7%)."""
    seq = [(0, 22.14, 0.132), (5, 27.08, 0.034), (0, 23.01, 0.154), (1, 21.57, 0.072),
           (0, 19.93, 0.105), (2, 21.97, 0.042), (0, 12.88, 0.307)]  # fmt: skip
    return [
        {"position": str(i), "trial": str(n), "role": "baseline" if n == 0 else "finalist",
         "state": "complete", "samples_per_s": str(v), "throughput_cv": str(cv)}
        for i, (n, v, cv) in enumerate(seq)
    ]  # fmt: skip


CASES = {
    "rule_corrupt": mutate(
        healthy(),
        trials=[
            trial_row(0, 100.0),
            trial_row(1, 150.0, state="corrupt", reason="warm-up step 0 grad norm 2.1 vs 1.9"),
        ],
    ),  # fmt: skip
    "rule_measurement_noise": mutate(healthy(), remeasure=issue_18_rows()),
    "rule_data_wait": best_row(healthy(), data_s="0.04"),
    "rule_comm_fraction": best_row(healthy(), exposed_comm_s="0.1", compute_s="0.1"),
    "rule_bandwidth": mutate(healthy(), probe=probe_rows(10.0)),
    "rule_gpu_util": mutate(healthy(), run_info=replace(healthy().run_info, gpu_util=0.5)),
    "rule_memory": mutate(
        healthy(), run_info=replace(healthy().run_info, memory_capacity_bytes=GiB)
    ),
    "rule_nonfinite": mutate(healthy(), summary=Summary(steps=1000, nonfinite_steps=5)),
    "rule_nccl_on_gloo": mutate(gloo_healthy(), best_config={"env": {"NCCL_ALGO": "Tree"}}),
    "rule_scaling": mutate(
        healthy(), run_info=replace(healthy().run_info, single_worker_samples_per_s=100.0)
    ),
    "rule_size_below_searched": mutate(
        healthy(),
        summary=Summary(
            by_size=[
                {
                    "world_size": 2,
                    "steps": 40,
                    "samples_per_s": 90.0,
                    "entry_size": 2,
                    "searched_samples_per_s": 100.0,
                },
                {
                    "world_size": 1,
                    "steps": 40,
                    "samples_per_s": 30.0,
                    "entry_size": 1,
                    "searched_samples_per_s": 60.0,
                },
            ]
        ),
    ),  # fmt: skip
    "rule_mixed_placement": mutate(
        healthy(),
        trials=[
            trial_row(0, 100.0, placement="node0:8"),
            trial_row(1, 120.0, placement="node0:4,node1:4"),
        ],
    ),  # fmt: skip
}


def test_every_rule_has_a_case() -> None:
    assert sorted(CASES) == sorted(rule.__name__ for rule in RULES)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_rule_quiet_on_healthy_runs(rule) -> None:
    assert rule(healthy()) is None
    assert rule(gloo_healthy()) is None
    assert rule(RunRecord()) is None  # nothing read: nothing claimed


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_rule_fires_on_its_crafted_record(rule) -> None:
    finding = rule(CASES[rule.__name__])
    assert isinstance(finding, Finding)
    assert finding.evidence and finding.fix and finding.title
    # the run's own numbers (the inert-NCCL rule's evidence is the names and values it found)
    assert any(ch.isdigit() for ch in finding.evidence) or "NCCL_ALGO=Tree" in finding.evidence


def test_fixes_name_the_concrete_knobs() -> None:
    comm = rules.rule_comm_fraction(CASES["rule_comm_fraction"])
    for knob in ("bucket_cap_mb", "NCCL_MIN_NCHANNELS", "NCCL_ALGO", "reshard_after_forward"):
        assert knob in comm.fix
    bandwidth = rules.rule_bandwidth(CASES["rule_bandwidth"])
    assert "FI_EFA_USE_DEVICE_RDMA=1" in bandwidth.fix and "NCCL_SOCKET_IFNAME" in bandwidth.fix
    assert "nvlink_a100" in bandwidth.evidence  # the NV12 topology chose the link bound


def test_gloo_bandwidth_compares_the_trial_with_the_probe() -> None:
    slow = best_row(gloo_healthy(), exposed_comm_s="0.1")  # 0.16 GB/s against 1.4 probed
    finding = rules.rule_bandwidth(slow)
    assert finding is not None and "probe" in finding.evidence
    no_bytes = mutate(slow, run_info=RunInfo(backend="gloo", world_size=2))
    assert rules.rule_bandwidth(no_bytes) is None  # no gradient size: quiet, not a guess


def test_comm_fix_on_gloo_says_nccl_does_not_apply() -> None:
    rec = best_row(gloo_healthy(), exposed_comm_s="0.1", compute_s="0.1")
    finding = rules.rule_comm_fraction(rec)
    assert "GPUs only" in finding.fix and "NCCL_ALGO" not in finding.fix


def test_the_comm_figure_says_what_it_measures_under_fsdp_and_ddp() -> None:
    """Under FSDP the no-sync reference all-gathers too: the exposed figure is the
    reduce-scatter only, a lower bound, and the evidence says so."""
    ddp = rules.rule_comm_fraction(best_row(healthy(), exposed_comm_s="0.1", compute_s="0.1"))
    fsdp = rules.rule_comm_fraction(
        best_row(healthy(), exposed_comm_s="0.1", compute_s="0.1", strategy="fsdp")
    )
    assert "DDP: the gradient all-reduce" in ddp.evidence
    assert "reduce-scatter only" in fsdp.evidence and "lower bound" in fsdp.evidence


def test_nccl_params_in_trials_on_gloo_are_flagged() -> None:
    rec = gloo_healthy()
    rec.param_names.append("NCCL_MIN_NCHANNELS")
    rec.trials[1]["NCCL_MIN_NCHANNELS"] = "4"
    finding = rules.rule_nccl_on_gloo(rec)
    assert finding is not None and "NCCL_MIN_NCHANNELS" in finding.evidence


def test_training_summary_wins_over_the_search() -> None:
    rec = mutate(healthy(), summary=Summary(steps=100, comm_fraction=0.7))
    finding = rules.rule_comm_fraction(rec)
    assert finding is not None and finding.severity == "high"
    assert "training run" in finding.evidence


def test_diagnose_ranks_most_severe_first() -> None:
    rec = mutate(CASES["rule_nonfinite"], run_info=replace(healthy().run_info, gpu_util=0.7))
    found = diagnose(rec)
    assert [f.severity for f in found] == ["high", "medium"]
    assert diagnose(healthy()) == []


def write_run(folder: Path) -> Path:
    """A crafted search folder with a training run beside it in train/."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trials.csv").write_text(
        "number,state,accumulation_steps,strategy,samples_per_s,tokens_per_s,throughput_cv,"
        "step_time_s,data_s,fwd_bwd_s,optim_s,loss,peak_mem_mib,trial_wall_s,reason\n"
        "0,complete,1,ddp,100,6400,0.02,0.16,0.03,0.12,0.01,7.1,900,20,\n"
        "1,complete,2,ddp,120,7680,0.03,0.13,0.03,0.09,0.01,7.0,700,21,\n"
        '2,oom,1,fsdp,,,,,,,,,,5,"out of memory at micro_batch=8"\n'
    )
    (folder / "best.yaml").write_text(
        "# commtune best configuration: trial 1, 120.00 samples/s\nname: crafted\nstrategy: ddp\n"
        "workload: {model: bert-tiny, global_batch: 16, seq_len: 64}\ncluster: {num_workers: 2}\n"
        "env: {}\n"
    )
    (folder / "run_info.json").write_text(
        json.dumps({"backend": "gloo", "world_size": 2, "topology": {"cpus": 2}})
    )
    (folder / "train").mkdir(exist_ok=True)
    (folder / "train" / "summary.json").write_text(json.dumps({"steps": 50, "nonfinite_steps": 1}))
    return folder


def test_collect_reads_a_crafted_folder(tmp_path: Path) -> None:
    rec = collect([write_run(tmp_path / "run")])
    assert set(rec.files) == {"trials.csv", "best.yaml", "run_info.json", "summary.json"}
    assert rec.param_names == ["accumulation_steps", "strategy"]
    assert rec.best_number == 1 and rec.best()["number"] == "1"
    assert rec.baseline()["number"] == "0"
    assert rec.name == "crafted" and rec.model == "bert-tiny" and rec.world_size == 2
    assert rec.backend == "gloo" and rec.summary.steps == 50
    assert rec.topology == {"source": "run_info.json", "cpus": 2}
    found = diagnose(rec)
    titles = [f.title for f in found]
    assert any("waits for data" in t for t in titles)  # 0.03 of 0.13 s
    assert any("non-finite" in t for t in titles)  # 1 of 50 steps
    assert found[0].severity == "high"


def test_collect_tolerates_missing_and_broken_files(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run")
    (run / "run_info.json").write_text("{not json")
    (run / "trials.csv").unlink()
    rec = collect([run])
    assert "run_info.json" in rec.unreadable and rec.run_info == RunInfo()
    assert rec.trials == [] and rec.best() is None
    diagnose(rec)  # no rule trips over absent data
    assert rec.topology["source"].startswith("this machine")


def test_topology_gathers_numa_and_nvidia_smi(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "node0").mkdir()
    (tmp_path / "node0" / "cpulist").write_text("0-3\n")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU0 X NV12'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(runfiles.shutil, "which", lambda name: str(smi))
    topo = runfiles.topology(tmp_path)
    assert topo["numa_nodes"] == {"node0": "0-3"} and topo["cpu_count"]
    assert "NV12" in topo["nvidia_smi_topo"]
    monkeypatch.setattr(runfiles.shutil, "which", lambda name: None)
    assert "nvidia_smi_topo" not in runfiles.topology(tmp_path / "absent")


def test_main_exit_codes(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert doctor_cli.main([str(empty)]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "trials.csv" in err and len(err.strip().splitlines()) == 1
    assert doctor_cli.main([str(write_run(tmp_path / "run"))]) == 0
    out = capsys.readouterr().out
    assert "1. [high]" in out and "evidence:" in out and "fix:" in out


def test_main_says_no_problem_found(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.yaml").write_text("name: quiet\nenv: {}\n")
    assert doctor_cli.main([str(run)]) == 0
    assert "no problem found" in capsys.readouterr().out


def test_noise_names_the_disturbed_run_and_gains_inside_window_cv() -> None:
    finding = rules.rule_measurement_noise(CASES["rule_measurement_noise"])
    assert "baseline run-to-run spread" in finding.evidence
    assert "disturbed: baseline at position 6: window cv 30.7%" in finding.evidence
    assert finding.severity == "medium"  # one window: too noisy to decide
    claim = best_row(healthy(), throughput_cv="0.15")  # +10% claimed inside a 15% window cv
    finding = rules.rule_measurement_noise(claim)
    assert "trial 1 claims +10% with window cv 15%" in finding.evidence
    assert finding.severity == "medium" and "search.windows" in finding.fix
    assert "--resume" not in finding.fix  # paired runs are not measured on


@pytest.mark.parametrize(("race", "offered"), [("0", True), ("1", True), ("2", False)])
def test_the_noise_fix_offers_measuring_on_while_the_race_may_be(race: str, offered: bool) -> None:
    """An undecided window race: ``--resume`` is offered until it was measured on twice."""
    rows = [{"position": str(2 * k + j), "trial": str(n), "role": role, "state": "complete",
             "samples_per_s": str(100.0 * (1.03 + 0.09 * (-1) ** k) if j else 100.0),
             "pairing": "window", "pair": str(k), "against": "5", "delta": "0.02",
             "race": race} for k in range(4) for j, (n, role) in enumerate(
                 [(0, "baseline"), (5, "finalist")])]  # fmt: skip
    finding = rules.rule_measurement_noise(mutate(healthy(), remeasure=rows))
    assert "too noisy to decide" in finding.evidence
    assert ("--resume" in finding.fix) is offered


def test_corrupt_configurations_come_first() -> None:
    rec = mutate(CASES["rule_corrupt"], summary=Summary(steps=1000, nonfinite_steps=5))
    found = diagnose(rec)
    assert found[0].title.startswith("1 configuration(s) computed wrong results")
    assert "trial 1: warm-up step 0 grad norm" in found[0].evidence


HAND_EDITS = {
    "sections": ("best.yaml", "name: [1]\ncluster: 5\nworkload: bert\nenv: [1, 2]\n",
                 "name, cluster, workload, env: wrong kind"),
    "sizes": ("summary.json", '{"world_sizes": 5, "steps": 10}', "world_sizes: wrong kind"),
    "deep": ("run_info.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "huge": ("run_info.json", '{"world_size": ' + "9" * 400 + "}", "world_size: wrong kind"),
    "negative": ("run_info.json", '{"gpu_util": -0.5, "world_size": -2, "grad_bytes": NaN}',
                 "world_size, grad_bytes, gpu_util: wrong kind"),
}  # fmt: skip


@pytest.mark.parametrize("case", HAND_EDITS)
def test_a_hand_edited_folder_is_read_as_far_as_it_goes(tmp_path: Path, capsys, case) -> None:
    """A value of the wrong kind, a file nested past the parser or a number no count can be:
    one line says what was skipped, the rest is diagnosed, exit 0 (not a traceback)."""
    name, text, note = HAND_EDITS[case]
    (tmp_path / name).write_text(text)
    (tmp_path / "trials.csv").write_text("number,state,samples_per_s\n0,complete,10\n")
    assert doctor_cli.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (said,) = [line for line in out.splitlines() if line.startswith("unreadable:")]
    assert said.startswith(f"unreadable: {name} (") and note in said
    for nonsense in ("-50", "-2 workers", "nan", "inf "):
        assert nonsense not in out


def test_the_skip_line_names_no_command(tmp_path: Path, caplog) -> None:
    """The doctor and the report both read a folder through ``collect``: the warning says
    what was skipped, not which of them skipped it."""
    run = write_run(tmp_path / "run")
    (run / "run_info.json").write_text("{not json")
    with caplog.at_level("WARNING", logger="commtune"):
        collect([run])
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("skipping unreadable ") and "doctor" not in message
