"""Ray heads started the way a user starts them (`ray start --head`), for the job tests.

A head's daemons carry its owner mark (``_procs``): stopping it ends those, and only those
(`ray stop` would end every Ray of the machine, another user's too).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import _procs
import requests

ROOT = Path(__file__).resolve().parents[2]
CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")
"""Where `ray start` notes the newest head's address (a bare ray.init() joins it)."""
_noted: dict[str, str] = {}
"""Each head's owner mark: the address it noted there."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(args: list[str], env: dict[str, str], dashboard_port: int) -> str:
    """``ray start --head ARGS``; returns its owner mark once the Jobs API answers (401 counts:
    it is up)."""
    owner = _procs.new_owner("head")
    try:
        subprocess.run(
            ["ray", "start", "--head", "--dashboard-host=127.0.0.1",
             f"--dashboard-port={dashboard_port}", *args],
            env=_procs.owned_env(owner, env), cwd=ROOT, check=True, capture_output=True,
            timeout=120,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                requests.get(f"http://127.0.0.1:{dashboard_port}/api/version", timeout=2)
                _noted[owner] = CURRENT_CLUSTER.read_text() if CURRENT_CLUSTER.exists() else ""
                return owner
            except requests.ConnectionError:
                time.sleep(1)
        raise TimeoutError(f"the dashboard on port {dashboard_port} never answered")
    except BaseException:
        _procs.end(owner)  # half a head is still a head
        raise


def stop_head(owner: str) -> None:
    """End the head's processes and the address it noted (what ``ray stop`` does, for this head
    alone: another head's note stays); none of its processes may be left."""
    _procs.end(owner)
    noted = _noted.pop(owner, "")
    if noted and CURRENT_CLUSTER.exists() and CURRENT_CLUSTER.read_text() == noted:
        CURRENT_CLUSTER.unlink()
    assert not _procs.owned(owner), f"head processes left behind: {_procs.owned(owner)}"


def submit_cli(args: list[str], env: dict[str, str], timeout: float = 300):
    """``python -m orchestrator.submit ARGS`` as a user runs it."""
    return _procs.python("orchestrator.submit", args, env=env, timeout=timeout)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without Ray's auth and address settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env.update(extra)
    return env
