"""A search killed in trial 1 (its driver and everything it started, as a node loss takes them)
resumes from another folder with the same ``--storage``: on SQLite (a file shared by both
folders) and on a real PostgreSQL server. The kill lands while trial 1 holds at its start
(``train_fns.hold``), every time.

The searches run without their verdict's race, so the finished study is one whose driver died
between its last trial and the end of its race (no ``remeasure.csv``): on SQLite a second
``--resume`` runs no trial again and runs that race (proven once, on the file: what it reads
from the study is what the first resume proved on both). A third
``--resume``, after the race's record is cut to its first two pairs (a verdict left undecided),
measures on from those pairs: one killed study proves all three, where each used to start
searches of its own."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from _postgres import PASSWORD, binaries, server
from _search import FAST, Holds, cli, kill_in_second_trial

from orchestrator.runfiles.remeasure import write_remeasure
from orchestrator.verdict.decide import verdict_from_rows

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # a killed search, 2-3 resumes
RACE = ["--set", "search.remeasure_top=1", "--set", "search.verdict_pairs=3"]
"""The second ``--resume``'s race: one finalist, at most 3 pairs."""


@dataclass(frozen=True)
class Resumed:
    url: str
    first: float
    stdout: str
    a: Path
    b: Path
    again: str
    """What a second --resume said on SQLite: no trial owed, and the race its driver never
    ran (empty on PostgreSQL: not run there)."""


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
    said = ""
    if storage.startswith("sqlite"):  # proven once: a third search would prove it again
        again = cli([*args, *RACE, "--out", str(b / "run"), "--resume"])
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        said = again.stdout
    return Resumed(storage, first, proc.stdout + proc.stderr, a / "run", b / "run", said)


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
    if resumed.url.startswith("sqlite"):
        assert "already has 2 of 2 trials" in resumed.again, "a finished study runs no trial"
        assert len(list(csv.DictReader((b / "trials.csv").open()))) == len(rows)
    else:
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


def test_a_finished_study_whose_race_never_ended_races_on_resume(resumed: Resumed) -> None:
    """The race the killed driver never ran (no remeasure.csv) is run by ``--resume``, and
    best.yaml says the verdict it reached."""
    if not resumed.url.startswith("sqlite"):
        pytest.skip("proven once, on SQLite: a race costs a worker group")
    assert "\nrace: trial 2" in resumed.again, resumed.again[-3000:]
    record = list(csv.DictReader((resumed.b / "remeasure.csv").open()))
    assert {r["pairing"] for r in record} == {"window"} and len(record) >= 2 + 2 * 3
    line = verdict_from_rows(record).line()
    assert f"\nverdict: {line}" in resumed.again
    assert f"# verdict, measured beside the baseline: {line}" in best_yaml(resumed)


def test_an_undecided_race_on_record_is_measured_on_by_the_next_resume(resumed: Resumed) -> None:
    """A verdict left undecided (here: the record cut to its first two pairs) is measured on
    from its pairs by the next ``--resume``, in a fresh worker group, its rows appended."""
    if not resumed.url.startswith("sqlite"):
        pytest.skip("proven once, on SQLite: a race costs a worker group")
    path = resumed.b / "remeasure.csv"
    cut = [r for r in csv.DictReader(path.open()) if r["pair"] == "" or int(r["pair"]) < 2]
    write_remeasure(path, cut)
    args = [*FAST, "--trials", "2", "--set", "search.prune=false", "--storage", resumed.url]
    on = cli([*args, *RACE, "--out", str(resumed.b), "--resume"])
    assert on.returncode == 0, on.stdout[-3000:] + on.stderr[-3000:]
    assert "measuring trial(s) 2 on from their pairs" in on.stdout, on.stdout[-3000:]
    assert "2 pairs on record, at most 3 more" in on.stdout
    record = list(csv.DictReader(path.open()))
    assert record[: len(cut)] == cut and len(record) > len(cut) + 1
    assert {r["attempt"] for r in record[len(cut) :]} == {"1"}
    line = verdict_from_rows(record).line()
    assert f"\nverdict: {line}" in on.stdout
    assert f"# verdict, measured beside the baseline: {line}" in best_yaml(resumed)


def best_yaml(resumed: Resumed) -> str:
    return (resumed.b / "best.yaml").read_text()
