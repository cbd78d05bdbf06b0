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
import logging
import os
import sys
from collections.abc import Sequence

from orchestrator.config.schema import ConfigError
from orchestrator.runfiles import BEST_YAML
from orchestrator.submit.jobs import (
    COMMANDS,
    DEFAULT_ADDRESS,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_RESULTS_ROOT,
    PROJECT_ROOT,
    TERMINAL,
    SubmitError,
    check_heartbeat,
    client,
    describe,
    follow,
    refusal,
    settle,
    submit,
)
from orchestrator.submit.transfer import fetch, pack


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
    p.add_argument(
        "--insecure",
        action="store_true",
        help="send the token over plain http:// to a non-loopback address (refused otherwise)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        add_job_parser(sub, name)
    for name, what in (("status", "print the job's status"), ("stop", "stop a running job")):
        sub.add_parser(name, help=what).add_argument("job_id")
    logs = sub.add_parser("logs", help="print the job's logs")
    logs.add_argument("job_id")
    logs.add_argument("--follow", action="store_true", help="stream until the job ends")
    add_heartbeat(logs)
    fetch = sub.add_parser("fetch", help=f"copy the job's outputs ({BEST_YAML} and friends) here")
    fetch.add_argument("job_id")
    fetch.add_argument("--dest", help="local folder (default runs/<job id>)")
    fetch.add_argument(
        "--force", action="store_true", help="overwrite files of the same names in --dest"
    )
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
        name, help=f"submit `python -m {COMMANDS[name].module} ARGS` as a job", allow_abbrev=False
    )
    s.add_argument(
        "--follow", action="store_true", help="stream the logs until the job ends; exit with it"
    )
    add_heartbeat(s)
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


def add_heartbeat(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--heartbeat-s", default=DEFAULT_HEARTBEAT_S, metavar="S",
        help="with --follow: a line with the job's state after S seconds without a log line "
        f"(default {DEFAULT_HEARTBEAT_S:g})",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if hasattr(args, "heartbeat_s"):
        args.heartbeat_s = check_heartbeat(args.heartbeat_s)  # before anything is submitted
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
            return follow(jobs, args.job_id, args.heartbeat_s)
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


