"""``benchmarks.overhead``'s arguments: every mistake refused by name before a search runs (a
search is a minute or more), and a run read as the warm search only when its cold twin would
run alike (made as ``benchmarks._commands.QUICK_SEARCH``)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from benchmarks import overhead
from orchestrator.runfiles import BEST_YAML, RUN_INFO, TRIALS_CSV
from orchestrator.search.results import TIMING_PARTS


def _no_search(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"a search ran: {args}")


@pytest.fixture(autouse=True)
def _searches_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(overhead, "run_module", _no_search)


def _run(folder: Path, **changed: object) -> Path:
    """A finished quick search's folder as ``calibration.verdicts --quick`` keeps it, with
    ``changed`` dotted keys of its best.yaml set otherwise."""
    config: dict = {"search": {}}
    for key, value in {**overhead.quick_settings(), **changed}.items():
        *parents, last = key.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    folder.mkdir(parents=True)
    (folder / BEST_YAML).write_text("# commtune best configuration\n" + yaml.safe_dump(config))
    with (folder / TRIALS_CSV).open("w", newline="") as f:
        csv.writer(f).writerows([["number", "state", *TIMING_PARTS],
                                 [0, "complete", *[1.0] * len(TIMING_PARTS)]])  # fmt: skip
    (folder / RUN_INFO).write_text('{"search_wall_s": 20.0}')
    return folder


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as raised:
        overhead.main(argv)
    assert raised.value.code == 2
    return capsys.readouterr().err


def test_a_quick_run_is_accepted_as_the_warm_search_and_read_once(tmp_path: Path) -> None:
    read = overhead.check_quick_run(_run(tmp_path / "run0"))
    assert read["trials"] == 1 and read["search_wall_s"] == 20.0
    assert all(read[part] == 1.0 for part in TIMING_PARTS)


@pytest.mark.parametrize(("changed", "named"), [
    ({"name": "cpu-demo"}, "name is 'cpu-demo'"),
    ({"search.warm": False}, "search.warm is False"),
    ({"search.trials": 6}, "search.trials is 6"),
    ({"search.prune": True}, "search.prune is True"),
])  # fmt: skip
def test_a_run_made_otherwise_is_refused_naming_the_setting(
    changed: dict, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path / "run0", **changed)
    err = _refused([str(run), "--quick"], capsys)
    assert named in err and "would not run alike" in err, err


def test_a_folder_that_is_no_search_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "no best.yaml" in _refused([str(tmp_path), "--quick"], capsys)
    run = _run(tmp_path / "run0")
    (run / RUN_INFO).unlink()
    assert "holds no finished search" in _refused([str(run), "--quick"], capsys)


@pytest.mark.parametrize(("argv", "named"), [
    (["RUN"], "is read with --quick only"),
    (["--presets", "smoke", "RUN", "--quick"], "--presets smoke RUN: --quick runs"),
    (["RUN", "--quick", "--set", "search.seed=3"], "--set search.seed=3: "),
])  # fmt: skip
def test_arguments_that_cannot_go_together_are_refused(
    argv: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(_run(tmp_path / "run0"))
    err = _refused([run if a == "RUN" else a for a in argv], capsys)
    assert named.replace("RUN", run) in err, err


def test_quick_beside_a_run_searches_cold_only_and_reads_the_run_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, searched, reads = _run(tmp_path / "run0"), [], []
    read = overhead.totals
    monkeypatch.setattr(overhead, "totals", lambda out: reads.append(out) or read(out))
    monkeypatch.setattr(overhead, "run_search", lambda preset, warm, out, extra: searched.append(
        (preset, warm, extra)) or {**read(run), "command_s": 30.0})  # fmt: skip
    monkeypatch.setattr(overhead, "samples_per_s_by_config", lambda out: {})
    assert overhead.main([str(run), "--quick", "--results", str(tmp_path / "records")]) == 0
    assert searched == [("smoke", False, overhead.QUICK_ARGS)] and reads == [run]
