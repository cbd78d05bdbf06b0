"""``submit fetch``: bring a job's output folder back through the Jobs API (no SSH needed).

A small job on the cluster (``submit pack FOLDER``) prints the folder's top-level files as a
base64 tar between markers; the client reads the job's logs and unpacks them here.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import re
import shlex
import sys
import tarfile
import uuid
import zlib
from pathlib import Path

from orchestrator.submit.jobs import (
    OUT_KEY,
    PACK_BEGIN,
    PACK_END,
    PACK_LIMIT_BYTES,
    PROJECT_ROOT,
    UPLOAD_KEY,
    SubmitError,
    client,
    outcome,
    runtime_env_for,
    submit_when_ready,
)


def fetch(args: argparse.Namespace) -> int:
    """Pack the job's output folder on the cluster (a small job) and unpack it here."""
    jobs = client(args)
    metadata = jobs.get_job_info(args.job_id).metadata or {}
    out = metadata.get(OUT_KEY)
    if not out:
        raise SubmitError(
            f"job {args.job_id} was not submitted by orchestrator.submit "
            "(no output folder recorded)"
        )
    pack_id = f"{args.job_id}-fetch-{uuid.uuid4().hex[:6]}"
    submit_when_ready(
        jobs,
        entrypoint=shlex.join(["python", "-m", "orchestrator.submit", "pack", out]),
        submission_id=pack_id,
        runtime_env=runtime_env_for(metadata.get(UPLOAD_KEY) != "0", str(PROJECT_ROOT)),
    )
    if outcome(jobs, pack_id, wait_s=300, quiet=True) != 0:
        raise SubmitError(f"could not read {out} on the cluster:\n{jobs.get_job_logs(pack_id)}")
    dest = Path(args.dest or Path("runs") / args.job_id)
    names = unpack(jobs.get_job_logs(pack_id), dest, args.force)
    print(f"fetched {len(names)} file(s) into {dest}: {', '.join(names)}")
    return 0


def pack(folder: str) -> int:
    """On the cluster: print the folder's top-level files as a base64 tar between markers
    (trial state below it stays there)."""
    root = Path(os.path.expandvars(os.path.expanduser(folder)))
    files = sorted(p for p in root.glob("*") if p.is_file()) if root.is_dir() else []
    if not files:
        print(f"no outputs in {root} (has the job written any yet?)", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in files)
    if size > PACK_LIMIT_BYTES:
        print(
            f"{root} holds {size / 2**20:.0f} MiB, more than the {PACK_LIMIT_BYTES // 2**20}"
            " MiB fetch limit; copy it from the shared storage instead",
            file=sys.stderr,
        )
        return 1
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in files:
            tar.add(path, arcname=path.name)
    print(PACK_BEGIN)
    print(base64.b64encode(buf.getvalue()).decode())
    print(PACK_END)
    return 0


MAX_FILES = 64
"""More top-level files than a run folder holds is not a run folder."""
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A run's own files: flat names, no dotfiles, nothing that climbs out of --dest."""


def unpack(logs: str, dest: Path, force: bool = False) -> list[str]:
    """Extract what ``pack`` printed into ``dest``: only a run's own files (flat names, regular
    files, within the size and count caps), never over an existing file unless ``force``.
    Anything else is a SubmitError naming what and why; nothing is written then."""
    try:
        text = logs.split(PACK_BEGIN, 1)[1].split(PACK_END, 1)[0]
    except IndexError:
        raise SubmitError(f"the fetch job printed no outputs:\n{logs[-2000:]}") from None
    try:
        blob = base64.b64decode("".join(text.split()), validate=True)
    except ValueError as e:
        raise SubmitError(f"the fetch job's output is not base64 ({e}); fetch again") from None
    if len(blob) > PACK_LIMIT_BYTES:
        raise SubmitError(f"the fetched archive is over {PACK_LIMIT_BYTES // 2**20} MiB")
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            members = _checked_members(tar)
            _check_dest(dest, [m.name for m in members], force)
            dest.mkdir(parents=True, exist_ok=True)
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise SubmitError(f"the fetched archive is unreadable ({type(e).__name__}: {e})") from e
    return [m.name for m in members]


def _checked_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    members = tar.getmembers()
    if len(members) > MAX_FILES:
        raise SubmitError(f"the fetched archive holds {len(members)} entries (at most {MAX_FILES})")
    total = 0
    for member in members:
        if not member.isfile() or not SAFE_NAME.fullmatch(member.name):
            raise SubmitError(f"the fetched archive holds {member.name!r}, not a run's own file")
        total += member.size
    if total > PACK_LIMIT_BYTES:
        raise SubmitError(f"the fetched files come to {total / 2**20:.0f} MiB, over the limit")
    return members


def _check_dest(dest: Path, names: list[str], force: bool) -> None:
    """``dest`` is a folder (or will be), is no symlink, and holds none of ``names`` unless
    ``force``."""
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise SubmitError(f"--dest {dest}: not a folder (a symlink or a file); choose another")
    clashes = [n for n in names if (dest / n).exists() or (dest / n).is_symlink()]
    if clashes and not force:
        raise SubmitError(
            f"--dest {dest} already holds {', '.join(clashes[:5])}; choose an empty folder or "
            "pass --force to overwrite them"
        )
    links = [n for n in clashes if (dest / n).is_symlink()]
    if links:
        raise SubmitError(f"--dest {dest}: {links[0]} is a symlink; remove it first")
