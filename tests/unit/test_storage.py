"""Choosing and checking the study's storage, without Ray or a database server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from orchestrator.config.schema import ConfigError, load_config
from orchestrator.config.study_storage import (
    STUDY_DB,
    STUDY_JOURNAL,
    check,
    choose,
    network_fs,
    redact,
    without_password,
)

MOUNTS = """\
overlay / overlay rw,relatime,lowerdir=/a 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
/dev/nvme0n1p1 /mnt ext4 rw,relatime 0 0
fs-0123.efs.us-west-2.amazonaws.com:/ /mnt/shared nfs4 rw,vers=4.1,hard 0 0
/dev/nvme1n1 /mnt/shared/local\\040disk xfs rw 0 0
s3fs /mnt/bucket fuse.s3fs rw 0 0
192.168.1.5@tcp:/fsx /lustre lustre rw,flock 0 0
/dev/sdb1 /mnt/sharedother ext4 rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/mnt/shared/runs/smoke", "nfs4"),
        ("/mnt/shared", "nfs4"),
        ("/mnt/shared/local disk/runs", None),  # a local disk mounted inside the share
        ("/mnt/sharedother/runs", None),  # a prefix of the name is not a parent folder
        ("/mnt/bucket/x", "fuse.s3fs"),
        ("/lustre/project/runs", "lustre"),
        ("/mnt/runs", None),
        ("/home/me/runs", None),
    ],
)
def test_network_file_systems_are_told_from_proc_mounts(path: str, expected: str | None) -> None:
    assert network_fs(Path(path), MOUNTS) == expected


def test_the_last_mount_on_a_point_wins() -> None:
    mounts = MOUNTS + "server:/export /home/me nfs rw 0 0\n/dev/sdc /home/me ext4 rw 0 0\n"
    assert network_fs(Path("/home/me/runs"), mounts) is None


def test_default_is_sqlite_in_out_on_a_local_disk(tmp_path: Path) -> None:
    choice = choose(None, tmp_path / "run", MOUNTS)
    assert choice.target == f"sqlite:///{(tmp_path / 'run' / STUDY_DB).resolve()}"
    assert not choice.journal and choice.default and choice.note is None
    check(choice)  # nothing to connect to before --out exists


def test_default_on_a_network_disk_is_the_journal_with_the_open_lock(tmp_path: Path) -> None:
    mounts = f"server:/export {tmp_path} nfs rw 0 0\n"
    choice = choose(None, tmp_path / "run", mounts)
    assert choice.journal and choice.target == str((tmp_path / "run" / STUDY_JOURNAL).resolve())
    assert "network file system (nfs)" in choice.note and STUDY_JOURNAL in choice.note
    (tmp_path / "run").mkdir()
    storage = choice.open()
    backend = storage._backend
    assert type(backend._lock).__name__ == "JournalFileOpenLock"
    study = optuna.create_study(study_name="s", storage=storage)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    again = choose(None, tmp_path / "run", mounts).open()
    assert len(optuna.load_study(study_name="s", storage=again).trials) == 2


def test_an_existing_sqlite_study_on_a_network_disk_is_kept(tmp_path: Path) -> None:
    """A study begun before the journal rule resumes where it is."""
    (tmp_path / STUDY_DB).write_bytes(b"")
    choice = choose(None, tmp_path, f"server:/export {tmp_path} nfs rw 0 0\n")
    assert not choice.journal and choice.target.endswith(STUDY_DB)


def test_a_journal_path_and_a_url_are_taken_as_given(tmp_path: Path) -> None:
    journal = choose(str(tmp_path / "x.log"), tmp_path / "run", MOUNTS)
    assert journal.journal and journal.target == str(tmp_path / "x.log") and not journal.default
    url = choose("sqlite:////tmp/s.db", tmp_path, MOUNTS)
    assert url.target == "sqlite:////tmp/s.db" and not url.journal


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://bob:s3cr3t-pw@db.example:5432/studies",
        "postgresql+psycopg://bob:s3cr3t-pw@db.example/studies?sslmode=require",
        "mysql://bob:s3cr3t-pw@[::1",  # does not parse: redacted by hand
    ],
)
def test_redact_never_shows_the_password(url: str) -> None:
    shown = redact(url)
    assert "s3cr3t-pw" not in shown and "bob" in shown and "***" in shown


def test_plain_postgresql_means_the_installed_psycopg() -> None:
    pytest.importorskip("psycopg")
    url = choose("postgresql://bob:pw@host/db", Path("."), MOUNTS).target
    try:
        import psycopg2  # noqa: F401

        assert url.startswith("postgresql://")
    except ImportError:
        assert url.startswith("postgresql+psycopg://")
    assert url.endswith("bob:pw@host/db"), "the password is kept for connecting"


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("mongodb://bob:s3cr3t-pw@host/db", "unknown database dialect"),
        ("postgresql+nosuchdriver://bob:s3cr3t-pw@host/db", "unknown database dialect"),
        ("not a url://x", "not a storage URL"),
    ],
)
def test_unknown_dialects_are_config_errors(url: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        check(choose(url, Path("."), MOUNTS))
    text = str(e.value)
    assert text.startswith("search.storage: ") and needle in text, text
    assert "s3cr3t-pw" not in text and "\n" not in text


def refusal(call: Callable[[], object]) -> str:
    with pytest.raises(ConfigError) as e:
        call()
    return str(e.value)


@pytest.mark.parametrize("name", ["s.journal", "s.log", "sqlite:///{d}/s.db"])
def test_a_file_in_a_missing_folder_is_refused_in_the_same_words(tmp_path: Path, name: str) -> None:
    """The config when it loads and the storage before it connects: one rule, one message."""
    missing = tmp_path / "nope"
    target = name.format(d=missing) if "{d}" in name else str(missing / name)
    at_start = refusal(lambda: check(choose(target, tmp_path, MOUNTS)))
    at_load = refusal(lambda: load_config(None, "smoke", [f'search.storage="{target}"']))
    assert at_start == at_load == f"search.storage: {missing} is not a folder; create it or " \
        "use another path"  # fmt: skip


@pytest.mark.parametrize("url", ["not a url://bob:s3cr3t-pw@h", "mysql://bob:s3cr3t-pw@[::1"])
def test_a_url_that_does_not_parse_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(ConfigError, match="is not a storage URL") as e:
        load_config(None, "smoke", [f'search.storage="{url}"'])
    assert "s3cr3t-pw" not in str(e.value) and "bob" in str(e.value)


def test_best_yaml_never_holds_the_password() -> None:
    config = load_config(None, "smoke", ["search.storage=postgresql://bob:s3cr3t-pw@h/db"])
    assert without_password(config).search.storage == "postgresql://bob:***@h/db"
    assert config.search.storage.endswith("s3cr3t-pw@h/db"), "the original is unchanged"


def test_each_storage_kind_gets_the_hint_that_applies_to_it(tmp_path: Path) -> None:
    """A file that cannot be opened is not told to check a server's host and password."""
    with pytest.raises(ConfigError) as e:
        check(choose("sqlite:////proc/x.db", tmp_path, MOUNTS))
    text = str(e.value)
    assert "writable folder /proc" in text and "four slashes" in text, text
    assert "host" not in text and "password" not in text, text
    with pytest.raises(ConfigError) as e:  # nothing listens on port 1 of loopback
        check(choose("postgresql://bob:p@127.0.0.1:1/db", tmp_path, MOUNTS))
    text = str(e.value)
    assert "check the host, port, user, password" in text and "SQLite" not in text, text
    assert "bob:***@" in text and "***ort" not in text, "a short password is redacted whole"


def test_no_password_is_shown_from_the_query_or_in_a_drivers_words() -> None:
    from orchestrator.config.study_storage import _line

    assert "s3cr3t" not in redact("postgresql://u@h/db?password=s3cr3t&sslmode=require")
    said = RuntimeError("auth for abc!x failed;  double  space; port 5432 password p")
    assert _line(said, "postgresql://u:!x@h/db") == (
        "auth for abc*** failed; double space; port 5432 password p")  # fmt: skip
    assert "a  b" not in _line(RuntimeError("got a  b"), "postgresql://u:a  b@h/db")
    assert _line(RuntimeError("pw s3cr3t"), "postgresql://u@h/db?password=s3cr3t") == "pw ***"


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_study_is_refused(url: str, capsys: pytest.CaptureFixture) -> None:
    from orchestrator.search.cli import main

    assert main(["--preset", "smoke", "--storage", url]) == 2
    assert "search.storage: " in capsys.readouterr().err
    with pytest.raises(ConfigError, match="keeps the study in memory"):
        load_config(None, "smoke", [f'search.storage="{url}"'])
