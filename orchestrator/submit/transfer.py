"""``submit fetch``: bring a job's output folder back through the Jobs API (no SSH needed).

A small job on the cluster (``submit pack FOLDER``) prints the folder's top-level files as a
base64 tar between markers; the client reads the job's logs and unpacks them here.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import shlex
import sys
import tarfile
import uuid
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
    names = unpack(jobs.get_job_logs(pack_id), dest)
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


def unpack(logs: str, dest: Path) -> list[str]:
    """Extract what ``pack`` printed into ``dest``; returns the file names."""
    try:
        text = logs.split(PACK_BEGIN, 1)[1].split(PACK_END, 1)[0]
    except IndexError:
        raise SubmitError(f"the fetch job printed no outputs:\n{logs[-2000:]}") from None
    dest.mkdir(parents=True, exist_ok=True)
    blob = io.BytesIO(base64.b64decode("".join(text.split())))
    with tarfile.open(fileobj=blob, mode="r:gz") as tar:
        tar.extractall(dest, filter="data")
        return tar.getnames()
