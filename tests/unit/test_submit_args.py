"""orchestrator.submit without a cluster: argument checks, the token lookup, fetch's packing."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import ConfigError, parse_env_items
from orchestrator.submit import cli, jobs, transfer


def test_job_arguments_pass_through_and_get_a_cluster_folder() -> None:
    args = cli.parse_args(["search", "--preset", "smoke", "--trials", "2", "--follow"])
    argv, out = jobs.job_command(args, "job-1")
    assert args.follow
    assert argv[:3] == ["python", "-m", "orchestrator.search"]
    assert argv[3:] == [
        "--preset", "smoke", "--trials", "2", "--address", "auto", "--out", out,
    ]  # fmt: skip
    assert out == "~/commtune-runs/job-1"


def test_job_arguments_are_checked_before_submitting() -> None:
    args = cli.parse_args(["search", "--preset", "smoke", "--set", "search.trails=3"])
    with pytest.raises(ConfigError, match="search.trials"):
        jobs.job_command(args, "job-1")


def test_an_explicit_out_is_kept() -> None:
    args = cli.parse_args(["search", "--preset", "smoke", "--out", "/mnt/shared/runs/a"])
    argv, out = jobs.job_command(args, "job-1")
    assert out == "/mnt/shared/runs/a" and argv.count("--out") == 1


def test_config_file_is_rewritten_relative_to_the_upload(tmp_path: Path) -> None:
    cfg = tmp_path / "conf" / "my.yaml"
    cfg.parent.mkdir()
    cfg.write_text("name: mine\n")
    args = cli.parse_args(["search", "--preset", "smoke", "--config", str(cfg)])
    args.working_dir = str(tmp_path)
    argv, _ = jobs.job_command(args, "job-1")
    assert argv[argv.index("--config") + 1] == "conf/my.yaml"
    args.working_dir = str(tmp_path / "conf" / "elsewhere")
    with pytest.raises(ConfigError, match="outside the uploaded folder"):
        jobs.job_command(args, "job-1")


@pytest.mark.parametrize(
    ("pair", "key"),
    [("PATH=/tmp/evil", "--env PATH"), ("AWS_SECRET_ACCESS_KEY=x", "--env AWS_SECRET_ACCESS_KEY"),
     ("NCCL_NCHANNELS=4", "--env NCCL_NCHANNELS"), ("NCCL_DEBUG", "--env")],
)  # fmt: skip
def test_job_environment_obeys_the_search_allow_list(pair: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_env_items([pair], "--env")
    assert info.value.key == key


def test_allowed_job_environment() -> None:
    assert parse_env_items(["NCCL_DEBUG=INFO", "FI_PROVIDER=efa"], "--env") == {
        "NCCL_DEBUG": "INFO",
        "FI_PROVIDER": "efa",
    }


def test_token_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given, by_path = tmp_path / "given", tmp_path / "by_path"
    given.write_text("tok-given\n")
    by_path.write_text("tok-path\n")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(by_path))
    assert jobs.find_token(None) == "tok-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "tok-env")
    assert jobs.find_token(None) == "tok-env"
    assert jobs.find_token(str(given)) == "tok-given"
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    assert jobs.find_token(None) is None
    with pytest.raises(jobs.SubmitError, match="--token-file"):
        jobs.find_token(str(tmp_path / "missing"))


def test_pack_and_unpack_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    (out / "trials").mkdir(parents=True)  # trial state stays on the cluster
    (out / "trials" / "big.pt").write_bytes(b"x" * 1000)
    (out / "best.yaml").write_text("name: x\n")
    (out / "study.db").write_bytes(bytes(range(256)) * 10)
    assert transfer.pack(str(out)) == 0
    logs = "job output before\n" + capsys.readouterr().out + "after\n"
    names = transfer.unpack(logs, tmp_path / "back")
    assert sorted(names) == ["best.yaml", "study.db"]
    assert (tmp_path / "back" / "study.db").read_bytes() == (out / "study.db").read_bytes()


def test_pack_of_a_missing_folder_fails(tmp_path: Path) -> None:
    assert transfer.pack(str(tmp_path / "nothing")) == 1
    with pytest.raises(jobs.SubmitError, match="printed no outputs"):
        transfer.unpack("Traceback ...", tmp_path / "back")


def test_refusals_say_what_to_do() -> None:
    assert "--token-file" in jobs.refusal("http://h:8265", "status code 401", False)
    assert "not this cluster's" in jobs.refusal("http://h:8265", "status 403", True)
    assert "ray dashboard" in jobs.refusal("http://h:8265", "Failed to connect to API", False)


def test_without_upload_the_config_path_is_absolute(tmp_path: Path) -> None:
    cfg = tmp_path / "my.yaml"
    cfg.write_text("name: mine\n")
    args = cli.parse_args(["search", "--no-upload", "--preset", "smoke", "--config", str(cfg)])
    args.working_dir = str(tmp_path / "elsewhere")  # not used: nothing is uploaded
    argv, _ = jobs.job_command(args, "job-1")
    assert argv[argv.index("--config") + 1] == str(cfg.resolve())
    assert jobs.runtime_env_for(False, args.working_dir) == {}


def test_a_training_run_is_a_job_too() -> None:
    args = cli.parse_args(["train", "--preset", "smoke", "--steps", "50", "--workers", "1:2"])
    argv, out = jobs.job_command(args, "job-2")
    assert argv[:3] == ["python", "-m", "orchestrator.train"]
    assert argv[-4:] == ["--address", "auto", "--out", "~/commtune-runs/job-2"]
    bad = cli.parse_args(["train", "--preset", "smoke", "--workers", "2:1"])
    with pytest.raises(ConfigError, match="--workers"):
        jobs.job_command(bad, "job-3")


def test_submission_waits_for_a_fresh_heads_job_agent(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Jobs:
        calls = 0

        def submit_job(self, **job: object) -> None:
            Jobs.calls += 1
            if Jobs.calls < 3:
                raise RuntimeError("Request failed with status code 500: No available agent")

    monkeypatch.setattr(jobs.time, "sleep", lambda seconds: None)
    jobs.submit_when_ready(Jobs(), entrypoint="x")
    assert Jobs.calls == 3 and "job agent" in capsys.readouterr().err

    class Refused:
        def submit_job(self, **job: object) -> None:
            raise RuntimeError("status code 401")

    with pytest.raises(RuntimeError, match="401"):
        jobs.submit_when_ready(Refused(), entrypoint="x")
