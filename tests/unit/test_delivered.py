"""benchmarks.delivered reads the search's verdict before spending any training run."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.delivered import read_verdict


def test_a_run_without_a_race_says_there_is_no_verdict_to_check(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as ended:
        read_verdict(tmp_path)
    message = str(ended.value)
    assert str(tmp_path / "remeasure.csv") in message and "re-measured no finalist" in message


def test_the_verdict_is_read_as_the_search_read_it(tmp_path: Path) -> None:
    head = "position,trial,role,state,samples_per_s,pairing,pair,against,delta"
    rows = [head]
    for k in range(4):  # paired windows: a finalist about 1.5x the baseline, in turns
        rows += [f"{2 * k},0,baseline,complete,100,window,{k},1,0.04",
                 f"{2 * k + 1},1,finalist,complete,{150 + k},window,{k},1,0.04"]  # fmt: skip
    (tmp_path / "remeasure.csv").write_text("\n".join(rows) + "\n")
    verdict = read_verdict(tmp_path)
    assert verdict.chosen is not None and verdict.chosen.ratio == pytest.approx(1.515, abs=0.01)
