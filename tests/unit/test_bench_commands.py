"""The benchmarks' one command runner: output captured or streamed line by line, a failed
command named with its output, and a command past its timeout ended with its whole session."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from benchmarks._commands import run_module

SLEEPER = (
    "import os, subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
    "'import time; time.sleep(60)']); print(os.getpgid(0), flush=True); time.sleep(60)"
)


def test_output_is_captured_or_streamed() -> None:
    ran = run_module("platform", [])
    assert ran.returncode == 0 and "Linux" in ran.stdout and ran.seconds > 0
    seen: list[str] = []
    streamed = run_module("platform", [], on_line=seen.append)
    assert seen == streamed.stdout.splitlines() and streamed.stderr == ""


def test_a_failed_command_is_named_with_its_output() -> None:
    with pytest.raises(SystemExit, match=r"-m json\.tool /no/such/file exited 2:\n[\s\S]*No such"):
        run_module("json.tool", ["/no/such/file"])
    assert run_module("json.tool", ["/no/such/file"], check=False).returncode == 2


def test_a_command_past_its_timeout_ends_with_all_it_started() -> None:
    seen: list[str] = []
    started = time.monotonic()
    with pytest.raises(SystemExit, match="ran past 2 s and was ended"):
        run_module("timeit", ["-n", "1", SLEEPER], timeout_s=2, on_line=seen.append)
    assert time.monotonic() - started < 20
    group = int(seen[0])
    assert group != os.getpgid(0)
    deadline = time.monotonic() + 10
    while _living(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _living(group), "the sleeping grandchild outlived its session"


def _living(group: int) -> list[int]:
    """Processes of process group ``group`` that are not zombies (an ended orphan may wait
    to be reaped)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found
