"""The study in a real PostgreSQL server: bad URLs stop before Ray, a killed search resumes from
another machine's folder with the same --storage, and the study is a plain Optuna study.

The server is started here (``_postgres``), so a fresh machine needs no manual step; one smoke
search (killed, then resumed, then resumed again with nothing owed) serves every Ray test of
this module.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from _postgres import PASSWORD, Server, binaries, free_port, server
from _search import FAST, cli, kill_during_second_trial

from orchestrator.search.cli import main

pytest.importorskip("psycopg", reason="the postgres extra: pip install -e .[postgres]")


@pytest.fixture(scope="module")
def pg() -> Iterator[Server]:
    bin_dir = binaries()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql/<version>/bin")
    with server(bin_dir) as running:
        yield running


@pytest.mark.parametrize("case", ["wrong password", "no such database", "no server", "dialect"])
def test_a_bad_storage_url_exits_2_before_ray(
    pg: Server, case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = {
        "wrong password": pg.url("postgres", password="not-the-Pw-x9"),
        "no such database": pg.url("no_such_db"),
        "no server": pg.url("postgres", port=free_port()),
        "dialect": pg.url("postgres").replace("postgresql+psycopg", "postgresql+nodriver"),
    }[case]
    code = main(["--preset", "smoke", "--out", str(tmp_path / "out"), "--storage", url])
    err = capsys.readouterr()
    assert code == 2, err
    lines = err.err.strip().splitlines()
    assert len(lines) == 1 and "search.storage: " in lines[0], err.err
    assert PASSWORD not in err.err + err.out and "not-the-Pw-x9" not in err.err + err.out
    assert "commtune:***@127.0.0.1" in lines[0], "the URL is named, its password is not"
    assert not (tmp_path / "out").exists(), "stopped before the search made its folder"
    import ray

    assert not ray.is_initialized()


@dataclass(frozen=True)
class Resumed:
    url: str
    first: float
    stdout: str
    a: Path
    b: Path
    again: str
    """What a second --resume said: nothing owed, the outputs rewritten."""


@pytest.fixture(scope="module")
def resumed(pg: Server, tmp_path_factory: pytest.TempPathFactory) -> Resumed:
    """A smoke search into PostgreSQL from folder A, SIGKILLed in trial 1, resumed from folder B
    (as from another machine) with the same --storage."""
    pg.create_database("studies")
    url = pg.url("studies")
    a, b = tmp_path_factory.mktemp("machine_a"), tmp_path_factory.mktemp("machine_b")
    # 2 trials (FAST: no 1-worker scaling baseline): the least search killed and resumed
    args = [*FAST, "--trials", "2", "--set", "search.prune=false", "--storage", url]
    args += ["--set", "search.measure_steps=30"]  # a trial takes seconds: the kill lands in one
    first = kill_during_second_trial([*args, "--out", str(a / "run")], url)
    proc = cli([*args, "--out", str(b / "run"), "--resume"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = cli([*args, "--out", str(b / "run"), "--resume"])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    return Resumed(url, first, proc.stdout + proc.stderr, a / "run", b / "run", again.stdout)


def test_a_killed_search_resumes_from_another_folder(resumed: Resumed) -> None:
    assert "was interrupted" in resumed.stdout
    b = resumed.b
    rows = list(csv.DictReader((b / "trials.csv").open()))
    assert [r["number"] for r in rows] == [str(n) for n in range(len(rows))], "whole, in order"
    assert len([r for r in rows if r["state"] != "interrupted"]) == 2, rows
    assert [r for r in rows if r["state"] == "interrupted"], "the killed trial is marked"
    assert float(rows[0]["samples_per_s"]) == pytest.approx(resumed.first, rel=1e-5)  # 6 digits
    for name in ("best.yaml", "best.env", "trials.csv", "run_info.json", "report.html"):
        assert (b / name).is_file(), name
    assert not (resumed.a / "trials.csv").exists(), "A was killed before writing outputs"
    assert not any((d / "study.db").exists() for d in (resumed.a, b)), "the study is in postgres"
    assert "postgresql+psycopg://commtune:***@" in (b / "best.yaml").read_text()
    leaked = [p.name for p in b.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
    assert not leaked and PASSWORD not in resumed.stdout, leaked
    assert "already has 2 of 2 trials" in resumed.again, "a finished study runs nothing again"
    assert len(list(csv.DictReader((b / "trials.csv").open()))) == len(rows)


def test_the_study_reads_back_through_optunas_public_api(resumed: Resumed) -> None:
    study = optuna.load_study(study_name="smoke", storage=resumed.url)
    finished = [t for t in study.trials if t.state.is_finished()]
    states = [t.user_attrs["state"] for t in finished]
    assert states.count("interrupted") >= 1 and states.count("complete") >= 1, states
    complete = next(t for t in finished if t.user_attrs["state"] == "complete")
    assert complete.state == optuna.trial.TrialState.COMPLETE
    assert complete.value == pytest.approx(complete.user_attrs["samples_per_s"])
    killed = next(t for t in finished if t.user_attrs["state"] == "interrupted")
    assert killed.state == optuna.trial.TrialState.FAIL and "driver died" in killed.user_attrs[
        "reason"
    ]
    assert study.best_trial.user_attrs["state"] == "complete"


def test_a_pickled_storage_holds_no_password(pg: Server) -> None:
    """Ray Tune pickles the searcher and its study into tune/tuner.pkl in --out."""
    import pickle

    from orchestrator.storage import choose

    opened = choose(pg.url("postgres"), Path("."))
    assert PASSWORD.encode() not in pickle.dumps(opened.open())
