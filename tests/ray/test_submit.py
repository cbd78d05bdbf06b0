"""Jobs through the Ray Jobs API on a token-protected head: refused without the token,
a smoke search that succeeds and whose outputs come back, and a job that is stopped."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import _procs
import pytest
from _heads import clean_env, free_port, start_head, stop_head, submit_cli


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, str]]:
    """A 3-CPU head with RAY_AUTH_MODE=token; yields its Jobs API address, token file and owner
    mark (``_procs``)."""
    token = tmp_path_factory.mktemp("auth") / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = clean_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    port = free_port()
    owner = start_head([f"--port={free_port()}", "--num-cpus=3"], env, port)
    try:
        yield f"http://127.0.0.1:{port}", token, owner
    finally:
        stop_head(owner)


def no_token_env() -> dict[str, str]:
    return clean_env(RAY_AUTH_TOKEN_PATH="/nonexistent/auth_token")


def test_submission_without_the_token_is_refused(
    head: tuple[str, Path, str], tmp_path: Path
) -> None:
    address, _, _ = head
    args = ["--address", address, "search", "--preset", "smoke", "--trials", "1"]
    done = submit_cli(args, no_token_env(), timeout=120)
    assert done.returncode == 2, done.stderr
    assert "requires a token" in done.stderr
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    done = submit_cli(["--token-file", str(wrong), *args], no_token_env(), timeout=120)
    assert done.returncode == 2 and "refused the token" in done.stderr, done.stderr


USER_WORKLOAD = """
import torch
from torch import nn


def make_workload(ctx):
    def batch(indices):
        gen = lambda i: torch.Generator().manual_seed(ctx.seed * 1000 + i)
        return torch.stack([torch.randn(5, generator=gen(i)) for i in indices])

    def loss(model, data):
        return nn.functional.mse_loss(model(data[:, :4]), data[:, 4:])

    return {"model": nn.Linear(4, 1), "batch": batch, "loss": loss}
"""


@pytest.mark.slow
def test_search_job_succeeds_and_its_outputs_come_back(
    head: tuple[str, Path, str], tmp_path: Path
) -> None:
    """The job's config and the user's workload file live outside the project (and the
    cluster has never seen either): both go with the job."""
    address, token, _ = head
    user = tmp_path / "user"
    user.mkdir()
    (user / "my_workload.py").write_text(USER_WORKLOAD)
    (user / "job.yaml").write_text(
        f"workload: {{entrypoint: {user / 'my_workload.py'}:make_workload, global_batch: 8}}\n"
    )
    base = ["--address", address, "--token-file", str(token)]
    done = submit_cli(
        [*base, "search", "--follow", "--results-root", str(tmp_path / "cluster"),
         "--preset", "smoke", f"--config={user / 'job.yaml'}", "--trials", "1",
         "--set", "search.remeasure_top=0", "--set", "search.scaling_baseline=false"],
        no_token_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "trial   0" in done.stdout and "SUCCEEDED" in done.stdout
    assert "my_workload.py" in done.stdout  # the search names the workload it ran
    job_id = done.stdout.split("submitted ", 1)[1].split(":", 1)[0]
    status = submit_cli([*base, "status", job_id], no_token_env(), timeout=60)
    assert "SUCCEEDED" in status.stdout
    fetched = submit_cli(
        [*base, "fetch", job_id, "--dest", str(tmp_path / "back")], no_token_env(), timeout=300
    )
    assert fetched.returncode == 0, fetched.stderr
    best = (tmp_path / "back" / "best.yaml").read_text()
    assert "_commtune_inputs/workload/my_workload.py:make_workload" in best
    rows = (tmp_path / "back" / "trials.csv").read_text().strip().splitlines()
    assert len(rows) == 2 and ",complete," in rows[1], rows  # header + the baseline


@pytest.mark.slow
def test_stop_ends_a_running_job(head: tuple[str, Path, str], tmp_path: Path) -> None:
    address, token, owner = head
    base = ["--address", address, "--token-file", str(token)]
    done = submit_cli(
        [*base, "search", "--results-root", str(tmp_path), "--preset", "smoke", "--trials", "5"],
        no_token_env(), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split("submitted ", 1)[1].split(":", 1)[0]
    deadline = time.monotonic() + 120
    while "RUNNING" not in submit_cli([*base, "status", job_id], no_token_env(), 60).stdout:
        assert time.monotonic() < deadline, "the job never started running"
        time.sleep(2)
    # its search runs among this head's processes (else the check below proves nothing)
    assert any(job_id in args for args in _procs.owned(owner).values()), _procs.owned(owner)
    stopped = submit_cli([*base, "stop", job_id], no_token_env(), timeout=120)
    assert stopped.returncode == 0 and "STOPPED" in stopped.stdout, stopped.stdout
    deadline = time.monotonic() + 30
    while any(job_id in args for args in _procs.owned(owner).values()):  # this head's only
        assert time.monotonic() < deadline, "the stopped job's search is still running"
        time.sleep(1)
