"""What a storage setting (``--storage`` / ``search.storage``) names, read in one place.

A journal file (a path ending ``.log``/``.journal``) or a database URL. The config reads it
when it loads (a mistake exits 2 with the rest of the config's) and
``orchestrator.config.study_storage``
reads it again before it connects, so both say the same words, and a password never
appears in them. Nothing here contacts a server: it may be reachable only from the cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.config.inputs import ConfigError
from orchestrator.runfiles import STUDY_DB

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

KEY = "search.storage"
"""The key every refusal names (``--storage`` sets it too)."""
JOURNAL_SUFFIXES = (".log", ".journal")
QUERY_SECRETS = frozenset({"password", "passwd", "pwd", "sslpassword"})
"""Query parameters a driver takes a password from (``postgresql://u@h/db?password=...``)."""


def read_storage(text: str) -> Path | URL:
    """The journal file ``text`` names, or the database URL it spells, parsed. An in-memory
    SQLite study is refused: it is lost when the search ends (no ``--resume``, no report)."""
    if "://" not in text and text.endswith(JOURNAL_SUFFIXES):
        return Path(text).expanduser()
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(text)
    except (ArgumentError, ValueError) as e:
        raise ConfigError(
            KEY, f"{redact(text)!r} is not a storage URL ({e}); e.g. "
            f"postgresql://user:password@host:5432/db, sqlite:///path/{STUDY_DB} or a .journal path"
        ) from e  # fmt: skip
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        raise ConfigError(KEY, f"{text} keeps the study in memory, lost when the search ends "
                          "(no --resume, no report): name a file, e.g. "
                          f"sqlite:////absolute/path/{STUDY_DB}")  # fmt: skip
    return url


def check_storage(text: str | None) -> Path | URL | None:
    """``text`` read, and the folder of its local file (a journal, a SQLite database) there:
    such files are not made in a missing folder, which failed after Ray had started."""
    if text is None:
        return None
    target = read_storage(text)
    if isinstance(target, Path):
        path = target
    elif target.get_backend_name() == "sqlite":
        path = Path(str(target.database)).expanduser()
    else:
        return target
    if not path.parent.is_dir():
        raise ConfigError(KEY, f"{path.parent} is not a folder; create it or use another path")
    return target


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (also when it does not parse)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
        hidden = {k: "***" for k in parsed.query if k.lower() in QUERY_SECRETS}
        return parsed.update_query_dict(hidden).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        scheme, sep, rest = url.partition("://")
        userinfo, at, host = rest.rpartition("@")
        if not (sep and at and ":" in userinfo):
            return url
        return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"
