"""The study in a real PostgreSQL server: bad URLs stop before Ray, and the pickled storage holds
no password (the kill-and-resume on PostgreSQL is test_resume.py's).

The server is started here (``_postgres``), so a fresh machine needs no manual step.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _postgres import PASSWORD, Server, binaries, free_port, server

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


def test_a_pickled_storage_holds_no_password(pg: Server) -> None:
    """Ray Tune pickles the searcher and its study into tune/tuner.pkl in --out."""
    import pickle

    from orchestrator.config.study_storage import choose

    opened = choose(pg.url("postgres"), Path("."))
    assert PASSWORD.encode() not in pickle.dumps(opened.open())
