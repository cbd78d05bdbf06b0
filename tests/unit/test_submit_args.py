"""orchestrator.submit without a cluster: argument checks, the token lookup, fetch's packing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import search_spaces
from orchestrator.config.inputs import parse_env_items
from orchestrator.config.schema import ConfigError
from orchestrator.submit import cli, jobs, transfer

STAGED = ["--config", "_commtune_inputs/config.yaml"]


def small_project(tmp_path: Path) -> Path:
    """A stand-in working directory (the real project would be copied whole)."""
    root = tmp_path / "project"
    (root / "runs").mkdir(parents=True)
    (root / "runs" / "old.csv").write_text("outputs stay behind\n")
    (root / "code.py").write_text("x = 1\n")
    return root


def job(tmp_path: Path, *argv: str) -> tuple[list[str], str, Path]:
    args = cli.parse_args(list(argv))
    args.working_dir = str(small_project(tmp_path))
    staging = tmp_path / "staged"
    command, out = jobs.job_command(args, "job-1", staging)
    return command, out, staging


def staged_config(staging: Path) -> dict:
    return yaml.safe_load((staging / "_commtune_inputs" / "config.yaml").read_text())


def test_job_arguments_pass_through_and_get_a_cluster_folder(tmp_path: Path) -> None:
    argv, out, staging = job(tmp_path, "search", "--preset", "smoke", "--trials", "2", "--follow")
    assert argv[:3] == ["python", "-m", "orchestrator.search"]
    assert argv[3:] == [*STAGED, "--trials", "2", "--address", "auto", "--out", out]
    assert out == "~/commtune-runs/job-1"
    assert staged_config(staging)["name"] == "smoke"  # the preset, resolved here
    assert (staging / "code.py").is_file() and not (staging / "runs").exists()


def test_a_virtual_environment_in_the_project_stays_behind(tmp_path: Path) -> None:
    """A project's virtual environment (any name: it holds pyvenv.cfg) is not staged: CI's
    .ci-venv (2 GB) made each submission copy it first."""
    root = small_project(tmp_path)
    for name in (".venv", "env-3.11"):
        (root / name / "lib").mkdir(parents=True)
        (root / name / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (root / name / "lib" / "big.so").write_bytes(b"0" * 1024)
    (root / "data" / "lib").mkdir(parents=True)  # an ordinary folder goes
    args = cli.parse_args(["search", "--preset", "smoke"])
    args.working_dir = str(root)
    jobs.job_command(args, "job-1", tmp_path / "staged")
    staged = {p.name for p in (tmp_path / "staged").iterdir()}
    assert {"code.py", "data"} <= staged and not {".venv", "env-3.11"} & staged, staged


def test_job_arguments_are_checked_before_submitting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="search.trials"):
        job(tmp_path, "search", "--preset", "smoke", "--set", "search.trails=3")


def test_an_explicit_out_is_kept(tmp_path: Path) -> None:
    argv, out, _ = job(tmp_path, "search", "--preset", "smoke", "--out", "/mnt/shared/runs/a")
    assert out == "/mnt/shared/runs/a" and argv.count("--out") == 1


def test_an_explicit_out_and_address_are_kept_in_either_spelling(tmp_path: Path) -> None:
    argv, out, _ = job(tmp_path, "train", "--preset", "smoke", "--out=/mnt/b", "--address=h:1")
    assert out == "/mnt/b" and "--out" not in argv and "--address" not in argv


@pytest.mark.parametrize("spelling", ["--config", "--config="])
def test_configs_and_the_files_they_name_go_with_the_job(tmp_path: Path, spelling: str) -> None:
    """Outside the project, given as --config PATH or --config=PATH, with a workload file, a
    space file and --set on top: all resolved here and shipped, paths rewritten."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "wl.py").write_text(
        "import torch\nfrom torch import nn\n\ndef make_workload(ctx):\n"
        "    return {'model': nn.Linear(2, 1), 'batch': lambda i: torch.ones(len(i), 2),\n"
        "            'loss': lambda m, b: m(b).sum()}\n"
    )
    (user / "mine.yaml").write_text((Path(search_spaces.__file__).parent / "ddp.yaml").read_text())
    cfg = user / "my.yaml"
    cfg.write_text(
        f"name: mine\nworkload: {{entrypoint: {user / 'wl.py'}:make_workload}}\n"
        f"search: {{spaces: [accumulation, {user / 'mine.yaml'}]}}\n"
    )
    flag = [f"--config={cfg}"] if spelling.endswith("=") else ["--config", str(cfg)]
    argv, _, staging = job(tmp_path, "search", *flag, "--set", "search.trials=5")
    assert argv[3:5] == STAGED and str(cfg) not in " ".join(argv) and "--set" not in argv
    config = staged_config(staging)
    assert config["search"]["trials"] == 5 and config["name"] == "mine"
    entry = config["workload"]["entrypoint"]
    assert entry == "_commtune_inputs/workload/wl.py:make_workload"
    assert (staging / entry.split(":")[0]).read_text() == (user / "wl.py").read_text()
    assert config["search"]["spaces"] == ["accumulation", "_commtune_inputs/spaces/1-mine.yaml"]
    assert (staging / config["search"]["spaces"][1]).is_file()


def test_a_missing_input_is_refused_before_submitting(tmp_path: Path) -> None:
    cfg = tmp_path / "my.yaml"
    cfg.write_text(f"name: mine\nsearch: {{spaces: [{tmp_path / 'gone.yaml'}]}}\n")
    with pytest.raises(ConfigError) as info:
        job(tmp_path, "search", "--config", str(cfg))
    assert info.value.key.startswith("search.spaces")


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


def test_without_upload_the_config_path_is_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "my.yaml"
    cfg.write_text("name: mine\n")
    args = cli.parse_args(["search", "--no-upload", "--preset", "smoke", f"--config={cfg}"])
    argv, _ = jobs.job_command(args, "job-1", tmp_path / "unused")
    assert f"--config={cfg.resolve()}" in argv and not (tmp_path / "unused").exists()
    assert jobs.runtime_env_for(False, args.working_dir) == {}
    monkeypatch.chdir(tmp_path)
    rel = cli.parse_args(["search", "--no-upload", "--preset", "smoke", "--set",
                          "search.spaces=[strategy, accumulation, rel/mine.yaml]"])  # fmt: skip
    (tmp_path / "rel").mkdir()
    ddp = Path(search_spaces.__file__).parent / "ddp.yaml"
    (tmp_path / "rel" / "mine.yaml").write_text(ddp.read_text())
    with pytest.raises(ConfigError, match="relative"):
        jobs.job_command(rel, "job-1", tmp_path / "unused")


def test_a_training_run_is_a_job_too(tmp_path: Path) -> None:
    argv, out, _ = job(tmp_path, "train", "--preset", "smoke", "--steps", "50", "--workers", "1:2")
    out = out.replace("job-1", "job-2")
    assert argv[:3] == ["python", "-m", "orchestrator.train"]
    assert argv[-4:] == ["--address", "auto", "--out", "~/commtune-runs/job-1"]
    with pytest.raises(ConfigError, match="--workers"):
        job(tmp_path / "bad", "train", "--preset", "smoke", "--workers", "2:1")


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


def packed(members: dict[str, bytes], links: dict[str, str] | None = None) -> str:
    """Job logs holding a tar of ``members`` (and symlinks), as a hostile pack job could print."""
    import base64
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    blob = base64.b64encode(buf.getvalue()).decode()
    return f"{transfer.PACK_BEGIN}\n{blob}\n{transfer.PACK_END}\n"


@pytest.mark.parametrize(
    ("logs", "why"),
    [
        (packed({"../escape.txt": b"x"}), "not a run's own file"),
        (packed({"sub/trials.csv": b"x"}), "not a run's own file"),
        (packed({".bashrc": b"x"}), "not a run's own file"),
        (packed({"best.yaml": b"x"}, {"link": "/etc/passwd"}), "not a run's own file"),
        (packed({f"f{i}.csv": b"x" for i in range(65)}), "entries"),
        (f"{transfer.PACK_BEGIN}\nnot base64!\n{transfer.PACK_END}", "not base64"),
        (f"{transfer.PACK_BEGIN}\naGVsbG8=\n{transfer.PACK_END}", "unreadable"),
    ],
)
def test_fetch_unpacks_only_a_runs_own_files(tmp_path: Path, logs: str, why: str) -> None:
    with pytest.raises(jobs.SubmitError, match=why):
        transfer.unpack(logs, tmp_path / "back")
    assert not (tmp_path / "back").exists() and not (tmp_path / "escape.txt").exists()


def test_fetch_never_overwrites_without_force(tmp_path: Path) -> None:
    dest = tmp_path / "home"
    dest.mkdir()
    (dest / "best.yaml").write_text("mine\n")
    logs = packed({"best.yaml": b"theirs\n", "trials.csv": b"a\n"})
    with pytest.raises(jobs.SubmitError, match="--force"):
        transfer.unpack(logs, dest)
    assert (dest / "best.yaml").read_text() == "mine\n" and not (dest / "trials.csv").exists()
    assert sorted(transfer.unpack(logs, dest, force=True)) == ["best.yaml", "trials.csv"]
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(jobs.SubmitError, match="symlink"):
        transfer.unpack(logs, tmp_path / "link")


@pytest.mark.parametrize(
    ("address", "insecure", "refused"),
    [("http://10.0.0.5:8265", False, True), ("http://10.0.0.5:8265", True, False),
     ("https://head.example:8265", False, False), ("http://127.0.0.1:8265", False, False),
     ("http://localhost:8265", False, False), ("10.0.0.5:8265", False, True)],
)  # fmt: skip
def test_the_token_never_crosses_a_network_in_clear_text(
    address: str, insecure: bool, refused: bool
) -> None:
    if refused:
        with pytest.raises(jobs.SubmitError, match="--insecure"):
            jobs.check_transport(address, True, insecure)
    else:
        jobs.check_transport(address, True, insecure)
    jobs.check_transport(address, False, False)  # no token, nothing to leak


def test_a_token_file_others_can_read_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    token.chmod(0o644)
    assert jobs.find_token(str(token)) == "secret"
    assert "chmod 600" in capsys.readouterr().err
    token.chmod(0o600)
    jobs.find_token(str(token))
    assert capsys.readouterr().err == ""


class _QuietJob:
    """A Jobs client whose job logs one line, stays silent for ``silent_s``, logs another."""

    def __init__(self, silent_s: float) -> None:
        self.silent_s = silent_s

    async def tail_job_logs(self, job_id: str):
        import asyncio

        yield "first line\n"
        await asyncio.sleep(self.silent_s)
        yield "last line\n"

    def get_job_info(self, job_id: str):
        from types import SimpleNamespace

        return SimpleNamespace(status="SUCCEEDED", start_time=None, message="",
                               driver_exit_code=0)  # fmt: skip


def test_follow_says_the_jobs_state_after_a_silence_and_keeps_streaming(capsys) -> None:
    assert jobs.follow(_QuietJob(silent_s=2.5), "job-1", heartbeat_s=1.0) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "first line" and "last line" in lines, lines
    quiet = lines[1 : lines.index("last line")]
    # one line a second of silence: 2 in 2.5 s, a third where a loaded machine woke late
    assert 2 <= len(quiet) <= 3 and all("job job-1: SUCCEEDED" in q for q in quiet), lines
    silences = [int(q.rsplit("for ", 1)[1].removesuffix(" s")) for q in quiet]
    assert all(k + 1 <= s <= k + 2 for k, s in enumerate(silences)), quiet


def test_a_talkative_job_has_no_heartbeat(capsys) -> None:
    assert jobs.follow(_QuietJob(silent_s=0.1), "job-1", heartbeat_s=1.0) == 0
    assert "no new log line" not in capsys.readouterr().out


def test_the_quiet_line_says_how_long_the_job_has_run() -> None:
    from types import SimpleNamespace

    info = SimpleNamespace(status="RUNNING", start_time=1_000_000)
    line = jobs.quiet_line("j", info, silent_s=31.4, now=1_095.0)
    assert line == "job j: RUNNING, 95 s since it started; no new log line for 31 s"


@pytest.mark.parametrize("bad", ["0", "-5", "nan", "inf", "abc", "1e9"])
def test_a_bad_heartbeat_is_refused_before_anything_is_submitted(bad: str, capsys) -> None:
    assert cli.main(["search", "--preset", "smoke", "--follow", "--heartbeat-s", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--heartbeat-s" in err[0] and repr(bad) in err[0], err
