"""Peak memory against capacity, from the workers' reports to the doctor's memory rule: the
capacity reaches the doctor, so its memory rule can fire."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from orchestrator.findings import rules
from orchestrator.runfiles import collect, update_run_info
from orchestrator.search.outcome import summarize
from orchestrator.search.results import TrialRecord, memory_capacity_info, write_trials_csv
from train_fns import metrics as m
from train_fns.plan import TrialPlan
from train_fns.timing import memory_capacity_bytes

GiB = 2**30


def _window(rank: int, peak: int, capacity: int) -> dict:
    return {
        m.RANK: rank, m.STEP_TIME_S: 0.1, m.MEAN_STEP_TIME_S: 0.1, m.DATA_S: 0.001,
        m.FWD_BWD_S: 0.09, m.OPTIM_S: 0.009,
        m.SYNC_MICRO_S: 0.09, m.NOSYNC_MICRO_S: 0.08, m.LOSS: 7.0, m.PEAK_MEM_BYTES: peak,
        m.ALLOCATED_PEAK_BYTES: peak - GiB, m.DEVICE_USED_PEAK_BYTES: peak,
        m.MEMORY_CAPACITY_BYTES: capacity, m.ENV_SEEN: {}, m.SETUP_S: {}, m.NUM_PARAMS: 10,
    }  # fmt: skip


def _record(number: int, peak: int) -> TrialRecord:
    """A trial whose two ranks report 16 GiB GPUs (one 15.5 GiB in use after NCCL's buffers)."""
    plan = TrialPlan(model="bert-tiny", task="mlm", seq_len=16, global_batch=8, world_size=2,
                     accumulation_steps=1, micro_batch=4)  # fmt: skip
    windows = [[_window(0, peak, 16 * GiB), _window(1, peak - GiB, 16 * GiB)]]
    attrs = {m.STATE: m.COMPLETE, **summarize(windows, plan)}
    return TrialRecord(number, m.COMPLETE, "", {"strategy": "ddp"}, attrs)


def _run_folder(folder: Path, peak: int, run_info: bool) -> Path:
    folder.mkdir()
    recs = [_record(0, peak)]
    write_trials_csv(recs, folder / "trials.csv")
    (folder / "run_info.json").write_text(json.dumps({"backend": "nccl", "topology": {"x": 1}}))
    if run_info:
        update_run_info(folder, memory_capacity_info(recs))
    return folder


def test_the_memory_rule_fires_from_the_trials_capacity(tmp_path: Path) -> None:
    record = collect([_run_folder(tmp_path / "run", int(15.5 * GiB), run_info=False)])
    assert record.trials[0]["memory_capacity_bytes"] == str(16 * GiB)
    finding = rules.rule_memory(record)
    assert finding is not None and "of 16.00 GiB" in finding.evidence, finding


def test_run_info_carries_the_smallest_capacity_and_the_rule_reads_it(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path / "run", int(15.5 * GiB), run_info=True)
    assert json.loads((folder / "run_info.json").read_text())["memory_capacity_bytes"] == 16 * GiB
    record = collect([folder])
    record.trials[0]["memory_capacity_bytes"] = ""  # a trials.csv from before the column
    assert rules.rule_memory(record) is not None


def test_the_rule_stays_quiet_with_room_to_spare(tmp_path: Path) -> None:
    record = collect([_run_folder(tmp_path / "run", 4 * GiB, run_info=True)])
    assert rules.rule_memory(record) is None


def test_cpu_capacity_is_the_cgroup_limit_below_the_ram_else_the_ram(tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    ram = memory_capacity_bytes(cpu, cgroup=tmp_path / "none")
    assert ram > GiB
    (tmp_path / "memory.max").write_text(f"{GiB}\n")
    assert memory_capacity_bytes(cpu, cgroup=tmp_path) == GiB
    (tmp_path / "memory.max").write_text("max\n")  # no limit set
    assert memory_capacity_bytes(cpu, cgroup=tmp_path) == ram
