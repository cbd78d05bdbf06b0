"""A search killed in trial 1 (its driver and everything it started, as a node loss takes them)
resumes from another folder with the same ``--storage``, and a second ``--resume`` runs nothing
again: on SQLite (a file shared by both folders) and on a real PostgreSQL server. The kill lands
while trial 1 holds at its start (``train_fns.hold``), every time."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from _postgres import PASSWORD, binaries, server
from _search import FAST, Holds, cli, kill_in_second_trial

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # a killed search, 2 resumes


@dataclass(frozen=True)
class Resumed:
    url: str
    first: float
    stdout: str
    a: Path
    b: Path
    again: str
    """What a second --resume said: nothing owed, the outputs rewritten."""


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def storage(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('shared') / 'study.db'}"
        return
    pytest.importorskip("psycopg", reason="the postgres extra: pip install -e .[postgres]")
    bin_dir = binaries()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql/<version>/bin")
    with server(bin_dir) as pg:
        pg.create_database("studies")
        yield pg.url("studies")


@pytest.fixture(scope="module")
def resumed(storage: str, tmp_path_factory: pytest.TempPathFactory) -> Resumed:
    """A smoke search from folder A, killed in trial 1, resumed from folder B (as from another
    machine) with the same --storage, then resumed again."""
    a, b = tmp_path_factory.mktemp("machine_a"), tmp_path_factory.mktemp("machine_b")
    # 2 trials (FAST: no 1-worker scaling baseline): the least search killed and resumed
    args = [*FAST, "--trials", "2", "--set", "search.prune=false", "--storage", storage]
    holds = Holds(tmp_path_factory.mktemp("holds"))
    first = kill_in_second_trial([*args, "--out", str(a / "run")], storage, holds)
    proc = cli([*args, "--out", str(b / "run"), "--resume"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = cli([*args, "--out", str(b / "run"), "--resume"])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    return Resumed(storage, first, proc.stdout + proc.stderr, a / "run", b / "run", again.stdout)


def test_a_killed_search_resumes_from_another_folder(resumed: Resumed) -> None:
    assert "was interrupted" in resumed.stdout
    b = resumed.b
    rows = list(csv.DictReader((b / "trials.csv").open()))
    assert [r["number"] for r in rows] == [str(n) for n in range(len(rows))], "whole, in order"
    assert [r["state"] for r in rows] == ["complete", "interrupted", "complete"], rows
    assert float(rows[0]["samples_per_s"]) == pytest.approx(resumed.first, rel=1e-5)  # 6 digits
    for name in ("best.yaml", "best.env", "trials.csv", "run_info.json", "report.html"):
        assert (b / name).is_file(), name
    assert not (resumed.a / "trials.csv").exists(), "A was killed before writing outputs"
    assert "already has 2 of 2 trials" in resumed.again, "a finished study runs nothing again"
    assert len(list(csv.DictReader((b / "trials.csv").open()))) == len(rows)
    if resumed.url.startswith("postgresql"):
        assert not any((d / "study.db").exists() for d in (resumed.a, b)), "it is in postgres"
        assert "postgresql+psycopg://commtune:***@" in (b / "best.yaml").read_text()
        leaked = [
            p.name for p in b.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()
        ]
        assert not leaked and PASSWORD not in resumed.stdout, leaked


def test_the_study_reads_back_through_optunas_public_api(resumed: Resumed) -> None:
    study = optuna.load_study(study_name="smoke", storage=resumed.url)
    states = [t.user_attrs["state"] for t in study.trials]
    assert states == ["complete", "interrupted", "complete"], states
    complete = study.trials[0]
    assert complete.state == optuna.trial.TrialState.COMPLETE
    assert complete.value == pytest.approx(complete.user_attrs["samples_per_s"])
    killed = study.trials[1]
    assert killed.state == optuna.trial.TrialState.FAIL
    assert "driver died" in killed.user_attrs["reason"]
    assert study.best_trial.user_attrs["state"] == "complete"
