"""A search over a range of world sizes through the CLI: an entry per size in best.yaml, each
with its verdict against its own baseline, the smaller size started from the larger's best."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_search_over_a_range_writes_an_entry_per_size_with_its_verdict(tmp_path: Path) -> None:
    out = tmp_path / "range"
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.search", "--preset", "smoke", "--workers", "1:2",
         "--out", str(out), "--set", "search.verdict_pairs=3", "--set", "search.prune=false",
         "--set", "search.scaling_baseline=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
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
