"""``python -m orchestrator.submit``: run commtune on a cluster as a Ray job, and follow it.

    python -m orchestrator.submit [--address URL] search|train [its args...] [--follow]
    python -m orchestrator.submit status|logs|stop JOB_ID
    python -m orchestrator.submit fetch JOB_ID [--dest DIR]

A job runs with this project as its working directory (uploaded through the Jobs API), so
the cluster runs the code you have here. Its arguments are validated here before anything
is submitted, its outputs go to a folder on the cluster named after the job
(``--results-root``, default ``~/commtune-runs`` on the head; use shared storage such as
``/mnt/shared/runs`` on a multi-node cluster), and ``fetch`` brings them back through the
Jobs API, so no SSH or cloud credentials are needed.

The token of a cluster with ``RAY_AUTH_MODE=token`` is sent with every request: from
``--token-file``, else ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``
(Ray's own order). Exit codes: 0 success, 2 usage error or refused request, 1 a job that
failed or was stopped (with ``--follow``: the job's own exit code when it has one).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import logging
import os
import shlex
import sys
import tarfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.config import ConfigError
from search_spaces import SpaceError
from search_spaces._env import env_strings

PROJECT_ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {"search": "orchestrator.search", "train": "orchestrator.train"}
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


class SubmitError(Exception):
    """A request the cluster refused or that cannot be made; the message says what to do."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m orchestrator.submit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--address",
        default=os.environ.get("RAY_API_SERVER_ADDRESS", DEFAULT_ADDRESS),
        help=f"the cluster's dashboard / Jobs API (default {DEFAULT_ADDRESS}; "
        "reach a remote head with `ray dashboard cluster.yaml`)",
    )
    p.add_argument("--token-file", help="the cluster's auth token (default: Ray's lookup order)")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        add_job_parser(sub, name)
    for name, what in (("status", "print the job's status"), ("stop", "stop a running job")):
        sub.add_parser(name, help=what).add_argument("job_id")
    logs = sub.add_parser("logs", help="print the job's logs")
    logs.add_argument("job_id")
    logs.add_argument("--follow", action="store_true", help="stream until the job ends")
    fetch = sub.add_parser("fetch", help="copy the job's outputs (best.yaml and friends) here")
    fetch.add_argument("job_id")
    fetch.add_argument("--dest", help="local folder (default runs/<job id>)")
    pack = sub.add_parser("pack", help=argparse.SUPPRESS)  # runs on the cluster for `fetch`
    pack.add_argument("folder")
    args, rest = p.parse_known_args(argv)
    if rest and args.command not in COMMANDS:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    args.job_args = rest
    return args


def add_job_parser(sub: argparse._SubParsersAction, name: str) -> None:
    """A job kind's own options; every other argument goes to the job (and is checked here)."""
    s = sub.add_parser(
        name, help=f"submit `python -m {COMMANDS[name]} ARGS` as a job", allow_abbrev=False
    )
    s.add_argument(
        "--follow", action="store_true", help="stream the logs until the job ends; exit with it"
    )
    s.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment variable for the job (the search's allow-listed names only)",
    )
    s.add_argument(
        "--results-root",
        default=DEFAULT_RESULTS_ROOT,
        help=f"folder on the cluster that receives <job id>/ (default {DEFAULT_RESULTS_ROOT}); "
        "not used when ARGS hold --out",
    )
    s.add_argument(
        "--working-dir",
        default=str(PROJECT_ROOT),
        help="project folder uploaded as the job's working directory",
    )
    s.add_argument(
        "--no-upload",
        action="store_true",
        help="run the commtune installed on the cluster instead of uploading this folder "
        "(needed on the local twin, whose fake nodes share one disk)",
    )


def find_token(token_file: str | None) -> str | None:
    """The auth token this client presents, in Ray's own lookup order (None: no token)."""
    if token_file:
        path = Path(token_file).expanduser()
        if not path.is_file():
            raise SubmitError(f"--token-file: {path} does not exist")
        return path.read_text().strip() or None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or "~/.ray/auth_token").expanduser()
    if not path.is_file():
        return None
    return path.read_text().strip() or None


def client(args: argparse.Namespace):
    """A Jobs API client that sends the token explicitly (whatever this shell's RAY_AUTH_MODE)."""
    from ray.exceptions import RayError
    from ray.job_submission import JobSubmissionClient

    token = find_token(args.token_file)
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


def job_env(pairs: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` pairs, held to the search's allow-list (no secrets, no PATH games)."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError("--env", f"{pair!r} is not NAME=VALUE")
        env[name] = value
    try:  # unsafe NCCL values only through a config with search.unsafe_nccl: true
        return env_strings(env)
    except SpaceError as e:
        raise ConfigError(f"--env {e.key}" if e.key else "--env", e.message) from e


def job_command(args: argparse.Namespace, job_id: str) -> tuple[list[str], str]:
    """The job's argv, validated here as the cluster would, and its output folder there."""
    import importlib

    job_args = list(args.job_args)
    module = importlib.import_module(COMMANDS[args.command])
    parsed = module.parse_args(job_args)
    module.check(parsed)
    if parsed.config:
        job_args = relocate(job_args, parsed.config, args)
    if not parsed.address:  # a job's driver joins the cluster it runs on
        job_args += ["--address", "auto"]
    out = parsed.out
    if not out:
        out = f"{args.results_root.rstrip('/')}/{job_id}"
        job_args += ["--out", out]
    return ["python", "-m", COMMANDS[args.command], *job_args], out


def relocate(job_args: list[str], config: str, args: argparse.Namespace) -> list[str]:
    """Point ``--config`` at the uploaded copy (the job sees only the working directory), or
    at the absolute path when nothing is uploaded (the cluster must see the same file)."""
    path, working_dir = Path(config).resolve(), Path(args.working_dir)
    if args.no_upload:
        return [str(path) if a == config else a for a in job_args]
    try:
        inside = path.relative_to(working_dir.resolve())
    except ValueError:
        raise ConfigError(
            "--config",
            f"{config} is outside the uploaded folder {working_dir}; copy it there "
            "(the job sees only that folder) or pass --working-dir",
        ) from None
    return [inside.as_posix() if a == config else a for a in job_args]


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
    argv, out = job_command(args, job_id)
    runtime_env = runtime_env_for(not args.no_upload, args.working_dir)
    env = job_env(args.env)
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
    return follow(jobs, job_id) if args.follow else 0


def follow(jobs, job_id: str) -> int:
    """Stream the logs until the job ends; the exit code tells the job's outcome."""

    async def tail() -> None:
        async for chunk in jobs.tail_job_logs(job_id):
            print(chunk, end="", flush=True)

    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        print(
            f"\nstopped following; the job goes on (stop it with "
            f"`python -m orchestrator.submit stop {job_id}`)",
            file=sys.stderr,
        )
        return 130
    return outcome(jobs, job_id)


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


def run(args: argparse.Namespace) -> int:
    if args.command == "pack":
        return pack(args.folder)
    if args.command in COMMANDS:
        return submit(args)
    if args.command == "fetch":
        return fetch(args)
    jobs = client(args)
    if args.command == "status":
        print(describe(args.job_id, jobs.get_job_info(args.job_id)))
        return 0
    if args.command == "logs":
        if args.follow:
            return follow(jobs, args.job_id)
        print(jobs.get_job_logs(args.job_id), end="")
        return 0
    jobs.stop_job(args.job_id)
    info = settle(jobs, args.job_id, wait_s=60)
    print(describe(args.job_id, info))
    return 0 if str(info.status) in TERMINAL else 1


def main(argv: Sequence[str] | None = None) -> int:
    from ray.exceptions import RayError

    args = parse_args(argv)
    # Ray logs each file it leaves out of the upload at INFO; what matters is printed here.
    logging.getLogger("ray").setLevel(logging.WARNING)
    logging.getLogger("ray._private.runtime_env.working_dir").setLevel(logging.ERROR)
    try:
        return run(args)
    except ConfigError as e:
        print(f"commtune: error: {e}", file=sys.stderr)
        return 2
    except SubmitError as e:
        print(f"commtune: error: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, RayError) as e:  # the Jobs API's answer: a refused token, no such job
        print(f"commtune: error: {refusal(args.address, str(e), True)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
