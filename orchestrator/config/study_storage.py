"""Where the Optuna study lives, chosen and checked before Ray starts.

The study is the search's memory (every output is rebuilt from it), so a storage that cannot be
reached, or one that corrupts itself, loses the search. Three kinds:

- a database URL (``postgresql://...``): checked by connecting, so that a typo, a wrong
  password or a missing database exits 2 at once instead of after Ray has started;
- a journal file (a path ending ``.log``/``.journal``): Optuna's append-only log;
- nothing given: SQLite ``study.db`` in ``--out``, except on a network file system, where
  SQLite's file locking is unreliable (Optuna's documentation says so): there the journal with
  its NFS-safe open lock is used instead, and the choice is said.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import optuna

from orchestrator.config.schema import Config, ConfigError
from orchestrator.config.storage_url import (
    JOURNAL_SUFFIXES,
    KEY,
    QUERY_SECRETS,
    check_storage,
    read_storage,
    redact,
)
from orchestrator.runfiles import STUDY_DB, STUDY_JOURNAL

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

NETWORK_FS = frozenset(
    {"nfs", "nfs4", "efs", "lustre", "cifs", "smb", "smb3", "smbfs", "glusterfs", "ceph",
     "gpfs", "beegfs", "panfs", "9p", "afs", "davfs", "ocfs2", "gfs2"}
)  # fmt: skip
"""File system types whose locks SQLite cannot trust; any ``fuse.*`` mount counts too."""
CONNECT_TIMEOUT_S = 5
POSTGRES_EXTRA = "pip install -e .[postgres]"


@dataclass(frozen=True)
class StorageChoice:
    """The storage a search will use: a database URL or a journal file path."""

    target: str
    journal: bool
    default: bool = False
    """Chosen by commtune in ``--out`` (which the search creates), not given by the user."""
    note: str | None = None
    """Said to the user when the choice was made for them (a journal on a network disk)."""

    def open(self) -> optuna.storages.BaseStorage:
        if self.journal:
            from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

            lock = JournalFileOpenLock(self.target)  # safe on NFSv3+, unlike fcntl locks
            return optuna.storages.JournalStorage(JournalFileBackend(self.target, lock_obj=lock))
        return _RDBStorage(self.target)

    def shown(self) -> str:
        """The target as it may be printed: a URL's password is never shown."""
        return self.target if self.journal else redact(self.target)


class _RDBStorage(optuna.storages.RDBStorage):
    """An RDBStorage whose pickles hold no password: Ray Tune writes the searcher, and the study
    in it, to ``tune/tuner.pkl`` in ``--out``. Only the driver connects (with the live object);
    an unpickled copy fails to authenticate rather than leak."""

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["url"] = redact(self.url)
        return state


def open_file(path: Path) -> optuna.storages.BaseStorage:
    """The study in a run folder's file (what the report reads): a journal or SQLite."""
    journal = path.suffix in JOURNAL_SUFFIXES
    return StorageChoice(str(path) if journal else f"sqlite:///{path.resolve()}", journal).open()


def choose(configured: str | None, out: Path, mounts: str | None = None) -> StorageChoice:
    """The storage for ``configured`` (``--storage``), else the default in ``out``; no I/O but
    reading ``/proc/mounts`` (``mounts`` stands in for it in tests)."""
    if configured:
        target = read_storage(configured)
        if isinstance(target, Path):
            return StorageChoice(str(target), journal=True)
        return StorageChoice(normalize(target), journal=False)
    out = out.resolve()
    fs = network_fs(out, mounts)
    if fs is None or ((out / STUDY_DB).exists() and not (out / STUDY_JOURNAL).exists()):
        return StorageChoice(f"sqlite:///{out / STUDY_DB}", journal=False, default=True)
    note = (
        f"storage: {out} is on a network file system ({fs}), where SQLite's locking is "
        f"unreliable; the study is Optuna's journal {out / STUDY_JOURNAL} (NFS-safe lock). "
        "Pass --storage to choose another (a database URL is best for a team)"
    )
    return StorageChoice(str(out / STUDY_JOURNAL), journal=True, default=True, note=note)


def network_fs(path: Path, mounts: str | None = None) -> str | None:
    """The file system type of ``path`` when it is a network one (longest mount point that
    holds it, the last mounted winning); None for a local disk or when it cannot be told."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None
    best, fstype = -1, ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1])
        if _holds(point, str(path)) and len(point) >= best:
            best, fstype = len(point), fields[2]
    if fstype in NETWORK_FS or fstype.startswith("fuse."):
        return fstype
    return None


def _unescape(point: str) -> str:
    """/proc/mounts writes a space as ``\\040`` (and tab, newline, backslash likewise)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        point = point.replace(code, char)
    return point


def _holds(point: str, path: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def without_password(config: Config) -> Config:
    """``config`` as it may be written to a file (best.yaml): its storage URL redacted."""
    url = config.search.storage
    if not url or "://" not in url:
        return config
    return replace(config, search=replace(config.search, storage=redact(url)))


def normalize(url: URL) -> str:
    """A SQLAlchemy URL that can be used as is: plain ``postgresql://`` means psycopg 3 (the
    driver the ``postgres`` extra installs) unless psycopg2, SQLAlchemy's default, is there."""
    psycopg3_only = _has("psycopg") and not _has("psycopg2")
    if url.drivername in ("postgresql", "postgres") and psycopg3_only:
        url = url.set(drivername="postgresql+psycopg")
    return url.render_as_string(hide_password=False)


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check(choice: StorageChoice) -> None:
    """The config's checks of the storage (``storage_url.check_storage``), then one connection
    to a database URL, so that a bad one exits 2 before Ray starts; one line naming the key,
    never the password."""
    if choice.default:
        return  # a file in --out, which the search creates
    url = check_storage(choice.target)
    if url is None or isinstance(url, Path):
        return  # a journal file: nothing to connect to
    import sqlalchemy
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

    shown = choice.shown()
    try:
        engine = sqlalchemy.create_engine(choice.target, connect_args=_timeout(url))
    except (NoSuchModuleError, ArgumentError) as e:
        raise ConfigError(
            KEY, f"{shown}: unknown database dialect or driver ({_line(e, choice.target)}); "
            "use postgresql://, mysql+pymysql:// or sqlite:///"
        ) from e  # fmt: skip
    except ImportError as e:
        raise ConfigError(
            KEY, f"{shown}: its driver is not installed ({e.name or e}); for PostgreSQL: "
            f"{POSTGRES_EXTRA}"
        ) from e  # fmt: skip
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as e:
        raise ConfigError(
            KEY, f"cannot open {shown}: {_line(e, choice.target)}; {_open_hint(engine.url)}"
        ) from e  # fmt: skip
    finally:
        engine.dispose()


def _open_hint(url: URL) -> str:
    """What to check when a storage cannot be opened, for its kind: a file or a server (an
    in-memory SQLite study never gets here: ``read_storage`` refuses it)."""
    if url.get_backend_name() != "sqlite":
        return ("check the host, port, user, password, that the server runs and that the "
                "database exists (createdb NAME)")  # fmt: skip
    path = Path(url.database)
    return (
        f"SQLite needs a writable folder {path.parent} and a file it may create or open there "
        f"({path.name}); choose a folder of yours (sqlite:/// then an absolute path, four "
        "slashes in all) or a .journal path"
    )


def _timeout(url: URL) -> dict[str, int]:
    """A server that does not answer fails in seconds, not at the OS's TCP timeout."""
    server = url.get_backend_name() in ("postgresql", "mysql")
    return {"connect_timeout": CONNECT_TIMEOUT_S} if server else {}


def _line(error: Exception, url: str) -> str:
    """The driver's own words, on one line, without the password (as given, or percent-encoded
    as in the URL) should it quote it."""
    from urllib.parse import quote

    from sqlalchemy.engine import make_url

    text = str(getattr(error, "orig", None) or error)
    try:
        parsed = make_url(url)
    except Exception:  # an unparsable URL has been redacted by the caller
        parsed = None
    secrets = [] if parsed is None else [str(parsed.password or "")] + [
        str(v) for k, v in parsed.query.items() if k.lower() in QUERY_SECRETS]  # fmt: skip
    for secret in filter(None, secrets):
        for form in {secret, quote(secret, safe="")}:
            # Whole occurrences where it starts or ends with a word character: a short password
            # is also a piece of the driver's words ("p" in "port").
            head = r"(?<!\w)" if re.match(r"\w", form) else ""
            tail = r"(?!\w)" if re.search(r"\w$", form) else ""
            text = re.sub(f"{head}{re.escape(form)}{tail}", "***", text)
    return " ".join(text.split())
