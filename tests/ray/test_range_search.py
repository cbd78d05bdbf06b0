"""The smoke preset end to end through the CLI, as a user runs it, over a range of world sizes
(``--workers 1:2``): one search proves both. The primary size (2 workers, in the run folder
itself) is a whole smoke search, with the probe, the single-worker baseline, the race, the
report and the overhead accounting; then an entry per size in best.yaml, each with its verdict
against its own baseline, the smaller size started from the larger's best."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable
from pathlib import Path

import _procs
import pytest

from orchestrator.config.schema import load_config
from orchestrator.search.results import TIMING_PARTS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the search's own limit is 780 s


@pytest.fixture(scope="module")
def ranged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The search's run folder and its output."""
    out = tmp_path_factory.mktemp("range") / "smoke"
    # pruning off so that a finalist is always there to be re-measured
    proc = _procs.python(
        "orchestrator.search",
        ["--preset", "smoke", "--workers", "1:2", "--out", str(out),
         "--set", "search.verdict_pairs=3", "--set", "search.prune=false",
         "--set", "search.probe=true"],
        timeout=780,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not proc.left, f"the search left processes behind: {proc.left}"
    return out, proc.stdout


def test_the_primary_size_is_a_whole_smoke_search(ranged: tuple[Path, str]) -> None:
    out, text = ranged
    assert "trial   0" in text and "[2 workers] kept: " in text, text
    assert "nccl dropped" in text, "gloo runs must say NCCL knobs are inert"
    verdicts = ("keep trial", "too noisy to decide", "no gain worth having")
    assert any(f"\n[2 workers] verdict: {v}" in text for v in verdicts), text
    assert "x baseline (interval" in text and " window pair" in text
    assert "paired windows in the same processes" in text and "δ 2%" in text
    for name in ("best.yaml", "best.env", "trials.csv", "study.db", "remeasure.csv"):
        assert (out / name).is_file(), name
    assert "[2 workers] scaling: baseline" in text and "efficiency" in text, text
    assert "bound" in text and "exposed" in text  # the cost model vs measured
    info = json.loads((out / "run_info.json").read_text())
    assert info["backend"] == "gloo" and info["single_worker_samples_per_s"] > 0
    assert info["grad_bytes"] > 0
    # the doctor's memory rule has a capacity; the topology is a worker's, not the driver's
    assert info["memory_capacity_bytes"] > 0
    assert info["topology"]["source"].startswith("a worker on node"), info["topology"]
    assert {r["op"] for r in csv.DictReader((out / "probe.csv").open())} == {
        "all_reduce", "all_gather", "reduce_scatter",
    }  # fmt: skip
    report = (out / "report.html").read_text()
    assert report.count("data:image/png;base64,") >= 4 and "https://" not in report
    assert "measured share of search time:" in text and info["search_wall_s"] > 0
    # a finalist is always raced here (pruning off): the share counts the race's time too
    share = next(line for line in text.splitlines()
                 if line.startswith("[2 workers] measured share of search time:"))  # fmt: skip
    assert "race round 1:" in text and info["race_wall_s"] > 0, text[-3000:]
    assert 0 < info["race_measured_s"] < info["race_wall_s"] and ", race " in share, share
    best = load_config(str(out / "best.yaml"))
    assert best.strategy in ("ddp", "fsdp")
    assert best.workload.global_batch == 16
    assert (out / "best.env").read_text().startswith("#")


def test_each_trial_says_where_its_time_went(ranged: tuple[Path, str]) -> None:
    out, _ = ranged
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert [int(r["number"]) for r in rows] == [0, 1, 2]
    assert rows[0]["state"] == "complete" and float(rows[0]["samples_per_s"]) > 0
    assert 0 <= float(rows[0]["comm_fraction"]) < 1 and float(rows[0]["compute_s"]) > 0
    assert all(int(r["memory_capacity_bytes"]) > 0 for r in rows if r["state"] == "complete")
    # the named parts are measured apart, and none is counted twice: together they stay within
    # the trial's wall-clock and hold most of it (other_s, the remainder, is an unmeasured phase)
    for r in rows:
        named = sum(float(r[k]) for k in TIMING_PARTS if k != "other_s")
        assert named <= 1.02 * float(r["trial_wall_s"]), r
        assert float(r["other_s"]) <= 0.5 * float(r["trial_wall_s"]), r
        assert float(r["measured_s"]) > 0 and 0 < float(r["measured_share"]) <= 1
    for part in ("start_s", "imports_s", "build_s", "wrap_s", "warmup_s"):
        assert float(rows[0][part]) > 0, f"the group's first trial measured no {part}"


def test_the_race_pairs_windows_in_the_same_processes(ranged: tuple[Path, str]) -> None:
    out, _ = ranged
    remeasured = list(csv.DictReader((out / "remeasure.csv").open()))
    # the race: both built and warmed up, each a step again after the last build, then pairs
    # of windows (B c, then c B, ...)
    assert {r["pairing"] for r in remeasured} == {"window"}
    assert [r["role"] for r in remeasured if r["pair"] == ""] == ["baseline", "finalist"] * 2
    paired = [r for r in remeasured if r["pair"] != ""]
    assert len(paired) >= 6 and [r["role"] for r in paired[:4]] == [
        "baseline", "finalist", "finalist", "baseline",
    ]  # fmt: skip


def test_a_search_over_a_range_writes_an_entry_per_size_with_its_verdict(
    ranged: tuple[Path, str],
) -> None:
    out, text = ranged
    assert "world size 2 (1 of 2)" in text and "world size 1 (2 of 2)" in text, text
    assert "carried from 2 workers: 1 workers run the entry for 2 workers" in text, text
    cost = re.search(r"tuned 2 world sizes in (\d+)s: ([\d.]+)x the 2-worker search alone "
                     r"\((\d+)s\); in worker-seconds ([\d.]+)x", text)  # fmt: skip
    assert cost, text
    total, ratio, first, held = (float(g) for g in cost.groups())
    assert _within_rounding(ratio, lambda t, f: t / f, total, first)
    assert _within_rounding(held, lambda t, f: (f * 2 + (t - f)) / (f * 2), total, first)
    config = load_config(str(out / "best.yaml"))
    assert sorted(config.sizes) == [1, 2] and config.sizes[2]["tuned"] == config.tuned
    verdicts = ("keep trial", "too noisy to decide", "no gain worth having")
    for size, entry in config.sizes.items():
        assert entry["samples_per_s"] > 0 and entry["verdict"].startswith(verdicts), size
        assert f"size {size}: trial {entry['trial']}" in text
    one = load_config(str(out / "size-1" / "best.yaml"))
    assert one.cluster.num_workers == 1  # its search's choice, its strategy included
    assert config.sizes[1]["tuned"] == {**one.tuned, "strategy": one.strategy}
    rows = list(csv.DictReader((out / "size-1" / "trials.csv").open()))
    assert len(rows) == 3  # the smoke preset's 3 trials (half of them would be fewer than 3)


def _within_rounding(
    shown: float, ratio: Callable[[float, float], float], total: float, first: float
) -> bool:
    """Whether a ratio printed to 2 decimals can come from the seconds printed whole: a search
    of 55 s rounds to a figure up to 1% off, and the ratio is taken before that rounding."""
    corners = [ratio(t, f) for t in (total - 0.5, total + 0.5) for f in (first - 0.5, first + 0.5)]
    return min(corners) - 0.005 <= shown <= max(corners) + 0.005
