"""The smoke preset end to end through the CLI, as a user runs it (with the probe, the
single-worker baseline, the report and the overhead accounting)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.search.results import TIMING_PARTS

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_preset_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    proc = subprocess.run(
        # pruning off so that a finalist is always there to be re-measured
        [
            sys.executable,
            "-m",
            "orchestrator.search",
            "--preset",
            "smoke",
            "--out",
            str(out),
            "--set",
            "search.prune=false",
            "--set",
            "search.probe=true",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "trial   0" in proc.stdout and "best: trial" in proc.stdout, proc.stdout
    assert "nccl dropped" in proc.stdout, "gloo runs must say NCCL knobs are inert"
    verdicts = ("keep trial", "too noisy to decide", "no gain worth having")
    assert any(f"\nverdict: {v}" in proc.stdout for v in verdicts), proc.stdout
    assert "x baseline (interval" in proc.stdout and " window pair" in proc.stdout
    assert "paired windows in the same processes" in proc.stdout and "δ 2%" in proc.stdout
    for name in ("best.yaml", "best.env", "trials.csv", "study.db", "remeasure.csv"):
        assert (out / name).is_file(), name
    assert "scaling: baseline" in proc.stdout and "efficiency" in proc.stdout, proc.stdout
    assert "bound" in proc.stdout and "exposed" in proc.stdout  # the cost model vs measured
    info = json.loads((out / "run_info.json").read_text())
    assert info["backend"] == "gloo" and info["single_worker_samples_per_s"] > 0
    assert info["grad_bytes"] > 0
    # the doctor's memory rule has a capacity; the topology is a worker's, not the driver's
    assert info["memory_capacity_bytes"] > 0
    assert info["topology"]["source"].startswith("a worker on node"), info["topology"]
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert all(int(r["memory_capacity_bytes"]) > 0 for r in rows if r["state"] == "complete")
    assert {r["op"] for r in csv.DictReader((out / "probe.csv").open())} == {
        "all_reduce", "all_gather", "reduce_scatter",
    }  # fmt: skip
    report = (out / "report.html").read_text()
    assert report.count("data:image/png;base64,") >= 4 and "https://" not in report

    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert [int(r["number"]) for r in rows] == [0, 1, 2]
    assert rows[0]["state"] == "complete" and float(rows[0]["samples_per_s"]) > 0
    assert 0 <= float(rows[0]["comm_fraction"]) < 1 and float(rows[0]["compute_s"]) > 0
    assert all(r["state"] for r in rows)
    # where each trial's wall-clock went: the parts add up to it, measured steps included, and
    # the named parts hold most of it (other_s is the remainder: an unmeasured phase lands there)
    for r in rows:
        parts = sum(float(r[k]) for k in TIMING_PARTS)
        assert parts == pytest.approx(float(r["trial_wall_s"]), rel=0.02), r
        assert float(r["measured_s"]) > 0 and 0 < float(r["measured_share"]) <= 1
        assert float(r["other_s"]) <= 0.5 * float(r["trial_wall_s"]), r
    for part in ("start_s", "imports_s", "build_s", "wrap_s", "warmup_s"):
        assert float(rows[0][part]) > 0, f"the group's first trial measured no {part}"
    assert "measured share of search time:" in proc.stdout and info["search_wall_s"] > 0

    best = load_config(str(out / "best.yaml"))
    assert best.strategy in ("ddp", "fsdp")
    assert best.workload.global_batch == 16
    assert (out / "best.env").read_text().startswith("#")
    remeasured = list(csv.DictReader((out / "remeasure.csv").open()))
    # the race: both built and warmed up, then pairs of windows (B c, then c B, ...)
    assert {r["pairing"] for r in remeasured} == {"window"}
    assert [r["role"] for r in remeasured if r["pair"] == ""] == ["baseline", "finalist"]
    paired = [r for r in remeasured if r["pair"] != ""]
    assert len(paired) >= 6 and [r["role"] for r in paired[:4]] == [
        "baseline", "finalist", "finalist", "baseline",
    ]  # fmt: skip
