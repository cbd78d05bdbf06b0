"""Ray jobs for commtune: the client, submitting a search or training run, following it.

A job runs with this project as its working directory (uploaded through the Jobs API), so
the cluster runs the code you have here. Its arguments are validated here before anything
is submitted, and its outputs go to a folder on the cluster named after the job.

The token of a cluster with ``RAY_AUTH_MODE=token`` is sent with every request: from
``--token-file``, else ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``
(Ray's own order).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from orchestrator import search, train
from orchestrator.config.address import check_reachable
from orchestrator.config.inputs import parse_env_items
from orchestrator.config.schema import Config
from orchestrator.submit.staging import absolute_inputs, stage

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class Command(NamedTuple):
    """A job kind: the module the job runs (``python -m``) and that command's face, which
    validates the job's arguments here before anything is sent."""

    module: str
    check: Callable[[list[str]], Config]


COMMANDS = {
    "search": Command("orchestrator.search", search.check),
    "train": Command("orchestrator.train", train.check),
}
"""Job kinds: what a user may run on the cluster through this tool."""
DEFAULT_ADDRESS = "http://127.0.0.1:8265"
DEFAULT_RESULTS_ROOT = "~/commtune-runs"
UPLOAD_EXCLUDES = ["runs/", ".git/", "**/__pycache__/", "*.egg-info/", ".ruff_cache/"]
OUT_KEY, UPLOAD_KEY = "commtune_out", "commtune_upload"
"""Job metadata keys: the job's output folder on the cluster, and whether the project was
uploaded (``fetch`` reads both)."""
PACK_BEGIN, PACK_END = "--- commtune outputs begin ---", "--- commtune outputs end ---"
PACK_LIMIT_BYTES = 64 * 2**20
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
AGENT_WAIT_S = 60.0
DEFAULT_HEARTBEAT_S = 30.0
"""``--follow``: a line after this many seconds without a log line (``--heartbeat-s``)."""


class SubmitError(Exception):
    """A request the cluster refused or that cannot be made; the message says what to do."""


def find_token(token_file: str | None) -> str | None:
    """The auth token this client presents, in Ray's own lookup order (None: no token)."""
    if token_file:
        path = Path(token_file).expanduser()
        if not path.is_file():
            raise SubmitError(f"--token-file: {path} does not exist")
        return _read_token(path)
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token").expanduser()
    if not path.is_file():
        return None
    return _read_token(path)


def _read_token(path: Path) -> str | None:
    """A token file's token; a warning when others may read it (the token is the cluster)."""
    if path.stat().st_mode & 0o077:
        print(f"warning: {path} is readable by group or others; chmod 600 {path}",
              file=sys.stderr, flush=True)  # fmt: skip
    return path.read_text().strip() or None


LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")


def check_transport(address: str, has_token: bool, insecure: bool) -> None:
    """Refuse to send a token over plain HTTP to an address that is not this machine (the
    tunnel ``ray dashboard`` opens is loopback) unless ``--insecure`` says to."""
    from urllib.parse import urlparse

    url = urlparse(address if "://" in address else f"http://{address}")
    host = (url.hostname or "").lower()
    loopback = host in LOOPBACK or host.startswith("127.")
    if has_token and url.scheme == "http" and not loopback and not insecure:
        raise SubmitError(
            f"--address {address}: the token would cross the network in clear text; use "
            "https://, the loopback tunnel of `ray dashboard cluster.yaml` "
            "(http://127.0.0.1:8265), or --insecure if this network is yours"
        )


def client(args: argparse.Namespace):
    """A Jobs API client that sends the token explicitly (whatever this shell's RAY_AUTH_MODE).
    The address is checked first, before Ray is imported: a bare HOST:PORT that nothing
    answers at made Ray wait for a GCS there for 45 s."""
    token = find_token(args.token_file)
    check_transport(args.address, token is not None, getattr(args, "insecure", False))
    check_reachable(args.address, "--address", "is the head up and the tunnel open (`ray "
                    f"dashboard cluster.yaml`, then --address {DEFAULT_ADDRESS})?")  # fmt: skip
    from ray.exceptions import RayError
    from ray.job_submission import JobSubmissionClient

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        return JobSubmissionClient(args.address, headers=headers)
    except (ConnectionError, RuntimeError, ValueError, RayError) as e:
        raise SubmitError(refusal(args.address, str(e), token is not None)) from e


def refusal(address: str, error: str, had_token: bool) -> str:
    """One actionable line for a cluster that cannot be reached or refused us."""
    if "401" in error or "Authentication required" in error:
        return (
            f"{address} requires a token (RAY_AUTH_MODE=token) and none was found: pass "
            "--token-file, set RAY_AUTH_TOKEN, or copy the cluster's ~/.ray/auth_token here"
        )
    if had_token and ("403" in error or "invalid" in error.lower()):
        return f"{address} refused the token: it is not this cluster's (check --token-file)"
    first = error.strip().splitlines()[0] if error.strip() else "no answer"
    if "Failed to connect" in error or "Connection" in error:
        return (
            f"cannot reach the Jobs API at {address} ({first}); is the head up and the "
            "tunnel open (`ray dashboard cluster.yaml`)?"
        )
    return f"{address}: {first}"


CONFIG_FLAGS = ("--config", "--preset", "--set")
"""Job arguments that shape the config: applied here, then replaced by the staged config."""


def job_command(args: argparse.Namespace, job_id: str, staging: Path) -> tuple[list[str], str]:
    """The job's argv, validated here as the cluster would, and its output folder there.

    With an upload, ``staging`` (a folder that does not exist yet) receives the working
    directory, the resolved config and every local file it names (``staging.stage``), and the
    job reads that config; without one, every path must be absolute (the cluster reads them).
    """
    command = COMMANDS[args.command]
    job_args = list(args.job_args)
    config = command.check(job_args)
    given = _job_flags(job_args)
    if args.no_upload:
        absolute_inputs(config)
        job_args = _absolute_config(job_args)
    else:
        staged = stage(config, Path(args.working_dir), staging)
        job_args = ["--config", staged.as_posix(), *_without_config_flags(job_args)]
    if not given.address:  # a job's driver joins the cluster it runs on
        job_args += ["--address", "auto"]
    out = given.out
    if not out:
        out = f"{args.results_root.rstrip('/')}/{job_id}"
        job_args += ["--out", out]
    return ["python", "-m", command.module, *job_args], out


def _job_flags(job_args: list[str]) -> argparse.Namespace:
    """``--address`` and ``--out`` as the job's arguments give them (None: not given), read
    the way argparse reads them (either spelling, the last wins): submit fills in the two that
    a job on the cluster needs and the user left out. The rest is the command's to check."""
    flags = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    flags.add_argument("--address")
    flags.add_argument("--out")
    return flags.parse_known_args(job_args)[0]


def _without_config_flags(job_args: list[str]) -> list[str]:
    """``job_args`` less ``--config``/``--preset``/``--set`` (either spelling, with values)."""
    kept, skip = [], False
    for arg in job_args:
        if skip:
            skip = False
        elif arg in CONFIG_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in CONFIG_FLAGS)):
            kept.append(arg)
    return kept


def _absolute_config(job_args: list[str]) -> list[str]:
    """``--config PATH`` / ``--config=PATH`` with PATH made absolute (no upload: the cluster
    must see the same file)."""
    out, follows = [], False
    for arg in job_args:
        if follows:
            arg, follows = str(Path(arg).expanduser().resolve()), False
        elif arg == "--config":
            follows = True
        elif arg.startswith("--config="):
            arg = f"--config={Path(arg.split('=', 1)[1]).expanduser().resolve()}"
        out.append(arg)
    return out


def runtime_env_for(upload: bool, working_dir: str) -> dict:
    """The job's runtime environment: this project as its working directory, or nothing."""
    return {"working_dir": working_dir, "excludes": UPLOAD_EXCLUDES} if upload else {}


def submit_when_ready(jobs, wait_s: float = AGENT_WAIT_S, **job: Any) -> None:
    """``submit_job``, waiting while a freshly started head has no job agent yet (Ray answers
    500 "No available agent to submit job" for a few seconds after ``ray start``)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            jobs.submit_job(**job)
            return
        except RuntimeError as e:
            if "No available agent" not in str(e) or time.monotonic() > deadline:
                raise
            print("waiting for the head's job agent to come up ...", file=sys.stderr, flush=True)
            time.sleep(2)


def submit(args: argparse.Namespace) -> int:
    job_id = f"commtune-{args.command}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory(prefix="commtune-job-") as tmp:
        staging = Path(tmp) / "job"
        argv, out = job_command(args, job_id, staging)
        return _submit(args, job_id, argv, out, str(staging))


def _submit(args: argparse.Namespace, job_id: str, argv: list[str], out: str, staged: str) -> int:
    """Submit the job (its working directory is uploaded from ``staged``), then follow it."""
    runtime_env = runtime_env_for(not args.no_upload, staged)
    env = parse_env_items(args.env, "--env")
    if env:
        runtime_env["env_vars"] = env
    entrypoint = shlex.join(argv)
    jobs = client(args)
    try:
        submit_when_ready(
            jobs,
            entrypoint=entrypoint,
            submission_id=job_id,
            runtime_env=runtime_env,
            metadata={OUT_KEY: out, UPLOAD_KEY: "0" if args.no_upload else "1"},
        )
    except RuntimeError as e:
        raise SubmitError(refusal(args.address, str(e), True)) from e
    print(f"submitted {job_id}: {entrypoint}")
    print(
        f"outputs on the cluster: {out}; fetch them with "
        f"`python -m orchestrator.submit fetch {job_id}`",
        flush=True,
    )
    return follow(jobs, job_id, args.heartbeat_s) if args.follow else 0


def follow(jobs, job_id: str, heartbeat_s: float = DEFAULT_HEARTBEAT_S) -> int:
    """Stream the logs until the job ends; the exit code tells the job's outcome. After
    ``heartbeat_s`` without a log line, a line says the job's state and age (a quiet job,
    one waiting for resources and a lost stream look alike otherwise)."""
    try:
        asyncio.run(_tail(jobs, job_id, heartbeat_s))
    except KeyboardInterrupt:
        print(
            f"\nstopped following; the job goes on (stop it with "
            f"`python -m orchestrator.submit stop {job_id}`)",
            file=sys.stderr,
        )
        return 130
    return outcome(jobs, job_id)


async def _tail(jobs, job_id: str, heartbeat_s: float) -> None:
    """Print each chunk of the job's logs as it comes; a heartbeat line after each
    ``heartbeat_s`` of silence. The pending read is never cancelled (that would end the
    stream): it is waited on again."""
    chunks = jobs.tail_job_logs(job_id).__aiter__()
    silent_since = time.monotonic()
    pending = asyncio.ensure_future(chunks.__anext__())
    while True:
        done, _ = await asyncio.wait({pending}, timeout=heartbeat_s)
        if not done:
            print(quiet_line(job_id, jobs.get_job_info(job_id), time.monotonic() - silent_since),
                  flush=True)  # fmt: skip
            continue
        try:
            chunk = pending.result()
        except StopAsyncIteration:
            return
        print(chunk, end="", flush=True)
        silent_since = time.monotonic()
        pending = asyncio.ensure_future(chunks.__anext__())


def quiet_line(job_id: str, info: Any, silent_s: float, now: float | None = None) -> str:
    """A heartbeat line of ``--follow``: the job's state, how long it has run (from its
    start time, in ms since the epoch), how long its logs were silent."""
    started = getattr(info, "start_time", None)
    age = f", {((now or time.time()) - started / 1000):.0f} s since it started" if started else ""
    return f"job {job_id}: {info.status}{age}; no new log line for {silent_s:.0f} s"


def check_heartbeat(text: str | float) -> float:
    """``--heartbeat-s``: seconds, 1 to a day (checked before anything is submitted)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 1 <= value <= 86_400:  # nan fails too
        raise SubmitError(f"--heartbeat-s: {text!r} is not a number of seconds from 1 to 86400; "
                          "e.g. --heartbeat-s 30")  # fmt: skip
    return value


def settle(jobs, job_id: str, wait_s: float):
    """The job's info once it ended, or as it stands after ``wait_s`` (the log stream can
    close a moment before the status is final)."""
    deadline = time.monotonic() + wait_s
    info = jobs.get_job_info(job_id)
    while str(info.status) not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.5)
        info = jobs.get_job_info(job_id)
    return info


def describe(job_id: str, info) -> str:
    return f"job {job_id}: {info.status}" + (f" ({info.message})" if info.message else "")


def outcome(jobs, job_id: str, wait_s: float = 30.0, quiet: bool = False) -> int:
    """0 if the job succeeded; else its driver's exit code, or 1."""
    info = settle(jobs, job_id, wait_s)
    if not quiet or str(info.status) != "SUCCEEDED":
        print(describe(job_id, info))
    if str(info.status) == "SUCCEEDED":
        return 0
    return info.driver_exit_code or 1
