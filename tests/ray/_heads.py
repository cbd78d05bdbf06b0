"""Ray heads started the way a user starts them (`ray start --head`), for the job tests.

`ray stop` ends every Ray process of this machine, which is why the Ray tests never run two at
once; after it, nothing of the head may be left.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_head(args: list[str], env: dict[str, str], dashboard_port: int) -> None:
    """``ray start --head ARGS``; returns once the Jobs API answers (401 counts: it is up)."""
    subprocess.run(
        ["ray", "start", "--head", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dashboard_port}", *args],
        env=env, cwd=ROOT, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            requests.get(f"http://127.0.0.1:{dashboard_port}/api/version", timeout=2)
            return
        except requests.ConnectionError:
            time.sleep(1)
    raise TimeoutError(f"the dashboard on port {dashboard_port} never answered")


def stop_all(env: dict[str, str]) -> None:
    """``ray stop`` and check that no Ray process of the head is left."""
    subprocess.run(["ray", "stop"], env=env, capture_output=True, timeout=120)
    deadline = time.monotonic() + 30
    while leftovers() and time.monotonic() < deadline:
        time.sleep(1)
    assert not leftovers(), f"Ray processes left behind: {leftovers()}"


def leftovers() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if "raylet" in line or "gcs_server" in line]


def submit_cli(args: list[str], env: dict[str, str], timeout: float = 600):
    """``python -m orchestrator.submit ARGS`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.submit", *args],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without Ray's auth and address settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env.update(extra)
    return env
