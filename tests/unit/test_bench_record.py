"""A benchmark run leaves one record that reads back whole: its name, UTC time, commit, machine,
command line, figures and printed lines; a quick run writes one only where it is told, so no
test adds a file to the repository's results folder."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
from pathlib import Path

import pytest

from benchmarks import _record

MODULE = "benchmarks.example"


def _run(results: Path | None, quick: bool, fail: bool = False) -> None:
    with _record.recording(MODULE, ["--quick", "--seeds", "2"], results, quick) as figures:
        print("ratio: 1.07x")
        figures["ratio"] = 1.07
        if fail:
            raise SystemExit("the benchmark failed")


def test_a_run_writes_one_record_that_reads_back(tmp_path: Path, capsys) -> None:
    _run(tmp_path / "records", quick=True)
    (path,) = (tmp_path / "records").iterdir()
    assert re.fullmatch(r"\d{8}-example-\d{6}\.json", path.name), path.name
    record = _record.read(path)
    when = dt.datetime.fromisoformat(record.utc)
    assert when.utcoffset() == dt.timedelta(0)
    assert path.name == f"{when:%Y%m%d}-example-{when:%H%M%S}.json"
    assert abs((dt.datetime.now(dt.timezone.utc) - when).total_seconds()) < 60
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_record.ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    assert (record.benchmark, record.commit) == ("example", head)
    assert isinstance(record.dirty, bool)
    assert record.machine["cpus"] == os.cpu_count() and record.machine["memory_bytes"] > 2**20
    assert record.machine["torch"] and isinstance(record.machine["gpus"], list)
    assert record.command == "python -m benchmarks.example --quick --seeds 2"
    assert record.figures == {"ratio": 1.07}
    assert record.printed == ["ratio: 1.07x"]
    assert capsys.readouterr().out == f"ratio: 1.07x\nrecord: {path}\n"


def test_the_variable_names_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_record.RESULTS_ENV, str(tmp_path))
    _run(None, quick=True)
    assert [p.suffix for p in tmp_path.iterdir()] == [".json"]


def test_a_quick_run_without_a_folder_and_a_failed_run_write_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(_record.RESULTS_ENV, raising=False)
    before = sorted(_record.RESULTS.glob("*")) if _record.RESULTS.exists() else []
    _run(None, quick=True)
    after = sorted(_record.RESULTS.glob("*")) if _record.RESULTS.exists() else []
    assert after == before
    with pytest.raises(SystemExit):
        _run(tmp_path, quick=False, fail=True)
    assert not list(tmp_path.iterdir())
    assert _record.destination(None, quick=False) == _record.RESULTS
