"""The processes a test started, and only those.

Each command a test runs carries an owner mark of its own in its environment
(``COMMTUNE_TEST_OWNER``). Ray's processes inherit it from whatever started them (gcs_server,
the raylet, every worker, a ``ray start`` head's daemons), it survives Ray's process titles and
re-parenting, so a test finds its own processes by it, and never another user's Ray on a
shared machine (no ``ray stop``, no ``/tmp/ray/session_latest``, no search by name). Commands
run in their own session: a timeout, or any exception while one runs (pytest-timeout's
included), ends everything the command owns before the error goes on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNER_VAR = "COMMTUNE_TEST_OWNER"
COMMAND_TIMEOUT_S = 480
"""A command's default limit: under pytest's per-test ``timeout`` (pyproject.toml), so the
command's own limit fires first and says which command it was."""
started: list[str] = []
"""Every owner mark handed out in this pytest process (conftest ends what is left of each)."""


def new_owner(label: str) -> str:
    """A fresh owner mark (``label`` says whose, in a failure's listing), noted in ``started``."""
    owner = f"{label}-{uuid.uuid4().hex[:12]}"
    started.append(owner)
    return owner


def owned_env(owner: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (this process's environment by default) with ``owner``'s mark."""
    return {**(os.environ if base is None else base), OWNER_VAR: owner}


def owned(owner: str) -> dict[int, str]:
    """The live processes marked with ``owner``, by pid: their command line (zombies are gone,
    only not yet reaped, and are left out)."""
    mark = f"{OWNER_VAR}={owner}\0".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark not in (entry / "environ").read_bytes():
                continue
            stat = (entry / "stat").read_text()
            args = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            found[int(entry.name)] = args.strip()
    return found


def end(owner: str, timeout_s: float = 30) -> None:
    """SIGKILL every process ``owner`` marks until none is left."""
    deadline = time.monotonic() + timeout_s
    while (alive := owned(owner)) and time.monotonic() < deadline:
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # ended, pid reused
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def wait_gone(owner: str, timeout_s: float = 30) -> dict[int, str]:
    """Wait up to ``timeout_s`` for ``owner``'s processes to end by themselves; what is left."""
    deadline = time.monotonic() + timeout_s
    while (alive := owned(owner)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive


def start(args: list[str], owner: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    """``args`` in a session of its own, marked with ``owner``."""
    return subprocess.Popen(
        args, cwd=kw.pop("cwd", ROOT), env=owned_env(owner, env), start_new_session=True, **kw
    )


class Finished(subprocess.CompletedProcess):
    """A command's result, with what it left running: ``left`` holds the processes it started
    that were still alive 15 s after it exited (by pid: their command line)."""

    left: dict[int, str]


def run(
    args: list[str],
    label: str = "command",
    env: dict[str, str] | None = None,
    timeout: float = COMMAND_TIMEOUT_S,
    **kw,
) -> Finished:
    """``subprocess.run`` of ``args`` (text, output captured) that owns its processes: on a
    timeout or any other exception everything the command started is ended, then the error
    goes on."""
    owner = new_owner(label)
    proc = start(args, owner, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        end(owner)
        proc.communicate()
        raise
    done = Finished(args, proc.returncode, out, err)
    done.left = wait_gone(owner, timeout_s=15)
    return done


def python(module: str, args: list[str], **kw) -> Finished:
    """``python -m module args`` as a user runs it (see ``run``)."""
    return run([sys.executable, "-m", module, *args], label=module.rsplit(".", 1)[-1], **kw)
