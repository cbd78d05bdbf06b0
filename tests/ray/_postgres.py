"""A throwaway PostgreSQL server for the tests: ``initdb`` + ``pg_ctl`` in a temporary folder,
listening on 127.0.0.1 only, with a password user; stopped and removed at the end.

PostgreSQL refuses to run as root, so as root (CI here) it runs as the ``postgres`` system user
through ``runuser``; as anyone else it runs as that user.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

USER, PASSWORD = "commtune", "pg-s3cret-Zq7"


def binaries() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` that holds initdb and pg_ctl."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    for initdb in reversed(found):
        bin_dir = Path(initdb).parent
        if (bin_dir / "pg_ctl").exists():
            return bin_dir
    return None


def _version(path: str) -> float:
    try:
        return float(Path(path).parts[-3])
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class Server:
    port: int

    def url(self, database: str, password: str = PASSWORD, port: int | None = None) -> str:
        return f"postgresql+psycopg://{USER}:{password}@127.0.0.1:{port or self.port}/{database}"

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres").replace("+psycopg", ""), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server(bin_dir: Path) -> Iterator[Server]:
    home = Path(tempfile.mkdtemp(prefix="commtune-pg-"))
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    try:
        (home / "pw").write_text(PASSWORD + "\n")
        if as_pg:
            shutil.chown(home, "postgres")
            shutil.chown(home / "pw", "postgres")
        run = lambda *cmd: subprocess.run(  # noqa: E731
            [*as_pg, *map(str, cmd)], check=True, capture_output=True, text=True, timeout=120
        )
        run(bin_dir / "initdb", "-D", home / "data", "-U", USER, "--pwfile", home / "pw",
            "--auth", "scram-sha-256", "--encoding", "UTF8", "--no-sync")  # fmt: skip
        port = free_port()
        options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off"
        run(bin_dir / "pg_ctl", "-D", home / "data", "-l", home / "log", "-o", options,
            "-w", "-t", "60", "start")  # fmt: skip
        try:
            yield Server(port)
        finally:
            run(bin_dir / "pg_ctl", "-D", home / "data", "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(home, ignore_errors=True)
