"""``orchestrator.train`` for real: resume after the driver is killed, recovery from a killed
worker, and an elastic run that loses a node and gets it back (ray.cluster_utils.Cluster; slow,
about 150 s: ``pytest -m slow``). Kills land at the steps the tests name (``train_fns.hold``)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import _procs
import pytest
import yaml
from _search import Holds

SMOKE = ["--preset", "smoke", "--checkpoint-every", "10", "--set", "train.log_every=5"]
SIZE_ONE = (
    "sizes={1: {tuned: {accumulation_steps: 4, activation_checkpointing: true}, "
    "samples_per_s: 40.0}}"
)
"""An entry for one worker, as a search over 1:2 writes it; the top level is the entry for 2."""


def start(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``orchestrator.train`` as a user runs it; its processes carry ``out``'s owner mark."""
    return _procs.start(
        [sys.executable, "-m", "orchestrator.train", *SMOKE, "--out", str(out), *args],
        owner_of(out), env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


OWNERS: dict[Path, str] = {}


def owner_of(out: Path) -> str:
    """One owner mark per run folder: a run and its resumptions are one run's processes."""
    return OWNERS.setdefault(out, _procs.new_owner("train"))


def rows(out: Path) -> list[dict[str, str]]:
    path = out / "progress.csv"
    return list(csv.DictReader(path.open())) if path.exists() else []


def wait_for(out: Path, predicate, timeout_s: float = 240) -> list[dict[str, str]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = rows(out)
        if found and predicate(found):
            return found
        time.sleep(0.5)
    raise TimeoutError(f"progress in {out} never got there: {rows(out)[-3:]}")


def finish(process: subprocess.Popen, timeout_s: float = 400) -> str:
    output, _ = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, output[-4000:]
    return output


def events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_killed_worker_then_killed_driver_resume_on_the_same_trajectory(tmp_path: Path) -> None:
    """A Ray Train worker SIGKILLed at step 15 is recovered from the latest snapshot (within
    --max-failures); then the driver and all it started are SIGKILLed at step 27, and --resume
    finishes the run from the checkpoint at step 20 at exactly --steps, its steps 21-25 with the
    losses the killed attempt had logged for them: the same samples in the same order from the
    same state. Both kills land where they are said to (``train_fns.hold``). That a restart
    trains on exactly as an uninterrupted run would is proven in-process on gloo
    (``tests/dist/test_snapshots.py``), not again here."""
    out, holds = tmp_path / "run", Holds(tmp_path / "holds")
    holds.arm("step-15", "step-27")
    process = start(out, "--steps", "40", "--max-failures", "2", env=holds.env())
    holds.wait("step-15", process)  # 15 steps done: a checkpoint at 10, a snapshot at 15
    # only this run's own workers: never another job's on a shared machine
    pids = sorted(p for p, args in _procs.owned(owner_of(out)).items() if "RayTrainWorker" in args)
    assert len(pids) == 2, f"this run's two Ray Train workers: {_procs.owned(owner_of(out))}"
    os.kill(pids[-1], signal.SIGKILL)
    holds.release("step-15")
    holds.wait("step-27", process)  # the second attempt, 12 steps later
    wait_for(out, lambda rs: any(r["attempt"] == "2" and r["checkpoint_step"] == "20" for r in rs))
    wait_for(out, lambda rs: any(r["attempt"] == "2" and r["step"] == "25" for r in rs))
    failures = [e for e in events(out) if e["kind"] == "failure"]
    assert [f["reason"] for f in failures] == ["worker died"]
    restarted = [e for e in events(out) if e["kind"] == "start"][1]
    # the newest copy: the snapshot at 15, or (its transfer cut by the kill) the checkpoint at
    # 10, which saved a snapshot too
    source, step = restarted["resumed_from"], restarted["resumed_from_step"]
    assert (source, step) in {("snapshot", 15), ("snapshot", 10), ("checkpoint", 10)}, restarted
    _procs.end(owner_of(out))  # the driver, its Ray and the held workers: a machine lost
    process.wait()
    killed = rows(out)
    refused = _procs.python("orchestrator.train", [*SMOKE, "--steps", "40", "--out", str(out)])
    assert refused.returncode == 2 and "--resume" in refused.stderr
    output = finish(start(out, "--steps", "40", "--resume"))
    resumed = summary(out)
    assert resumed["steps"] == 40
    after_kill = {r["step"]: float(r["loss"]) for r in rows(out)[len(killed):]}
    before_kill = {r["step"]: float(r["loss"]) for r in killed if r["attempt"] == "2"}
    again = [str(n) for n in range(21, 26)]
    assert [after_kill[n] for n in again] == pytest.approx([before_kill[n] for n in again],
                                                          rel=1e-5)  # fmt: skip
    assert "resuming from step 20" in output, output[-3000:]
    assert [e for e in events(out) if e["kind"] == "start"][-1]["resumed_from_step"] == 20
    after = [int(r["step"]) for r in rows(out)][-20:]
    assert after == list(range(21, 41))  # nothing skipped, nothing repeated
    assert not _procs.wait_gone(owner_of(out)), "the resumed run left processes behind"


@pytest.fixture
def three_nodes() -> Iterator[object]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": True, "dashboard_host": "127.0.0.1"},
    )
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_elastic_run_loses_a_node_then_grows_back(three_nodes, tmp_path: Path) -> None:
    cluster = three_nodes
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    process = start(
        tmp_path, "--steps", "240", "--workers", "1:2", "--address", cluster.address,
        "--set", "train.resize_check_s=2", "--set", "train.start_timeout_s=10",
        "--set", "tuned={bucket_cap_mb: 1}", "--set", SIZE_ONE,
    )  # fmt: skip
    wait_for(tmp_path, lambda r: int(r[-1]["step"]) >= 15)
    removed_at = time.time()
    cluster.remove_node(nodes[1])
    shrunk = wait_for(tmp_path, lambda rs: any(r["world_size"] == "1" for r in rs))
    first_alone = next(r for r in shrunk if r["world_size"] == "1")
    cluster.add_node(num_cpus=1)
    wait_for(tmp_path, lambda rs: any(r["world_size"] == "2" and r["attempt"] == "3" for r in rs))
    output = finish(process)
    result = summary(tmp_path)
    assert result["steps"] == 240, output[-3000:]
    reasons = [r["reason"] for r in result["restarts"]]
    assert len(reasons) == 2 and reasons[1] == "node added: scaled up", reasons
    alone = [r for r in rows(tmp_path) if r["world_size"] == "1"]
    assert {
        (r["global_batch"], r["accumulation_steps"], r["micro_batch"], r["entry_size"])
        for r in alone
    } == {("16", "4", "4", "1")}  # one worker: its own entry's split
    pair = [r for r in rows(tmp_path) if r["world_size"] == "2"]
    assert {(r["accumulation_steps"], r["micro_batch"], r["entry_size"]) for r in pair} == {
        ("1", "8", "2")  # two: the top level's, before the loss and after the node came back
    }
    assert output.count("entry: 1 workers run its own entry, searched at 40.0") == 1, output
    assert output.count("entry: 2 workers run its own entry") == 2, output
    by_size = {s["world_size"]: s for s in result["by_size"]}
    assert by_size[1]["searched_samples_per_s"] == 40.0 and by_size[2]["steps"] > 0
    lost = result["restarts"][0]
    redone = lost["last_step"] - lost["resumed_from"]
    # a snapshot every 5 steps (half the checkpoint interval) on the driver's node survives it;
    # a loss within 5 steps of a checkpoint resumes from it (the snapshot there is no newer)
    assert redone <= 5, lost["line"]
    from_checkpoint = lost["resumed_from"] % 10 == 0 and redone < 5
    assert lost["source"] == "snapshot" or from_checkpoint, lost["line"]
    assert "recovered: " in output and result["snapshots"]["taken"] > 0, output[-3000:]
    print(
        f"node loss -> first step on 1 worker: {float(first_alone['wall_time']) - removed_at:.1f}s;"
        f" restarts: {[r['line'] for r in result['restarts']]}; snapshots: {result['snapshots']}"
    )


TUNE = ["--tune", "--set", "train.tune_window=1", "--set", "search.verdict_pairs=3",
        "--set", "train.tune_budget=0.5"]  # fmt: skip
"""Tuning while training in few steps: windows of one step, three pairs a candidate at most."""


@pytest.mark.slow
def test_a_size_an_elastic_run_shrinks_to_is_tuned_and_a_resume_starts_with_it(
    three_nodes, tmp_path: Path
) -> None:
    """``--workers 1:2 --tune`` loses a node: the 1-worker size, which has no entry, is tuned
    online and its entry written to tuned_sizes.yaml; a ``--resume`` at 1 worker starts with
    that split and does not tune again."""
    cluster = three_nodes
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    process = start(
        tmp_path, "--steps", "90", "--workers", "1:2", "--address", cluster.address,
        "--set", "train.resize_check_s=2", "--set", "train.start_timeout_s=10", *TUNE,
    )  # fmt: skip
    wait_for(tmp_path, lambda r: int(r[-1]["step"]) >= 8)
    cluster.remove_node(nodes[1])
    output = finish(process)
    assert ("tune: step 0, 2 worker(s): accumulation 1, buckets 25 MB runs; candidates: "
            "accumulation 2, 4, 8; buckets 50, 10, 100, 5, 200, 1 MB") in output  # fmt: skip
    assert ", 1 worker(s): accumulation 2 runs; candidates: accumulation 4, 8" in output, output
    decided = yaml.safe_load((tmp_path / "tuned_sizes.yaml").read_text())["sizes"]
    assert list(decided) == [1], decided  # the 2-worker size was cut short by the loss
    kept = decided[1]["tuned"]["accumulation_steps"]
    assert f"1 worker(s): decided: accumulation {kept}" in output
    tune = summary(tmp_path)["tune"]["sizes"]
    assert tune["1"]["running"] == {"accumulation_steps": kept}
    assert len(tune["1"]["decisions"]) == 2
    assert tune["2"]["outcome"] == "tuning"
    before = len(rows(tmp_path))
    cluster.add_node(num_cpus=1)  # room for Ray Train's controller beside the one worker
    resumed = finish(start(tmp_path, "--steps", "100", "--workers", "1", "--address",
                           cluster.address, "--resume", *TUNE))  # fmt: skip
    assert f"1 worker(s): accumulation {kept} decided by tuned_sizes.yaml's entry" in resumed
    after = rows(tmp_path)[before:]
    assert [r["step"] for r in after] == [str(s) for s in range(91, 101)]
    assert {(r["world_size"], r["accumulation_steps"]) for r in after} == {("1", str(kept))}
    kinds = [e["kind"] for e in events(tmp_path)]
    since = kinds[len(kinds) - 1 - kinds[::-1].index("start"):]  # the resumed run's events
    assert "tune_skip" in since and not {"tune_start", "tune_pair"} & set(since), since
